/* GPU test: attention over an f16 KV cache in a pool of blocks, as src/exec/kv_cache.h lays it out
 * (each sequence's blocks interleaved with the others' and in no order, the cells no sequence
 * holds NaN), against cpu_attention_heads over the same cells in order. Decode: any batch (tokens
 * of different sequences and positions), GQA groups 1..16 (3 and 10 among them), head sizes
 * 64..256 (80: pieces a lane owns unevenly), contexts from 1 cell to thousands (several KV
 * splits). Prefill: a prompt of one sequence (causal inside the batch, continuing an existing
 * prefix). Errors are relative to max |v|; prefill rounds probabilities to f16, so its tolerance
 * is looser. */
#include "cpu/attention.h"
#include "device_test.h"

enum { BLOCK = CUDA_KV_TILE };

struct cache {
    int64_t n_seq, n_ctx, k_width, v_width;
    uint16_t *k, *v; /* host: [seq][cell][width], in order */
    struct cuda_kv_layer dev;
};

static void cache_init(struct dt *d, struct cache *c, const struct cuda_attn_shape *a, int64_t n_seq, int64_t n_ctx) {
    c->n_seq = n_seq, c->n_ctx = n_ctx;
    c->k_width = (int64_t)a->n_head_kv * a->head_k, c->v_width = (int64_t)a->n_head_kv * a->head_v;
    const size_t kb = 2 * (size_t)(n_seq * n_ctx * c->k_width), vb = 2 * (size_t)(n_seq * n_ctx * c->v_width);
    c->k = dt_malloc(kb), c->v = dt_malloc(vb);
    for (size_t i = 0; i < kb / 2; i++) c->k[i] = half_from_f32(dt_uniform(-1.0f, 1.0f));
    for (size_t i = 0; i < vb / 2; i++) c->v[i] = half_from_f32(dt_uniform(-1.0f, 1.0f));
    /* Block i of sequence s at pool block n - 1 - (i * n_seq + s): the sequences' blocks alternate,
     * each's run backwards, and two blocks no one holds lead the pool. */
    const int64_t per = (n_ctx + BLOCK - 1) / BLOCK, n = n_seq * per + 2;
    int32_t *blocks = dt_malloc(sizeof(int32_t) * (size_t)(n_seq * per));
    uint16_t *pk = dt_malloc(2 * (size_t)(n * BLOCK * c->k_width)), *pv = dt_malloc(2 * (size_t)(n * BLOCK * c->v_width));
    for (int64_t i = 0; i < n * BLOCK * c->k_width; i++) pk[i] = 0x7e00; /* NaN: a cell read wrongly shows */
    for (int64_t i = 0; i < n * BLOCK * c->v_width; i++) pv[i] = 0x7e00;
    for (int64_t s = 0; s < n_seq; s++)
        for (int64_t i = 0; i < per; i++) {
            const int64_t b = n - 1 - (i * n_seq + s), cells = n_ctx - i * BLOCK < BLOCK ? n_ctx - i * BLOCK : BLOCK;
            blocks[s * per + i] = (int32_t)b;
            memcpy(pk + b * BLOCK * c->k_width, c->k + (s * n_ctx + i * BLOCK) * c->k_width, 2 * (size_t)(cells * c->k_width));
            memcpy(pv + b * BLOCK * c->v_width, c->v + (s * n_ctx + i * BLOCK) * c->v_width, 2 * (size_t)(cells * c->v_width));
        }
    c->dev = (struct cuda_kv_layer){dt_upload(d, pk, 2 * (size_t)(n * BLOCK * c->k_width)),
                                    dt_upload(d, pv, 2 * (size_t)(n * BLOCK * c->v_width)),
                                    dt_upload(d, blocks, sizeof(int32_t) * (size_t)(n_seq * per)), (int32_t)per, BLOCK};
    free(blocks), free(pk), free(pv);
}

static void reference(const struct cuda_attn_shape *a, const struct cache *c, const float *q, const int32_t *seq,
                      const int32_t *pos, int64_t n_tokens, float *out) {
    const struct cpu_attn_shape s = {a->n_head, a->n_head_kv, a->head_k, a->head_v, a->scale};
    for (int64_t t = 0; t < n_tokens; t++) {
        const struct cpu_kv_view kv = cpu_kv_contiguous(c->k + seq[t] * c->n_ctx * c->k_width, c->v + seq[t] * c->n_ctx * c->v_width);
        cpu_attention_heads(&s, q + t * a->n_head * a->head_k, &kv, pos[t] + 1, 0, a->n_head, out + t * a->n_head * a->head_v);
    }
}

/* DECODE_CAPTURED: the decode kernel sized for more cells than any token has, as a captured
 * decode step is sized for the whole context (each token's slices cut from its own length). */
enum kernel { DECODE, DECODE_CAPTURED, PREFILL, PREFILL_ONE_SLICE };

static const char *slices_label(const struct cuda_attn_shape *a, enum kernel kernel, int64_t n_tokens, int32_t max_len) {
    if (kernel == PREFILL_ONE_SLICE) return ", one slice";
    if (kernel == DECODE_CAPTURED) return ", sized for 16K cells";
    return kernel == PREFILL && cuda_attention_prefill_work_bytes(a, n_tokens, max_len) ? ", sliced" : "";
}

/* The decode kernel with its output also converted (Q8_0, Q8_1, F16, BF16): the same floats as
 * without, and the bytes cuda_quantize makes of them. */
static void quantized_matches(struct dt *d, const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *dq,
                              const int32_t *dseq, const int32_t *dpos, int64_t n_tokens, int32_t max_len,
                              const float *dout, void *work, size_t wb) {
    const int64_t width = (int64_t)a->n_head * a->head_v, o_n = n_tokens * width;
    const enum quant_type types[] = {QUANT_Q8_0, QUANT_Q8_1, QUANT_F16, QUANT_BF16};
    for (int i = 0; i < 4; i++) {
        const size_t qb = quant_row_bytes(types[i], o_n);
        float *dout2 = dt_alloc(d, 4 * (size_t)o_n);
        void *dq8 = dt_alloc(d, qb), *dq8_ref = dt_alloc(d, qb);
        DT_CHECK(cuda_attention_decode_quantized(a, kv, dq, dseq, dpos, n_tokens, max_len, dout2, types[i], dq8, work, wb,
                                                 d->s));
        DT_CHECK(cuda_quantize(types[i], dout, width, n_tokens, dq8_ref, d->s));
        float *o1 = dt_malloc(4 * (size_t)o_n), *o2 = dt_malloc(4 * (size_t)o_n);
        uint8_t *q1 = dt_malloc(qb), *q2 = dt_malloc(qb);
        dt_download(d, o1, dout, 4 * (size_t)o_n), dt_download(d, o2, dout2, 4 * (size_t)o_n);
        dt_download(d, q1, dq8_ref, qb), dt_download(d, q2, dq8, qb);
        dt_case(d, memcmp(o1, o2, 4 * (size_t)o_n) == 0 && memcmp(q1, q2, qb) == 0,
                "attention decode heads %d x %d, %lld tokens, its output quantized to %s in the merge: the bits of "
                "quantizing it after", a->n_head, a->head_v, (long long)n_tokens, quant_type_name(types[i]));
        free(o1), free(o2), free(q1), free(q2);
    }
}

static void run_case(struct dt *d, const struct cuda_attn_shape *a, int64_t n_ctx, const int32_t *seq,
                     const int32_t *pos, int64_t n_tokens, enum kernel kernel) {
    const bool prefill = kernel == PREFILL || kernel == PREFILL_ONE_SLICE;
    const size_t mark = cuda_arena_mark(&d->arena);
    struct cache c;
    cache_init(d, &c, a, 3, n_ctx);
    const int64_t q_n = n_tokens * a->n_head * a->head_k, o_n = n_tokens * a->n_head * a->head_v;
    float *q = dt_malloc(4 * (size_t)q_n), *want = dt_malloc(4 * (size_t)o_n), *got = dt_malloc(4 * (size_t)o_n);
    dt_fill(q, q_n, -2.0f, 2.0f);
    reference(a, &c, q, seq, pos, n_tokens, want);
    float *dq = dt_upload(d, q, 4 * (size_t)q_n), *dout = dt_alloc(d, 4 * (size_t)o_n);
    int32_t *dseq = dt_upload(d, seq, 4 * (size_t)n_tokens), *dpos = dt_upload(d, pos, 4 * (size_t)n_tokens);
    int32_t max_len = 0;
    for (int64_t t = 0; t < n_tokens; t++) max_len = pos[t] + 1 > max_len ? pos[t] + 1 : max_len;
    if (kernel == DECODE_CAPTURED) max_len = 16384;
    if (prefill) {
        const size_t wb = cuda_attention_prefill_work_bytes(a, n_tokens, max_len);
        void *work = kernel == PREFILL_ONE_SLICE ? NULL : dt_alloc(d, wb ? wb : 1);
        DT_CHECK(cuda_attention_prefill(a, &c.dev, dq, seq[0], dpos, n_tokens, max_len, dout, work, wb, d->s));
    } else {
        const size_t wb = cuda_attention_decode_work_bytes(a, n_tokens, max_len);
        void *work = dt_alloc(d, wb);
        DT_CHECK(cuda_attention_decode(a, &c.dev, dq, dseq, dpos, n_tokens, max_len, dout, work, wb, d->s));
        if (cuda_attention_decode_quantizes(a, QUANT_Q8_1))
            quantized_matches(d, a, &c.dev, dq, dseq, dpos, n_tokens, max_len, dout, work, wb);
    }
    dt_download(d, got, dout, 4 * (size_t)o_n);
    int64_t where;
    const double tol = prefill ? 2e-3 : 2e-5;
    const double e = dt_max_err(got, want, o_n, 1.0, &where); /* |v| <= 1 */
    dt_case(d, e <= tol, "attention %-7s heads %2d/%2d x %3d/%3d, %3lld tokens, up to %5d cells%s: max err %.2e (tol %.0e)",
            prefill ? "prefill" : "decode", a->n_head, a->n_head_kv, a->head_k, a->head_v, (long long)n_tokens, max_len,
            slices_label(a, kernel, n_tokens, max_len), e, tol);
    if (!(e <= tol))
        printf("    token %lld head %lld dim %lld: got %.7g want %.7g\n", (long long)(where / (a->n_head * a->head_v)),
               (long long)(where / a->head_v % a->n_head), (long long)(where % a->head_v), got[where], want[where]);
    cuda_arena_reset(&d->arena, mark);
    free(c.k), free(c.v), free(q), free(want), free(got);
}

static void decode_batch(struct dt *d, int n_head, int n_head_kv, int head_k, int head_v, int64_t n_ctx) {
    const struct cuda_attn_shape a = {n_head, n_head_kv, head_k, head_v, 1.0f / sqrtf((float)head_k)};
    /* Mixed batch: first cell only, short, long, the last cell, other sequences. */
    const int32_t seq[] = {0, 1, 2, 0, 1, 2, 0};
    const int32_t pos[] = {0, 5, (int32_t)n_ctx - 1, (int32_t)n_ctx / 2, 63, 64, (int32_t)n_ctx - 2};
    run_case(d, &a, n_ctx, seq, pos, 1, DECODE);
    run_case(d, &a, n_ctx, seq + 2, pos + 2, 1, DECODE);
    run_case(d, &a, n_ctx, seq, pos, 7, DECODE);
    run_case(d, &a, n_ctx, seq, pos, 1, DECODE_CAPTURED);
    run_case(d, &a, n_ctx, seq + 2, pos + 2, 1, DECODE_CAPTURED);
    run_case(d, &a, n_ctx, seq, pos, 7, DECODE_CAPTURED);
}

/* A decode step split with the host: the CPU's partial sums of cells [0, first) of each token
 * (cpu_attention_merge_sums over the units a decode step cuts), placed in work, merged with the
 * GPU's over [first, pos]: the whole attention, and its Q8_1 bytes those of quantizing it after. */
static void split_with_host(struct dt *d, int n_head, int n_head_kv, int head, int64_t n_ctx, int32_t first,
                            int64_t n_tokens) {
    const struct cuda_attn_shape a = {n_head, n_head_kv, head, head, 1.0f / sqrtf((float)head)};
    const struct cpu_attn_shape cs = {n_head, n_head_kv, head, head, a.scale};
    const size_t mark = cuda_arena_mark(&d->arena);
    struct cache c;
    cache_init(d, &c, &a, 3, n_ctx);
    const int32_t seq[] = {2, 0}, pos[] = {(int32_t)n_ctx - 1, (int32_t)n_ctx - 100};
    const int64_t q_n = n_tokens * n_head * head, o_n = n_tokens * n_head * head, sums_n = n_tokens * n_head * (head + 2);
    float *q = dt_malloc(4 * (size_t)q_n), *want = dt_malloc(4 * (size_t)o_n), *got = dt_malloc(4 * (size_t)o_n);
    float *sums = dt_malloc(4 * (size_t)sums_n);
    dt_fill(q, q_n, -2.0f, 2.0f);
    reference(&a, &c, q, seq, pos, n_tokens, want);
    float *partial = dt_malloc(sizeof(float) * (size_t)cpu_attention_partial_floats_max(&cs));
    for (int64_t t = 0; t < n_tokens; t++) {
        struct cpu_attn_units u;
        cpu_attention_units(&cs, 1, first, true, 3, &u);
        const struct cpu_kv_view kv = cpu_kv_contiguous(c.k + seq[t] * c.n_ctx * c.k_width, c.v + seq[t] * c.n_ctx * c.v_width);
        const int64_t cells = first;
        for (int64_t unit = 0; unit < u.count; unit++) {
            int64_t t0, t1;
            int h0, h1, split;
            cpu_attention_unit(&cs, &u, unit, &t0, &t1, &h0, &h1, &split);
            cpu_attention_run_unit(&cs, &u, t0, t1, h0, h1, split, q + t * q_n / n_tokens, &kv, &cells, partial, NULL);
        }
        cpu_attention_merge_sums(&cs, &u, partial, sums + t * sums_n / n_tokens);
    }
    float *dq = dt_upload(d, q, 4 * (size_t)q_n), *dout = dt_alloc(d, 4 * (size_t)o_n), *dout2 = dt_alloc(d, 4 * (size_t)o_n);
    int32_t *dseq = dt_upload(d, seq, 4 * (size_t)n_tokens), *dpos = dt_upload(d, pos, 4 * (size_t)n_tokens);
    const int32_t max_len = (int32_t)n_ctx;
    const size_t wb = cuda_attention_split_work_bytes(&a, n_tokens, max_len, first), qb = quant_row_bytes(QUANT_Q8_1, o_n);
    void *work = dt_alloc(d, wb), *dq8 = dt_alloc(d, qb), *dq8_ref = dt_alloc(d, qb);
    DT_CHECK(cuda_attention_decode_from(&a, &c.dev, dq, dseq, dpos, n_tokens, max_len, first, work, wb, d->s));
    DT_CHECK(cuda_copy_h2d(cuda_attention_host_sums(&a, n_tokens, max_len, first, work), sums, 4 * (size_t)sums_n, d->s));
    DT_CHECK(cuda_attention_merge_host(&a, n_tokens, max_len, first, dout, QUANT_F32, NULL, work, d->s));
    DT_CHECK(cuda_attention_merge_host(&a, n_tokens, max_len, first, dout2, QUANT_Q8_1, dq8, work, d->s));
    DT_CHECK(cuda_quantize(QUANT_Q8_1, dout, (int64_t)n_head * head, n_tokens, dq8_ref, d->s));
    dt_download(d, got, dout, 4 * (size_t)o_n);
    int64_t where;
    const double e = dt_max_err(got, want, o_n, 1.0, &where);
    dt_case(d, e <= 1e-4, "attention decode heads %d/%d x %d, %lld tokens over %lld cells, the first %d attended by the CPU: "
            "max err %.2e (tol 1e-4)", n_head, n_head_kv, head, (long long)n_tokens, (long long)n_ctx, first, e);
    uint8_t *q1 = dt_malloc(qb), *q2 = dt_malloc(qb);
    dt_download(d, q1, dq8_ref, qb), dt_download(d, q2, dq8, qb);
    dt_case(d, memcmp(q1, q2, qb) == 0, "the same, its output quantized to Q8_1 in the merge: the bytes of quantizing it after");
    cuda_arena_reset(&d->arena, mark);
    free(c.k), free(c.v), free(q), free(want), free(got), free(sums), free(partial), free(q1), free(q2);
}

static void prefill(struct dt *d, int n_head, int n_head_kv, int head, int64_t n_tokens, int32_t first_pos) {
    const struct cuda_attn_shape a = {n_head, n_head_kv, head, head, 1.0f / sqrtf((float)head)};
    const int64_t n_ctx = first_pos + n_tokens + 5;
    int32_t *seq = dt_malloc(4 * (size_t)n_tokens), *pos = dt_malloc(4 * (size_t)n_tokens);
    for (int64_t t = 0; t < n_tokens; t++) seq[t] = 1, pos[t] = first_pos + (int32_t)t;
    run_case(d, &a, n_ctx, seq, pos, n_tokens, PREFILL);
    if (cuda_attention_prefill_work_bytes(&a, n_tokens, first_pos + (int32_t)n_tokens)) /* the cache in slices */
        run_case(d, &a, n_ctx, seq, pos, n_tokens, PREFILL_ONE_SLICE);
    run_case(d, &a, n_ctx, seq, pos, n_tokens < 40 ? n_tokens : 40, DECODE); /* the decode kernel on a prompt */
    free(seq), free(pos);
}

/* The vision encoder's attention over tiles (windows of `window` patches, or every patch), f32
 * and on tensor cores, against softmax attention in double over each tile's keys. */
static void vision(struct dt *d, int n_head, int head_dim, int n, int window, bool tensor_cores) {
    const size_t mark = cuda_arena_mark(&d->arena);
    const int64_t width = (int64_t)n_head * head_dim, total = n * width;
    float *q = dt_malloc(4 * (size_t)total), *k = dt_malloc(4 * (size_t)total), *v = dt_malloc(4 * (size_t)total);
    float *want = dt_malloc(4 * (size_t)total), *got = dt_malloc(4 * (size_t)total);
    dt_fill(q, total, -2.0f, 2.0f), dt_fill(k, total, -1.0f, 1.0f), dt_fill(v, total, -1.0f, 1.0f);
    struct cuda_vision_tile tiles[256];
    int n_tiles = 0;
    for (int w0 = 0; w0 < n; w0 += window) {
        const int w_len = n - w0 < window ? n - w0 : window;
        for (int q0 = 0; q0 < w_len && n_tiles < 256; q0 += CUDA_VISION_TILE_QUERIES)
            tiles[n_tiles++] = (struct cuda_vision_tile){w0 + q0, w_len - q0 < CUDA_VISION_TILE_QUERIES ? w_len - q0
                                                                                                      : CUDA_VISION_TILE_QUERIES,
                                                         w0, w_len};
    }
    const double scale = 1.0 / sqrt((double)head_dim);
    double *p = dt_malloc(sizeof(double) * (size_t)n);
    for (int t = 0; t < n_tiles; t++)
        for (int r = 0; r < tiles[t].q_count; r++)
            for (int h = 0; h < n_head; h++) {
                const float *qr = q + (int64_t)(tiles[t].q_first + r) * width + h * head_dim;
                double mx = -INFINITY, sum = 0;
                for (int c = 0; c < tiles[t].k_count; c++) {
                    const float *kr = k + (int64_t)(tiles[t].k_first + c) * width + h * head_dim;
                    double dot = 0;
                    for (int i = 0; i < head_dim; i++) dot += (double)qr[i] * kr[i];
                    p[c] = dot * scale, mx = p[c] > mx ? p[c] : mx;
                }
                for (int c = 0; c < tiles[t].k_count; c++) sum += p[c] = exp(p[c] - mx);
                for (int i = 0; i < head_dim; i++) {
                    double o = 0;
                    for (int c = 0; c < tiles[t].k_count; c++) o += p[c] * v[(int64_t)(tiles[t].k_first + c) * width + h * head_dim + i];
                    want[(int64_t)(tiles[t].q_first + r) * width + h * head_dim + i] = (float)(o / sum);
                }
            }
    float *dq = dt_upload(d, q, 4 * (size_t)total);
    DT_CHECK(cuda_vision_attention(dq, dt_upload(d, k, 4 * (size_t)total), dt_upload(d, v, 4 * (size_t)total),
                                   dt_upload(d, tiles, sizeof tiles[0] * (size_t)n_tiles), n_tiles, n_head, head_dim,
                                   (float)scale, tensor_cores, d->s));
    dt_download(d, got, dq, 4 * (size_t)total);
    int64_t where;
    const double tol = tensor_cores ? 2e-3 : 2e-5, e = dt_max_err(got, want, total, 1.0, &where); /* |v| <= 1 */
    dt_case(d, e <= tol, "vision attention %s, %d heads of %d, %d patches in windows of %d (%d tiles): max err %.2e (tol %.0e)",
            tensor_cores ? "on tensor cores" : "in f32", n_head, head_dim, n, window, n_tiles, e, tol);
    cuda_arena_reset(&d->arena, mark);
    free(q), free(k), free(v), free(want), free(got), free(p);
}

int main(void) {
    struct dt d;
    dt_init(&d, "test_cuda_attention", 1u << 30);
    dt_seed(4);
    for (int tc = 0; tc < 2; tc++) {
        vision(&d, 3, 80, 300, 100, tc); /* windows: 64 + 36 queries a window */
        vision(&d, 2, 80, 777, 777, tc); /* full attention over every patch */
        vision(&d, 4, 32, 130, 64, tc);  /* the tiny encoder's heads */
    }
    decode_batch(&d, 8, 2, 64, 64, 300);
    decode_batch(&d, 32, 8, 128, 128, 4096);
    decode_batch(&d, 32, 4, 128, 128, 1000);
    decode_batch(&d, 16, 1, 128, 128, 777);    /* group of 16 */
    decode_batch(&d, 4, 4, 96, 96, 200);       /* no GQA, head 96 */
    decode_batch(&d, 8, 2, 256, 256, 500);     /* head 256: eight dims a lane */
    decode_batch(&d, 12, 4, 80, 80, 300);      /* a group of 3, head 80: pieces not a multiple of the lanes' */
    decode_batch(&d, 40, 4, 128, 128, 600);    /* a group of 10: two blocks a KV head */
    split_with_host(&d, 32, 4, 128, 5000, 2048, 1); /* qwen30b's heads */
    split_with_host(&d, 32, 8, 128, 3000, 1024, 2);
    split_with_host(&d, 8, 2, 64, 40000, 16384, 1);  /* runs of the CPU's longer than 512 cells */
    prefill(&d, 8, 2, 64, 100, 0);
    prefill(&d, 32, 8, 128, 300, 0);
    prefill(&d, 16, 4, 128, 77, 150);          /* continuing a prefix */
    prefill(&d, 4, 1, 96, 65, 3);
    /* Less than a tile of queries at the end of a long cache, as steps of a few dozen tokens
     * now run it (cuda_attention_prefill_pays): qwen30b's and llama8b's groups. */
    prefill(&d, 32, 4, 128, 40, 3000);
    prefill(&d, 32, 8, 128, 20, 1500);
    /* Slices of the cache: three tiles (the last part full) over 9000 cells, and a cache that
     * ends inside a slice's last tile. */
    prefill(&d, 32, 4, 128, 130, 9000);
    prefill(&d, 8, 2, 64, 50, 2000);
    /* Which kernel: 2 tokens per query head of a KV head's group, 8 at the least, a full tile
     * at the most. */
    static const struct { int n_head, n_head_kv, tokens; bool prompt; } pick[] = {
        {32, 4, 15, false}, {32, 4, 16, true}, {32, 8, 7, false},  {32, 8, 8, true},  {32, 32, 7, false},
        {32, 32, 8, true},  {64, 2, 63, false}, {64, 2, 64, true}, {32, 4, 1, false}};
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
        const struct cuda_attn_shape a = {pick[i].n_head, pick[i].n_head_kv, 128, 128, 1};
        dt_case(&d, cuda_attention_prefill_pays(&a, pick[i].tokens) == pick[i].prompt,
                "attention kernel for %d tokens, heads %d/%d: %s", pick[i].tokens, pick[i].n_head, pick[i].n_head_kv,
                pick[i].prompt ? "prompt" : "split-KV");
    }
    return dt_finish(&d);
}
