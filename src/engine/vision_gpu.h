/* Which encoder an image goes through: the GPU's, in the scratch the executor lends between
 * steps, where the context has the GPU placement and the encoding fits there; else the CPU's. */
#ifndef ENGINE_VISION_GPU_H
#define ENGINE_VISION_GPU_H

#include "pshard.h"
#include "vision/encoder_gpu.h"

struct threadpool;

/* Encode p with the encoder of m. *gpu is what the GPU encoder keeps of m (made on first use,
 * vision_gpu_free with m). Where the GPU cannot take the image (the encoding does not fit what the
 * executor lends, a shape without GPU kernels) a warning says why and the CPU encodes it on pool's
 * threads; PSHARD_VISION_GPU=0 asks for the CPU always. */
pshard_status engine_vision_encode(pshard_ctx *ctx, const struct mmproj *m, struct threadpool *pool, struct vision_gpu **gpu,
                                   const struct vision_patches *p, const struct vision_progress *progress,
                                   struct vision_embeddings *out);

#endif
