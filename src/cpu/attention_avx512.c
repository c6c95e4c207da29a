/* AVX-512 versions of the tile's scores and outputs (attention_kernels.h): sixteen lanes an
 * instruction, which a core with two 512-bit FMA units runs at twice the AVX2 kernels' rate. As in
 * the AVX2 kernels, each (row, key) score and each output go through the same operations whatever
 * slot of a call they take. The outputs are the AVX2 kernel's, bit for bit (an output's FMAs over
 * the keys in order); the scores differ from the AVX2 kernel's in the order of their sums. */
#include <immintrin.h>

#include "cpu/attention_kernels.h"

/* Lanes below n of p (n < 16: a tail; the rest read as 0) */
static inline __m512 load_head(const float *p, int n) {
    return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}

/* Lanes 0..3: the sums of a0..a3's lanes, each by the same tree, (lane i + lane i + 8), then
 * ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) of those, whichever slot it comes in. */
static inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define HALVES(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(HALVES(a0), HALVES(a1)), _mm256_hadd_ps(HALVES(a2), HALVES(a3)));
#undef HALVES
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

static inline void store_scores(float *out, __m128 s, int n) {
    _mm_mask_storeu_ps(out, (__mmask8)(n >= 4 ? 0xf : (1u << n) - 1), s);
}

/* R rows (1, 2 or 4) by four keys: 4R sums share R + 4 loads. */
static inline __attribute__((always_inline)) void score_rows(int R, const float *q, int64_t q_stride, const float *k,
                                                             int64_t k_stride, int n_keys, int n, __m128 scale,
                                                             float *out, int64_t out_stride) {
    for (int j = 0; j < n_keys; j += 4) {
        const float *kj[4]; /* past the last key: the last key again, its sums dropped */
        for (int t = 0; t < 4; t++) kj[t] = j + t < n_keys ? k + (j + t) * k_stride : k + j * k_stride;
        __m512 a[4][4];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) a[r][t] = _mm512_setzero_ps();
        for (int i = 0; i < n; i += 16) {
            __m512 x[4];
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) x[r] = load_head(q + r * q_stride + i, n - i);
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m512 y = load_head(kj[t] + i, n - i);
                #pragma GCC unroll 4
                for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_ps(x[r], y, a[r][t]);
            }
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            store_scores(out + r * out_stride + j, _mm_mul_ps(sum4(a[r][0], a[r][1], a[r][2], a[r][3]), scale), n_keys - j);
    }
}

void attn_scores_tile_avx512(const float *q, int64_t q_stride, int n_rows, const float *k, int64_t k_stride, int n_keys,
                             int n, float scale, float *out, int64_t out_stride) {
    const __m128 vscale = _mm_set1_ps(scale);
    int r = 0;
    for (; r + 4 <= n_rows; r += 4)
        score_rows(4, q + r * q_stride, q_stride, k, k_stride, n_keys, n, vscale, out + r * out_stride, out_stride);
    for (; r + 2 <= n_rows; r += 2)
        score_rows(2, q + r * q_stride, q_stride, k, k_stride, n_keys, n, vscale, out + r * out_stride, out_stride);
    if (r < n_rows) score_rows(1, q + r * q_stride, q_stride, k, k_stride, n_keys, n, vscale, out + r * out_stride, out_stride);
}

/* acc rows += p[j] * v row j over the keys in turn for R rows (1, 2 or 4), 64 outputs of each row
 * in registers at a time (a v load serving every row), then 16, then a masked tail. */
static inline __attribute__((always_inline)) void accumulate_rows(int R, float *acc, int64_t acc_stride, const float *p,
                                                                  int64_t p_stride, const float *v, int64_t v_stride,
                                                                  int n_keys, int n) {
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 a[4][4];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) a[r][t] = _mm512_loadu_ps(acc + r * acc_stride + i + 16 * t);
        for (int j = 0; j < n_keys; j++) {
            const float *vj = v + j * v_stride + i;
            __m512 x[4];
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) x[r] = _mm512_set1_ps(p[r * p_stride + j]);
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m512 w = _mm512_loadu_ps(vj + 16 * t);
                #pragma GCC unroll 4
                for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_ps(x[r], w, a[r][t]);
            }
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) _mm512_storeu_ps(acc + r * acc_stride + i + 16 * t, a[r][t]);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        __m512 a[4];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) a[r] = _mm512_maskz_loadu_ps(m, acc + r * acc_stride + i);
        for (int j = 0; j < n_keys; j++) {
            const __m512 w = _mm512_maskz_loadu_ps(m, v + j * v_stride + i);
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[r * p_stride + j]), w, a[r]);
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(acc + r * acc_stride + i, m, a[r]);
    }
}

void attn_accumulate_tile_avx512(float *acc, int64_t acc_stride, const float *p, int64_t p_stride, int n_rows, const float *v,
                                 int64_t v_stride, int n_keys, int n) {
    int r = 0;
    for (; r + 4 <= n_rows; r += 4)
        accumulate_rows(4, acc + r * acc_stride, acc_stride, p + r * p_stride, p_stride, v, v_stride, n_keys, n);
    for (; r + 2 <= n_rows; r += 2)
        accumulate_rows(2, acc + r * acc_stride, acc_stride, p + r * p_stride, p_stride, v, v_stride, n_keys, n);
    if (r < n_rows) accumulate_rows(1, acc + r * acc_stride, acc_stride, p + r * p_stride, p_stride, v, v_stride, n_keys, n);
}
