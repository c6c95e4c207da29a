/* AVX2 kernels of the float formats (F32, F16, BF16) and the activation quantizers
 * (F16, BF16, Q8_0, Q8_1, Q8_K). The quantizers write the same bytes as the reference. */
#include "quant/quant_internal.h"
#include "quant/simd_x86.h"

/* ---- float rows */

void quant_dequant_f16_avx2(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++) y[i] = half_load(p + 2 * i);
}

static inline __m256 bf16x8_load(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

void quant_dequant_bf16_avx2(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, bf16x8_load(p + 2 * i));
    quant_dequant_bf16_ref(p + 2 * i, y + i, n - i);
}

void quant_act_f16_avx2(const float *x, void *act, int64_t n) {
    uint8_t *p = act;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(p + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) half_store(p + 2 * i, x[i]);
}

/* f32 -> bf16 bits in 8 int32 lanes: round to nearest even, nan kept quiet. */
static inline __m256i bf16x8_round(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    __m256i is_nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

void quant_act_bf16_avx2(const float *x, void *act, int64_t n) {
    uint8_t *p = act;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = bf16x8_round(_mm256_loadu_ps(x + i)), b = bf16x8_round(_mm256_loadu_ps(x + i + 8));
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(p + 2 * i), packed);
    }
    quant_act_bf16_ref(x + i, p + 2 * i, n - i);
}

/* ---- float dots: two accumulators of 8 per row and token, the tail by the reference
 *
 * As in float_avx512.c, a product's sum has the same order in a lone dot and in a tile, so the
 * tile gives vec_dot's result bit for bit. Here each product keeps two accumulators (even and odd
 * steps of 8): one chain of 8-wide FMAs waits on its latency, and a lone token's dot (decode) goes
 * a row at a time, since rows read side by side come from memory slower. Sixteen registers hold a
 * pass of two rows by two tokens; a tile of four by four takes four passes. */

static inline __m256 f32x8_load(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }
static inline __m256 f16x8_load(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* `rows` and `tokens` (each at most 2): out[t * 4 + r]. */
static inline __attribute__((always_inline)) void float_pass(int64_t n, const uint8_t *w, size_t w_stride,
                                                             const uint8_t *a, size_t a_stride, int rows, int tokens,
                                                             int elem_bytes, __m256 (*load)(const uint8_t *),
                                                             float (*ref_tail)(int64_t, const void *, const void *),
                                                             float *out) {
    __m256 acc[2][2][2], x[2][2]; /* [row][token][even/odd step], [token][even/odd step] */
    _Pragma("GCC unroll 2") for (int r = 0; r < rows; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < tokens; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _Pragma("GCC unroll 2") for (int t = 0; t < tokens; t++)
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                x[t][h] = load(a + t * a_stride + (i + 8 * h) * elem_bytes);
        _Pragma("GCC unroll 2") for (int r = 0; r < rows; r++)
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m256 v = load(w + r * w_stride + (i + 8 * h) * elem_bytes);
                _Pragma("GCC unroll 2") for (int t = 0; t < tokens; t++)
                    acc[r][t][h] = _mm256_fmadd_ps(v, x[t][h], acc[r][t][h]);
            }
    }
    if (i + 8 <= n) {
        _Pragma("GCC unroll 2") for (int t = 0; t < tokens; t++) x[t][0] = load(a + t * a_stride + i * elem_bytes);
        _Pragma("GCC unroll 2") for (int r = 0; r < rows; r++) {
            const __m256 v = load(w + r * w_stride + i * elem_bytes);
            _Pragma("GCC unroll 2") for (int t = 0; t < tokens; t++)
                acc[r][t][0] = _mm256_fmadd_ps(v, x[t][0], acc[r][t][0]);
        }
        i += 8;
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < rows; r++)
        _Pragma("GCC unroll 2") for (int t = 0; t < tokens; t++)
            out[t * 4 + r] = hsum_ps256(_mm256_add_ps(acc[r][t][0], acc[r][t][1])) +
                             ref_tail(n - i, w + r * w_stride + i * elem_bytes, a + t * a_stride + i * elem_bytes);
}

#define FLOAT_DOTS_AVX2(fmt, elem_bytes, load)                                                                         \
    float quant_dot_##fmt##_avx2(int64_t n, const void *w, const void *act) {                                          \
        float out[1];                                                                                                  \
        float_pass(n, w, 0, act, 0, 1, 1, elem_bytes, load, quant_dot_##fmt##_ref, out);                               \
        return out[0];                                                                                                 \
    }                                                                                                                  \
    void quant_tile_##fmt##_avx2(int64_t n, const void *w, size_t w_stride, const void *act, size_t act_stride,       \
                                 int n_tokens, float *out) {                                                           \
        const uint8_t *a = act;                                                                                        \
        for (int r = 0; r < 4; r += 2)                                                                                 \
            for (int t = 0; t < n_tokens; t += 2) {                                                                    \
                const uint8_t *wr = (const uint8_t *)w + r * w_stride, *at = a + t * act_stride;                       \
                if (n_tokens - t >= 2)                                                                                 \
                    float_pass(n, wr, w_stride, at, act_stride, 2, 2, elem_bytes, load, quant_dot_##fmt##_ref,         \
                               out + t * 4 + r);                                                                       \
                else                                                                                                   \
                    float_pass(n, wr, w_stride, at, act_stride, 2, 1, elem_bytes, load, quant_dot_##fmt##_ref,         \
                               out + t * 4 + r);                                                                       \
            }                                                                                                          \
    }

FLOAT_DOTS_AVX2(f32, 4, f32x8_load)
FLOAT_DOTS_AVX2(f16, 2, f16x8_load)
FLOAT_DOTS_AVX2(bf16, 2, bf16x8_load)

/* ---- activation quantizers */

/* Quantize 32 floats to int8 with multiplier id, rounding ties to even; returns the 4 int32
 * vectors before packing through *i32 (for sums) and the 32 bytes in element order. */
static inline __m256i quantize_32_avx2(const float *x, float id, __m256i i32[4]) {
    __m256 mul = _mm256_set1_ps(id);
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), mul);
        i32[k] = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]), i16b = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i i8 = _mm256_packs_epi16(i16a, i16b);
    /* the packs work per 128-bit lane; restore element order */
    return _mm256_permutevar8x32_epi32(i8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Largest |x| over n floats (n a multiple of 8). */
static inline float abs_max_avx2(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void quant_act_q8_0_avx2(const float *x, void *act, int64_t n) {
    struct block_q8_0 *y = act;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = abs_max_avx2(x, 32);
        __m256i i32[4];
        __m256i q = quantize_32_avx2(x, amax != 0.0f ? 127.0f / amax : 0.0f, i32);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        y[i].d = half_from_f32(amax / 127.0f);
    }
}

void quant_act_q8_1_avx2(const float *x, void *act, int64_t n) {
    struct block_q8_1 *y = act;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = abs_max_avx2(x, 32), d = amax / 127.0f;
        __m256i i32[4];
        __m256i q = quantize_32_avx2(x, amax != 0.0f ? 127.0f / amax : 0.0f, i32);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        int sum = hsum_epi32_256(_mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3])));
        y[i].d = half_from_f32(d);
        y[i].s = half_from_f32(d * (float)sum);
    }
}

/* The first element whose magnitude equals amax, with its sign. */
static float first_with_magnitude(const float *x, int n, float amax) {
    const __m256 sign = _mm256_set1_ps(-0.0f), target = _mm256_set1_ps(amax);
    for (int j = 0; j < n; j += 8) {
        __m256 hit = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), target, _CMP_EQ_OQ);
        int mask = _mm256_movemask_ps(hit);
        if (mask) return x[j + __builtin_ctz((unsigned)mask)];
    }
    return amax;
}

void quant_act_q8_K_avx2(const float *x, void *act, int64_t n) {
    struct block_q8_K *y = act;
    for (int64_t i = 0; i < n / QUANT_QK_K; i++, x += QUANT_QK_K) {
        float amax = abs_max_avx2(x, QUANT_QK_K);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -127.0f / first_with_magnitude(x, QUANT_QK_K, amax);
        for (int g = 0; g < QUANT_QK_K / 32; g++) {
            __m256i i32[4];
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * g), quantize_32_avx2(x + 32 * g, iscale, i32));
            y[i].bsums[2 * g] = (int16_t)hsum_epi32_256(_mm256_add_epi32(i32[0], i32[1]));
            y[i].bsums[2 * g + 1] = (int16_t)hsum_epi32_256(_mm256_add_epi32(i32[2], i32[3]));
        }
        y[i].d = 1.0f / iscale;
    }
}
