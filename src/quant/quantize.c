/* Quantizers from f32 for writing weights. The 32-element formats use the round-to-nearest
 * reference rules that ggml and gguf-py share, byte for byte. Q4_K and Q6_K fit each
 * sub-block's scale (and min) by a short least-squares search over candidate scales, then
 * round the sub-block scales to their 6/8-bit codes and requantize against the rounded ones. */
#include <math.h>

#include "quant/quant_internal.h"

/* The element of largest magnitude, with its sign (the first one on ties). */
static float signed_abs_max(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* round(v) clamped to lo..hi; safe for any v (the rounding trick needs |v| < 2^22). */
static int round_clamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo; /* also nan */
    if (v >= (float)hi) return hi;
    return clamp_int(quant_round_even(v), lo, hi);
}

/* A super-block scale as f16 bits, never rounded to zero when the scale is not: tiny weights
 * then get coarse codes against the smallest half instead of all becoming zero. */
static uint16_t half_scale(float scale) {
    uint16_t h = half_from_f32(scale);
    return scale > 0 && (h & 0x7fff) == 0 ? 1 : h;
}

/* The code of `value` in units of `step` (0 when the step is 0). */
static int round_code(float value, float step, int lo, int hi) {
    return step > 0 ? round_clamp(value / step, lo, hi) : 0;
}

/* ---- 32-element formats */

void quant_quantize_q8_0(const float *x, void *dst, int64_t n) {
    struct block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
        y[i].d = half_from_f32(d);
    }
}

/* Symmetric 4/5-bit: the largest-magnitude element maps to code 0 (value -2^(bits-1) * d). */
static void quantize_symmetric(const float *x, float levels, int max_code, uint8_t q[32], float *d_out) {
    float d = signed_abs_max(x, 32) / -levels;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        int v = (int8_t)(x[j] * id + (levels + 0.5f));
        q[j] = (uint8_t)(v < max_code ? v : max_code);
    }
    *d_out = d;
}

/* Asymmetric 4/5-bit: min maps to code 0, max to the top code. */
static void quantize_offset(const float *x, int max_code, uint8_t q[32], float *d_out, float *m_out) {
    float min = x[0], max = x[0];
    for (int j = 1; j < 32; j++) {
        min = fminf(min, x[j]);
        max = fmaxf(max, x[j]);
    }
    float d = (max - min) / (float)max_code;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        int v = (int8_t)((x[j] - min) * id + 0.5f);
        q[j] = (uint8_t)(v < max_code ? v : max_code);
    }
    *d_out = d;
    *m_out = min;
}

static void pack_nibbles(const uint8_t q[32], uint8_t qs[16]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
}

static void pack_high_bits(const uint8_t q[32], uint8_t qh[4]) {
    uint32_t bits = 0;
    for (int j = 0; j < 32; j++) bits |= (uint32_t)((q[j] >> 4) & 1) << j;
    memcpy(qh, &bits, 4);
}

void quant_quantize_q4_0(const float *x, void *dst, int64_t n) {
    struct block_q4_0 *y = dst;
    uint8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d;
        quantize_symmetric(x, 8, 15, q, &d);
        y[i].d = half_from_f32(d);
        pack_nibbles(q, y[i].qs);
    }
}

void quant_quantize_q5_0(const float *x, void *dst, int64_t n) {
    struct block_q5_0 *y = dst;
    uint8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d;
        quantize_symmetric(x, 16, 31, q, &d);
        y[i].d = half_from_f32(d);
        pack_high_bits(q, y[i].qh);
        pack_nibbles(q, y[i].qs);
    }
}

void quant_quantize_q4_1(const float *x, void *dst, int64_t n) {
    struct block_q4_1 *y = dst;
    uint8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d, m;
        quantize_offset(x, 15, q, &d, &m);
        y[i].d = half_from_f32(d);
        y[i].m = half_from_f32(m);
        pack_nibbles(q, y[i].qs);
    }
}

void quant_quantize_q5_1(const float *x, void *dst, int64_t n) {
    struct block_q5_1 *y = dst;
    uint8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float d, m;
        quantize_offset(x, 31, q, &d, &m);
        y[i].d = half_from_f32(d);
        y[i].m = half_from_f32(m);
        pack_high_bits(q, y[i].qh);
        pack_nibbles(q, y[i].qs);
    }
}

/* ---- K formats */

/* Fit x ~ scale * q - min with q in 0..max_code, scale >= 0, min >= 0 (the format subtracts
 * a non-negative min). Tries candidate step sizes around (hi - lo) / max_code, refits scale
 * and min by least squares for each assignment, keeps the smallest squared error. */
static void fit_scale_min(const float *x, int n, int max_code, float *scale, float *min) {
    float lo = 0, hi = x[0];
    for (int j = 0; j < n; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    *scale = 0;
    *min = -lo;
    if (hi <= lo) return;
    float best_err = INFINITY;
    for (int step = -10; step <= 10; step++) {
        float iscale = ((float)max_code + 0.1f * (float)step) / (hi - lo);
        float sq = 0, sq2 = 0, sx = 0, sqx = 0;
        uint8_t q[32];
        for (int j = 0; j < n; j++) {
            q[j] = (uint8_t)round_clamp((x[j] - lo) * iscale, 0, max_code);
            sq += q[j];
            sq2 += (float)q[j] * q[j];
            sx += x[j];
            sqx += q[j] * x[j];
        }
        /* least squares for scale a and offset b; all codes equal (det 0) or a positive
         * offset leave the scale alone to fit */
        float det = (float)n * sq2 - sq * sq, a = 0, b = 1;
        if (det > 0) {
            a = ((float)n * sqx - sq * sx) / det;
            b = (sx - a * sq) / (float)n;
        }
        if (b > 0) {
            b = 0;
            a = sq2 > 0 ? sqx / sq2 : 0;
        }
        if (a <= 0) continue;
        float err = 0;
        for (int j = 0; j < n; j++) {
            float e = a * q[j] + b - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            *scale = a;
            *min = -b;
        }
    }
}

/* Fit x ~ scale * q with q in -32..31 (Q6_K's 6-bit signed codes); scale may be negative so
 * the largest-magnitude element can use code -32. */
static float fit_scale_signed(const float *x, int n) {
    float max = signed_abs_max(x, n);
    if (max == 0) return 0;
    float best_err = INFINITY, best = 0;
    for (int step = -10; step <= 10; step++) {
        float iscale = -(32.0f + 0.1f * (float)step) / max;
        float sq2 = 0, sqx = 0;
        int8_t q[16];
        for (int j = 0; j < n; j++) {
            q[j] = (int8_t)round_clamp(x[j] * iscale, -32, 31);
            sq2 += (float)q[j] * q[j];
            sqx += q[j] * x[j];
        }
        if (sq2 == 0) continue;
        float a = sqx / sq2, err = 0;
        for (int j = 0; j < n; j++) {
            float e = a * q[j] - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best = a;
        }
    }
    return best;
}

void quant_quantize_q4_K(const float *x, void *dst, int64_t n) {
    struct block_q4_K *y = dst;
    for (int64_t i = 0; i < n / QUANT_QK_K; i++, x += QUANT_QK_K) {
        float scale[8], min[8], max_scale = 0, max_min = 0;
        for (int s = 0; s < 8; s++) {
            fit_scale_min(x + 32 * s, 32, 15, &scale[s], &min[s]);
            max_scale = fmaxf(max_scale, scale[s]);
            max_min = fmaxf(max_min, min[s]);
        }
        y[i].d = half_scale(max_scale / 63);
        y[i].dmin = half_scale(max_min / 63);
        float d = half_to_f32(y[i].d), dmin = half_to_f32(y[i].dmin);
        uint8_t ls[8], lm[8];
        for (int s = 0; s < 8; s++) {
            ls[s] = (uint8_t)round_code(scale[s], d, 0, 63);
            lm[s] = (uint8_t)round_code(min[s], dmin, 0, 63);
        }
        /* 6-bit packing: sub-blocks 0..3 whole in bytes 0..7; 4..7 split into nibbles in
         * bytes 8..11 and their top 2 bits in the top of bytes 0..7 */
        memset(y[i].scales, 0, 12);
        for (int s = 0; s < 4; s++) {
            y[i].scales[s] = ls[s] | (uint8_t)((ls[s + 4] >> 4) << 6);
            y[i].scales[s + 4] = lm[s] | (uint8_t)((lm[s + 4] >> 4) << 6);
            y[i].scales[s + 8] = (uint8_t)((ls[s + 4] & 0xf) | ((lm[s + 4] & 0xf) << 4));
        }
        uint8_t q[QUANT_QK_K];
        for (int s = 0; s < 8; s++) {
            float dl = d * ls[s], ml = dmin * lm[s];
            for (int j = 32 * s; j < 32 * s + 32; j++) q[j] = (uint8_t)round_code(x[j] + ml, dl, 0, 15);
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

void quant_quantize_q6_K(const float *x, void *dst, int64_t n) {
    struct block_q6_K *y = dst;
    for (int64_t i = 0; i < n / QUANT_QK_K; i++, x += QUANT_QK_K) {
        float scale[16], max_abs = 0;
        for (int s = 0; s < 16; s++) {
            scale[s] = fit_scale_signed(x + 16 * s, 16);
            max_abs = fmaxf(max_abs, fabsf(scale[s]));
        }
        y[i].d = half_scale(max_abs / 127);
        float d = half_to_f32(y[i].d);
        for (int s = 0; s < 16; s++) y[i].scales[s] = (int8_t)round_code(scale[s], d, -127, 127);
        uint8_t q[QUANT_QK_K]; /* codes 0..63 = value + 32 */
        for (int j = 0; j < QUANT_QK_K; j++) {
            float dl = d * y[i].scales[j / 16];
            int v = dl != 0 ? round_clamp(x[j] / dl, -32, 31) : 0;
            q[j] = (uint8_t)(v + 32);
        }
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((qq[l] & 0xf) | ((qq[l + 64] & 0xf) << 4));
                ql[l + 32] = (uint8_t)((qq[l + 32] & 0xf) | ((qq[l + 96] & 0xf) << 4));
                qh[l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                  ((qq[l + 96] >> 4) << 6));
            }
        }
    }
}
