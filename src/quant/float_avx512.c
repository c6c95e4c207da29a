/* AVX-512 kernels of the float formats (F32, F16, BF16) and the activation quantizers
 * (F16, BF16, Q8_0, Q8_1, Q8_K); tails use masked loads. The quantizers write the same bytes
 * as the reference. */
#include "quant/quant_internal.h"
#include "quant/simd_x86.h"

static inline __mmask16 tail_mask(int64_t left) { return (__mmask16)((1u << left) - 1); }

/* ---- float rows */

void quant_dequant_f16_avx512(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + 2 * i)));
    }
}

static inline __m512 bf16x16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

void quant_dequant_bf16_avx512(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, bf16x16(_mm256_loadu_si256((const __m256i *)(p + 2 * i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, bf16x16(_mm256_maskz_loadu_epi16(m, p + 2 * i)));
    }
}

void quant_act_f16_avx512(const float *x, void *act, int64_t n) {
    uint8_t *p = act;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(p + 2 * i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(p + 2 * i, m, h);
    }
}

/* f32 -> bf16: round to nearest even on the integer bits, nan kept quiet (the dedicated
 * conversion instruction flushes subnormals, which the reference does not). */
static inline __m256i bf16x16_round(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(64));
    __mmask16 is_nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
}

void quant_act_bf16_avx512(const float *x, void *act, int64_t n) {
    uint8_t *p = act;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(p + 2 * i), bf16x16_round(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(p + 2 * i, m, bf16x16_round(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* ---- float dots: one accumulator of 16 per row and token, masked tail
 *
 * Each product keeps its own accumulator, so its sum's order is the same whichever tile computes
 * it: a tile of rows and tokens gives vec_dot's result bit for bit (a token's logits never depend
 * on its batch). A lone dot waits on its FMA chain, which still outruns memory (a lone token's
 * product goes a row at a time, see cpu_matmul_tiles); steps of more tokens call the tile, whose
 * 8 to 16 chains run side by side and which converts each weight vector once for up to four. */

static inline __m512 f32x16(const uint8_t *p) { return _mm512_loadu_ps(p); }
static inline __m512 f32x16_mask(__mmask16 m, const uint8_t *p) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 f16x16_mask(__mmask16 m, const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
static inline __m512 bf16x16_load(const uint8_t *p) { return bf16x16(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 bf16x16_mask(__mmask16 m, const uint8_t *p) { return bf16x16(_mm256_maskz_loadu_epi16(m, p)); }

/* `rows` weight rows against `tokens` activation rows (each at most 4): out[t * 4 + r]. Inlined
 * with constant counts and loaders, the accumulators stay in registers. */
static inline __attribute__((always_inline)) void float_tile(int64_t n, const uint8_t *w, size_t w_stride,
                                                             const uint8_t *a, size_t a_stride, int rows, int tokens,
                                                             int elem_bytes, __m512 (*load)(const uint8_t *),
                                                             __m512 (*mask_load)(__mmask16, const uint8_t *),
                                                             float *out) {
    __m512 acc[4][4], x[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < rows; r++)
        _Pragma("GCC unroll 4") for (int t = 0; t < tokens; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _Pragma("GCC unroll 4") for (int t = 0; t < tokens; t++) x[t] = load(a + t * a_stride + i * elem_bytes);
        _Pragma("GCC unroll 4") for (int r = 0; r < rows; r++) {
            const __m512 v = load(w + r * w_stride + i * elem_bytes);
            _Pragma("GCC unroll 4") for (int t = 0; t < tokens; t++) acc[r][t] = _mm512_fmadd_ps(v, x[t], acc[r][t]);
        }
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _Pragma("GCC unroll 4") for (int t = 0; t < tokens; t++) x[t] = mask_load(m, a + t * a_stride + i * elem_bytes);
        _Pragma("GCC unroll 4") for (int r = 0; r < rows; r++) {
            const __m512 v = mask_load(m, w + r * w_stride + i * elem_bytes);
            _Pragma("GCC unroll 4") for (int t = 0; t < tokens; t++) acc[r][t] = _mm512_fmadd_ps(v, x[t], acc[r][t]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < rows; r++)
        _Pragma("GCC unroll 4") for (int t = 0; t < tokens; t++) out[t * 4 + r] = _mm512_reduce_add_ps(acc[r][t]);
}

#define FLOAT_DOTS_AVX512(fmt, elem_bytes, load, mask_load)                                                            \
    float quant_dot_##fmt##_avx512(int64_t n, const void *w, const void *act) {                                        \
        float out[1];                                                                                                  \
        float_tile(n, w, 0, act, 0, 1, 1, elem_bytes, load, mask_load, out);                                           \
        return out[0];                                                                                                 \
    }                                                                                                                  \
    void quant_tile_##fmt##_avx512(int64_t n, const void *w, size_t w_stride, const void *act, size_t act_stride,      \
                                 int n_tokens, float *out) {                                                           \
        switch (n_tokens) {                                                                                            \
        case 1: float_tile(n, w, w_stride, act, act_stride, 4, 1, elem_bytes, load, mask_load, out); break;            \
        case 2: float_tile(n, w, w_stride, act, act_stride, 4, 2, elem_bytes, load, mask_load, out); break;            \
        case 3: float_tile(n, w, w_stride, act, act_stride, 4, 3, elem_bytes, load, mask_load, out); break;            \
        default: float_tile(n, w, w_stride, act, act_stride, 4, 4, elem_bytes, load, mask_load, out); break;           \
        }                                                                                                              \
    }

FLOAT_DOTS_AVX512(f32, 4, f32x16, f32x16_mask)
FLOAT_DOTS_AVX512(f16, 2, f16x16, f16x16_mask)
FLOAT_DOTS_AVX512(bf16, 2, bf16x16_load, bf16x16_mask)

/* ---- activation quantizers */

/* 16 floats times id, rounded half to even, as int32. */
static inline __m512i round_16(const float *x, float id) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(id));
    return _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* The sum of 16 quants as stored: saturated to int8, so a NaN or infinite input (which converts
 * to INT_MIN) cannot overflow it; finite ones never saturate. */
static inline int sum_16(__m128i q) { return _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q)); }

/* One block of 32 with scale amax / 127; returns the sum of the quants. */
static inline int quantize_32(const float *x, int8_t *qs, float *d) {
    float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), _mm512_abs_ps(_mm512_loadu_ps(x + 16))));
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m128i lo = _mm512_cvtsepi32_epi8(round_16(x, id)), hi = _mm512_cvtsepi32_epi8(round_16(x + 16, id));
    _mm_storeu_si128((__m128i *)qs, lo);
    _mm_storeu_si128((__m128i *)(qs + 16), hi);
    *d = amax / 127.0f;
    return sum_16(lo) + sum_16(hi);
}

void quant_act_q8_0_avx512(const float *x, void *act, int64_t n) {
    struct block_q8_0 *y = act;
    for (int64_t i = 0; i < n / 32; i++) {
        float d;
        quantize_32(x + 32 * i, y[i].qs, &d);
        y[i].d = half_from_f32(d);
    }
}

void quant_act_q8_1_avx512(const float *x, void *act, int64_t n) {
    struct block_q8_1 *y = act;
    for (int64_t i = 0; i < n / 32; i++) {
        float d;
        int sum = quantize_32(x + 32 * i, y[i].qs, &d);
        y[i].d = half_from_f32(d);
        y[i].s = half_from_f32(d * (float)sum);
    }
}

void quant_act_q8_K_avx512(const float *x, void *act, int64_t n) {
    struct block_q8_K *y = act;
    for (int64_t i = 0; i < n / QUANT_QK_K; i++, x += QUANT_QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < QUANT_QK_K; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
        float amax = _mm512_reduce_max_ps(m);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* the first element of largest magnitude sets the sign */
        float max = amax;
        for (int j = 0; j < QUANT_QK_K; j += 16) {
            __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (hit) {
                max = x[j + __builtin_ctz(hit)];
                break;
            }
        }
        float iscale = -127.0f / max;
        for (int g = 0; g < QUANT_QK_K / 16; g++) {
            const __m128i q = _mm512_cvtsepi32_epi8(round_16(x + 16 * g, iscale));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * g), q);
            y[i].bsums[g] = (int16_t)sum_16(q);
        }
        y[i].d = 1.0f / iscale;
    }
}
