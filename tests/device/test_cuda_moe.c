/* GPU test: MoE routing against cpu_moe_route (same experts, weights to float rounding), and the
 * expert FFN: up to 8 tokens against cpu_moe (the same quantized activations); beyond, the
 * f16 tensor-core path against a double-precision FFN on f16-rounded operands; small steps both
 * on the fused kernels (the default) and on the grouped ones. Also a subset
 * of experts (mask), accumulation into the output, and per-expert pointer tables; and a routed
 * split's mask against the planner's rule (plan_routed_split). */
#include "cpu/moe.h"
#include "device_test.h"
#include "plan/plan.h"

struct experts {
    enum quant_type gate_type, down_type;
    int n_expert, k;
    int64_t n_embd, n_ff;
    uint8_t *gate, *up, *down; /* host, 3-D */
    float *gate_f, *up_f, *down_f; /* dequantized */
    struct cuda_moe dev;
};

static void experts_init(struct dt *d, struct experts *e, enum quant_type gate_type, enum quant_type down_type,
                         int n_expert, int k, int64_t n_embd, int64_t n_ff) {
    e->gate_type = gate_type, e->down_type = down_type, e->n_expert = n_expert, e->k = k;
    e->n_embd = n_embd, e->n_ff = n_ff;
    const size_t gb = quant_row_bytes(gate_type, n_embd), db = quant_row_bytes(down_type, n_ff);
    e->gate = dt_malloc(gb * (size_t)(n_ff * n_expert));
    e->up = dt_malloc(gb * (size_t)(n_ff * n_expert));
    e->down = dt_malloc(db * (size_t)(n_embd * n_expert));
    dt_random_weights(gate_type, e->gate, n_ff * n_expert, n_embd);
    dt_random_weights(gate_type, e->up, n_ff * n_expert, n_embd);
    dt_random_weights(down_type, e->down, n_embd * n_expert, n_ff);
    e->gate_f = dt_malloc(4 * (size_t)(n_ff * n_expert * n_embd));
    e->up_f = dt_malloc(4 * (size_t)(n_ff * n_expert * n_embd));
    e->down_f = dt_malloc(4 * (size_t)(n_embd * n_expert * n_ff));
    const struct quant_kernels *kg = quant_kernels_variant(gate_type, QUANT_IMPL_REF);
    const struct quant_kernels *kd = quant_kernels_variant(down_type, QUANT_IMPL_REF);
    for (int64_t r = 0; r < n_ff * n_expert; r++) {
        kg->dequant_row(e->gate + r * gb, e->gate_f + r * n_embd, n_embd);
        kg->dequant_row(e->up + r * gb, e->up_f + r * n_embd, n_embd);
    }
    for (int64_t r = 0; r < n_embd * n_expert; r++) kd->dequant_row(e->down + r * db, e->down_f + r * n_ff, n_ff);
    memset(&e->dev, 0, sizeof e->dev);
    e->dev.gate = (struct cuda_matrix){gate_type, dt_upload(d, e->gate, gb * (size_t)(n_ff * n_expert)), n_embd, n_ff, n_expert, gb, false};
    e->dev.up = (struct cuda_matrix){gate_type, dt_upload(d, e->up, gb * (size_t)(n_ff * n_expert)), n_embd, n_ff, n_expert, gb, false};
    e->dev.down = (struct cuda_matrix){down_type, dt_upload(d, e->down, db * (size_t)(n_embd * n_expert)), n_ff, n_embd, n_expert, db, false};
    e->dev.n_expert = n_expert, e->dev.k = k;
}

static void experts_free(struct experts *e) {
    free(e->gate), free(e->up), free(e->down), free(e->gate_f), free(e->up_f), free(e->down_f);
}

static struct cpu_matrix cpu_view(enum quant_type type, const void *data, int64_t n_cols, int64_t n_rows, int n_expert) {
    return (struct cpu_matrix){type, data, n_cols, n_rows, n_expert, quant_row_bytes(type, n_cols),
                               quant_kernels_variant(type, QUANT_IMPL_REF)};
}

/* The CPU's expert FFN (quantized activations, as the matvec path computes). */
static void reference_cpu(const struct experts *e, const float *x, const int32_t *ids, const float *w, int64_t n_tokens,
                          float *out) {
    const struct cpu_matrix g = cpu_view(e->gate_type, e->gate, e->n_embd, e->n_ff, e->n_expert);
    const struct cpu_matrix u = cpu_view(e->gate_type, e->up, e->n_embd, e->n_ff, e->n_expert);
    const struct cpu_matrix dn = cpu_view(e->down_type, e->down, e->n_ff, e->n_embd, e->n_expert);
    struct threadpool *pool;
    DT_CHECK(threadpool_create(1, &pool));
    const size_t sb = cpu_moe_scratch_bytes(n_tokens, e->k, e->n_expert, e->n_embd, e->n_ff, e->down_type);
    void *mem = dt_malloc(sb);
    struct moe_scratch s;
    cpu_moe_scratch_init(&s, mem, n_tokens, e->k, e->n_expert, e->n_embd, e->n_ff, e->down_type);
    void *act_buf = dt_malloc(quant_act_row_bytes(g.kernels, e->n_embd) * (size_t)n_tokens);
    struct cpu_acts acts;
    cpu_quantize_acts(NULL, &g, x, n_tokens, act_buf, &acts);
    const struct moe_routing r = {n_tokens, e->k, ids, w, 0, 0};
    cpu_moe(pool, &g, &u, &dn, &acts, &r, &s, out);
    threadpool_free(pool);
    free(mem), free(act_buf);
}

/* The f16 path's function in double: operands rounded to f16 as the GPU rounds them. */
static void reference_f16(const struct experts *e, const float *x, const int32_t *ids, const float *w, int64_t n_tokens,
                          float *out) {
    float *h = dt_malloc(4 * (size_t)e->n_ff);
    for (int64_t t = 0; t < n_tokens; t++) {
        double *o = calloc((size_t)e->n_embd, sizeof(double));
        for (int j = 0; j < e->k; j++) {
            const int32_t ex = ids[t * e->k + j];
            for (int64_t f = 0; f < e->n_ff; f++) {
                double g = 0, u = 0;
                const float *gr = e->gate_f + ((int64_t)ex * e->n_ff + f) * e->n_embd, *ur = e->up_f + ((int64_t)ex * e->n_ff + f) * e->n_embd;
                for (int64_t i = 0; i < e->n_embd; i++) {
                    const double xi = dt_round_f16(x[t * e->n_embd + i]);
                    g += dt_round_f16(gr[i]) * xi;
                    u += dt_round_f16(ur[i]) * xi;
                }
                h[f] = (float)((g / (1.0 + exp(-g))) * u);
            }
            for (int64_t i = 0; i < e->n_embd; i++) {
                const float *dr = e->down_f + ((int64_t)ex * e->n_embd + i) * e->n_ff;
                double s = 0;
                for (int64_t f = 0; f < e->n_ff; f++) s += (double)dt_round_f16(dr[f]) * dt_round_f16(h[f]);
                o[i] += w[t * e->k + j] * s;
            }
        }
        for (int64_t i = 0; i < e->n_embd; i++) out[t * e->n_embd + i] = (float)o[i];
        free(o);
    }
    free(h);
}

static void test_route(struct dt *d, int64_t n_tokens, int n_expert, int k, bool normalize) {
    const size_t mark = cuda_arena_mark(&d->arena);
    float *logits = dt_malloc(4 * (size_t)(n_tokens * n_expert)), *wt = dt_malloc(4 * (size_t)(n_tokens * k));
    float *wg = dt_malloc(4 * (size_t)(n_tokens * k));
    int32_t *ids = dt_malloc(4 * (size_t)(n_tokens * k)), *ig = dt_malloc(4 * (size_t)(n_tokens * k));
    dt_fill(logits, n_tokens * n_expert, -4.0f, 4.0f);
    for (int64_t i = 0; i < n_tokens * n_expert; i += 13) logits[i] = logits[i - i % n_expert]; /* ties */
    float *dl = dt_upload(d, logits, 4 * (size_t)(n_tokens * n_expert));
    int32_t *dids = dt_alloc(d, 4 * (size_t)(n_tokens * k));
    float *dw = dt_alloc(d, 4 * (size_t)(n_tokens * k));
    DT_CHECK(cuda_moe_route(dl, n_tokens, n_expert, k, normalize, dids, dw, d->s));
    dt_download(d, ig, dids, 4 * (size_t)(n_tokens * k));
    dt_download(d, wg, dw, 4 * (size_t)(n_tokens * k));
    cpu_moe_route(logits, n_tokens, n_expert, k, normalize, ids, wt);
    int64_t where;
    const double e = dt_max_err(wg, wt, n_tokens * k, 1.0, &where);
    dt_case(d, memcmp(ids, ig, 4 * (size_t)(n_tokens * k)) == 0 && e <= 1e-6,
            "route %lld tokens, top %d of %d%s: same experts, weights max err %.2e", (long long)n_tokens, k, n_expert,
            normalize ? ", normalized" : "", e);
    cuda_arena_reset(&d->arena, mark);
    free(logits), free(wt), free(wg), free(ids), free(ig);
}

/* Tokens whose logits went NaN (every token here, and one logit of a second step's tokens,
 * which makes the whole softmax NaN): the k experts are still k distinct real ones, so nothing
 * downstream indexes past the experts. */
static void test_route_nan(struct dt *d, int64_t n_tokens, int n_expert, int k) {
    const size_t mark = cuda_arena_mark(&d->arena);
    float *logits = dt_malloc(4 * (size_t)(n_tokens * n_expert));
    int32_t *ig = dt_malloc(4 * (size_t)(n_tokens * k));
    bool ok = true;
    for (int one = 0; one < 2; one++) {
        dt_fill(logits, n_tokens * n_expert, -4.0f, 4.0f);
        for (int64_t t = 0; t < n_tokens; t++)
            for (int e = 0; e < n_expert; e++)
                if (!one || e == (int)(t % n_expert)) logits[t * n_expert + e] = NAN;
        float *dl = dt_upload(d, logits, 4 * (size_t)(n_tokens * n_expert));
        int32_t *dids = dt_alloc(d, 4 * (size_t)(n_tokens * k));
        float *dw = dt_alloc(d, 4 * (size_t)(n_tokens * k));
        DT_CHECK(cuda_moe_route(dl, n_tokens, n_expert, k, true, dids, dw, d->s));
        dt_download(d, ig, dids, 4 * (size_t)(n_tokens * k));
        for (int64_t t = 0; t < n_tokens; t++)
            for (int j = 0; j < k; j++) {
                const int32_t id = ig[t * k + j];
                ok = ok && id >= 0 && id < n_expert;
                for (int i = 0; i < j; i++) ok = ok && ig[t * k + i] != id;
            }
    }
    dt_case(d, ok, "route %lld tokens of NaN logits, top %d of %d: %d distinct experts in range", (long long)n_tokens, k,
            n_expert, k);
    cuda_arena_reset(&d->arena, mark);
    free(logits), free(ig);
}

enum variant { PLAIN, MASKED, TABLES };

static int n_fused;       /* cases that ran on the fused kernels */
static bool int8_device; /* compute capability 8.0 or later: int8 tensor cores */

static bool int8_format(enum quant_type t) {
    return t == QUANT_Q4_0 || t == QUANT_Q2_K || t == QUANT_Q4_K || t == QUANT_Q5_K;
}

/* fused: through cuda_moe_ffn (which fuses small steps), else cuda_moe_ffn_grouped. */
static void test_ffn(struct dt *d, enum quant_type gate_type, enum quant_type down_type, int n_expert, int k,
                     int64_t n_embd, int64_t n_ff, int64_t n_tokens, enum variant variant, int matvec_max, bool fused,
                     int slice) {
    const size_t mark = cuda_arena_mark(&d->arena);
    struct experts e;
    experts_init(d, &e, gate_type, down_type, n_expert, k, n_embd, n_ff);
    e.dev.matvec_max_tokens = matvec_max;
    e.dev.slice_tokens = slice; /* (the cases that slice cut their steps in equal slices: one kernel for all) */
    float *x = dt_malloc(4 * (size_t)(n_tokens * n_embd)), *w = dt_malloc(4 * (size_t)(n_tokens * k));
    int32_t *ids = dt_malloc(4 * (size_t)(n_tokens * k));
    dt_fill(x, n_tokens * n_embd, -1.0f, 1.0f);
    float *logits = dt_malloc(4 * (size_t)(n_tokens * n_expert));
    dt_fill(logits, n_tokens * n_expert, -3.0f, 3.0f);
    cpu_moe_route(logits, n_tokens, n_expert, k, true, ids, w);
    uint8_t *mask = dt_malloc((size_t)n_expert);
    for (int i = 0; i < n_expert; i++) mask[i] = variant != MASKED || i % 3 != 0;
    /* Reference: masked-out experts weigh 0 (their products are then exactly 0 in the sum). */
    float *wref = dt_malloc(4 * (size_t)(n_tokens * k));
    for (int64_t i = 0; i < n_tokens * k; i++) wref[i] = mask[ids[i]] ? w[i] : 0.0f;
    const int64_t step = slice > 0 && slice < n_tokens ? slice : n_tokens;
    const bool gemm = step > (matvec_max > 0 ? matvec_max : cuda_moe_matvec_bound(&e.dev));
    /* The tiled path multiplies Q4_0, Q2_K, Q4_K and Q5_K rows of whole 256-element stages on int8
     * tensor cores (sm_80 and later), with the matrix-vector kernel's quantized activations and
     * integers: the CPU's function; other formats dequantized to f16. */
    const bool int8_gate = gemm && int8_device && int8_format(gate_type) && n_embd % 256 == 0;
    const bool int8_down = gemm && int8_device && int8_format(down_type) && n_ff % 256 == 0;
    float *want = dt_malloc(4 * (size_t)(n_tokens * n_embd)), *got = dt_malloc(4 * (size_t)(n_tokens * n_embd));
    if (gemm && !int8_gate && !int8_down) reference_f16(&e, x, ids, wref, n_tokens, want);
    else reference_cpu(&e, x, ids, wref, n_tokens, want);
    float *base = dt_malloc(4 * (size_t)(n_tokens * n_embd));
    dt_fill(base, n_tokens * n_embd, -1.0f, 1.0f);
    if (variant == MASKED)
        for (int64_t i = 0; i < n_tokens * n_embd; i++) want[i] += base[i];

    if (variant == MASKED) e.dev.expert_mask = dt_upload(d, mask, (size_t)n_expert);
    if (variant == TABLES) {
        /* Each expert copied to its own place, in reverse order, reached through tables. */
        const void **tables[3];
        const struct cuda_matrix *mats[3] = {&e.dev.gate, &e.dev.up, &e.dev.down};
        for (int m = 0; m < 3; m++) {
            const size_t bytes = (size_t)mats[m]->n_rows * mats[m]->row_bytes;
            uint8_t *copies = dt_alloc(d, bytes * (size_t)n_expert);
            tables[m] = dt_malloc(sizeof(void *) * (size_t)n_expert);
            for (int ex = 0; ex < n_expert; ex++) {
                tables[m][ex] = copies + bytes * (size_t)(n_expert - 1 - ex);
                DT_CHECK(cuda_copy_d2d((void *)tables[m][ex], (const uint8_t *)mats[m]->data + bytes * (size_t)ex, bytes, d->s));
            }
        }
        e.dev.gate_ptrs = dt_upload(d, tables[0], sizeof(void *) * (size_t)n_expert);
        e.dev.up_ptrs = dt_upload(d, tables[1], sizeof(void *) * (size_t)n_expert);
        e.dev.down_ptrs = dt_upload(d, tables[2], sizeof(void *) * (size_t)n_expert);
        e.dev.gate.data = e.dev.up.data = e.dev.down.data = NULL;
        for (int m = 0; m < 3; m++) free(tables[m]);
    }
    const size_t out_bytes = 4 * (size_t)(n_tokens * n_embd);
    float *dout = dt_upload(d, base, out_bytes), *dx = dt_upload(d, x, out_bytes);
    int32_t *dids = dt_upload(d, ids, 4 * (size_t)(n_tokens * k));
    float *dw = dt_upload(d, w, 4 * (size_t)(n_tokens * k));
    const size_t wb = cuda_moe_work_bytes(&e.dev, n_tokens);
    void *dwork = dt_alloc(d, wb);
    DT_CHECK((fused ? cuda_moe_ffn : cuda_moe_ffn_grouped)(&e.dev, dx, dids, dw, n_tokens, dout, variant == MASKED, dwork,
                                                           wb, d->s));
    dt_download(d, got, dout, out_bytes);
    /* The same step with x given quantized, as the norm before it leaves it: the same bits. */
    bool same_quantized = true;
    if (fused && !gemm) {
        const enum quant_type act = cuda_act_type(gate_type);
        void *dq = dt_alloc(d, cuda_act_row_bytes(act, n_embd) * (size_t)n_tokens + 64);
        float *dout2 = dt_upload(d, base, out_bytes), *got2 = dt_malloc(out_bytes);
        DT_CHECK(cuda_quantize(act, dx, n_embd, n_tokens, dq, d->s));
        DT_CHECK(cuda_moe_ffn_quantized(&e.dev, dx, dq, dids, dw, n_tokens, dout2, variant == MASKED, dwork, wb, d->s));
        dt_download(d, got2, dout2, out_bytes);
        same_quantized = memcmp(got, got2, out_bytes) == 0;
        free(got2);
    }
    double scale = 0.0;
    for (int64_t i = 0; i < n_tokens * n_embd; i++) scale = fmax(scale, fabs(want[i]));
    int64_t where;
    /* Matvec path: the hidden activations are re-quantized to 8 bits after float sums that
     * differ in order, so an element can land one quant step apart: 1e-3 of the scale. */
    /* Int8 gate and up before an f16 down (or the reverse): each half the other's function, so
     * against the CPU the error of 8-bit activations against 16-bit ones, about 1/128 of a value,
     * and more where the 8-bit half is a K format (Q8_K: one scale for 256 elements, not 32;
     * measured up to 1.7e-2 of the scale on an H100). */
    const bool k_half = (int8_gate && gate_type != QUANT_Q4_0) || (int8_down && down_type != QUANT_Q4_0);
    const double tol = int8_gate != int8_down ? (k_half ? 3e-2 : 1e-2) : gemm && !int8_gate ? 5e-4 : 1e-3;
    const double err = dt_max_err(got, want, n_tokens * n_embd, scale, &where);
    static const char *names[] = {"", " masked+accumulate", " pointer tables"};
    const bool fused_path = fused && cuda_moe_fuses(&e.dev, n_tokens);
    n_fused += fused_path;
    dt_case(d, err <= tol && same_quantized,
            "moe %-4s/%-4s %3d experts top %d, %lld x %lld, %3lld tokens (%s%s%s)%s: max err %.2e of %.3g (tol %.0e)%s",
            quant_type_name(gate_type), quant_type_name(down_type), n_expert, k, (long long)n_embd, (long long)n_ff,
            (long long)n_tokens, gemm ? (int8_gate || int8_down ? "gemm, int8" : "gemm") : fused_path ? "fused" : "matvec",
            matvec_max ? ", forced" : "",
            step < n_tokens ? ", in slices" : "", names[variant], err, scale, tol,
            same_quantized ? "" : "; x given quantized: other bits");
    if (!(err <= tol))
        printf("    token %lld dim %lld: got %.7g want %.7g\n", (long long)(where / n_embd), (long long)(where % n_embd),
               got[where], want[where]);
    cuda_arena_reset(&d->arena, mark);
    experts_free(&e);
    free(x), free(w), free(ids), free(logits), free(mask), free(wref), free(want), free(got), free(base);
}

/* The mask of one token's experts the GPU reads in a routed split, against plan_routed_split, over
 * random routings, resident ranges and quotas (every other one with the resident experts too). */
static void test_routed_mask(struct dt *d, int n_expert, int k, int trials) {
    const size_t mark = cuda_arena_mark(&d->arena);
    int32_t *dids = dt_alloc(d, 4 * (size_t)k);
    uint8_t *dquota = dt_alloc(d, PLAN_MAX_ROUTED + 1), *dmask = dt_alloc(d, (size_t)n_expert);
    uint8_t *mask = dt_malloc((size_t)n_expert), quota[PLAN_MAX_ROUTED + 1];
    int32_t ids[PLAN_MAX_ROUTED];
    bool gpu[PLAN_MAX_ROUTED];
    int wrong = 0, marked = 0;
    for (int t = 0; t < trials; t++) {
        float logits[2048];
        dt_fill(logits, n_expert, -3.0f, 3.0f);
        float w[PLAN_MAX_ROUTED];
        cpu_moe_route(logits, 1, n_expert, k, true, ids, w);
        const int first = t % 3 == 0 ? 0 : (int)(logits[0] * 1000.0f + 3000.0f) % n_expert;
        for (int n = 0; n <= PLAN_MAX_ROUTED; n++) quota[n] = (uint8_t)(n ? (int)(logits[n] * 100.0f + 300.0f) % (n + 1) : 0);
        DT_CHECK(cuda_copy_h2d(dids, ids, 4 * (size_t)k, d->s));
        DT_CHECK(cuda_copy_h2d(dquota, quota, sizeof quota, d->s));
        const bool resident_too = t % 2 == 1; /* one expert call: the resident ones as well */
        DT_CHECK(cuda_moe_routed_mask(dids, k, first, dquota, n_expert, resident_too, dmask, d->s));
        dt_download(d, mask, dmask, (size_t)n_expert);
        plan_routed_split(ids, k, first, quota, gpu);
        int set = 0;
        for (int j = 0; j < k; j++) {
            const bool want = gpu[j] || (resident_too && ids[j] < first);
            wrong += mask[ids[j]] != want;
            set += want;
        }
        int total = 0;
        for (int e = 0; e < n_expert; e++) total += mask[e];
        wrong += total != set;
        marked += set;
    }
    dt_case(d, wrong == 0 && marked > 0, "routed mask, top %d of %d, %d routings: %d experts marked, %d differ from the rule", k,
            n_expert, trials, marked, wrong);
    cuda_arena_reset(&d->arena, mark);
    free(mask);
}

int main(void) {
    struct dt d;
    dt_init(&d, "test_cuda_moe", 1u << 30);
    dt_seed(5);
    struct cuda_device_info info;
    int8_device = cuda_device_describe(0, &info) == PSHARD_OK && info.compute_major >= 8;
    test_route(&d, 1, 128, 8, true);
    test_route(&d, 37, 64, 4, false);
    test_route(&d, 300, 128, 8, true);
    test_route(&d, 5, 8, 2, true);
    test_route(&d, 6, 160, 8, true);  /* a warp's 8 experts a lane */
    test_route(&d, 3, 512, 10, true); /* past a warp: the block kernel */
    test_route_nan(&d, 5, 128, 8);
    test_route_nan(&d, 3, 512, 10);
    test_routed_mask(&d, 128, 8, 200);
    test_routed_mask(&d, 8, 2, 50);
    const int64_t tokens[] = {1, 3, 8, 12, 20, 70};
    const struct { enum quant_type gate, down; int n_expert, k, n_embd, n_ff; enum variant v; } c[6] = {
        {QUANT_Q4_0, QUANT_Q4_0, 16, 4, 256, 512, PLAIN}, {QUANT_Q4_K, QUANT_Q6_K, 16, 4, 256, 512, PLAIN},
        {QUANT_Q8_0, QUANT_Q5_K, 8, 2, 512, 256, MASKED}, {QUANT_F16, QUANT_Q4_1, 8, 3, 256, 256, TABLES},
        {QUANT_Q2_K, QUANT_Q2_K, 128, 8, 512, 256, PLAIN}, {QUANT_Q4_0, QUANT_Q8_0, 128, 8, 256, 768, MASKED}};
    /* Each count on the kernel its size picks, then (past one token) on the other one: groups of
     * more pairs than a matrix-vector pass takes, and the tiled GEMM's mostly empty tiles. Up to
     * CUDA_MOE_FUSED_MAX_TOKENS the default is the fused kernels; the grouped matrix-vector kernels
     * run too (from VRAM, 3-D or masked: mv_group_kernel; tables: mv_kernel). */
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
        for (int forced = 0; forced < (tokens[i] > 1 ? 2 : 1); forced++)
            for (int j = 0; j < 6; j++) {
                if (j >= 4 && tokens[i] > 8) continue; /* (the fused cases) */
                const struct cuda_moe rule = {.gate = {.type = c[j].gate, .n_cols = c[j].n_embd},
                                              .n_expert = c[j].n_expert, .k = c[j].k};
                const bool tiled = tokens[i] > cuda_moe_matvec_bound(&rule);
                test_ffn(&d, c[j].gate, c[j].down, c[j].n_expert, c[j].k, c[j].n_embd, c[j].n_ff, tokens[i], c[j].v,
                         !forced ? 0 : tiled ? 1 << 30 : 1, true, 0);
                if (!forced && tokens[i] <= CUDA_MOE_FUSED_MAX_TOKENS)
                    test_ffn(&d, c[j].gate, c[j].down, c[j].n_expert, c[j].k, c[j].n_embd, c[j].n_ff, tokens[i], c[j].v,
                             0, false, 0);
            }
    /* Steps past a slice, one slice after another over one work buffer: 70 tokens in two slices
     * of 35 (the GEMM), 16 in two of 8 (the matrix-vector kernel, x given quantized too: its rows
     * cut with the slices); every format pair and variant of the cases above but the fused ones. */
    const struct { int64_t n; int slice; } sliced[] = {{70, 35}, {16, 8}};
    for (size_t i = 0; i < sizeof sliced / sizeof sliced[0]; i++)
        for (int j = 0; j < 4; j++)
            test_ffn(&d, c[j].gate, c[j].down, c[j].n_expert, c[j].k, c[j].n_embd, c[j].n_ff, sliced[i].n, c[j].v, 0,
                     true, sliced[i].slice);
    /* The int8 tiled product through pointer tables (a staging slot's experts), 20 tokens. */
    test_ffn(&d, QUANT_Q4_0, QUANT_Q4_0, 8, 2, 256, 512, 20, TABLES, 1, true, 0);
    /* The K formats' int8 products (Q8_K activations, the minimums through the bsums): both
     * halves, each variant; Q2_K's 16-element scales in the weights' words. */
    test_ffn(&d, QUANT_Q4_K, QUANT_Q5_K, 16, 4, 512, 256, 70, PLAIN, 1, true, 0);
    test_ffn(&d, QUANT_Q2_K, QUANT_Q4_K, 16, 4, 256, 512, 20, MASKED, 1, true, 0);
    test_ffn(&d, QUANT_Q5_K, QUANT_Q2_K, 8, 2, 256, 256, 20, TABLES, 1, true, 0);
    /* Every small default case above fuses (rows of 16-, 8- and 4-byte multiples among them), and
     * so does qwen30b's layer (Q4_0, 128 experts top 8, 2048 x 768) up to the bound. */
    struct cuda_moe q30 = {.n_expert = 128, .k = 8};
    q30.gate = q30.up = (struct cuda_matrix){QUANT_Q4_0, d.arena.base, 2048, 768, 128, quant_row_bytes(QUANT_Q4_0, 2048), false};
    q30.down = (struct cuda_matrix){QUANT_Q4_0, d.arena.base, 768, 2048, 128, quant_row_bytes(QUANT_Q4_0, 768), false};
    int small = 0;
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) small += 6 * (tokens[i] <= CUDA_MOE_FUSED_MAX_TOKENS);
    const bool q30_fuses = cuda_moe_fuses(&q30, 1) && cuda_moe_fuses(&q30, CUDA_MOE_FUSED_MAX_TOKENS) &&
                           !cuda_moe_fuses(&q30, CUDA_MOE_FUSED_MAX_TOKENS + 1);
    dt_case(&d, small >= 12 && n_fused == small && q30_fuses,
            "fused kernels ran %d of the %d small default cases; qwen30b's layer fuses at 1-%d tokens, not above: %s", n_fused,
            small, (int)CUDA_MOE_FUSED_MAX_TOKENS, q30_fuses ? "yes" : "no");
    /* The int8 kernel: rows of whole 256-element stages in its formats, from sm_80; where it runs, qwen30b's
     * experts in VRAM take the tiled path past CUDA_MOE_INT8_MATVEC_MAX tokens, read in place past
     * the matrix-vector kernel's own bound. */
    bool int8_rule = !cuda_int8_products(QUANT_Q4_0, 2048 + 32);
    for (uint32_t t = 0; t < 32; t++)
        if (cuda_type_supported((enum quant_type)t))
            int8_rule &= cuda_int8_products((enum quant_type)t, 2048) == (int8_device && int8_format((enum quant_type)t));
    struct cuda_moe q30_host = q30;
    q30_host.gate.in_place = true;
    const int64_t vram_bound = cuda_moe_matvec_bound(&q30), host_bound = cuda_moe_matvec_bound(&q30_host);
    const int64_t own = cuda_moe_matvec_max_tokens(128, 8);
    dt_case(&d, int8_rule && vram_bound == (int8_device ? CUDA_MOE_INT8_MATVEC_MAX : own) && host_bound == own,
            "int8 expert products on this device: %s; qwen30b's experts tiled past %lld tokens in VRAM, %lld in place",
            int8_device ? "yes" : "no", (long long)vram_bound, (long long)host_bound);
    return dt_finish(&d);
}
