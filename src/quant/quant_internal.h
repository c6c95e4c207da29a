/* Inside the quant module: every variant's kernels by name, and the small scalar helpers that
 * the reference and SIMD files share (rounding, unpacking of K-format scales). */
#ifndef QUANT_INTERNAL_H
#define QUANT_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "quant/quant.h"

/* Round to nearest, ties to even, as the activation quantizers must; valid for |x| < 2^22.
 * Adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits. */
static inline int quant_round_even(float x) {
    float v = x + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline uint32_t quant_load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 8 six-bit scales and mins of a Q4_K/Q5_K block from its 12 packed bytes. Sub-blocks
 * 0..3 sit whole in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); 4..7 keep their
 * low 4 bits in the nibbles of bytes 8..11 and their top 2 bits in the top of bytes 0..7.
 * Done on 32-bit words, four sub-blocks at a time. */
static inline void quant_k4_scales(const uint8_t s[12], uint8_t sc[8], uint8_t m[8]) {
    uint32_t w0 = quant_load_u32(s), w1 = quant_load_u32(s + 4), w2 = quant_load_u32(s + 8);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
    memcpy(sc, &sc_lo, 4);
    memcpy(sc + 4, &sc_hi, 4);
    memcpy(m, &m_lo, 4);
    memcpy(m + 4, &m_hi, 4);
}

/* A K format's dot product and its four-token version, which gives each token the same result
 * bit for bit: each super-block's weights are unpacked once (UNPACK(block, &weights)), then each
 * token's sums are added into its accumulators (TOKEN(&weights, block, act_block, &acc)) in the
 * same order; RESULT(&acc) is the total. ACC is a vector accumulator or a struct of them, zero to
 * start. */
#define QUANT_K_DOTS(t, impl, WEIGHTS, ACC, UNPACK, TOKEN, RESULT)                                                     \
    float quant_dot_##t##_##impl(int64_t n, const void *w, const void *act) {                                          \
        const struct block_##t *b = w;                                                                                 \
        const struct block_q8_K *a = act;                                                                              \
        ACC acc;                                                                                                       \
        memset(&acc, 0, sizeof acc);                                                                                   \
        WEIGHTS k;                                                                                                     \
        for (int64_t i = 0; i < n / QUANT_QK_K; i++) {                                                                 \
            UNPACK(&b[i], &k);                                                                                         \
            TOKEN(&k, &b[i], &a[i], &acc);                                                                             \
        }                                                                                                              \
        return RESULT(&acc);                                                                                           \
    }                                                                                                                  \
    void quant_dot4_##t##_##impl(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {           \
        const struct block_##t *b = w;                                                                                 \
        ACC acc[4];                                                                                                    \
        memset(acc, 0, sizeof acc);                                                                                    \
        WEIGHTS k;                                                                                                     \
        for (int64_t i = 0; i < n / QUANT_QK_K; i++) {                                                                 \
            UNPACK(&b[i], &k);                                                                                         \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {                                                      \
                const struct block_q8_K *a = (const void *)((const uint8_t *)act + j * act_stride);                    \
                TOKEN(&k, &b[i], &a[i], &acc[j]);                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        for (int j = 0; j < 4; j++) out[j] = RESULT(&acc[j]);                                                          \
    }

/* The same pair of kernels built the other way round, for ISAs whose registers cannot hold an
 * unpacked super-block beside four tokens' sums (AVX2's sixteen): SUMS(block, acts, tokens, isum)
 * adds every token's integer sums over the super-block in one pass (acts[j], isum[j]: token j's
 * activation block and sums), each step's codes unpacked once for the tokens and the sums kept in
 * registers, and returns what else the block's float steps need (EXTRA); FINISH(&extra, block,
 * act_block, isum, &acc) then runs a token's float steps, the same ones whatever the number of
 * tokens. Integer sums are exact in any order, so each token's result is the same bit for bit.
 * AVX-512 keeps the first form: built this way its four-token kernels ran 4-7% slower on the
 * development machine. */
#define QUANT_K_DOTS_BY_STEP(t, impl, ISUM, EXTRA, ACC, SUMS, FINISH, RESULT)                                          \
    float quant_dot_##t##_##impl(int64_t n, const void *w, const void *act) {                                          \
        const struct block_##t *b = w;                                                                                 \
        const struct block_q8_K *a = act;                                                                              \
        ACC acc;                                                                                                       \
        memset(&acc, 0, sizeof acc);                                                                                   \
        for (int64_t i = 0; i < n / QUANT_QK_K; i++) {                                                                 \
            const struct block_q8_K *ai[1] = {&a[i]};                                                                  \
            ISUM isum[1];                                                                                              \
            const EXTRA e = SUMS(&b[i], ai, 1, isum);                                                                  \
            FINISH(&e, &b[i], &a[i], isum[0], &acc);                                                                   \
        }                                                                                                              \
        return RESULT(&acc);                                                                                           \
    }                                                                                                                  \
    void quant_dot4_##t##_##impl(int64_t n, const void *w, const void *act, size_t act_stride, float *out) {           \
        const struct block_##t *b = w;                                                                                 \
        const struct block_q8_K *a[4];                                                                                 \
        for (int j = 0; j < 4; j++) a[j] = (const void *)((const uint8_t *)act + j * act_stride);                      \
        ACC acc[4];                                                                                                    \
        memset(acc, 0, sizeof acc);                                                                                    \
        for (int64_t i = 0; i < n / QUANT_QK_K; i++) {                                                                 \
            const struct block_q8_K *ai[4] = {&a[0][i], &a[1][i], &a[2][i], &a[3][i]};                                 \
            ISUM isum[4];                                                                                              \
            const EXTRA e = SUMS(&b[i], ai, 4, isum);                                                                  \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) FINISH(&e, &b[i], ai[j], isum[j], &acc[j]);            \
        }                                                                                                              \
        for (int j = 0; j < 4; j++) out[j] = RESULT(&acc[j]);                                                          \
    }

/* The 16 signed scales (-32..31) of a Q3_K block from its 12 packed bytes: low nibbles of
 * bytes 0..7 then their high nibbles give the low 4 bits; bits 2k..2k+1 of bytes 8..11 the
 * top 2 bits of scales 4k..4k+3. */
static inline void quant_q3_K_scales(const uint8_t s[12], int8_t out[16]) {
    uint32_t w0 = quant_load_u32(s), w1 = quant_load_u32(s + 4), w2 = quant_load_u32(s + 8);
    uint32_t v[4] = {
        (w0 & 0x0f0f0f0fu) | ((w2 & 0x03030303u) << 4),
        (w1 & 0x0f0f0f0fu) | (((w2 >> 2) & 0x03030303u) << 4),
        ((w0 >> 4) & 0x0f0f0f0fu) | (((w2 >> 4) & 0x03030303u) << 4),
        ((w1 >> 4) & 0x0f0f0f0fu) | (((w2 >> 6) & 0x03030303u) << 4),
    };
    uint8_t u[16];
    memcpy(u, v, 16);
    for (int i = 0; i < 16; i++) out[i] = (int8_t)(u[i] - 32);
}

/* Declare the kernels of one (type, variant): dequant_row and vec_dot. */
#define QUANT_DECLARE(t, impl)                                                                                         \
    void quant_dequant_##t##_##impl(const void *w, float *y, int64_t n);                                               \
    float quant_dot_##t##_##impl(int64_t n, const void *w, const void *act);

#define QUANT_DECLARE_ALL(impl)                                                                                        \
    QUANT_DECLARE(f32, impl)                                                                                           \
    QUANT_DECLARE(f16, impl)                                                                                           \
    QUANT_DECLARE(bf16, impl)                                                                                          \
    QUANT_DECLARE(q4_0, impl)                                                                                          \
    QUANT_DECLARE(q4_1, impl)                                                                                          \
    QUANT_DECLARE(q5_0, impl)                                                                                          \
    QUANT_DECLARE(q5_1, impl)                                                                                          \
    QUANT_DECLARE(q8_0, impl)                                                                                          \
    QUANT_DECLARE(q2_K, impl)                                                                                          \
    QUANT_DECLARE(q3_K, impl)                                                                                          \
    QUANT_DECLARE(q4_K, impl)                                                                                          \
    QUANT_DECLARE(q5_K, impl)                                                                                          \
    QUANT_DECLARE(q6_K, impl)                                                                                          \
    void quant_act_f32_##impl(const float *x, void *act, int64_t n);                                                   \
    void quant_act_f16_##impl(const float *x, void *act, int64_t n);                                                   \
    void quant_act_bf16_##impl(const float *x, void *act, int64_t n);                                                  \
    void quant_act_q8_0_##impl(const float *x, void *act, int64_t n);                                                  \
    void quant_act_q8_1_##impl(const float *x, void *act, int64_t n);                                                  \
    void quant_act_q8_K_##impl(const float *x, void *act, int64_t n);

QUANT_DECLARE_ALL(ref)
QUANT_DECLARE_ALL(avx2)

/* legacy_vnni_avx512.c: the AVX2 dot products of the 32-element formats with 256-bit VNNI. */
float quant_dot_q4_0_vnni256(int64_t n, const void *w, const void *act);
float quant_dot_q4_1_vnni256(int64_t n, const void *w, const void *act);
float quant_dot_q5_0_vnni256(int64_t n, const void *w, const void *act);
float quant_dot_q5_1_vnni256(int64_t n, const void *w, const void *act);
float quant_dot_q8_0_vnni256(int64_t n, const void *w, const void *act);

QUANT_DECLARE_ALL(avx512)

/* Four-token versions: the 32-element formats (legacy_avx2.c, built twice; legacy_avx512.c) and the K formats
 * (kquants_*.c). */
#define QUANT_DECLARE_DOT4(t, impl)                                                                                    \
    void quant_dot4_##t##_##impl(int64_t n, const void *w, const void *act, size_t act_stride, float *out);
#define QUANT_DECLARE_LEGACY_DOT4(impl)                                                                                \
    QUANT_DECLARE_DOT4(q4_0, impl) QUANT_DECLARE_DOT4(q4_1, impl) QUANT_DECLARE_DOT4(q8_0, impl)
#define QUANT_DECLARE_K_DOT4(impl)                                                                                     \
    QUANT_DECLARE_DOT4(q2_K, impl) QUANT_DECLARE_DOT4(q3_K, impl) QUANT_DECLARE_DOT4(q4_K, impl)                       \
    QUANT_DECLARE_DOT4(q5_K, impl) QUANT_DECLARE_DOT4(q6_K, impl)
QUANT_DECLARE_LEGACY_DOT4(avx2)
QUANT_DECLARE_LEGACY_DOT4(vnni256)
QUANT_DECLARE_LEGACY_DOT4(avx512)
QUANT_DECLARE_K_DOT4(avx2)
QUANT_DECLARE_K_DOT4(avx512)

/* Tiles of four rows by up to four tokens (float_avx2.c, float_avx512.c). */
#define QUANT_DECLARE_TILE(t, impl)                                                                                    \
    void quant_tile_##t##_##impl(int64_t n, const void *w, size_t w_stride, const void *act, size_t act_stride,        \
                                 int n_tokens, float *out);
QUANT_DECLARE_TILE(f32, avx2)
QUANT_DECLARE_TILE(f16, avx2)
QUANT_DECLARE_TILE(bf16, avx2)
QUANT_DECLARE_TILE(f32, avx512)
QUANT_DECLARE_TILE(f16, avx512)
QUANT_DECLARE_TILE(bf16, avx512)

/* Weight quantizers (quantize.c). */
void quant_quantize_q8_0(const float *x, void *dst, int64_t n);
void quant_quantize_q4_0(const float *x, void *dst, int64_t n);
void quant_quantize_q4_1(const float *x, void *dst, int64_t n);
void quant_quantize_q5_0(const float *x, void *dst, int64_t n);
void quant_quantize_q5_1(const float *x, void *dst, int64_t n);
void quant_quantize_q4_K(const float *x, void *dst, int64_t n);
void quant_quantize_q6_K(const float *x, void *dst, int64_t n);

#endif
