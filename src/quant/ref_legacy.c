/* Reference kernels of the 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: each block is
 * unpacked to its integer quants once, and both dequantization and the dot product read those,
 * so the two cannot disagree about the layout. */
#include "quant/quant_internal.h"

/* Quants of one block as integers: q4_0 and q5_0 centred (q - 8, q - 16), q4_1/q5_1 raw. */
static void unpack_q4(const uint8_t qs[16], int offset, int8_t q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((qs[j] & 0xf) - offset);
        q[j + 16] = (int8_t)((qs[j] >> 4) - offset);
    }
}

static void unpack_q5(const uint8_t qs[16], const uint8_t qh_bytes[4], int offset, int8_t q[32]) {
    uint32_t qh = quant_load_u32(qh_bytes);
    for (int j = 0; j < 16; j++) {
        int high0 = (int)((qh >> j) & 1) << 4, high1 = (int)((qh >> (j + 16)) & 1) << 4;
        q[j] = (int8_t)(((qs[j] & 0xf) | high0) - offset);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | high1) - offset);
    }
}

static int32_t dot_i8(const int8_t *a, const int8_t *b, int n) {
    int32_t sum = 0;
    for (int i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* ---- dequantization: x = d * q (+ m) */

static void scale_block(const int8_t q[32], float d, float *y) {
    for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d;
}

static void scale_offset_block(const int8_t q[32], float d, float m, float *y) {
    for (int j = 0; j < 32; j++) y[j] = (float)q[j] * d + m;
}

void quant_dequant_q4_0_ref(const void *w, float *y, int64_t n) {
    const struct block_q4_0 *b = w;
    int8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        unpack_q4(b[i].qs, 8, q);
        scale_block(q, half_to_f32(b[i].d), y);
    }
}

void quant_dequant_q4_1_ref(const void *w, float *y, int64_t n) {
    const struct block_q4_1 *b = w;
    int8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        unpack_q4(b[i].qs, 0, q);
        scale_offset_block(q, half_to_f32(b[i].d), half_to_f32(b[i].m), y);
    }
}

void quant_dequant_q5_0_ref(const void *w, float *y, int64_t n) {
    const struct block_q5_0 *b = w;
    int8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        unpack_q5(b[i].qs, b[i].qh, 16, q);
        scale_block(q, half_to_f32(b[i].d), y);
    }
}

void quant_dequant_q5_1_ref(const void *w, float *y, int64_t n) {
    const struct block_q5_1 *b = w;
    int8_t q[32];
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        unpack_q5(b[i].qs, b[i].qh, 0, q);
        scale_offset_block(q, half_to_f32(b[i].d), half_to_f32(b[i].m), y);
    }
}

void quant_dequant_q8_0_ref(const void *w, float *y, int64_t n) {
    const struct block_q8_0 *b = w;
    for (int64_t i = 0; i < n / 32; i++, y += 32) scale_block(b[i].qs, half_to_f32(b[i].d), y);
}

/* ---- dot products with Q8_0 activations: sum_blocks (dw * da) * sum(qw * qa), and for the
 * offset formats with Q8_1 activations + mw * sa, where sa = da * sum(qa). */

float quant_dot_q4_0_ref(int64_t n, const void *w, const void *act) {
    const struct block_q4_0 *b = w;
    const struct block_q8_0 *a = act;
    int8_t q[32];
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        unpack_q4(b[i].qs, 8, q);
        sum += half_to_f32(b[i].d) * half_to_f32(a[i].d) * (float)dot_i8(q, a[i].qs, 32);
    }
    return sum;
}

float quant_dot_q4_1_ref(int64_t n, const void *w, const void *act) {
    const struct block_q4_1 *b = w;
    const struct block_q8_1 *a = act;
    int8_t q[32];
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        unpack_q4(b[i].qs, 0, q);
        sum += half_to_f32(b[i].d) * half_to_f32(a[i].d) * (float)dot_i8(q, a[i].qs, 32) +
               half_to_f32(b[i].m) * half_to_f32(a[i].s);
    }
    return sum;
}

float quant_dot_q5_0_ref(int64_t n, const void *w, const void *act) {
    const struct block_q5_0 *b = w;
    const struct block_q8_0 *a = act;
    int8_t q[32];
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        unpack_q5(b[i].qs, b[i].qh, 16, q);
        sum += half_to_f32(b[i].d) * half_to_f32(a[i].d) * (float)dot_i8(q, a[i].qs, 32);
    }
    return sum;
}

float quant_dot_q5_1_ref(int64_t n, const void *w, const void *act) {
    const struct block_q5_1 *b = w;
    const struct block_q8_1 *a = act;
    int8_t q[32];
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        unpack_q5(b[i].qs, b[i].qh, 0, q);
        sum += half_to_f32(b[i].d) * half_to_f32(a[i].d) * (float)dot_i8(q, a[i].qs, 32) +
               half_to_f32(b[i].m) * half_to_f32(a[i].s);
    }
    return sum;
}

float quant_dot_q8_0_ref(int64_t n, const void *w, const void *act) {
    const struct block_q8_0 *b = w;
    const struct block_q8_0 *a = act;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++)
        sum += half_to_f32(b[i].d) * half_to_f32(a[i].d) * (float)dot_i8(b[i].qs, a[i].qs, 32);
    return sum;
}
