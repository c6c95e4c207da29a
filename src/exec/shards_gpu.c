/* One step with every shard on the GPU: the batch goes up, the shards run on the compute
 * stream in order (each reads and updates the residual stream g->x, as on the CPU), and the
 * logits of the outputs come back. The host waits once per step, for the logits. */
#include <string.h>

#include "exec/exec_gpu_internal.h"

static pshard_status project(struct exec_ctx *ctx, struct exec_gpu *g, const struct cuda_matrix *m, const float *x,
                             int64_t n, float *y) {
    ctx->stats.weight_bytes_read += (uint64_t)m->n_rows * m->row_bytes;
    /* F32 weights (an MoE router, above all) stay in f32 for any number of tokens: the
     * tensor-core path would round them to f16 and flip routing decisions near a tie. They are
     * small, so a few matrix-vector passes cost little. */
    const int64_t chunk = m->type == QUANT_F32 ? CUDA_MATVEC_MAX_TOKENS : n;
    for (int64_t t = 0; t < n; t += chunk) {
        const int64_t count = n - t < chunk ? n - t : chunk;
        CORE_TRY(cuda_matmul(g->cuda, m, x + t * m->n_cols, count, y + t * m->n_rows, m->n_rows, g->work, g->work_bytes,
                             g->stream));
    }
    return PSHARD_OK;
}

static pshard_status attn_shard(struct exec_ctx *ctx, struct exec_gpu *g, int il, const struct exec_batch *b) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct gpu_layer *l = &g->layers[il];
    const int64_t n = b->n_tokens, d = hp->n_embd, q_width = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t k_width = ctx->kv.k_width, v_width = ctx->kv.v_width;
    cuda_stream s = g->stream;
    CORE_TRY(cuda_rmsnorm(g->x, l->attn_norm, g->xn, n, d, hp->rms_eps, s));
    CORE_TRY(project(ctx, g, &l->wq, g->xn, n, g->q));
    CORE_TRY(project(ctx, g, &l->wk, g->xn, n, g->k));
    CORE_TRY(project(ctx, g, &l->wv, g->xn, n, g->v));
    if (l->bq) CORE_TRY(cuda_add_bias(g->q, l->bq, n, q_width, s));
    if (l->bk) CORE_TRY(cuda_add_bias(g->k, l->bk, n, k_width, s));
    if (l->bv) CORE_TRY(cuda_add_bias(g->v, l->bv, n, v_width, s));
    if (l->q_norm) CORE_TRY(cuda_rmsnorm(g->q, l->q_norm, g->q, n * hp->n_head, hp->head_dim_k, hp->rms_eps, s));
    if (l->k_norm) CORE_TRY(cuda_rmsnorm(g->k, l->k_norm, g->k, n * hp->n_head_kv, hp->head_dim_k, hp->rms_eps, s));
    CORE_TRY(cuda_rope_table(&ctx->w.rope, g->rope_freqs, g->pos, n, g->rope_cs, s));
    CORE_TRY(cuda_rope_apply(&ctx->w.rope, g->rope_cs, g->q, n, (int)hp->n_head, (int)hp->head_dim_k, s));
    CORE_TRY(cuda_rope_apply(&ctx->w.rope, g->rope_cs, g->k, n, (int)hp->n_head_kv, (int)hp->head_dim_k, s));
    CORE_TRY(cuda_kv_store(&g->kv[il], g->k, g->v, k_width, v_width, g->seq, g->pos, n, s));

    /* A prompt of one sequence goes to the tensor-core kernel; anything else to the split-KV
     * decode kernel, which takes any mix of sequences. */
    int32_t max_len = 0;
    bool one_seq = true;
    for (int32_t t = 0; t < n; t++) {
        max_len = b->pos[t] + 1 > max_len ? b->pos[t] + 1 : max_len;
        one_seq = one_seq && b->seq[t] == b->seq[0];
    }
    if (g->capturing) max_len = ctx->params.n_ctx; /* a replayed bound must not depend on the position */
    if (n > 1 && one_seq && cuda_attention_prefill_supported(&g->attn_shape))
        CORE_TRY(cuda_attention_prefill(&g->attn_shape, &g->kv[il], g->q, b->seq[0], g->pos, n, g->attn, s));
    else
        CORE_TRY(cuda_attention_decode(&g->attn_shape, &g->kv[il], g->q, g->seq, g->pos, n, max_len, g->attn, g->work,
                                       g->work_bytes, s));
    CORE_TRY(project(ctx, g, &l->wo, g->attn, n, g->proj));
    if (l->bo) CORE_TRY(cuda_add_bias(g->proj, l->bo, n, d, s));
    return cuda_add(g->x, g->proj, n * d, s);
}

static pshard_status swiglu_ffn(struct exec_ctx *ctx, struct exec_gpu *g, const struct cuda_matrix *gate,
                                const struct cuda_matrix *up, const struct cuda_matrix *down, int64_t n, float *y) {
    CORE_TRY(project(ctx, g, gate, g->xn, n, g->gate));
    CORE_TRY(project(ctx, g, up, g->xn, n, g->up));
    CORE_TRY(cuda_swiglu(g->gate, g->up, g->gate, n * gate->n_rows, g->stream));
    return project(ctx, g, down, g->gate, n, y);
}

static pshard_status ffn_shard(struct exec_ctx *ctx, struct exec_gpu *g, int il, const struct exec_batch *b) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct gpu_layer *l = &g->layers[il];
    const int64_t n = b->n_tokens, d = hp->n_embd;
    CORE_TRY(cuda_rmsnorm(g->x, l->ffn_norm, g->xn, n, d, hp->rms_eps, g->stream));
    CORE_TRY(swiglu_ffn(ctx, g, &l->ffn_gate, &l->ffn_up, &l->ffn_down, n, g->proj));
    return cuda_add(g->x, g->proj, n * d, g->stream);
}

static pshard_status moe_shard(struct exec_ctx *ctx, struct exec_gpu *g, int il, const struct exec_batch *b) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct gpu_layer *l = &g->layers[il];
    const int64_t n = b->n_tokens, d = hp->n_embd;
    cuda_stream s = g->stream;
    CORE_TRY(cuda_rmsnorm(g->x, l->ffn_norm, g->xn, n, d, hp->rms_eps, s));
    CORE_TRY(project(ctx, g, &l->gate_inp, g->xn, n, g->router));
    CORE_TRY(cuda_moe_route(g->router, n, (int)hp->n_expert, (int)hp->n_expert_used, ctx->w.norm_expert_weights,
                            g->expert_ids, g->expert_weights, s));
    /* Experts add straight into the residual stream. The host does not see the routing, so
     * the bytes count every expert a batch of this size can touch. */
    CORE_TRY(cuda_moe_ffn(&l->moe, g->xn, g->expert_ids, g->expert_weights, n, g->x, true, g->work, g->work_bytes, s));
    const int64_t touched = n * hp->n_expert_used < hp->n_expert ? n * hp->n_expert_used : hp->n_expert;
    ctx->stats.weight_bytes_read += (uint64_t)touched * ctx->model->shards[2 + 2 * il].expert_bytes;
    if (l->gate_shexp.data) {
        if (l->gate_inp_shexp)
            return core_fail(PSHARD_ERR_UNSUPPORTED, "a gated shared expert is not supported on the GPU yet");
        CORE_TRY(swiglu_ffn(ctx, g, &l->gate_shexp, &l->up_shexp, &l->down_shexp, n, g->proj));
        CORE_TRY(cuda_add(g->x, g->proj, n * d, s));
    }
    return PSHARD_OK;
}

static pshard_status head_shard(struct exec_ctx *ctx, struct exec_gpu *g) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t n_out = ctx->stats.n_outputs, d = hp->n_embd;
    /* Gather the output rows of the residual stream (an F32 "matrix" of n_batch rows). */
    const struct cuda_matrix rows = {QUANT_F32, g->x, d, ctx->params.n_batch, 1, sizeof(float) * (size_t)d};
    CORE_TRY(cuda_get_rows(&rows, g->out_rows, n_out, g->proj, g->stream));
    CORE_TRY(cuda_rmsnorm(g->proj, g->output_norm, g->xn, n_out, d, hp->rms_eps, g->stream));
    return project(ctx, g, &g->output, g->xn, n_out, g->logits);
}

static pshard_status upload_batch(struct exec_ctx *ctx, struct exec_gpu *g, const struct exec_batch *b) {
    const size_t B = (size_t)ctx->params.n_batch, n = (size_t)b->n_tokens;
    int32_t *host = g->host_in.ptr;
    memcpy(host, b->tokens, n * sizeof(int32_t));
    memcpy(host + B, b->pos, n * sizeof(int32_t));
    memcpy(host + 2 * B, b->seq, n * sizeof(int32_t));
    memcpy(host + 3 * B, ctx->s.out_rows, (size_t)ctx->stats.n_outputs * sizeof(int32_t));
    return PSHARD_OK;
}

static pshard_status gpu_shard(struct exec_ctx *ctx, struct exec_gpu *g, const struct shard *shard,
                               const struct exec_batch *b) {
    switch (shard->kind) {
    case SHARD_EMBED:
        ctx->stats.weight_bytes_read += (uint64_t)b->n_tokens * g->token_embd.row_bytes;
        return cuda_get_rows(&g->token_embd, g->tokens, b->n_tokens, g->x, g->stream);
    case SHARD_ATTN: return attn_shard(ctx, g, shard->layer, b);
    case SHARD_FFN: return ffn_shard(ctx, g, shard->layer, b);
    case SHARD_MOE: return moe_shard(ctx, g, shard->layer, b);
    case SHARD_HEAD: return ctx->stats.n_outputs ? head_shard(ctx, g) : PSHARD_OK;
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

/* Everything an all-GPU step enqueues: the batch up, the shards, the logits down. */
static pshard_status enqueue_step(struct exec_ctx *ctx, struct exec_gpu *g, const struct exec_batch *b) {
    const struct model *model = ctx->model;
    CORE_TRY(cuda_copy_h2d(g->tokens, g->host_in.ptr, 4 * (size_t)ctx->params.n_batch * sizeof(int32_t), g->stream));
    for (uint32_t i = 0; i < model->n_shards; i++) CORE_TRY(gpu_shard(ctx, g, &model->shards[i], b));
    const size_t logit_bytes = sizeof(float) * (size_t)ctx->stats.n_outputs * model->hp.n_vocab;
    if (logit_bytes) CORE_TRY(cuda_copy_d2h(g->host_logits.ptr, g->logits, logit_bytes, g->stream));
    return PSHARD_OK;
}

/* The residual stream [n_tokens][n_embd] crossing PCIe through the pinned buffer. */
static pshard_status x_to_gpu(struct exec_ctx *ctx, struct exec_gpu *g, int64_t n) {
    const size_t bytes = sizeof(float) * (size_t)n * ctx->model->hp.n_embd;
    memcpy(g->host_x.ptr, ctx->s.x, bytes);
    return cuda_copy_h2d(g->x, g->host_x.ptr, bytes, g->stream);
}

static pshard_status x_to_host(struct exec_ctx *ctx, struct exec_gpu *g, int64_t n) {
    const size_t bytes = sizeof(float) * (size_t)n * ctx->model->hp.n_embd;
    CORE_TRY(cuda_copy_d2h(g->host_x.ptr, g->x, bytes, g->stream));
    CORE_TRY(cuda_stream_sync(g->stream));
    memcpy(ctx->s.x, g->host_x.ptr, bytes);
    return PSHARD_OK;
}

/* A plan that mixes places: each shard where the plan puts it, the activations following. */
static pshard_status hybrid_step(struct exec_ctx *ctx, struct exec_gpu *g, const struct exec_batch *b) {
    const struct model *model = ctx->model;
    const struct plan *plan = &ctx->plan;
    CORE_TRY(cuda_copy_h2d(g->tokens, g->host_in.ptr, 4 * (size_t)ctx->params.n_batch * sizeof(int32_t), g->stream));
    bool x_on_gpu = false;
    for (uint32_t i = 0; i < model->n_shards; i++) {
        const struct shard *shard = &model->shards[i];
        const bool on_gpu = plan->shard[i] != PLACE_CPU;
        if (on_gpu && !x_on_gpu && shard->kind != SHARD_EMBED) CORE_TRY(x_to_gpu(ctx, g, b->n_tokens));
        if (!on_gpu && x_on_gpu && shard->kind != SHARD_EMBED) CORE_TRY(x_to_host(ctx, g, b->n_tokens));
        if (on_gpu) CORE_TRY(gpu_shard(ctx, g, shard, b));
        else cpu_shard(ctx, shard, b);
        x_on_gpu = on_gpu;
    }
    const size_t logit_bytes = sizeof(float) * (size_t)ctx->stats.n_outputs * model->hp.n_vocab;
    if (x_on_gpu && logit_bytes) CORE_TRY(cuda_copy_d2h(g->host_logits.ptr, g->logits, logit_bytes, g->stream));
    CORE_TRY(cuda_stream_sync(g->stream));
    if (x_on_gpu) memcpy(ctx->s.logits, g->host_logits.ptr, logit_bytes);
    return PSHARD_OK;
}

/* A decode step (one token, one output) is captured once and replayed: the per-token inputs
 * travel through the pinned buffer its first copy reads. */
static pshard_status replay_decode(struct exec_ctx *ctx, struct exec_gpu *g, const struct exec_batch *b) {
    if (!g->decode_graph) {
        const uint64_t before = ctx->stats.weight_bytes_read;
        g->capturing = true;
        CORE_TRY(cuda_graph_capture_begin(g->stream));
        pshard_status st = enqueue_step(ctx, g, b);
        cuda_graph end_graph = NULL;
        pshard_status end = cuda_graph_capture_end(g->stream, &end_graph);
        g->capturing = false;
        CORE_TRY(st);
        CORE_TRY(end);
        g->decode_graph = end_graph;
        g->decode_graph_bytes = ctx->stats.weight_bytes_read - before;
        ctx->stats.weight_bytes_read = before;
    }
    ctx->stats.weight_bytes_read += g->decode_graph_bytes;
    return cuda_graph_launch(g->decode_graph, g->stream);
}

pshard_status exec_gpu_step(struct exec_ctx *ctx, const struct exec_batch *b) {
    struct exec_gpu *g = ctx->gpu;
    CORE_TRY(upload_batch(ctx, g, b));
    if (!ctx->plan.all_gpu) return hybrid_step(ctx, g, b);
    if (b->n_tokens == 1 && ctx->stats.n_outputs == 1 && !g->no_graphs) CORE_TRY(replay_decode(ctx, g, b));
    else CORE_TRY(enqueue_step(ctx, g, b));
    CORE_TRY(cuda_stream_sync(g->stream));
    const size_t logit_bytes = sizeof(float) * (size_t)ctx->stats.n_outputs * ctx->model->hp.n_vocab;
    memcpy(ctx->s.logits, g->host_logits.ptr, logit_bytes);
    return PSHARD_OK;
}
