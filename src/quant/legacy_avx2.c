/* AVX2 dot products of the 32-element formats with Q8_0/Q8_1 activations, and the simple
 * dequantizers (Q4_0, Q5_0, Q8_0: one multiply per element, so identical to the reference;
 * the others need a multiply-add the compiler may fuse, so they stay scalar). One block is
 * one 256-bit vector of 32 int8 products. Blocks go in groups of 8 so their 16 f16 scales are
 * converted in two instructions, not sixteen; two accumulators alternate so consecutive FMAs
 * do not wait on each other. */
#include "quant/quant_internal.h"
#include "quant/simd_x86.h"

/* legacy_vnni_avx512.c includes this file again with 256-bit VNNI enabled and its own names. */
#ifndef LEGACY_DOT_NAME
#define LEGACY_DOT_NAME(type) quant_dot_##type##_avx2
#define LEGACY_DOT4_NAME(type) quant_dot4_##type##_avx2
#endif

/* Quants of one block as 32 signed bytes, in element order. */
static inline __m256i q4_0_bytes(const struct block_q4_0 *b) {
    return _mm256_sub_epi8(nibbles_32(b->qs), _mm256_set1_epi8(8));
}

/* Q5_0: a missing fifth bit means q - 16 < 0, i.e. the nibble with its top four bits set. */
static inline __m256i q5_0_bytes(const struct block_q5_0 *b) {
    __m256i high = bits_to_bytes_32(b->qh);
    return _mm256_or_si256(nibbles_32(b->qs), _mm256_andnot_si256(high, _mm256_set1_epi8((char)0xf0)));
}

/* Q5 codes 0..31 from a block's fifth bits and nibbles. */
static inline __m256i q5_codes(const uint8_t *qh, const uint8_t *qs) {
    return _mm256_or_si256(nibbles_32(qs), _mm256_and_si256(bits_to_bytes_32(qh), _mm256_set1_epi8(0x10)));
}

static inline __m256i q5_1_bytes(const struct block_q5_1 *b) { return q5_codes(b->qh, b->qs); }

static inline __m256i act_bytes(const int8_t *qs) { return _mm256_loadu_si256((const __m256i *)qs); }

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/* sum(codes * act) - offset * sum(act), in int32 lanes. */
static inline __m256i dot_offset(__m256i codes, __m256i act, char offset) {
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, act),
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(offset), act));
}
#endif

/* A Q4_0 or Q5_0 block's int32 dot with 32 activation quants. With VNNI the codes (0..15, 0..31)
 * go in unsigned and their offset (8, 16) times sum(activations) comes off: two vpdpbusd and a
 * subtraction. Without, the centred codes through the sign trick. The same integers either way. */
static inline __m256i q4_0_dot(const struct block_q4_0 *b, const int8_t *qs) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return dot_offset(nibbles_32(b->qs), act_bytes(qs), 8);
#else
    return dot_i8_avx2(q4_0_bytes(b), act_bytes(qs));
#endif
}

static inline __m256i q5_0_dot(const struct block_q5_0 *b, const int8_t *qs) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return dot_offset(q5_codes(b->qh, b->qs), act_bytes(qs), 16);
#else
    return dot_i8_avx2(q5_0_bytes(b), act_bytes(qs));
#endif
}

/* The loop all five share. BODY(i) is the int32 dot (8 lanes) of block i. Every block's
 * scale dw * da comes from halves8 over the `d` fields. OFFSET(i, k) adds the Q8_1 term
 * m * s of blocks i..i+k-1 (k = 8: all together) to acc_m, or nothing. A tail of fewer than 8
 * blocks converts its scales one by one. */
#define LEGACY_DOT_AVX2(BODY, OFFSET)                                                                            \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();                  \
    float tail_m = 0;                                                                                            \
    int64_t nb = n / 32, i = 0;                                                                                  \
    for (; i + 8 <= nb; i += 8) {                                                                                \
        __m256 scales = _mm256_mul_ps(halves8(&b[i].d, sizeof *b), halves8(&a[i].d, sizeof *a));                 \
        _Alignas(32) float s[8];                                                                                 \
        _mm256_store_ps(s, scales);                                                                              \
        _Pragma("GCC unroll 4") for (int k = 0; k < 8; k += 2) {                                                 \
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&s[k]), _mm256_cvtepi32_ps(BODY(i + k)), acc0);           \
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&s[k + 1]), _mm256_cvtepi32_ps(BODY(i + k + 1)), acc1);   \
        }                                                                                                        \
        OFFSET(i, 8);                                                                                            \
    }                                                                                                            \
    for (; i < nb; i++) {                                                                                        \
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_product(b[i].d, a[i].d)), _mm256_cvtepi32_ps(BODY(i)), acc0); \
        OFFSET(i, 1);                                                                                            \
    }                                                                                                            \
    return hsum_ps256(_mm256_add_ps(acc0, acc1)) + hsum_ps256(acc_m) + tail_m;

#define NO_OFFSET(i, k) ((void)0)
#define Q8_1_OFFSET(i, k)                                                                             \
    do {                                                                                              \
        if ((k) == 8)                                                                                 \
            acc_m = _mm256_fmadd_ps(halves8(&b[i].m, sizeof *b), halves8(&a[i].s, sizeof *a), acc_m); \
        else                                                                                          \
            tail_m += half_product(b[i].m, a[i].s);                                                   \
    } while (0)

float LEGACY_DOT_NAME(q4_0)(int64_t n, const void *w, const void *act) {
    const struct block_q4_0 *b = w;
    const struct block_q8_0 *a = act;
#define BODY(i) q4_0_dot(&b[i], a[i].qs)
    LEGACY_DOT_AVX2(BODY, NO_OFFSET)
#undef BODY
}

float LEGACY_DOT_NAME(q4_1)(int64_t n, const void *w, const void *act) {
    const struct block_q4_1 *b = w;
    const struct block_q8_1 *a = act;
#define BODY(i) dot_u8i8_avx2(nibbles_32(b[i].qs), act_bytes(a[i].qs))
    LEGACY_DOT_AVX2(BODY, Q8_1_OFFSET)
#undef BODY
}

float LEGACY_DOT_NAME(q5_0)(int64_t n, const void *w, const void *act) {
    const struct block_q5_0 *b = w;
    const struct block_q8_0 *a = act;
#define BODY(i) q5_0_dot(&b[i], a[i].qs)
    LEGACY_DOT_AVX2(BODY, NO_OFFSET)
#undef BODY
}

float LEGACY_DOT_NAME(q5_1)(int64_t n, const void *w, const void *act) {
    const struct block_q5_1 *b = w;
    const struct block_q8_1 *a = act;
#define BODY(i) dot_u8i8_avx2(q5_1_bytes(&b[i]), act_bytes(a[i].qs))
    LEGACY_DOT_AVX2(BODY, Q8_1_OFFSET)
#undef BODY
}

float LEGACY_DOT_NAME(q8_0)(int64_t n, const void *w, const void *act) {
    const struct block_q8_0 *b = w;
    const struct block_q8_0 *a = act;
#define BODY(i) dot_i8_avx2(act_bytes(b[i].qs), act_bytes(a[i].qs))
    LEGACY_DOT_AVX2(BODY, NO_OFFSET)
#undef BODY
}

/* ---- four tokens at once (prompts): each weight block is unpacked once for four activation
 * rows. Every token's arithmetic is the single-token kernel's, operation for operation, so the
 * results are bit-identical to it and a token's logits do not depend on its batch. W(i) gives
 * block i's weight codes, DOT(w, qs) their int32 dot with activation quants qs. */
#define LEGACY_DOT4_AVX2(W, DOT, OFFSET)                                                                          \
    const struct ACT_BLOCK *a4[4];                                                                                \
    __m256 acc0[4], acc1[4], acc_m[4];                                                                            \
    float tail_m[4];                                                                                              \
    for (int j = 0; j < 4; j++) {                                                                                 \
        a4[j] = (const struct ACT_BLOCK *)((const uint8_t *)act + (size_t)j * act_stride);                         \
        acc0[j] = acc1[j] = acc_m[j] = _mm256_setzero_ps();                                                       \
        tail_m[j] = 0;                                                                                            \
    }                                                                                                             \
    int64_t nb = n / 32, i = 0;                                                                                   \
    for (; i + 8 <= nb; i += 8) {                                                                                 \
        const __m256 wd = halves8(&b[i].d, sizeof *b);                                                            \
        _Alignas(32) float s[4][8];                                                                               \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                                       \
            _mm256_store_ps(s[j], _mm256_mul_ps(wd, halves8(&a4[j][i].d, sizeof *a4[j])));                       \
        _Pragma("GCC unroll 4") for (int k = 0; k < 8; k += 2) {                                                  \
            const __m256i w0 = W(i + k), w1 = W(i + k + 1);                                                      \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                 \
                acc0[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&s[j][k]),                                          \
                                          _mm256_cvtepi32_ps(DOT(w0, a4[j][i + k].qs)), acc0[j]);                 \
                acc1[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&s[j][k + 1]),                                      \
                                          _mm256_cvtepi32_ps(DOT(w1, a4[j][i + k + 1].qs)), acc1[j]);             \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) OFFSET(i, 8, j);                                      \
    }                                                                                                             \
    for (; i < nb; i++) {                                                                                         \
        const __m256i w0 = W(i);                                                                                  \
        for (int j = 0; j < 4; j++) {                                                                             \
            acc0[j] = _mm256_fmadd_ps(_mm256_set1_ps(half_product(b[i].d, a4[j][i].d)),                          \
                                      _mm256_cvtepi32_ps(DOT(w0, a4[j][i].qs)), acc0[j]);                         \
            OFFSET(i, 1, j);                                                                                      \
        }                                                                                                         \
    }                                                                                                             \
    for (int j = 0; j < 4; j++) out[j] = hsum_ps256(_mm256_add_ps(acc0[j], acc1[j])) + hsum_ps256(acc_m[j]) + tail_m[j];

#define NO_OFFSET4(i, k, j) ((void)0)
#define Q8_1_OFFSET4(i, k, j)                                                                                    \
    do {                                                                                                         \
        if ((k) == 8)                                                                                            \
            acc_m[j] = _mm256_fmadd_ps(halves8(&b[i].m, sizeof *b), halves8(&a4[j][i].s, sizeof *a4[j]), acc_m[j]); \
        else                                                                                                     \
            tail_m[j] += half_product(b[i].m, a4[j][i].s);                                                       \
    } while (0)

#define DOT_I8(w, qs) dot_i8_avx2(w, act_bytes(qs))
#define DOT_U8I8(w, qs) dot_u8i8_avx2(w, act_bytes(qs))

void LEGACY_DOT4_NAME(q4_0)(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {
    const struct block_q4_0 *b = w;
#define ACT_BLOCK block_q8_0
#define W(i) q4_0_bytes(&b[i])
    LEGACY_DOT4_AVX2(W, DOT_I8, NO_OFFSET4)
#undef W
#undef ACT_BLOCK
}

void LEGACY_DOT4_NAME(q4_1)(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {
    const struct block_q4_1 *b = w;
#define ACT_BLOCK block_q8_1
#define W(i) nibbles_32(b[i].qs)
    LEGACY_DOT4_AVX2(W, DOT_U8I8, Q8_1_OFFSET4)
#undef W
#undef ACT_BLOCK
}

void LEGACY_DOT4_NAME(q8_0)(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {
    const struct block_q8_0 *b = w;
#define ACT_BLOCK block_q8_0
#define W(i) act_bytes(b[i].qs)
    LEGACY_DOT4_AVX2(W, DOT_I8, NO_OFFSET4)
#undef W
#undef ACT_BLOCK
}

#ifndef LEGACY_DOTS_ONLY
/* ---- dequantization */

static inline void store_scaled(float *y, __m256i q8, float d) {
    __m256 dv = _mm256_set1_ps(d);
    __m128i lo = _mm256_castsi256_si128(q8), hi = _mm256_extracti128_si256(q8, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), dv));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), dv));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), dv));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), dv));
}

void quant_dequant_q4_0_avx2(const void *w, float *y, int64_t n) {
    const struct block_q4_0 *b = w;
    for (int64_t i = 0; i < n / 32; i++) store_scaled(y + 32 * i, q4_0_bytes(&b[i]), _cvtsh_ss(b[i].d));
}

void quant_dequant_q5_0_avx2(const void *w, float *y, int64_t n) {
    const struct block_q5_0 *b = w;
    for (int64_t i = 0; i < n / 32; i++) store_scaled(y + 32 * i, q5_0_bytes(&b[i]), _cvtsh_ss(b[i].d));
}

void quant_dequant_q8_0_avx2(const void *w, float *y, int64_t n) {
    const struct block_q8_0 *b = w;
    for (int64_t i = 0; i < n / 32; i++) store_scaled(y + 32 * i, act_bytes(b[i].qs), _cvtsh_ss(b[i].d));
}
#endif
