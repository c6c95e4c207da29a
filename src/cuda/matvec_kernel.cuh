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
 * are the same whichever pass holds it). Expert groups for MoE run likewise, blockIdx.y picking
 * an active expert whose pairs (token, slot) are its tokens, each pass sized to the pairs left;
 * from VRAM on mv_group_kernel, which stages a pass's activations in shared memory for a block's
 * 32 rows (below). Rows whose weights are not 16-byte aligned stage through 2-byte loads instead
 * (correct, slower). One token of F16 or BF16 in VRAM skips the stage: each lane loads its own
 * 64-byte items, two at a time (mv_row_direct). A dense launch may take several matrices of one
 * format and width at once (mv_args.n_parts: q, k and v), and may add into its output
 * (mv_args.accumulate). */
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
        dep_wait(); /* (the weights' loads are in flight; at once after the first time) */
#pragma unroll
        for (int d = 0; d < D; d++)
            if (b0 + 32 * d < nb)
                T::template dot<1>((const uint8_t *)wv[d], 0, arow, (int64_t)(b0 + 32 * d) * T::ACT_BYTES, acc);
    }
}

/* Expert e's matrix: table[e] where there is a table, else base + e * stride (3-D tensors). */
__device__ __forceinline__ const uint8_t *expert_matrix(const uint8_t *base, const void *const *table, size_t stride,
                                                        int e) {
    return table ? (const uint8_t *)table[e] : base + (size_t)e * stride;
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
    dep_wait(); /* the first chunk's loads in flight before the activations are ready */
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

/* One pass over a row: arow[t] . w for NT token rows (a short pass repeats its last row: no
 * branches in the dots), the first n_valid sums stored at y row orow[t]. */
template <class T, int NT>
__device__ __forceinline__ void mv_pass(const uint8_t *w, const mv_args &a, uint8_t *stage, int lane,
                                        const uint8_t *const *arow, const int64_t *orow, int n_valid, float *y,
                                        int64_t y_stride, int row) {
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    mv_row<T, NT>(w, a, stage, lane, arow, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0 && t < n_valid) {
            float *out = y + orow[t] * y_stride + row;
            *out = a.accumulate ? *out + v : v;
        }
    }
}

/* A pass of the fewest tokens, 1, 2, 4 or 8 (at most MAXP), that holds n <= MAXP (expert groups
 * are mostly small: a step of 16 tokens over 128 experts gives 1.6 pairs an expert), so no dots
 * of repeated rows. Each token's sums are the same in any pass. */
template <class T, int MAXP>
__device__ __forceinline__ void mv_pass_sized(const uint8_t *w, const mv_args &a, uint8_t *stage, int lane,
                                              const uint8_t *const *arow, const int64_t *orow, int n, int row) {
    static_assert(MAXP == 4 || MAXP == 8, "passes of 1, 2, 4 or 8");
    if (n <= 1) mv_pass<T, 1>(w, a, stage, lane, arow, orow, n, a.y, a.y_stride, row);
    else if (n <= 2) mv_pass<T, 2>(w, a, stage, lane, arow, orow, n, a.y, a.y_stride, row);
    else if constexpr (MAXP == 4) mv_pass<T, 4>(w, a, stage, lane, arow, orow, n, a.y, a.y_stride, row);
    else if (n <= 4) mv_pass<T, 4>(w, a, stage, lane, arow, orow, n, a.y, a.y_stride, row);
    else mv_pass<T, 8>(w, a, stage, lane, arow, orow, n, a.y, a.y_stride, row);
}

/* Expert group pairs [g, g + n) (n <= NP): their activation rows (STAGED: in act_base,
 * act_stride bytes apart; else where a.act has pair p's row) and output rows, the last repeated
 * up to NP. */
template <bool STAGED, int NP>
__device__ __forceinline__ void mv_group_rows(const mv_args &a, int g, int n, const uint8_t *act_base,
                                              size_t act_stride, const uint8_t **arow, int64_t *orow) {
#pragma unroll
    for (int t = 0; t < NP; t++) {
        const int i = min(t, n - 1), p = a.pairs[g + i];
        arow[t] = STAGED ? act_base + (size_t)i * act_stride : a.act + (int64_t)(p / a.act_div) * a.act_row_bytes;
        orow[t] = p;
    }
}

template <class T, int NT> __global__ void __launch_bounds__(MV_THREADS) mv_kernel(const mv_args a) {
    __shared__ __align__(16) uint8_t stage_all[MV_WARPS][MV_CHUNK];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    dep_release();
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
    if (a.pairs) { /* expert groups whose activations do not fit mv_group_kernel's stage */
        dep_wait();
        if constexpr (NT == CUDA_MATVEC_MAX_TOKENS) { /* (mv_launch runs groups at this NT) */
            if ((int)blockIdx.y >= *a.n_active) return;
            const int e = a.active[blockIdx.y];
            w = expert_matrix(a.w, a.expert_ptrs, a.expert_stride, e);
            const int g_end = a.expert_start[e + 1];
            for (int g = a.expert_start[e]; g < g_end; g += CUDA_MATVEC_MAX_TOKENS) {
                const uint8_t *arow[CUDA_MATVEC_MAX_TOKENS];
                int64_t orow[CUDA_MATVEC_MAX_TOKENS];
                const int n = min(CUDA_MATVEC_MAX_TOKENS, g_end - g);
                mv_group_rows<false, CUDA_MATVEC_MAX_TOKENS>(a, g, n, NULL, 0, arow, orow);
                mv_pass_sized<T, CUDA_MATVEC_MAX_TOKENS>(w + (size_t)row * a.row_bytes, a, stage_all[warp], lane, arow,
                                                         orow, n, row);
            }
        }
        return;
    }
    /* Dense: pass blockIdx.y, tokens [NT * y, NT * y + NT) of n_tokens. */
    const uint8_t *arow[NT];
    int64_t orow[NT];
    const int g = (int)blockIdx.y * NT, n = min(NT, a.n_tokens - g);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        arow[t] = a.act + (int64_t)(g + min(t, n - 1)) * a.act_row_bytes;
        orow[t] = g + t;
    }
    mv_pass<T, NT>(w + (size_t)row * a.row_bytes, a, stage_all[warp], lane, arow, orow, n, y, y_stride, row);
}

/* Expert groups in VRAM whose activations fit a stage (a.act_stage_stride): block (x, y) takes
 * rows [MV_GROUP_ROWS x, + MV_GROUP_ROWS) of active expert y, warp w rows w, w + MV_WARPS, ...,
 * for each pass of up to MV_GROUP_PASS of its pairs. A pass's activation rows are copied once
 * into shared memory for all those rows: lanes read an item's activations at a 36-byte stride
 * (Q8_1), from global memory a cache line every few lanes, each load a replay of several, but from
 * shared memory without conflicts. Passes of at most 4 take 64 registers a thread where 8 take
 * 96 (Q4_0), so more warps stay resident; groups of more pairs read their rows again, mostly
 * from L1/L2. Dynamic shared memory: MV_WARPS weight stages, then the activations. */
template <class T> __global__ void __launch_bounds__(MV_THREADS) mv_group_kernel(const mv_args a) {
    extern __shared__ __align__(16) uint8_t mv_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    dep_enter();
    if ((int)blockIdx.y >= *a.n_active) return; /* the whole block */
    const int e = a.active[blockIdx.y];
    const uint8_t *w = expert_matrix(a.w, a.expert_ptrs, a.expert_stride, e);
    uint8_t *stage = mv_smem + warp * MV_CHUNK, *acts = mv_smem + MV_WARPS * MV_CHUNK;
    const size_t stride = a.act_stage_stride;
    const int row_end = min((int)(blockIdx.x + 1) * MV_GROUP_ROWS, a.n_rows), g_end = a.expert_start[e + 1];
    for (int g = a.expert_start[e]; g < g_end; g += MV_GROUP_PASS) {
        const int n = min((int)MV_GROUP_PASS, g_end - g);
        __syncthreads(); /* the previous pass is done with the stage */
        const int words = (int)(a.act_row_bytes / 4);
        for (int t = 0; t < n; t++) {
            const uint32_t *src = (const uint32_t *)(a.act + (int64_t)(a.pairs[g + t] / a.act_div) * a.act_row_bytes);
            uint32_t *dst = (uint32_t *)(acts + (size_t)t * stride);
            if (a.act_row_bytes % 16 == 0 && (uintptr_t)src % 16 == 0)
                for (int i = threadIdx.x; i < words / 4; i += MV_THREADS) ((uint4 *)dst)[i] = __ldg((const uint4 *)src + i);
            else
                for (int i = threadIdx.x; i < words; i += MV_THREADS) dst[i] = __ldg(src + i);
        }
        __syncthreads();
        const uint8_t *arow[MV_GROUP_PASS];
        int64_t orow[MV_GROUP_PASS];
        mv_group_rows<true, MV_GROUP_PASS>(a, g, n, acts, stride, arow, orow);
        for (int row = (int)blockIdx.x * MV_GROUP_ROWS + warp; row < row_end; row += MV_WARPS)
            mv_pass_sized<T, MV_GROUP_PASS>(w + (size_t)row * a.row_bytes, a, stage, lane, arow, orow, n, row);
    }
}

template <class T> pshard_status mv_launch(int nt, const mv_args &a, dim3 grid, cudaStream_t st) {
    if (a.pairs) { /* expert groups: passes sized to each group (mv_pass_sized) */
        if (a.act_stage_stride)
            CUDA_TRY(launch_dep(mv_group_kernel<T>, dim3((unsigned)ceil_div(a.n_rows, MV_GROUP_ROWS), grid.y),
                                MV_THREADS, mv_group_smem(a), st, a));
        else
            CUDA_TRY(launch_dep(mv_kernel<T, CUDA_MATVEC_MAX_TOKENS>, grid, MV_THREADS, 0, st, a));
        return PSHARD_OK;
    }
    void (*kernel)(const mv_args) = NULL;
    switch (nt) {
    case 1: kernel = mv_kernel<T, 1>; break;
    case 2: kernel = mv_kernel<T, 2>; break;
    case 3: kernel = mv_kernel<T, 3>; break;
    case 4: kernel = mv_kernel<T, 4>; break;
    case 5: kernel = mv_kernel<T, 5>; break;
    case 6: kernel = mv_kernel<T, 6>; break;
    case 7: kernel = mv_kernel<T, 7>; break;
    case 8: kernel = mv_kernel<T, 8>; break;
    default: return core_fail(PSHARD_ERR_INVALID_ARG, "matvec: %d tokens (1..8)", nt);
    }
    CUDA_TRY(launch_dep(kernel, grid, MV_THREADS, 0, st, a));
    return PSHARD_OK;
}

#endif
