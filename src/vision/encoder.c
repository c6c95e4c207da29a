/* Qwen2.5-VL's vision encoder, computed plainly in float32 on the CPU. The model's own code
 * reorders the patches window by window, attends within each window (or over all in the
 * full-attention layers) and restores the order after the merger; attention does not depend on
 * the order of its tokens, so here the patches keep their order and a window layer attends
 * only among the patches of the same window, which gives the same numbers. The rotary angles
 * of a patch come from its own row and column: the first half of each head's rotated pairs
 * turn with the row, the second half with the column (theta 10000 over head_dim / 2). */
#include "vision/encoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/quant.h"

uint32_t vision_window_of(const struct vision_hparams *hp, uint32_t grid_w, uint32_t row, uint32_t col) {
    const uint32_t m = hp->spatial_merge, units = hp->window_size / hp->patch_size / m;
    const uint32_t groups_across = (grid_w / m + units - 1) / units;
    return (row / m / units) * groups_across + (col / m / units);
}

/* y[t][o] = W[o] . x[t] + b[o] for n tokens: W is a GGUF matrix [in, out] of any supported
 * type, dequantized one row at a time into `row`. */
static pshard_status linear(const struct gguf_tensor *w, const struct gguf_tensor *b, const float *x, uint32_t n,
                            float *y, float *row) {
    const int64_t in = w->ne[0], out = w->ne[1];
    const size_t row_bytes = quant_row_bytes((enum quant_type)w->type, in);
    float *bias = NULL;
    if (b) {
        bias = malloc((size_t)out * sizeof *bias);
        if (!bias) return core_fail(PSHARD_ERR_NOMEM, "out of memory in the vision encoder");
        pshard_status st = quant_dequantize_row((enum quant_type)b->type, b->data, bias, out);
        if (st != PSHARD_OK) {
            free(bias);
            return st;
        }
    }
    for (int64_t o = 0; o < out; o++) {
        pshard_status st = quant_dequantize_row((enum quant_type)w->type, (const uint8_t *)w->data + o * row_bytes, row, in);
        if (st != PSHARD_OK) {
            free(bias);
            return st;
        }
        for (uint32_t t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * in;
            double acc = 0.0;
            for (int64_t i = 0; i < in; i++) acc += (double)row[i] * xt[i];
            y[(size_t)t * out + o] = (float)acc + (bias ? bias[o] : 0.0f);
        }
    }
    free(bias);
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

struct scratch {
    float *x, *h, *q, *k, *v, *o, *gate, *up, *row, *scores;
    uint32_t *window;
    float *cos_t, *sin_t;
};

/* Attention of every patch over the patches it may see (its window, or all), per head. */
static void attend(const struct vision_hparams *hp, const struct scratch *s, uint32_t n, bool full) {
    const uint32_t hd = hp->head_dim, e = hp->n_embd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < hp->n_head; h++) {
            const float *qt = s->q + (size_t)t * e + (size_t)h * hd;
            float max = -INFINITY;
            for (uint32_t j = 0; j < n; j++) {
                if (!full && s->window[j] != s->window[t]) {
                    s->scores[j] = -INFINITY;
                    continue;
                }
                const float *kj = s->k + (size_t)j * e + (size_t)h * hd;
                float dot = 0.0f;
                for (uint32_t i = 0; i < hd; i++) dot += qt[i] * kj[i];
                s->scores[j] = dot * scale;
                if (s->scores[j] > max) max = s->scores[j];
            }
            double sum = 0.0;
            for (uint32_t j = 0; j < n; j++) sum += s->scores[j] = s->scores[j] == -INFINITY ? 0.0f : expf(s->scores[j] - max);
            float *ot = s->o + (size_t)t * e + (size_t)h * hd;
            memset(ot, 0, hd * sizeof *ot);
            for (uint32_t j = 0; j < n; j++) {
                if (s->scores[j] == 0.0f) continue;
                const float p = (float)(s->scores[j] / sum);
                const float *vj = s->v + (size_t)j * e + (size_t)h * hd;
                for (uint32_t i = 0; i < hd; i++) ot[i] += p * vj[i];
            }
        }
}

static pshard_status block(const struct mmproj *m, uint32_t il, struct scratch *s, uint32_t n) {
    const struct vision_hparams *hp = &m->hp;
    const struct vision_layer *l = &m->layers[il];
    const uint32_t e = hp->n_embd, ff = hp->n_ff;
    CORE_TRY(rms_norm(l->ln1, s->x, n, e, hp->eps, s->h, s->row));
    CORE_TRY(linear(l->q_w, l->q_b, s->h, n, s->q, s->row));
    CORE_TRY(linear(l->k_w, l->k_b, s->h, n, s->k, s->row));
    CORE_TRY(linear(l->v_w, l->v_b, s->h, n, s->v, s->row));
    rope_2d(s->q, n, hp->n_head, hp->head_dim, s->cos_t, s->sin_t);
    rope_2d(s->k, n, hp->n_head, hp->head_dim, s->cos_t, s->sin_t);
    attend(hp, s, n, hp->full_attention[il]);
    CORE_TRY(linear(l->o_w, l->o_b, s->o, n, s->h, s->row));
    for (size_t i = 0; i < (size_t)n * e; i++) s->x[i] += s->h[i];
    CORE_TRY(rms_norm(l->ln2, s->x, n, e, hp->eps, s->h, s->row));
    CORE_TRY(linear(l->gate_w, l->gate_b, s->h, n, s->gate, s->row));
    CORE_TRY(linear(l->up_w, l->up_b, s->h, n, s->up, s->row));
    for (size_t i = 0; i < (size_t)n * ff; i++) s->gate[i] = s->gate[i] / (1.0f + expf(-s->gate[i])) * s->up[i];
    CORE_TRY(linear(l->down_w, l->down_b, s->gate, n, s->h, s->row));
    for (size_t i = 0; i < (size_t)n * e; i++) s->x[i] += s->h[i];
    return PSHARD_OK;
}

/* Patch embedding: the Conv3d as two [E, 3, P, P] kernels, one per frame of the patch. */
static pshard_status embed(const struct mmproj *m, const struct vision_patches *p, struct scratch *s) {
    const uint32_t e = m->hp.n_embd, pp = m->hp.patch_size * m->hp.patch_size, per_frame = 3 * pp;
    float *k0 = malloc((size_t)per_frame * 2 * sizeof *k0);
    if (!k0) return core_fail(PSHARD_ERR_NOMEM, "out of memory in the vision encoder");
    float *k1 = k0 + per_frame;
    const size_t kernel_bytes = quant_row_bytes((enum quant_type)m->patch_embd[0]->type, (int64_t)per_frame);
    for (uint32_t o = 0; o < e; o++) {
        pshard_status st = quant_dequantize_row((enum quant_type)m->patch_embd[0]->type,
                                                (const uint8_t *)m->patch_embd[0]->data + o * kernel_bytes, k0, per_frame);
        if (st == PSHARD_OK)
            st = quant_dequantize_row((enum quant_type)m->patch_embd[1]->type,
                                      (const uint8_t *)m->patch_embd[1]->data + o * kernel_bytes, k1, per_frame);
        if (st != PSHARD_OK) {
            free(k0);
            return st;
        }
        for (uint64_t t = 0; t < p->n_patches; t++) {
            const float *patch = p->data + t * p->patch_dim; /* [channel][frame][row][col] */
            double acc = 0.0;
            for (uint32_t c = 0; c < 3; c++)
                for (uint32_t i = 0; i < pp; i++)
                    acc += (double)k0[c * pp + i] * patch[(c * 2 + 0) * pp + i] + (double)k1[c * pp + i] * patch[(c * 2 + 1) * pp + i];
            s->x[t * e + o] = (float)acc;
        }
    }
    free(k0);
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
    free(s->row), free(s->scores), free(s->window), free(s->cos_t), free(s->sin_t);
}

pshard_status vision_encode(const struct mmproj *m, const struct vision_patches *p, struct vision_embeddings *out) {
    memset(out, 0, sizeof *out);
    const struct vision_hparams *hp = &m->hp;
    const uint32_t e = hp->n_embd, merge2 = hp->spatial_merge * hp->spatial_merge;
    if (p->patch_dim != 3u * VISION_TEMPORAL_PATCH * hp->patch_size * hp->patch_size || p->n_patches == 0 ||
        p->n_patches % merge2 != 0 || p->n_patches > (1u << 20))
        return core_fail(PSHARD_ERR_INVALID_ARG, "vision encoder: %llu patches of %u values do not fit this model",
                         (unsigned long long)p->n_patches, p->patch_dim);
    const uint32_t n = (uint32_t)p->n_patches, widest = hp->n_ff > 4 * e ? hp->n_ff : 4 * e;
    struct scratch s = {0};
    s.x = malloc((size_t)n * e * sizeof(float));
    s.h = malloc((size_t)n * (hp->projection_dim > e ? hp->projection_dim : e) * sizeof(float));
    s.q = malloc((size_t)n * e * sizeof(float));
    s.k = malloc((size_t)n * e * sizeof(float));
    s.v = malloc((size_t)n * e * sizeof(float));
    s.o = malloc((size_t)n * e * sizeof(float));
    s.gate = malloc((size_t)n * widest * sizeof(float));
    s.up = malloc((size_t)n * widest * sizeof(float));
    s.row = malloc((size_t)widest * sizeof(float));
    s.scores = malloc((size_t)n * sizeof(float));
    s.window = malloc((size_t)n * sizeof(uint32_t));
    s.cos_t = malloc((size_t)n * hp->head_dim / 2 * sizeof(float));
    s.sin_t = malloc((size_t)n * hp->head_dim / 2 * sizeof(float));
    pshard_status st = PSHARD_OK;
    if (!s.x || !s.h || !s.q || !s.k || !s.v || !s.o || !s.gate || !s.up || !s.row || !s.scores || !s.window || !s.cos_t ||
        !s.sin_t)
        st = core_fail(PSHARD_ERR_NOMEM, "out of memory encoding %u patches", n);
    if (st == PSHARD_OK) st = embed(m, p, &s);
    if (st == PSHARD_OK) positions(hp, p, &s);
    for (uint32_t il = 0; il < hp->n_layer && st == PSHARD_OK; il++) st = block(m, il, &s, n);
    /* The merger: RMS norm per patch, then each 2x2 group (consecutive patches) as one 4E
     * vector through Linear, GELU (exact), Linear. */
    const uint32_t n_tokens = n / merge2;
    if (st == PSHARD_OK) st = rms_norm(m->post_ln, s.x, n, e, hp->eps, s.h, s.row);
    if (st == PSHARD_OK) st = linear(m->mm0_w, m->mm0_b, s.h, n_tokens, s.gate, s.row);
    if (st == PSHARD_OK) {
        for (size_t i = 0; i < (size_t)n_tokens * merge2 * e; i++)
            s.gate[i] = 0.5f * s.gate[i] * (1.0f + erff(s.gate[i] * 0.70710678f));
        out->data = malloc((size_t)n_tokens * hp->projection_dim * sizeof(float));
        if (!out->data) st = core_fail(PSHARD_ERR_NOMEM, "out of memory for %u image tokens", n_tokens);
    }
    if (st == PSHARD_OK) st = linear(m->mm2_w, m->mm2_b, s.gate, n_tokens, out->data, s.row);
    scratch_free(&s);
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
