/* Qwen2.5-VL's vision encoder on the GPU (encoder_gpu.h says how its memory goes). The patches
 * are put in window order as they go up, so a window is a contiguous range of rows and each
 * attention tile names its keys by a range; the merger's tokens come back in window order and
 * are put back in raster order on the host. Products with the weights, norms, SwiGLU and adds are
 * the language model's kernels; a block's products and MLP run over chunks of patches, so only
 * x, q, k and v are N rows long. */
#include "vision/encoder_gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/quant.h"
#include "vision/encoder_gpu_units.h"

struct vision_gpu {
    const struct mmproj *m;
    uint32_t n_units;
    struct cuda_pinned *mapped; /* the file's parts, registered so copies from them run pinned */
    uint32_t n_mapped;
    struct cuda_pinned vectors; /* the f32 parts, in unit order */
    const void **host;          /* [n_units][VISION_UNIT_PARTS]: where each part is copied from */
};

void vision_gpu_free(struct vision_gpu *g) {
    if (!g) return;
    for (uint32_t i = 0; i < g->n_mapped; i++) cuda_pinned_release(&g->mapped[i]);
    free(g->mapped);
    cuda_pinned_release(&g->vectors);
    free(g->host);
    free(g);
}

/* The patch kernel in a patch's layout: out[o][c][k][i] = frame k's kernel [o][c][i]. */
static pshard_status patch_kernel(const struct mmproj *m, float *out) {
    const uint32_t e = m->hp.n_embd, pp = m->hp.patch_size * m->hp.patch_size, per_frame = 3 * pp;
    float *row = malloc(sizeof(float) * per_frame);
    if (!row) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    pshard_status st = PSHARD_OK;
    for (int k = 0; k < VISION_TEMPORAL_PATCH && st == PSHARD_OK; k++) {
        const struct gguf_tensor *t = m->patch_embd[k];
        const size_t row_bytes = quant_row_bytes((enum quant_type)t->type, per_frame);
        for (uint32_t o = 0; o < e && st == PSHARD_OK; o++) {
            st = quant_dequantize_row((enum quant_type)t->type, (const uint8_t *)t->data + o * row_bytes, row, per_frame);
            for (uint32_t c = 0; c < 3 && st == PSHARD_OK; c++)
                memcpy(out + (size_t)o * 2 * per_frame + ((size_t)c * VISION_TEMPORAL_PATCH + k) * pp, row + c * pp,
                       sizeof(float) * pp);
        }
    }
    free(row);
    return st;
}

pshard_status vision_gpu_create(const struct mmproj *m, struct vision_gpu **out) {
    *out = NULL;
    struct vision_gpu *g = calloc(1, sizeof *g);
    if (!g) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    g->m = m;
    g->n_units = m->hp.n_layer + 2;
    g->host = calloc((size_t)g->n_units * VISION_UNIT_PARTS, sizeof *g->host);
    const uint32_t n_parts = gguf_part_count(m->file);
    g->mapped = calloc(n_parts ? n_parts : 1, sizeof *g->mapped);
    if (!g->host || !g->mapped) {
        vision_gpu_free(g);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    }
    size_t total = 0;
    for (uint32_t u = 0; u < g->n_units; u++) {
        struct vision_gpu_part parts[VISION_UNIT_PARTS];
        const uint32_t n = vision_gpu_unit_parts(m, u, parts);
        for (uint32_t i = 0; i < n; i++)
            if (parts[i].kind != VISION_PART_RAW) total += cuda_align(vision_gpu_part_bytes(m, &parts[i]));
    }
    pshard_status st = cuda_host_alloc(total, &g->vectors);
    size_t at = 0;
    for (uint32_t u = 0; u < g->n_units && st == PSHARD_OK; u++) {
        struct vision_gpu_part parts[VISION_UNIT_PARTS];
        const uint32_t n = vision_gpu_unit_parts(m, u, parts);
        for (uint32_t i = 0; i < n && st == PSHARD_OK; i++) {
            const struct gguf_tensor *t = parts[i].t;
            if (parts[i].kind == VISION_PART_RAW) {
                g->host[u * VISION_UNIT_PARTS + i] = t->data;
                continue;
            }
            float *dst = (float *)((uint8_t *)g->vectors.ptr + at);
            g->host[u * VISION_UNIT_PARTS + i] = dst;
            at += cuda_align(vision_gpu_part_bytes(m, &parts[i]));
            st = parts[i].kind == VISION_PART_PATCH ? patch_kernel(m, dst)
                                                    : quant_dequantize_row((enum quant_type)t->type, t->data, dst, t->ne[0]);
        }
    }
    /* The matrices are copied from the file's mapping: pinned where the driver registers it
     * (else the copies run from pageable memory, slower but the same). */
    for (uint32_t p = 0; p < n_parts && st == PSHARD_OK; p++) {
        size_t size;
        const void *base = gguf_part_image(m->file, p, &size);
        st = cuda_host_register((void *)base, size, false, &g->mapped[p]);
        g->n_mapped = p + 1;
    }
    if (st != PSHARD_OK) {
        vision_gpu_free(g);
        return core_fail_context(st, "the GPU vision encoder: ");
    }
    *out = g;
    return PSHARD_OK;
}

/* ---- one encoding */

struct run {
    struct vision_gpu *g;
    const struct mmproj *m;
    const struct vision_gpu_layout *l;
    struct cuda_ctx *cuda;
    cuda_stream s, copy;
    float *x, *q, *k, *v, *rope, *h, *a, *b;
    struct cuda_vision_tile *tiles;
    void *work;
    uint8_t *staging;
    cuda_event filled[2], freed[2];
    bool slot_used[2];
};

static bool is_merger(const struct run *r, uint32_t unit) { return unit == r->m->hp.n_layer + 1; }

/* Where unit `unit` goes: its slot, or the whole area for the merger. */
static uint8_t *unit_slot(const struct run *r, uint32_t unit) {
    return is_merger(r, unit) ? r->staging : r->staging + (unit % r->l->n_slots) * r->l->slot_bytes;
}

/* Copy unit `unit` up on the copy stream once the compute that read its slot (or, the merger,
 * every slot) is done. */
static pshard_status fill(struct run *r, uint32_t unit) {
    for (uint32_t k = 0; k < r->l->n_slots; k++)
        if (r->slot_used[k] && (is_merger(r, unit) || k == unit % r->l->n_slots)) CORE_TRY(cuda_stream_wait(r->copy, r->freed[k]));
    struct vision_gpu_part parts[VISION_UNIT_PARTS];
    const uint32_t n = vision_gpu_unit_parts(r->m, unit, parts);
    uint8_t *dst = unit_slot(r, unit);
    for (uint32_t i = 0; i < n; i++) {
        const size_t bytes = vision_gpu_part_bytes(r->m, &parts[i]);
        CORE_TRY(cuda_copy_h2d(dst, r->g->host[unit * VISION_UNIT_PARTS + i], bytes, r->copy));
        dst += cuda_align(bytes);
    }
    return cuda_event_record(r->filled[is_merger(r, unit) ? 0 : unit % r->l->n_slots], r->copy);
}

/* The compute stream waits for unit `unit` to arrive; at[i] is where its part i is. */
static pshard_status acquire(struct run *r, uint32_t unit, const uint8_t **at) {
    CORE_TRY(cuda_stream_wait(r->s, r->filled[is_merger(r, unit) ? 0 : unit % r->l->n_slots]));
    struct vision_gpu_part parts[VISION_UNIT_PARTS];
    const uint32_t n = vision_gpu_unit_parts(r->m, unit, parts);
    const uint8_t *p = unit_slot(r, unit);
    for (uint32_t i = 0; i < n; i++) {
        at[i] = p;
        p += cuda_align(vision_gpu_part_bytes(r->m, &parts[i]));
    }
    return PSHARD_OK;
}

/* The compute reading unit `unit` is enqueued: its slot may be refilled after it. */
static pshard_status release(struct run *r, uint32_t unit) {
    const uint32_t k = unit % r->l->n_slots;
    if (is_merger(r, unit)) return PSHARD_OK; /* the last */
    CORE_TRY(cuda_event_record(r->freed[k], r->s));
    r->slot_used[k] = true;
    return PSHARD_OK;
}

/* Unit `used` is enqueued: its slot takes the unit n_slots further on; after the last block,
 * the merger takes the whole area. */
static pshard_status refill(struct run *r, uint32_t used) {
    const uint32_t last_block = r->m->hp.n_layer;
    if (used + r->l->n_slots <= last_block) CORE_TRY(fill(r, used + r->l->n_slots));
    if (used == last_block) CORE_TRY(fill(r, last_block + 1));
    return PSHARD_OK;
}

/* y [rows][t's rows] = x . W^T + bias, W the copy of tensor t at w. */
static pshard_status linear(struct run *r, const struct gguf_tensor *t, const uint8_t *w, const uint8_t *bias, const float *x,
                            int64_t rows, float *y) {
    const struct cuda_matrix mat = vision_gpu_matrix(t, w);
    CORE_TRY(cuda_matmul(r->cuda, &mat, x, rows, y, mat.n_rows, r->work, r->l->bytes[VISION_GPU_WORK], r->s));
    return cuda_add_bias(y, (const float *)bias, rows, mat.n_rows, r->s);
}

/* Patch embedding, chunk by chunk: the chunk's patches gathered in window order on the host. */
static pshard_status embed(struct run *r, const struct vision_patches *p, const uint32_t *order, float *gather) {
    const uint8_t *kernel;
    CORE_TRY(acquire(r, 0, &kernel));
    const uint32_t e = r->m->hp.n_embd, pd = p->patch_dim;
    for (uint32_t c = 0, c0, rows; c < r->l->n_chunks; c++) {
        vision_gpu_chunk(r->l, c, &c0, &rows);
        if (c > 0) CORE_TRY(cuda_stream_sync(r->s)); /* the last chunk's copy has read gather */
        for (uint32_t i = 0; i < rows; i++)
            memcpy(gather + (size_t)i * pd, p->data + (size_t)order[c0 + i] * pd, sizeof(float) * pd);
        CORE_TRY(cuda_copy_h2d(r->a, gather, sizeof(float) * pd * rows, r->s));
        CORE_TRY(cuda_vision_patch_embed(r->a, (const float *)kernel, rows, e, pd, r->x + (size_t)c0 * e, r->s));
    }
    return release(r, 0);
}

static pshard_status block(struct run *r, uint32_t il) {
    const struct vision_hparams *hp = &r->m->hp;
    const struct vision_layer *ly = &r->m->layers[il];
    const uint8_t *at[VISION_UNIT_PARTS];
    CORE_TRY(acquire(r, il + 1, at));
    const uint8_t *const *w = at, *const *vec = at + VISION_BLOCK_MATRICES;
    /* vec: ln1, ln2, then the biases of q, k, v, out, gate, up, down */
    const uint32_t e = hp->n_embd, n = r->l->n_patches;
    for (uint32_t c = 0, c0, rows; c < r->l->n_chunks; c++) {
        vision_gpu_chunk(r->l, c, &c0, &rows);
        const size_t off = (size_t)c0 * e;
        CORE_TRY(cuda_rmsnorm(r->x + off, (const float *)vec[0], r->h, rows, e, hp->eps, r->s));
        CORE_TRY(linear(r, ly->q_w, w[0], vec[2], r->h, rows, r->q + off));
        CORE_TRY(linear(r, ly->k_w, w[1], vec[3], r->h, rows, r->k + off));
        CORE_TRY(linear(r, ly->v_w, w[2], vec[4], r->h, rows, r->v + off));
    }
    CORE_TRY(cuda_vision_rope(r->q, r->rope, n, (int)hp->n_head, (int)hp->head_dim, r->s));
    CORE_TRY(cuda_vision_rope(r->k, r->rope, n, (int)hp->n_head, (int)hp->head_dim, r->s));
    const bool full = hp->full_attention[il];
    /* On tensor cores where the layer's weights are 16-bit or narrower: its products are rounded
     * as coarsely (an F32 encoder keeps f32 attention). */
    const bool tensor_cores = ly->q_w->type != QUANT_F32;
    CORE_TRY(cuda_vision_attention(r->q, r->k, r->v, r->tiles + (full ? r->l->n_window_tiles : 0),
                                   full ? r->l->n_full_tiles : r->l->n_window_tiles, (int)hp->n_head, (int)hp->head_dim,
                                   1.0f / sqrtf((float)hp->head_dim), tensor_cores, r->s));
    for (uint32_t c = 0, c0, rows; c < r->l->n_chunks; c++) {
        vision_gpu_chunk(r->l, c, &c0, &rows);
        const size_t off = (size_t)c0 * e;
        CORE_TRY(linear(r, ly->o_w, w[3], vec[5], r->q + off, rows, r->h));
        CORE_TRY(cuda_add(r->x + off, r->h, (int64_t)rows * e, r->s));
        CORE_TRY(cuda_rmsnorm(r->x + off, (const float *)vec[1], r->h, rows, e, hp->eps, r->s));
        CORE_TRY(linear(r, ly->gate_w, w[4], vec[6], r->h, rows, r->a));
        CORE_TRY(linear(r, ly->up_w, w[5], vec[7], r->h, rows, r->b));
        CORE_TRY(cuda_swiglu(r->a, r->b, r->a, (int64_t)rows * hp->n_ff, r->s));
        CORE_TRY(linear(r, ly->down_w, w[6], vec[8], r->a, rows, r->h));
        CORE_TRY(cuda_add(r->x + off, r->h, (int64_t)rows * e, r->s));
    }
    return release(r, il + 1);
}

/* The merger, chunk by chunk: RMS norm, each 4 consecutive rows as one, Linear, GELU, Linear;
 * its tokens go down (in window order) into merged. */
static pshard_status merger(struct run *r, float *merged) {
    const struct vision_hparams *hp = &r->m->hp;
    const uint8_t *at[VISION_UNIT_PARTS];
    CORE_TRY(acquire(r, hp->n_layer + 1, at));
    /* at: mm.0, mm.2, post_ln, mm.0's bias, mm.2's bias */
    const uint32_t e = hp->n_embd, d = hp->projection_dim, group = hp->spatial_merge * hp->spatial_merge;
    for (uint32_t c = 0, c0, rows; c < r->l->n_chunks; c++) {
        vision_gpu_chunk(r->l, c, &c0, &rows);
        const uint32_t tokens = rows / group;
        CORE_TRY(cuda_rmsnorm(r->x + (size_t)c0 * e, (const float *)at[2], r->h, rows, e, hp->eps, r->s));
        CORE_TRY(linear(r, r->m->mm0_w, at[0], at[3], r->h, tokens, r->a));
        CORE_TRY(cuda_gelu_erf(r->a, (int64_t)tokens * r->m->mm0_w->ne[1], r->s));
        CORE_TRY(linear(r, r->m->mm2_w, at[1], at[4], r->a, tokens, r->b));
        CORE_TRY(cuda_copy_d2h(merged + (size_t)(c0 / group) * d, r->b, sizeof(float) * tokens * d, r->s));
    }
    return release(r, hp->n_layer + 1);
}

/* Device buffer `which` where the layout put it. */
static void *buffer(const struct vision_gpu_layout *l, const struct cuda_region *regions, enum vision_gpu_buffer which) {
    return regions[l->region[which]].base + l->offset[which];
}

/* The rotary table in window order: position i is patch order[i], whose first half of pairs
 * turns by its row and second by its column, as encoder.c's. */
static void rope_table(const struct vision_hparams *hp, const struct vision_patches *p, const uint32_t *order, float *cs) {
    const uint32_t half = hp->head_dim / 2, quarter = half / 2;
    for (uint64_t i = 0; i < p->n_patches; i++) {
        uint32_t row, col;
        vision_patch_position(p->grid_w, hp->spatial_merge, order[i], &row, &col);
        for (uint32_t j = 0; j < half; j++) {
            const double freq = pow(10000.0, -(double)(2 * (j % quarter)) / (double)half);
            const double angle = (j < quarter ? row : col) * freq;
            cs[(i * half + j) * 2] = (float)cos(angle);
            cs[(i * half + j) * 2 + 1] = (float)sin(angle);
        }
    }
}

static pshard_status encode(struct run *r, const struct vision_patches *p, const struct vision_windows *win, float *host_rope,
                            struct cuda_vision_tile *host_tiles, float *gather, float *merged,
                            const struct vision_progress *progress) {
    const struct vision_hparams *hp = &r->m->hp;
    rope_table(hp, p, win->order, host_rope);
    vision_tiles_fill(win, false, host_tiles);
    vision_tiles_fill(win, true, host_tiles + r->l->n_window_tiles);
    CORE_TRY(cuda_copy_h2d(r->rope, host_rope, sizeof(float) * p->n_patches * hp->head_dim, r->s));
    CORE_TRY(cuda_copy_h2d(r->tiles, host_tiles, sizeof *host_tiles * (r->l->n_window_tiles + r->l->n_full_tiles), r->s));
    for (uint32_t u = 0; u < r->l->n_slots && u <= hp->n_layer; u++) CORE_TRY(fill(r, u));
    CORE_TRY(embed(r, p, win->order, gather));
    CORE_TRY(refill(r, 0));
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        CORE_TRY(block(r, il));
        CORE_TRY(refill(r, il + 1));
        if (progress && progress->fn) {
            CORE_TRY(cuda_stream_sync(r->s));
            CORE_TRY(vision_progress_report(progress, il + 1, hp->n_layer + 1));
        }
    }
    CORE_TRY(merger(r, merged));
    return cuda_stream_sync(r->s);
}

pshard_status vision_encode_gpu(struct vision_gpu *g, const struct vision_patches *p, const struct vision_gpu_layout *layout,
                                struct cuda_ctx *cuda, const struct cuda_region *regions,
                                const struct vision_progress *progress, struct vision_embeddings *out) {
    memset(out, 0, sizeof *out);
    const struct mmproj *m = g->m;
    const struct vision_hparams *hp = &m->hp;
    if (p->patch_dim != vision_gpu_patch_dim(hp) || p->n_patches != layout->n_patches ||
        p->n_patches != (uint64_t)p->grid_h * p->grid_w)
        return core_fail(PSHARD_ERR_INVALID_ARG, "vision encoder: %llu patches of %u values do not fit this model or plan",
                         (unsigned long long)p->n_patches, p->patch_dim);
    struct vision_windows win;
    CORE_TRY(vision_windows_make(hp, p->grid_h, p->grid_w, &win));
    struct run r = {.g = g, .m = m, .l = layout, .cuda = cuda, .s = cuda_ctx_compute_stream(cuda),
                    .copy = cuda_ctx_copy_stream(cuda)};
    r.x = buffer(layout, regions, VISION_GPU_X), r.q = buffer(layout, regions, VISION_GPU_Q);
    r.k = buffer(layout, regions, VISION_GPU_K), r.v = buffer(layout, regions, VISION_GPU_V);
    r.rope = buffer(layout, regions, VISION_GPU_ROPE), r.tiles = buffer(layout, regions, VISION_GPU_TILES);
    r.h = buffer(layout, regions, VISION_GPU_H), r.a = buffer(layout, regions, VISION_GPU_A);
    r.b = buffer(layout, regions, VISION_GPU_B), r.work = buffer(layout, regions, VISION_GPU_WORK);
    r.staging = buffer(layout, regions, VISION_GPU_STAGING);
    const uint32_t n_tokens = layout->n_patches / (hp->spatial_merge * hp->spatial_merge);
    float *host_rope = malloc(sizeof(float) * p->n_patches * hp->head_dim);
    struct cuda_vision_tile *host_tiles = malloc(sizeof *host_tiles * (layout->n_window_tiles + layout->n_full_tiles));
    float *gather = malloc(sizeof(float) * layout->chunk_rows * p->patch_dim);
    float *merged = malloc(sizeof(float) * n_tokens * hp->projection_dim);
    out->data = malloc(sizeof(float) * n_tokens * hp->projection_dim);
    pshard_status st = host_rope && host_tiles && gather && merged && out->data
                           ? PSHARD_OK
                           : core_fail(PSHARD_ERR_NOMEM, "out of memory encoding %llu patches",
                                       (unsigned long long)p->n_patches);
    for (int i = 0; i < 2 && st == PSHARD_OK; i++) {
        st = cuda_event_create(false, &r.filled[i]);
        if (st == PSHARD_OK) st = cuda_event_create(false, &r.freed[i]);
    }
    if (st == PSHARD_OK) st = encode(&r, p, &win, host_rope, host_tiles, gather, merged, progress);
    /* Nothing may still run in the lent memory once it is handed back, failed or not. */
    cuda_stream_sync(r.s);
    cuda_stream_sync(r.copy);
    for (int i = 0; i < 2; i++) cuda_event_destroy(r.filled[i]), cuda_event_destroy(r.freed[i]);
    if (st == PSHARD_OK) st = vision_progress_report(progress, hp->n_layer + 1, hp->n_layer + 1);
    if (st == PSHARD_OK) /* window order back to raster order: token j of window order is group order[4j] / 4 */
        for (uint32_t j = 0; j < n_tokens; j++) {
            const uint32_t group = hp->spatial_merge * hp->spatial_merge, token = win.order[(size_t)j * group] / group;
            memcpy(out->data + (size_t)token * hp->projection_dim, merged + (size_t)j * hp->projection_dim,
                   sizeof(float) * hp->projection_dim);
        }
    free(host_rope), free(host_tiles), free(gather), free(merged);
    vision_windows_free(&win);
    if (st != PSHARD_OK) {
        vision_embeddings_free(out);
        return st;
    }
    out->n_tokens = n_tokens;
    out->n_embd = hp->projection_dim;
    return PSHARD_OK;
}
