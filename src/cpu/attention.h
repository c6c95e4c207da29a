/* Causal attention of new tokens over an f16 KV cache, with an online softmax, so memory does
 * not grow with the context and no score matrix is formed. */
#ifndef CPU_ATTENTION_H
#define CPU_ATTENTION_H

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

/* A step's attention as units of work for a thread pool: each a token's run of query heads that
 * share a KV head, the whole group (at most 8) where that leaves a unit for each of n_threads,
 * else halved until it does. */
struct cpu_attn_units {
    int per, slices; /* heads a unit takes; units a KV head's group makes */
    int64_t count;   /* n_tokens * n_head_kv * slices */
};
void cpu_attention_units(const struct cpu_attn_shape *s, int64_t n_tokens, int n_threads, struct cpu_attn_units *u);

/* Unit `unit` (0 <= unit < u->count): its token and heads [head_begin, head_end). */
void cpu_attention_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t unit, int64_t *token,
                        int *head_begin, int *head_end);

#endif
