/* Rotary position embedding: per position a table of (cos, sin) pairs, applied to every head
 * of q and k. Normal ordering rotates adjacent pairs (x[2i], x[2i+1]) (llama); neox ordering
 * rotates x[i] with x[i + n_dims/2] (qwen2/qwen3). Linear, YaRN and per-dimension frequency
 * factors (Llama 3 "rope_freqs") follow the metadata. Multimodal rope (M-RoPE, Qwen2-VL): each
 * token has three positions (time, row, column) and sections say which one turns each rotated
 * pair; with all three equal it is plain rope, to the bit. */
#ifndef CPU_ROPE_H
#define CPU_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/rope.h"

/* cs[2*i], cs[2*i+1] = cos, sin of pair i at position pos (n_dims floats). */
void cpu_rope_table(const struct rope_params *p, int32_t pos, float *cs);

/* The same for M-RoPE: pair i turns by pos[axis(i)], pos = {time, row, column}. */
void cpu_rope_table_multi(const struct rope_params *p, const int32_t pos[3], float *cs);

/* Which of the three positions rotated pair `pair` follows (0 without sections). */
int cpu_rope_axis(const struct rope_params *p, int pair);

/* Rotate n_heads heads of head_size floats each, laid out back to back. */
void cpu_rope_apply(const struct rope_params *p, const float *cs, float *x, int n_heads, int head_size);

#endif
