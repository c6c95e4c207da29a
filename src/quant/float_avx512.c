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

/* ---- float dots: four accumulators of 16, masked tail */

#define FLOAT_DOT_AVX512(name, elem_bytes, load, mask_load)                                                            \
    float name(int64_t n, const void *w, const void *act) {                                                            \
        const uint8_t *a = w, *b = act;                                                                                \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                                                 \
        __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();                                                 \
        int64_t i = 0;                                                                                                 \
        for (; i + 64 <= n; i += 64) {                                                                                 \
            const uint8_t *pa = a + i * elem_bytes, *pb = b + i * elem_bytes;                                          \
            acc0 = _mm512_fmadd_ps(load(pa), load(pb), acc0);                                                          \
            acc1 = _mm512_fmadd_ps(load(pa + 16 * elem_bytes), load(pb + 16 * elem_bytes), acc1);                      \
            acc2 = _mm512_fmadd_ps(load(pa + 32 * elem_bytes), load(pb + 32 * elem_bytes), acc2);                      \
            acc3 = _mm512_fmadd_ps(load(pa + 48 * elem_bytes), load(pb + 48 * elem_bytes), acc3);                      \
        }                                                                                                              \
        for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load(a + i * elem_bytes), load(b + i * elem_bytes), acc0); \
        if (i < n) {                                                                                                   \
            __mmask16 m = tail_mask(n - i);                                                                            \
            acc1 = _mm512_fmadd_ps(mask_load(m, a + i * elem_bytes), mask_load(m, b + i * elem_bytes), acc1);          \
        }                                                                                                              \
        return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));              \
    }

static inline __m512 f32x16(const uint8_t *p) { return _mm512_loadu_ps(p); }
static inline __m512 f32x16_mask(__mmask16 m, const uint8_t *p) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 f16x16_mask(__mmask16 m, const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
static inline __m512 bf16x16_load(const uint8_t *p) { return bf16x16(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 bf16x16_mask(__mmask16 m, const uint8_t *p) { return bf16x16(_mm256_maskz_loadu_epi16(m, p)); }

FLOAT_DOT_AVX512(quant_dot_f32_avx512, 4, f32x16, f32x16_mask)
FLOAT_DOT_AVX512(quant_dot_f16_avx512, 2, f16x16, f16x16_mask)
FLOAT_DOT_AVX512(quant_dot_bf16_avx512, 2, bf16x16_load, bf16x16_mask)

/* ---- activation quantizers */

/* 16 floats times id, rounded half to even, as int32. */
static inline __m512i round_16(const float *x, float id) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(id));
    return _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* One block of 32 with scale amax / 127; returns the sum of the quants. */
static inline int quantize_32(const float *x, int8_t *qs, float *d) {
    float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), _mm512_abs_ps(_mm512_loadu_ps(x + 16))));
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    __m512i lo = round_16(x, id), hi = round_16(x + 16, id);
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(lo));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(hi));
    *d = amax / 127.0f;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(lo, hi));
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
            __m512i v = round_16(x + 16 * g, iscale);
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * g), _mm512_cvtsepi32_epi8(v));
            y[i].bsums[g] = (int16_t)_mm512_reduce_add_epi32(v);
        }
        y[i].d = 1.0f / iscale;
    }
}
