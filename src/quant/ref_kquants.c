/* Reference kernels of the 256-element K formats (Q2_K..Q6_K). Each super-block is unpacked
 * into one common shape -- integer quants, a scale and a min per sub-block -- so that
 * dequantization (x = d * sc * q - dmin * m) and the dot product with Q8_K activations share
 * one reading of every layout. */
#include "quant/quant_internal.h"

struct kblock {
    float d, dmin;
    int sub_len; /* 16 or 32 elements per sub-block */
    int8_t q[QUANT_QK_K];
    int16_t sc[16], m[16]; /* per sub-block; m is 0 for the symmetric formats */
};

static void unpack_q2_K(const struct block_q2_K *b, struct kblock *k) {
    k->d = half_to_f32(b->d);
    k->dmin = half_to_f32(b->dmin);
    k->sub_len = 16;
    for (int s = 0; s < 16; s++) {
        k->sc[s] = b->scales[s] & 0xf;
        k->m[s] = b->scales[s] >> 4;
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) k->q[128 * h + 32 * j + l] = (int8_t)((b->qs[32 * h + l] >> (2 * j)) & 3);
}

static void unpack_q3_K(const struct block_q3_K *b, struct kblock *k) {
    k->d = half_to_f32(b->d);
    k->dmin = 0;
    k->sub_len = 16;
    int8_t sc[16];
    quant_q3_K_scales(b->scales, sc);
    for (int s = 0; s < 16; s++) {
        k->sc[s] = sc[s];
        k->m[s] = 0;
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int low = (b->qs[32 * h + l] >> (2 * j)) & 3;
                int high = (b->hmask[l] >> (4 * h + j)) & 1;
                k->q[128 * h + 32 * j + l] = (int8_t)(low - (high ? 0 : 4));
            }
}

static void unpack_k4_scales(const uint8_t scales[12], struct kblock *k) {
    uint8_t sc[8], m[8];
    quant_k4_scales(scales, sc, m);
    k->sub_len = 32;
    for (int s = 0; s < 8; s++) {
        k->sc[s] = sc[s];
        k->m[s] = m[s];
    }
}

static void unpack_q4_K(const struct block_q4_K *b, struct kblock *k) {
    k->d = half_to_f32(b->d);
    k->dmin = half_to_f32(b->dmin);
    unpack_k4_scales(b->scales, k);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            k->q[64 * c + l] = (int8_t)(b->qs[32 * c + l] & 0xf);
            k->q[64 * c + 32 + l] = (int8_t)(b->qs[32 * c + l] >> 4);
        }
}

static void unpack_q5_K(const struct block_q5_K *b, struct kblock *k) {
    k->d = half_to_f32(b->d);
    k->dmin = half_to_f32(b->dmin);
    unpack_k4_scales(b->scales, k);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int high0 = (b->qh[l] >> (2 * c)) & 1, high1 = (b->qh[l] >> (2 * c + 1)) & 1;
            k->q[64 * c + l] = (int8_t)((b->qs[32 * c + l] & 0xf) | (high0 << 4));
            k->q[64 * c + 32 + l] = (int8_t)((b->qs[32 * c + l] >> 4) | (high1 << 4));
        }
}

static void unpack_q6_K(const struct block_q6_K *b, struct kblock *k) {
    k->d = half_to_f32(b->d);
    k->dmin = 0;
    k->sub_len = 16;
    for (int s = 0; s < 16; s++) {
        k->sc[s] = b->scales[s];
        k->m[s] = 0;
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *q = k->q + 128 * h;
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

static void kblock_dequant(const struct kblock *k, float *y) {
    int n_sub = QUANT_QK_K / k->sub_len;
    for (int s = 0; s < n_sub; s++) {
        float dl = k->d * (float)k->sc[s], ml = k->dmin * (float)k->m[s];
        for (int e = s * k->sub_len; e < (s + 1) * k->sub_len; e++) y[e] = dl * (float)k->q[e] - ml;
    }
}

/* d * da * sum_s sc[s] * (q . qa)[s]  -  dmin * da * sum_s m[s] * sum(qa)[s]; the activation
 * sums come from the Q8_K block's per-16 bsums. */
static float kblock_dot(const struct kblock *k, const struct block_q8_K *a) {
    int n_sub = QUANT_QK_K / k->sub_len, sums_per_sub = k->sub_len / 16;
    int32_t sumi = 0, summ = 0;
    for (int s = 0; s < n_sub; s++) {
        int32_t dot = 0;
        for (int e = s * k->sub_len; e < (s + 1) * k->sub_len; e++) dot += k->q[e] * a->qs[e];
        sumi += k->sc[s] * dot;
        int32_t asum = 0;
        for (int j = 0; j < sums_per_sub; j++) asum += a->bsums[s * sums_per_sub + j];
        summ += k->m[s] * asum;
    }
    return k->d * a->d * (float)sumi - k->dmin * a->d * (float)summ;
}

/* One dequant and one dot function per format, all through the kblock shape. */
#define KQUANT_REF(t)                                                      \
    void quant_dequant_##t##_ref(const void *w, float *y, int64_t n) {     \
        const struct block_##t *b = w;                                     \
        struct kblock k;                                                   \
        for (int64_t i = 0; i < n / QUANT_QK_K; i++) {                     \
            unpack_##t(&b[i], &k);                                         \
            kblock_dequant(&k, y + i * QUANT_QK_K);                        \
        }                                                                  \
    }                                                                      \
    float quant_dot_##t##_ref(int64_t n, const void *w, const void *act) { \
        const struct block_##t *b = w;                                     \
        const struct block_q8_K *a = act;                                  \
        struct kblock k;                                                   \
        float sum = 0;                                                     \
        for (int64_t i = 0; i < n / QUANT_QK_K; i++) {                     \
            unpack_##t(&b[i], &k);                                         \
            sum += kblock_dot(&k, &a[i]);                                  \
        }                                                                  \
        return sum;                                                        \
    }

KQUANT_REF(q2_K)
KQUANT_REF(q3_K)
KQUANT_REF(q4_K)
KQUANT_REF(q5_K)
KQUANT_REF(q6_K)
