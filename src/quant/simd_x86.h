/* Small x86 helpers shared by the *_avx2.c and *_avx512.c kernel files (which are compiled
 * with those instruction sets); never include it from a portable file. */
#ifndef QUANT_SIMD_X86_H
#define QUANT_SIMD_X86_H

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "simd_x86.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"

static inline float hsum_ps256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32_128(__m128i v) {
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

static inline int hsum_epi32_256(__m256i v) {
    return hsum_epi32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* 16 packed bytes -> 32 bytes: low nibbles first (elements 0..15), then high (16..31). The bytes
 * are loaded into both halves (a load, no shuffle), the upper half shifted by 4 and both masked. */
static inline __m256i nibbles_32(const uint8_t *p) {
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    both = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* 32 bits -> 32 bytes, 0xff where bit i of the (little-endian) word at p is set. */
static inline __m256i bits_to_bytes_32(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i byte_of_bit = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                                 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit_in_byte = _mm256_set1_epi64x(0x8040201008040201);
    __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), byte_of_bit);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_in_byte), bit_in_byte);
}

/* Signed int8 dot in pairs of 4 -> 8 int32, via |x| * sign(y, x) for maddubs. Exact for any
 * x (|-128| reads as unsigned 128) and y > -128, which activation quantizers guarantee. */
static inline __m256i dot_i8_avx2(__m256i x, __m256i y) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
#else
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
#endif
}

/* Unsigned (0..127) x signed int8 dot in pairs of 4 -> 8 int32. */
static inline __m256i dot_u8i8_avx2(__m256i x, __m256i y) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y); /* one instruction, same sums */
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
#endif
}

static inline uint64_t load_u16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* The halves at p, p + stride, ..., p + 7 * stride as 8 floats: gathered with scalar loads
 * into two 64-bit words (integer ports, not vector ones), then one conversion. */
static inline __m256 halves8(const void *p, size_t stride) {
    const uint8_t *b = p;
    uint64_t lo = load_u16_at(b) | load_u16_at(b + stride) << 16 | load_u16_at(b + 2 * stride) << 32 |
                  load_u16_at(b + 3 * stride) << 48;
    b += 4 * stride;
    uint64_t hi = load_u16_at(b) | load_u16_at(b + stride) << 16 | load_u16_at(b + 2 * stride) << 32 |
                  load_u16_at(b + 3 * stride) << 48;
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

/* Product of two stored halves. */
static inline float half_product(uint16_t a, uint16_t b) { return _cvtsh_ss(a) * _cvtsh_ss(b); }

/* The 16 Q3_K scales (-32..31) from their 12 packed bytes, as 16 signed bytes: low nibbles of
 * bytes 0..7, then their high nibbles, give the low 4 bits; bits 2k..2k+1 of bytes 8..11 the
 * top 2 bits of scales 4k..4k+3. */
static inline __m128i q3_K_scales_sse(const uint8_t *s) {
    uint32_t top;
    memcpy(&top, s + 8, 4);
    const __m128i m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(3);
    __m128i raw = _mm_loadl_epi64((const __m128i *)s);
    __m128i low = _mm_unpacklo_epi64(_mm_and_si128(raw, m4), _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    __m128i high = _mm_srlv_epi32(_mm_set1_epi32((int)top), _mm_setr_epi32(0, 2, 4, 6));
    high = _mm_slli_epi16(_mm_and_si128(high, m2), 4);
    return _mm_sub_epi8(_mm_or_si128(low, high), _mm_set1_epi8(32));
}

/* d and dmin of a Q2_K/Q4_K/Q5_K block (adjacent halves) times the activation scale:
 * lanes 0 and 1. */
static inline __m128 d_dmin_times(const void *d_then_dmin, float act_d) {
    uint32_t both;
    memcpy(&both, d_then_dmin, 4);
    return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)both)), _mm_set1_ps(act_d));
}

/* A Q4_K/Q5_K block's 8 sub-block mins as 16 int16, each twice over, lined up with the
 * activations' 16 block sums (two per 32-element sub-block). */
static inline __m256i k4_mins16(const uint8_t m[8]) {
    const __m128i m8 = _mm_loadl_epi64((const __m128i *)m);
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
}

/* The activations' 16 block sums (one per 16 elements) weighed by w16 (int16), adjacent pairs
 * added: 8 int32. A K block's mins term or its codes' offset, before the scales. */
static inline __m256i bsums_weighed(__m256i w16, const struct block_q8_K *a) {
    return _mm256_madd_epi16(w16, _mm256_loadu_si256((const __m256i *)a->bsums));
}

#endif
