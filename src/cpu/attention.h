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

/* One query token: q [n_head][head_k] f32 attends to cells 0..n_cells-1 of k [cell][n_head_kv
 * * head_k] and v [cell][n_head_kv * head_v] (f16 bits); out [n_head][head_v]. Heads
 * [head_begin, head_end) only, so callers can split heads across threads; heads in the range
 * that share a KV head read the cache together (a head's result does not depend on the range). */
void cpu_attention_heads(const struct cpu_attn_shape *s, const float *q, const uint16_t *k, const uint16_t *v,
                         int64_t n_cells, int head_begin, int head_end, float *out);

/* Tokens of one sequence: q [n_tokens][n_head * head_k], token i attending cells
 * 0..n_cells[i]-1, out [n_tokens][n_head * head_v]; heads [head_begin, head_end). Each token's
 * result is the one cpu_attention_heads gives it alone, bit for bit; the tokens read the cache
 * together, a tile of them per block of cells. */
void cpu_attention_tokens(const struct cpu_attn_shape *s, const float *q, const uint16_t *k, const uint16_t *v,
                          const int64_t *n_cells, int n_tokens, int head_begin, int head_end, float *out);

/* A step's attention as units of work for a thread pool: each a run of query heads that share a
 * KV head (the whole group, at most 8) for one token, or, where the step's tokens are all of one
 * sequence, for a tile of consecutive tokens (up to 64 query rows); tiles shrink, then the heads
 * a unit takes, until there is a unit for each of n_threads. */
enum { CPU_ATTN_TILE_TOKENS = 64 }; /* the most tokens a unit takes */
struct cpu_attn_units {
    int per, slices;  /* heads a unit takes; units a KV head's group makes */
    int tokens;       /* tokens a unit takes (the last tile may take fewer) */
    int64_t n_tokens; /* the step's */
    int64_t count;    /* tiles * n_head_kv * slices */
};
void cpu_attention_units(const struct cpu_attn_shape *s, int64_t n_tokens, bool one_sequence, int n_threads,
                         struct cpu_attn_units *u);

/* Unit `unit` (0 <= unit < u->count): its tokens [token_begin, token_end) and heads
 * [head_begin, head_end). Units are in the order of their tokens. */
void cpu_attention_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t unit, int64_t *token_begin,
                        int64_t *token_end, int *head_begin, int *head_end);

#endif
