/* The executor: creation (weights bound, scratch and KV sized once) and the step loop, which
 * walks the shard list in order. Nothing is allocated per step. */
#include "exec/exec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/attention.h"
#include "exec/exec_gpu.h"
#include "exec/exec_internal.h"
#include "plan/planner.h"

static pshard_status view(const struct gguf_tensor *t, struct cpu_matrix *m) {
    if (!t) {
        memset(m, 0, sizeof *m);
        return PSHARD_OK;
    }
    return cpu_matrix_from_tensor(t, m);
}

static pshard_status check_f32(const struct gguf_tensor *t, const char *path) {
    if (t && t->type != QUANT_F32)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: tensor '%.*s' is %s; norms and biases must be F32", path,
                         (int)t->name.len, t->name.data, quant_type_name(t->type));
    return PSHARD_OK;
}

static pshard_status view_layers(struct exec_ctx *ctx) {
    const char *path = gguf_path(ctx->model->file);
    for (uint32_t il = 0; il < ctx->model->hp.n_layers; il++) {
        const struct layer_weights *l = &ctx->w.layers[il];
        struct layer_mats *m = &ctx->mats[il];
        const struct gguf_tensor *vectors[] = {l->attn_norm, l->bq, l->bk, l->bv, l->bo, l->q_norm, l->k_norm,
                                               l->ffn_norm, l->gate_inp_shexp};
        for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) CORE_TRY(check_f32(vectors[i], path));
        CORE_TRY(view(l->wq, &m->wq));
        CORE_TRY(view(l->wk, &m->wk));
        CORE_TRY(view(l->wv, &m->wv));
        CORE_TRY(view(l->wo, &m->wo));
        CORE_TRY(view(l->ffn_gate, &m->ffn_gate));
        CORE_TRY(view(l->ffn_up, &m->ffn_up));
        CORE_TRY(view(l->ffn_down, &m->ffn_down));
        CORE_TRY(view(l->gate_inp, &m->gate_inp));
        CORE_TRY(view(l->gate_exps, &m->gate_exps));
        CORE_TRY(view(l->up_exps, &m->up_exps));
        CORE_TRY(view(l->down_exps, &m->down_exps));
        CORE_TRY(view(l->gate_shexp, &m->gate_shexp));
        CORE_TRY(view(l->up_shexp, &m->up_shexp));
        CORE_TRY(view(l->down_shexp, &m->down_shexp));
    }
    CORE_TRY(check_f32(ctx->w.output_norm, path));
    CORE_TRY(view(ctx->w.token_embd, &ctx->token_embd));
    return view(ctx->w.output, &ctx->output);
}

static int64_t max3(int64_t a, int64_t b, int64_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

/* Carve every per-step buffer from one allocation. */
static pshard_status alloc_scratch(struct exec_ctx *ctx) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t B = ctx->params.n_batch, d = hp->n_embd;
    const int64_t q_width = (int64_t)hp->n_head * hp->head_dim_k, o_width = (int64_t)hp->n_head * hp->head_dim_v;
    const int64_t ff = ctx->w.ffn_rows; /* (0 in a model of experts alone: its layers use no dense FFN buffers) */
    const int64_t widest = max3(max3(d, q_width, o_width), ff, hp->n_ff_expert);
    const struct cpu_attn_shape attn_shape = {(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v, 1};
    struct { void **ptr; size_t bytes; } parts[] = {
        {(void **)&ctx->s.x, sizeof(float) * B * d},
        {(void **)&ctx->s.xn, sizeof(float) * B * d},
        {(void **)&ctx->s.q, sizeof(float) * B * q_width},
        {(void **)&ctx->s.k, sizeof(float) * B * ctx->kv.k_width},
        {(void **)&ctx->s.v, sizeof(float) * B * ctx->kv.v_width},
        {(void **)&ctx->s.attn, sizeof(float) * B * o_width},
        {(void **)&ctx->s.attn_partial, sizeof(float) * (size_t)cpu_attention_partial_floats_max(&attn_shape)},
        {(void **)&ctx->s.proj, sizeof(float) * B * d},
        {(void **)&ctx->s.gate, sizeof(float) * B * (ff ? ff : 1)},
        {(void **)&ctx->s.up, sizeof(float) * B * (ff ? ff : 1)},
        {(void **)&ctx->s.router, sizeof(float) * B * (hp->n_expert ? hp->n_expert : 1)},
        {(void **)&ctx->s.expert_ids, sizeof(int32_t) * B * (hp->n_expert_used ? hp->n_expert_used : 1)},
        {(void **)&ctx->s.expert_weights, sizeof(float) * B * (hp->n_expert_used ? hp->n_expert_used : 1)},
        /* F32 activations are the widest format (4 bytes per value); every other is smaller. */
        {(void **)&ctx->s.acts, sizeof(float) * B * widest + 64},
        {(void **)&ctx->s.rope, sizeof(float) * B * ctx->w.rope.n_dims},
        {(void **)&ctx->s.out_rows, sizeof(int32_t) * B},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) total += (parts[i].bytes + 63) & ~(size_t)63;
    ctx->scratch_mem = aligned_alloc(64, total);
    if (!ctx->scratch_mem)
        return core_fail(PSHARD_ERR_NOMEM, "cannot allocate %.1f MB of activation buffers (reduce the batch)", total / 1e6);
    uint8_t *p = ctx->scratch_mem;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        *parts[i].ptr = p;
        p += (parts[i].bytes + 63) & ~(size_t)63;
    }
    if (ctx->w.moe) {
        /* Sized for F32 activations, the widest format, so any layer's down type fits. */
        size_t bytes = cpu_moe_scratch_bytes(B, (int)hp->n_expert_used, hp->n_expert, d, hp->n_ff_expert, QUANT_F32);
        ctx->moe_mem = malloc(bytes);
        if (!ctx->moe_mem) return core_fail(PSHARD_ERR_NOMEM, "cannot allocate %.1f MB of expert buffers", bytes / 1e6);
        cpu_moe_scratch_init(&ctx->s.moe, ctx->moe_mem, B, (int)hp->n_expert_used, hp->n_expert, d, hp->n_ff_expert,
                             QUANT_F32);
    }
    return PSHARD_OK;
}

/* The planner's request for these parameters. Tiers that do not use the staging ring read the
 * units it leaves in its slots (plan.lent), the MoE pieces among them too (plan.experts_lent);
 * dynamic tiers split dense FFNs by rows between the GPU and the CPU; static tiers stage the
 * attention they stream; balanced dynamic tiers split a token's experts by its routing; a layer's
 * resident and streamed experts go in one call; ring tiers may carry the KV cells of layers whose
 * cache is on the host to the GPU's attention; decode steps over long caches may run over another
 * set than short ones. p->options turns each off but lending, the routed split and the one expert
 * call, or fixes a choice, for comparison. */
static struct plan_request request_for(const struct exec_params *p, bool gpu_wanted) {
    const struct plan_options *o = &p->options;
    return (struct plan_request){
        .family = gpu_wanted ? p->plan : PLAN_CPU,
        .vram_budget = p->vram_budget,
        .n_ctx = p->n_ctx,
        .n_batch = p->n_batch,
        .n_seq = p->n_seq,
        .stream_share = p->stream_share,
        .staging = p->staging,
        .profile = p->profile,
        .split_ffn = !o->no_split_ffn,
        .stage_static = !o->no_stage_static,
        .routed_quota = o->routed_quota_count ? o->routed_quota : NULL,
        .routed_quota_count = o->routed_quota_count,
        .phases = p->decode_set != PLAN_DECODE_SAME,
        .decode_set = p->decode_set,
        .n_decode = p->n_decode,
        .kv_stream = !o->no_kv_stream,
        .kv_split = !o->no_kv_split,
        .kv_cpu_share = o->kv_cpu_share,
        .long_decode = !o->no_long_decode,
        .decode_from = o->decode_from,
        .dynamic_in_place = p->dynamic_in_place,
        .kv_cells = kv_cache_pool_cells(p->n_seq, p->n_ctx, p->n_cells),
    };
}

/* The GPU's buffers are priced from the weights' shapes alone, so this needs no device (the
 * weights are bound here, not read). */
pshard_status exec_make_plan(const struct model *model, const struct exec_params *params, struct plan *out) {
    const bool gpu_wanted = params->plan != PLAN_CPU && params->vram_budget != 0;
    struct model_weights w;
    CORE_TRY(model_bind_weights(model, &w));
    struct plan_gpu_costs costs = {0};
    pshard_status st = PSHARD_OK;
    if (gpu_wanted) st = exec_gpu_costs(model, &w, params, &costs);
    const struct plan_request req = request_for(params, gpu_wanted);
    if (st == PSHARD_OK) st = plan_build(model, &req, &costs, out);
    model_weights_free(&w);
    return st;
}

pshard_status exec_choose_batch(const struct model *model, struct exec_params *params, struct exec_batch_choice *out) {
    static const int32_t sizes[EXEC_BATCH_SIZES] = {512, 1024};
    memset(out, 0, sizeof *out);
    double best = INFINITY;
    for (int i = 0; i < EXEC_BATCH_SIZES; i++) {
        int32_t b = sizes[i] < params->n_ctx ? sizes[i] : params->n_ctx;
        if (b < params->n_seq) b = params->n_seq;
        if (out->n && b <= out->n_batch[out->n - 1]) break; /* (capped: the sizes left are the same) */
        struct exec_params p = *params;
        p.n_batch = b;
        struct plan plan;
        const pshard_status st = exec_make_plan(model, &p, &plan);
        /* A larger micro-batch needs more memory, not less: where the least fails, its error (and
         * the minimum budget it names) is the one to tell. */
        if (st != PSHARD_OK && i == 0) return st;
        if (st == PSHARD_OK && i == 0 && plan.n_candidates == 0) { /* (fits whole: nothing weighed) */
            plan_free(&plan);
            return PSHARD_OK;
        }
        out->n_batch[out->n] = b;
        out->request_s[out->n] = st == PSHARD_OK ? plan.predicted_ttft + plan.n_decode * plan.predicted_decode : INFINITY;
        if (out->request_s[out->n] < best) best = out->request_s[out->n];
        out->n++;
        if (st == PSHARD_OK) plan_free(&plan);
    }
    if (!isfinite(best)) {
        out->n = 0;
        return core_fail(PSHARD_ERR_INTERNAL, "no micro-batch size plans");
    }
    for (int i = 0; i < out->n; i++)
        if (out->request_s[i] <= best * (1 + EXEC_BATCH_MARGIN)) out->chosen = i;
    params->n_batch = out->n_batch[out->chosen];
    return PSHARD_OK;
}

struct exec_params exec_params_for_candidate(const struct exec_params *params, const struct plan_candidate *cand) {
    struct exec_params cp = *params;
    cp.plan = cand->family;
    cp.stream_share = cand->share;
    cp.staging = (int32_t)cand->set;
    cp.dynamic_in_place = true;
    if (cand->family == PLAN_CPU) cp.vram_budget = 0;
    return cp;
}

const struct plan *exec_get_plan(const struct exec_ctx *ctx) { return &ctx->plan; }

static pshard_status create(struct exec_ctx *ctx) {
    const struct model_hparams *hp = &ctx->model->hp;
    const struct exec_params *p = &ctx->params;
    if (p->n_ctx <= 0 || p->n_batch <= 0 || p->n_seq <= 0 || p->n_threads < 0 || p->n_cells < 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "context, batch and sequence counts must be positive");
    CORE_TRY(model_bind_weights(ctx->model, &ctx->w));
    ctx->mats = calloc(hp->n_layers, sizeof *ctx->mats);
    if (!ctx->mats) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    CORE_TRY(view_layers(ctx));
    if (p->plan != PLAN_CPU && p->vram_budget != 0 && cuda_device_count() == 0)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "no CUDA device: run on the CPU (budget 0 or --plan cpu)");
    CORE_TRY(exec_make_plan(ctx->model, p, &ctx->plan));
    ctx->active = &ctx->plan;
    /* Two phases keep every layer's KV cache on the host too: a change of phase moves it there
     * and back. */
    CORE_TRY(kv_cache_init(&ctx->kv, (int32_t)hp->n_layers, p->n_seq, p->n_ctx, p->n_cells, (int64_t)hp->n_head_kv * hp->head_dim_k,
                           (int64_t)hp->n_head_kv * hp->head_dim_v, ctx->plan.any_cpu_attention || ctx->plan.decode));
    CORE_TRY(alloc_scratch(ctx));
    ctx->next_pos = malloc(sizeof(int32_t) * (size_t)p->n_seq);
    if (!ctx->next_pos) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    if (ctx->plan.any_gpu) CORE_TRY(exec_gpu_create(ctx, &ctx->gpu));
    CORE_TRY(threadpool_create(p->n_threads, &ctx->pool));
    ctx->params.n_threads = threadpool_size(ctx->pool);
    return PSHARD_OK;
}

int exec_device_count(void) { return cuda_device_count(); }

void exec_params_share_pool(struct exec_params *p, uint32_t n_ctx_train) {
    if (p->n_seq <= 1) return;
    p->n_cells = p->n_ctx;
    if (n_ctx_train && (uint32_t)p->n_ctx > n_ctx_train) p->n_ctx = (int32_t)n_ctx_train;
}

pshard_status exec_create(const struct model *model, const struct exec_params *params, struct exec_ctx **out) {
    *out = NULL;
    struct exec_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    ctx->model = model;
    ctx->params = *params;
    pshard_status st = create(ctx);
    if (st != PSHARD_OK) {
        exec_free(ctx);
        return st;
    }
    *out = ctx;
    return PSHARD_OK;
}

void exec_free(struct exec_ctx *ctx) {
    if (!ctx) return;
    exec_gpu_free(ctx->gpu);
    plan_free(&ctx->plan);
    free(ctx->next_pos);
    threadpool_free(ctx->pool);
    free(ctx->scratch_mem);
    free(ctx->moe_mem);
    free(ctx->s.logits);
    kv_cache_free(&ctx->kv);
    free(ctx->mats);
    model_weights_free(&ctx->w);
    free(ctx);
}

/* Refuse a batch that would read or write outside the cache, before touching any state. */
static pshard_status validate(const struct exec_ctx *ctx, const struct exec_batch *b) {
    const struct exec_params *p = &ctx->params;
    if (b->n_tokens <= 0 || b->n_tokens > p->n_batch)
        return core_fail(PSHARD_ERR_INVALID_ARG, "a step carries 1 to %d tokens, not %d", p->n_batch, b->n_tokens);
    const struct exec_media *m = ctx->media;
    if (m && m->rope_pos && !rope_is_multi(&ctx->w.rope))
        return core_fail(PSHARD_ERR_INVALID_ARG, "rope positions given for a model (%s) without multimodal rope",
                         ctx->model->hp.arch_name);
    if (m && m->embd && (m->embd_first < 0 || m->embd_count <= 0 || m->embd_count > b->n_tokens - m->embd_first))
        return core_fail(PSHARD_ERR_INVALID_ARG, "input embeddings for tokens %d..%d of a step of %d", m->embd_first,
                         m->embd_first + m->embd_count - 1, b->n_tokens);
    memcpy(ctx->next_pos, ctx->kv.seq_len, sizeof(int32_t) * (size_t)p->n_seq);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || (uint32_t)b->tokens[t] >= ctx->model->hp.n_vocab)
            return core_fail(PSHARD_ERR_INVALID_ARG, "token id %d is outside the vocabulary (%u)", b->tokens[t],
                             ctx->model->hp.n_vocab);
        if (b->seq[t] < 0 || b->seq[t] >= p->n_seq)
            return core_fail(PSHARD_ERR_INVALID_ARG, "sequence %d is outside the %d slots", b->seq[t], p->n_seq);
        /* Expected position: the sequence's length plus its earlier tokens in this batch. */
        const int32_t expect = ctx->next_pos[b->seq[t]]++;
        if (b->pos[t] != expect)
            return core_fail(PSHARD_ERR_INVALID_ARG, "token %d of sequence %d has position %d, expected %d", t, b->seq[t],
                             b->pos[t], expect);
        if (b->pos[t] >= p->n_ctx)
            return core_fail(PSHARD_ERR_RANGE, "context full: sequence %d would need more than %d positions (raise -c)",
                             b->seq[t], p->n_ctx);
    }
    /* The blocks the new cells need, every sequence's together, from the pool's free ones. */
    int64_t need = 0;
    for (int32_t s = 0; s < p->n_seq; s++)
        if (ctx->next_pos[s] > ctx->kv.seq_len[s]) need += kv_cache_blocks_needed(&ctx->kv, s, ctx->next_pos[s]);
    if (need > ctx->kv.n_free)
        return core_fail(PSHARD_ERR_RANGE, "KV cache full: the step needs %lld blocks of %d cells and %d are free (of %d; "
                         "raise -c)", (long long)need, (int)KV_BLOCK_CELLS, ctx->kv.n_free, ctx->kv.n_blocks);
    return PSHARD_OK;
}

/* A block's first cells copied on the GPU too, for the layers whose cache is there. */
static pshard_status copy_on_gpu(void *arg, int32_t dst, int32_t src, int32_t n_cells) {
    struct exec_ctx *ctx = arg;
    return ctx->gpu ? exec_gpu_copy_cells(ctx, dst, src, n_cells) : PSHARD_OK;
}

/* The blocks the batch writes, taken from the pool (validate counted them). */
static pshard_status reserve_cells(struct exec_ctx *ctx) {
    const struct kv_copier copier = {copy_on_gpu, ctx};
    for (int32_t s = 0; s < ctx->params.n_seq; s++)
        if (ctx->next_pos[s] > ctx->kv.seq_len[s]) CORE_TRY(kv_cache_reserve(&ctx->kv, s, ctx->next_pos[s], &copier));
    return PSHARD_OK;
}

pshard_status exec_reserve_logits(struct exec_ctx *ctx, int32_t n) {
    if (n <= ctx->logit_rows) return PSHARD_OK;
    const int32_t rows = exec_logit_rows_for(ctx, n);
    const size_t bytes = sizeof(float) * (size_t)rows * ctx->model->hp.n_vocab;
    float *logits = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!logits) return core_fail(PSHARD_ERR_NOMEM, "cannot allocate %.1f MB for the logits of %d tokens", bytes / 1e6, (int)n);
    free(ctx->s.logits);
    ctx->s.logits = logits;
    ctx->logit_rows = rows;
    return PSHARD_OK;
}

static pshard_status step(struct exec_ctx *ctx, const struct exec_batch *batch) {
    CORE_TRY(validate(ctx, batch));
    const struct model *model = ctx->model;
    ctx->stats.weight_bytes_read = ctx->stats.streamed_bytes = 0;
    ctx->stats.n_outputs = 0;
    ctx->stats.host_compute_ms = ctx->stats.host_wait_ms = 0;
    ctx->stats.gpu_between_ms = ctx->stats.gpu_handoff_ms = 0;
    ctx->stats.handoffs = 0;
    ctx->logits = NULL; /* (set where the step's head wrote them) */
    for (int32_t t = 0; t < batch->n_tokens; t++)
        if (batch->logits ? batch->logits[t] != 0 : t == batch->n_tokens - 1) ctx->s.out_rows[ctx->stats.n_outputs++] = t;

    if (ctx->gpu) {
        int32_t cells = 0; /* the cache the step attends, its own cells included (a decode plan's bands) */
        for (int32_t t = 0; ctx->plan.decode && t < batch->n_tokens; t++)
            cells = batch->pos[t] + 1 > cells ? batch->pos[t] + 1 : cells;
        const struct plan *runs = plan_for_step(&ctx->plan, batch->n_tokens, cells);
        pshard_status st = runs != ctx->active ? exec_gpu_switch(ctx, runs) : PSHARD_OK;
        if (st != PSHARD_OK) return core_fail_context(st, "changing to the %s phase's plan", runs == &ctx->plan ? "prompt" : "decode");
        CORE_TRY(reserve_cells(ctx));
        st = exec_gpu_step(ctx, batch);
        if (st != PSHARD_OK) return core_fail_context(st, "step on the GPU");
    } else {
        CORE_TRY(exec_reserve_logits(ctx, ctx->stats.n_outputs));
        ctx->logits = ctx->s.logits;
        CORE_TRY(reserve_cells(ctx));
        for (uint32_t i = 0; i < model->n_shards; i++) {
            const struct shard *shard = &model->shards[i];
            switch (shard->kind) {
            case SHARD_EMBED: shard_embed_cpu(ctx, batch); break;
            case SHARD_ATTN: shard_attn_cpu(ctx, shard->layer, batch); break;
            case SHARD_FFN: shard_ffn_cpu(ctx, shard->layer, batch); break;
            case SHARD_MOE: shard_moe_cpu(ctx, shard->layer, batch); break;
            case SHARD_HEAD: if (ctx->stats.n_outputs) shard_head_cpu(ctx, batch); break;
            case SHARD_KIND_COUNT: break;
            }
        }
    }
    for (int32_t t = 0; t < batch->n_tokens; t++)
        if (batch->pos[t] + 1 > ctx->kv.seq_len[batch->seq[t]]) ctx->kv.seq_len[batch->seq[t]] = batch->pos[t] + 1;
    return PSHARD_OK;
}

pshard_status exec_step_media(struct exec_ctx *ctx, const struct exec_batch *batch, const struct exec_media *media) {
    ctx->media = media; /* for this step's shards */
    pshard_status st = step(ctx, batch);
    ctx->media = NULL;
    return st;
}

pshard_status exec_step(struct exec_ctx *ctx, const struct exec_batch *batch) { return exec_step_media(ctx, batch, NULL); }

struct threadpool *exec_threads(struct exec_ctx *ctx) { return ctx->pool; }

const float *exec_logits(const struct exec_ctx *ctx, int32_t i) {
    if (i < 0 || i >= ctx->stats.n_outputs || !ctx->logits) return NULL;
    return ctx->logits + (int64_t)i * ctx->model->hp.n_vocab;
}

int32_t exec_n_vocab(const struct exec_ctx *ctx) { return (int32_t)ctx->model->hp.n_vocab; }
const struct exec_stats *exec_last_stats(const struct exec_ctx *ctx) { return &ctx->stats; }
const struct exec_params *exec_get_params(const struct exec_ctx *ctx) { return &ctx->params; }
uint64_t exec_kv_bytes(const struct exec_ctx *ctx) { return kv_cache_bytes(&ctx->kv); }

const struct gpu_memory_report *exec_gpu_memory(const struct exec_ctx *ctx) {
    return ctx->gpu ? exec_gpu_report(ctx->gpu) : NULL;
}

int32_t exec_seq_len(const struct exec_ctx *ctx, int32_t seq) {
    return seq >= 0 && seq < ctx->params.n_seq ? ctx->kv.seq_len[seq] : 0;
}

pshard_status exec_fill_seq(struct exec_ctx *ctx, int32_t seq, int32_t len) {
    struct kv_cache *kv = &ctx->kv;
    if (seq < 0 || seq >= kv->n_seq || len < 0 || len >= kv->n_ctx)
        return core_fail(PSHARD_ERR_INVALID_ARG, "cannot fill sequence %d to %d cells (context %d)", seq, len, kv->n_ctx);
    int32_t own = 0; /* blocks the sequence gives back first */
    for (int32_t i = 0; i < kv->n_held[seq]; i++) own += kv->refs[kv_cache_blocks(kv, seq)[i]] == 1;
    if ((len + KV_BLOCK_CELLS - 1) / KV_BLOCK_CELLS > kv->n_free + own)
        return core_fail(PSHARD_ERR_RANGE, "KV cache full: %d cells do not fit the %d free (raise -c)", len,
                         (kv->n_free + own) * KV_BLOCK_CELLS);
    kv_cache_truncate(kv, seq, 0);
    CORE_TRY(kv_cache_reserve(kv, seq, len, NULL));
    /* Its blocks zeroed, on the host and on the GPU. */
    for (int32_t il = 0; kv->k && il < kv->n_layers; il++)
        for (int32_t i = 0; i < kv->n_held[seq]; i++) {
            const int64_t row = (int64_t)kv_cache_blocks(kv, seq)[i] * KV_BLOCK_CELLS;
            memset(kv_cache_k(kv, il, row), 0, sizeof(uint16_t) * KV_BLOCK_CELLS * (size_t)kv->k_width);
            memset(kv_cache_v(kv, il, row), 0, sizeof(uint16_t) * KV_BLOCK_CELLS * (size_t)kv->v_width);
        }
    if (ctx->gpu) CORE_TRY(exec_gpu_clear_kv(ctx, seq));
    kv->seq_len[seq] = len;
    return PSHARD_OK;
}

void exec_truncate_seq(struct exec_ctx *ctx, int32_t seq, int32_t len) { kv_cache_truncate(&ctx->kv, seq, len); }

int32_t exec_free_cells(const struct exec_ctx *ctx) { return ctx->kv.n_free * KV_BLOCK_CELLS; }
int32_t exec_block_cells(const struct exec_ctx *ctx) {
    (void)ctx;
    return KV_BLOCK_CELLS;
}

pshard_status exec_share_prefix(struct exec_ctx *ctx, int32_t dst_seq, int32_t src_seq, int32_t n_cells) {
    const struct kv_copier copier = {copy_on_gpu, ctx};
    return kv_cache_share(&ctx->kv, dst_seq, src_seq, n_cells, &copier);
}
