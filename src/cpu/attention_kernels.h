/* Inner loops of attention, in a portable and an AVX2/F16C version chosen at run time. */
#ifndef CPU_ATTENTION_KERNELS_H
#define CPU_ATTENTION_KERNELS_H

#include <stdint.h>

/* sum of q[i] * k[i] for f16 k */
float attn_dot_f16_avx2(const float *q, const uint16_t *k, int n);
/* acc[i] += a * v[i] for f16 v */
void attn_axpy_f16_avx2(float *acc, float a, const uint16_t *v, int n);

/* The rest work over keys and values already widened to f32, a run of a block at a time. */
/* out[r * out_stride + j] = (q row r . key j) * scale for rows r < n_rows and keys j < n_keys of
 * keys widened to f32, each sum over n elements by the same operations whichever (row, key) slot
 * of a call it takes: a row's scores are the same bit for bit in any tile */
void attn_scores_tile_avx2(const float *q, int64_t q_stride, int n_rows, const float *k, int64_t k_stride, int n_keys,
                           int n, float scale, float *out, int64_t out_stride);
/* the largest of s[0..n) */
float attn_max_avx2(const float *s, int n);
/* s[j] = e^(s[j] - max) in place for j < n (max at least each s[j]); returns their sum, added in
 * an order that depends on n alone */
float attn_exp_sum_avx2(float *s, int n, float max);
/* acc[r * acc_stride + i] += p[r * p_stride + j] * v[j * v_stride + i] for rows r < n_rows, keys
 * j < n_keys in turn and i < n: each output the same FMAs in the same order in any tile */
void attn_accumulate_tile_avx2(float *acc, int64_t acc_stride, const float *p, int64_t p_stride, int n_rows, const float *v,
                               int64_t v_stride, int n_keys, int n);
/* The AVX-512 version of the outputs (attention_avx512.c): the AVX2 kernel's sums, bit for bit */
void attn_accumulate_tile_avx512(float *acc, int64_t acc_stride, const float *p, int64_t p_stride, int n_rows, const float *v,
                                 int64_t v_stride, int n_keys, int n);

#endif
