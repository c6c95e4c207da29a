/* AVX2 dot products of the K formats with Q8_K activations. Quants are made unsigned
 * (Q3_K: q + 4, Q6_K: q + 32) so vpmaddubsw can multiply them with the signed activations;
 * the offset comes back out through the activation block sums (bsums), as do the mins of
 * Q2_K/Q4_K/Q5_K. Each super-block's integer total is exact; one FMA per super-block and token,
 * and one more for the mins. */
#include "quant/quant_internal.h"
#include "quant/simd_x86.h"

/* Byte shuffles that spread scales 2p and 2p + 1 of 16 over 8 bytes each, matching the 16
 * pair lanes of one 32-element step: 8 lanes per 16-element sub-block. */
static const uint8_t pair_shuffle[8][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},
    {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13},
    {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

/* int16 scales for the 32 elements of sub-blocks 2p and 2p + 1 (from 16 signed bytes). */
static inline __m256i scale_pair(__m128i scales8, int p) {
    __m128i spread = _mm_shuffle_epi8(scales8, _mm_loadu_si128((const __m128i *)pair_shuffle[p]));
    return _mm256_cvtepi8_epi16(spread);
}

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* sum over 32 elements of scale * code * act -> 8 int32 (codes unsigned, int16 scales). */
static inline __m256i scaled_dot(__m256i codes, const int8_t *act, __m256i scales16) {
    __m256i p = _mm256_maddubs_epi16(codes, _mm256_loadu_si256((const __m256i *)act));
    return _mm256_madd_epi16(p, scales16);
}

/* Q2_K, Q4_K, Q5_K: d * the scaled codes' sum, less dmin * each sub-block's min (mins16: as
 * int16, one per 16 elements) times its activations' sum. */
static inline void mins_finish(const __m256i *mins16, const void *d_dmin, const struct block_q8_K *a, __m256i isum,
                               __m256 *acc) {
    const __m128 dd = d_dmin_times(d_dmin, a->d);
    *acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(isum), *acc);
    *acc = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), _mm256_cvtepi32_ps(bsums_weighed(*mins16, a)),
                            *acc);
}

/* Q3_K and Q6_K: codes offset by 2^shift, which comes back out through the block sums. */
static inline void offset_finish(const __m256i *sc16, uint16_t d, int shift, const struct block_q8_K *a, __m256i isum,
                                 __m256 *acc) {
    const __m256i sumi = _mm256_sub_epi32(isum, _mm256_slli_epi32(bsums_weighed(*sc16, a), shift));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(a->d * _cvtsh_ss(d)), _mm256_cvtepi32_ps(sumi), *acc);
}

static inline float k_result(const __m256 *acc) { return hsum_ps256(*acc); }

/* Every K format takes one to four tokens a pass (QUANT_K_DOTS_BY_STEP): each step's codes and
 * scales are unpacked once, and every token's integer sum over the super-block stays in a
 * register. A super-block unpacked whole for four tokens (16 registers of codes and scales)
 * spilled to the stack, and each token read it back. */

/* Q2_K and Q3_K: per half of 128 elements, 32 bytes of 2-bit codes (element 32j + l in bits
 * 2j..2j+1 of byte l). Q3_K (hmask != NULL) adds 4 where the element's fifth bit is set:
 * bit 4h + j of hmask[l]. Every token's sum by steps of 32 elements (two sub-blocks of 16). */
static inline __attribute__((always_inline)) void crumb_sums(const uint8_t *qs, const uint8_t *hmask, __m128i sc,
                                                             const struct block_q8_K *const *a, int tokens,
                                                             __m256i *isum) {
    const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    __m256i hm = hmask ? load256(hmask) : _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int j = 0; j < tokens; j++) isum[j] = _mm256_setzero_si256();
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m256i q = load256(qs + 32 * h);
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m256i codes = _mm256_and_si256(q, m3);
            if (hmask) codes = _mm256_or_si256(codes, _mm256_slli_epi16(_mm256_and_si256(hm, m1), 2));
            const __m256i s16 = scale_pair(sc, 4 * h + k);
            _Pragma("GCC unroll 4") for (int j = 0; j < tokens; j++)
                isum[j] = _mm256_add_epi32(isum[j], scaled_dot(codes, a[j]->qs + 128 * h + 32 * k, s16));
            q = _mm256_srli_epi16(q, 2);
            hm = _mm256_srli_epi16(hm, 1);
        }
    }
}

/* Q2_K: 4-bit scales and mins in one byte per sub-block; returns the mins as int16. */
static inline __attribute__((always_inline)) __m256i q2_K_sums(const struct block_q2_K *b,
                                                               const struct block_q8_K *const *a, int tokens,
                                                               __m256i *isum) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0x0f);
    crumb_sums(b->qs, NULL, _mm_and_si128(raw, m4), a, tokens, isum);
    return _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
}

/* Q3_K: returns the signed scales as int16. */
static inline __attribute__((always_inline)) __m256i q3_K_sums(const struct block_q3_K *b,
                                                               const struct block_q8_K *const *a, int tokens,
                                                               __m256i *isum) {
    const __m128i sc = q3_K_scales_sse(b->scales);
    crumb_sums(b->qs, b->hmask, sc, a, tokens, isum);
    return _mm256_cvtepi8_epi16(sc);
}

static inline void q2_K_finish(const __m256i *mins16, const struct block_q2_K *b, const struct block_q8_K *a,
                               __m256i isum, __m256 *acc) {
    mins_finish(mins16, &b->d, a, isum, acc);
}
static inline void q3_K_finish(const __m256i *sc16, const struct block_q3_K *b, const struct block_q8_K *a,
                               __m256i isum, __m256 *acc) {
    offset_finish(sc16, b->d, 2, a, isum, acc);
}

QUANT_K_DOTS_BY_STEP(q2_K, avx2, __m256i, __m256i, __m256, q2_K_sums, q2_K_finish, k_result)
QUANT_K_DOTS_BY_STEP(q3_K, avx2, __m256i, __m256i, __m256, q3_K_sums, q3_K_finish, k_result)

/* Q4_K or Q5_K (qh_bits == NULL for Q4_K): every token's sum over a super-block, by steps of 64
 * elements (two sub-blocks); returns each sub-block's min twice over as int16, lined up with the
 * activations' 16 block sums (two per sub-block). */
static inline __attribute__((always_inline)) __m256i k4_sums(const uint8_t *scales, const uint8_t *qs,
                                                             const uint8_t *qh_bits, const struct block_q8_K *const *a,
                                                             int tokens, __m256i *isum) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    uint8_t sc[8], m[8];
    quant_k4_scales(scales, sc, m);
    __m256i qh = qh_bits ? load256(qh_bits) : _mm256_setzero_si256(); /* bits 2c, 2c + 1 of step c */
    _Pragma("GCC unroll 4") for (int j = 0; j < tokens; j++) isum[j] = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        __m256i q = load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh_bits) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, m1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), m1), 4));
            qh = _mm256_srli_epi16(qh, 2);
        }
        const __m256i sc_lo = _mm256_set1_epi16(sc[2 * c]), sc_hi = _mm256_set1_epi16(sc[2 * c + 1]);
        _Pragma("GCC unroll 4") for (int j = 0; j < tokens; j++) {
            const __m256i d = _mm256_add_epi32(scaled_dot(lo, a[j]->qs + 64 * c, sc_lo),
                                               scaled_dot(hi, a[j]->qs + 64 * c + 32, sc_hi));
            isum[j] = _mm256_add_epi32(isum[j], d);
        }
    }
    return k4_mins16(m);
}

static inline __attribute__((always_inline)) __m256i q4_K_sums(const struct block_q4_K *b,
                                                               const struct block_q8_K *const *a, int tokens,
                                                               __m256i *isum) {
    return k4_sums(b->scales, b->qs, NULL, a, tokens, isum);
}
static inline __attribute__((always_inline)) __m256i q5_K_sums(const struct block_q5_K *b,
                                                               const struct block_q8_K *const *a, int tokens,
                                                               __m256i *isum) {
    return k4_sums(b->scales, b->qs, b->qh, a, tokens, isum);
}
static inline void q4_K_finish(const __m256i *mins16, const struct block_q4_K *b, const struct block_q8_K *a,
                               __m256i isum, __m256 *acc) {
    mins_finish(mins16, &b->d, a, isum, acc);
}
static inline void q5_K_finish(const __m256i *mins16, const struct block_q5_K *b, const struct block_q8_K *a,
                               __m256i isum, __m256 *acc) {
    mins_finish(mins16, &b->d, a, isum, acc);
}
QUANT_K_DOTS_BY_STEP(q4_K, avx2, __m256i, __m256i, __m256, q4_K_sums, q4_K_finish, k_result)
QUANT_K_DOTS_BY_STEP(q5_K, avx2, __m256i, __m256i, __m256, q5_K_sums, q5_K_finish, k_result)

/* Q6_K: element l, l + 32, l + 64, l + 96 of each half are the low nibble of ql[l], ql[l + 32],
 * the high nibble of ql[l], ql[l + 32], with top 2 bits from bits 0-1, 2-3, 4-5, 6-7 of qh[l];
 * codes q + 32. Every token's sum by steps of 32 elements (two sub-blocks); returns the scales as
 * int16, for the offset through the block sums. */
static inline __attribute__((always_inline)) __m256i q6_K_sums(const struct block_q6_K *b,
                                                               const struct block_q8_K *const *a, int tokens,
                                                               __m256i *isum) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m_hi = _mm256_set1_epi8(0x30);
    const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
    _Pragma("GCC unroll 4") for (int j = 0; j < tokens; j++) isum[j] = _mm256_setzero_si256();
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m256i ql0 = load256(b->ql + 64 * h), ql1 = load256(b->ql + 64 * h + 32), qh = load256(b->qh + 32 * h);
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            const __m256i lo = _mm256_and_si256(k % 2 ? ql1 : ql0, m4);
            const __m256i ql = k < 2 ? lo : _mm256_and_si256(_mm256_srli_epi16(k % 2 ? ql1 : ql0, 4), m4);
            const __m256i top = k == 0   ? _mm256_slli_epi16(qh, 4)
                                : k == 1 ? _mm256_slli_epi16(qh, 2)
                                : k == 2 ? qh
                                         : _mm256_srli_epi16(qh, 2);
            const __m256i codes = _mm256_or_si256(ql, _mm256_and_si256(top, m_hi));
            const __m256i s16 = scale_pair(sc, 4 * h + k);
            _Pragma("GCC unroll 4") for (int j = 0; j < tokens; j++)
                isum[j] = _mm256_add_epi32(isum[j], scaled_dot(codes, a[j]->qs + 128 * h + 32 * k, s16));
        }
    }
    return _mm256_cvtepi8_epi16(sc);
}

static inline void q6_K_finish(const __m256i *sc16, const struct block_q6_K *b, const struct block_q8_K *a,
                               __m256i isum, __m256 *acc) {
    offset_finish(sc16, b->d, 5, a, isum, acc);
}

QUANT_K_DOTS_BY_STEP(q6_K, avx2, __m256i, __m256i, __m256, q6_K_sums, q6_K_finish, k_result)
