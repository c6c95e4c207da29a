/* The greedy choice of a decode step, made where its logits are: the first index of the largest
 * logit, as the host's sampler finds it at temperature 0 without penalties (src/engine/sampler.c:
 * NaNs never win, -0 ties with +0, and index 0 where logit 0 is NaN or every logit is). The index
 * becomes the next step's token where the step reads it, the step's position and its rope
 * positions move on by one, and the host finds the index in mapped memory, at the slot of the
 * position's parity: two steps may be in flight, so the host reads each pick before the step after
 * next can write over it. One block: the logits (151,936 at qwen3's vocabulary, 0.6 MB) were just
 * written and sit in L2, so a block's loads in flight take a few microseconds. */
#include "cuda/cuda_internal.cuh"

enum { PICK_THREADS = 1024 };

/* A logit as a key that orders as the floats do, above 0 (NaN: 0, never chosen; -0 as +0). */
__device__ __forceinline__ uint32_t pick_key(float v) {
    if (v != v) return 0u;
    const uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

/* Key and index in one word: the larger key first, then the smaller index. */
__device__ __forceinline__ uint64_t pick_pack(uint32_t key, int i) {
    return (uint64_t)key << 32 | (uint64_t)(0xffffffffu - (uint32_t)i);
}

__device__ __forceinline__ uint64_t pick_max(uint64_t a, uint64_t b) { return a > b ? a : b; }

__global__ void __launch_bounds__(PICK_THREADS) pick_kernel(const float *logits, int n, int32_t *token, int32_t *pos,
                                                            int32_t *rope, int rope_stride, uint32_t *host) {
    dep_enter();
    __shared__ uint64_t best_of[PICK_THREADS / 32];
    uint64_t best = 0;
    const int quads = n / 4; /* (logits start 16-byte aligned: an arena buffer) */
    const float4 *l4 = (const float4 *)logits;
#pragma unroll 4
    for (int q = threadIdx.x; q < quads; q += PICK_THREADS) {
        const float4 v = l4[q];
        best = pick_max(best, pick_pack(pick_key(v.x), 4 * q));
        best = pick_max(best, pick_pack(pick_key(v.y), 4 * q + 1));
        best = pick_max(best, pick_pack(pick_key(v.z), 4 * q + 2));
        best = pick_max(best, pick_pack(pick_key(v.w), 4 * q + 3));
    }
    for (int i = 4 * quads + threadIdx.x; i < n; i += PICK_THREADS) best = pick_max(best, pick_pack(pick_key(logits[i]), i));
    for (int o = 16; o > 0; o /= 2) best = pick_max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (threadIdx.x % 32 == 0) best_of[threadIdx.x / 32] = best;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < PICK_THREADS / 32; w++) best = pick_max(best, best_of[w]);
    const float first = logits[0];
    const int32_t id = first != first || (best >> 32) == 0 ? 0 : (int32_t)(0xffffffffu - (uint32_t)best);
    const int32_t p = *pos;
    *token = id;
    *pos = p + 1;
    if (rope)
        for (int a = 0; a < 3; a++) rope[a * rope_stride]++;
    host[p & 1] = (uint32_t)id;
    __threadfence_system();
}

extern "C" pshard_status cuda_pick_greedy(const float *logits, int64_t n, int32_t *token, int32_t *pos, int32_t *rope,
                                          int64_t rope_stride, uint32_t *host_dev, cuda_stream s) {
    CUDA_ARG(n > 0 && n < (1ll << 31), "greedy pick over %lld logits", (long long)n);
    CUDA_ARG(((uintptr_t)logits & 15) == 0, "greedy pick: logits not 16-byte aligned");
    CUDA_TRY(launch_dep(pick_kernel, 1, PICK_THREADS, 0, raw_stream(s), logits, (int)n, token, pos, rope, (int)rope_stride,
                        host_dev));
    return PSHARD_OK;
}
