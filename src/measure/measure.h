/* src/measure: the machine's measurements for the profile. The planner prices plans from the
 * figures in plan/profile.h; this folder times them on this machine, with the CPU's and the GPU's
 * own kernels (it calls cpu, cuda and exec's KV layout, as a step would), and saves them in the
 * cache. It is not part of a step: the executor never calls it. The engine asks it for a profile
 * (measure_machine_profile) when it opens a model or the budget changes, `pshard plan` for the cached
 * one (it never measures), `pshard profile` and `pshard bench` to measure.
 *
 * Measuring this machine for the cost model (`pshard profile`): the CPU's and the GPU's kernels
 * on matrices of the model's shapes and formats, host memory, PCIe copies by size, reading host
 * memory in place, launch and hand-off latencies, and copies and CPU work run together. Each
 * figure is a short timed loop on buffers larger than the caches; the whole run stays within a
 * time limit (the GPU part is skipped without a GPU). */
#ifndef MEASURE_H
#define MEASURE_H

#include <stdbool.h>

#include "model/model.h"
#include "plan/profile.h"

/* Called as measuring moves on: what is being measured and the fraction done (0..1); a
 * negative fraction makes `what` a note to show on its own (why a cached profile is not used). */
typedef void (*measure_progress_fn)(void *user, const char *what, double done);

struct measure_request {
    const struct model *model; /* shapes and formats to measure; NULL: a generic 4096-wide model */
    int n_threads;             /* 0: all cores */
    bool gpu;                  /* measure the GPU too (when one exists) */
    measure_progress_fn progress;
    void *user;
    int64_t vram_cap;          /* device memory the GPU's measuring may take besides the CUDA
                                  context (a run's VRAM budget); 0: what it takes by default */
};

/* Measure into *p. Formats already in *p (a profile being extended with a new model's
 * formats) are measured again only when the model uses them. */
pshard_status measure_profile(const struct measure_request *req, struct profile *p);

/* The host's read bandwidth now, in GB/s, measured as the profile's host_read_gbps is (n_threads
 * threads, 0: all cores): comparing the two tells how far the host has drifted since profiling. */
pshard_status measure_host_read(int n_threads, double *gbps);

/* The CPU's figures that follow the host memory's load (struct cpu_sample: host reads, dense
 * matmuls of up to 4 tokens, experts of up to 16 tokens, in the formats p has for the model),
 * timed again now into p; the rest of p stays. A profile is one moment of a host whose speed
 * drifts within minutes, and these figures timed at the run track its steps better
 * (bench/RESULTS.md). About a second. */
pshard_status measure_cpu_now(const struct model *model, int n_threads, struct profile *p);

/* The profile to plan `model` with on this machine. MEASURE: the cached one when it fits this
 * machine and holds the model's formats, else measured now (the model's missing formats added
 * to a usable cached profile) and saved. CACHED: the cached one if usable (formats it lacks
 * are priced as its slowest), else the defaults. DEFAULTS: the conservative defaults.
 * *measured_now tells whether it measured (for the caller's messages). Measuring the GPU takes
 * no more than vram_cap bytes of device memory besides the context (0: what it takes by default;
 * see measure_request). */
enum profile_use { PROFILE_MEASURE, PROFILE_CACHED, PROFILE_DEFAULTS };
pshard_status measure_machine_profile(const struct model *model, int n_threads, int64_t vram_cap, enum profile_use use,
                                   measure_progress_fn progress, void *user, struct profile *out, bool *measured_now);

#endif
