/* GPU placement of the executor: every shard resident in VRAM (the all-in-VRAM plan). One
 * device arena of a computed size holds the weights, the KV cache, activations, per-step work
 * buffers and cuBLAS's workspace; nothing else allocates device memory. Built on the CUDA
 * backend's C interface (src/cuda/cuda_backend.h); in a build without CUDA creation fails with
 * a clear message. */
#ifndef EXEC_GPU_H
#define EXEC_GPU_H

#include <stdint.h>

#include "cuda/cuda_backend.h"

struct exec_ctx;
struct exec_batch;

/* Device memory breakdown, for the load report. */
struct gpu_memory_report {
    uint64_t context_bytes; /* CUDA context + cuBLAS handle, outside the arena */
    uint64_t arena_bytes;
    uint64_t weight_bytes, kv_bytes, activation_bytes, work_bytes;
};

struct exec_gpu;

/* Upload every weight and carve the arena for ctx's model and parameters. */
pshard_status exec_gpu_create(struct exec_ctx *ctx, struct exec_gpu **out);
void exec_gpu_free(struct exec_gpu *gpu);
const struct gpu_memory_report *exec_gpu_report(const struct exec_gpu *gpu);

/* One step with every shard on the GPU; leaves the logits of the outputs in ctx->s.logits. */
pshard_status exec_gpu_step(struct exec_ctx *ctx, const struct exec_batch *batch);

#endif
