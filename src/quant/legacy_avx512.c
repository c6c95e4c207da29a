/* AVX-512 (VNNI) dot products of the 32-element formats: two blocks per 512-bit vector,
 * vpdpbusd multiplies the unsigned weight codes with the signed activations, and the formats'
 * offsets (Q4_0: 8, Q5_0: 16, Q8_0: the +128 bias that makes its codes unsigned) come back
 * out as offset * sum(activations), from a second vpdpbusd. */
#include "quant/quant_internal.h"
#include "quant/simd_x86.h"

/* Two 32-byte block payloads side by side in one 512-bit vector. */
static inline __m512i pair_512(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* Two blocks of 16 packed nibble bytes -> 64 bytes 0..15 in element order, block by block: each
 * block's bytes loaded into two 128-bit lanes (one shuffle joins the blocks), the second lane of
 * each shifted by 4, all masked. */
static inline __m512i nibbles_pair_512(const uint8_t *lo, const uint8_t *hi) {
    __m256i l = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lo));
    __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hi));
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
    z = _mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

/* Eight blocks' two halves d and m (or Q8_1's d and s) at p, p + stride, ...: each block's four
 * bytes in one load, the halves split by vpmovdw, so a block takes one scalar load where two
 * halves8 take two (for d alone halves8 measured faster). */
static inline void half_pairs8(const void *p, size_t stride, __m256 *first, __m256 *second) {
    const uint8_t *b = p;
    const __m256i v = _mm256_setr_epi64x(
        (long long)(quant_load_u32(b) | (uint64_t)quant_load_u32(b + stride) << 32),
        (long long)(quant_load_u32(b + 2 * stride) | (uint64_t)quant_load_u32(b + 3 * stride) << 32),
        (long long)(quant_load_u32(b + 4 * stride) | (uint64_t)quant_load_u32(b + 5 * stride) << 32),
        (long long)(quant_load_u32(b + 6 * stride) | (uint64_t)quant_load_u32(b + 7 * stride) << 32));
    *first = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v));
    *second = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(v, 16)));
}

/* int32 sums of code * act over each group of 4, minus offset * act. */
static inline __m512i dot_offset(__m512i codes, __m512i act, char offset) {
    __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, act);
    if (offset == 0) return sum;
    return _mm512_sub_epi32(sum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(offset), act));
}

/* Q5: the fifth bits of two blocks as one 64-bit mask, element order. */
static inline __m512i add_fifth_bits(__m512i codes, const uint8_t *qh_lo, const uint8_t *qh_hi) {
    __mmask64 bits = (__mmask64)quant_load_u32(qh_lo) | ((__mmask64)quant_load_u32(qh_hi) << 32);
    return _mm512_mask_add_epi8(codes, bits, codes, _mm512_set1_epi8(16));
}

/* The loop shared by all five: groups of 8 blocks, whose scales dw * da are converted
 * together and spread two per vector with vpermps; two blocks per vpdpbusd step, two
 * accumulators. HALVES(i) declares blocks i..i+7's wd and ad (Q8_1 formats: also wm and as,
 * loaded with them); OFFSET adds the Q8_1 term m * s of the 8 blocks, or nothing. The last 0..7
 * blocks go to the AVX2 kernel. CODES(i) gives the codes of blocks i, i + 1. */
#define PAIR_DOT_LOOP(CODES, ZERO_POINT, HALVES, OFFSET, avx2_dot)                                                  \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                                                  \
    __m256 acc_m = _mm256_setzero_ps();                                                                             \
    int64_t nb = n / 32, i = 0;                                                                                     \
    for (; i + 8 <= nb; i += 8) {                                                                                   \
        HALVES(i);                                                                                                  \
        __m512 scales = _mm512_castps256_ps512(_mm256_mul_ps(wd, ad));                                              \
        _Pragma("GCC unroll 2") for (int p = 0; p < 4; p += 2) {                                                    \
            __m512i s0 = dot_offset(CODES(i + 2 * p), pair_512(a[i + 2 * p].qs, a[i + 2 * p + 1].qs), ZERO_POINT);  \
            __m512i s1 =                                                                                            \
                dot_offset(CODES(i + 2 * p + 2), pair_512(a[i + 2 * p + 2].qs, a[i + 2 * p + 3].qs), ZERO_POINT);   \
            acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair_index(p), scales), _mm512_cvtepi32_ps(s0), acc0);     \
            acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair_index(p + 1), scales), _mm512_cvtepi32_ps(s1), acc1); \
        }                                                                                                           \
        OFFSET;                                                                                                     \
    }                                                                                                               \
    float tail = i < nb ? avx2_dot((nb - i) * 32, &b[i], &a[i]) : 0.0f;                                             \
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + hsum_ps256(acc_m) + tail;

/* vpermps indices putting scale 2p in lanes 0..7 and 2p + 1 in lanes 8..15. */
static inline __m512i pair_index(int p) {
    return _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                            2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p);
}

/* Blocks i and i + 1's codes: Q4 nibbles, Q5 with their fifth bits, Q8_0 made unsigned by +128. */
#define NIBBLE_CODES(i) nibbles_pair_512(b[i].qs, b[(i) + 1].qs)
#define FIFTH_BIT_CODES(i) add_fifth_bits(NIBBLE_CODES(i), b[i].qh, b[(i) + 1].qh)
#define BIASED_CODES(i) _mm512_xor_si512(pair_512(b[i].qs, b[(i) + 1].qs), _mm512_set1_epi8((char)0x80))

/* Blocks i..i+7's scales: d alone (Q8_0 activations), or d with m and s (Q8_1). */
#define D_HALVES(i) const __m256 wd = halves8(&b[i].d, sizeof *b), ad = halves8(&a[i].d, sizeof *a)
#define DM_HALVES(i)                             \
    __m256 wd, wm, ad, as;                       \
    half_pairs8(&b[i].d, sizeof *b, &wd, &wm);   \
    half_pairs8(&a[i].d, sizeof *a, &ad, &as)

#define NO_OFFSET ((void)0)
#define Q8_1_OFFSET (acc_m = _mm256_fmadd_ps(wm, as, acc_m))

float quant_dot_q4_0_avx512(int64_t n, const void *w, const void *act) {
    const struct block_q4_0 *b = w;
    const struct block_q8_0 *a = act;
    PAIR_DOT_LOOP(NIBBLE_CODES, 8, D_HALVES, NO_OFFSET, quant_dot_q4_0_avx2)
}

float quant_dot_q4_1_avx512(int64_t n, const void *w, const void *act) {
    const struct block_q4_1 *b = w;
    const struct block_q8_1 *a = act;
    PAIR_DOT_LOOP(NIBBLE_CODES, 0, DM_HALVES, Q8_1_OFFSET, quant_dot_q4_1_avx2)
}

float quant_dot_q5_0_avx512(int64_t n, const void *w, const void *act) {
    const struct block_q5_0 *b = w;
    const struct block_q8_0 *a = act;
    PAIR_DOT_LOOP(FIFTH_BIT_CODES, 16, D_HALVES, NO_OFFSET, quant_dot_q5_0_avx2)
}

float quant_dot_q5_1_avx512(int64_t n, const void *w, const void *act) {
    const struct block_q5_1 *b = w;
    const struct block_q8_1 *a = act;
    PAIR_DOT_LOOP(FIFTH_BIT_CODES, 0, DM_HALVES, Q8_1_OFFSET, quant_dot_q5_1_avx2)
}

float quant_dot_q8_0_avx512(int64_t n, const void *w, const void *act) {
    const struct block_q8_0 *b = w;
    const struct block_q8_0 *a = act;
    PAIR_DOT_LOOP(BIASED_CODES, (char)0x80, D_HALVES, NO_OFFSET, quant_dot_q8_0_avx2)
}

/* Four tokens at once (prompts): each pair of weight blocks is unpacked once for four activation
 * rows, and every token's steps are PAIR_DOT_LOOP's in the same order (its last blocks through the
 * AVX2 four-token kernel, which is the AVX2 kernel's bit for bit), so a token's result does not
 * depend on its batch. */
#define PAIR_DOT4_LOOP(ACT, CODES, ZERO_POINT, HALVES4, OFFSET4, avx2_dot4)                                          \
    const struct ACT *a4[4];                                                                                         \
    __m512 acc0[4], acc1[4];                                                                                         \
    __m256 acc_m[4];                                                                                                 \
    for (int j = 0; j < 4; j++) {                                                                                    \
        a4[j] = (const struct ACT *)((const uint8_t *)act + (size_t)j * act_stride);                                 \
        acc0[j] = acc1[j] = _mm512_setzero_ps();                                                                     \
        acc_m[j] = _mm256_setzero_ps();                                                                              \
    }                                                                                                                \
    int64_t nb = n / 32, i = 0;                                                                                      \
    for (; i + 8 <= nb; i += 8) {                                                                                    \
        HALVES4(i);                                                                                                  \
        _Pragma("GCC unroll 2") for (int p = 0; p < 4; p += 2) {                                                     \
            const __m512i c0 = CODES(i + 2 * p), c1 = CODES(i + 2 * p + 2);                                          \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                    \
                const struct ACT *a = a4[j];                                                                         \
                __m512i s0 = dot_offset(c0, pair_512(a[i + 2 * p].qs, a[i + 2 * p + 1].qs), ZERO_POINT);             \
                __m512i s1 = dot_offset(c1, pair_512(a[i + 2 * p + 2].qs, a[i + 2 * p + 3].qs), ZERO_POINT);         \
                const __m512 v0 = _mm512_permutexvar_ps(pair_index(p), scales[j]);                                   \
                const __m512 v1 = _mm512_permutexvar_ps(pair_index(p + 1), scales[j]);                               \
                acc0[j] = _mm512_fmadd_ps(v0, _mm512_cvtepi32_ps(s0), acc0[j]);                                      \
                acc1[j] = _mm512_fmadd_ps(v1, _mm512_cvtepi32_ps(s1), acc1[j]);                                      \
            }                                                                                                        \
        }                                                                                                            \
        for (int j = 0; j < 4; j++) OFFSET4(j);                                                                      \
    }                                                                                                                \
    float tail[4] = {0, 0, 0, 0};                                                                                    \
    if (i < nb) avx2_dot4((nb - i) * 32, &b[i], &a4[0][i], act_stride, tail);                                        \
    for (int j = 0; j < 4; j++)                                                                                      \
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) + hsum_ps256(acc_m[j]) + tail[j];

/* D_HALVES and DM_HALVES for four tokens: the weights' halves once, then each token's scales
 * wd * ad in scales[j] (and its as[j]). */
#define D_HALVES4(i)                                                                                   \
    const __m256 wd = halves8(&b[i].d, sizeof *b);                                                     \
    __m512 scales[4];                                                                                  \
    for (int j = 0; j < 4; j++)                                                                        \
        scales[j] = _mm512_castps256_ps512(_mm256_mul_ps(wd, halves8(&a4[j][i].d, sizeof *a4[j])))
#define DM_HALVES4(i)                                                                                  \
    __m256 wd, wm, as[4];                                                                              \
    __m512 scales[4];                                                                                  \
    half_pairs8(&b[i].d, sizeof *b, &wd, &wm);                                                         \
    for (int j = 0; j < 4; j++) {                                                                      \
        __m256 ad;                                                                                     \
        half_pairs8(&a4[j][i].d, sizeof *a4[j], &ad, &as[j]);                                          \
        scales[j] = _mm512_castps256_ps512(_mm256_mul_ps(wd, ad));                                     \
    }

#define Q8_1_OFFSET4(j) (acc_m[j] = _mm256_fmadd_ps(wm, as[j], acc_m[j]))
#define NO_OFFSET4(j) ((void)0)

void quant_dot4_q4_0_avx512(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {
    const struct block_q4_0 *b = w;
    PAIR_DOT4_LOOP(block_q8_0, NIBBLE_CODES, 8, D_HALVES4, NO_OFFSET4, quant_dot4_q4_0_avx2)
}

void quant_dot4_q4_1_avx512(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {
    const struct block_q4_1 *b = w;
    PAIR_DOT4_LOOP(block_q8_1, NIBBLE_CODES, 0, DM_HALVES4, Q8_1_OFFSET4, quant_dot4_q4_1_avx2)
}

void quant_dot4_q8_0_avx512(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {
    const struct block_q8_0 *b = w;
    PAIR_DOT4_LOOP(block_q8_0, BIASED_CODES, (char)0x80, D_HALVES4, NO_OFFSET4, quant_dot4_q8_0_avx2)
}
