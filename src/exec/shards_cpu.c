/* The shards computed on the CPU: embed, attn, ffn, moe, head. Each runs from its inputs
 * alone: the residual stream ctx->s.x, its weights, and (attn) its layer's KV cache. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/error.h"
#include "cpu/attention.h"
#include "cpu/rope.h"
#include "exec/exec_internal.h"
#include "quant/half.h"

static const float *f32_data(const struct gguf_tensor *t) { return t ? (const float *)t->data : NULL; }

static void rmsnorm_rows(const float *x, const struct gguf_tensor *w, float *out, int64_t n_tokens, int64_t n, float eps) {
    for (int64_t t = 0; t < n_tokens; t++) cpu_rmsnorm(x + t * n, f32_data(w), out + t * n, n, eps);
}

static void count_bytes(struct exec_ctx *ctx, const struct cpu_matrix *m) {
    ctx->stats.weight_bytes_read += (uint64_t)m->n_rows * quant_row_bytes(m->type, m->n_cols); /* a view's own columns */
}

void shard_embed_cpu(struct exec_ctx *ctx, const struct exec_batch *batch) {
    const int64_t d = ctx->model->hp.n_embd;
    const struct exec_media *m = ctx->media;
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        if (m && m->embd && t >= m->embd_first && t - m->embd_first < m->embd_count) {
            memcpy(ctx->s.x + t * d, m->embd + (int64_t)(t - m->embd_first) * d, sizeof(float) * (size_t)d);
            continue;
        }
        cpu_get_row(&ctx->token_embd, batch->tokens[t], ctx->s.x + t * d);
        ctx->stats.weight_bytes_read += ctx->token_embd.row_bytes;
    }
}

/* Token t's rotation table: its one position, or with multimodal rope its time, row and column
 * (all three pos where the batch gives none). */
static void rope_table_of(const struct exec_ctx *ctx, const struct exec_batch *batch, int64_t t, float *cs) {
    const struct rope_params *r = &ctx->w.rope;
    const int32_t *rope_pos = ctx->media ? ctx->media->rope_pos : NULL;
    if (!rope_pos) {
        cpu_rope_table(r, batch->pos[t], cs);
        return;
    }
    const int64_t n = batch->n_tokens;
    const int32_t pos[3] = {rope_pos[t], rope_pos[n + t], rope_pos[2 * n + t]};
    cpu_rope_table_multi(r, pos, cs);
}

/* ---- attention */

struct attn_job {
    struct exec_ctx *ctx;
    int layer;
    const struct exec_batch *batch;
    struct cpu_attn_shape shape;
    struct cpu_attn_units units; /* a token's heads that share a KV head (cpu_attention_units) */
    float *partial;              /* a split step's partial sums (units.splits > 1) */
    _Atomic int64_t next;        /* units claimed so far, taken from the last token down */
};

/* Later tokens attend to more cells, so units are claimed one at a time from the end: the
 * longest go first and the short ones fill the gaps. A unit's tokens are of one sequence. */
static void attn_worker(void *p, int thread, int n_threads) {
    struct attn_job *job = p;
    (void)thread, (void)n_threads;
    const struct exec_ctx *ctx = job->ctx;
    const int64_t total = job->units.count;
    for (int64_t claimed = atomic_fetch_add(&job->next, 1); claimed < total; claimed = atomic_fetch_add(&job->next, 1)) {
        int64_t t0, t1, n_cells[CPU_ATTN_TILE_TOKENS];
        int h0, h1, split;
        cpu_attention_unit(&job->shape, &job->units, total - 1 - claimed, &t0, &t1, &h0, &h1, &split);
        for (int64_t t = t0; t < t1; t++) n_cells[t - t0] = job->batch->pos[t] + 1;
        /* the sequence's cells through its blocks, in this layer's pool */
        const struct cpu_kv_view view = {kv_cache_k(&ctx->kv, job->layer, 0), kv_cache_v(&ctx->kv, job->layer, 0),
                                         kv_cache_blocks(&ctx->kv, job->batch->seq[t0]), KV_BLOCK_CELLS};
        cpu_attention_run_unit(&job->shape, &job->units, t0, t1, h0, h1, split, ctx->s.q, &view, n_cells, job->partial,
                               ctx->s.attn);
    }
}

static struct cpu_attn_shape attn_shape(const struct model_hparams *hp) {
    return (struct cpu_attn_shape){(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v,
                                   1.0f / sqrtf((float)hp->head_dim_k)};
}

pshard_status shard_attn_cpu_sums(struct exec_ctx *ctx, int layer, int32_t seq, const float *q, int64_t n_cells,
                                  float *sums) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int32_t pos = (int32_t)(n_cells - 1);
    const struct exec_batch one = {.n_tokens = 1, .pos = &pos, .seq = &seq};
    struct attn_job job = {ctx, layer, &one, attn_shape(hp), {0}, ctx->s.attn_partial, 0};
    cpu_attention_units(&job.shape, 1, n_cells, true, threadpool_size(ctx->pool), &job.units);
    if (job.units.splits < 2) /* (no runs: the sums would come normalized) */
        return core_fail(PSHARD_ERR_INTERNAL, "attention's partial sums over %lld cells, fewer than %d", (long long)n_cells,
                         2 * CPU_ATTN_SPLIT_CELLS);
    memcpy(ctx->s.q, q, sizeof(float) * (size_t)hp->n_head * hp->head_dim_k);
    threadpool_run(ctx->pool, attn_worker, &job);
    cpu_attention_merge_sums(&job.shape, &job.units, job.partial, sums);
    return PSHARD_OK;
}

/* y_i = x · m_i^T for matrices that share their input x (q/k/v, gate/up): the input is
 * quantized once per activation format, and the products run as one parallel job when the
 * formats agree. */
static void project_many(struct exec_ctx *ctx, const struct cpu_matrix *const *mats, float *const *ys, int n,
                         const float *x, int64_t n_tokens) {
    struct cpu_acts acts = {0};
    struct cpu_matmul_task tasks[4];
    int n_tasks = 0;
    for (int i = 0; i < n; i++) {
        const struct cpu_matrix *m = mats[i];
        if (!acts.data || acts.type != m->kernels->act_type || acts.n_cols != m->n_cols) {
            cpu_matmul_many(ctx->pool, tasks, n_tasks); /* flush what used the previous format */
            n_tasks = 0;
            cpu_quantize_acts(ctx->pool, m, x, n_tokens, ctx->s.acts, &acts);
        }
        tasks[n_tasks++] = (struct cpu_matmul_task){m, &acts, ys[i], m->n_rows};
        count_bytes(ctx, m);
    }
    cpu_matmul_many(ctx->pool, tasks, n_tasks);
}

static void project(struct exec_ctx *ctx, const struct cpu_matrix *m, int64_t n_tokens, float *y, const float *x) {
    project_many(ctx, &m, &y, 1, x, n_tokens);
}

void shard_attn_cpu(struct exec_ctx *ctx, int layer, const struct exec_batch *batch) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct layer_weights *lw = &ctx->w.layers[layer];
    const struct layer_mats *lm = &ctx->mats[layer];
    const int64_t n = batch->n_tokens, d = hp->n_embd;
    const int64_t q_width = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t k_width = ctx->kv.k_width, v_width = ctx->kv.v_width;
    struct exec_scratch *s = &ctx->s;

    rmsnorm_rows(s->x, lw->attn_norm, s->xn, n, d, hp->rms_eps);
    const struct cpu_matrix *qkv[3] = {&lm->wq, &lm->wk, &lm->wv};
    float *const qkv_out[3] = {s->q, s->k, s->v};
    project_many(ctx, qkv, qkv_out, 3, s->xn, n);
    if (lw->bq) cpu_add_bias(s->q, f32_data(lw->bq), n, q_width);
    if (lw->bk) cpu_add_bias(s->k, f32_data(lw->bk), n, k_width);
    if (lw->bv) cpu_add_bias(s->v, f32_data(lw->bv), n, v_width);
    if (lw->q_norm) rmsnorm_rows(s->q, lw->q_norm, s->q, n * hp->n_head, hp->head_dim_k, hp->rms_eps);
    if (lw->k_norm) rmsnorm_rows(s->k, lw->k_norm, s->k, n * hp->n_head_kv, hp->head_dim_k, hp->rms_eps);

    const int rope_dims = ctx->w.rope.n_dims;
    for (int64_t t = 0; t < n; t++) {
        float *cs = s->rope + t * rope_dims;
        rope_table_of(ctx, batch, t, cs);
        cpu_rope_apply(&ctx->w.rope, cs, s->q + t * q_width, (int)hp->n_head, (int)hp->head_dim_k);
        cpu_rope_apply(&ctx->w.rope, cs, s->k + t * k_width, (int)hp->n_head_kv, (int)hp->head_dim_k);
        /* Write this token's K and V into its sequence's cell before anyone attends (the step
         * took the cell's block for it: never one another sequence holds). */
        const int64_t row = kv_cache_row(&ctx->kv, batch->seq[t], batch->pos[t]);
        uint16_t *kc = kv_cache_k(&ctx->kv, layer, row), *vc = kv_cache_v(&ctx->kv, layer, row);
        for (int64_t i = 0; i < k_width; i++) kc[i] = half_from_f32(s->k[t * k_width + i]);
        for (int64_t i = 0; i < v_width; i++) vc[i] = half_from_f32(s->v[t * v_width + i]);
    }
    struct attn_job job = {ctx, layer, batch, attn_shape(hp), {0}, ctx->s.attn_partial, 0};
    bool one_sequence = true;
    int64_t longest = 0;
    for (int64_t t = 0; t < n; t++) {
        one_sequence &= batch->seq[t] == batch->seq[0];
        longest = batch->pos[t] + 1 > longest ? batch->pos[t] + 1 : longest;
    }
    cpu_attention_units(&job.shape, n, longest, one_sequence, threadpool_size(ctx->pool), &job.units);
    threadpool_run(ctx->pool, attn_worker, &job);
    if (job.units.splits > 1) cpu_attention_merge(&job.shape, &job.units, job.partial, s->attn);

    project(ctx, &lm->wo, n, s->proj, s->attn);
    if (lw->bo) cpu_add_bias(s->proj, f32_data(lw->bo), n, d);
    cpu_add(s->x, s->proj, n * d);
}

/* ---- feed-forward */

/* y = down(silu(gate(xn)) * up(xn)) for n tokens. */
static void swiglu_ffn(struct exec_ctx *ctx, const struct cpu_matrix *gate, const struct cpu_matrix *up,
                       const struct cpu_matrix *down, int64_t n, float *y) {
    struct exec_scratch *s = &ctx->s;
    const int64_t ff = gate->n_rows;
    const struct cpu_matrix *gate_up[2] = {gate, up};
    float *const gate_up_out[2] = {s->gate, s->up};
    project_many(ctx, gate_up, gate_up_out, 2, s->xn, n);
    cpu_swiglu_parallel(ctx->pool, s->gate, s->up, s->gate, n * ff);
    project(ctx, down, n, y, s->gate);
}

void shard_ffn_cpu(struct exec_ctx *ctx, int layer, const struct exec_batch *batch) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t n = batch->n_tokens, d = hp->n_embd;
    const struct layer_mats *lm = &ctx->mats[layer];
    rmsnorm_rows(ctx->s.x, ctx->w.layers[layer].ffn_norm, ctx->s.xn, n, d, hp->rms_eps);
    swiglu_ffn(ctx, &lm->ffn_gate, &lm->ffn_up, &lm->ffn_down, n, ctx->s.proj);
    cpu_add(ctx->s.x, ctx->s.proj, n * d);
}

void shard_ffn_cpu_rows(struct exec_ctx *ctx, int layer, int64_t n, uint32_t first, uint32_t end, float *out) {
    const struct layer_mats *lm = &ctx->mats[layer];
    struct cpu_matrix gate = lm->ffn_gate, up = lm->ffn_up, down = lm->ffn_down;
    struct cpu_matrix *rows[] = {&gate, &up};
    for (int m = 0; m < 2; m++) {
        rows[m]->data = (const uint8_t *)rows[m]->data + (size_t)first * rows[m]->row_bytes;
        rows[m]->n_rows = end - first;
    }
    /* down's columns [first, end): a stretch of each of its rows, on a block boundary */
    down.data = (const uint8_t *)down.data + quant_row_bytes(down.type, first);
    down.n_cols = end - first;
    swiglu_ffn(ctx, &gate, &up, &down, n, out);
}

void shard_moe_cpu(struct exec_ctx *ctx, int layer, const struct exec_batch *batch) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct layer_weights *lw = &ctx->w.layers[layer];
    const struct layer_mats *lm = &ctx->mats[layer];
    struct exec_scratch *s = &ctx->s;
    const int64_t n = batch->n_tokens, d = hp->n_embd;
    const int k = (int)hp->n_expert_used;

    rmsnorm_rows(s->x, lw->ffn_norm, s->xn, n, d, hp->rms_eps);
    project(ctx, &lm->gate_inp, n, s->router, s->xn);
    cpu_moe_route(s->router, n, hp->n_expert, k, ctx->w.norm_expert_weights, s->expert_ids, s->expert_weights);

    struct cpu_acts acts;
    cpu_quantize_acts(ctx->pool, &lm->gate_exps, s->xn, n, s->acts, &acts);
    struct moe_routing routing = {n, k, s->expert_ids, s->expert_weights, 0, 0};
    cpu_moe(ctx->pool, &lm->gate_exps, &lm->up_exps, &lm->down_exps, &acts, &routing, &s->moe, s->proj);
    /* Bytes: each distinct chosen expert once. */
    for (int64_t e = 0; e < hp->n_expert; e++)
        if (s->moe.expert_start[e + 1] > s->moe.expert_start[e])
            ctx->stats.weight_bytes_read += (uint64_t)(lm->gate_exps.n_rows * lm->gate_exps.row_bytes +
                                                       lm->up_exps.n_rows * lm->up_exps.row_bytes +
                                                       lm->down_exps.n_rows * lm->down_exps.row_bytes);
    cpu_add(s->x, s->proj, n * d);

    if (lw->gate_shexp) {
        swiglu_ffn(ctx, &lm->gate_shexp, &lm->up_shexp, &lm->down_shexp, n, s->proj);
        if (lw->gate_inp_shexp) {
            const float *g = f32_data(lw->gate_inp_shexp);
            for (int64_t t = 0; t < n; t++) {
                float logit = 0.0f;
                for (int64_t i = 0; i < d; i++) logit += g[i] * s->xn[t * d + i];
                const float gate = 1.0f / (1.0f + expf(-logit));
                for (int64_t i = 0; i < d; i++) s->proj[t * d + i] *= gate;
            }
        }
        cpu_add(s->x, s->proj, n * d);
    }
}

void shard_moe_cpu_experts(struct exec_ctx *ctx, int layer, int64_t n, const int32_t *ids, const float *weights,
                           int32_t first, int32_t end, float *out) {
    const struct layer_mats *lm = &ctx->mats[layer];
    struct exec_scratch *s = &ctx->s;
    struct cpu_acts acts;
    cpu_quantize_acts(ctx->pool, &lm->gate_exps, s->xn, n, s->acts, &acts);
    struct moe_routing routing = {n, (int)ctx->model->hp.n_expert_used, ids, weights, first, end};
    cpu_moe(ctx->pool, &lm->gate_exps, &lm->up_exps, &lm->down_exps, &acts, &routing, &s->moe, out);
}

void shard_head_cpu(struct exec_ctx *ctx, const struct exec_batch *batch) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t d = hp->n_embd;
    struct exec_scratch *s = &ctx->s;
    const int32_t n_out = ctx->stats.n_outputs;
    for (int32_t i = 0; i < n_out; i++)
        cpu_rmsnorm(s->x + (int64_t)s->out_rows[i] * d, f32_data(ctx->w.output_norm), s->xn + (int64_t)i * d, d, hp->rms_eps);
    project(ctx, &ctx->output, n_out, s->logits, s->xn);
}
