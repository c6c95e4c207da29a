/* The planner's tools' door into the library: internal and unstable, never installed. `pshard plan`,
 * `pshard profile` and `pshard bench` exist to look inside the planner (every candidate plan, the
 * cost model's prediction of each step, the executor timed step by step against it, the machine's
 * measured rates), so they use its own structs (plan, profile, exec_params, model) rather than a
 * public API that would have to freeze them. They, and the files that carry the comparison
 * switches (struct plan_options) to the engine, include this header and nothing else of src/; the
 * build gives src/ to them alone (CMakeLists.txt, PSHARD_CLI_INSIDE), and every other command of the
 * tool sees include/pshard.h (docs/architecture.md, "The tool and the library"). */
#ifndef ENGINE_TOOLS_API_H
#define ENGINE_TOOLS_API_H

#include "core/error.h"         /* CORE_TRY, core_fail */
#include "core/timer.h"         /* core_now_ms */
#include "cuda/cuda_backend.h"  /* cuda_device_count, the device's name for the profile */
#include "engine/engine_open.h" /* engine_open with the comparison switches, the API's planning options */
#include "exec/exec.h"          /* plans made and stepped as the engine does (bench --oracle) */
#include "exec/kv_cache.h"      /* KV_BLOCK_CELLS: a pool of whole blocks for every sequence (bench --batch) */
#include "gguf/gguf.h"
#include "measure/measure.h"    /* measuring this machine, the cached profile */
#include "model/model.h"
#include "plan/cost.h"          /* the cost model's step */
#include "plan/cost_vision.h"   /* the vision encoder's phase (plan --image-size) */
#include "plan/plan.h"
#include "plan/profile.h"
#include "vision/image.h"
#include "vision/mmproj.h"

#endif
