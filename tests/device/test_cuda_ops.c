/* GPU test: the element-wise operators against src/cpu -- RMSNorm (rows and per head), residual
 * and bias adds and the f16 KV store (exact), SwiGLU (expf may differ by an ulp), RoPE tables
 * in normal, neox, frequency-factor and YaRN settings up to long positions (only cosf/sinf may
 * differ, by an ulp), and the rotation itself (exact given the same table). */
#include "cpu/cpu_ops.h"
#include "cpu/rope.h"
#include "device_test.h"

static void test_rmsnorm(struct dt *d, int64_t n_rows, int64_t n, bool weighted) {
    const size_t mark = cuda_arena_mark(&d->arena);
    float *x = dt_malloc(4 * (size_t)(n_rows * n)), *w = dt_malloc(4 * (size_t)n);
    float *want = dt_malloc(4 * (size_t)(n_rows * n)), *got = dt_malloc(4 * (size_t)(n_rows * n));
    dt_fill(x, n_rows * n, -3.0f, 3.0f);
    dt_fill(w, n, 0.5f, 1.5f);
    for (int64_t r = 0; r < n_rows; r++) cpu_rmsnorm(x + r * n, weighted ? w : NULL, want + r * n, n, 1e-6f);
    float *dx = dt_upload(d, x, 4 * (size_t)(n_rows * n)), *dw = dt_upload(d, w, 4 * (size_t)n);
    /* apart from x (a few rows run a block per 256 values), then in place, as q/k norms run */
    float *dout = dt_alloc(d, 4 * (size_t)(n_rows * n)), *apart = dt_malloc(4 * (size_t)(n_rows * n));
    DT_CHECK(cuda_rmsnorm(dx, weighted ? dw : NULL, dout, n_rows, n, 1e-6f, d->s));
    dt_download(d, apart, dout, 4 * (size_t)(n_rows * n));
    DT_CHECK(cuda_rmsnorm(dx, weighted ? dw : NULL, dx, n_rows, n, 1e-6f, d->s));
    dt_download(d, got, dx, 4 * (size_t)(n_rows * n));
    int64_t where;
    const double e = dt_max_err(got, want, n_rows * n, 1.0, &where);
    dt_case(d, e <= 1e-6 && memcmp(apart, got, 4 * (size_t)(n_rows * n)) == 0,
            "rmsnorm %lld rows x %lld%s: max abs err %.2e, the same bits in place and apart", (long long)n_rows, (long long)n,
            weighted ? " weighted" : "", e);
    cuda_arena_reset(&d->arena, mark);
    free(x), free(w), free(want), free(got), free(apart);
}

/* RMSNorm and its quantization in one launch: the bits of cuda_rmsnorm then cuda_quantize (Q8_0,
 * Q8_1, F16 and BF16 in one launch; another format through the two calls), the mirror (where
 * asked) the same as the output. */
static void test_rmsnorm_quantize(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n, bool weighted,
                                  bool mirrored) {
    const size_t mark = cuda_arena_mark(&d->arena);
    const size_t fb = 4 * (size_t)(n_rows * n), qb = quant_row_bytes(type, n_rows * n) + 64;
    float *x = dt_malloc(fb), *w = dt_malloc(4 * (size_t)n), *out1 = dt_malloc(fb), *out2 = dt_malloc(fb);
    float *out3 = dt_malloc(fb);
    uint8_t *q1 = dt_malloc(qb), *q2 = dt_malloc(qb);
    dt_fill(x, n_rows * n, -3.0f, 3.0f);
    dt_fill(w, n, 0.5f, 1.5f);
    float *dx = dt_upload(d, x, fb), *dw = weighted ? dt_upload(d, w, 4 * (size_t)n) : NULL;
    float *dn1 = dt_alloc(d, fb), *dn2 = dt_alloc(d, fb), *dm = mirrored ? dt_alloc(d, fb) : NULL;
    void *dq1 = dt_alloc(d, qb), *dq2 = dt_alloc(d, qb);
    DT_CHECK(cuda_rmsnorm(dx, dw, dn1, n_rows, n, 1e-6f, d->s));
    DT_CHECK(cuda_quantize(type, dn1, n, n_rows, dq1, d->s));
    DT_CHECK(cuda_rmsnorm_quantize(type, dx, dw, dn2, dm, dq2, n_rows, n, 1e-6f, d->s));
    dt_download(d, out1, dn1, fb), dt_download(d, out2, dn2, fb);
    if (mirrored) dt_download(d, out3, dm, fb);
    const size_t used = quant_row_bytes(type, n_rows * n);
    dt_download(d, q1, dq1, used), dt_download(d, q2, dq2, used);
    dt_case(d, memcmp(out1, out2, fb) == 0 && memcmp(q1, q2, used) == 0 && (!mirrored || memcmp(out1, out3, fb) == 0),
            "rmsnorm and quantize to %s, %lld rows x %lld%s%s: the bits of rmsnorm then quantize", quant_type_name(type),
            (long long)n_rows, (long long)n, weighted ? " weighted" : "", mirrored ? ", mirrored" : "");
    cuda_arena_reset(&d->arena, mark);
    free(x), free(w), free(out1), free(out2), free(out3), free(q1), free(q2);
}

/* SwiGLU and the conversion for down in one launch: the bits of cuda_swiglu then cuda_quantize. */
static void test_swiglu_quantize(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n) {
    const size_t mark = cuda_arena_mark(&d->arena);
    const size_t fb = 4 * (size_t)(n_rows * n), qb = quant_row_bytes(type, n_rows * n);
    float *g = dt_malloc(fb), *u = dt_malloc(fb);
    uint8_t *q1 = dt_malloc(qb), *q2 = dt_malloc(qb);
    dt_fill(g, n_rows * n, -8.0f, 8.0f);
    dt_fill(u, n_rows * n, -2.0f, 2.0f);
    float *dg = dt_upload(d, g, fb), *du = dt_upload(d, u, fb), *dh = dt_alloc(d, fb);
    void *dq1 = dt_alloc(d, qb), *dq2 = dt_alloc(d, qb);
    DT_CHECK(cuda_swiglu(dg, du, dh, n_rows * n, d->s));
    DT_CHECK(cuda_quantize(type, dh, n, n_rows, dq1, d->s));
    DT_CHECK(cuda_swiglu_quantize(type, dg, du, n, n_rows, dq2, d->s));
    dt_download(d, q1, dq1, qb), dt_download(d, q2, dq2, qb);
    dt_case(d, memcmp(q1, q2, qb) == 0, "swiglu and quantize to %s, %lld rows x %lld: the bits of swiglu then quantize",
            quant_type_name(type), (long long)n_rows, (long long)n);
    cuda_arena_reset(&d->arena, mark);
    free(g), free(u), free(q1), free(q2);
}

static void test_pointwise(struct dt *d) {
    const int64_t rows = 7, n = 3000;
    const size_t bytes = 4 * (size_t)(rows * n);
    const size_t mark = cuda_arena_mark(&d->arena);
    float *a = dt_malloc(bytes), *b = dt_malloc(bytes), *bias = dt_malloc(4 * (size_t)n), *got = dt_malloc(bytes);
    float *want = dt_malloc(bytes);
    dt_fill(a, rows * n, -8.0f, 8.0f);
    dt_fill(b, rows * n, -2.0f, 2.0f);
    dt_fill(bias, n, -1.0f, 1.0f);
    float *da = dt_upload(d, a, bytes), *db = dt_upload(d, b, bytes), *dbias = dt_upload(d, bias, 4 * (size_t)n);
    int64_t where;

    memcpy(want, a, bytes);
    cpu_add(want, b, rows * n);
    cpu_add_bias(want, bias, rows, n);
    DT_CHECK(cuda_add(da, db, rows * n, d->s));
    DT_CHECK(cuda_add_bias(da, dbias, rows, n, d->s));
    dt_download(d, got, da, bytes);
    dt_case(d, dt_max_err(got, want, rows * n, 1.0, &where) == 0.0, "add + add_bias: exact");

    cpu_swiglu(want, b, want, rows * n);
    DT_CHECK(cuda_swiglu(da, db, da, rows * n, d->s));
    dt_download(d, got, da, bytes);
    double worst = 0.0;
    for (int64_t i = 0; i < rows * n; i++) {
        const double e = fabs((double)got[i] - want[i]) / (fabs(want[i]) + 1e-30);
        if (!(e <= worst)) worst = e, where = i;
    }
    dt_case(d, worst <= 5e-7, "swiglu: max rel err %.2e (tol 5e-7)", worst);
    cuda_arena_reset(&d->arena, mark);
    free(a), free(b), free(bias), free(got), free(want);
}

static void test_rope(struct dt *d, const char *name, struct rope_params p, int head_size, int n_heads) {
    const size_t mark = cuda_arena_mark(&d->arena);
    /* M-RoPE: [3][n_tokens] time, row and column (an image's tokens: one time, rows and columns
     * past it; a text token: all three the same) */
    const int32_t pos[] = {0, 1, 2, 17, 1000, 4095, 32767, 131071,
                           0, 1, 2, 17, 1003, 4095, 32767, 131071,
                           0, 1, 2, 17, 1011, 4099, 32767, 131071};
    const bool multi = rope_is_multi(&p);
    const int64_t n_tokens = sizeof pos / sizeof pos[0] / 3;
    float *ff = NULL, *dff = NULL;
    if (p.freq_factors) {
        ff = dt_malloc(4 * (size_t)(p.n_dims / 2));
        for (int i = 0; i < p.n_dims / 2; i++) ff[i] = i < p.n_dims / 8 ? 1.0f : dt_uniform(1.0f, 8.0f);
        p.freq_factors = ff;
        dff = dt_upload(d, ff, 4 * (size_t)(p.n_dims / 2));
    }
    const int64_t width = (int64_t)n_heads * head_size;
    float *cs = dt_malloc(4 * (size_t)(n_tokens * p.n_dims)), *cs_got = dt_malloc(4 * (size_t)(n_tokens * p.n_dims));
    float *x = dt_malloc(4 * (size_t)(n_tokens * width)), *x_got = dt_malloc(4 * (size_t)(n_tokens * width));
    dt_fill(x, n_tokens * width, -2.0f, 2.0f);
    int32_t *dpos = dt_upload(d, pos, sizeof pos);
    float *dcs = dt_alloc(d, 4 * (size_t)(n_tokens * p.n_dims));
    DT_CHECK(cuda_rope_table(&p, dff, dpos, n_tokens, n_tokens, dcs, d->s));
    dt_download(d, cs_got, dcs, 4 * (size_t)(n_tokens * p.n_dims));
    for (int64_t t = 0; t < n_tokens; t++) {
        const int32_t three[3] = {pos[t], pos[n_tokens + t], pos[2 * n_tokens + t]};
        if (multi) cpu_rope_table_multi(&p, three, cs + t * p.n_dims);
        else cpu_rope_table(&p, pos[t], cs + t * p.n_dims);
    }
    int64_t where;
    const double e = dt_max_err(cs_got, cs, n_tokens * p.n_dims, 1.0, &where);
    int64_t bitwise = 0;
    for (int64_t i = 0; i < n_tokens * p.n_dims; i++) bitwise += memcmp(&cs[i], &cs_got[i], 4) == 0;
    dt_case(d, e <= 1e-6, "rope table %-8s: max abs err %.2e, %lld of %lld bit-identical", name, e,
            (long long)bitwise, (long long)(n_tokens * p.n_dims));
    if (e > 1e-6)
        printf("    token %lld dim %lld: got %.9g want %.9g\n", (long long)(where / p.n_dims),
               (long long)(where % p.n_dims), cs_got[where], cs[where]);

    /* Rotation from the CPU's table: exact. */
    float *dx = dt_upload(d, x, 4 * (size_t)(n_tokens * width));
    DT_CHECK(cuda_copy_h2d(dcs, cs, 4 * (size_t)(n_tokens * p.n_dims), d->s));
    DT_CHECK(cuda_rope_apply(&p, dcs, dx, n_tokens, n_heads, head_size, d->s));
    dt_download(d, x_got, dx, 4 * (size_t)(n_tokens * width));
    for (int64_t t = 0; t < n_tokens; t++) cpu_rope_apply(&p, cs + t * p.n_dims, x + t * width, n_heads, head_size);
    dt_case(d, dt_max_err(x_got, x, n_tokens * width, 1.0, &where) == 0.0, "rope apply %-8s: exact", name);

    /* A head norm and the rotation in one kernel: the two kernels' result to the bit. */
    float *wn = dt_malloc(4 * (size_t)head_size);
    dt_fill(wn, head_size, 0.5f, 1.5f);
    dt_fill(x, n_tokens * width, -2.0f, 2.0f);
    const float *dwn = dt_upload(d, wn, 4 * (size_t)head_size);
    float *two = dt_upload(d, x, 4 * (size_t)(n_tokens * width)), *one = dt_upload(d, x, 4 * (size_t)(n_tokens * width));
    DT_CHECK(cuda_rmsnorm(two, dwn, two, n_tokens * n_heads, head_size, 1e-6f, d->s));
    DT_CHECK(cuda_rope_apply(&p, dcs, two, n_tokens, n_heads, head_size, d->s));
    DT_CHECK(cuda_norm_rope(&p, dcs, one, dwn, 1e-6f, n_tokens, n_heads, head_size, d->s));
    dt_download(d, x, two, 4 * (size_t)(n_tokens * width));
    dt_download(d, x_got, one, 4 * (size_t)(n_tokens * width));
    dt_case(d, memcmp(x, x_got, 4 * (size_t)(n_tokens * width)) == 0, "norm+rope %-8s: the same bits as norm, then rope",
            name);
    /* q's and k's heads (k: a third of the heads, its own weights), then K and V stored, in one
     * launch (V's heads narrower): the bits of norm+rope of each, then the KV store, at cells 3 t
     * of a sequence whose blocks run backwards. */
    const int kv_heads = n_heads / 3 > 0 ? n_heads / 3 : 1;
    float *wk = dt_malloc(4 * (size_t)head_size);
    dt_fill(wk, head_size, 0.25f, 1.25f);
    const float *dwk = dt_upload(d, wk, 4 * (size_t)head_size);
    const int64_t k_n = n_tokens * kv_heads * head_size;
    const int head_v = head_size > 32 ? head_size - 32 : head_size;
    const int64_t v_n = n_tokens * kv_heads * head_v, k_width = (int64_t)kv_heads * head_size;
    const int64_t v_width = (int64_t)kv_heads * head_v;
    const int32_t n_blocks = (int32_t)(3 * n_tokens / CUDA_KV_TILE + 1);
    int32_t *blocks = dt_malloc(sizeof(int32_t) * (size_t)n_blocks), *seq = dt_malloc(sizeof(int32_t) * (size_t)n_tokens),
            *cpos = dt_malloc(sizeof(int32_t) * (size_t)n_tokens);
    for (int32_t b = 0; b < n_blocks; b++) blocks[b] = n_blocks - 1 - b;
    for (int64_t t = 0; t < n_tokens; t++) seq[t] = 0, cpos[t] = (int32_t)(3 * t);
    const size_t kb = 2 * (size_t)(n_blocks * CUDA_KV_TILE * k_width), vb = 2 * (size_t)(n_blocks * CUDA_KV_TILE * v_width);
    const int32_t *dblocks = dt_upload(d, blocks, sizeof(int32_t) * (size_t)n_blocks);
    struct cuda_kv_layer kv1 = {dt_alloc(d, kb), dt_alloc(d, vb), dblocks, n_blocks, CUDA_KV_TILE};
    struct cuda_kv_layer kv2 = kv1;
    kv2.k = dt_alloc(d, kb), kv2.v = dt_alloc(d, vb);
    DT_CHECK(cuda_memset(kv1.k, 0, kb, d->s));
    DT_CHECK(cuda_memset(kv1.v, 0, vb, d->s));
    DT_CHECK(cuda_memset(kv2.k, 0, kb, d->s));
    DT_CHECK(cuda_memset(kv2.v, 0, vb, d->s));
    float *vv = dt_malloc(4 * (size_t)v_n);
    dt_fill(vv, v_n, -3.0f, 3.0f);
    dt_fill(x, n_tokens * width, -2.0f, 2.0f);
    const float *dv = dt_upload(d, vv, 4 * (size_t)v_n);
    const int32_t *dseq = dt_upload(d, seq, sizeof(int32_t) * (size_t)n_tokens);
    const int32_t *dcpos = dt_upload(d, cpos, sizeof(int32_t) * (size_t)n_tokens);
    float *q3 = dt_upload(d, x, 4 * (size_t)(n_tokens * width)), *q4 = dt_upload(d, x, 4 * (size_t)(n_tokens * width));
    float *k3 = dt_upload(d, x, 4 * (size_t)k_n), *k4 = dt_upload(d, x, 4 * (size_t)k_n);
    DT_CHECK(cuda_norm_rope(&p, dcs, q3, dwn, 1e-6f, n_tokens, n_heads, head_size, d->s));
    DT_CHECK(cuda_norm_rope(&p, dcs, k3, dwk, 1e-6f, n_tokens, kv_heads, head_size, d->s));
    DT_CHECK(cuda_kv_store(&kv1, k3, dv, k_width, v_width, dseq, dcpos, n_tokens, d->s));
    DT_CHECK(cuda_norm_rope_qk_store(&p, dcs, q4, dwn, n_heads, k4, dwk, kv_heads, 1e-6f, n_tokens, head_size, &kv2, dv,
                                     head_v, dseq, dcpos, d->s));
    const size_t qb = 4 * (size_t)(n_tokens * width);
    dt_case(d, dt_same(d, q3, q4, qb) && dt_same(d, k3, k4, 4 * (size_t)k_n) && dt_same(d, kv1.k, kv2.k, kb) &&
                   dt_same(d, kv1.v, kv2.v, vb), "norm+rope %-8s of q and k and the KV store (v heads of %d) in one launch: the same bits and cells", name,
            head_v);
    /* And without the norms: rope of q and of k, then the store. */
    DT_CHECK(cuda_memset(kv2.k, 0, kb, d->s));
    DT_CHECK(cuda_memset(kv2.v, 0, vb, d->s));
    DT_CHECK(cuda_memset(kv1.k, 0, kb, d->s));
    DT_CHECK(cuda_memset(kv1.v, 0, vb, d->s));
    DT_CHECK(cuda_copy_h2d(q3, x, qb, d->s));
    DT_CHECK(cuda_copy_h2d(q4, x, qb, d->s));
    DT_CHECK(cuda_copy_h2d(k3, x, 4 * (size_t)k_n, d->s));
    DT_CHECK(cuda_copy_h2d(k4, x, 4 * (size_t)k_n, d->s));
    DT_CHECK(cuda_rope_apply(&p, dcs, q3, n_tokens, n_heads, head_size, d->s));
    DT_CHECK(cuda_rope_apply(&p, dcs, k3, n_tokens, kv_heads, head_size, d->s));
    DT_CHECK(cuda_kv_store(&kv1, k3, dv, k_width, v_width, dseq, dcpos, n_tokens, d->s));
    DT_CHECK(cuda_rope_qk_store(&p, dcs, q4, n_heads, k4, kv_heads, n_tokens, head_size, &kv2, dv, head_v, dseq, dcpos,
                                d->s));
    dt_case(d, dt_same(d, q3, q4, qb) && dt_same(d, k3, k4, 4 * (size_t)k_n) && dt_same(d, kv1.k, kv2.k, kb) &&
                   dt_same(d, kv1.v, kv2.v, vb),
            "rope %-8s of q and k and the KV store in one launch, no norms: the same bits and cells", name);
    free(blocks), free(seq), free(cpos), free(vv);
    free(wn), free(wk);
    cuda_arena_reset(&d->arena, mark);
    free(ff), free(cs), free(cs_got), free(x), free(x_got);
}

/* Cells land at their rows of the pool through each sequence's blocks (interleaved, backwards). */
static void test_kv_store(struct dt *d) {
    const int64_t n_seq = 3, n_ctx = 150, k_width = 256, v_width = 192, n_tokens = 6, per = 3, n = n_seq * per + 1;
    const int32_t seq[] = {0, 2, 2, 1, 0, 2}, pos[] = {0, 63, 64, 149, 3, 130};
    int32_t blocks[9];
    for (int64_t s = 0; s < n_seq; s++)
        for (int64_t i = 0; i < per; i++) blocks[s * per + i] = (int32_t)(n - 1 - (i * n_seq + s));
    const size_t mark = cuda_arena_mark(&d->arena);
    const size_t kb = 2 * (size_t)(n * CUDA_KV_TILE * k_width), vb = 2 * (size_t)(n * CUDA_KV_TILE * v_width);
    uint16_t *kc = calloc(1, kb), *vc = calloc(1, vb), *kg = dt_malloc(kb), *vg = dt_malloc(vb);
    float *k = dt_malloc(4 * (size_t)(n_tokens * k_width)), *v = dt_malloc(4 * (size_t)(n_tokens * v_width));
    dt_fill(k, n_tokens * k_width, -100.0f, 100.0f);
    dt_fill(v, n_tokens * v_width, -1e-5f, 1e-5f); /* subnormal halves */
    for (int64_t t = 0; t < n_tokens; t++) {
        const int64_t row = (int64_t)blocks[seq[t] * per + pos[t] / CUDA_KV_TILE] * CUDA_KV_TILE + pos[t] % CUDA_KV_TILE;
        for (int64_t i = 0; i < k_width; i++) kc[row * k_width + i] = half_from_f32(k[t * k_width + i]);
        for (int64_t i = 0; i < v_width; i++) vc[row * v_width + i] = half_from_f32(v[t * v_width + i]);
    }
    struct cuda_kv_layer kv = {dt_alloc(d, kb), dt_alloc(d, vb), dt_upload(d, blocks, sizeof blocks), (int32_t)per, CUDA_KV_TILE};
    (void)n_ctx;
    DT_CHECK(cuda_memset(kv.k, 0, kb, d->s));
    DT_CHECK(cuda_memset(kv.v, 0, vb, d->s));
    DT_CHECK(cuda_kv_store(&kv, dt_upload(d, k, 4 * (size_t)(n_tokens * k_width)),
                           dt_upload(d, v, 4 * (size_t)(n_tokens * v_width)), k_width, v_width, dt_upload(d, seq, sizeof seq),
                           dt_upload(d, pos, sizeof pos), n_tokens, d->s));
    dt_download(d, kg, kv.k, kb);
    dt_download(d, vg, kv.v, vb);
    dt_case(d, memcmp(kg, kc, kb) == 0 && memcmp(vg, vc, vb) == 0, "kv store: f16 bits at the right cells of the pool's blocks");
    cuda_arena_reset(&d->arena, mark);
    free(kc), free(vc), free(kg), free(vg), free(k), free(v);
}

int main(void) {
    struct dt d;
    dt_init(&d, "test_cuda_ops", 256 << 20);
    dt_seed(3);
    test_rmsnorm(&d, 5, 4096, true);
    test_rmsnorm(&d, 1, 2048, false);
    test_rmsnorm(&d, 3, 2080, true); /* a block per 256 values, the last one partly */
    test_rmsnorm(&d, 5 * 32, 128, true); /* per-head q norm */
    test_rmsnorm_quantize(&d, QUANT_Q8_1, 1, 2048, true, false); /* qwen30b's attention input, one token */
    test_rmsnorm_quantize(&d, QUANT_Q8_1, 1, 2048, true, true);  /* its MoE input, mirrored to the host's copy */
    test_rmsnorm_quantize(&d, QUANT_Q8_1, 8, 4096, true, false);
    test_rmsnorm_quantize(&d, QUANT_Q8_0, 3, 2048, false, true);
    test_rmsnorm_quantize(&d, QUANT_Q8_0, 2, 2080, true, false); /* a last block of 8 warps only partly used */
    test_rmsnorm_quantize(&d, QUANT_F16, 2, 4096, true, false);  /* llama8b's input to q/k/v */
    test_rmsnorm_quantize(&d, QUANT_BF16, 3, 2080, true, true);
    test_rmsnorm_quantize(&d, QUANT_Q8_K, 2, 2048, true, true); /* (the two calls) */
    test_swiglu_quantize(&d, QUANT_F16, 1, 14336);              /* llama8b's input to down */
    test_swiglu_quantize(&d, QUANT_BF16, 3, 2080);
    test_swiglu_quantize(&d, QUANT_Q8_1, 8, 4096);
    test_swiglu_quantize(&d, QUANT_Q8_0, 2, 1056);
    test_pointwise(&d);
    struct rope_params normal = {.n_dims = 128, .neox = false, .freq_base = 500000.0f, .freq_scale = 1.0f,
                                 .attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 8192};
    test_rope(&d, "normal", normal, 128, 4);
    struct rope_params neox = normal;
    neox.neox = true, neox.freq_base = 1000000.0f;
    test_rope(&d, "neox", neox, 128, 3);
    struct rope_params partial = neox;
    partial.n_dims = 64;
    test_rope(&d, "partial", partial, 128, 2);
    struct rope_params factors = normal;
    factors.freq_factors = (const float *)1; /* replaced by random factors in the test */
    test_rope(&d, "factors", factors, 128, 2);
    struct rope_params yarn = neox;
    yarn.ext_factor = 1.0f, yarn.freq_scale = 0.25f, yarn.n_ctx_orig = 4096;
    test_rope(&d, "yarn", yarn, 128, 2);
    struct rope_params mrope = neox; /* Qwen2.5-VL-7B's sections */
    mrope.sections[0] = 16, mrope.sections[1] = 24, mrope.sections[2] = 24;
    test_rope(&d, "mrope", mrope, 128, 4);
    test_kv_store(&d);
    return dt_finish(&d);
}
