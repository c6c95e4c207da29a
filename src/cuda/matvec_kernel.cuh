/* The matrix-vector kernel all weight formats share (1..8 tokens, bandwidth-bound).
 *
 * One warp per weight row. The row is streamed in chunks of whole blocks (<= MV_CHUNK bytes)
 * with 16-byte loads into the warp's slice of shared memory, the next chunk's loads issued
 * before the current one is computed, so each warp keeps ~2 KB in flight and the loads are
 * fully coalesced whatever the block size (18, 22, 110, 210 bytes...). Lanes then take the
 * chunk's "items" -- a legacy block of 32, or one 32-element part of a K super-block -- and
 * dot them with every token's activations straight from global memory (they stay in L1/L2).
 * A format is a policy class: its block bytes, items per block, activation bytes per block,
 * and dot<NT>(), which unpacks the item once and accumulates it into NT token sums.
 *
 * More tokens run as passes of NT side by side, blockIdx.y picking the pass (each token's sums
 * are the same whichever pass holds it). The same kernel runs expert groups for MoE: blockIdx.y
 * picks an active expert, whose pairs (token, slot) are its tokens. Rows whose weights are not
 * 16-byte aligned stage through 2-byte loads instead (correct, slower). One token of F16 or
 * BF16 in VRAM skips the stage: each lane loads its own 64-byte items, two at a time
 * (mv_row_direct). A dense launch may take several matrices of one format and width at once
 * (mv_args.n_parts: q, k and v), and may add into its output (mv_args.accumulate). */
#ifndef CUDA_MATVEC_KERNEL_CUH
#define CUDA_MATVEC_KERNEL_CUH

#include "cuda/cuda_internal.cuh"
#include "cuda/matvec.cuh"

/* Stage a chunk: lane i loads 16-byte units i, i + 32, ... */
__device__ __forceinline__ void mv_fetch(const uint8_t *src, int bytes, int lane, uint4 *pre) {
#pragma unroll
    for (int u = 0; u < MV_UNITS; u++) {
        const int i = lane + 32 * u;
        if (i * 16 < bytes) pre[u] = __ldg((const uint4 *)src + i);
    }
}

__device__ __forceinline__ void mv_store(uint8_t *stage, int bytes, int lane, const uint4 *pre) {
#pragma unroll
    for (int u = 0; u < MV_UNITS; u++) {
        const int i = lane + 32 * u;
        if (i * 16 < bytes) ((uint4 *)stage)[i] = pre[u];
    }
}

/* acc[0] += row w . activations arow[0] for one token of a format whose items are whole 16-byte
 * vectors (F16, BF16) in VRAM, where the row is 16-byte aligned and its chunks a multiple of 32
 * items (a.direct): lane L reads its items L, L + 32, ... straight from global memory, MV_DIRECT
 * of them at once, and dots them in that order -- the items and the order the staged path gives
 * lane L, so the same sums. */
template <class T>
__device__ __forceinline__ void mv_row_direct(const uint8_t *w, const mv_args &a, int lane, const uint8_t *const *arow,
                                              float *acc) {
    constexpr int V = T::BYTES / 16, D = MV_DIRECT;
    const int nb = a.n_blocks;
    for (int b0 = lane; b0 < nb; b0 += 32 * D) {
        uint4 wv[D][V];
#pragma unroll
        for (int d = 0; d < D; d++)
            if (b0 + 32 * d < nb)
#pragma unroll
                for (int i = 0; i < V; i++) wv[d][i] = __ldg((const uint4 *)(w + (size_t)(b0 + 32 * d) * T::BYTES) + i);
#pragma unroll
        for (int d = 0; d < D; d++)
            if (b0 + 32 * d < nb)
                T::template dot<1>((const uint8_t *)wv[d], 0, arow, (int64_t)(b0 + 32 * d) * T::ACT_BYTES, acc);
    }
}

/* acc[t] += row w . activations arow[t], for one warp. */
template <class T, int NT>
__device__ __forceinline__ void mv_row(const uint8_t *w, const mv_args &a, uint8_t *stage, int lane,
                                       const uint8_t *const *arow, float *acc) {
    if constexpr (NT == 1 && T::BYTES == 64 && T::IPB == 1) { /* F16, BF16 (more tokens: too many registers) */
        if (a.direct) {
            mv_row_direct<T>(w, a, lane, arow, acc);
            return;
        }
    }
    const int nb = a.n_blocks, cb = a.chunk_blocks;
    uint4 pre[MV_UNITS];
    if (a.aligned) mv_fetch(w, min(cb, nb) * T::BYTES, lane, pre);
    for (int b0 = 0; b0 < nb; b0 += cb) {
        const int here = min(cb, nb - b0);
        __syncwarp(); /* every lane is done with the previous chunk */
        if (a.aligned) {
            mv_store(stage, here * T::BYTES, lane, pre);
            if (b0 + cb < nb) mv_fetch(w + (size_t)(b0 + cb) * T::BYTES, min(cb, nb - b0 - cb) * T::BYTES, lane, pre);
        } else {
            const uint16_t *src = (const uint16_t *)(w + (size_t)b0 * T::BYTES);
            for (int i = lane; i < here * T::BYTES / 2; i += 32) ((uint16_t *)stage)[i] = src[i];
        }
        __syncwarp();
        const int items = here * T::IPB;
        for (int it = lane; it < items; it += 32) {
            const int blk = it / T::IPB, part = it % T::IPB;
            T::template dot<NT>(stage + blk * T::BYTES, part, arow, (int64_t)(b0 + blk) * T::ACT_BYTES, acc);
        }
    }
}

template <class T, int NT> __global__ void __launch_bounds__(MV_THREADS) mv_kernel(const mv_args a) {
    __shared__ __align__(16) uint8_t stage_all[MV_WARPS][MV_CHUNK];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int row = blockIdx.x * MV_WARPS + warp;
    if (row >= a.n_rows) return; /* only warp-level syncs below */
    const uint8_t *w = a.w;
    float *y = a.y;
    int64_t y_stride = a.y_stride;
    if (a.n_parts > 1) { /* which matrix of several the row is in */
        int p = 0;
        while (p + 1 < a.n_parts && row >= a.part_end[p]) p++;
        if (p) row -= a.part_end[p - 1];
        w = a.part_w[p], y = a.part_y[p], y_stride = a.part_y_stride[p];
    }
    /* Dense: pass blockIdx.y, tokens [NT * y, NT * y + NT) of n_tokens. */
    int g_begin = (int)blockIdx.y * NT, g_end = min(g_begin + NT, a.n_tokens);
    if (a.pairs) {
        if ((int)blockIdx.y >= *a.n_active) return;
        const int e = a.active[blockIdx.y];
        w = a.expert_ptrs ? (const uint8_t *)a.expert_ptrs[e] : a.w + (size_t)e * a.expert_stride;
        g_begin = a.expert_start[e];
        g_end = a.expert_start[e + 1];
    }
    w += (size_t)row * a.row_bytes;
    for (int g = g_begin; g < g_end; g += NT) {
        /* Token rows of this pass; a short last pass repeats its last row (no branches in the
         * dots) and does not store the repeats. */
        const uint8_t *arow[NT];
        int64_t orow[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (a.pairs) {
                const int p = a.pairs[min(g + t, g_end - 1)];
                arow[t] = a.act + (int64_t)(p / a.act_div) * a.act_row_bytes;
                orow[t] = p;
            } else {
                arow[t] = a.act + (int64_t)min(g + t, g_end - 1) * a.act_row_bytes;
                orow[t] = g + t;
            }
        }
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.0f;
        mv_row<T, NT>(w, a, stage_all[warp], lane, arow, acc);
        const int n_valid = min(NT, g_end - g);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = warp_sum(acc[t]);
            if (lane == 0 && t < n_valid) {
                float *out = y + orow[t] * y_stride + row;
                *out = a.accumulate ? *out + v : v;
            }
        }
    }
}

template <class T> pshard_status mv_launch(int nt, const mv_args &a, dim3 grid, cudaStream_t st) {
    switch (nt) {
    case 1: mv_kernel<T, 1><<<grid, MV_THREADS, 0, st>>>(a); break;
    case 2: mv_kernel<T, 2><<<grid, MV_THREADS, 0, st>>>(a); break;
    case 3: mv_kernel<T, 3><<<grid, MV_THREADS, 0, st>>>(a); break;
    case 4: mv_kernel<T, 4><<<grid, MV_THREADS, 0, st>>>(a); break;
    case 5: mv_kernel<T, 5><<<grid, MV_THREADS, 0, st>>>(a); break;
    case 6: mv_kernel<T, 6><<<grid, MV_THREADS, 0, st>>>(a); break;
    case 7: mv_kernel<T, 7><<<grid, MV_THREADS, 0, st>>>(a); break;
    case 8: mv_kernel<T, 8><<<grid, MV_THREADS, 0, st>>>(a); break;
    default: return core_fail(PSHARD_ERR_INVALID_ARG, "matvec: %d tokens (1..8)", nt);
    }
    CUDA_TRY_LAUNCH("matvec");
    return PSHARD_OK;
}

#endif
