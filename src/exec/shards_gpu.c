/* One step following the plan's tier for its size: the batch goes up, GPU shards run on the
 * compute stream in order (each reads and updates the residual stream g->x, as on the CPU),
 * CPU shards on the thread pool with the residual stream crossing PCIe where the place changes,
 * and the logits of the outputs come back. Streamed shards are read in place from host memory
 * (small steps) or staged through the slot ring (prompt steps; static steps pass over the units
 * they run on the CPU, so a layer's attention is copied while the CPU computes the FFN before
 * it): the copy stream fills slot j while the compute stream works on slot j-1, each slot
 * refilled only after the event its last reader recorded. MoE shards split their experts
 * between VRAM, the stream and the CPU, and dense FFNs may split their rows between the stream
 * and the CPU, the CPU's share computed while the GPU computes its own. An all-GPU step waits
 * once, for the logits. */
#include <string.h>

#include "core/timer.h"
#include "cpu/attention.h"
#include "exec/exec_gpu_internal.h"

/* A product's weight bytes in the step's statistics (a view's own columns). */
static void count_weights(struct exec_ctx *ctx, const struct cuda_matrix *m) {
    ctx->stats.weight_bytes_read += (uint64_t)m->n_rows * quant_row_bytes(m->type, m->n_cols);
}

static pshard_status project(struct exec_ctx *ctx, struct exec_gpu *g, const struct cuda_matrix *m, const float *x,
                             int64_t n, float *y) {
    count_weights(ctx, m);
    return cuda_matmul(g->cuda, m, x, n, y, m->n_rows, g->work, g->work_bytes, g->stream);
}

/* y += x . m^T: up to 8 tokens the projection adds into the residual stream itself; above, it
 * goes through g->proj. */
static pshard_status project_add(struct exec_ctx *ctx, struct exec_gpu *g, const struct cuda_matrix *m, const float *x,
                                 int64_t n, float *y) {
    count_weights(ctx, m);
    return cuda_matmul_add(g->cuda, m, x, n, y, g->proj, g->work, g->work_bytes, g->stream);
}

/* Whether project_each quantizes its input once for all the matrices: at matrix-vector sizes,
 * where their activations share a format and width. */
static bool quantizes_once(const struct cuda_matrix *const *m, int count, int64_t n) {
    bool once = n <= CUDA_MATVEC_MAX_TOKENS;
    for (int i = 1; i < count; i++)
        once = once && cuda_act_type(m[i]->type) == cuda_act_type(m[0]->type) && m[i]->n_cols == m[0]->n_cols;
    return once;
}

/* Whether a norm of n rows of d writes its output for products with activations `at` in the same
 * launch (Q8_0, Q8_1, F16 and BF16 at matrix-vector sizes). */
static bool norm_quantizes(enum quant_type at, int64_t n, int64_t d) {
    return n <= CUDA_MATVEC_MAX_TOKENS && cuda_writes_act(at) && d % 32 == 0;
}

/* g->xn = RMSNorm(g->x) (weights w) for the products by m; where they take it converted once (to
 * Q8_0, Q8_1, F16 or BF16), that conversion into g->work in the same launch (*quantized: tell
 * project_each). */
static pshard_status norm_for(struct exec_gpu *g, const float *w, const struct cuda_matrix *const *m, int count, int64_t n,
                              int64_t d, float eps, bool *quantized) {
    const enum quant_type at = cuda_act_type(m[0]->type);
    *quantized = quantizes_once(m, count, n) && norm_quantizes(at, n, d);
    if (*quantized) return cuda_rmsnorm_quantize(at, g->x, w, g->xn, NULL, g->work, n, d, eps, g->stream);
    return cuda_rmsnorm(g->x, w, g->xn, n, d, eps, g->stream);
}

/* Projections of one input by several matrices (q, k and v; gate and up): at matrix-vector
 * sizes, where their activations share a format, the input is quantized once for all (or was,
 * into g->work: `quantized`, by norm_for), and matrices of one format and width run in one
 * launch. */
static pshard_status project_each(struct exec_ctx *ctx, struct exec_gpu *g, const struct cuda_matrix *const *m, int count,
                                  const float *x, int64_t n, float *const *y, bool quantized) {
    if (!quantizes_once(m, count, n)) {
        for (int i = 0; i < count; i++) CORE_TRY(project(ctx, g, m[i], x, n, y[i]));
        return PSHARD_OK;
    }
    const void *acts = x; /* f32 activations are read as they are */
    if (quantized) acts = g->work;
    else if (cuda_act_type(m[0]->type) != QUANT_F32) {
        CORE_TRY(cuda_quantize(cuda_act_type(m[0]->type), x, m[0]->n_cols, n, g->work, g->stream));
        acts = g->work;
    }
    bool one_launch = count <= CUDA_MATVEC_MAX_PARTS;
    for (int i = 0; i < count; i++) {
        count_weights(ctx, m[i]);
        one_launch = one_launch && m[i]->type == m[0]->type && m[i]->row_bytes == m[0]->row_bytes;
    }
    if (one_launch) return cuda_matvec_each(m, count, acts, (int)n, y, false, g->stream);
    for (int i = 0; i < count; i++) CORE_TRY(cuda_matvec(m[i], acts, (int)n, y[i], m[i]->n_rows, g->stream));
    return PSHARD_OK;
}

/* The step's new cells of a layer whose KV cache is in host memory, from their copy in a slot down
 * to the host's pool (the slot holds the pool's rows at their places): one copy of K and one of
 * V for each run of consecutive positions of a sequence whose rows follow one another. */
static pshard_status kv_cells_down(struct exec_ctx *ctx, struct exec_gpu *g, int il, const struct cuda_kv_layer *kv,
                                   const struct exec_batch *b) {
    const int64_t kw = ctx->kv.k_width, vw = ctx->kv.v_width;
    for (int32_t t = 0, end; t < b->n_tokens; t = end) {
        const int32_t s = b->seq[t], from = b->pos[t];
        for (end = t + 1; end < b->n_tokens && b->seq[end] == s && b->pos[end] == from + (end - t);) end++;
        for (int32_t pos = from, n; pos < from + (end - t); pos += n) {
            int64_t row;
            n = kv_cache_run(&ctx->kv, s, pos, from + (end - t), &row);
            CORE_TRY(cuda_copy_d2h(kv_cache_k(&ctx->kv, il, row), kv->k + row * kw, sizeof(uint16_t) * (size_t)(n * kw), g->stream));
            CORE_TRY(cuda_copy_d2h(kv_cache_v(&ctx->kv, il, row), kv->v + row * vw, sizeof(uint16_t) * (size_t)(n * vw), g->stream));
        }
    }
    return PSHARD_OK;
}

static pshard_status split_attention(struct exec_ctx *ctx, struct exec_gpu *g, int il, const struct gpu_layer *l,
                                     const struct cuda_kv_layer *kv, const struct exec_batch *b);

/* At matrix-vector sizes wo's input comes quantized from the attention's last launch, into
 * g->proj (free until a step of more tokens): its format, QUANT_F32 where it does not. */
static enum quant_type wo_input_type(const struct exec_ctx *ctx, const struct exec_gpu *g, const struct gpu_layer *l,
                                     int64_t n) {
    const enum quant_type at = cuda_act_type(l->wo.type);
    const size_t q_bytes = (size_t)n * cuda_act_row_bytes(at, l->wo.n_cols);
    const bool quantized = !l->bo && n <= CUDA_MATVEC_MAX_TOKENS && l->wo.n_cols % 32 == 0 &&
                           cuda_attention_decode_quantizes(&g->attn_shape, at) &&
                           q_bytes <= sizeof(float) * (size_t)n * (size_t)ctx->model->hp.n_embd;
    return quantized ? at : QUANT_F32;
}

/* wo over the attention's output (g->attn, or quantized in g->proj), added into the residual
 * stream (with bo where the layer has one). */
static pshard_status attn_out(struct exec_ctx *ctx, struct exec_gpu *g, const struct cuda_matrix *wo, const float *bo,
                              int64_t n, bool quantized) {
    const int64_t d = ctx->model->hp.n_embd;
    if (quantized) {
        float *x = g->x;
        count_weights(ctx, wo);
        return cuda_matvec_each(&wo, 1, g->proj, (int)n, &x, true, g->stream);
    }
    if (!bo) return project_add(ctx, g, wo, g->attn, n, g->x);
    CORE_TRY(project(ctx, g, wo, g->attn, n, g->proj));
    CORE_TRY(cuda_add_bias(g->proj, bo, n, d, g->stream));
    return cuda_add(g->x, g->proj, n * d, g->stream);
}

/* A layer's attention over `kv`: its cache in VRAM, or (plan.kv_stream) its cells carried in a
 * slot, whose new cells then go down to the host's cache. */
static pshard_status attn_shard(struct exec_ctx *ctx, struct exec_gpu *g, int il, const struct gpu_layer *l,
                               const struct cuda_kv_layer *kv, const struct exec_batch *b) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t n = b->n_tokens, d = hp->n_embd, q_width = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t k_width = ctx->kv.k_width, v_width = ctx->kv.v_width;
    cuda_stream s = g->stream;
    const struct cuda_matrix *qkv[3] = {&l->wq, &l->wk, &l->wv};
    float *const qkv_out[3] = {g->q, g->k, g->v};
    bool quantized;
    CORE_TRY(norm_for(g, l->attn_norm, qkv, 3, n, d, hp->rms_eps, &quantized));
    CORE_TRY(project_each(ctx, g, qkv, 3, g->xn, n, qkv_out, quantized));
    if (l->bq) CORE_TRY(cuda_add_bias(g->q, l->bq, n, q_width, s));
    if (l->bk) CORE_TRY(cuda_add_bias(g->k, l->bk, n, k_width, s));
    if (l->bv) CORE_TRY(cuda_add_bias(g->v, l->bv, n, v_width, s));
    /* Every layer rotates by the same positions: the table is made once a step. */
    const int32_t *rope_pos = rope_is_multi(&ctx->w.rope) ? g->rope_pos : g->pos;
    if (!g->rope_ready) CORE_TRY(cuda_rope_table(&ctx->w.rope, g->rope_freqs, rope_pos, ctx->params.n_batch, n, g->rope_cs, s));
    g->rope_ready = true;
    const int n_head = (int)hp->n_head, n_head_kv = (int)hp->n_head_kv, head = (int)hp->head_dim_k;
    if (l->q_norm && l->k_norm) { /* q's and k's heads normed and rotated, and K and V stored, in one launch */
        CORE_TRY(cuda_norm_rope_qk_store(&ctx->w.rope, g->rope_cs, g->q, l->q_norm, n_head, g->k, l->k_norm, n_head_kv,
                                         hp->rms_eps, n, head, kv, g->v, (int)hp->head_dim_v, g->seq, g->pos, s));
    } else if (!l->q_norm && !l->k_norm && n <= CUDA_MATVEC_MAX_TOKENS) {
        /* the same without norms, at matrix-vector sizes (a block a head; a prompt rotates a thread a pair) */
        CORE_TRY(cuda_rope_qk_store(&ctx->w.rope, g->rope_cs, g->q, n_head, g->k, n_head_kv, n, head, kv, g->v,
                                    (int)hp->head_dim_v, g->seq, g->pos, s));
    } else {
        CORE_TRY(l->q_norm ? cuda_norm_rope(&ctx->w.rope, g->rope_cs, g->q, l->q_norm, hp->rms_eps, n, n_head, head, s)
                           : cuda_rope_apply(&ctx->w.rope, g->rope_cs, g->q, n, n_head, head, s));
        CORE_TRY(l->k_norm ? cuda_norm_rope(&ctx->w.rope, g->rope_cs, g->k, l->k_norm, hp->rms_eps, n, n_head_kv, head, s)
                           : cuda_rope_apply(&ctx->w.rope, g->rope_cs, g->k, n, n_head_kv, head, s));
        CORE_TRY(cuda_kv_store(kv, g->k, g->v, k_width, v_width, g->seq, g->pos, n, s));
    }
    if (kv != &g->kv[il]) CORE_TRY(kv_cells_down(ctx, g, il, kv, b));
    if (kv != &g->kv[il] && g->kv_cpu_cells > 0) return split_attention(ctx, g, il, l, kv, b);

    /* A prompt of one sequence of a query tile or more goes to the tensor-core kernel; anything
     * else to the split-KV decode kernel, which takes any mix of sequences. */
    int32_t max_len = 0;
    bool one_seq = true;
    for (int32_t t = 0; t < n; t++) {
        max_len = b->pos[t] + 1 > max_len ? b->pos[t] + 1 : max_len;
        one_seq = one_seq && b->seq[t] == b->seq[0];
    }
    if (g->capturing) max_len = ctx->params.n_ctx; /* a replayed bound must not depend on the position */
    if (one_seq && cuda_attention_prefill_pays(&g->attn_shape, n)) {
        CORE_TRY(cuda_attention_prefill(&g->attn_shape, kv, g->q, b->seq[0], g->pos, n, max_len, g->attn, g->work,
                                        g->work_bytes, s));
        return attn_out(ctx, g, &l->wo, l->bo, n, false);
    }
    const enum quant_type at = wo_input_type(ctx, g, l, n);
    const bool wo_quantized = at != QUANT_F32;
    CORE_TRY(cuda_attention_decode_quantized(&g->attn_shape, kv, g->q, g->seq, g->pos, n, max_len, g->attn, at,
                                             wo_quantized ? (void *)g->proj : NULL, g->work, g->work_bytes, s));
    return attn_out(ctx, g, &l->wo, l->bo, n, wo_quantized);
}

/* The FFN of g->xn added into the residual stream g->x (quantized: g->xn is in g->work already,
 * as norm_for leaves it). */
static pshard_status swiglu_ffn(struct exec_ctx *ctx, struct exec_gpu *g, const struct cuda_matrix *gate,
                                const struct cuda_matrix *up, const struct cuda_matrix *down, int64_t n, bool quantized) {
    const struct cuda_matrix *gate_up[2] = {gate, up};
    float *const gate_up_out[2] = {g->gate, g->up};
    CORE_TRY(project_each(ctx, g, gate_up, 2, g->xn, n, gate_up_out, quantized));
    /* At matrix-vector sizes SwiGLU writes down's input converted, into g->work (free once gate
     * and up have read it), and down adds into the residual stream from there. */
    const enum quant_type at = cuda_act_type(down->type);
    if (n <= CUDA_MATVEC_MAX_TOKENS && cuda_writes_act(at) && gate->n_rows % 32 == 0 &&
        cuda_act_row_bytes(at, gate->n_rows) * (size_t)n <= g->work_bytes) {
        CORE_TRY(cuda_swiglu_quantize(at, g->gate, g->up, gate->n_rows, n, g->work, g->stream));
        float *x = g->x;
        count_weights(ctx, down);
        return cuda_matvec_each(&down, 1, g->work, (int)n, &x, true, g->stream);
    }
    CORE_TRY(cuda_swiglu(g->gate, g->up, g->gate, n * gate->n_rows, g->stream));
    return project_add(ctx, g, down, g->gate, n, g->x);
}

static pshard_status ffn_shard(struct exec_ctx *ctx, struct exec_gpu *g, const struct gpu_layer *l,
                              const struct exec_batch *b) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t n = b->n_tokens, d = hp->n_embd;
    const struct cuda_matrix *gate_up[2] = {&l->ffn_gate, &l->ffn_up};
    bool quantized;
    CORE_TRY(norm_for(g, l->ffn_norm, gate_up, 2, n, d, hp->rms_eps, &quantized));
    return swiglu_ffn(ctx, g, &l->ffn_gate, &l->ffn_up, &l->ffn_down, n, quantized);
}

/* ---- the staging ring */

/* A staged dense shard's matrices in slot order, each at the next aligned offset: the layer's
 * device views (to bind; mats may be NULL) and the tensors they come from (to copy). */
static int dense_unit(struct gpu_layer *l, const struct layer_weights *w, enum shard_kind kind,
                      struct cuda_matrix **mats, const struct gguf_tensor **tensors) {
    struct cuda_matrix *attn[] = {&l->wq, &l->wk, &l->wv, &l->wo}, *ffn[] = {&l->ffn_gate, &l->ffn_up, &l->ffn_down};
    const struct gguf_tensor *attn_t[] = {w->wq, w->wk, w->wv, w->wo}, *ffn_t[] = {w->ffn_gate, w->ffn_up, w->ffn_down};
    const bool is_attn = kind == SHARD_ATTN;
    int n = 0;
    for (int m = 0; m < (is_attn ? 4 : 3); m++) {
        if (!(is_attn ? attn_t : ffn_t)[m]) continue;
        if (mats) mats[n] = (is_attn ? attn : ffn)[m];
        tensors[n++] = (is_attn ? attn_t : ffn_t)[m];
    }
    return n;
}

/* An MoE piece's three expert tensors and the bytes of experts [first, end) of each. */
static void expert_unit(const struct layer_weights *w, uint32_t first, uint32_t end, const struct gguf_tensor **tensors,
                        size_t *offset, size_t *bytes) {
    const struct gguf_tensor *t[] = {w->gate_exps, w->up_exps, w->down_exps};
    for (int m = 0; m < 3; m++) {
        const size_t per = t[m]->n_bytes / (size_t)t[m]->ne[2];
        tensors[m] = t[m];
        offset[m] = per * first;
        bytes[m] = per * (end - first);
    }
}

void expert_slot_bases(const struct layer_weights *w, uint32_t first, uint32_t end, const uint8_t *slot,
                       uintptr_t base[3]) {
    const struct gguf_tensor *tensors[3];
    size_t offset[3], bytes[3];
    expert_unit(w, first, end, tensors, offset, bytes);
    for (int m = 0; m < 3; m++) base[m] = (uintptr_t)(slot + unit_matrix_at(bytes, m)) - (uintptr_t)offset[m];
}

/* A layer's KV cells in a slot, from `at` (past its matrices): a copy of its pool's rows of K,
 * then of V, addressed through the block table as the pool in VRAM is (plan.kv_stream). */
static struct cuda_kv_layer slot_kv(const struct exec_ctx *ctx, const struct exec_gpu *g, uint8_t *at) {
    const struct kv_cache *kv = &ctx->kv;
    struct cuda_kv_layer l = {(uint16_t *)at, NULL, g->kv_table, kv->max_blocks, KV_BLOCK_CELLS};
    l.v = (uint16_t *)(at + cuda_align(sizeof(uint16_t) * (size_t)(kv_cache_cells(kv) * kv->k_width)));
    return l;
}

/* The blocks the step's sequences hold below their lengths, of a layer whose KV is on the host,
 * copied into the slot on the copy stream (the step adds its own cells there): each block once,
 * though sequences share it, a run of consecutive blocks a copy; but the blocks of the cells the
 * CPU attends (g->kv_cpu_cells, a whole number of blocks). */
static pshard_status kv_cells_up(struct exec_ctx *ctx, struct exec_gpu *g, int il, uint8_t *at) {
    const struct kv_cache *kv = &ctx->kv;
    const struct cuda_kv_layer l = slot_kv(ctx, g, at);
    for (int32_t i = 0; i < g->n_step_seq; i++) {
        const int32_t s = g->step_seq[i], *blocks = kv_cache_blocks(kv, s);
        for (int32_t j = (int32_t)(g->kv_cpu_cells / KV_BLOCK_CELLS); j < (kv->seq_len[s] + KV_BLOCK_CELLS - 1) / KV_BLOCK_CELLS; j++)
            g->kv_marks[blocks[j]] = true;
    }
    for (int32_t b = 0, n; b < kv->n_blocks; b += n) {
        n = 1;
        if (!g->kv_marks[b]) continue;
        while (b + n < kv->n_blocks && g->kv_marks[b + n]) n++;
        memset(g->kv_marks + b, 0, (size_t)n * sizeof *g->kv_marks);
        const int64_t row = (int64_t)b * KV_BLOCK_CELLS, cells = (int64_t)n * KV_BLOCK_CELLS;
        const size_t kb = sizeof(uint16_t) * (size_t)(cells * kv->k_width), vb = sizeof(uint16_t) * (size_t)(cells * kv->v_width);
        CORE_TRY(cuda_copy_h2d(l.k + row * kv->k_width, kv_cache_k(kv, il, row), kb, g->copy));
        CORE_TRY(cuda_copy_h2d(l.v + row * kv->v_width, kv_cache_v(kv, il, row), vb, g->copy));
        ctx->stats.streamed_bytes += kb + vb;
    }
    return PSHARD_OK;
}

/* Copy unit j into its slot on the copy stream, once the compute that read the slot before is done. */
static pshard_status ring_fill(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t j) {
    const struct plan_unit *u = &g->units[j];
    const struct shard *s = &ctx->model->shards[u->shard];
    const struct layer_weights *w = &ctx->w.layers[s->layer];
    const uint32_t slot = j % ctx->active->n_slots;
    if (g->slot_used[slot]) CORE_TRY(cuda_stream_wait(g->copy, g->freed[slot]));
    const struct gguf_tensor *tensors[4];
    size_t offset[4] = {0}, bytes[4];
    int n = 3;
    if (s->kind == SHARD_MOE) {
        expert_unit(w, u->first, u->end, tensors, offset, bytes);
    } else {
        n = dense_unit(&g->layers[s->layer], w, s->kind, NULL, tensors);
        for (int m = 0; m < n; m++) bytes[m] = tensors[m]->n_bytes;
    }
    for (int m = 0; m < n; m++)
        CORE_TRY(cuda_copy_h2d(g->slot[slot] + unit_matrix_at(bytes, m), (const uint8_t *)tensors[m]->data + offset[m],
                               bytes[m], g->copy));
    const size_t at = unit_matrix_at(bytes, n);
    ctx->stats.streamed_bytes += at;
    if (s->kind == SHARD_ATTN && !ctx->active->kv_gpu[s->layer]) CORE_TRY(kv_cells_up(ctx, g, s->layer, g->slot[slot] + at));
    return cuda_event_record(g->filled[slot], g->copy);
}

/* Unit j in a ring step: copied if the step's tier runs it on the GPU; passed over otherwise
 * (its slot is not touched). */
static pshard_status ring_fill_for_step(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t j) {
    if (plan_tier_stages(ctx->model, g->ring_tier, &g->units[j])) return ring_fill(ctx, g, j);
    g->ring_passed = true;
    return PSHARD_OK;
}

/* Past the units the step's tier does not stage, each making way for a fill further ahead. */
static pshard_status ring_pass(struct exec_ctx *ctx, struct exec_gpu *g) {
    while (g->next_use < g->n_units && !plan_tier_stages(ctx->model, g->ring_tier, &g->units[g->next_use])) {
        g->next_use++;
        if (g->next_fill < g->n_units) CORE_TRY(ring_fill_for_step(ctx, g, g->next_fill++));
    }
    return PSHARD_OK;
}

static pshard_status ring_start(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier) {
    /* Steps before may have read lent units: the fills wait for them. */
    for (uint32_t k = 0; k < ctx->active->n_slots; k++) {
        CORE_TRY(cuda_event_record(g->freed[k], g->stream));
        g->slot_used[k] = true;
    }
    g->lent_ready = false;
    g->unit_released = false;
    g->ring_tier = tier;
    g->ring_passed = false;
    g->next_use = 0;
    for (g->next_fill = 0; g->next_fill < g->n_units && g->next_fill < ctx->active->n_slots; g->next_fill++)
        CORE_TRY(ring_fill_for_step(ctx, g, g->next_fill));
    return ring_pass(ctx, g);
}

/* The next unit's slot, for the compute stream (which waits until it is filled). */
static pshard_status ring_acquire(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t shard, uint32_t first,
                                  uint8_t **slot) {
    if (g->next_use >= g->n_units || g->units[g->next_use].shard != shard || g->units[g->next_use].first != first)
        return core_fail(PSHARD_ERR_INTERNAL, "staging ring out of step at shard %u", shard);
    const uint32_t k = g->next_use % ctx->active->n_slots;
    CORE_TRY(cuda_stream_wait(g->stream, g->filled[k]));
    *slot = g->slot[k];
    return PSHARD_OK;
}

/* The compute that reads the current unit is enqueued: free its slot and refill it. */
static pshard_status ring_release(struct exec_ctx *ctx, struct exec_gpu *g) {
    const uint32_t k = g->next_use % ctx->active->n_slots;
    CORE_TRY(cuda_event_record(g->freed[k], g->stream));
    g->slot_used[k] = true;
    g->next_use++;
    if (g->next_fill < g->n_units) CORE_TRY(ring_fill_for_step(ctx, g, g->next_fill++));
    return ring_pass(ctx, g);
}

/* A dense shard (attention or FFN) computed from the copy of its matrices in a slot. */
static pshard_status dense_in_slot(struct exec_ctx *ctx, struct exec_gpu *g, const struct shard *shard, uint8_t *slot,
                                   const struct exec_batch *b) {
    struct gpu_layer view = g->layers[shard->layer];
    struct cuda_matrix *mats[4];
    const struct gguf_tensor *tensors[4];
    const int n = dense_unit(&view, &ctx->w.layers[shard->layer], shard->kind, mats, tensors);
    size_t bytes[4];
    for (int m = 0; m < n; m++) bytes[m] = tensors[m]->n_bytes;
    for (int m = 0; m < n; m++) {
        mats[m]->data = slot + unit_matrix_at(bytes, m);
        mats[m]->in_place = false;
    }
    const size_t at = unit_matrix_at(bytes, n);
    if (shard->kind != SHARD_ATTN) return ffn_shard(ctx, g, &view, b);
    if (ctx->active->kv_gpu[shard->layer]) return attn_shard(ctx, g, shard->layer, &view, &g->kv[shard->layer], b);
    const struct cuda_kv_layer kv = slot_kv(ctx, g, slot + at);
    return attn_shard(ctx, g, shard->layer, &view, &kv, b);
}

/* A dense shard whose matrices are staged. */
static pshard_status staged_dense(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t index, const struct shard *shard,
                                  const struct exec_batch *b) {
    uint8_t *slot;
    CORE_TRY(ring_acquire(ctx, g, index, 0, &slot));
    CORE_TRY(dense_in_slot(ctx, g, shard, slot, b));
    if (g->unit_released) { /* (split_attention freed the slot already) */
        g->unit_released = false;
        return PSHARD_OK;
    }
    return ring_release(ctx, g);
}

/* ---- the slots lent to tiers without the ring (plan.lent): the ring's last units */

static uint32_t last_units(const struct exec_ctx *ctx, const struct exec_gpu *g) {
    return g->n_units > ctx->active->n_slots ? g->n_units - ctx->active->n_slots : 0;
}

/* The slot holding lent shard `index` (make_ring checked that one does). */
static uint8_t *lent_slot(const struct exec_ctx *ctx, const struct exec_gpu *g, uint32_t index) {
    for (uint32_t j = last_units(ctx, g); j < g->n_units; j++)
        if (g->units[j].shard == index) return g->slot[j % ctx->active->n_slots];
    return NULL;
}

/* Before a step without the ring: unless a ring step left the lent units in their slots, copy
 * them there; the compute stream waits for the copies. */
static pshard_status ensure_lent(struct exec_ctx *ctx, struct exec_gpu *g) {
    if (g->lent_ready) return PSHARD_OK;
    for (uint32_t j = last_units(ctx, g); j < g->n_units; j++) {
        if (!plan_unit_lent(ctx->active, ctx->model, &g->units[j])) continue;
        CORE_TRY(ring_fill(ctx, g, j));
        CORE_TRY(cuda_stream_wait(g->stream, g->filled[j % ctx->active->n_slots]));
    }
    g->lent_ready = true;
    return PSHARD_OK;
}

/* ---- mixture of experts */

/* Experts [first, end) staged in a slot: 3-D views whose expert e lands in the slot (the
 * experts outside the range are masked and never read). */
static pshard_status staged_experts(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t index, int il, int64_t n,
                                    uint32_t end) {
    const struct gpu_layer *l = &g->layers[il];
    const uint32_t piece = ctx->active->piece_experts, r = ctx->active->experts_resident[il];
    /* (in the ring's order: from the highest piece down) */
    const uint32_t pieces = (end - r + piece - 1) / piece;
    for (uint32_t p = 0; p < pieces; p++) {
        const uint32_t first = r + (pieces - 1 - p) * piece;
        uint8_t *slot;
        CORE_TRY(ring_acquire(ctx, g, index, first, &slot));
        uintptr_t base[3];
        expert_slot_bases(&ctx->w.layers[il], first, g->units[g->next_use].end, slot, base);
        struct cuda_moe view = l->moe_host;
        struct cuda_matrix *mats[] = {&view.gate, &view.up, &view.down};
        for (int m = 0; m < 3; m++) {
            mats[m]->data = (const void *)base[m];
            mats[m]->in_place = false;
        }
        view.expert_mask = l->mask_pieces + (size_t)((first - r) / piece) * ctx->active->n_expert;
        CORE_TRY(cuda_moe_ffn(&view, g->xn, g->expert_ids, g->expert_weights, n, g->x, true, g->work, g->work_bytes,
                              g->stream));
        CORE_TRY(ring_release(ctx, g));
    }
    return PSHARD_OK;
}

/* The CPU's share of a split layer: the normalized input (and an MoE layer's routing) go down,
 * written to host memory by the kernels that make them; the thread pool computes while the GPU
 * works on its own share; the sum comes back up, read in place by the add. Launched kernel by
 * kernel, the host waits on an event; in a replayed graph, on a flag (hand-offs below). */

/* Where the GPU writes its clock as flag i is raised or waited on (NULL: not traced). */
static uint64_t *stamp(const struct exec_gpu *g, int i) { return g->stamps_dev ? g->stamps_dev + i : NULL; }

/* The host's waits on the GPU, timed into the step's stats. */
static pshard_status timed_wait(struct exec_ctx *ctx, pshard_status st, double since_ms) {
    ctx->stats.host_wait_ms += core_now_ms() - since_ms;
    return st;
}

static pshard_status stream_done(struct exec_ctx *ctx, struct exec_gpu *g) {
    const double t0 = core_now_ms();
    return timed_wait(ctx, cuda_stream_sync(g->stream), t0);
}

/* ---- attention split with the CPU (plan_kv_cpu_cells) */

/* The attention of a one-token step over a carried layer, split with the CPU: the query goes
 * down, the GPU attends cells [c, n] from the slot while the CPU attends [0, c) from the host's
 * cache (c = g->kv_cpu_cells), and the CPU's partial sums come up to be merged with the GPU's.
 * Meanwhile the slot is freed for the ring's next copy: the GPU's side has read its cells, and wo
 * is copied out to `work` first (where the merge's output goes straight into wo's activations
 * and work has room; else the slot is held to the end). */
static pshard_status split_attention(struct exec_ctx *ctx, struct exec_gpu *g, int il, const struct gpu_layer *l,
                                     const struct cuda_kv_layer *kv, const struct exec_batch *b) {
    const struct cuda_attn_shape *a = &g->attn_shape;
    const int32_t n_cells = b->pos[0] + 1, c = (int32_t)g->kv_cpu_cells;
    cuda_stream s = g->stream;
    float *host_q = g->host_attn.ptr, *host_sums = host_q + (size_t)a->n_head * a->head_k;
    CORE_TRY(cuda_copy_d2h(host_q, g->q, sizeof(float) * (size_t)a->n_head * a->head_k, s));
    CORE_TRY(cuda_event_record(g->q_ready, s));
    CORE_TRY(cuda_attention_decode_from(a, kv, g->q, g->seq, g->pos, 1, n_cells, c, g->work, g->work_bytes, s));
    struct cuda_matrix wo = l->wo;
    const enum quant_type at = wo_input_type(ctx, g, l, 1);
    const bool quantized = at != QUANT_F32;
    const size_t at_spare = cuda_align(cuda_attention_split_work_bytes(a, 1, n_cells, c));
    const size_t wo_bytes = (size_t)wo.n_rows * wo.row_bytes;
    if (quantized && at_spare + wo_bytes <= g->work_bytes) {
        CORE_TRY(cuda_copy_d2d((uint8_t *)g->work + at_spare, wo.data, wo_bytes, s));
        wo.data = (uint8_t *)g->work + at_spare;
        CORE_TRY(ring_release(ctx, g));
        g->unit_released = true;
    }
    const double t0 = core_now_ms();
    CORE_TRY(timed_wait(ctx, cuda_event_sync(g->q_ready), t0));
    const double t1 = core_now_ms();
    CORE_TRY(shard_attn_cpu_sums(ctx, il, b->seq[0], host_q, c, host_sums));
    ctx->stats.host_compute_ms += core_now_ms() - t1;
    CORE_TRY(cuda_copy_h2d(cuda_attention_host_sums(a, 1, n_cells, c, g->work), host_sums,
                           sizeof(float) * (size_t)a->n_head * (size_t)(a->head_v + 2), s));
    CORE_TRY(cuda_attention_merge_host(a, 1, n_cells, c, g->attn, at, quantized ? g->proj : NULL, g->work, s));
    return attn_out(ctx, g, &wo, l->bo, 1, quantized);
}

/* Whether a step of n tokens in the tier splits its experts by routing (plan_tier.routed), in
 * the layers it splits with the CPU. */
static bool routed_step(const struct plan_tier *tier, int64_t n) { return tier->routed && n == 1; }

/* Once the routing is down: the CPU's experts into host_moe; in a routed step, those of the
 * token's experts past the resident ones that the GPU does not read (the GPU's marked out of
 * the CPU's range). */
static void cpu_experts(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier, const struct shard *s,
                        int64_t n) {
    const size_t k = ctx->model->hp.n_expert_used;
    const int32_t *ids = g->host_route.ptr;
    const float *weights = (const float *)(ids + (size_t)n * k);
    uint32_t first = tier->experts_gpu[s->layer];
    if (routed_step(tier, n)) {
        bool gpu[PLAN_MAX_ROUTED];
        int32_t routed[PLAN_MAX_ROUTED];
        first = plan_experts_vram(ctx->active, tier, s->layer);
        plan_routed_split(ids, (int)k, (int32_t)first, tier->routed_quota, gpu);
        uint64_t mine = 0, read = 0;
        for (size_t j = 0; j < k; j++) {
            routed[j] = gpu[j] ? -1 : ids[j];
            mine += routed[j] >= (int32_t)first;
            read += gpu[j];
        }
        /* The host sees this routing (the GPU's side of the step was counted when captured). */
        ctx->stats.weight_bytes_read += (mine + read) * s->expert_bytes;
        ctx->stats.streamed_bytes += read * s->expert_bytes;
        shard_moe_cpu_experts(ctx, s->layer, n, routed, weights, (int32_t)first, (int32_t)s->n_expert, g->host_moe.ptr);
        return;
    }
    shard_moe_cpu_experts(ctx, s->layer, n, ids, weights, (int32_t)first, (int32_t)s->n_expert, g->host_moe.ptr);
    ctx->stats.weight_bytes_read += (uint64_t)n * k * s->expert_bytes * (s->n_expert - first) / s->n_expert;
}

static pshard_status sum_up(struct exec_ctx *ctx, struct exec_gpu *g, int64_t n) {
    return cuda_add(g->x, g->moe_from_host, n * ctx->model->hp.n_embd, g->stream);
}

/* ---- dense FFNs split by rows with the CPU (plan ffn_rows_gpu) */

/* Once the input is down: the CPU's rows [first, n_ff) into host_moe. */
static void cpu_ffn_rows(struct exec_ctx *ctx, struct exec_gpu *g, const struct shard *s, int64_t n, uint32_t first) {
    shard_ffn_cpu_rows(ctx, s->layer, n, first, ctx->model->hp.n_ff, g->host_moe.ptr);
}

/* ---- hand-offs of a layer split with the CPU (an MoE shard's experts, an FFN's rows) */

/* The host's part of shard s in the tier, into host_moe, once its input (and routing) is down;
 * timed into the step's stats. */
static void host_part(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier, const struct shard *s,
                      int64_t n) {
    const double t0 = core_now_ms();
    memcpy(ctx->s.xn, g->host_xn.ptr, sizeof(float) * (size_t)n * ctx->model->hp.n_embd);
    if (s->kind == SHARD_MOE) cpu_experts(ctx, g, tier, s, n);
    else cpu_ffn_rows(ctx, g, s, n, tier->ffn_rows_gpu[s->layer]);
    ctx->stats.host_compute_ms += core_now_ms() - t0;
}

/* The input of layer il's host part is queued down: let the host start (a flag in a captured
 * graph, an event launched kernel by kernel). */
static pshard_status hand_down(struct exec_gpu *g, int il) {
    return g->capturing ? cuda_flag_raise(g->flags_dev + 2 * il, stamp(g, 2 * il), g->stream)
                        : cuda_event_record(g->route_ready, g->stream);
}

/* The host's part comes back up and adds into the residual stream. Captured, the GPU waits on
 * the flag the host raises at replay (replay_handoffs); launched, the host waits for the input
 * and computes its part now. */
static pshard_status hand_back(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier,
                               const struct shard *s, int64_t n) {
    if (g->capturing) {
        CORE_TRY(cuda_flag_wait(g->flags_dev + 2 * s->layer + 1, stamp(g, 2 * s->layer + 1), g->stream));
    } else {
        const double t0 = core_now_ms();
        CORE_TRY(timed_wait(ctx, cuda_event_sync(g->route_ready), t0));
        host_part(ctx, g, tier, s, n);
    }
    return sum_up(ctx, g, n);
}

/* The GPU computes rows [0, f) of gate and up and those columns of down, reading host memory in
 * place, while the CPU computes the rest from the normalized input it is handed; the CPU's part
 * comes back up and both add into the residual stream. */
static pshard_status split_ffn_shard(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t index, int il,
                                     const struct plan_tier *tier, const struct exec_batch *b) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct gpu_layer *l = &g->layers[il];
    const int64_t n = b->n_tokens, d = hp->n_embd;
    const uint32_t f = tier->ffn_rows_gpu[il];
    CORE_TRY(cuda_rmsnorm_mirror(g->x, l->ffn_norm, g->xn, g->xn_to_host, n, d, hp->rms_eps, g->stream));
    CORE_TRY(hand_down(g, il));
    struct cuda_matrix gate = l->ffn_gate, up = l->ffn_up, down = l->ffn_down;
    gate.n_rows = up.n_rows = f;
    down.n_cols = f; /* the first f columns of each row: row_bytes keeps the full stride */
    CORE_TRY(swiglu_ffn(ctx, g, &gate, &up, &down, n, false));
    ctx->stats.streamed_bytes += plan_unit_bytes(&ctx->model->shards[index], 0) * f / hp->n_ff;
    return hand_back(ctx, g, tier, &ctx->model->shards[index], n);
}

/* Whether shard i of the tier hands off to the CPU in the middle: an MoE shard that leaves
 * experts to the CPU, or an FFN it splits with the CPU. */
static bool hands_off(const struct exec_ctx *ctx, const struct plan_tier *tier, uint32_t i) {
    const struct shard *s = &ctx->model->shards[i];
    if (s->kind == SHARD_MOE) return tier->shard[i] != PLACE_CPU && tier->experts_gpu[s->layer] < s->n_expert;
    return tier->shard[i] == PLACE_STREAMED && plan_ffn_split(tier, s);
}

/* The host's side of a replayed step's hand-offs, in the step's order: wait for the input,
 * compute, let the GPU go on. */
static pshard_status replay_handoffs(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier) {
    volatile uint32_t *flags = g->flags.ptr;
    for (uint32_t i = 0; i < ctx->model->n_shards; i++) {
        const struct shard *s = &ctx->model->shards[i];
        if (!hands_off(ctx, tier, i)) continue;
        const double t0 = core_now_ms();
        CORE_TRY(timed_wait(ctx, cuda_flag_host_wait(flags + 2 * s->layer, g->stream), t0));
        host_part(ctx, g, tier, s, 1);
        cuda_flag_host_raise(flags + 2 * s->layer + 1);
    }
    return PSHARD_OK;
}

/* An MoE layer's experts on the GPU where they do not run as one call (moe_shard): in a ring
 * tier the resident ones from VRAM, then the pieces staged through the ring; elsewhere those of
 * a layer with none resident nor lent, read in place (by range or by the routing), or those of a
 * step that reads none in place. */
static pshard_status experts_apart(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t index, int il,
                                   const struct plan_tier *tier, int64_t n, bool routed, uint64_t touched,
                                   const void *x_act) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct gpu_layer *l = &g->layers[il];
    const struct shard *shard = &ctx->model->shards[index];
    const uint32_t r = ctx->active->experts_resident[il], on_gpu = tier->experts_gpu[il], E = hp->n_expert;
    cuda_stream s = g->stream;
    if (r) {
        struct cuda_moe resident = l->moe;
        resident.expert_mask = r < E ? l->mask_resident : NULL;
        CORE_TRY(cuda_moe_ffn_quantized(&resident, g->xn, x_act, g->expert_ids, g->expert_weights, n, g->x, true, g->work,
                                        g->work_bytes, s));
        ctx->stats.weight_bytes_read += touched * shard->expert_bytes * r / E;
    }
    if (routed) {
        struct cuda_moe streamed = l->moe_host;
        CORE_TRY(cuda_moe_routed_mask(g->expert_ids, (int)hp->n_expert_used, (int)r, g->routed_quota[tier - ctx->active->tier],
                                      (int)E, false, g->routed_mask, s));
        streamed.expert_mask = g->routed_mask;
        CORE_TRY(cuda_moe_ffn_quantized(&streamed, g->xn, x_act, g->expert_ids, g->expert_weights, n, g->x, true, g->work,
                                        g->work_bytes, s));
    } else if (on_gpu > r) {
        if (tier->ring) {
            CORE_TRY(staged_experts(ctx, g, index, il, n, on_gpu));
        } else {
            struct cuda_moe streamed = l->moe_host;
            streamed.expert_mask = l->mask_streamed[tier - ctx->active->tier];
            CORE_TRY(cuda_moe_ffn_quantized(&streamed, g->xn, x_act, g->expert_ids, g->expert_weights, n, g->x, true,
                                            g->work, g->work_bytes, s));
            ctx->stats.streamed_bytes += touched * shard->expert_bytes * (on_gpu - r) / E;
        }
        ctx->stats.weight_bytes_read += touched * shard->expert_bytes * (on_gpu - r) / E;
    }
    return PSHARD_OK;
}

static pshard_status moe_shard(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t index, int il,
                               const struct plan_tier *tier, const struct exec_batch *b) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct gpu_layer *l = &g->layers[il];
    const struct shard *shard = &ctx->model->shards[index];
    const int64_t n = b->n_tokens, d = hp->n_embd;
    const uint32_t r = ctx->active->experts_resident[il], on_gpu = tier->experts_gpu[il], E = hp->n_expert;
    cuda_stream s = g->stream;
    const bool split = on_gpu < E;
    /* At matrix-vector sizes the norm also quantizes its output for the experts' products, into
     * g->proj (free until the shared expert), which every call below reads. */
    const enum quant_type at = cuda_act_type(ctx->w.layers[il].gate_exps->type);
    const bool quantized = norm_quantizes(at, n, d);
    const void *x_act = quantized ? g->proj : NULL;
    if (quantized)
        CORE_TRY(cuda_rmsnorm_quantize(at, g->x, l->ffn_norm, g->xn, split ? g->xn_to_host : NULL, g->proj, n, d, hp->rms_eps, s));
    else
        CORE_TRY(cuda_rmsnorm_mirror(g->x, l->ffn_norm, g->xn, split ? g->xn_to_host : NULL, n, d, hp->rms_eps, s));
    CORE_TRY(project(ctx, g, &l->gate_inp, g->xn, n, g->router));
    CORE_TRY(cuda_moe_route_mirror(g->router, n, (int)E, (int)hp->n_expert_used, ctx->w.norm_expert_weights,
                                   g->expert_ids, g->expert_weights, split ? g->route_to_host : NULL, s));
    if (split) CORE_TRY(hand_down(g, il));
    /* Experts add straight into the residual stream. The host does not see the GPU's routing,
     * so the bytes count the experts a batch of this size touches on average. */
    const uint64_t touched = (uint64_t)(n * hp->n_expert_used < E ? n * hp->n_expert_used : E);
    const bool routed = split && routed_step(tier, n);
    if (l->moe_all.gate_ptrs && !tier->ring && (routed || on_gpu > r)) {
        /* One call: the resident experts from VRAM (and those lent in the ring's slots) and the
         * streamed ones in place, side by side. */
        const uint32_t vram = plan_experts_vram(ctx->active, tier, (uint32_t)il);
        struct cuda_moe all = l->moe_all;
        all.expert_mask = l->mask_gpu[tier - ctx->active->tier];
        if (routed) {
            CORE_TRY(cuda_moe_routed_mask(g->expert_ids, (int)hp->n_expert_used, (int)vram,
                                          g->routed_quota[tier - ctx->active->tier], (int)E, true, g->routed_mask, s));
            all.expert_mask = g->routed_mask;
        }
        CORE_TRY(cuda_moe_ffn_quantized(&all, g->xn, x_act, g->expert_ids, g->expert_weights, n, g->x, true, g->work,
                                        g->work_bytes, s));
        ctx->stats.weight_bytes_read += touched * shard->expert_bytes * (routed ? vram : on_gpu) / E;
        if (!routed) ctx->stats.streamed_bytes += touched * shard->expert_bytes * (on_gpu - vram) / E;
    } else {
        CORE_TRY(experts_apart(ctx, g, index, il, tier, n, routed, touched, x_act));
    }
    if (l->gate_shexp.data) {
        if (l->gate_inp_shexp)
            return core_fail(PSHARD_ERR_UNSUPPORTED, "a gated shared expert is not supported on the GPU yet");
        CORE_TRY(swiglu_ffn(ctx, g, &l->gate_shexp, &l->up_shexp, &l->down_shexp, n, false));
    }
    if (split) CORE_TRY(hand_back(ctx, g, tier, shard, n));
    return PSHARD_OK;
}

/* The head in chunks of outputs, each chunk's logits copied down as it is done: chunks of
 * g->logit_rows where one product reads the head once for all of them (the fused kernel over a
 * tall quantized head in VRAM, cuda_matmul_reads_once; a float head, which cuBLAS reads as it is;
 * a head read in place, which crosses PCIe once a chunk); else, a quantized head in VRAM that
 * cuBLAS would take as an f16 copy made for every chunk, chunks of CUDA_MATVEC_MAX_TOKENS on the
 * matrix-vector kernel (qwen30b's Q4_0 head at 64 outputs: 2.5 ms a step against 2.9 in chunks of
 * 16 through the f16 copy, bench/cuda_kernels.md). */
static pshard_status head_shard(struct exec_ctx *ctx, struct exec_gpu *g) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t n_out = ctx->stats.n_outputs, d = hp->n_embd;
    const enum quant_type type = g->output.type;
    const bool float_head = type == QUANT_F16 || type == QUANT_BF16 || type == QUANT_F32;
    const int64_t first = n_out < g->logit_rows ? n_out : g->logit_rows; /* (the first chunk's outputs) */
    const bool once = float_head || g->output.in_place || cuda_matmul_reads_once(g->cuda, &g->output, first);
    const int64_t chunk = once ? g->logit_rows : CUDA_MATVEC_MAX_TOKENS;
    /* Gather the output rows of the residual stream (an F32 "matrix" of n_batch rows). */
    const struct cuda_matrix rows = {QUANT_F32, g->x, d, ctx->params.n_batch, 1, sizeof(float) * (size_t)d, false};
    CORE_TRY(cuda_get_rows(&rows, g->out_rows, n_out, g->proj, g->stream));
    CORE_TRY(cuda_rmsnorm(g->proj, g->output_norm, g->xn, n_out, d, hp->rms_eps, g->stream));
    for (int64_t c = 0; c < n_out; c += chunk) {
        const int64_t count = n_out - c < chunk ? n_out - c : chunk;
        CORE_TRY(project(ctx, g, &g->output, g->xn + c * d, count, g->logits));
        CORE_TRY(cuda_copy_d2h((float *)g->host_logits.ptr + c * (int64_t)hp->n_vocab, g->logits,
                               sizeof(float) * (size_t)count * hp->n_vocab, g->stream));
    }
    return PSHARD_OK;
}

/* The KV block table up to its fixed place, on the compute stream before the step (a replayed
 * graph reads it there), whenever the host's changed since. The pinned buffer is free: the
 * last step waited for its copy. */
static pshard_status table_up(struct exec_ctx *ctx, struct exec_gpu *g) {
    if (!g->table_stale && g->table_version == ctx->kv.table_version) return PSHARD_OK;
    const size_t bytes = sizeof(int32_t) * (size_t)ctx->kv.n_seq * (size_t)ctx->kv.max_blocks;
    memcpy(g->host_table.ptr, ctx->kv.table, bytes);
    CORE_TRY(cuda_copy_h2d(g->kv_table, g->host_table.ptr, bytes, g->stream));
    g->table_version = ctx->kv.table_version;
    g->table_stale = false;
    return PSHARD_OK;
}

static pshard_status upload_batch(struct exec_ctx *ctx, struct exec_gpu *g, const struct exec_batch *b) {
    const size_t B = (size_t)ctx->params.n_batch, n = (size_t)b->n_tokens;
    int32_t *host = g->host_in.ptr;
    memcpy(host, b->tokens, n * sizeof(int32_t));
    memcpy(host + B, b->pos, n * sizeof(int32_t));
    memcpy(host + 2 * B, b->seq, n * sizeof(int32_t));
    memcpy(host + 3 * B, ctx->s.out_rows, (size_t)ctx->stats.n_outputs * sizeof(int32_t));
    const int32_t *rope_pos = ctx->media ? ctx->media->rope_pos : NULL;
    for (size_t a = 0; a < 3 && rope_is_multi(&ctx->w.rope); a++)
        memcpy(host + (4 + a) * B, rope_pos ? rope_pos + a * n : b->pos, n * sizeof(int32_t));
    return PSHARD_OK;
}

static pshard_status gpu_shard(struct exec_ctx *ctx, struct exec_gpu *g, uint32_t index, const struct plan_tier *tier,
                               const struct exec_batch *b) {
    const struct shard *shard = &ctx->model->shards[index];
    const bool staged = tier->ring && tier->shard[index] == PLACE_STREAMED;
    const bool streamed = tier->shard[index] == PLACE_STREAMED;
    switch (shard->kind) {
    case SHARD_EMBED:
        ctx->stats.weight_bytes_read += (uint64_t)b->n_tokens * g->token_embd.row_bytes;
        if (streamed) ctx->stats.streamed_bytes += (uint64_t)b->n_tokens * g->token_embd.row_bytes;
        return cuda_get_rows(&g->token_embd, g->tokens, b->n_tokens, g->x, g->stream);
    case SHARD_ATTN:
    case SHARD_FFN:
        if (staged) return staged_dense(ctx, g, index, shard, b);
        if (streamed && plan_ffn_split(tier, shard)) return split_ffn_shard(ctx, g, index, shard->layer, tier, b);
        if (plan_reads_lent(ctx->active, tier, index)) return dense_in_slot(ctx, g, shard, lent_slot(ctx, g, index), b);
        if (streamed) ctx->stats.streamed_bytes += plan_unit_bytes(shard, 0);
        if (shard->kind == SHARD_FFN) return ffn_shard(ctx, g, &g->layers[shard->layer], b);
        if (!ctx->active->kv_gpu[shard->layer]) /* (its cells come only in a ring step's slot) */
            return core_fail(PSHARD_ERR_INTERNAL, "layer %u's attention is on the GPU without its KV cells", shard->layer);
        return attn_shard(ctx, g, shard->layer, &g->layers[shard->layer], &g->kv[shard->layer], b);
    case SHARD_MOE: return moe_shard(ctx, g, index, shard->layer, tier, b);
    case SHARD_HEAD:
        if (!ctx->stats.n_outputs) return PSHARD_OK;
        if (streamed) ctx->stats.streamed_bytes += (uint64_t)g->output.n_rows * g->output.row_bytes;
        return head_shard(ctx, g);
    case SHARD_KIND_COUNT: break;
    }
    return PSHARD_OK;
}

static void cpu_shard(struct exec_ctx *ctx, const struct shard *shard, const struct exec_batch *b) {
    switch (shard->kind) {
    case SHARD_EMBED: shard_embed_cpu(ctx, b); break;
    case SHARD_ATTN: shard_attn_cpu(ctx, shard->layer, b); break;
    case SHARD_FFN: shard_ffn_cpu(ctx, shard->layer, b); break;
    case SHARD_MOE: shard_moe_cpu(ctx, shard->layer, b); break;
    case SHARD_HEAD: if (ctx->stats.n_outputs) shard_head_cpu(ctx, b); break;
    case SHARD_KIND_COUNT: break;
    }
}

/* The residual stream [n_tokens][n_embd] crossing PCIe through the pinned buffer. */
static pshard_status x_to_gpu(struct exec_ctx *ctx, struct exec_gpu *g, int64_t n) {
    const size_t bytes = sizeof(float) * (size_t)n * ctx->model->hp.n_embd;
    memcpy(g->host_x.ptr, ctx->s.x, bytes);
    return cuda_copy_h2d(g->x, g->host_x.ptr, bytes, g->stream);
}

/* A replayed step whose embedding is on the host: the row is looked up and placed where the
 * graph's first copy reads it. */
static void embed_for_replay(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier,
                             const struct exec_batch *b) {
    if (tier->shard[0] != PLACE_CPU) return;
    shard_embed_cpu(ctx, b);
    memcpy(g->host_x.ptr, ctx->s.x, sizeof(float) * (size_t)b->n_tokens * ctx->model->hp.n_embd);
}

static pshard_status x_to_host(struct exec_ctx *ctx, struct exec_gpu *g, int64_t n) {
    const size_t bytes = sizeof(float) * (size_t)n * ctx->model->hp.n_embd;
    CORE_TRY(cuda_copy_d2h(g->host_x.ptr, g->x, bytes, g->stream));
    CORE_TRY(stream_done(ctx, g));
    memcpy(ctx->s.x, g->host_x.ptr, bytes);
    return PSHARD_OK;
}

/* Every shard where the tier puts it, the activations following; the logits of a GPU head are
 * copied down by the head itself. Returns without waiting for the stream. */
static pshard_status enqueue_step(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier,
                                  const struct exec_batch *b) {
    const struct model *model = ctx->model;
    CORE_TRY(cuda_copy_h2d(g->tokens, g->host_in.ptr, GPU_BATCH_ROWS * (size_t)ctx->params.n_batch * sizeof(int32_t), g->stream));
    g->rope_ready = false;
    if (tier->ring) CORE_TRY(ring_start(ctx, g, tier));
    const bool embd = ctx->media && ctx->media->embd;
    bool x_on_gpu = false;
    for (uint32_t i = 0; i < model->n_shards; i++) {
        const struct shard *shard = &model->shards[i];
        /* Input embeddings (an image's tokens) are placed by the host; the stream goes up after. */
        const bool on_gpu = tier->shard[i] != PLACE_CPU && !(shard->kind == SHARD_EMBED && embd);
        if (on_gpu && !x_on_gpu && shard->kind != SHARD_EMBED) CORE_TRY(x_to_gpu(ctx, g, b->n_tokens));
        if (!on_gpu && x_on_gpu && shard->kind != SHARD_EMBED) CORE_TRY(x_to_host(ctx, g, b->n_tokens));
        if (on_gpu) {
            CORE_TRY(gpu_shard(ctx, g, i, tier, b));
        } else {
            const double t0 = core_now_ms();
            cpu_shard(ctx, shard, b);
            ctx->stats.host_compute_ms += core_now_ms() - t0;
        }
        x_on_gpu = on_gpu;
    }
    /* The slots hold the last units, unless the step passed over some. */
    if (tier->ring && g->next_use == g->n_units && !g->ring_passed) g->lent_ready = true;
    return PSHARD_OK;
}

/* A decode step of a tier with every shard on the GPU (one token, one output) is captured once
 * and replayed: the per-token inputs travel through the pinned buffer its first copy reads; the
 * CPU's experts of split MoE layers meet it at flags. */
static pshard_status replay_decode(struct exec_ctx *ctx, struct exec_gpu *g, const struct plan_tier *tier,
                                   const struct exec_batch *b) {
    const bool fresh = !g->decode_graph; /* capturing ran the host's part of this step already */
    if (fresh) {
        const struct exec_stats before = ctx->stats;
        g->capturing = true;
        CORE_TRY(cuda_graph_capture_begin(g->stream));
        pshard_status st = enqueue_step(ctx, g, tier, b);
        cuda_graph end_graph = NULL;
        pshard_status end = cuda_graph_capture_end(g->stream, &end_graph);
        g->capturing = false;
        CORE_TRY(st);
        CORE_TRY(end);
        g->decode_graph = end_graph;
        g->decode_graph_bytes = ctx->stats.weight_bytes_read - before.weight_bytes_read;
        g->decode_graph_streamed = ctx->stats.streamed_bytes - before.streamed_bytes;
        ctx->stats = before;
    }
    ctx->stats.weight_bytes_read += g->decode_graph_bytes;
    ctx->stats.streamed_bytes += g->decode_graph_streamed;
    if (!fresh) embed_for_replay(ctx, g, tier, b);
    CORE_TRY(cuda_graph_launch(g->decode_graph, g->stream));
    return replay_handoffs(ctx, g, tier);
}

/* After a traced replay has finished: the GPU's clock at each hand-off into the step's stats. */
static void read_stamps(struct exec_ctx *ctx, const struct exec_gpu *g, const struct plan_tier *tier) {
    const uint64_t *t = g->stamps.ptr;
    uint64_t went_on = 0; /* the last hand-off's end */
    for (uint32_t i = 0; i < ctx->model->n_shards; i++) {
        if (!hands_off(ctx, tier, i)) continue;
        const int il = (int)ctx->model->shards[i].layer;
        const uint64_t ready = t[2 * il], go = t[2 * il + 1];
        if (!ready || go < ready) return; /* not written this step: nothing to say */
        if (went_on && ready >= went_on) ctx->stats.gpu_between_ms += (double)(ready - went_on) / 1e6;
        ctx->stats.gpu_handoff_ms += (double)(go - ready) / 1e6;
        ctx->stats.handoffs++;
        went_on = go;
    }
}

pshard_status exec_gpu_step(struct exec_ctx *ctx, const struct exec_batch *b) {
    struct exec_gpu *g = ctx->gpu;
    if (g->broken) return core_fail(PSHARD_ERR_INTERNAL, "the GPU's memory was left half carved by a failed change of plan");
    CORE_TRY(exec_gpu_take_uploads(ctx));
    const struct plan_tier *tier = plan_tier_for(ctx->active, b->n_tokens);
    const bool head_on_gpu = tier->shard[ctx->model->n_shards - 1] != PLACE_CPU;
    CORE_TRY(head_on_gpu ? exec_gpu_reserve_logits(ctx, ctx->stats.n_outputs) : exec_reserve_logits(ctx, ctx->stats.n_outputs));
    g->n_step_seq = 0;
    for (int32_t t = 0; ctx->active->kv_stream && t < b->n_tokens; t++)
        if (!g->seen[b->seq[t]]) g->seen[b->seq[t]] = true, g->step_seq[g->n_step_seq++] = b->seq[t];
    for (int32_t i = 0; i < g->n_step_seq; i++) g->seen[g->step_seq[i]] = false;
    /* PLAN_KV_CPU_RUN cells are whole blocks: the ring carries the rest of a block's run */
    _Static_assert((int)PLAN_KV_CPU_RUN % (int)KV_BLOCK_CELLS == 0 && (int)PLAN_KV_CPU_RUN == (int)CPU_ATTN_SPLIT_CELLS, "the CPU's cells");
    g->kv_cpu_cells = tier->ring && tier->kv_stream && b->n_tokens == 1 ? plan_kv_cpu_cells(tier, b->pos[0]) : 0;
    CORE_TRY(upload_batch(ctx, g, b));
    CORE_TRY(table_up(ctx, g));
    if (!tier->ring && tier->any_gpu) CORE_TRY(ensure_lent(ctx, g));
    const bool replayed = plan_tier_replays(tier, b->n_tokens) && ctx->stats.n_outputs == 1 && !(ctx->media && ctx->media->embd);
    if (replayed)
        CORE_TRY(replay_decode(ctx, g, tier, b));
    else
        CORE_TRY(enqueue_step(ctx, g, tier, b));
    CORE_TRY(stream_done(ctx, g));
    if (replayed && g->stamps_dev) read_stamps(ctx, g, tier);
    ctx->logits = head_on_gpu ? g->host_logits.ptr : ctx->s.logits; /* (read where they came down: no second copy) */
    return PSHARD_OK;
}
