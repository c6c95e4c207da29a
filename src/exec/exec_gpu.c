/* The all-in-VRAM placement: sizing the arena, uploading the weights through a pinned buffer,
 * and device views of every tensor. The step and the shards are in shards_gpu.c. */
#include "exec/exec_gpu.h"

#include <stdlib.h>
#include <string.h>

#include "exec/exec_gpu_internal.h"

enum { UPLOAD_CHUNK_BYTES = 64 << 20 };

static size_t align_up(size_t n) { return (n + CUDA_ARENA_ALIGN - 1) / CUDA_ARENA_ALIGN * CUDA_ARENA_ALIGN; }

static pshard_status check_type(const struct gguf_tensor *t) {
    if (t && !cuda_type_supported((enum quant_type)t->type))
        return core_fail(PSHARD_ERR_UNSUPPORTED, "tensor '%.*s' has type %s, which the CUDA backend cannot compute with",
                         (int)t->name.len, t->name.data, quant_type_name(t->type));
    return PSHARD_OK;
}

/* Copy a host range to the device through the pinned staging buffer (the weights are an
 * mmapped file, which is not registered: see cuda_host_register). */
static pshard_status upload(struct exec_gpu *g, void *dst, const void *src, size_t bytes) {
    for (size_t off = 0; off < bytes; off += UPLOAD_CHUNK_BYTES) {
        const size_t n = bytes - off < UPLOAD_CHUNK_BYTES ? bytes - off : UPLOAD_CHUNK_BYTES;
        memcpy(g->staging.ptr, (const uint8_t *)src + off, n);
        CORE_TRY(cuda_copy_h2d((uint8_t *)dst + off, g->staging.ptr, n, g->stream));
        CORE_TRY(cuda_stream_sync(g->stream));
    }
    return PSHARD_OK;
}

/* The device copy of a tensor, uploaded on first use (a tied head shares the embedding's). */
static pshard_status device_tensor(struct exec_gpu *g, const struct gguf_tensor *t, const void **out) {
    *out = NULL;
    if (!t) return PSHARD_OK;
    for (uint32_t i = 0; i < g->n_uploaded; i++)
        if (g->uploaded[i].tensor == t) {
            *out = g->uploaded[i].dev;
            return PSHARD_OK;
        }
    if (g->n_uploaded == g->cap_uploaded)
        return core_fail(PSHARD_ERR_INTERNAL, "more device tensors than the model has");
    void *dev;
    CORE_TRY(cuda_arena_alloc(&g->arena, t->n_bytes, "weights", &dev));
    CORE_TRY(upload(g, dev, t->data, t->n_bytes));
    g->uploaded[g->n_uploaded++] = (struct gpu_tensor){t, dev};
    g->report.weight_bytes += align_up(t->n_bytes);
    *out = dev;
    return PSHARD_OK;
}

static pshard_status matrix(struct exec_gpu *g, const struct gguf_tensor *t, struct cuda_matrix *m) {
    memset(m, 0, sizeof *m);
    if (!t) return PSHARD_OK;
    CORE_TRY(check_type(t));
    const void *dev;
    CORE_TRY(device_tensor(g, t, &dev));
    *m = (struct cuda_matrix){(enum quant_type)t->type, dev, t->ne[0], t->ne[1], t->ne[2],
                              quant_row_bytes((enum quant_type)t->type, t->ne[0])};
    return PSHARD_OK;
}

static pshard_status vector(struct exec_gpu *g, const struct gguf_tensor *t, const float **out) {
    return device_tensor(g, t, (const void **)out);
}

static pshard_status upload_layer(struct exec_gpu *g, const struct layer_weights *w, const struct model_hparams *hp,
                                  struct gpu_layer *l) {
    CORE_TRY(vector(g, w->attn_norm, &l->attn_norm));
    CORE_TRY(vector(g, w->ffn_norm, &l->ffn_norm));
    CORE_TRY(vector(g, w->bq, &l->bq));
    CORE_TRY(vector(g, w->bk, &l->bk));
    CORE_TRY(vector(g, w->bv, &l->bv));
    CORE_TRY(vector(g, w->bo, &l->bo));
    CORE_TRY(vector(g, w->q_norm, &l->q_norm));
    CORE_TRY(vector(g, w->k_norm, &l->k_norm));
    CORE_TRY(vector(g, w->gate_inp_shexp, &l->gate_inp_shexp));
    CORE_TRY(matrix(g, w->wq, &l->wq));
    CORE_TRY(matrix(g, w->wk, &l->wk));
    CORE_TRY(matrix(g, w->wv, &l->wv));
    CORE_TRY(matrix(g, w->wo, &l->wo));
    CORE_TRY(matrix(g, w->ffn_gate, &l->ffn_gate));
    CORE_TRY(matrix(g, w->ffn_up, &l->ffn_up));
    CORE_TRY(matrix(g, w->ffn_down, &l->ffn_down));
    CORE_TRY(matrix(g, w->gate_inp, &l->gate_inp));
    CORE_TRY(matrix(g, w->gate_shexp, &l->gate_shexp));
    CORE_TRY(matrix(g, w->up_shexp, &l->up_shexp));
    CORE_TRY(matrix(g, w->down_shexp, &l->down_shexp));
    if (w->gate_exps) {
        l->moe = (struct cuda_moe){.n_expert = (int)hp->n_expert, .k = (int)hp->n_expert_used};
        CORE_TRY(matrix(g, w->gate_exps, &l->moe.gate));
        CORE_TRY(matrix(g, w->up_exps, &l->moe.up));
        CORE_TRY(matrix(g, w->down_exps, &l->moe.down));
    }
    return PSHARD_OK;
}

static void grow_work(size_t *work, size_t need) { *work = need > *work ? need : *work; }

/* The largest work buffer any kernel of a step needs: every product, attention, experts. */
static size_t work_bytes_needed(const struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct model_hparams *hp = &ctx->model->hp;
    const int64_t B = ctx->params.n_batch;
    size_t work = 0;
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        const struct gpu_layer *l = &g->layers[il];
        const struct cuda_matrix *mats[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                                            &l->gate_inp, &l->gate_shexp, &l->up_shexp, &l->down_shexp};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (mats[i]->data) grow_work(&work, cuda_matmul_work_bytes(mats[i], B));
        if (l->moe.gate.data) grow_work(&work, cuda_moe_work_bytes(&l->moe, B));
    }
    grow_work(&work, cuda_matmul_work_bytes(&g->output, B));
    grow_work(&work, cuda_attention_decode_work_bytes(&g->attn_shape, B, ctx->params.n_ctx));
    return work;
}

static pshard_status carve(struct exec_gpu *g, size_t bytes, const char *what, void **out) {
    CORE_TRY(cuda_arena_alloc(&g->arena, bytes, what, out));
    return PSHARD_OK;
}

/* Activations of one step, for n_batch tokens; the same shapes as the CPU scratch. */
static pshard_status carve_activations(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct model_hparams *hp = &ctx->model->hp;
    const size_t B = (size_t)ctx->params.n_batch, d = hp->n_embd, f = sizeof(float);
    const size_t q_width = (size_t)hp->n_head * hp->head_dim_k, o_width = (size_t)hp->n_head * hp->head_dim_v;
    const size_t ff = hp->n_ff > hp->n_ff_shared_expert ? hp->n_ff : hp->n_ff_shared_expert;
    const size_t k_used = hp->n_expert_used ? hp->n_expert_used : 1, n_exp = hp->n_expert ? hp->n_expert : 1;
    const size_t before = g->arena.used;
    CORE_TRY(carve(g, f * B * d, "activations", (void **)&g->x));
    CORE_TRY(carve(g, f * B * d, "activations", (void **)&g->xn));
    CORE_TRY(carve(g, f * B * d, "activations", (void **)&g->proj));
    CORE_TRY(carve(g, f * B * q_width, "activations", (void **)&g->q));
    CORE_TRY(carve(g, f * B * (size_t)ctx->kv.k_width, "activations", (void **)&g->k));
    CORE_TRY(carve(g, f * B * (size_t)ctx->kv.v_width, "activations", (void **)&g->v));
    CORE_TRY(carve(g, f * B * o_width, "activations", (void **)&g->attn));
    CORE_TRY(carve(g, f * B * (ff ? ff : 1), "activations", (void **)&g->gate));
    CORE_TRY(carve(g, f * B * (ff ? ff : 1), "activations", (void **)&g->up));
    CORE_TRY(carve(g, f * B * n_exp, "activations", (void **)&g->router));
    CORE_TRY(carve(g, f * B * k_used, "activations", (void **)&g->expert_weights));
    CORE_TRY(carve(g, sizeof(int32_t) * B * k_used, "activations", (void **)&g->expert_ids));
    CORE_TRY(carve(g, f * B * (size_t)ctx->w.rope.n_dims, "activations", (void **)&g->rope_cs));
    CORE_TRY(carve(g, f * B * hp->n_vocab, "activations", (void **)&g->logits));
    CORE_TRY(carve(g, sizeof(int32_t) * B * 4, "activations", (void **)&g->tokens));
    g->pos = g->tokens + B, g->seq = g->pos + B, g->out_rows = g->seq + B;
    g->report.activation_bytes = g->arena.used - before;
    return PSHARD_OK;
}

static pshard_status carve_kv(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct kv_cache *kv = &ctx->kv;
    const size_t before = g->arena.used;
    for (int32_t il = 0; il < kv->n_layers; il++) {
        struct cuda_kv_layer *l = &g->kv[il];
        l->seq_stride_k = (int64_t)kv->n_ctx * kv->k_width;
        l->seq_stride_v = (int64_t)kv->n_ctx * kv->v_width;
        CORE_TRY(carve(g, sizeof(uint16_t) * (size_t)(l->seq_stride_k * kv->n_seq), "kv", (void **)&l->k));
        CORE_TRY(carve(g, sizeof(uint16_t) * (size_t)(l->seq_stride_v * kv->n_seq), "kv", (void **)&l->v));
    }
    g->report.kv_bytes = g->arena.used - before;
    return PSHARD_OK;
}

/* Bytes the arena needs: weights + KV + activations + work + cuBLAS workspace. Computed before
 * allocating, from the same shapes the carving uses, plus a little alignment slack. */
static size_t arena_bytes_needed(const struct exec_ctx *ctx, size_t work) {
    const struct model_hparams *hp = &ctx->model->hp;
    size_t bytes = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(ctx->model->file); i++)
        bytes += align_up(gguf_tensor_at(ctx->model->file, i)->n_bytes);
    const size_t B = (size_t)ctx->params.n_batch;
    const size_t widest = hp->n_vocab + 8 * (size_t)hp->n_embd + (size_t)hp->n_head * (hp->head_dim_k + hp->head_dim_v) +
                          2 * ((size_t)hp->n_ff + hp->n_ff_shared_expert) + hp->n_expert + 2 * hp->n_expert_used + 256;
    bytes += sizeof(float) * B * widest + 64 * CUDA_ARENA_ALIGN;
    bytes += kv_cache_bytes(&ctx->kv) + 2 * (size_t)ctx->kv.n_layers * CUDA_ARENA_ALIGN;
    return bytes + align_up(work) + CUDA_BLAS_WORKSPACE_BYTES + (1 << 20);
}

static pshard_status create(struct exec_gpu *g, struct exec_ctx *ctx) {
    const struct model_hparams *hp = &ctx->model->hp;
    if (cuda_device_count() == 0)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "no CUDA device: run on the CPU (without --gpu)");
    CORE_TRY(cuda_ctx_create(0, &g->cuda));
    g->no_graphs = getenv("PSHARD_NO_CUDA_GRAPHS") != NULL;
    g->stream = cuda_ctx_compute_stream(g->cuda);
    g->report.context_bytes = cuda_ctx_info(g->cuda)->context_bytes + cuda_ctx_info(g->cuda)->blas_bytes;
    g->attn_shape = (struct cuda_attn_shape){(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k,
                                             (int)hp->head_dim_v, 1.0f / sqrtf((float)hp->head_dim_k)};
    g->layers = calloc(hp->n_layers, sizeof *g->layers);
    g->kv = calloc((size_t)ctx->kv.n_layers, sizeof *g->kv);
    g->cap_uploaded = (uint32_t)gguf_tensor_count(ctx->model->file);
    g->uploaded = calloc(g->cap_uploaded ? g->cap_uploaded : 1, sizeof *g->uploaded);
    if (!g->layers || !g->kv || !g->uploaded) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    CORE_TRY(cuda_host_alloc(UPLOAD_CHUNK_BYTES, &g->staging));
    const size_t B = (size_t)ctx->params.n_batch;
    CORE_TRY(cuda_host_alloc(sizeof(int32_t) * B * 4, &g->host_in));
    CORE_TRY(cuda_host_alloc(sizeof(float) * B * hp->n_vocab, &g->host_logits));

    /* Size the work buffer from host-side shapes first (views without device data), then make
     * the arena exactly what the plan needs, then carve and upload. */
    struct exec_gpu probe = *g;
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        const struct layer_weights *w = &ctx->w.layers[il];
        struct gpu_layer *l = &probe.layers[il];
        const struct gguf_tensor *ts[] = {w->wq, w->wk, w->wv, w->wo, w->ffn_gate, w->ffn_up, w->ffn_down, w->gate_inp,
                                          w->gate_shexp, w->up_shexp, w->down_shexp, w->gate_exps, w->up_exps, w->down_exps};
        struct cuda_matrix *ms[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down, &l->gate_inp,
                                    &l->gate_shexp, &l->up_shexp, &l->down_shexp, &l->moe.gate, &l->moe.up, &l->moe.down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            CORE_TRY(check_type(ts[i]));
            if (ts[i])
                *ms[i] = (struct cuda_matrix){(enum quant_type)ts[i]->type, (const void *)1, ts[i]->ne[0], ts[i]->ne[1],
                                              ts[i]->ne[2], quant_row_bytes((enum quant_type)ts[i]->type, ts[i]->ne[0])};
        }
        l->moe.n_expert = (int)hp->n_expert;
        l->moe.k = (int)hp->n_expert_used;
    }
    const struct gguf_tensor *out_t = ctx->w.output;
    CORE_TRY(check_type(out_t));
    probe.output = (struct cuda_matrix){(enum quant_type)out_t->type, (const void *)1, out_t->ne[0], out_t->ne[1], 1,
                                        quant_row_bytes((enum quant_type)out_t->type, out_t->ne[0])};
    const size_t work = work_bytes_needed(&probe, ctx);
    memset(g->layers, 0, hp->n_layers * sizeof *g->layers);

    CORE_TRY(cuda_arena_create(&g->arena, arena_bytes_needed(ctx, work)));
    g->report.arena_bytes = g->arena.size;
    void *blas;
    CORE_TRY(carve(g, CUDA_BLAS_WORKSPACE_BYTES, "cublas", &blas));
    CORE_TRY(cuda_ctx_set_blas_workspace(g->cuda, blas, CUDA_BLAS_WORKSPACE_BYTES));
    CORE_TRY(carve(g, work, "work", &g->work));
    g->work_bytes = work;
    g->report.work_bytes = align_up(work) + CUDA_BLAS_WORKSPACE_BYTES;
    CORE_TRY(carve_kv(g, ctx));
    CORE_TRY(carve_activations(g, ctx));
    for (uint32_t il = 0; il < hp->n_layers; il++) CORE_TRY(upload_layer(g, &ctx->w.layers[il], hp, &g->layers[il]));
    CORE_TRY(matrix(g, ctx->w.token_embd, &g->token_embd));
    CORE_TRY(matrix(g, ctx->w.output, &g->output));
    CORE_TRY(vector(g, ctx->w.output_norm, &g->output_norm));
    CORE_TRY(vector(g, ctx->w.rope_freqs, &g->rope_freqs));
    return cuda_stream_sync(g->stream);
}

pshard_status exec_gpu_create(struct exec_ctx *ctx, struct exec_gpu **out) {
    *out = NULL;
    struct exec_gpu *g = calloc(1, sizeof *g);
    if (!g) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    pshard_status st = create(g, ctx);
    if (st != PSHARD_OK) {
        exec_gpu_free(g);
        return st;
    }
    *out = g;
    return PSHARD_OK;
}

void exec_gpu_free(struct exec_gpu *g) {
    if (!g) return;
    if (g->arena.base) cuda_arena_destroy(&g->arena);
    cuda_pinned_release(&g->staging);
    cuda_pinned_release(&g->host_in);
    cuda_pinned_release(&g->host_logits);
    cuda_graph_destroy(g->decode_graph);
    if (g->cuda) cuda_ctx_destroy(g->cuda);
    free(g->layers);
    free(g->kv);
    free(g->uploaded);
    free(g);
}

const struct gpu_memory_report *exec_gpu_report(const struct exec_gpu *g) { return &g->report; }
