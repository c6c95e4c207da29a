/* Inner loops of attention, in a portable and an AVX2/F16C version chosen at run time. */
#ifndef CPU_ATTENTION_KERNELS_H
#define CPU_ATTENTION_KERNELS_H

#include <stdint.h>

/* sum of q[i] * k[i] for f16 k */
float attn_dot_f16_avx2(const float *q, const uint16_t *k, int n);
/* acc[i] += a * v[i] for f16 v */
void attn_axpy_f16_avx2(float *acc, float a, const uint16_t *v, int n);

/* the same over keys and values widened to f32 */
float attn_dot_f32_avx2(const float *q, const float *k, int n);
void attn_axpy_f32_avx2(float *acc, float a, const float *v, int n);
/* out[j] = attn_dot_f32_avx2(q, k + j * k_stride, n) * scale for keys j = 0..n_keys-1, the same
 * sums bit for bit */
void attn_scores_f32_avx2(const float *q, const float *k, int64_t k_stride, int n_keys, int n, float scale, float *out);
/* acc[i] += p[j] * v[j * v_stride + i] for keys j = 0..n_keys-1 in turn (each output the same
 * FMAs in the same order as n_keys calls of attn_axpy_f32_avx2) */
void attn_accumulate_f32_avx2(float *acc, const float *p, const float *v, int64_t v_stride, int n_keys, int n);

#endif
