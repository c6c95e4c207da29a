/* Shared helpers of the GPU tests: device setup (or a clean skip without a GPU), an arena for
 * test buffers, upload/download, random data and weights of every format, comparisons that
 * print one PASS/FAIL line per case. Each test program compares CUDA kernels with the CPU
 * reference (src/quant, src/cpu) and exits nonzero if any case failed. */
#ifndef TESTS_DEVICE_TEST_H
#define TESTS_DEVICE_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "quant/quant.h"

struct dt {
    struct cuda_ctx *ctx;
    struct cuda_arena arena;
    cuda_stream s;
    int cases, failures;
    const char *name;
};

/* Fatal setup failure: the message of the failing call and exit. */
static inline void dt_die(const char *what, pshard_status st) {
    fprintf(stderr, "FATAL %s: %s (%s)\n", what, pshard_last_error(), pshard_status_name(st));
    exit(2);
}

#define DT_CHECK(expr)                                                                           \
    do {                                                                                         \
        pshard_status dt_st_ = (expr);                                                           \
        if (dt_st_ != PSHARD_OK) dt_die(#expr, dt_st_);                                          \
    } while (0)

/* Start: exit(0) with a skip line when no GPU is present, else a context and an arena. */
static inline void dt_init(struct dt *d, const char *name, size_t arena_bytes) {
    memset(d, 0, sizeof *d);
    d->name = name;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a test that hangs or crashes still shows its last case */
    if (cuda_device_count() == 0) {
        printf("%s: no CUDA device: skipped\n", name);
        exit(0);
    }
    DT_CHECK(cuda_ctx_create(0, &d->ctx));
    DT_CHECK(cuda_arena_create(&d->arena, arena_bytes));
    d->s = cuda_ctx_compute_stream(d->ctx);
    const struct cuda_ctx_info *info = cuda_ctx_info(d->ctx);
    printf("%s on %s (%d SMs)\n", name, info->name, info->sm_count);
}

static inline int dt_finish(struct dt *d) {
    cuda_arena_destroy(&d->arena);
    cuda_ctx_destroy(d->ctx);
    printf("%s: %d cases, %d failed: %s\n", d->name, d->cases, d->failures, d->failures ? "FAIL" : "PASS");
    return d->failures ? 1 : 0;
}

/* Record and print one case. */
static inline bool dt_case(struct dt *d, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline bool dt_case(struct dt *d, bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    d->cases++;
    d->failures += !ok;
    return ok;
}

static inline void *dt_alloc(struct dt *d, size_t bytes) {
    void *p;
    DT_CHECK(cuda_arena_alloc(&d->arena, bytes ? bytes : 1, "test", &p));
    return p;
}

static inline void *dt_upload(struct dt *d, const void *host, size_t bytes) {
    void *p = dt_alloc(d, bytes);
    DT_CHECK(cuda_copy_h2d(p, host, bytes, d->s));
    DT_CHECK(cuda_stream_sync(d->s));
    return p;
}

static inline void dt_download(struct dt *d, void *host, const void *dev, size_t bytes) {
    DT_CHECK(cuda_copy_d2h(host, dev, bytes, d->s));
    DT_CHECK(cuda_stream_sync(d->s));
}

static inline void *dt_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "FATAL out of host memory\n");
        exit(2);
    }
    return p;
}

/* Whether two device buffers hold the same bytes. */
static inline bool dt_same(struct dt *d, const void *x, const void *y, size_t bytes) {
    uint8_t *a = dt_malloc(bytes), *b = dt_malloc(bytes);
    dt_download(d, a, x, bytes), dt_download(d, b, y, bytes);
    const bool same = memcmp(a, b, bytes) == 0;
    free(a), free(b);
    return same;
}

/* ---- random data */

static uint64_t dt_rng_state = 0x9e3779b97f4a7c15ull;
static inline void dt_seed(uint64_t s) { dt_rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static inline uint64_t dt_next(void) {
    dt_rng_state ^= dt_rng_state << 13;
    dt_rng_state ^= dt_rng_state >> 7;
    dt_rng_state ^= dt_rng_state << 17;
    return dt_rng_state;
}
/* Uniform in [lo, hi). */
static inline float dt_uniform(float lo, float hi) { return lo + (hi - lo) * (float)(dt_next() >> 40) * 0x1p-24f; }

static inline void dt_fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = dt_uniform(lo, hi);
}

/* Random weights of `type`: random bytes in every quant and scale field (so every bit pattern
 * of the layouts is exercised), with the half-precision multipliers (d, dmin, m) set to sane
 * magnitudes; float formats get values in [-1, 1). */
static inline void dt_random_weights(enum quant_type type, void *dst, int64_t n_rows, int64_t n_cols) {
    const struct quant_type_info *ti = quant_type_info(type);
    const size_t row_bytes = quant_row_bytes(type, n_cols), total = row_bytes * (size_t)n_rows;
    uint8_t *p = dst;
    if (type == QUANT_F32 || type == QUANT_F16 || type == QUANT_BF16) {
        for (int64_t i = 0; i < n_rows * n_cols; i++) {
            const float v = dt_uniform(-1.0f, 1.0f);
            if (type == QUANT_F32) memcpy(p + 4 * i, &v, 4);
            else {
                const uint16_t h = type == QUANT_F16 ? half_from_f32(v) : bf16_from_f32(v);
                memcpy(p + 2 * i, &h, 2);
            }
        }
        return;
    }
    for (size_t i = 0; i < total; i++) p[i] = (uint8_t)(dt_next() >> 56);
    /* Offsets of the f16 multipliers in each block; the second one is a min or offset. */
    int d_off = -1, m_off = -1;
    switch (type) {
    case QUANT_Q4_0: case QUANT_Q5_0: case QUANT_Q8_0: d_off = 0; break;
    case QUANT_Q4_1: case QUANT_Q5_1: case QUANT_Q4_K: case QUANT_Q5_K: d_off = 0, m_off = 2; break;
    case QUANT_Q2_K: d_off = 80, m_off = 82; break;
    case QUANT_Q3_K: d_off = 108; break;
    case QUANT_Q6_K: d_off = 208; break;
    default: break;
    }
    const size_t n_blocks = total / ti->block_bytes;
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = p + b * ti->block_bytes;
        half_store(blk + d_off, dt_uniform(0.002f, 0.02f));
        if (m_off >= 0) half_store(blk + m_off, dt_uniform(-0.02f, 0.02f));
    }
}

/* Largest |got - ref| / scale over n values, and where. */
static inline double dt_max_err(const float *got, const float *ref, int64_t n, double scale, int64_t *where) {
    double worst = 0.0;
    *where = -1;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - (double)ref[i]) / scale;
        if (!(e <= worst)) { /* also catches NaN */
            worst = isnan(e) ? INFINITY : e;
            *where = i;
        }
    }
    return worst;
}

static inline float dt_round_f16(float v) { return half_to_f32(half_from_f32(v)); }
static inline float dt_round_bf16(float v) { return bf16_to_f32(bf16_from_f32(v)); }

#endif
