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
};

/* Whether the fused GEMM copies this matrix's rows as raw bytes (gemm_raw_kernel: a block format
 * with 4-byte-aligned blocks, rows of whole 256-element stages), rather than dequantizing them one
 * thread a row. */
bool gemm_reads_raw(enum quant_type type, int64_t n_cols);

/* Launch over (n_rows / 128, grid_y) tiles: grid_y = token tiles (dense) or a bound on the
 * number of expert tiles. */
pshard_status gemm_fused_run(enum quant_type type, const gemm_args &a, unsigned grid_y, cudaStream_t st);

#endif
