/* IEEE half (f16) and bfloat16 (bf16) <-> f32 conversions, shared by the whole engine.
 * Both directions are exact where the result is representable; f32 -> half/bf16 rounds to
 * nearest-even, as F16C, numpy and ggml do, so values written here match theirs bit for bit. */
#ifndef QUANT_HALF_H
#define QUANT_HALF_H

#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline uint32_t half_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float half_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float half_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return half_bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, nan */
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return half_bits_f32(sign | half_f32_bits(v));
    }
    return half_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
#endif
}

static inline uint16_t half_from_f32(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x = half_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* quiet nan */
    if (ax >= 0x477ff000u) return sign | 0x7c00;                                 /* >= 65520 rounds to infinity */
    if (ax < 0x38800000u) {
        /* below the smallest normal half (2^-14): result is a subnormal in units of 2^-24 */
        uint32_t e = ax >> 23;
        if (e < 102) return sign; /* below 2^-25: rounds to zero */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1))) h++; /* may carry into the normal range */
        return sign | (uint16_t)h;
    }
    uint32_t r = ax - 0x38000000u;  /* rebias exponent 127 -> 15 */
    r += 0x0fffu + ((r >> 13) & 1); /* round to nearest even on the 13 dropped bits */
    return sign | (uint16_t)(r >> 13);
#endif
}

static inline float bf16_to_f32(uint16_t h) { return half_bits_f32((uint32_t)h << 16); }

static inline uint16_t bf16_from_f32(float f) {
    uint32_t u = half_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* keep nan quiet */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* Unaligned-safe loads of a stored half/bf16: blocks are packed, so scales may sit at odd
 * addresses inside a mapped file. */
static inline float half_load(const void *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return half_to_f32(h);
}

static inline void half_store(void *p, float f) {
    uint16_t h = half_from_f32(f);
    memcpy(p, &h, sizeof h);
}

#endif
