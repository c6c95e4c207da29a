/* The AVX-512 version of the tile's outputs (attention_kernels.h): sixteen lanes an instruction and
 * sixteen sums in flight, the AVX2 kernel's sums bit for bit (an output's FMAs over the keys in
 * order, whatever rows come together). A 512-bit version of the scores measured no faster than
 * AVX2's on an Intel core and slower on Zen 4 (bench/RESULTS.md): there is none. */
#include <immintrin.h>

#include "cpu/attention_kernels.h"

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
