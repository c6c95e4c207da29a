/* Quant kernels: every SIMD variant this CPU has against the reference (dequantization and
 * activation bytes identical, dot products within float rounding), the reference dot against
 * a double-precision dot of the dequantized rows, quantizer round-trip error, and the f16
 * conversions. Rows sit at odd addresses on purpose. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/cpu_features.h"
#include "quant/quant.h"

/* ---- random numbers (fixed seeds: failures reproduce) */

static uint64_t rng_state;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_uniform(void) { return (float)((rng_next() >> 40) * 0x1p-24); }

static float rng_normal(void) {
    float u = rng_uniform() + 0x1p-25f, v = rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* ---- the types under test: where their f16 scales sit inside a block */

struct type_case {
    enum quant_type type;
    int n_scales;
    int scale_at[2];
};

/* clang-format off */
static const struct type_case TYPES[] = {
    {QUANT_F32, 0, {0}},      {QUANT_F16, 0, {0}},      {QUANT_BF16, 0, {0}},
    {QUANT_Q4_0, 1, {0}},     {QUANT_Q4_1, 2, {0, 2}},  {QUANT_Q5_0, 1, {0}},
    {QUANT_Q5_1, 2, {0, 2}},  {QUANT_Q8_0, 1, {0}},     {QUANT_Q2_K, 2, {80, 82}},
    {QUANT_Q3_K, 1, {108}},   {QUANT_Q4_K, 2, {0, 2}},  {QUANT_Q5_K, 2, {0, 2}},
    {QUANT_Q6_K, 1, {208}},
};
/* clang-format on */
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* Row lengths in blocks, mixing tiny rows, odd counts and typical model widths. */
static const int64_t N_BLOCKS[] = {1, 2, 3, 5, 8, 16, 17, 43};
#define N_SIZES (sizeof N_BLOCKS / sizeof N_BLOCKS[0])

static int64_t row_elems(const struct quant_type_info *info, int s) {
    /* float types: odd lengths exercise the vector tails */
    return info->block_elems == 1 ? N_BLOCKS[s] * 37 + s : N_BLOCKS[s] * info->block_elems;
}

/* Weight row: random bytes (fill < 0) or every byte `fill` -- so every code is at its minimum or
 * maximum, the worst case for saturating SIMD products -- with each block's scales set to
 * modest finite halves; random values for the float types. */
static void fill_weights(const struct type_case *tc, uint8_t *w, int64_t n, int fill) {
    const struct quant_type_info *info = quant_type_info(tc->type);
    size_t bytes = quant_row_bytes(tc->type, n);
    for (size_t i = 0; i < bytes; i++) w[i] = fill < 0 ? (uint8_t)rng_next() : (uint8_t)fill;
    for (int64_t i = 0; i < n && info->block_elems == 1; i++) {
        float v = rng_normal();
        if (tc->type == QUANT_F32) memcpy(w + 4 * i, &v, 4);
        if (tc->type == QUANT_F16) half_store(w + 2 * i, v);
        if (tc->type == QUANT_BF16) {
            uint16_t h = bf16_from_f32(v);
            memcpy(w + 2 * i, &h, 2);
        }
    }
    for (int64_t b = 0; info->block_elems > 1 && b < n / info->block_elems; b++)
        for (int k = 0; k < tc->n_scales; k++)
            half_store(w + b * info->block_bytes + tc->scale_at[k], (rng_uniform() * 2 - 1) * 0.05f);
}

static void fill_activations(float *x, int64_t n, int pattern) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal();
    if (pattern == 1) /* a zero block and an outlier, as real activations have */
        for (int64_t i = 0; i < n; i++) x[i] = i < 32 ? 0.0f : i == n / 2 ? 60.0f : x[i];
    if (pattern == 2) /* large and tiny magnitudes */
        for (int64_t i = 0; i < n; i++) x[i] *= (i / 32) % 2 ? 1e4f : 1e-4f;
    if (pattern == 3) /* constant: every activation code at +127 */
        for (int64_t i = 0; i < n; i++) x[i] = 0.75f;
    if (pattern == 4) /* constant negative: every code at -127 */
        for (int64_t i = 0; i < n; i++) x[i] = -3.0f;
}

/* Activation row back to floats (the values the dot product really uses). */
static void act_values(enum quant_type act_type, const void *act, double *out, int64_t n) {
    const uint8_t *p = act;
    for (int64_t i = 0; i < n; i++) {
        switch (act_type) {
        case QUANT_F32: {
            float f;
            memcpy(&f, p + 4 * i, 4);
            out[i] = f;
            break;
        }
        case QUANT_F16: out[i] = half_load(p + 2 * i); break;
        case QUANT_BF16: {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = bf16_to_f32(h);
            break;
        }
        case QUANT_Q8_0: {
            const struct block_q8_0 *b = (const struct block_q8_0 *)(p + (i / 32) * sizeof *b);
            out[i] = half_to_f32(b->d) * (double)b->qs[i % 32];
            break;
        }
        case QUANT_Q8_1: {
            const struct block_q8_1 *b = (const struct block_q8_1 *)(p + (i / 32) * sizeof *b);
            out[i] = half_to_f32(b->d) * (double)b->qs[i % 32];
            break;
        }
        case QUANT_Q8_K: {
            const struct block_q8_K *b = (const struct block_q8_K *)(p + (i / 256) * sizeof *b);
            out[i] = b->d * (double)b->qs[i % 256];
            break;
        }
        default: fail_msg("unexpected activation type %d", act_type);
        }
    }
}

/* Buffers at deliberately odd addresses (offset 1..3 bytes past a malloc). */
struct bufs {
    uint8_t *w_base, *act_base, *act2_base;
    uint8_t *w, *act, *act2;
    float *x, *y, *y2;
    double *wd, *ad;
};

static struct bufs bufs_alloc(size_t w_bytes, size_t act_bytes, int64_t n, int shift) {
    struct bufs b;
    b.w_base = malloc(w_bytes + 4);
    b.act_base = malloc(act_bytes + 4);
    b.act2_base = malloc(act_bytes + 4);
    b.w = b.w_base + 1 + shift % 3;
    b.act = b.act_base + 3 - shift % 3;
    b.act2 = b.act2_base + 2;
    b.x = malloc((size_t)n * sizeof(float));
    b.y = malloc((size_t)n * sizeof(float));
    b.y2 = malloc((size_t)n * sizeof(float));
    b.wd = malloc((size_t)n * sizeof(double));
    b.ad = malloc((size_t)n * sizeof(double));
    assert_non_null(b.w_base);
    assert_non_null(b.act_base);
    assert_non_null(b.act2_base);
    assert_non_null(b.x);
    assert_non_null(b.y);
    assert_non_null(b.y2);
    assert_non_null(b.wd);
    assert_non_null(b.ad);
    return b;
}

static void bufs_free(struct bufs *b) {
    free(b->ad);
    free(b->wd);
    free(b->y2);
    free(b->y);
    free(b->x);
    free(b->act2_base);
    free(b->act_base);
    free(b->w_base);
}

static int bits_equal(float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub || (isnan(a) && isnan(b));
}

/* Extra slack for Q8_1: its block sum s = d * sum(q) is stored as f16 separately from d, so
 * m * s and m * d * sum(q) differ by f16 rounding: relative 2^-11 each, or absolute 2^-25
 * when d or s are subnormal halves. */
static double q8_1_slack(enum quant_type type, const void *w, const void *act, int64_t n) {
    if (type != QUANT_Q4_1 && type != QUANT_Q5_1) return 0;
    size_t wb = quant_type_info(type)->block_bytes;
    double slack = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const struct block_q8_1 *a = (const struct block_q8_1 *)((const uint8_t *)act + i * sizeof *a);
        double m = fabs(half_load((const uint8_t *)w + i * wb + 2));
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += a->qs[j];
        slack += m * (fabs(half_to_f32(a->s)) * 0x1p-10 + (abs(sum) + 1) * 0x1p-24);
    }
    return slack;
}

/* ---- tests */

static int variants_run; /* over the whole run: proves the SIMD paths were exercised */

/* For every type, size and activation pattern: the reference dot equals the double dot of
 * the dequantized rows, and each SIMD variant matches the reference. */
static void test_kernels_against_reference(void **state) {
    (void)state;
    rng_state = 0x9e3779b97f4a7c15ull;
    int ref_checks = 0;
    for (size_t t = 0; t < N_TYPES; t++) {
        const struct type_case *tc = &TYPES[t];
        const struct quant_type_info *info = quant_type_info(tc->type);
        const struct quant_kernels *ref = quant_kernels_variant(tc->type, QUANT_IMPL_REF);
        assert_non_null(ref);
        assert_int_equal(ref->block_elems, info->block_elems);
        for (size_t s = 0; s < N_SIZES; s++) {
            int64_t n = row_elems(info, (int)s);
            struct bufs b = bufs_alloc(quant_row_bytes(tc->type, n), quant_act_row_bytes(ref, n), n, (int)s);
            static const int fills[] = {-1, 0x00, 0xff, 0x80};
            for (int combo = 0; combo < 5 * 4; combo++) {
                int pattern = combo % 5, fill = fills[combo / 5];
                fill_weights(tc, b.w, n, fill);
                fill_activations(b.x, n, pattern);
                ref->dequant_row(b.w, b.y, n);
                ref->quantize_act(b.x, b.act, n);
                act_values(ref->act_type, b.act, b.ad, n);
                double exact = 0, magnitude = 0;
                for (int64_t i = 0; i < n; i++) {
                    exact += (double)b.y[i] * b.ad[i];
                    magnitude += fabs((double)b.y[i] * b.ad[i]);
                }
                double slack = q8_1_slack(tc->type, b.w, b.act, n);
                float ref_dot = ref->vec_dot(n, b.w, b.act);
                if (fabs(ref_dot - exact) > 2e-5 * magnitude + slack + 1e-30)
                    fail_msg("%s n=%lld fill %d pattern %d: ref dot %.9g, dequantized dot %.9g", info->name,
                             (long long)n, fill, pattern, ref_dot, exact);
                ref_checks++;

                for (int impl = QUANT_IMPL_REF + 1; impl < QUANT_IMPL_COUNT; impl++) {
                    const struct quant_kernels *k = quant_kernels_variant(tc->type, (enum quant_impl)impl);
                    if (!k) continue;
                    assert_int_equal(k->act_type, ref->act_type);
                    k->dequant_row(b.w, b.y2, n);
                    for (int64_t i = 0; i < n; i++)
                        if (!bits_equal(b.y[i], b.y2[i]))
                            fail_msg("%s %s dequant differs at %lld: %g vs %g", info->name, quant_impl_name(k->impl),
                                     (long long)i, b.y2[i], b.y[i]);
                    size_t act_bytes = quant_act_row_bytes(k, n);
                    k->quantize_act(b.x, b.act2, n);
                    if (memcmp(b.act, b.act2, act_bytes) != 0)
                        fail_msg("%s %s activation bytes differ (n=%lld, pattern %d)", info->name,
                                 quant_impl_name(k->impl), (long long)n, pattern);
                    float dot = k->vec_dot(n, b.w, b.act);
                    if (fabs((double)dot - ref_dot) > 2e-5 * magnitude + 1e-30)
                        fail_msg("%s %s n=%lld fill %d pattern %d: dot %.9g, ref %.9g (magnitude %g)", info->name,
                                 quant_impl_name(k->impl), (long long)n, fill, pattern, dot, ref_dot, magnitude);
                    variants_run++;
                }
            }
            bufs_free(&b);
        }
    }
    assert_true(ref_checks > 0);
    print_message("reference checks: %d, SIMD variant checks: %d\n", ref_checks, variants_run);
}

/* The best kernels are one of the variants, and every supported type has them. */
static void test_dispatch(void **state) {
    (void)state;
    for (size_t t = 0; t < N_TYPES; t++) {
        const struct quant_kernels *best = quant_kernels_get(TYPES[t].type);
        assert_non_null(best);
        assert_ptr_equal(best, quant_kernels_variant(TYPES[t].type, best->impl));
        /* Nothing better is left unused: only the narrow VNNI kernels may outrank AVX-512. */
        for (int impl = best->impl + 1; impl <= QUANT_IMPL_AVX512; impl++)
            assert_null(quant_kernels_variant(TYPES[t].type, (enum quant_impl)impl));
        print_message("%-5s -> %s\n", quant_type_name(TYPES[t].type), quant_impl_name(best->impl));
    }
    assert_null(quant_kernels_get(QUANT_Q8_K));
    assert_null(quant_kernels_get(QUANT_IQ2_XXS));
    assert_null(quant_kernels_get((enum quant_type)999));
    assert_null(quant_kernels_variant(QUANT_Q4_0, QUANT_IMPL_COUNT));
}

/* Quantize -> dequantize error on Gaussian rows, relative to the rows' RMS. */
static void test_quantize_round_trip(void **state) {
    (void)state;
    static const struct {
        enum quant_type type;
        double max_rel_rmse;
    } cases[] = {
        {QUANT_F32, 0},     {QUANT_F16, 5e-4},   {QUANT_BF16, 4e-3}, {QUANT_Q8_0, 6e-3},  {QUANT_Q4_0, 0.11},
        {QUANT_Q4_1, 0.10}, {QUANT_Q5_0, 0.055}, {QUANT_Q5_1, 0.05}, {QUANT_Q4_K, 0.085}, {QUANT_Q6_K, 0.025},
    };
    rng_state = 12345;
    int64_t n = 256 * 64;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint8_t *q = malloc(quant_row_bytes(QUANT_F32, n) + 1);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(q);
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * (1.0f + (float)(i / 256 % 7)); /* scale varies */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_true(quant_can_quantize(cases[c].type));
        assert_int_equal(quant_quantize_row(cases[c].type, x, q + 1, n), PSHARD_OK);
        assert_int_equal(quant_dequantize_row(cases[c].type, q + 1, y, n), PSHARD_OK);
        double err = 0, ref = 0;
        for (int64_t i = 0; i < n; i++) {
            err += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            ref += (double)x[i] * x[i];
        }
        double rel = sqrt(err / ref);
        print_message("%-5s relative rmse %.5f\n", quant_type_name(cases[c].type), rel);
        assert_true(rel <= cases[c].max_rel_rmse);
    }
    /* constant and all-zero rows come back exactly where the format can represent them */
    for (int64_t i = 0; i < n; i++) x[i] = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_int_equal(quant_quantize_row(cases[c].type, x, q + 1, n), PSHARD_OK);
        assert_int_equal(quant_dequantize_row(cases[c].type, q + 1, y, n), PSHARD_OK);
        for (int64_t i = 0; i < n; i++) assert_true(y[i] == 0.0f);
    }
    free(q);
    free(y);
    free(x);
}

static void test_bad_arguments(void **state) {
    (void)state;
    float x[64] = {0}, y[64];
    uint8_t q[256];
    assert_int_equal(quant_quantize_row(QUANT_Q4_0, x, q, 33), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(quant_quantize_row(QUANT_Q4_K, x, q, 64), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(quant_quantize_row(QUANT_Q2_K, x, q, 256), PSHARD_ERR_UNSUPPORTED);
    assert_int_equal(quant_quantize_row(QUANT_IQ4_NL, x, q, 32), PSHARD_ERR_UNSUPPORTED);
    assert_int_equal(quant_quantize_row(QUANT_Q8_0, NULL, q, 32), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(quant_dequantize_row(QUANT_Q8_K, q, y, 256), PSHARD_ERR_UNSUPPORTED);
    assert_int_equal(quant_dequantize_row(QUANT_Q6_K, q, y, 255), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(quant_dequantize_row(QUANT_Q8_0, q, y, -32), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(quant_dequantize_row(QUANT_Q8_0, q, y, 0), PSHARD_OK);
}

/* Every half survives half -> f32 -> half; f32 -> half rounds to nearest even, including into
 * and out of the subnormal range, and the SIMD activation converters agree on random floats. */
static void test_half_conversions(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = half_to_f32((uint16_t)h);
        if (isnan(f)) {
            assert_true(((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff));
            continue;
        }
        assert_int_equal(half_from_f32(f), h);
        uint16_t b = (uint16_t)h;
        float bf = bf16_to_f32(b);
        if (!isnan(bf)) assert_int_equal(bf16_from_f32(bf), b);
    }
    assert_int_equal(half_from_f32(65519.0f), 0x7bff);
    assert_int_equal(half_from_f32(65520.0f), 0x7c00);
    assert_int_equal(half_from_f32(-1e9f), 0xfc00);
    assert_int_equal(half_from_f32(0x1p-25f), 0x0000); /* tie between 0 and 2^-24: even */
    assert_int_equal(half_from_f32(0x1.000002p-25f), 0x0001);
    assert_int_equal(half_from_f32(0x1.8p-24f), 0x0002);   /* 1.5 units: tie, to even 2 */
    assert_int_equal(half_from_f32(0x1.ff8p-15f), 0x03ff); /* largest subnormal */
    assert_int_equal(half_from_f32(0x1.ffbp-15f), 0x03ff);
    assert_int_equal(half_from_f32(0x1.ffcp-15f), 0x0400);      /* tie, rounds up into the normals */
    assert_int_equal(half_from_f32(1.0f + 0x1p-11f), 0x3c00);   /* tie, to even */
    assert_int_equal(half_from_f32(1.0f + 0x1.8p-10f), 0x3c02); /* tie, to even (up) */
    assert_int_equal(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);    /* tie, to even */
    assert_int_equal(bf16_from_f32(1.0f + 0x1.8p-7f), 0x3f82);

    /* software reference vs hardware (F16C) conversions of the SIMD variants */
    rng_state = 777;
    enum { N = 4096 };
    float x[N];
    uint8_t a[2 * N], b[2 * N];
    for (int i = 0; i < N; i++) {
        uint32_t bits = (uint32_t)rng_next();
        bits = (bits & 0x80000000u) | (0x30000000u + bits % 0x18000000u); /* 2^-31 .. 2^17 */
        memcpy(&x[i], &bits, 4);
    }
    for (enum quant_type t = QUANT_F16; t <= QUANT_BF16; t = t == QUANT_F16 ? QUANT_BF16 : QUANT_TYPE_LIMIT) {
        const struct quant_kernels *ref = quant_kernels_variant(t, QUANT_IMPL_REF);
        ref->quantize_act(x, a, N);
        for (int impl = QUANT_IMPL_REF + 1; impl < QUANT_IMPL_COUNT; impl++) {
            const struct quant_kernels *k = quant_kernels_variant(t, (enum quant_impl)impl);
            if (!k) continue;
            k->quantize_act(x, b, N);
            assert_memory_equal(a, b, sizeof a);
        }
    }
}

/* The four-token dot products and the tiles of four rows by one to four tokens give exactly the
 * single dot products (a token's logits must not depend on which batch it is in), for every
 * size, unaligned rows and activations, random codes and scales. */
static void test_batched_dots_equal_dots(void **state) {
    (void)state;
    rng_state = 0x2545f4914f6cdd1dull;
    int checked = 0;
    for (size_t tc = 0; tc < N_TYPES; tc++)
        for (int impl = 0; impl < QUANT_IMPL_COUNT; impl++) {
            const struct quant_kernels *k = quant_kernels_variant(TYPES[tc].type, (enum quant_impl)impl);
            if (!k || (!k->vec_dot4 && !k->dot_tile)) continue;
            for (size_t si = 0; si < N_SIZES; si++) {
                const int64_t n = row_elems(quant_type_info(TYPES[tc].type), (int)si);
                const size_t wb = quant_row_bytes(TYPES[tc].type, n), ab = quant_act_row_bytes(k, n) + 3;
                float *x = malloc(sizeof(float) * n);
                uint8_t *w = malloc(4 * wb + 1), *acts = malloc(4 * ab + 1);
                for (int r = 0; r < 4; r++) fill_weights(&TYPES[tc], w + 1 + r * wb, n, -1);
                for (int t = 0; t < 4; t++) {
                    fill_activations(x, n, t);
                    k->quantize_act(x, acts + 1 + t * ab, n);
                }
                float one[4][4]; /* [token][row] */
                for (int t = 0; t < 4; t++)
                    for (int r = 0; r < 4; r++) one[t][r] = k->vec_dot(n, w + 1 + r * wb, acts + 1 + t * ab);
                if (k->vec_dot4) {
                    float out[4];
                    k->vec_dot4(n, w + 1, acts + 1, ab, out);
                    for (int t = 0; t < 4; t++, checked++) assert_memory_equal(&one[t][0], &out[t], sizeof out[t]);
                }
                for (int n_tokens = 1; k->dot_tile && n_tokens <= 4; n_tokens++) {
                    float out[16];
                    k->dot_tile(n, w + 1, wb, acts + 1, ab, n_tokens, out);
                    for (int t = 0; t < n_tokens; t++)
                        for (int r = 0; r < 4; r++, checked++)
                            assert_memory_equal(&one[t][r], &out[t * 4 + r], sizeof out[0]);
                }
                free(x), free(w), free(acts);
            }
        }
    if (cpu_features()->avx2) assert_true(checked > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_kernels_against_reference),
        cmocka_unit_test(test_quantize_round_trip),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_batched_dots_equal_dots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
