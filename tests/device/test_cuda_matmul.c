/* GPU test: matrix-vector products for 1..8 tokens in every weight format against the CPU
 * reference dots (the same quantized activations, so the same integer sums: only the float
 * summation order differs), and for more tokens (passes of 8 in one launch) against one-token
 * calls bit for bit; the many-token GEMM paths (fused dequantizing kernel and
 * dequantize + cuBLAS) against a double-precision product of the f16-rounded weights and
 * activations they compute with; also views of a matrix's first columns (row_bytes keeps the full
 * row's stride, as an FFN split by rows reads down's columns). Errors are relative to
 * sum |w_i x_i| of the row. */
#include "device_test.h"

static const enum quant_type types[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1,
                                        QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K};

enum { MAX_NT = 8 };
static const double MATVEC_TOL = 1e-5, GEMM_TOL = 2e-4;

struct problem {
    enum quant_type type;
    int64_t n_rows, n_cols, n_tokens;
    uint8_t *w;     /* host weights */
    float *x;       /* [n_tokens][n_cols] */
    float *wf;      /* dequantized weights [n_rows][n_cols] */
    struct cuda_matrix m;
};

static void problem_init(struct dt *d, struct problem *p, enum quant_type type, int64_t n_rows, int64_t n_cols,
                         int64_t n_tokens) {
    p->type = type, p->n_rows = n_rows, p->n_cols = n_cols, p->n_tokens = n_tokens;
    const size_t row_bytes = quant_row_bytes(type, n_cols);
    p->w = dt_malloc(row_bytes * (size_t)n_rows);
    dt_random_weights(type, p->w, n_rows, n_cols);
    p->x = dt_malloc(sizeof(float) * (size_t)(n_tokens * n_cols));
    dt_fill(p->x, n_tokens * n_cols, -1.0f, 1.0f);
    p->wf = dt_malloc(sizeof(float) * (size_t)(n_rows * n_cols));
    const struct quant_kernels *k = quant_kernels_variant(type, QUANT_IMPL_REF);
    for (int64_t r = 0; r < n_rows; r++) k->dequant_row(p->w + (size_t)r * row_bytes, p->wf + r * n_cols, n_cols);
    p->m = (struct cuda_matrix){type, dt_upload(d, p->w, row_bytes * (size_t)n_rows), n_cols, n_rows, 1, row_bytes, false};
}

static void problem_free(struct problem *p) { free(p->w), free(p->x), free(p->wf); }

/* Three matrices of one format and width (q, k and v) in one cuda_matvec_each launch, then the
 * same added into outputs that hold values already (accumulate), and cuda_matmul_add at 5 and 12
 * tokens: every sum equals, bit for bit, its own cuda_matvec / cuda_matmul (plus the value
 * there, in one f32 add). A row read from the wrong matrix or written to the wrong output, or a
 * lost addend, differs. */
static void test_matvec_each(struct dt *d, enum quant_type type, int64_t n_cols, int64_t n_tokens) {
    const size_t mark = cuda_arena_mark(&d->arena);
    const int64_t rows[3] = {96, 32, 40};
    struct problem p[3];
    for (int i = 0; i < 3; i++) problem_init(d, &p[i], type, rows[i], n_cols, n_tokens);
    const enum quant_type act_type = cuda_act_type(type);
    const size_t act_row = cuda_act_row_bytes(act_type, n_cols);
    float *dx = dt_upload(d, p[0].x, sizeof(float) * (size_t)(n_tokens * n_cols));
    uint8_t *dact = dt_alloc(d, act_row * (size_t)n_tokens);
    DT_CHECK(cuda_quantize(act_type, dx, n_cols, n_tokens, dact, d->s));
    const struct cuda_matrix *m[3] = {&p[0].m, &p[1].m, &p[2].m};
    float *dy[3], *dalone[3], *base[3];
    for (int i = 0; i < 3; i++) {
        const size_t bytes = sizeof(float) * (size_t)(n_tokens * rows[i]);
        base[i] = dt_malloc(bytes);
        dt_fill(base[i], n_tokens * rows[i], -2.0f, 2.0f);
        dy[i] = dt_upload(d, base[i], bytes);
        dalone[i] = dt_alloc(d, bytes);
        DT_CHECK(cuda_matvec(m[i], dact, (int)n_tokens, dalone[i], rows[i], d->s));
    }
    int64_t differ = 0, differ_add = 0, differ_mm = 0;
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        if (accumulate)
            for (int i = 0; i < 3; i++) {
                DT_CHECK(cuda_copy_h2d(dy[i], base[i], sizeof(float) * (size_t)(n_tokens * rows[i]), d->s));
                DT_CHECK(cuda_stream_sync(d->s));
            }
        DT_CHECK(cuda_matvec_each(m, 3, dact, (int)n_tokens, dy, accumulate, d->s));
        for (int i = 0; i < 3; i++) {
            const int64_t n = n_tokens * rows[i];
            float *got = dt_malloc(sizeof(float) * (size_t)n), *alone = dt_malloc(sizeof(float) * (size_t)n);
            dt_download(d, got, dy[i], sizeof(float) * (size_t)n);
            dt_download(d, alone, dalone[i], sizeof(float) * (size_t)n);
            for (int64_t j = 0; j < n; j++) {
                const float want = accumulate ? base[i][j] + alone[j] : alone[j];
                if (memcmp(&got[j], &want, sizeof want) != 0) *(accumulate ? &differ_add : &differ) += 1;
            }
            free(got), free(alone);
        }
    }
    /* cuda_matmul_add against cuda_matmul + the values there: the matrix-vector kernel's own add
     * at 5 tokens, the product and an add above 8. */
    const int64_t mm_tokens = n_tokens <= CUDA_MATVEC_MAX_TOKENS ? n_tokens : CUDA_MATVEC_MAX_TOKENS;
    const int64_t counts[2] = {mm_tokens, 12};
    for (int c = 0; c < 2; c++) {
        const int64_t nt = counts[c], n = nt * rows[0];
        struct problem q;
        problem_init(d, &q, type, rows[0], n_cols, nt);
        float *dxq = dt_upload(d, q.x, sizeof(float) * (size_t)(nt * n_cols));
        const size_t wb = cuda_matmul_work_bytes(&q.m, nt) + ((size_t)64 << 20);
        void *work = dt_alloc(d, wb);
        float *start = dt_malloc(sizeof(float) * (size_t)n), *got = dt_malloc(sizeof(float) * (size_t)n);
        float *prod = dt_malloc(sizeof(float) * (size_t)n);
        dt_fill(start, n, -2.0f, 2.0f);
        float *dyq = dt_upload(d, start, sizeof(float) * (size_t)n), *dtmp = dt_alloc(d, sizeof(float) * (size_t)n);
        DT_CHECK(cuda_matmul_add(d->ctx, &q.m, dxq, nt, dyq, dtmp, work, wb, d->s));
        dt_download(d, got, dyq, sizeof(float) * (size_t)n);
        DT_CHECK(cuda_matmul(d->ctx, &q.m, dxq, nt, dtmp, rows[0], work, wb, d->s));
        dt_download(d, prod, dtmp, sizeof(float) * (size_t)n);
        for (int64_t j = 0; j < n; j++) {
            const float want = start[j] + prod[j];
            differ_mm += memcmp(&got[j], &want, sizeof want) != 0;
        }
        free(start), free(got), free(prod);
        problem_free(&q);
    }
    dt_case(d, differ == 0 && differ_add == 0 && differ_mm == 0,
            "matvec_each %-4s 96+32+40 x %lld, %lld tokens: %lld sums differ from one matrix a launch, %lld added, "
            "%lld of matmul_add",
            quant_type_name(type), (long long)n_cols, (long long)n_tokens, (long long)differ, (long long)differ_add,
            (long long)differ_mm);
    cuda_arena_reset(&d->arena, mark);
    for (int i = 0; i < 3; i++) free(base[i]), problem_free(&p[i]);
}

/* sum |w x| per (token, row): the scale errors are measured against. */
static double abs_dot(const struct problem *p, int64_t t, int64_t r) {
    double s = 0.0;
    for (int64_t i = 0; i < p->n_cols; i++) s += fabs((double)p->wf[r * p->n_cols + i] * p->x[t * p->n_cols + i]);
    return s > 1e-30 ? s : 1e-30;
}

/* Worst relative error of y [n_tokens][y_stride] against ref [n_tokens][n_rows]. */
static double worst_error(const struct problem *p, const float *y, int64_t y_stride, const float *ref, int64_t *wt,
                          int64_t *wr) {
    double worst = 0.0;
    for (int64_t t = 0; t < p->n_tokens; t++)
        for (int64_t r = 0; r < p->n_rows; r++) {
            const double e = fabs((double)y[t * y_stride + r] - ref[t * p->n_rows + r]) / abs_dot(p, t, r);
            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, *wt = t, *wr = r;
        }
    return worst;
}

static void test_matvec(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n_cols) {
    const size_t mark = cuda_arena_mark(&d->arena);
    struct problem p;
    problem_init(d, &p, type, n_rows, n_cols, MAX_NT);
    /* CPU reference: the type's activation quantizer and dot, reference variant. */
    const struct quant_kernels *k = quant_kernels_variant(type, QUANT_IMPL_REF);
    const size_t cpu_act_bytes = quant_act_row_bytes(k, n_cols), row_bytes = p.m.row_bytes;
    uint8_t *acts = dt_malloc(cpu_act_bytes);
    float *ref = dt_malloc(sizeof(float) * (size_t)(MAX_NT * n_rows));
    for (int64_t t = 0; t < MAX_NT; t++) {
        k->quantize_act(p.x + t * n_cols, acts, n_cols);
        for (int64_t r = 0; r < n_rows; r++) ref[t * n_rows + r] = k->vec_dot(n_cols, p.w + (size_t)r * row_bytes, acts);
    }
    const enum quant_type act_type = cuda_act_type(type);
    float *dx = dt_upload(d, p.x, sizeof(float) * (size_t)(MAX_NT * n_cols));
    void *dact = dt_alloc(d, cuda_act_row_bytes(act_type, n_cols) * MAX_NT);
    const int64_t y_stride = n_rows + 3; /* a stride wider than the row exercises y_stride */
    float *dy = dt_alloc(d, sizeof(float) * (size_t)(MAX_NT * y_stride));
    float *y = dt_malloc(sizeof(float) * (size_t)(MAX_NT * y_stride));
    DT_CHECK(cuda_quantize(act_type, dx, n_cols, MAX_NT, dact, d->s));
    double worst_all = 0.0;
    bool ok = true;
    for (int nt = 1; nt <= MAX_NT; nt++) {
        DT_CHECK(cuda_memset(dy, 0xff, sizeof(float) * (size_t)(MAX_NT * y_stride), d->s));
        DT_CHECK(cuda_matvec(&p.m, dact, nt, dy, y_stride, d->s));
        dt_download(d, y, dy, sizeof(float) * (size_t)(MAX_NT * y_stride));
        int64_t wt = 0, wr = 0;
        struct problem sub = p;
        sub.n_tokens = nt;
        const double e = worst_error(&sub, y, y_stride, ref, &wt, &wr);
        if (e > worst_all) worst_all = e;
        if (!(e <= MATVEC_TOL)) {
            ok = false;
            printf("    %d tokens: token %lld row %lld: got %.9g want %.9g (rel %.3g)\n", nt, (long long)wt,
                   (long long)wr, y[wt * y_stride + wr], ref[wt * n_rows + wr], e);
        }
    }
    dt_case(d, ok, "matvec %-4s %5lld x %5lld (row %zu B%s), 1..8 tokens: max rel err %.2e (tol %.0e)",
            quant_type_name(type), (long long)n_rows, (long long)n_cols, row_bytes,
            row_bytes % 16 ? ", unaligned" : "", worst_all, MATVEC_TOL);
    cuda_arena_reset(&d->arena, mark);
    free(acts), free(ref), free(y);
    problem_free(&p);
}

/* More than 8 tokens through cuda_matvec (an F32 router's prompt: the tiled kernel; the other
 * formats: passes of 8 side by side in one launch); every token's sums must equal, bit for bit,
 * what a one-token call gives it (a pass reading another pass's activations, or writing another's
 * rows, differs). */
static void test_matvec_passes(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n_cols, int64_t n_tokens) {
    const size_t mark = cuda_arena_mark(&d->arena);
    struct problem p;
    problem_init(d, &p, type, n_rows, n_cols, n_tokens);
    const enum quant_type act_type = cuda_act_type(type);
    const size_t act_row = cuda_act_row_bytes(act_type, n_cols);
    float *dx = dt_upload(d, p.x, sizeof(float) * (size_t)(n_tokens * n_cols));
    uint8_t *dact = dt_alloc(d, act_row * (size_t)n_tokens);
    DT_CHECK(cuda_quantize(act_type, dx, n_cols, n_tokens, dact, d->s));
    const int64_t y_stride = n_rows + 5;
    float *dy = dt_alloc(d, sizeof(float) * (size_t)(n_tokens * y_stride)), *d1 = dt_alloc(d, sizeof(float) * (size_t)n_rows);
    DT_CHECK(cuda_memset(dy, 0xff, sizeof(float) * (size_t)(n_tokens * y_stride), d->s));
    DT_CHECK(cuda_matvec(&p.m, dact, (int)n_tokens, dy, y_stride, d->s));
    float *y = dt_malloc(sizeof(float) * (size_t)(n_tokens * y_stride)), *one = dt_malloc(sizeof(float) * (size_t)n_rows);
    dt_download(d, y, dy, sizeof(float) * (size_t)(n_tokens * y_stride));
    int64_t differ = 0, first_t = -1, first_r = -1;
    for (int64_t t = 0; t < n_tokens; t++) {
        DT_CHECK(cuda_matvec(&p.m, dact + act_row * (size_t)t, 1, d1, n_rows, d->s));
        dt_download(d, one, d1, sizeof(float) * (size_t)n_rows);
        for (int64_t r = 0; r < n_rows; r++)
            if (memcmp(&y[t * y_stride + r], &one[r], sizeof(float)) != 0 && differ++ == 0) first_t = t, first_r = r;
    }
    dt_case(d, differ == 0, "matvec %-4s %4lld x %4lld, %3lld tokens in passes of 8: %lld sums differ from one-token calls",
            quant_type_name(type), (long long)n_rows, (long long)n_cols, (long long)n_tokens, (long long)differ);
    if (differ)
        printf("    token %lld row %lld: got %.9g, alone %.9g\n", (long long)first_t, (long long)first_r,
               y[first_t * y_stride + first_r], one[first_r]);
    cuda_arena_reset(&d->arena, mark);
    free(y), free(one);
    problem_free(&p);
}

/* The product as the GPU computes it for many tokens: weights and activations rounded to f16
 * (bf16 for BF16 weights, unrounded for F32), products summed in double. */
static float *gemm_reference(const struct problem *p) {
    const int64_t n_rows = p->n_rows, n_cols = p->n_cols;
    float *ref = dt_malloc(sizeof(float) * (size_t)(p->n_tokens * n_rows));
    float (*round)(float) = p->type == QUANT_BF16 ? dt_round_bf16 : dt_round_f16;
    for (int64_t t = 0; t < p->n_tokens; t++)
        for (int64_t r = 0; r < n_rows; r++) {
            double s = 0.0;
            for (int64_t i = 0; i < n_cols; i++) {
                const float w = p->wf[r * n_cols + i], x = p->x[t * n_cols + i];
                s += p->type == QUANT_F32 ? (double)w * x : (double)round(w) * round(x);
            }
            ref[t * n_rows + r] = (float)s;
        }
    return ref;
}

/* p->m on the GPU with the least work buffer (the chunked paths then take 256 rows at a time
 * and loop), against gemm_reference; `what` names the case. */
static void check_gemm(struct dt *d, const struct problem *p, const char *what) {
    const int64_t n_rows = p->n_rows, n_tokens = p->n_tokens;
    float *ref = gemm_reference(p);
    float *dx = dt_upload(d, p->x, sizeof(float) * (size_t)(n_tokens * p->n_cols));
    const size_t work_bytes = cuda_matmul_work_bytes(&p->m, n_tokens);
    void *work = dt_alloc(d, work_bytes);
    float *dy = dt_alloc(d, sizeof(float) * (size_t)(n_tokens * n_rows));
    DT_CHECK(cuda_matmul(d->ctx, &p->m, dx, n_tokens, dy, n_rows, work, work_bytes, d->s));
    float *y = dt_malloc(sizeof(float) * (size_t)(n_tokens * n_rows));
    dt_download(d, y, dy, sizeof(float) * (size_t)(n_tokens * n_rows));
    int64_t wt = 0, wr = 0;
    const double e = worst_error(p, y, n_rows, ref, &wt, &wr);
    dt_case(d, e <= GEMM_TOL, "gemm %-22s %-4s %4lld x %4lld, %3lld tokens: max rel err %.2e (tol %.0e)", what,
            quant_type_name(p->type), (long long)n_rows, (long long)p->n_cols, (long long)n_tokens, e, GEMM_TOL);
    if (!(e <= GEMM_TOL))
        printf("    token %lld row %lld: got %.9g want %.9g\n", (long long)wt, (long long)wr, y[wt * n_rows + wr],
               ref[wt * n_rows + wr]);
    free(ref), free(y);
}

static void test_gemm(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n_cols, int64_t n_tokens,
                      enum cuda_gemm_path path) {
    const size_t mark = cuda_arena_mark(&d->arena);
    struct problem p;
    problem_init(d, &p, type, n_rows, n_cols, n_tokens);
    cuda_ctx_set_gemm_path(d->ctx, path);
    check_gemm(d, &p, path == CUDA_GEMM_FUSED ? "fused" : "cublas");
    cuda_ctx_set_gemm_path(d->ctx, CUDA_GEMM_AUTO);
    cuda_arena_reset(&d->arena, mark);
    problem_free(&p);
}

/* AUTO's choice for a head: a block-format matrix in VRAM whose row tiles fill every SM twice takes
 * the fused kernel (read once) for 9 to 64 tokens, cuBLAS above and for a short matrix; the
 * products are right either way. */
static void test_auto_tall(struct dt *d, enum quant_type type, int64_t n_tokens) {
    const size_t mark = cuda_arena_mark(&d->arena);
    const int64_t tall = 128 * 2 * (int64_t)cuda_ctx_info(d->ctx)->sm_count + 5; /* (a last tile of 5 rows) */
    struct problem p;
    problem_init(d, &p, type, tall, 256, n_tokens);
    const bool once = cuda_matmul_reads_once(d->ctx, &p.m, n_tokens);
    struct cuda_matrix shorter = p.m;
    shorter.n_rows = tall - 6;
    dt_case(d, once == (n_tokens > CUDA_MATVEC_MAX_TOKENS && n_tokens <= 64) && !cuda_matmul_reads_once(d->ctx, &shorter, n_tokens),
            "auto: %lld rows of %s at %lld tokens %s read once (%lld rows: not)", (long long)tall, quant_type_name(type),
            (long long)n_tokens, once ? "are" : "are not", (long long)shorter.n_rows);
    check_gemm(d, &p, once ? "auto, tall: fused" : "auto, tall");
    cuda_arena_reset(&d->arena, mark);
    problem_free(&p);
}

/* Weights read from pinned host memory `skew` bytes past a 128-byte boundary, as from a file
 * mapping: marked in place (F16 then copied into the work buffer in chunks) or not (cuBLAS
 * reads them through the mapping). */
static void test_gemm_in_place(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n_cols, int64_t n_tokens,
                               size_t skew, bool in_place) {
    const size_t mark = cuda_arena_mark(&d->arena);
    struct problem p;
    problem_init(d, &p, type, n_rows, n_cols, n_tokens);
    const size_t bytes = p.m.row_bytes * (size_t)n_rows;
    struct cuda_pinned host;
    DT_CHECK(cuda_host_alloc(bytes + 128, &host));
    uint8_t *at = (uint8_t *)host.ptr + (128 - (uintptr_t)host.ptr % 128) % 128 + skew;
    memcpy(at, p.w, bytes);
    DT_CHECK(cuda_host_device_pointer(at, &p.m.data));
    p.m.in_place = in_place;
    char what[64];
    snprintf(what, sizeof what, "%s, %zu past 128", in_place ? "in place" : "mapped", skew);
    check_gemm(d, &p, what);
    cuda_pinned_release(&host);
    cuda_arena_reset(&d->arena, mark);
    problem_free(&p);
}

/* The first `cols` columns of a matrix as a view (n_cols = cols, row_bytes of the full row): 1..8
 * tokens against the CPU's dots over those columns, and 64 tokens on both GEMM paths against the
 * double-precision product over them. */
static void test_view(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n_cols, int64_t cols) {
    const size_t mark = cuda_arena_mark(&d->arena);
    enum { NT = 64 };
    struct problem p;
    problem_init(d, &p, type, n_rows, n_cols, NT);
    struct cuda_matrix view = p.m;
    view.n_cols = cols;
    float *xv = dt_malloc(sizeof(float) * NT * (size_t)cols);
    for (int64_t t = 0; t < NT; t++) memcpy(xv + t * cols, p.x + t * n_cols, sizeof(float) * (size_t)cols);
    float *dx = dt_upload(d, xv, sizeof(float) * NT * (size_t)cols);
    const size_t work_bytes = cuda_matmul_work_bytes(&view, NT);
    void *work = dt_alloc(d, work_bytes);
    float *dy = dt_alloc(d, sizeof(float) * NT * (size_t)n_rows), *y = dt_malloc(sizeof(float) * NT * (size_t)n_rows);
    const struct quant_kernels *k = quant_kernels_variant(type, QUANT_IMPL_REF);
    uint8_t *acts = dt_malloc(quant_act_row_bytes(k, cols));
    double worst = 0, worst_gemm = 0;
    for (int nt = 1; nt <= MAX_NT; nt++) {
        DT_CHECK(cuda_matmul(d->ctx, &view, dx, nt, dy, n_rows, work, work_bytes, d->s));
        dt_download(d, y, dy, sizeof(float) * (size_t)nt * n_rows);
        for (int64_t t = 0; t < nt; t++) {
            k->quantize_act(xv + t * cols, acts, cols);
            for (int64_t r = 0; r < n_rows; r++) {
                double scale = 0;
                for (int64_t i = 0; i < cols; i++) scale += fabs((double)p.wf[r * n_cols + i] * xv[t * cols + i]);
                const double want = k->vec_dot(cols, p.w + (size_t)r * p.m.row_bytes, acts);
                const double e = fabs(y[t * n_rows + r] - want) / (scale > 1e-30 ? scale : 1e-30);
                if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
            }
        }
    }
    float (*round)(float) = type == QUANT_BF16 ? dt_round_bf16 : dt_round_f16;
    const enum cuda_gemm_path paths[] = {CUDA_GEMM_FUSED, CUDA_GEMM_CUBLAS};
    for (int pi = 0; pi < 2; pi++) {
        cuda_ctx_set_gemm_path(d->ctx, paths[pi]);
        DT_CHECK(cuda_matmul(d->ctx, &view, dx, NT, dy, n_rows, work, work_bytes, d->s));
        dt_download(d, y, dy, sizeof(float) * NT * (size_t)n_rows);
        for (int64_t t = 0; t < NT; t++)
            for (int64_t r = 0; r < n_rows; r++) {
                double s = 0, scale = 0;
                for (int64_t i = 0; i < cols; i++) {
                    const float w = p.wf[r * n_cols + i], x = xv[t * cols + i];
                    s += type == QUANT_F32 ? (double)w * x : (double)round(w) * round(x);
                    scale += fabs((double)w * x);
                }
                const double e = fabs(y[t * n_rows + r] - s) / (scale > 1e-30 ? scale : 1e-30);
                if (!(e <= worst_gemm)) worst_gemm = isnan(e) ? INFINITY : e;
            }
    }
    cuda_ctx_set_gemm_path(d->ctx, CUDA_GEMM_AUTO);
    dt_case(d, worst <= MATVEC_TOL && worst_gemm <= GEMM_TOL,
            "view %-4s first %lld of %lld columns, %lld rows: 1..8 tokens max rel err %.2e, 64 tokens %.2e",
            quant_type_name(type), (long long)cols, (long long)n_cols, (long long)n_rows, worst, worst_gemm);
    cuda_arena_reset(&d->arena, mark);
    free(xv), free(y), free(acts);
    problem_free(&p);
}

int main(void) {
    struct dt d;
    dt_init(&d, "test_cuda_matmul", 1u << 30);
    void *ws = dt_alloc(&d, CUDA_BLAS_WORKSPACE_BYTES);
    DT_CHECK(cuda_ctx_set_blas_workspace(d.ctx, ws, CUDA_BLAS_WORKSPACE_BYTES));
    dt_seed(2);
    /* (rows, cols): short rows, unaligned rows (2304 = 9 K-blocks), multi-chunk long rows. */
    const int64_t shapes[][2] = {{67, 256}, {203, 2304}, {96, 4096}, {41, 14336}};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) test_matvec(&d, types[t], shapes[s][0], shapes[s][1]);
    /* qwen30b's router (128 x 2048 F32) at 13, 37 and 256 tokens; two block formats. */
    const int64_t pass_tokens[] = {13, 37, 256};
    for (size_t n = 0; n < sizeof pass_tokens / sizeof pass_tokens[0]; n++) {
        test_matvec_passes(&d, QUANT_F32, 128, 2048, pass_tokens[n]);
        test_matvec_passes(&d, QUANT_Q4_0, 67, 256, pass_tokens[n]);
        test_matvec_passes(&d, QUANT_Q4_K, 203, 2304, pass_tokens[n]);
    }
    /* F16 and BF16: one token reads its rows straight from VRAM (each lane its own items), passes
     * of 8 stage them: the same sums, bit for bit. Rows of 4,096 and 14,336 columns (llama8b's),
     * and of 63 items (two chunks, the second one short). */
    const enum quant_type halves[] = {QUANT_F16, QUANT_BF16};
    for (size_t t = 0; t < 2; t++) {
        test_matvec_passes(&d, halves[t], 96, 4096, 13);
        test_matvec_passes(&d, halves[t], 41, 14336, 9);
        test_matvec_passes(&d, halves[t], 67, 2016, 11);
    }
    /* F32 through the tiled kernel: qwen235b's router (4,096 columns: eight chunks), and rows in
     * chunks of 15 items (1,920 columns) whose count is no multiple of a block's 64. */
    test_matvec_passes(&d, QUANT_F32, 128, 4096, 100);
    test_matvec_passes(&d, QUANT_F32, 70, 1920, 37);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        test_matvec_each(&d, types[t], 512, 1);
        test_matvec_each(&d, types[t], 512, 5);
    }
    test_matvec_each(&d, QUANT_Q4_0, 2304, 11); /* passes of 8 side by side */
    test_matvec_each(&d, QUANT_F32, 2304, 3);   /* F32 a block a row: five chunks of 15 items */
    const int64_t gemm_tokens[] = {9, 64, 130};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t n = 0; n < sizeof gemm_tokens / sizeof gemm_tokens[0]; n++) {
            test_gemm(&d, types[t], 300, 512, gemm_tokens[n], CUDA_GEMM_FUSED);
            test_gemm(&d, types[t], 300, 512, gemm_tokens[n], CUDA_GEMM_CUBLAS);
        }
    /* Rows of 544 elements: the fused GEMM's last step of 64 half past the end. */
    const enum quant_type short_blocks[] = {QUANT_F16, QUANT_Q4_0, QUANT_Q8_0};
    for (size_t t = 0; t < sizeof short_blocks / sizeof short_blocks[0]; t++)
        test_gemm(&d, short_blocks[t], 300, 544, 130, CUDA_GEMM_FUSED);
    /* Raw stages of 256 elements: one copied 4 bytes at a time (Q2_K rows of 84 bytes), three
     * and four stages (a stage copied while two others are in use). */
    test_gemm(&d, QUANT_Q2_K, 300, 256, 64, CUDA_GEMM_FUSED);
    test_gemm(&d, QUANT_Q4_K, 200, 768, 64, CUDA_GEMM_FUSED);
    test_gemm(&d, QUANT_Q4_0, 300, 1024, 130, CUDA_GEMM_FUSED);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) test_view(&d, types[t], 300, 1024, 512);
    const int64_t head_tokens[] = {16, 64, 65};
    for (size_t n = 0; n < sizeof head_tokens / sizeof head_tokens[0]; n++) test_auto_tall(&d, QUANT_Q4_0, head_tokens[n]);
    test_auto_tall(&d, QUANT_Q2_K, 37);
    /* 600 rows: three chunks of the least work buffer (256 rows). */
    const enum quant_type in_place[] = {QUANT_F16, QUANT_BF16, QUANT_Q4_K};
    for (size_t t = 0; t < sizeof in_place / sizeof in_place[0]; t++)
        for (size_t skew = 0; skew < 128; skew += 32) test_gemm_in_place(&d, in_place[t], 600, 512, 16, skew, true);
    test_gemm_in_place(&d, QUANT_F16, 600, 512, 130, 96, true);
    test_gemm_in_place(&d, QUANT_F16, 600, 512, 16, 96, false);
    return dt_finish(&d);
}
