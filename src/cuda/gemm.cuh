/* The fused dequantizing tensor-core GEMM inside the backend: shared by the dense prefill path
 * and the expert-grouped MoE path. */
#ifndef CUDA_GEMM_CUH
#define CUDA_GEMM_CUH

#include "cuda/cuda_internal.cuh"
#include "cuda/cuda_sizes.h"

enum { GEMM_TILE_M = CUDA_GEMM_TILE_M, GEMM_TILE_N = 128 };

struct gemm_args {
    const uint8_t *w;       /* the matrix, or expert 0 of a 3-D expert tensor */
    size_t row_bytes;
    int n_rows, n_cols;
    const __half *x;        /* activations in f16, x_stride halves per row */
    int64_t x_stride;
    int n_tokens;           /* dense: rows of x and y */
    float *y;
    int64_t y_stride;
    /* Expert groups (NULL pairs: dense): tile t covers pairs [tile_start[t], +64) of expert
     * tile_expert[t], clipped to the expert's end. */
    const int32_t *pairs, *expert_start, *tile_expert, *tile_start, *n_tiles;
    const void *const *expert_ptrs;
    size_t expert_stride;
    int act_div;            /* activation row of pair p is p / act_div */
    /* The int8 kernel (mmq.cu): activation rows (cuda_act_type's format) act_row_bytes apart
     * instead of x; the copy units it found for the weights and the activations. */
    const uint8_t *act;
    size_t act_row_bytes;
    int mq_unit, mq_act_unit;
};

/* The block's weights (an expert's, or the matrix) and, a tile row each, the activation row it
 * reads and the output row it writes (-1: none); NULL where the block has no tile. */
__device__ __forceinline__ const uint8_t *tile_rows(const gemm_args &a, int *a_rows, int *o_rows) {
    const int tid = threadIdx.x;
    if (!a.pairs) {
        if (tid < GEMM_TILE_M) {
            const int t = blockIdx.y * GEMM_TILE_M + tid;
            a_rows[tid] = o_rows[tid] = t < a.n_tokens ? t : -1;
        }
        return a.w;
    }
    const int tile = blockIdx.y;
    if (tile >= *a.n_tiles) return nullptr;
    const int e = a.tile_expert[tile], start = a.tile_start[tile], end = a.expert_start[e + 1];
    if (tid < GEMM_TILE_M) {
        const int p = start + tid < end ? a.pairs[start + tid] : -1;
        a_rows[tid] = p >= 0 ? p / a.act_div : -1;
        o_rows[tid] = p;
    }
    return a.expert_ptrs ? (const uint8_t *)a.expert_ptrs[e] : a.w + (size_t)e * a.expert_stride;
}

/* The fused GEMM's tiles (grid_y of them, rows of 128) on int8 tensor cores, for the formats of
 * cuda_int8_products, activations a.act in cuda_act_type(type): y = x . W^T as the matrix-vector
 * kernel's integers, summed part by part in f32. */
pshard_status mmq_run(enum quant_type type, const gemm_args &a, unsigned grid_y, cudaStream_t st);

/* Whether the fused GEMM copies this matrix's rows as raw bytes (gemm_raw_kernel: a block format
 * with 4-byte-aligned blocks, rows of whole 256-element stages), rather than dequantizing them one
 * thread a row. */
bool gemm_reads_raw(enum quant_type type, int64_t n_cols);

/* Launch over (n_rows / 128, grid_y) tiles: grid_y = token tiles (dense) or a bound on the
 * number of expert tiles. */
pshard_status gemm_fused_run(enum quant_type type, const gemm_args &a, unsigned grid_y, cudaStream_t st);

#endif
