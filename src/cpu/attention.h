/* Causal attention of new tokens over an f16 KV cache, with an online softmax, so memory does
 * not grow with the context and no score matrix is formed. */
#ifndef CPU_ATTENTION_H
#define CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"

struct cpu_attn_shape {
    int n_head, n_head_kv, head_k, head_v;
    float scale; /* usually 1/sqrt(head_k) */
};

/* The kernels score keys CPU_ATTN_KEY_BLOCK cells at a time, from multiples of it. */
enum { CPU_ATTN_KEY_BLOCK = 64 };

/* One sequence's cells in a paged cache: cell c is row blocks[c / block_cells] * block_cells +
 * c % block_cells of k (rows of n_head_kv * head_k f16 values) and of v (n_head_kv * head_v).
 * block_cells is a multiple of CPU_ATTN_KEY_BLOCK, so a block of keys is one table lookup. */
struct cpu_kv_view {
    const uint16_t *k, *v;
    const int32_t *blocks;
    int64_t block_cells;
};

/* A cache whose cells are k's and v's rows in order (one block that never ends). */
static inline struct cpu_kv_view cpu_kv_contiguous(const uint16_t *k, const uint16_t *v) {
    static const int32_t first = 0;
    return (struct cpu_kv_view){k, v, &first, (int64_t)CPU_ATTN_KEY_BLOCK << 34};
}

/* One query token: q [n_head][head_k] f32 attends to cells 0..n_cells-1 of the cache kv; out
 * [n_head][head_v]. Heads
 * [head_begin, head_end) only, so callers can split heads across threads; heads in the range
 * that share a KV head read the cache together (a head's result does not depend on the range). */
void cpu_attention_heads(const struct cpu_attn_shape *s, const float *q, const struct cpu_kv_view *kv, int64_t n_cells,
                         int head_begin, int head_end, float *out);

/* Tokens of one sequence: q [n_tokens][n_head * head_k], token i attending cells
 * 0..n_cells[i]-1, out [n_tokens][n_head * head_v]; heads [head_begin, head_end). Each token's
 * result is the one cpu_attention_heads gives it alone, bit for bit; the tokens read the cache
 * together, a tile of them per block of cells. */
void cpu_attention_tokens(const struct cpu_attn_shape *s, const float *q, const struct cpu_kv_view *kv,
                          const int64_t *n_cells, int n_tokens, int head_begin, int head_end, float *out);

/* A step's attention as units of work for a thread pool: each the query heads of several KV
 * heads (their whole groups, all of them at first) for one token, or a run of query heads that
 * share a KV head (the whole group, at most 8) for one token, or, where the step's tokens are all
 * of one sequence, for a tile of consecutive tokens (up to 64 query rows); tiles shrink, then the
 * KV heads a unit takes, then its query heads, until there is a unit for each of n_threads. A
 * unit of several KV heads reads a cell's rows of all of them, which lie side by side.
 *
 * A step of at most CPU_ATTN_SPLIT_TOKENS tokens whose longest cache has 2 * CPU_ATTN_SPLIT_CELLS
 * cells or more also cuts each token's cells into runs (splits): CPU_ATTN_SPLIT_CELLS cells each,
 * more where the cache would make over CPU_ATTN_MAX_SPLITS of them. A unit then attends one run
 * of one token with its heads, leaving partial sums (cpu_attention_split) that
 * cpu_attention_merge combines once every unit is done. Without runs, a decode step of qwen30b's
 * shape on 16 threads cut each KV head's group of 8 query heads into 4 units of 2, and each read
 * the whole cache of its KV head; and 3 KV heads on 2 threads left one idle a third of the time.
 * The runs depend on the step's cells, not on the threads, so a token's result does not depend
 * on the thread count (it differs from the unsplit path's by rounding). */
enum { CPU_ATTN_TILE_TOKENS = 64 }; /* the most tokens a unit takes */
enum { CPU_ATTN_SPLIT_TOKENS = 4, CPU_ATTN_SPLIT_CELLS = 512, CPU_ATTN_MAX_SPLITS = 64 };
struct cpu_attn_units {
    int per, slices;     /* heads a unit takes; units a KV head's group makes */
    int kv_per;          /* KV heads a unit takes (more than 1: their whole groups, a token a unit) */
    int tokens;          /* tokens a unit takes (the last tile may take fewer) */
    int splits;          /* runs a token's cells are cut into (1: none) */
    int64_t split_cells; /* cells a run takes */
    int64_t n_tokens;    /* the step's */
    int64_t count;       /* tiles * ceil(n_head_kv / kv_per) * slices * splits */
};
/* max_cells: the most cells a token of the step attends. */
void cpu_attention_units(const struct cpu_attn_shape *s, int64_t n_tokens, int64_t max_cells, bool one_sequence,
                         int n_threads, struct cpu_attn_units *u);

/* Unit `unit` (0 <= unit < u->count): its tokens [token_begin, token_end), heads [head_begin,
 * head_end) and run (0 when u->splits is 1). Units are in the order of their tokens. */
void cpu_attention_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t unit, int64_t *token_begin,
                        int64_t *token_end, int *head_begin, int *head_end, int *split);

/* Floats of the partial sums a split step leaves (u->splits > 1): for each token, query head and
 * run, the run's maximum score, its sum of exponentials and its unnormalized output. */
static inline int64_t cpu_attention_partial_floats(const struct cpu_attn_shape *s, const struct cpu_attn_units *u) {
    return u->splits > 1 ? u->n_tokens * s->n_head * u->splits * (s->head_v + 2) : 0;
}
/* The most a step of at most CPU_ATTN_SPLIT_TOKENS tokens needs. */
static inline int64_t cpu_attention_partial_floats_max(const struct cpu_attn_shape *s) {
    return (int64_t)CPU_ATTN_SPLIT_TOKENS * s->n_head * CPU_ATTN_MAX_SPLITS * (s->head_v + 2);
}

/* Run `split` of token `token` (q: that token's queries, n_cells: the cells it attends) for heads
 * [head_begin, head_end), a KV head after another: its partial sums into `partial` (the step's). */
void cpu_attention_split(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *q,
                         const struct cpu_kv_view *kv, int64_t n_cells, int64_t token, int head_begin, int head_end, int split,
                         float *partial);

/* Runs a unit as cpu_attention_unit gave it: q and out are the step's ([n_tokens][n_head * head_k],
 * [n_tokens][n_head * head_v]), kv the cache of the unit's tokens' sequence, n_cells the
 * cells of each of the unit's tokens; a split step's run leaves its sums in `partial`. */
void cpu_attention_run_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t token_begin,
                            int64_t token_end, int head_begin, int head_end, int split, const float *q,
                            const struct cpu_kv_view *kv, const int64_t *n_cells, float *partial, float *out);

/* Every token's output, out [n_tokens][n_head * head_v], from the runs' partial sums. */
void cpu_attention_merge(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *partial, float *out);
/* The same left as partial sums, the runs' together: for each token and query head its maximum
 * score, its sum of exponentials and its unnormalized output (head_v + 2 floats), into sums
 * [n_tokens][n_head][head_v + 2], for attention over more cells elsewhere to merge with. */
void cpu_attention_merge_sums(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *partial,
                              float *sums);

#endif
