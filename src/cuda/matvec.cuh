/* The matrix-vector kernels' launch interface inside the backend: the argument block shared by
 * the dense and the expert-grouped (MoE) uses, and one launcher per family of formats. */
#ifndef CUDA_MATVEC_CUH
#define CUDA_MATVEC_CUH

#include "cuda/cuda_internal.cuh"

enum {
    MV_WARPS = 4,
    MV_THREADS = 32 * MV_WARPS,
    MV_CHUNK = 2048,            /* bytes of a row staged per warp at a time */
    MV_UNITS = MV_CHUNK / 512,  /* 16-byte loads per lane per chunk */
    MV_DIRECT = 2,              /* items a lane has in flight where it reads them directly (mv_row_direct) */
    MV_GROUP_ROWS = 32,         /* rows of an expert a block of mv_group_kernel takes */
    MV_GROUP_PASS = 4,          /* most pairs a pass of mv_group_kernel takes */
    MV_GROUP_ACT_BYTES = 40960, /* most bytes of a pass's activations mv_group_kernel stages */
    MV_MAX_PARTS = CUDA_MATVEC_MAX_PARTS,
};

struct mv_args {
    const uint8_t *w;        /* the matrix, or expert 0 of a 3-D expert tensor */
    size_t row_bytes;
    int n_rows;
    int n_blocks;            /* blocks per row (float types: units of 32 elements) */
    int chunk_blocks;        /* blocks staged per chunk */
    bool in_vram;            /* the weights are in device memory, not read in place (tables of experts: unset) */
    bool direct;             /* lanes read their items from global memory (mv_row_direct; set by mv_run) */
    bool aligned;            /* rows start on 16 bytes: stage with 16-byte loads */
    const uint8_t *act;      /* quantized activations, act_row_bytes per row */
    size_t act_row_bytes;
    float *y;
    int64_t y_stride;
    int n_tokens;            /* dense: every pass's tokens, blockIdx.y picking a pass of NT */
    /* Expert groups (NULL pairs: dense). */
    const int32_t *pairs;        /* token * k + slot, grouped by expert */
    const int32_t *expert_start; /* [n_expert + 1] into pairs */
    const int32_t *active;       /* experts with pairs, blockIdx.y indexes it */
    const int32_t *n_active;
    const void *const *expert_ptrs; /* optional per-expert matrices */
    size_t expert_stride;        /* bytes between experts of the 3-D tensor */
    int act_div;                 /* activation row of pair p is p / act_div */
    size_t act_stage_stride;     /* set by mv_run: a pass's activations fit mv_group_kernel's
                                    stage, rows this many bytes apart (0: mv_kernel runs the groups) */
    /* Dense: y += the product instead of y = (the residual stream takes a projection directly). */
    bool accumulate;
    /* Dense: up to MV_MAX_PARTS matrices of one type and width side by side (q, k and v; gate and
     * up), n_rows their rows in all: rows below part_end[0] are w's, then part 1's... Each part
     * writes its own y. n_parts 0 or 1: w alone. */
    int n_parts;
    const uint8_t *part_w[MV_MAX_PARTS];
    int part_end[MV_MAX_PARTS];
    float *part_y[MV_MAX_PARTS];
    int64_t part_y_stride[MV_MAX_PARTS];
};

/* Fill the geometry of `a` for a matrix of `type` (n_blocks, chunk_blocks, aligned) and launch
 * with grid (rows / MV_WARPS, grid_y) for nt tokens per pass. */
pshard_status mv_run(enum quant_type type, int64_t n_cols, mv_args a, int nt, unsigned grid_y, cudaStream_t st);

/* mv_group_kernel's dynamic shared memory: the weight stages, then a pass's activations. */
static inline size_t mv_group_smem(const mv_args &a) {
    return (size_t)MV_WARPS * MV_CHUNK + (size_t)MV_GROUP_PASS * a.act_stage_stride;
}

pshard_status mv_launch_legacy(enum quant_type type, int nt, const mv_args &a, dim3 grid, cudaStream_t st);
pshard_status mv_launch_kquants(enum quant_type type, int nt, const mv_args &a, dim3 grid, cudaStream_t st);
pshard_status mv_launch_float(enum quant_type type, int nt, const mv_args &a, dim3 grid, cudaStream_t st);

/* F32 weights (matvec_float.cu) for many tokens with the activations' tile in shared memory, and
 * for 1..8 tokens a block a row: the same sums, bit for bit, as mv_launch_float's (each token's
 * as a one-token call's); mv_f32_tiles and mv_f32_rows say whether they take a call. */
bool mv_f32_tiles(const mv_args &a, int64_t n_cols);
pshard_status mv_f32_tiled(const mv_args &a, int64_t n_cols, cudaStream_t st);
bool mv_f32_rows(const mv_args &a, int64_t n_cols);
pshard_status mv_f32_by_rows(const mv_args &a, int64_t n_cols, cudaStream_t st);

#endif
