/* The fused expert FFN of small MoE steps (up to CUDA_MOE_FUSED_MAX_TOKENS tokens): three launches
 * where the grouped path takes eight (grouping, quantization, gate, up, SwiGLU, quantization,
 * down, weighted sum).
 *
 *   gate_up: grid (n_ff / FUSED_WARPS, pairs). Block y takes pair y's expert if y is the first
 *            pair routed to it (the others return), gathers the expert's pairs with warp votes,
 *            and each warp streams one row of gate and one of up together, writing
 *            h[pair][row] = silu(gate . x) * up . x for each of the expert's pairs.
 *   (h quantized for down once, by cuda_quantize: every block of down reads its token's rows.)
 *   down:    grid (n_embd / FUSED_WARPS, n_tokens). Each warp of block (x, t) streams one row of
 *            every one of token t's experts' down matrices together and sums w[t][j] * (row .
 *            h_act[t][j]) in slot order, as weighted_sum_kernel (and the CPU) does, into out[t][row].
 *
 * Both stream several rows as one sequence of chunks (mv_stream), so a warp keeps a chunk's
 * worth of loads in flight even where each row is a few hundred bytes (qwen30b's down rows: 432
 * bytes). Experts all in VRAM (no tables, nothing read in place) stream by asynchronous copies
 * instead (mv_stream_async): two chunks in flight and no registers holding them; host memory read
 * in place that way was 2.3x slower (bench/cuda_kernels.md). Each expert's gate and up are read
 * once per pass of up to NT pairs; down is read once per token that chose the expert (at 4 tokens
 * of 128 experts, top 8: 32 reads of ~29 experts). The formats' dots are the matrix-vector
 * kernel's (matvec_kernel.cuh). */
#ifndef CUDA_MOE_FUSED_CUH
#define CUDA_MOE_FUSED_CUH

#include "cuda/async_copy.cuh"
#include "cuda/matvec_kernel.cuh"
#include "cuda/quantize_act.cuh"

enum {
    FUSED_WARPS = 8,
    FUSED_THREADS = 32 * FUSED_WARPS,
    FUSED_MAX_K = 16,
    FUSED_STAGES = 2, /* a warp's chunks in shared memory at most, streaming asynchronously */
    FUSED_MAX_PAIRS = CUDA_MOE_FUSED_MAX_TOKENS * FUSED_MAX_K,
};

struct moe_fused_args {
    /* Expert e's matrices: table[e] where there is a table, else base + e * stride. */
    const uint8_t *gate, *up, *down;
    const void *const *gate_ptrs, *const *up_ptrs, *const *down_ptrs;
    size_t gate_stride, down_stride;
    size_t gu_row_bytes, down_row_bytes;
    int gu_blocks, gu_chunk_blocks, gu_unit; /* blocks per gate/up row; per chunk; bytes per load */
    int down_blocks, down_chunk_blocks, down_unit;
    bool async;                    /* experts all in VRAM: mv_stream_async */
    int gu_stage_bytes, gu_stages; /* its stages a warp: a chunk's bytes rounded up to 16, how many */
    int down_stage_bytes, down_stages;
    int n_embd, n_ff, k, n_pairs;
    const int32_t *ids;
    const float *weights;
    const uint8_t *mask;
    const uint8_t *x_act; /* [n_tokens][x_act_row_bytes]: x quantized for gate/up */
    size_t x_act_row_bytes;
    float *h;             /* [pairs][n_ff] */
    const uint8_t *h_act; /* [pairs][h_act_row_bytes]: h quantized for down */
    size_t h_act_row_bytes;
    float *out;
    bool accumulate;
};

/* A chunk's share of one lane in units of U (16, 8 or 4 bytes): loads of the flattened bytes
 * [at, at + bytes) of rows row_bytes long (a unit never straddles two), and the stores into the
 * stage. pre holds MV_CHUNK / 32 bytes whatever U is. */
template <class U>
__device__ __forceinline__ void stream_fetch(const uint8_t *const *rows, int64_t row_bytes, int64_t at, int bytes,
                                             int lane, uint4 *pre) {
    constexpr int N = MV_CHUNK / 32 / (int)sizeof(U);
    U *p = (U *)pre;
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int i = lane + 32 * u;
        if (i * (int)sizeof(U) < bytes) {
            const int64_t o = at + (int64_t)sizeof(U) * i;
            const int j = (int)(o / row_bytes);
            p[u] = __ldg((const U *)(rows[j] + (o - j * row_bytes)));
        }
    }
}

template <class U> __device__ __forceinline__ void stream_store(uint8_t *stage, int bytes, int lane, const uint4 *pre) {
    constexpr int N = MV_CHUNK / 32 / (int)sizeof(U);
    const U *p = (const U *)pre;
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int i = lane + 32 * u;
        if (i * (int)sizeof(U) < bytes) ((U *)stage)[i] = p[u];
    }
}

/* Stream n rows of format T (rows[j] their addresses, in the warp's shared slot; each nb blocks,
 * and rows and their starts a multiple of `unit` bytes: 16, 8 or 4) through the warp's stage in
 * chunks of cb whole blocks, a chunk running on from one row into the next; the next chunk's
 * loads are in flight while a chunk is computed. item(j, block of the row, part, staged block)
 * runs for every item, lanes taking them in turn. */
template <class T, class F>
__device__ __forceinline__ void mv_stream(const uint8_t *const *rows, int n, int nb, int cb, int unit, uint8_t *stage,
                                          int lane, F item) {
    const int total = n * nb;
    const int64_t row_bytes = (int64_t)nb * T::BYTES;
    uint4 pre[MV_UNITS];
    auto fetch = [&](int b0) {
        const int bytes = min(cb, total - b0) * T::BYTES;
        const int64_t at = (int64_t)b0 * T::BYTES;
        if (unit == 16) stream_fetch<uint4>(rows, row_bytes, at, bytes, lane, pre);
        else if (unit == 8) stream_fetch<uint2>(rows, row_bytes, at, bytes, lane, pre);
        else stream_fetch<uint32_t>(rows, row_bytes, at, bytes, lane, pre);
    };
    if (total > 0) fetch(0);
    for (int b0 = 0; b0 < total; b0 += cb) {
        const int here = min(cb, total - b0);
        __syncwarp(); /* every lane is done with the previous chunk */
        if (unit == 16) stream_store<uint4>(stage, here * T::BYTES, lane, pre);
        else if (unit == 8) stream_store<uint2>(stage, here * T::BYTES, lane, pre);
        else stream_store<uint32_t>(stage, here * T::BYTES, lane, pre);
        if (b0 + cb < total) fetch(b0 + cb);
        __syncwarp();
        const int items = here * T::IPB;
        for (int it = lane; it < items; it += 32) {
            const int blk = it / T::IPB, part = it % T::IPB;
            const int flat = b0 + blk, j = flat / nb;
            item(j, flat - j * nb, part, stage + blk * T::BYTES);
        }
    }
}

/* Copies of the flattened bytes [at, at + bytes) of rows row_bytes long (rows[j] their addresses)
 * into dst, lane i taking units i, i + 32, ... of U bytes (16, 8 or 4: a unit never straddles two
 * rows). */
template <int U>
__device__ __forceinline__ void stream_copy(const uint8_t *const *rows, int row_bytes, int at, int bytes, int lane,
                                            uint8_t *dst) {
    for (int i = lane; i * U < bytes; i += 32) {
        const int o = at + U * i, j = o / row_bytes;
        copy_unit(dst + U * i, rows[j] + (o - j * row_bytes), U);
    }
}

/* mv_stream by asynchronous copies into up to FUSED_STAGES stages `stride` bytes apart: the
 * copies of the next chunk are in flight while one is computed (with two chunks, both at once).
 * The same chunks and items as mv_stream, so the same sums. */
template <class T, class F>
__device__ __forceinline__ void mv_stream_async(const uint8_t *const *rows, int n, int nb, int cb, int unit,
                                                uint8_t *stage, int stride, int lane, F item) {
    const int total = n * nb, row_bytes = nb * T::BYTES, n_chunks = (total + cb - 1) / cb;
    auto fetch = [&](int c) {
        const int at = c * cb * T::BYTES, bytes = min(cb, total - c * cb) * T::BYTES;
        uint8_t *dst = stage + (c % FUSED_STAGES) * stride;
        if (unit == 16) stream_copy<16>(rows, row_bytes, at, bytes, lane, dst);
        else if (unit == 8) stream_copy<8>(rows, row_bytes, at, bytes, lane, dst);
        else stream_copy<4>(rows, row_bytes, at, bytes, lane, dst);
    };
#pragma unroll
    for (int c = 0; c < FUSED_STAGES - 1; c++) {
        if (c < n_chunks) fetch(c);
        copy_commit();
    }
    for (int c = 0; c < n_chunks; c++) {
        if (c + FUSED_STAGES - 1 < n_chunks) fetch(c + FUSED_STAGES - 1); /* into the stage computed last */
        copy_commit();
        copy_wait_n<FUSED_STAGES - 1>(); /* this lane's copies of chunk c have landed */
        __syncwarp();                    /* and every lane's */
        const int b0 = c * cb, items = min(cb, total - b0) * T::IPB;
        const uint8_t *chunk = stage + (c % FUSED_STAGES) * stride;
        for (int it = lane; it < items; it += 32) {
            const int blk = it / T::IPB, part = it % T::IPB;
            const int flat = b0 + blk, j = flat / nb;
            item(j, flat - j * nb, part, chunk + blk * T::BYTES);
        }
        __syncwarp(); /* every lane is done with the stage before it is refilled */
    }
}

/* A warp's stream of rows through its part of the launch's dynamic shared memory: asynchronous
 * copies (stages of stage_bytes) where ASYNC, else mv_stream (one MV_CHUNK). */
template <class T, bool ASYNC, class F>
__device__ __forceinline__ void fused_stream(const uint8_t *const *rows, int n, int nb, int cb, int unit, uint8_t *smem,
                                             int warp, int stages, int stage_bytes, int lane, F item) {
    if constexpr (ASYNC)
        mv_stream_async<T>(rows, n, nb, cb, unit, smem + (size_t)warp * stages * stage_bytes, stage_bytes, lane, item);
    else
        mv_stream<T>(rows, n, nb, cb, unit, smem + (size_t)warp * MV_CHUNK, lane, item);
}

template <class T, int NT, bool ASYNC>
__global__ void __launch_bounds__(FUSED_THREADS) moe_gate_up_kernel(const moe_fused_args a) {
    extern __shared__ __align__(16) uint8_t fused_smem[]; /* the warps' stages (fused_stream) */
    __shared__ const uint8_t *rows[FUSED_WARPS][2];
    __shared__ int group[FUSED_MAX_PAIRS];
    __shared__ int n_group;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, p = blockIdx.y;
    dep_enter();
    const int e = a.ids[p];
    if (a.mask && !a.mask[e]) return; /* the same for the whole block */
    if (warp == 0) {
        /* Pairs before p routed to e: not this block's expert. Else e's pairs from p on. */
        bool taken = false;
        for (int q0 = 0; q0 < p; q0 += 32) taken |= __any_sync(0xffffffffu, q0 + lane < p && a.ids[q0 + lane] == e);
        int n = 0;
        for (int q0 = p; q0 < a.n_pairs && !taken; q0 += 32) {
            const bool mine = q0 + lane < a.n_pairs && a.ids[q0 + lane] == e;
            const unsigned votes = __ballot_sync(0xffffffffu, mine);
            if (mine) group[n + __popc(votes & ((1u << lane) - 1))] = q0 + lane;
            n += __popc(votes);
        }
        if (lane == 0) n_group = taken ? 0 : n;
    }
    __syncthreads();
    const int row = blockIdx.x * FUSED_WARPS + warp;
    if (n_group == 0 || row >= a.n_ff) return; /* no block-wide syncs below */
    if (lane == 0) {
        rows[warp][0] = expert_matrix(a.gate, a.gate_ptrs, a.gate_stride, e) + (size_t)row * a.gu_row_bytes;
        rows[warp][1] = expert_matrix(a.up, a.up_ptrs, a.gate_stride, e) + (size_t)row * a.gu_row_bytes;
    }
    __syncwarp();
    for (int g = 0; g < n_group; g += NT) {
        /* A short last pass repeats its last pair (no branches in the dots) and does not store it. */
        const uint8_t *arow[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) arow[t] = a.x_act + (size_t)(group[min(g + t, n_group - 1)] / a.k) * a.x_act_row_bytes;
        float acc_g[NT], acc_u[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc_g[t] = acc_u[t] = 0.0f;
        fused_stream<T, ASYNC>(rows[warp], 2, a.gu_blocks, a.gu_chunk_blocks, a.gu_unit, fused_smem, warp, a.gu_stages,
                               a.gu_stage_bytes, lane, [&](int j, int blk, int part, const uint8_t *w) {
                         if (j == 0) T::template dot<NT>(w, part, arow, (int64_t)blk * T::ACT_BYTES, acc_g);
                         else T::template dot<NT>(w, part, arow, (int64_t)blk * T::ACT_BYTES, acc_u);
                     });
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float gv = warp_sum(acc_g[t]), uv = warp_sum(acc_u[t]);
            if (lane == 0 && g + t < n_group)
                a.h[(size_t)group[g + t] * a.n_ff + row] = swiglu_value(gv, uv);
        }
    }
}

template <class T, bool ASYNC> __global__ void __launch_bounds__(FUSED_THREADS) moe_down_kernel(const moe_fused_args a) {
    extern __shared__ __align__(16) uint8_t fused_smem[]; /* the warps' stages (fused_stream) */
    __shared__ const uint8_t *rows[FUSED_WARPS][FUSED_MAX_K], *acts[FUSED_WARPS][FUSED_MAX_K];
    __shared__ int slots[FUSED_WARPS][FUSED_MAX_K];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = blockIdx.y;
    dep_enter();
    const int32_t *ids = a.ids + (size_t)t * a.k;
    const int row = blockIdx.x * FUSED_WARPS + warp;
    if (row >= a.n_embd) return; /* no block-wide syncs below */
    /* The token's experts computed here (u-th: slot slots[u]), in slot order: stream row `row` of
     * each, one after the other. */
    const bool used = lane < a.k && (!a.mask || a.mask[ids[lane]]);
    const unsigned votes = __ballot_sync(0xffffffffu, used);
    const int n_used = __popc(votes);
    if (used) {
        const int u = __popc(votes & ((1u << lane) - 1));
        rows[warp][u] = expert_matrix(a.down, a.down_ptrs, a.down_stride, ids[lane]) + (size_t)row * a.down_row_bytes;
        acts[warp][u] = a.h_act + ((size_t)t * a.k + lane) * a.h_act_row_bytes;
        slots[warp][u] = lane;
    }
    __syncwarp();
    float acc[FUSED_MAX_K]; /* a lane's share of each expert's dot */
#pragma unroll
    for (int u = 0; u < FUSED_MAX_K; u++) acc[u] = 0.0f;
    fused_stream<T, ASYNC>(rows[warp], n_used, a.down_blocks, a.down_chunk_blocks, a.down_unit, fused_smem, warp,
                           a.down_stages, a.down_stage_bytes, lane, [&](int u, int blk, int part, const uint8_t *w) {
                     const uint8_t *arow[1] = {acts[warp][u]};
                     T::template dot<1>(w, part, arow, (int64_t)blk * T::ACT_BYTES, &acc[u]);
                 });
    float o = 0.0f;
    for (int u = 0; u < n_used; u++) {
        const float v = warp_sum(acc[u]);
        o = __fadd_rn(o, __fmul_rn(a.weights[(size_t)t * a.k + slots[warp][u]], v));
    }
    if (lane == 0) {
        float *y = a.out + (size_t)t * a.n_embd + row;
        *y = a.accumulate ? *y + o : o;
    }
}

/* gate/up for nt tokens (1..CUDA_MOE_FUSED_MAX_TOKENS) a pass; down and the weighted sum. */
template <class T, bool ASYNC> pshard_status moe_gate_up_run(int nt, const moe_fused_args &a, cudaStream_t st) {
    const dim3 grid((unsigned)ceil_div(a.n_ff, FUSED_WARPS), (unsigned)a.n_pairs);
    const size_t smem = (size_t)FUSED_WARPS * (ASYNC ? a.gu_stages * a.gu_stage_bytes : MV_CHUNK);
    void (*kernel)(const moe_fused_args) = NULL;
    switch (nt) {
    case 1: kernel = moe_gate_up_kernel<T, 1, ASYNC>; break;
    case 2: kernel = moe_gate_up_kernel<T, 2, ASYNC>; break;
    case 3: kernel = moe_gate_up_kernel<T, 3, ASYNC>; break;
    case 4: kernel = moe_gate_up_kernel<T, 4, ASYNC>; break;
    default: return core_fail(PSHARD_ERR_INVALID_ARG, "fused MoE: %d tokens (1..%d)", nt, (int)CUDA_MOE_FUSED_MAX_TOKENS);
    }
    CUDA_TRY(launch_dep(kernel, grid, FUSED_THREADS, smem, st, a));
    return PSHARD_OK;
}

template <class T> pshard_status moe_gate_up_launch(int nt, const moe_fused_args &a, cudaStream_t st) {
    return a.async ? moe_gate_up_run<T, true>(nt, a, st) : moe_gate_up_run<T, false>(nt, a, st);
}

template <class T> pshard_status moe_down_launch(const moe_fused_args &a, cudaStream_t st) {
    const dim3 grid((unsigned)ceil_div(a.n_embd, FUSED_WARPS), (unsigned)(a.n_pairs / a.k));
    if (a.async)
        CUDA_TRY(launch_dep(moe_down_kernel<T, true>, grid, FUSED_THREADS,
                            (size_t)FUSED_WARPS * a.down_stages * a.down_stage_bytes, st, a));
    else
        CUDA_TRY(launch_dep(moe_down_kernel<T, false>, grid, FUSED_THREADS, (size_t)FUSED_WARPS * MV_CHUNK, st, a));
    return PSHARD_OK;
}

/* One of each per family of formats (matvec_legacy.cu, matvec_kquants.cu, matvec_float.cu). */
#define MOE_FUSED_FAMILY(family)                                                                                      \
    pshard_status moe_gate_up_##family(enum quant_type type, int nt, const moe_fused_args &a, cudaStream_t st);       \
    pshard_status moe_down_##family(enum quant_type type, const moe_fused_args &a, cudaStream_t st);
MOE_FUSED_FAMILY(legacy)
MOE_FUSED_FAMILY(kquants)
MOE_FUSED_FAMILY(float)
#undef MOE_FUSED_FAMILY

#endif
