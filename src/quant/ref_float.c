/* Reference kernels of the float formats (F32, F16, BF16): conversion of rows and dot products.
 * As in llama.cpp's CPU backend, an F16 (BF16) weight is dotted with activations rounded to
 * F16 (BF16); F32 with F32. Sums are kept in double here: the reference should be the most
 * accurate value, which the SIMD variants approach within float rounding. */
#include "quant/quant_internal.h"

void quant_dequant_f32_ref(const void *w, float *y, int64_t n) { memcpy(y, w, (size_t)n * 4); }

void quant_dequant_f16_ref(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    for (int64_t i = 0; i < n; i++) y[i] = half_load(p + 2 * i);
}

void quant_dequant_bf16_ref(const void *w, float *y, int64_t n) {
    const uint8_t *p = w;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = bf16_to_f32(h);
    }
}

void quant_act_f32_ref(const float *x, void *act, int64_t n) { memcpy(act, x, (size_t)n * 4); }

void quant_act_f16_ref(const float *x, void *act, int64_t n) {
    uint8_t *p = act;
    for (int64_t i = 0; i < n; i++) half_store(p + 2 * i, x[i]);
}

void quant_act_bf16_ref(const float *x, void *act, int64_t n) {
    uint8_t *p = act;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = bf16_from_f32(x[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

float quant_dot_f32_ref(int64_t n, const void *w, const void *act) {
    const uint8_t *a = w, *b = act;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        float x, y;
        memcpy(&x, a + 4 * i, 4);
        memcpy(&y, b + 4 * i, 4);
        sum += (double)x * y;
    }
    return (float)sum;
}

float quant_dot_f16_ref(int64_t n, const void *w, const void *act) {
    const uint8_t *a = w, *b = act;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)half_load(a + 2 * i) * half_load(b + 2 * i);
    return (float)sum;
}

float quant_dot_bf16_ref(int64_t n, const void *w, const void *act) {
    const uint8_t *a = w, *b = act;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t x, y;
        memcpy(&x, a + 2 * i, 2);
        memcpy(&y, b + 2 * i, 2);
        sum += (double)bf16_to_f32(x) * bf16_to_f32(y);
    }
    return (float)sum;
}
