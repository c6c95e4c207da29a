/* Which encoder an image goes through: the GPU's where the context has the GPU placement and the
 * encoding fits the scratch the executor lends between steps, or else its whole budget (the
 * language model's memory given up for the encoding and carved again after); else the CPU's. */
#ifndef ENGINE_VISION_GPU_H
#define ENGINE_VISION_GPU_H

#include "pshard.h"
#include "vision/encoder_gpu.h"

struct threadpool;

/* Encode p with the encoder of m. *gpu is what the GPU encoder keeps of m (made on first use,
 * vision_gpu_free with m). An encoding in the whole budget says so (a warning: the language model's
 * resident weights go up again after). Where the GPU cannot take the image (the encoding fits
 * neither, a shape without GPU kernels) a warning says why and the CPU encodes it on pool's threads;
 * the context's no_mmproj_offload asks for the CPU always. *where: the GPU memory it was encoded in
 * (VISION_GPU_NONE: the CPU). */
pshard_status engine_vision_encode(pshard_ctx *ctx, const struct mmproj *m, struct threadpool *pool, struct vision_gpu **gpu,
                                   const struct vision_patches *p, const struct vision_progress *progress,
                                   struct vision_embeddings *out, enum vision_gpu_memory *where);

#endif
