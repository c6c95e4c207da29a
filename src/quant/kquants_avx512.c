/* AVX-512 (VNNI) dot products of the K formats with Q8_K activations: 64 quants per 512-bit
 * step, vpmaddubsw for code * activation pairs, then vpdpwssd to weight each pair by its
 * sub-block scale and accumulate. As in the AVX2 version, Q3_K and Q6_K codes are offset to be
 * unsigned and the offset, like the mins, comes back through the activation block sums. */
#include "quant/quant_internal.h"
#include "quant/simd_x86.h"

/* vpermw indices spreading int16 scales over the 32 pair lanes of a step: for 16-element
 * sub-blocks, step z (elements 64z..64z+63) uses scales 4z..4z+3, eight lanes each; for
 * 32-element sub-blocks, step c uses scales 2c and 2c + 1, sixteen lanes each. */
static inline __m512i spread16_index(int z) {
    const __m512i base = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                          0, 0, 0, 0, 0, 0);
    return _mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * z)));
}

static inline __m512i spread32_index(int c) {
    const __m512i base = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, 0, 0, 0, 0);
    return _mm512_add_epi16(base, _mm512_set1_epi16((short)(2 * c)));
}

/* Byte mask selecting bit 2z in the low 32 bytes and bit 2z + 1 in the high 32. */
static inline __m512i bit_pair(int z) {
    return _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * z))), _mm256_set1_epi8((char)(2 << (2 * z))), 1);
}

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* [lo | hi] from two 256-bit halves. */
static inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* Four 2-bit fields of 32 bytes as two steps of 64 codes: [q & 3 | q >> 2 & 3] and
 * [q >> 4 & 3 | q >> 6 & 3] -- elements 0..63 and 64..127 of a Q2_K/Q3_K half. */
static inline void crumbs_128(const uint8_t *qs, __m512i *c01, __m512i *c23) {
    const __m512i m3 = _mm512_set1_epi8(3);
    __m256i q = load256(qs);
    *c01 = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 2)), m3);
    *c23 = _mm512_and_si512(join(_mm256_srli_epi16(q, 4), _mm256_srli_epi16(q, 6)), m3);
}

/* acc += sum over 64 elements of scale * code * act (codes unsigned, int16 scales per lane). */
static inline __m512i scaled_dot(__m512i acc, __m512i codes, const int8_t *act, __m512i scales16) {
    __m512i pairs = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(act));
    return _mm512_dpwssd_epi32(acc, pairs, scales16);
}

/* One Q4_K or Q5_K super-block's weights (qh == NULL for Q4_K), unpacked once for every token:
 * the codes of its four steps of 64, each step's scales spread over its pair lanes, and the
 * sub-block mins as int16. */
struct k4_weights {
    __m512i codes[4], scales16[4];
    __m256i mins16; /* each sub-block's min twice over, lined up with the activations' 16 block sums */
};

static inline void k4_unpack(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, struct k4_weights *k) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(16);
    uint8_t sc[8], m[8];
    quant_k4_scales(scales, sc, m);
    __m512i sc512 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
    __m512i hbits = qh ? join(load256(qh), load256(qh)) : _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        __m256i q = load256(qs + 32 * c);
        k->codes[c] = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), m4);
        if (qh)
            k->codes[c] =
                _mm512_mask_add_epi8(k->codes[c], _mm512_test_epi8_mask(hbits, bit_pair(c)), k->codes[c], sixteen);
        k->scales16[c] = _mm512_permutexvar_epi16(spread32_index(c), sc512);
    }
    k->mins16 = k4_mins16(m);
}

/* One token's activations against an unpacked super-block, added into its sums: d * the scaled
 * codes' sum, less dmin * each sub-block's min times its activations' sum. */
static inline void k4_token(const struct k4_weights *k, const void *d_dmin, const struct block_q8_K *a, __m512 *acc) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        if (c % 2)
            s1 = scaled_dot(s1, k->codes[c], a->qs + 64 * c, k->scales16[c]);
        else
            s0 = scaled_dot(s0, k->codes[c], a->qs + 64 * c, k->scales16[c]);
    }
    const __m128 dd = d_dmin_times(d_dmin, a->d);
    const __m512 mins = _mm512_zextps256_ps512(_mm256_cvtepi32_ps(bsums_weighed(k->mins16, a)));
    *acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dd), _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), *acc);
    *acc = _mm512_fnmadd_ps(_mm512_broadcastss_ps(_mm_movehdup_ps(dd)), mins, *acc);
}

static inline void q4_K_unpack(const struct block_q4_K *b, struct k4_weights *k) {
    k4_unpack(b->scales, b->qs, NULL, k);
}
static inline void q5_K_unpack(const struct block_q5_K *b, struct k4_weights *k) {
    k4_unpack(b->scales, b->qs, b->qh, k);
}
static inline void q4_K_token(const struct k4_weights *k, const struct block_q4_K *b, const struct block_q8_K *a,
                              __m512 *acc) {
    k4_token(k, &b->d, a, acc);
}
static inline void q5_K_token(const struct k4_weights *k, const struct block_q5_K *b, const struct block_q8_K *a,
                              __m512 *acc) {
    k4_token(k, &b->d, a, acc);
}
static inline float k4_result(const __m512 *acc) { return _mm512_reduce_add_ps(*acc); }

QUANT_K_DOTS(q4_K, avx512, struct k4_weights, __m512, q4_K_unpack, q4_K_token, k4_result)
QUANT_K_DOTS(q5_K, avx512, struct k4_weights, __m512, q5_K_unpack, q5_K_token, k4_result)

/* ---- the formats of 16-element sub-blocks: Q2_K, Q3_K, Q6_K
 *
 * A super-block's weights, unpacked once for every token: the unsigned codes of its four steps of
 * 64 (per half of 128 elements, two steps), each step's scales spread over its pair lanes, the
 * scales as int16, and what weighs the activations' block sums (Q2_K's mins). */
struct k16_weights {
    __m512i codes[4], scales16[4];
    __m256i sc, mins;
};

static inline void spread_scales(struct k16_weights *k) {
    const __m512i sc512 = _mm512_zextsi256_si512(k->sc);
    _Pragma("GCC unroll 4") for (int s = 0; s < 4; s++)
        k->scales16[s] = _mm512_permutexvar_epi16(spread16_index(s), sc512);
}

/* Q2_K and Q3_K read their codes the same way; Q3_K (hmask != NULL) adds 4 where the fifth bit is. */
static inline void crumbs_unpack(const uint8_t *qs, const uint8_t *hmask_bits, struct k16_weights *k) {
    const __m512i four = _mm512_set1_epi8(4);
    /* bit g of byte l: the fifth bit of element 32g + l */
    const __m256i hm = hmask_bits ? load256(hmask_bits) : _mm256_setzero_si256();
    const __m512i hmask = join(hm, hm);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m512i c01, c23;
        crumbs_128(qs + 32 * h, &c01, &c23);
        if (hmask_bits) {
            c01 = _mm512_mask_add_epi8(c01, _mm512_test_epi8_mask(hmask, bit_pair(2 * h)), c01, four);
            c23 = _mm512_mask_add_epi8(c23, _mm512_test_epi8_mask(hmask, bit_pair(2 * h + 1)), c23, four);
        }
        k->codes[2 * h] = c01, k->codes[2 * h + 1] = c23;
    }
    spread_scales(k);
}

static inline void q2_K_unpack(const struct block_q2_K *b, struct k16_weights *k) {
    __m128i raw = _mm_loadu_si128((const __m128i *)b->scales);
    k->sc = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0x0f)));
    k->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f)));
    crumbs_unpack(b->qs, NULL, k);
}

static inline void q3_K_unpack(const struct block_q3_K *b, struct k16_weights *k) {
    k->sc = _mm256_cvtepi8_epi16(q3_K_scales_sse(b->scales));
    crumbs_unpack(b->qs, b->hmask, k);
}

/* Q6_K: the low nibbles of ql[0..63] are elements 0..63 of a half, the high nibbles 64..127;
 * qh[l] holds the top 2 bits of l, l + 32, l + 64, l + 96; codes q + 32. */
static inline void q6_K_unpack(const struct block_q6_K *b, struct k16_weights *k) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m_hi = _mm512_set1_epi8(0x30);
    k->sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
        __m256i qh = load256(b->qh + 32 * h);
        __m512i high_a = _mm512_and_si512(join(_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2)), m_hi);
        __m512i high_b = _mm512_and_si512(join(qh, _mm256_srli_epi16(qh, 2)), m_hi);
        k->codes[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), high_a);
        k->codes[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), high_b);
    }
    spread_scales(k);
}

/* sum over the super-block of scale * code * act, as 16 int32. */
static inline __m512i k16_sum(const struct k16_weights *k, const struct block_q8_K *a) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        s0 = scaled_dot(s0, k->codes[2 * h], a->qs + 128 * h, k->scales16[2 * h]);
        s1 = scaled_dot(s1, k->codes[2 * h + 1], a->qs + 128 * h + 64, k->scales16[2 * h + 1]);
    }
    return _mm512_add_epi32(s0, s1);
}

/* Q3_K and Q6_K: codes offset by 2^shift, which comes back out through the block sums. */
static inline void offset_token(const struct k16_weights *k, uint16_t d, int shift, const struct block_q8_K *a,
                                __m512 *acc) {
    __m256i offset = _mm256_slli_epi32(bsums_weighed(k->sc, a), shift);
    __m512i sumi = _mm512_sub_epi32(k16_sum(k, a), _mm512_zextsi256_si512(offset));
    *acc = _mm512_fmadd_ps(_mm512_set1_ps(a->d * _cvtsh_ss(d)), _mm512_cvtepi32_ps(sumi), *acc);
}

static inline void q3_K_token(const struct k16_weights *k, const struct block_q3_K *b, const struct block_q8_K *a,
                              __m512 *acc) {
    offset_token(k, b->d, 2, a, acc);
}
static inline void q6_K_token(const struct k16_weights *k, const struct block_q6_K *b, const struct block_q8_K *a,
                              __m512 *acc) {
    offset_token(k, b->d, 5, a, acc);
}
static inline float offset_result(const __m512 *acc) { return _mm512_reduce_add_ps(*acc); }

/* Q2_K's sums: the scaled codes and the mins. */
struct k2_acc {
    __m512 sum;
    __m256 min;
};

static inline void q2_K_token(const struct k16_weights *k, const struct block_q2_K *b, const struct block_q8_K *a,
                              struct k2_acc *acc) {
    __m128 dd = d_dmin_times(&b->d, a->d);
    acc->sum = _mm512_fmadd_ps(_mm512_broadcastss_ps(dd), _mm512_cvtepi32_ps(k16_sum(k, a)), acc->sum);
    acc->min = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
                               _mm256_cvtepi32_ps(bsums_weighed(k->mins, a)), acc->min);
}
static inline float q2_K_result(const struct k2_acc *acc) {
    return _mm512_reduce_add_ps(acc->sum) - hsum_ps256(acc->min);
}

QUANT_K_DOTS(q2_K, avx512, struct k16_weights, struct k2_acc, q2_K_unpack, q2_K_token, q2_K_result)
QUANT_K_DOTS(q3_K, avx512, struct k16_weights, __m512, q3_K_unpack, q3_K_token, offset_result)
QUANT_K_DOTS(q6_K, avx512, struct k16_weights, __m512, q6_K_unpack, q6_K_token, offset_result)
