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
 * [head_begin, head_end) only, so callers can split heads across threads. */
void cpu_attention_heads(const struct cpu_attn_shape *s, const float *q, const uint16_t *k, const uint16_t *v,
                         int64_t n_cells, int head_begin, int head_end, float *out);

#endif
