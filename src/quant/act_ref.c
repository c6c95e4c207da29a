/* Reference quantization of activations to Q8_0, Q8_1 and Q8_K, rounding exactly as
 * llama.cpp's x86 CPU backend does at run time (scale 127 / amax, ties to even), so a dot
 * product sees the same integer activations there and here. The SIMD versions must produce
 * identical bytes. */
#include <math.h>

#include "quant/quant_internal.h"

static float abs_max(const float *x, int n) {
    float amax = 0;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

/* Quantize one block of 32 to qs with scale amax / 127; returns the sum of the quants. */
static int quantize_block_q8(const float *x, int8_t qs[32], float *d_out) {
    float amax = abs_max(x, 32);
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        qs[j] = (int8_t)quant_round_even(x[j] * id);
        sum += qs[j];
    }
    *d_out = d;
    return sum;
}

void quant_act_q8_0_ref(const float *x, void *act, int64_t n) {
    struct block_q8_0 *y = act;
    for (int64_t i = 0; i < n / 32; i++) {
        float d;
        quantize_block_q8(x + 32 * i, y[i].qs, &d);
        y[i].d = half_from_f32(d);
    }
}

void quant_act_q8_1_ref(const float *x, void *act, int64_t n) {
    struct block_q8_1 *y = act;
    for (int64_t i = 0; i < n / 32; i++) {
        float d;
        int sum = quantize_block_q8(x + 32 * i, y[i].qs, &d);
        y[i].d = half_from_f32(d);
        y[i].s = half_from_f32(d * (float)sum); /* from the unrounded d, as llama.cpp */
    }
}

/* Q8_K: the element of largest magnitude (the first, on ties) maps to -127, so the scale
 * carries the sign; d = 1 / iscale is kept in f32. */
void quant_act_q8_K_ref(const float *x, void *act, int64_t n) {
    struct block_q8_K *y = act;
    for (int64_t i = 0; i < n / QUANT_QK_K; i++, x += QUANT_QK_K) {
        float amax = 0, max = 0;
        for (int j = 0; j < QUANT_QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < QUANT_QK_K; j++) {
            int v = quant_round_even(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < QUANT_QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}
