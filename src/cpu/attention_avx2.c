/* AVX2/F16C inner loops of attention over f16 keys and values, and over rows of them already
 * widened to f32 (a prompt tile's block): the same operations in the same order, so both give
 * the same sums bit for bit (widening f16 is exact). */
#include <immintrin.h>

#include "cpu/attention_kernels.h"

float attn_dot_f16_avx2(const float *q, const uint16_t *k, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8))), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), acc0);
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (; i < n; i++) sum += q[i] * _cvtsh_ss(k[i]);
    return sum;
}

void attn_axpy_f16_avx2(float *acc, float a, const uint16_t *v, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))),
                                                  _mm256_loadu_ps(acc + i)));
    for (; i < n; i++) acc[i] += a * _cvtsh_ss(v[i]);
}

float attn_dot_f32_avx2(const float *q, const float *k, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc0);
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (; i < n; i++) sum += q[i] * k[i];
    return sum;
}

void attn_axpy_f32_avx2(float *acc, float a, const float *v, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
    for (; i < n; i++) acc[i] += a * v[i];
}

/* The horizontal sum attn_dot_f16_avx2 ends with, for the lanes of acc0 + acc1 */
static inline float sum_lanes(__m256 acc0, __m256 acc1) {
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void attn_scores_f32_avx2(const float *q, const float *k, int64_t k_stride, int n_keys, int n, float scale, float *out) {
    int j = 0;
    if (n % 16 == 0) /* four keys at a time, sharing q's loads; each key's sums as attn_dot_f32_avx2's */
        for (; j + 4 <= n_keys; j += 4) {
            const float *k0 = k + j * k_stride, *k1 = k0 + k_stride, *k2 = k1 + k_stride, *k3 = k2 + k_stride;
            __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
            __m256 a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
            for (int i = 0; i < n; i += 16) {
                const __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
                a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + i), a0), b0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + i + 8), b0);
                a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + i), a1), b1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + i + 8), b1);
                a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + i), a2), b2 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k2 + i + 8), b2);
                a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + i), a3), b3 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k3 + i + 8), b3);
            }
            out[j] = sum_lanes(a0, b0) * scale, out[j + 1] = sum_lanes(a1, b1) * scale;
            out[j + 2] = sum_lanes(a2, b2) * scale, out[j + 3] = sum_lanes(a3, b3) * scale;
        }
    for (; j < n_keys; j++) out[j] = attn_dot_f32_avx2(q, k + j * k_stride, n) * scale;
}

void attn_accumulate_f32_avx2(float *acc, const float *p, const float *v, int64_t v_stride, int n_keys, int n) {
    int i = 0;
    for (; i + 64 <= n; i += 64) { /* 64 outputs in registers across the keys: each sees the same FMAs in the same order */
        __m256 a[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) a[r] = _mm256_loadu_ps(acc + i + 8 * r);
        for (int j = 0; j < n_keys; j++) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            const float *vj = v + j * v_stride + i;
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * r), a[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) _mm256_storeu_ps(acc + i + 8 * r, a[r]);
    }
    if (i < n)
        for (int j = 0; j < n_keys; j++) attn_axpy_f32_avx2(acc + i, p[j], v + j * v_stride + i, n - i);
}
