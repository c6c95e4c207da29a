/* AVX2 dot products of the K formats with Q8_K activations. Quants are made unsigned
 * (Q3_K: q + 4, Q6_K: q + 32) so vpmaddubsw can multiply them with the signed activations;
 * the offset comes back out through the activation block sums (bsums), as do the mins of
 * Q2_K/Q4_K/Q5_K. Each super-block's integer total is exact; one FMA per super-block. */
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

/* scale * bsum over the 16 sub-blocks, in 8 int32 lanes (scales as 16 signed bytes). */
static inline __m256i scales_dot_bsums(__m128i scales8, const struct block_q8_K *a) {
    return _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales8), load256(a->bsums));
}

/* Q2_K and Q3_K: per half of 128 elements, 32 bytes of 2-bit codes (element 32j + l in bits
 * 2j..2j+1 of byte l). Q3_K (hmask != NULL) adds 4 where the element's fifth bit is set:
 * bit 4h + j of hmask[l]. */
static inline __m256i dot_crumbs(const uint8_t *qs, const uint8_t *hmask, __m128i sc, const int8_t *act) {
    const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    __m256i hm = hmask ? load256(hmask) : _mm256_setzero_si256();
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m256i q = load256(qs + 32 * h);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            __m256i codes = _mm256_and_si256(q, m3);
            if (hmask) codes = _mm256_or_si256(codes, _mm256_slli_epi16(_mm256_and_si256(hm, m1), 2));
            __m256i d = scaled_dot(codes, act + 128 * h + 32 * j, scale_pair(sc, 4 * h + j));
            if (j % 2)
                s1 = _mm256_add_epi32(s1, d);
            else
                s0 = _mm256_add_epi32(s0, d);
            q = _mm256_srli_epi16(q, 2);
            hm = _mm256_srli_epi16(hm, 1);
        }
    }
    return _mm256_add_epi32(s0, s1);
}

float quant_dot_q2_K_avx2(int64_t n, const void *w, const void *act) {
    const struct block_q2_K *b = w;
    const struct block_q8_K *a = act;
    __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QUANT_QK_K; i++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)b[i].scales);
        __m128i sc = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
        __m128i mins = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f));
        __m256i sumi = dot_crumbs(b[i].qs, NULL, sc, a[i].qs);
        __m128 dd = d_dmin_times(&b[i].d, a[i].d);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
        acc_min = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
                                  _mm256_cvtepi32_ps(scales_dot_bsums(mins, &a[i])), acc_min);
    }
    return hsum_ps256(acc) - hsum_ps256(acc_min);
}

float quant_dot_q3_K_avx2(int64_t n, const void *w, const void *act) {
    const struct block_q3_K *b = w;
    const struct block_q8_K *a = act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QUANT_QK_K; i++) {
        __m128i sc = q3_K_scales_sse(b[i].scales);
        __m256i sumi = dot_crumbs(b[i].qs, b[i].hmask, sc, a[i].qs);
        /* the codes were q + 4 */
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(scales_dot_bsums(sc, &a[i]), 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * _cvtsh_ss(b[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps256(acc);
}

/* One Q4_K or Q5_K super-block (qh == NULL for Q4_K): the scaled sum into *acc, the mins'
 * sum into *acc_min. */
static inline void k4_block(const void *d_dmin, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh_bits,
                            const struct block_q8_K *a, __m256 *acc, __m128 *acc_min) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    uint8_t sc[8], m[8];
    quant_k4_scales(scales, sc, m);
    __m256i qh = qh_bits ? load256(qh_bits) : _mm256_setzero_si256(); /* bits 2c, 2c + 1 of step c */
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        __m256i q = load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh_bits) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, m1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), m1), 4));
            qh = _mm256_srli_epi16(qh, 2);
        }
        s0 = _mm256_add_epi32(s0, scaled_dot(lo, a->qs + 64 * c, _mm256_set1_epi16(sc[2 * c])));
        s1 = _mm256_add_epi32(s1, scaled_dot(hi, a->qs + 64 * c + 32, _mm256_set1_epi16(sc[2 * c + 1])));
    }
    __m128 dd = d_dmin_times(d_dmin, a->d);
    *acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), *acc);
    /* mins: m[s] times the sum of sub-block s's 32 activations (two bsums) */
    __m256i bs = load256(a->bsums);
    __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    __m128i mins = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m)), pairs);
    *acc_min = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, _MM_SHUFFLE(1, 1, 1, 1)), _mm_cvtepi32_ps(mins), *acc_min);
}

float quant_dot_q4_K_avx2(int64_t n, const void *w, const void *act) {
    const struct block_q4_K *b = w;
    const struct block_q8_K *a = act;
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_min = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QUANT_QK_K; i++) k4_block(&b[i].d, b[i].scales, b[i].qs, NULL, &a[i], &acc, &acc_min);
    return hsum_ps256(acc) - hsum_ps256(_mm256_castps128_ps256(acc_min));
}

float quant_dot_q5_K_avx2(int64_t n, const void *w, const void *act) {
    const struct block_q5_K *b = w;
    const struct block_q8_K *a = act;
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_min = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QUANT_QK_K; i++)
        k4_block(&b[i].d, b[i].scales, b[i].qs, b[i].qh, &a[i], &acc, &acc_min);
    return hsum_ps256(acc) - hsum_ps256(_mm256_castps128_ps256(acc_min));
}

float quant_dot_q6_K_avx2(int64_t n, const void *w, const void *act) {
    const struct block_q6_K *b = w;
    const struct block_q8_K *a = act;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m_hi = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QUANT_QK_K; i++) {
        __m128i sc = _mm_loadu_si128((const __m128i *)b[i].scales);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            /* element l, l + 32, l + 64, l + 96 of this half: low nibble of ql[l], ql[l + 32],
             * high nibble of ql[l], ql[l + 32]; top 2 bits from bits 0-1, 2-3, 4-5, 6-7 of qh[l] */
            __m256i ql0 = load256(b[i].ql + 64 * h), ql1 = load256(b[i].ql + 64 * h + 32);
            __m256i qh = load256(b[i].qh + 32 * h);
            __m256i c0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m_hi));
            __m256i c1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m_hi));
            __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m_hi));
            __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), m_hi));
            const int8_t *y = a[i].qs + 128 * h;
            s0 = _mm256_add_epi32(s0, scaled_dot(c0, y, scale_pair(sc, 4 * h)));
            s1 = _mm256_add_epi32(s1, scaled_dot(c1, y + 32, scale_pair(sc, 4 * h + 1)));
            s0 = _mm256_add_epi32(s0, scaled_dot(c2, y + 64, scale_pair(sc, 4 * h + 2)));
            s1 = _mm256_add_epi32(s1, scaled_dot(c3, y + 96, scale_pair(sc, 4 * h + 3)));
        }
        /* the codes were q + 32 */
        __m256i sumi = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_slli_epi32(scales_dot_bsums(sc, &a[i]), 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[i].d * _cvtsh_ss(b[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps256(acc);
}
