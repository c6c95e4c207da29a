/* Qwen2.5-VL's vision encoder, computed plainly in float32 on the CPU. The model's own code
 * reorders the patches window by window, attends within each window (or over all in the
 * full-attention layers) and restores the order after the merger; attention does not depend on
 * the order of its tokens, so here the patches keep their order and a window layer attends
 * only among the patches of the same window, which gives the same numbers. The rotary angles
 * of a patch come from its own row and column: the first half of each head's rotated pairs
 * turn with the row, the second half with the column (theta 10000 over head_dim / 2).
 *
 * Matrix products use the quant kernels as the language model's CPU path does (activations
 * put in the weight type's activation format, F32 for F32 weights, F16 for F16, ...), split by
 * output rows over a thread pool when one is given; attention is split by query. */
#include "vision/encoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "quant/quant.h"

uint32_t vision_window_of(const struct vision_hparams *hp, uint32_t grid_w, uint32_t row, uint32_t col) {
    const uint32_t m = hp->spatial_merge, units = hp->window_size / hp->patch_size / m;
    const uint32_t groups_across = (grid_w / m + units - 1) / units;
    return (row / m / units) * groups_across + (col / m / units);
}

struct scratch {
    float *x, *h, *q, *k, *v, *o, *gate, *up, *row, *scores, *bias;
    uint8_t *act;
    uint32_t *window;
    float *cos_t, *sin_t;
};

struct encoder_run {
    const struct mmproj *m;
    struct threadpool *pool;
    struct scratch s;
    uint32_t n;
    const float *patches; /* the input, for embed_part */
    /* the job the pool is running */
    const struct quant_kernels *kernels;
    const struct gguf_tensor *w;
    const float *bias;
    size_t act_bytes;
    uint32_t n_rows;
    float *y;
    bool full;
};

static void run_parts(struct encoder_run *r, threadpool_fn fn) {
    if (r->pool) threadpool_run(r->pool, fn, r);
    else fn(r, 0, 1);
}

static void linear_part(void *ctx, int thread, int n_threads) {
    struct encoder_run *r = ctx;
    const int64_t in = r->w->ne[0], out = r->w->ne[1];
    const size_t row_bytes = quant_row_bytes((enum quant_type)r->w->type, in);
    int64_t begin, end;
    threadpool_range(out, 1, thread, n_threads, &begin, &end);
    for (int64_t o = begin; o < end; o++) {
        const uint8_t *w_row = (const uint8_t *)r->w->data + o * row_bytes;
        const float bias = r->bias ? r->bias[o] : 0.0f;
        uint32_t t = 0;
        if (r->kernels->vec_dot4) /* four tokens per pass over the row, the same bits as vec_dot */
            for (; t + 4 <= r->n_rows; t += 4) {
                float dots[4];
                r->kernels->vec_dot4(in, w_row, r->s.act + t * r->act_bytes, r->act_bytes, dots);
                for (int j = 0; j < 4; j++) r->y[(size_t)(t + j) * out + o] = dots[j] + bias;
            }
        for (; t < r->n_rows; t++) r->y[(size_t)t * out + o] = r->kernels->vec_dot(in, w_row, r->s.act + t * r->act_bytes) + bias;
    }
}

/* y[t][o] = W[o] . x[t] + b[o] for n_rows tokens: W is a GGUF matrix [in, out] of any type the
 * kernels compute with. */
static pshard_status linear(struct encoder_run *r, const struct gguf_tensor *w, const struct gguf_tensor *b, const float *x,
                            uint32_t n_rows, float *y) {
    r->kernels = quant_kernels_get((enum quant_type)w->type);
    if (!r->kernels)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "vision encoder: tensor '%.*s' has a type pshard does not compute with",
                         (int)w->name.len, w->name.data);
    const int64_t in = w->ne[0];
    r->act_bytes = quant_act_row_bytes(r->kernels, in);
    for (uint32_t t = 0; t < n_rows; t++) r->kernels->quantize_act(x + (size_t)t * in, r->s.act + t * r->act_bytes, in);
    r->bias = NULL;
    if (b) {
        CORE_TRY(quant_dequantize_row((enum quant_type)b->type, b->data, r->s.bias, b->ne[0]));
        r->bias = r->s.bias;
    }
    r->w = w;
    r->n_rows = n_rows;
    r->y = y;
    run_parts(r, linear_part);
    return PSHARD_OK;
}

static pshard_status rms_norm(const struct gguf_tensor *gain, const float *x, uint32_t n, uint32_t e, float eps, float *y,
                              float *g) {
    CORE_TRY(quant_dequantize_row((enum quant_type)gain->type, gain->data, g, e));
    for (uint32_t t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * e;
        double ss = 0.0;
        for (uint32_t i = 0; i < e; i++) ss += (double)xt[i] * xt[i];
        const float scale = (float)(1.0 / sqrt(ss / e + eps));
        for (uint32_t i = 0; i < e; i++) y[(size_t)t * e + i] = xt[i] * scale * g[i];
    }
    return PSHARD_OK;
}

/* Rotate each head's pairs (i, i + head_dim/2) by the patch's angle for pair i. */
static void rope_2d(float *x, uint32_t n, uint32_t n_head, uint32_t head_dim, const float *cos_t, const float *sin_t) {
    const uint32_t half = head_dim / 2;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < n_head; h++) {
            float *v = x + ((size_t)t * n_head + h) * head_dim;
            for (uint32_t i = 0; i < half; i++) {
                const float c = cos_t[(size_t)t * half + i], s = sin_t[(size_t)t * half + i];
                const float a = v[i], bb = v[i + half];
                v[i] = a * c - bb * s;
                v[i + half] = bb * c + a * s;
            }
        }
}

/* Attention of every patch over the patches it may see (its window, or all), per head; one
 * row of scores per thread at a time, so no N x N matrix exists. */
static void attend_part(void *ctx, int thread, int n_threads) {
    struct encoder_run *r = ctx;
    const struct vision_hparams *hp = &r->m->hp;
    const struct scratch *s = &r->s;
    const uint32_t hd = hp->head_dim, e = hp->n_embd, n = r->n;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = s->scores + (size_t)thread * n;
    int64_t begin, end;
    threadpool_range(n, 1, thread, n_threads, &begin, &end);
    for (int64_t t = begin; t < end; t++)
        for (uint32_t h = 0; h < hp->n_head; h++) {
            const float *qt = s->q + (size_t)t * e + (size_t)h * hd;
            float max = -INFINITY;
            for (uint32_t j = 0; j < n; j++) {
                if (!r->full && s->window[j] != s->window[t]) {
                    scores[j] = -INFINITY;
                    continue;
                }
                const float *kj = s->k + (size_t)j * e + (size_t)h * hd;
                float dot = 0.0f;
                for (uint32_t i = 0; i < hd; i++) dot += qt[i] * kj[i];
                scores[j] = dot * scale;
                if (scores[j] > max) max = scores[j];
            }
            double sum = 0.0;
            for (uint32_t j = 0; j < n; j++) sum += scores[j] = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - max);
            float *ot = s->o + (size_t)t * e + (size_t)h * hd;
            memset(ot, 0, hd * sizeof *ot);
            for (uint32_t j = 0; j < n; j++) {
                if (scores[j] == 0.0f) continue;
                const float p = (float)(scores[j] / sum);
                const float *vj = s->v + (size_t)j * e + (size_t)h * hd;
                for (uint32_t i = 0; i < hd; i++) ot[i] += p * vj[i];
            }
        }
}

static pshard_status block(struct encoder_run *r, uint32_t il) {
    const struct vision_hparams *hp = &r->m->hp;
    const struct vision_layer *l = &r->m->layers[il];
    struct scratch *s = &r->s;
    const uint32_t e = hp->n_embd, ff = hp->n_ff, n = r->n;
    CORE_TRY(rms_norm(l->ln1, s->x, n, e, hp->eps, s->h, s->row));
    CORE_TRY(linear(r, l->q_w, l->q_b, s->h, n, s->q));
    CORE_TRY(linear(r, l->k_w, l->k_b, s->h, n, s->k));
    CORE_TRY(linear(r, l->v_w, l->v_b, s->h, n, s->v));
    rope_2d(s->q, n, hp->n_head, hp->head_dim, s->cos_t, s->sin_t);
    rope_2d(s->k, n, hp->n_head, hp->head_dim, s->cos_t, s->sin_t);
    r->full = hp->full_attention[il];
    run_parts(r, attend_part);
    CORE_TRY(linear(r, l->o_w, l->o_b, s->o, n, s->h));
    for (size_t i = 0; i < (size_t)n * e; i++) s->x[i] += s->h[i];
    CORE_TRY(rms_norm(l->ln2, s->x, n, e, hp->eps, s->h, s->row));
    CORE_TRY(linear(r, l->gate_w, l->gate_b, s->h, n, s->gate));
    CORE_TRY(linear(r, l->up_w, l->up_b, s->h, n, s->up));
    for (size_t i = 0; i < (size_t)n * ff; i++) s->gate[i] = s->gate[i] / (1.0f + expf(-s->gate[i])) * s->up[i];
    CORE_TRY(linear(r, l->down_w, l->down_b, s->gate, n, s->h));
    for (size_t i = 0; i < (size_t)n * e; i++) s->x[i] += s->h[i];
    return PSHARD_OK;
}

/* Patch embedding: the Conv3d as two [E, 3, P, P] kernels, one per frame of the patch (both
 * dequantized to floats in s->gate first: 2 x E x 3P^2 values). */
static void embed_part(void *ctx, int thread, int n_threads) {
    struct encoder_run *r = ctx;
    const uint32_t e = r->m->hp.n_embd, pp = r->m->hp.patch_size * r->m->hp.patch_size, per_frame = 3 * pp;
    const float *k0 = r->s.gate, *k1 = r->s.gate + (size_t)e * per_frame;
    const float *patches = r->patches;
    int64_t begin, end;
    threadpool_range(r->n, 1, thread, n_threads, &begin, &end);
    for (int64_t t = begin; t < end; t++) {
        const float *patch = patches + (size_t)t * 2 * per_frame; /* [channel][frame][row][col] */
        for (uint32_t o = 0; o < e; o++) {
            const float *a = k0 + (size_t)o * per_frame, *b = k1 + (size_t)o * per_frame;
            double acc = 0.0;
            for (uint32_t c = 0; c < 3; c++)
                for (uint32_t i = 0; i < pp; i++)
                    acc += (double)a[c * pp + i] * patch[(c * 2 + 0) * pp + i] + (double)b[c * pp + i] * patch[(c * 2 + 1) * pp + i];
            r->s.x[(size_t)t * e + o] = (float)acc;
        }
    }
}

static pshard_status embed(struct encoder_run *r, const struct vision_patches *p) {
    const struct mmproj *m = r->m;
    const uint32_t e = m->hp.n_embd, per_frame = 3 * m->hp.patch_size * m->hp.patch_size;
    for (int k = 0; k < VISION_TEMPORAL_PATCH; k++) {
        const size_t kernel_bytes = quant_row_bytes((enum quant_type)m->patch_embd[k]->type, (int64_t)per_frame);
        for (uint32_t o = 0; o < e; o++)
            CORE_TRY(quant_dequantize_row((enum quant_type)m->patch_embd[k]->type,
                                          (const uint8_t *)m->patch_embd[k]->data + o * kernel_bytes,
                                          r->s.gate + ((size_t)k * e + o) * per_frame, per_frame));
    }
    r->patches = p->data;
    run_parts(r, embed_part);
    return PSHARD_OK;
}

/* Each patch's window and rotary angles from its row and column. */
static void positions(const struct vision_hparams *hp, const struct vision_patches *p, struct scratch *s) {
    const uint32_t half = hp->head_dim / 2, quarter = half / 2;
    for (uint64_t t = 0; t < p->n_patches; t++) {
        uint32_t row, col;
        vision_patch_position(p->grid_w, hp->spatial_merge, t, &row, &col);
        s->window[t] = vision_window_of(hp, p->grid_w, row, col);
        for (uint32_t i = 0; i < half; i++) {
            const uint32_t k = i % quarter;
            const double freq = pow(10000.0, -(double)(2 * k) / (double)half);
            const double angle = (i < quarter ? row : col) * freq;
            s->cos_t[t * half + i] = (float)cos(angle);
            s->sin_t[t * half + i] = (float)sin(angle);
        }
    }
}

static void scratch_free(struct scratch *s) {
    free(s->x), free(s->h), free(s->q), free(s->k), free(s->v), free(s->o), free(s->gate), free(s->up);
    free(s->row), free(s->scores), free(s->bias), free(s->act), free(s->window), free(s->cos_t), free(s->sin_t);
}

static pshard_status scratch_alloc(struct scratch *s, const struct vision_hparams *hp, uint32_t n, int n_threads) {
    const uint32_t e = hp->n_embd, widest = hp->n_ff > 4 * e ? hp->n_ff : 4 * e;
    const size_t wide = (size_t)(widest > hp->projection_dim ? widest : hp->projection_dim);
    /* The patch kernels are dequantized into `gate` before the first block. */
    const size_t gate = (size_t)n * widest > (size_t)2 * e * 3 * hp->patch_size * hp->patch_size
                            ? (size_t)n * widest
                            : (size_t)2 * e * 3 * hp->patch_size * hp->patch_size;
    s->x = malloc((size_t)n * e * sizeof(float));
    s->h = malloc((size_t)n * e * sizeof(float));
    s->q = malloc((size_t)n * e * sizeof(float));
    s->k = malloc((size_t)n * e * sizeof(float));
    s->v = malloc((size_t)n * e * sizeof(float));
    s->o = malloc((size_t)n * e * sizeof(float));
    s->gate = malloc(gate * sizeof(float));
    s->up = malloc((size_t)n * widest * sizeof(float));
    s->row = malloc(wide * sizeof(float));
    s->bias = malloc(wide * sizeof(float));
    s->act = malloc((size_t)n * wide * sizeof(float)); /* the widest activation format is F32 */
    s->scores = malloc((size_t)n * (size_t)n_threads * sizeof(float));
    s->window = malloc((size_t)n * sizeof(uint32_t));
    s->cos_t = malloc((size_t)n * hp->head_dim / 2 * sizeof(float));
    s->sin_t = malloc((size_t)n * hp->head_dim / 2 * sizeof(float));
    if (!s->x || !s->h || !s->q || !s->k || !s->v || !s->o || !s->gate || !s->up || !s->row || !s->bias || !s->act ||
        !s->scores || !s->window || !s->cos_t || !s->sin_t)
        return core_fail(PSHARD_ERR_NOMEM, "out of memory encoding %u patches", n);
    return PSHARD_OK;
}

pshard_status vision_progress_report(const struct vision_progress *progress, uint32_t done, uint32_t total) {
    if (progress && progress->fn && progress->fn(progress->user, done, total))
        return core_fail(PSHARD_ERR_INVALID_ARG, "image encoding stopped after %u of %u blocks", done, total);
    return PSHARD_OK;
}

pshard_status vision_encode(const struct mmproj *m, const struct vision_patches *p, struct threadpool *pool,
                            const struct vision_progress *progress, struct vision_embeddings *out) {
    memset(out, 0, sizeof *out);
    const struct vision_hparams *hp = &m->hp;
    const uint32_t e = hp->n_embd, merge2 = hp->spatial_merge * hp->spatial_merge;
    if (p->patch_dim != 3u * VISION_TEMPORAL_PATCH * hp->patch_size * hp->patch_size || p->n_patches == 0 ||
        p->n_patches % merge2 != 0 || p->n_patches > (1u << 20))
        return core_fail(PSHARD_ERR_INVALID_ARG, "vision encoder: %llu patches of %u values do not fit this model",
                         (unsigned long long)p->n_patches, p->patch_dim);
    struct encoder_run r = {.m = m, .pool = pool, .n = (uint32_t)p->n_patches};
    pshard_status st = scratch_alloc(&r.s, hp, r.n, pool ? threadpool_size(pool) : 1);
    if (st == PSHARD_OK) st = embed(&r, p);
    if (st == PSHARD_OK) positions(hp, p, &r.s);
    for (uint32_t il = 0; il < hp->n_layer && st == PSHARD_OK; il++) {
        st = block(&r, il);
        if (st == PSHARD_OK) st = vision_progress_report(progress, il + 1, hp->n_layer + 1);
    }
    /* The merger: RMS norm per patch, then each 2x2 group (consecutive patches) as one 4E
     * vector through Linear, GELU (exact), Linear. */
    const uint32_t n_tokens = r.n / merge2;
    if (st == PSHARD_OK) st = rms_norm(m->post_ln, r.s.x, r.n, e, hp->eps, r.s.h, r.s.row);
    if (st == PSHARD_OK) st = linear(&r, m->mm0_w, m->mm0_b, r.s.h, n_tokens, r.s.gate);
    if (st == PSHARD_OK) {
        for (size_t i = 0; i < (size_t)n_tokens * merge2 * e; i++)
            r.s.gate[i] = 0.5f * r.s.gate[i] * (1.0f + erff(r.s.gate[i] * 0.70710678f));
        out->data = malloc((size_t)n_tokens * hp->projection_dim * sizeof(float));
        if (!out->data) st = core_fail(PSHARD_ERR_NOMEM, "out of memory for %u image tokens", n_tokens);
    }
    if (st == PSHARD_OK) st = linear(&r, m->mm2_w, m->mm2_b, r.s.gate, n_tokens, out->data);
    if (st == PSHARD_OK) st = vision_progress_report(progress, hp->n_layer + 1, hp->n_layer + 1);
    scratch_free(&r.s);
    if (st != PSHARD_OK) {
        vision_embeddings_free(out);
        return st;
    }
    out->n_tokens = n_tokens;
    out->n_embd = hp->projection_dim;
    return PSHARD_OK;
}

void vision_embeddings_free(struct vision_embeddings *e) {
    free(e->data);
    memset(e, 0, sizeof *e);
}
