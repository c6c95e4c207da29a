/* The CUDA kernels' work buffers and slices as shape arithmetic (cuda_sizes.c): compiled in every
 * build, so a build without CUDA sizes a GPU plan's work buffer as a CUDA build does, and the
 * kernels carve their buffers and cut their caches with these same functions. */
#ifndef CUDA_SIZES_H
#define CUDA_SIZES_H

#include "cuda/cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    CUDA_MATMUL_CHUNK_ROWS = 256,     /* F16 weights read in place: rows copied up at a time */
    CUDA_GEMM_TILE_M = 64,            /* the fused GEMM's rows (expert pairs) a tile */
    CUDA_DECODE_TARGET_BLOCKS = 512,  /* decode attention: blocks to fill the GPU */
    CUDA_DECODE_MIN_SPLIT = 64,       /* decode attention: cells a slice walks at the least */
    CUDA_PREFILL_TARGET_BLOCKS = 256, /* prompt attention: two blocks on each of ~128 SMs */
    CUDA_PREFILL_MIN_SPLIT = 512,     /* prompt attention: cells a slice walks at the least */
};

/* Decode attention's slices of a cache of up to max_kv_len cells for a step of n tokens: enough
 * blocks to fill the GPU, none shorter than CUDA_DECODE_MIN_SPLIT cells. */
void cuda_decode_split(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int *n_splits,
                       int *split_len);

/* Prompt attention's slices: as many as bring the query tiles' blocks to the target, none
 * shorter than CUDA_PREFILL_MIN_SPLIT cells; and the merge buffer they need (0: one slice). */
void cuda_prefill_split(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int *n_splits,
                        int *split_len);
size_t cuda_prefill_split_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len);

/* Whether a step's expert groups run on the tiled GEMM (else the matrix-vector kernel). */
bool cuda_moe_tiled(const struct cuda_moe *m, int64_t n_tokens);

/* The MoE work buffer's parts, as offsets from its start (CUDA_NO_PART: not in this layout). */
#define CUDA_NO_PART ((size_t)-1)
struct cuda_moe_layout {
    size_t expert_start, active, n_active, n_tiles, tile_expert, tile_start, pairs; /* the grouping */
    size_t gate_out, up_out, down_out; /* f32 products of every pair */
    size_t x_act, x_act_up, h_act;     /* activations as the kernels read them */
    size_t bytes;
};
struct cuda_moe_layout cuda_moe_layout(const struct cuda_moe *m, int64_t n_tokens);
/* The most tokens one pass of cuda_moe_ffn takes (its slice). */
int64_t cuda_moe_slice_tokens(const struct cuda_moe *m);

#ifdef __cplusplus
}
#endif

#endif
