/* Random tensor bytes. Block types get random quant bits with scales set so the dequantized
 * values have the tensor's standard deviation (no float quantization: that is what makes
 * writing fast); plain types (F32/F16/BF16) draw from a table of 65536 Gaussian samples.
 * Every chunk has its own generator seeded by (seed, tensor name, chunk index), so the bytes
 * do not depend on how many threads write them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"

enum { VALUE_TABLE_SIZE = 65536, SCALE_TABLE_SIZE = 256 };

struct synth_fill_params {
    enum quant_type type;
    enum synth_init init;
    float stddev;
    void *values;                    /* plain types: VALUE_TABLE_SIZE values of the type */
    uint16_t d[SCALE_TABLE_SIZE];    /* block types: per-block scale (f16) ... */
    uint16_t dmin[SCALE_TABLE_SIZE]; /* ... and its min/offset partner where the type has one */
};

struct synth_fill_cache {
    struct synth_fill_params **items;
    size_t n;
    float *gauss; /* VALUE_TABLE_SIZE samples of N(0, 1), exactly mean 0 and variance 1 */
};

/* ---- generators: splitmix64 to seed, xoshiro256** to draw */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s[4];
};

static void rng_seed(struct rng *r, uint64_t seed, uint64_t key, uint64_t chunk) {
    uint64_t x = seed;
    uint64_t h = splitmix64(&x) ^ key;
    h = splitmix64(&h) ^ chunk;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&h);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(struct rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

static double rng_unit(struct rng *r) { /* (0, 1] */
    return ((double)(rng_next(r) >> 11) + 1.0) * 0x1.0p-53;
}

static void rng_bytes(struct rng *r, uint8_t *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(r);
        memcpy(out + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = rng_next(r);
        memcpy(out + i, &v, n - i);
    }
}

/* ---- half precision */

uint16_t synth_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t abs = x & 0x7fffffff;
    if (abs >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
    if (abs >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds past 65504 */
    if (abs < 0x38800000) {                                   /* below 2^-14: subnormal or 0 */
        const uint32_t mant = (abs & 0x7fffff) | 0x800000;
        const int shift = 126 - (int)(abs >> 23); /* 14 + 113 - exp, >= 14 */
        if (shift > 24) return (uint16_t)sign;
        uint32_t h = mant >> shift;
        const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((abs - 0x38000000) >> 13); /* rebias exponent 127 -> 15 */
    const uint32_t rest = abs & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v;
    if (exp == 0) v = ldexpf((float)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = ldexpf((float)(mant | 0x400), (int)exp - 25);
    uint32_t x;
    memcpy(&x, &v, 4);
    x |= sign;
    memcpy(&v, &x, 4);
    return v;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fff + ((x >> 16) & 1); /* round to nearest even; our values are finite */
    return (uint16_t)(x >> 16);
}

/* ---- block types: the standard deviation of one block's values when its scale d is 1.
 * The random bits are uniform; the sub-scales are drawn as below (see patch_block), so:
 *   Q4_0 (q-8), q in 0..15 with 0 moved to 8:  E = 2*(1+4+..+49)/16 = 17.5
 *   Q4_1 (q-7.5):                               (16^2-1)/12 = 21.25
 *   Q5_0 (q-16), q in 0..31 with 0 moved to 16: 2*(1+4+..+225)/32 = 77.5
 *   Q5_1 (q-15.5):                              85.25
 *   Q8_0 q in -127..127 (-128 moved to -127):   (2*690880 + 127^2)/256 = 5460.5
 *   Q2_K sc in 8..15, (q-1.5):                  137.5 * 1.25
 *   Q3_K (sc-32) in -32..31, q in -4..3:        341.5 * 5.5
 *   Q4_K sc in 32..63, (q-7.5):                 2341.5 * 21.25
 *   Q5_K sc in 32..63, (q-15.5):                2341.5 * 85.25
 *   Q6_K sc = +-(32..63), (q-32), q in 0..63:   2341.5 * 341.5 */
static double block_unit_variance(enum quant_type type) {
    switch (type) {
    case QUANT_Q4_0: return 17.5;
    case QUANT_Q4_1: return 21.25;
    case QUANT_Q5_0: return 77.5;
    case QUANT_Q5_1: return 85.25;
    case QUANT_Q8_0: return 5460.5;
    case QUANT_Q2_K: return 137.5 * 1.25;
    case QUANT_Q3_K: return 341.5 * 5.5;
    case QUANT_Q4_K: return 2341.5 * 21.25;
    case QUANT_Q5_K: return 2341.5 * 85.25;
    case QUANT_Q6_K: return 2341.5 * 341.5;
    default: return 0;
    }
}

/* The offset partner of d: value = d*q + m (Q4_1, Q5_1) or d*sc*q - dmin*sc (K types with
 * min = sc), chosen to center the values on zero. */
static double block_min_ratio(enum quant_type type) {
    switch (type) {
    case QUANT_Q4_1: return -7.5;
    case QUANT_Q5_1: return -15.5;
    case QUANT_Q2_K: return 1.5;
    case QUANT_Q4_K: return 7.5;
    case QUANT_Q5_K: return 15.5;
    default: return 0;
    }
}

static bool is_plain(enum quant_type type) {
    return type == QUANT_F32 || type == QUANT_F16 || type == QUANT_BF16;
}

static bool type_can_fill(enum quant_type type) {
    return is_plain(type) || block_unit_variance(type) > 0;
}

static struct synth_fill_params *params_new(const struct synth_fill_cache *cache,
                                            enum quant_type type, enum synth_init init,
                                            float stddev) {
    struct synth_fill_params *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->type = type;
    p->init = init;
    p->stddev = stddev;
    const double mean = init == SYNTH_INIT_NORM ? 1.0 : 0.0;
    if (is_plain(type)) {
        const size_t elem = quant_type_info(type)->block_bytes;
        p->values = malloc(VALUE_TABLE_SIZE * elem);
        if (!p->values) {
            free(p);
            return NULL;
        }
        for (size_t i = 0; i < VALUE_TABLE_SIZE; i++) {
            const float v = (float)(mean + stddev * cache->gauss[i]);
            if (type == QUANT_F32) ((float *)p->values)[i] = v;
            else if (type == QUANT_F16) ((uint16_t *)p->values)[i] = synth_f32_to_f16(v);
            else ((uint16_t *)p->values)[i] = f32_to_bf16(v);
        }
        return p;
    }
    /* Per-block scales spread over 0.5..1.5 of the base, so a kernel reading the wrong block's
     * scale gives a wrong answer; normalized so the mean square is the base's. */
    double mean_square = 0;
    for (int i = 0; i < SCALE_TABLE_SIZE; i++) {
        const double g = 0.5 + (i + 0.5) / SCALE_TABLE_SIZE;
        mean_square += g * g / SCALE_TABLE_SIZE;
    }
    const double base = stddev / sqrt(block_unit_variance(type) * mean_square);
    for (int i = 0; i < SCALE_TABLE_SIZE; i++) {
        const double g = 0.5 + (i + 0.5) / SCALE_TABLE_SIZE;
        p->d[i] = synth_f32_to_f16((float)(base * g));
        p->dmin[i] = synth_f32_to_f16((float)(block_min_ratio(type) * f16_to_f32(p->d[i])));
    }
    return p;
}

pshard_status synth_fill_prepare(struct synth_fill_cache **out, struct synth_model *model,
                                 uint64_t seed) {
    struct synth_fill_cache *cache = calloc(1, sizeof *cache);
    if (!cache) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    *out = cache;
    cache->items = calloc(model->n_tensors, sizeof *cache->items);
    cache->gauss = malloc(VALUE_TABLE_SIZE * sizeof *cache->gauss);
    if (!cache->items || !cache->gauss) return core_fail(PSHARD_ERR_NOMEM, "out of memory");

    struct rng r;
    rng_seed(&r, seed, 0x6761757373ull /* "gauss" */, 0);
    double sum = 0, sum_sq = 0;
    for (size_t i = 0; i < VALUE_TABLE_SIZE; i += 2) { /* Box-Muller, two at a time */
        const double radius = sqrt(-2.0 * log(rng_unit(&r))), angle = 2.0 * M_PI * rng_unit(&r);
        cache->gauss[i] = (float)(radius * cos(angle));
        cache->gauss[i + 1] = (float)(radius * sin(angle));
    }
    for (size_t i = 0; i < VALUE_TABLE_SIZE; i++) sum += cache->gauss[i];
    const double mean = sum / VALUE_TABLE_SIZE;
    for (size_t i = 0; i < VALUE_TABLE_SIZE; i++) {
        const double c = cache->gauss[i] - mean;
        sum_sq += c * c;
    }
    const double inv_std = 1.0 / sqrt(sum_sq / VALUE_TABLE_SIZE);
    for (size_t i = 0; i < VALUE_TABLE_SIZE; i++)
        cache->gauss[i] = (float)((cache->gauss[i] - mean) * inv_std);

    for (size_t i = 0; i < model->n_tensors; i++) {
        struct synth_tensor *t = &model->tensors[i];
        if (!type_can_fill(t->type))
            return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: cannot write random %s data",
                             t->name, quant_type_name(t->type));
        const struct synth_fill_params *found = NULL;
        for (size_t j = 0; j < cache->n && !found; j++) {
            const struct synth_fill_params *p = cache->items[j];
            if (p->type == t->type && p->init == t->init && p->stddev == t->stddev) found = p;
        }
        if (!found) {
            struct synth_fill_params *p = params_new(cache, t->type, t->init, t->stddev);
            if (!p) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
            cache->items[cache->n++] = p;
            found = p;
        }
        t->fill = found;
    }
    return PSHARD_OK;
}

void synth_fill_cache_free(struct synth_fill_cache *cache) {
    if (!cache) return;
    for (size_t i = 0; i < cache->n; i++) {
        free(cache->items[i]->values);
        free(cache->items[i]);
    }
    free(cache->items);
    free(cache->gauss);
    free(cache);
}

/* ---- patching random blocks into valid, centered ones */

static inline void put_f16(uint8_t *at, uint16_t h) { memcpy(at, &h, 2); }

/* Nibbles equal to 0 become 8, so Q4_0's (q - 8) is symmetric around zero. */
static void q4_zero_to_eight(uint8_t *qs, size_t n_bytes) {
    for (size_t i = 0; i < n_bytes; i += 8) {
        uint64_t w;
        memcpy(&w, qs + i, 8);
        uint64_t any = w | (w >> 1);
        any |= any >> 2;
        const uint64_t zero = ~any & 0x1111111111111111ull;
        w |= zero << 3;
        memcpy(qs + i, &w, 8);
    }
}

/* 5-bit values equal to 0 become 16, so Q5_0's (q - 16) is symmetric around zero. Element j
 * is the low (j < 16) or high nibble of qs[j % 16] with bit j of qh as its fifth bit. */
static void q5_zero_to_sixteen(uint8_t *qh_bytes, const uint8_t *qs) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < 16; j++) {
        if ((qs[j] & 0x0f) == 0) qh |= 1u << j;
        if ((qs[j] >> 4) == 0) qh |= 1u << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4);
}

/* Q4_K/Q5_K: eight 6-bit (scale, min) pairs packed in 12 bytes; we use min = scale, each in
 * 32..63, drawn from the first 8 (random) bytes. */
static void pack_k4_scales(uint8_t *scales) {
    uint8_t sc[8];
    for (int j = 0; j < 8; j++) sc[j] = 32 | (scales[j] & 31);
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((sc[j + 4] & 15) << 4));
    }
}

static void patch_block(const struct synth_fill_params *p, uint8_t *b) {
    switch (p->type) {
    case QUANT_Q4_0: /* d, qs[16] */
        put_f16(b, p->d[b[0]]);
        q4_zero_to_eight(b + 2, 16);
        break;
    case QUANT_Q4_1: /* d, m, qs[16] */
    case QUANT_Q5_1: /* d, m, qh[4], qs[16] */
        put_f16(b + 2, p->dmin[b[0]]);
        put_f16(b, p->d[b[0]]);
        break;
    case QUANT_Q5_0: /* d, qh[4], qs[16] */
        put_f16(b, p->d[b[0]]);
        q5_zero_to_sixteen(b + 2, b + 6);
        break;
    case QUANT_Q8_0: /* d, qs[32] */
        put_f16(b, p->d[b[0]]);
        for (int i = 2; i < 34; i++) /* -128 has no positive twin; some int8 kernels trip on it */
            if (b[i] == 0x80) b[i] = 0x81;
        break;
    case QUANT_Q2_K: /* scales[16] (scale | min << 4), qs[64], d, dmin */
        for (int i = 0; i < 16; i++) {
            const uint8_t s = 8 | (b[i] & 7);
            b[i] = (uint8_t)(s | (s << 4));
        }
        put_f16(b + 82, p->dmin[b[80]]);
        put_f16(b + 80, p->d[b[80]]);
        break;
    case QUANT_Q3_K: /* hmask[32], qs[64], scales[12] (random 6-bit, signed by -32), d */
        put_f16(b + 108, p->d[b[108]]);
        break;
    case QUANT_Q4_K: /* d, dmin, scales[12], qs[128] */
    case QUANT_Q5_K: /* d, dmin, scales[12], qh[32], qs[128] */
        pack_k4_scales(b + 4);
        put_f16(b + 2, p->dmin[b[0]]);
        put_f16(b, p->d[b[0]]);
        break;
    case QUANT_Q6_K: /* ql[128], qh[64], scales[16] int8, d */
        for (int i = 192; i < 208; i++) {
            const int s = 32 + (b[i] & 31);
            b[i] = (uint8_t)(int8_t)((b[i] & 0x80) ? -s : s);
        }
        put_f16(b + 208, p->d[b[208]]);
        break;
    default: break;
    }
}

void synth_fill(const struct synth_tensor *t, uint64_t seed, uint64_t chunk_index,
                uint64_t n_units, uint8_t *out) {
    const struct synth_fill_params *p = t->fill;
    const size_t unit_bytes = quant_type_info(t->type)->block_bytes;
    struct rng r;
    rng_seed(&r, seed, t->seed_key, chunk_index);
    if (!is_plain(t->type)) {
        rng_bytes(&r, out, n_units * unit_bytes);
        for (uint64_t i = 0; i < n_units; i++) patch_block(p, out + i * unit_bytes);
        return;
    }
    /* Plain types: four 16-bit table indices per 64 random bits. */
    uint64_t i = 0, bits = 0;
    for (; i < n_units; i++) {
        if ((i & 3) == 0) bits = rng_next(&r);
        const size_t index = (size_t)(bits & 0xffff);
        bits >>= 16;
        memcpy(out + i * unit_bytes, (const uint8_t *)p->values + index * unit_bytes, unit_bytes);
    }
}
