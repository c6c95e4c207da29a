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

/* A Q4_K, Q5_K or Q6_K super-block's weights, unpacked once for every token: the unsigned codes
 * of its eight 32-element steps and each step's int16 scales; Q4_K and Q5_K's sub-block mins as
 * int16. Integer sums are exact in any order, so a token's result is the same bit for bit whether
 * its block was unpacked for it alone or for four. Q2_K and Q3_K (above) unpack as they go: held
 * for four tokens their codes do not fit in the registers, and a lone token's dot, spilling them,
 * was 12% slower. */
struct k_weights {
    __m256i codes[8], scales16[8];
    __m128i mins;
};

/* Q4_K or Q5_K (qh_bits == NULL for Q4_K). */
static inline void k4_unpack(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh_bits, struct k_weights *k) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    uint8_t sc[8], m[8];
    quant_k4_scales(scales, sc, m);
    __m256i qh = qh_bits ? load256(qh_bits) : _mm256_setzero_si256(); /* bits 2c, 2c + 1 of step c */
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        __m256i q = load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh_bits) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, m1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), m1), 4));
            qh = _mm256_srli_epi16(qh, 2);
        }
        k->codes[2 * c] = lo, k->codes[2 * c + 1] = hi;
        k->scales16[2 * c] = _mm256_set1_epi16(sc[2 * c]);
        k->scales16[2 * c + 1] = _mm256_set1_epi16(sc[2 * c + 1]);
    }
    k->mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
}

/* sum over the super-block of scale * code * act, as 8 int32. */
static inline __m256i k_sum(const struct k_weights *k, const struct block_q8_K *a) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        s0 = _mm256_add_epi32(s0, scaled_dot(k->codes[2 * c], a->qs + 64 * c, k->scales16[2 * c]));
        s1 = _mm256_add_epi32(s1, scaled_dot(k->codes[2 * c + 1], a->qs + 64 * c + 32, k->scales16[2 * c + 1]));
    }
    return _mm256_add_epi32(s0, s1);
}

/* A token's sums over a Q4_K or Q5_K row: the scaled codes and the mins. */
struct k4_acc {
    __m256 sum;
    __m128 min;
};

/* One token against an unpacked Q4_K or Q5_K super-block, added into its sums. */
static inline void k4_token(const struct k_weights *k, const void *d_dmin, const struct block_q8_K *a,
                            struct k4_acc *acc) {
    __m128 dd = d_dmin_times(d_dmin, a->d);
    acc->sum = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(k_sum(k, a)), acc->sum);
    acc->min = k4_mins_add(k->mins, a, dd, acc->min);
}

QUANT_K4_BLOCKS(struct k_weights)
static inline float k4_result(const struct k4_acc *acc) {
    return hsum_ps256(acc->sum) - hsum_ps256(_mm256_castps128_ps256(acc->min));
}

QUANT_K_DOTS(q4_K, avx2, struct k_weights, struct k4_acc, q4_K_unpack, q4_K_token, k4_result)
QUANT_K_DOTS(q5_K, avx2, struct k_weights, struct k4_acc, q5_K_unpack, q5_K_token, k4_result)

/* Q6_K: element l, l + 32, l + 64, l + 96 of each half are the low nibble of ql[l], ql[l + 32],
 * the high nibble of ql[l], ql[l + 32], with top 2 bits from bits 0-1, 2-3, 4-5, 6-7 of qh[l];
 * codes q + 32. */
static inline void k6_unpack(const struct block_q6_K *b, struct k_weights *k) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m_hi = _mm256_set1_epi8(0x30);
    const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m256i ql0 = load256(b->ql + 64 * h), ql1 = load256(b->ql + 64 * h + 32);
        __m256i qh = load256(b->qh + 32 * h);
        k->codes[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m_hi));
        k->codes[4 * h + 1] =
            _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m_hi));
        k->codes[4 * h + 2] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m_hi));
        k->codes[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                              _mm256_and_si256(_mm256_srli_epi16(qh, 2), m_hi));
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) k->scales16[4 * h + j] = scale_pair(sc, 4 * h + j);
    }
    k->mins = sc; /* the scales as bytes, for the offset through the block sums */
}

static inline void k6_token(const struct k_weights *k, const struct block_q6_K *b, const struct block_q8_K *a,
                            __m256 *acc) {
    /* the codes were q + 32 */
    __m256i sumi = _mm256_sub_epi32(k_sum(k, a), _mm256_slli_epi32(scales_dot_bsums(k->mins, a), 5));
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(a->d * _cvtsh_ss(b->d)), _mm256_cvtepi32_ps(sumi), *acc);
}

static inline float k6_result(const __m256 *acc) { return hsum_ps256(*acc); }

QUANT_K_DOTS(q6_K, avx2, struct k_weights, __m256, k6_unpack, k6_token, k6_result)
