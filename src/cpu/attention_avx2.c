/* AVX2/F16C inner loops of attention: over f16 keys and values a head at a time (heads wider than
 * the tile's), and over a tile's run of them widened to f32, several rows and keys at a time, each
 * (row, key) by the same operations wherever it sits in a call. */
#include <immintrin.h>
#include <math.h>

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

/* Lanes 0..3 of the result: the sums of a0, a1, a2 and a3's lanes, each by the same tree,
 * ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), whichever slot it comes in. */
static inline __m128 sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The lanes below n (n < 8: a tail) */
static inline __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Lanes below n of p (n < 8 a tail; the rest read as 0) */
static inline __m256 load_head(const float *p, int n) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(n));
}

static inline void store_scores(float *out, __m128 s, int n) {
    if (n >= 4) {
        _mm_storeu_ps(out, s);
        return;
    }
    float lanes[4];
    _mm_storeu_ps(lanes, s);
    for (int i = 0; i < n; i++) out[i] = lanes[i];
}

void attn_scores_tile_avx2(const float *q, int64_t q_stride, int n_rows, const float *k, int64_t k_stride, int n_keys,
                           int n, float scale, float *out, int64_t out_stride) {
    const __m128 vscale = _mm_set1_ps(scale);
    for (int r = 0; r < n_rows; r += 2) { /* two rows and four keys at a time: eight sums share six loads */
        const float *q0 = q + r * q_stride, *q1 = r + 1 < n_rows ? q0 + q_stride : q0;
        for (int j = 0; j < n_keys; j += 4) {
            const float *k0 = k + j * k_stride; /* past the last key: the last key again, its sums dropped */
            const float *k1 = j + 1 < n_keys ? k0 + k_stride : k0, *k2 = j + 2 < n_keys ? k0 + 2 * k_stride : k0;
            const float *k3 = j + 3 < n_keys ? k0 + 3 * k_stride : k0;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
            __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
            for (int i = 0; i < n; i += 8) {
                const __m256 x0 = load_head(q0 + i, n - i), x1 = load_head(q1 + i, n - i);
                const __m256 y0 = load_head(k0 + i, n - i), y1 = load_head(k1 + i, n - i);
                const __m256 y2 = load_head(k2 + i, n - i), y3 = load_head(k3 + i, n - i);
                a0 = _mm256_fmadd_ps(x0, y0, a0), a1 = _mm256_fmadd_ps(x0, y1, a1);
                a2 = _mm256_fmadd_ps(x0, y2, a2), a3 = _mm256_fmadd_ps(x0, y3, a3);
                b0 = _mm256_fmadd_ps(x1, y0, b0), b1 = _mm256_fmadd_ps(x1, y1, b1);
                b2 = _mm256_fmadd_ps(x1, y2, b2), b3 = _mm256_fmadd_ps(x1, y3, b3);
            }
            store_scores(out + r * out_stride + j, _mm_mul_ps(sum4(a0, a1, a2, a3), vscale), n_keys - j);
            if (r + 1 < n_rows) store_scores(out + (r + 1) * out_stride + j, _mm_mul_ps(sum4(b0, b1, b2, b3), vscale), n_keys - j);
        }
    }
}

/* e^x for x <= 0 (0 below -87.3, where the float's exponent ends; NaN stays NaN): x = n ln 2 + r,
 * |r| <= ln 2 / 2, e^r by its degree-7 Taylor polynomial's minimax refit (Cephes' coefficients),
 * times 2^n built in the exponent's bits. Within 1 ulp of glibc's expf down to -87.29
 * (test_attention_exp_sum). */
static inline __m256 exp_nonpositive(__m256 x) {
    const __m256 floor_x = _mm256_set1_ps(-87.3f);
    const __m256 under = _mm256_cmp_ps(x, floor_x, _CMP_LT_OQ);
    x = _mm256_max_ps(floor_x, x); /* (x when x is NaN) */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)));
}

float attn_max_avx2(const float *s, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
    float lanes[8], max = -INFINITY;
    _mm256_storeu_ps(lanes, m);
    for (int i = 0; i < 8; i++) max = lanes[i] > max ? lanes[i] : max;
    for (; j < n; j++) max = s[j] > max ? s[j] : max;
    return max;
}

float attn_exp_sum_avx2(float *s, int n, float max) {
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        const int left = n - j;
        const __m256 e = exp_nonpositive(_mm256_sub_ps(load_head(s + j, left), vmax));
        if (left >= 8) {
            _mm256_storeu_ps(s + j, e);
            sum = _mm256_add_ps(sum, e);
        } else { /* the tail's lanes past n add 0 */
            const __m256i mask = lanes_below(left);
            _mm256_maskstore_ps(s + j, mask, e);
            sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(mask)));
        }
    }
    const __m256 z = _mm256_setzero_ps();
    return _mm_cvtss_f32(sum4(sum, z, z, z));
}

/* acc rows += p[j] * v row j over the keys in turn for R rows (1 to 3), 32 outputs of each row in
 * registers at a time (a v load serving every row; twelve sums in flight keep the FMAs busy), then
 * 8, then one by one: an output's FMAs are the same, in the same order, whatever rows it comes
 * with. */
static inline __attribute__((always_inline)) void accumulate_rows(int R, float *acc, int64_t acc_stride, const float *p,
                                                                  int64_t p_stride, const float *v, int64_t v_stride,
                                                                  int n_keys, int n) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a[3][4];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) a[r][t] = _mm256_loadu_ps(acc + r * acc_stride + i + 8 * t);
        for (int j = 0; j < n_keys; j++) {
            const float *vj = v + j * v_stride + i;
            __m256 x[3];
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) x[r] = _mm256_set1_ps(p[r * p_stride + j]);
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m256 w = _mm256_loadu_ps(vj + 8 * t);
                #pragma GCC unroll 4
                for (int r = 0; r < R; r++) a[r][t] = _mm256_fmadd_ps(x[r], w, a[r][t]);
            }
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) _mm256_storeu_ps(acc + r * acc_stride + i + 8 * t, a[r][t]);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a[3];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) a[r] = _mm256_loadu_ps(acc + r * acc_stride + i);
        for (int j = 0; j < n_keys; j++) {
            const __m256 w = _mm256_loadu_ps(v + j * v_stride + i);
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(_mm256_set1_ps(p[r * p_stride + j]), w, a[r]);
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) _mm256_storeu_ps(acc + r * acc_stride + i, a[r]);
    }
    for (; i < n; i++)
        for (int r = 0; r < R; r++)
            for (int j = 0; j < n_keys; j++)
                acc[r * acc_stride + i] = fmaf(p[r * p_stride + j], v[j * v_stride + i], acc[r * acc_stride + i]);
}

void attn_accumulate_tile_avx2(float *acc, int64_t acc_stride, const float *p, int64_t p_stride, int n_rows, const float *v,
                               int64_t v_stride, int n_keys, int n) {
    int r = 0;
    for (; r + 3 <= n_rows; r += 3)
        accumulate_rows(3, acc + r * acc_stride, acc_stride, p + r * p_stride, p_stride, v, v_stride, n_keys, n);
    for (; r + 2 <= n_rows; r += 2)
        accumulate_rows(2, acc + r * acc_stride, acc_stride, p + r * p_stride, p_stride, v, v_stride, n_keys, n);
    if (r < n_rows) accumulate_rows(1, acc + r * acc_stride, acc_stride, p + r * p_stride, p_stride, v, v_stride, n_keys, n);
}
