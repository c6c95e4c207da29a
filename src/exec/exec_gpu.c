/* The all-in-VRAM placement: sizing the arena, uploading the weights through a pinned buffer,
 * and device views of every tensor. The step and the shards are in shards_gpu.c. */
#include "exec/exec_gpu.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timer.h"
#include "exec/exec_gpu_internal.h"
#include "plan/planner.h"

enum { UPLOAD_CHUNK_BYTES = 64 << 20 };

static size_t align_up(size_t n) { return cuda_align(n); }

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

/* Copy weights (the model file's bytes) to the device: straight from the mapping where it is
 * registered (at pinned speed, on the compute stream; nothing to wait for), else through the
 * pinned buffer. */
static pshard_status upload_weights(struct exec_gpu *g, void *dst, const void *src, size_t bytes) {
    if (g->n_registered) return cuda_copy_h2d(dst, src, bytes, g->stream);
    return upload(g, dst, src, bytes);
}

/* The device copy of a tensor, uploaded on first use (a tied head shares the embedding's); `later`:
 * copied on the uploads stream, in the background (g->background), not yet to be read. */
static pshard_status device_tensor(struct exec_gpu *g, const struct gguf_tensor *t, bool later, const void **out) {
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
    CORE_TRY(later ? cuda_copy_h2d(dev, t->data, t->n_bytes, g->uploads) : upload_weights(g, dev, t->data, t->n_bytes));
    g->uploaded[g->n_uploaded++] = (struct gpu_tensor){t, dev};
    g->report.weight_bytes += align_up(t->n_bytes);
    *out = dev;
    return PSHARD_OK;
}

/* Tensor t as the kernels see it: its data at `data` (VRAM, or host memory read in place), the
 * first n_experts of its experts. */
static struct cuda_matrix matrix_of(const struct gguf_tensor *t, const void *data, int64_t n_experts, bool in_place) {
    return (struct cuda_matrix){(enum quant_type)t->type, data, t->ne[0], t->ne[1], n_experts,
                                quant_row_bytes((enum quant_type)t->type, t->ne[0]), in_place};
}

/* Matrix *m, resident, read in place from host memory until its copy (dev) is in VRAM: pending
 * (g->background). */
static pshard_status defer(struct exec_gpu *g, const struct gguf_tensor *t, struct cuda_matrix *m, struct cuda_matrix dev) {
    if (g->n_pending == g->cap_pending) {
        const uint32_t cap = g->cap_pending ? 2 * g->cap_pending : 64;
        struct pending_matrix *p = realloc(g->pending, sizeof *p * cap);
        if (!p) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
        g->pending = p, g->cap_pending = cap;
    }
    const void *host;
    CORE_TRY(cuda_host_device_pointer(t->data, &host));
    *m = matrix_of(t, host, dev.n_experts, true);
    g->pending[g->n_pending++] = (struct pending_matrix){m, dev};
    return PSHARD_OK;
}

static pshard_status matrix(struct exec_gpu *g, const struct gguf_tensor *t, struct cuda_matrix *m) {
    memset(m, 0, sizeof *m);
    if (!t) return PSHARD_OK;
    CORE_TRY(check_type(t));
    const void *dev;
    CORE_TRY(device_tensor(g, t, g->background, &dev));
    *m = matrix_of(t, dev, t->ne[2], false);
    return g->background ? defer(g, t, m, *m) : PSHARD_OK;
}

static pshard_status vector(struct exec_gpu *g, const struct gguf_tensor *t, const float **out) {
    return device_tensor(g, t, false, (const void **)out);
}

/* A matrix the GPU reads in place from the registered host mapping (a streamed shard). */
static pshard_status host_matrix(const struct gguf_tensor *t, struct cuda_matrix *m) {
    memset(m, 0, sizeof *m);
    if (!t) return PSHARD_OK;
    CORE_TRY(check_type(t));
    const void *dev;
    CORE_TRY(cuda_host_device_pointer(t->data, &dev));
    *m = matrix_of(t, dev, t->ne[2], true);
    return PSHARD_OK;
}

/* A resident matrix (uploaded) or a streamed one (read from host memory). */
static pshard_status bind_matrix(struct exec_gpu *g, const struct gguf_tensor *t, bool resident, struct cuda_matrix *m) {
    return resident ? matrix(g, t, m) : host_matrix(t, m);
}

static pshard_status upload_attn(struct exec_gpu *g, const struct layer_weights *w, bool resident, struct gpu_layer *l) {
    CORE_TRY(vector(g, w->attn_norm, &l->attn_norm));
    CORE_TRY(vector(g, w->bq, &l->bq));
    CORE_TRY(vector(g, w->bk, &l->bk));
    CORE_TRY(vector(g, w->bv, &l->bv));
    CORE_TRY(vector(g, w->bo, &l->bo));
    CORE_TRY(vector(g, w->q_norm, &l->q_norm));
    CORE_TRY(vector(g, w->k_norm, &l->k_norm));
    CORE_TRY(bind_matrix(g, w->wq, resident, &l->wq));
    CORE_TRY(bind_matrix(g, w->wk, resident, &l->wk));
    CORE_TRY(bind_matrix(g, w->wv, resident, &l->wv));
    return bind_matrix(g, w->wo, resident, &l->wo);
}

/* The first r experts of a 3-D expert tensor, uploaded as one range (a 3-D matrix of r). */
static pshard_status upload_experts(struct exec_gpu *g, const struct gguf_tensor *t, uint32_t r, struct cuda_matrix *m) {
    CORE_TRY(check_type(t));
    const size_t per = t->n_bytes / (size_t)t->ne[2];
    void *dev;
    CORE_TRY(cuda_arena_alloc(&g->arena, per * r, "weights", &dev));
    CORE_TRY(g->background ? cuda_copy_h2d(dev, t->data, per * r, g->uploads) : upload_weights(g, dev, t->data, per * r));
    g->report.weight_bytes += align_up(per * r);
    *m = matrix_of(t, dev, r, false);
    return g->background ? defer(g, t, m, *m) : PSHARD_OK;
}

/* Where expert e of MoE shard `shard` is in the slot the ring's last units left it in
 * (plan.experts_lent): matrix m of the unit holding it. */
static const void *lent_expert(const struct exec_gpu *g, const struct plan *plan, const struct layer_weights *w,
                               uint32_t shard, uint32_t e, const size_t stride[3], int m) {
    for (uint32_t j = g->n_units > plan->n_slots ? g->n_units - plan->n_slots : 0; j < g->n_units; j++) {
        const struct plan_unit *u = &g->units[j];
        if (u->shard != shard || e < u->first || e >= u->end) continue;
        uintptr_t base[3];
        expert_slot_bases(w, u->first, u->end, g->slot[j % plan->n_slots], base);
        return (const void *)(base[m] + stride[m] * e);
    }
    return NULL;
}

/* Tables of where each expert's gate, up and down are: [0, r) in VRAM (moe; in host memory while
 * pending), the next `lent` in the ring's slots (plan.experts_lent; for tiers without the ring),
 * the rest in host memory (moe_host), for one call over them all; written at `dev` where given
 * (rewritten once pending experts are in), else in a place of their own in the arena. */
static pshard_status expert_tables(struct exec_gpu *g, const struct plan *plan, const struct layer_weights *w,
                                   uint32_t shard, uint32_t r, uint32_t lent, struct gpu_layer *l, void **dev) {
    const int E = l->moe_host.n_expert;
    const struct cuda_matrix *vram[3] = {&l->moe.gate, &l->moe.up, &l->moe.down};
    const struct cuda_matrix *host[3] = {&l->moe_host.gate, &l->moe_host.up, &l->moe_host.down};
    size_t stride[3];
    for (int m = 0; m < 3; m++) stride[m] = (size_t)host[m]->n_rows * host[m]->row_bytes;
    const void **table = malloc(sizeof(void *) * (size_t)E * 3);
    if (!table) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < E; e++) {
            const uint32_t x = (uint32_t)e;
            table[m * E + e] = x >= r && x < r + lent ? lent_expert(g, plan, w, shard, x, stride, m)
                                                      : (const uint8_t *)(x < r ? vram[m]->data : host[m]->data) + stride[m] * x;
            if (!table[m * E + e]) {
                free(table);
                return core_fail(PSHARD_ERR_INTERNAL, "expert %d of shard %u is lent but not in a last unit of the ring", e, shard);
            }
        }
    pshard_status st = dev ? PSHARD_OK : cuda_arena_alloc(&g->arena, sizeof(void *) * (size_t)E * 3, "activations", (void **)&dev);
    if (st == PSHARD_OK) st = upload(g, dev, table, sizeof(void *) * (size_t)E * 3);
    free(table);
    CORE_TRY(st);
    l->moe_all = l->moe_host;
    l->moe_all.gate_ptrs = (const void *const *)dev;
    l->moe_all.up_ptrs = (const void *const *)dev + E;
    l->moe_all.down_ptrs = (const void *const *)dev + 2 * E;
    l->moe_all.gate.data = l->moe_all.up.data = l->moe_all.down.data = NULL;
    return PSHARD_OK;
}

static pshard_status upload_ffn(struct exec_gpu *g, const struct plan *plan, uint32_t shard, uint32_t layer,
                                const struct layer_weights *w, const struct model_hparams *hp, bool resident,
                                bool experts_streamed, struct gpu_layer *l) {
    const uint32_t experts_resident = plan->experts_resident[layer];
    const uint32_t lent = plan->experts_lent ? plan->experts_lent[layer] : 0;
    CORE_TRY(vector(g, w->ffn_norm, &l->ffn_norm));
    CORE_TRY(vector(g, w->gate_inp_shexp, &l->gate_inp_shexp));
    CORE_TRY(bind_matrix(g, w->ffn_gate, resident, &l->ffn_gate));
    CORE_TRY(bind_matrix(g, w->ffn_up, resident, &l->ffn_up));
    CORE_TRY(bind_matrix(g, w->ffn_down, resident, &l->ffn_down));
    /* An MoE shard's router and shared expert are resident whenever the shard is on the GPU. */
    CORE_TRY(matrix(g, w->gate_inp, &l->gate_inp));
    CORE_TRY(matrix(g, w->gate_shexp, &l->gate_shexp));
    CORE_TRY(matrix(g, w->up_shexp, &l->up_shexp));
    CORE_TRY(matrix(g, w->down_shexp, &l->down_shexp));
    if (w->gate_exps) {
        const struct cuda_moe base = {.n_expert = (int)hp->n_expert, .k = (int)hp->n_expert_used};
        l->moe = l->moe_host = base;
        if (experts_resident == hp->n_expert) {
            CORE_TRY(matrix(g, w->gate_exps, &l->moe.gate));
            CORE_TRY(matrix(g, w->up_exps, &l->moe.up));
            CORE_TRY(matrix(g, w->down_exps, &l->moe.down));
        } else if (experts_resident) {
            CORE_TRY(upload_experts(g, w->gate_exps, experts_resident, &l->moe.gate));
            CORE_TRY(upload_experts(g, w->up_exps, experts_resident, &l->moe.up));
            CORE_TRY(upload_experts(g, w->down_exps, experts_resident, &l->moe.down));
        }
        if (experts_streamed) {
            CORE_TRY(host_matrix(w->gate_exps, &l->moe_host.gate));
            CORE_TRY(host_matrix(w->up_exps, &l->moe_host.up));
            CORE_TRY(host_matrix(w->down_exps, &l->moe_host.down));
            if ((experts_resident > 0 || lent > 0) && experts_resident < hp->n_expert)
                CORE_TRY(expert_tables(g, plan, w, shard, experts_resident, lent, l, NULL));
        }
    }
    return PSHARD_OK;
}

static void grow_work(size_t *work, size_t need) { *work = need > *work ? need : *work; }

/* A matrix's shape without device data (for sizing work buffers before anything is uploaded). */
static struct cuda_matrix shape_of(const struct gguf_tensor *t) {
    struct cuda_matrix m = {0};
    if (t)
        m = matrix_of(t, NULL, t->ne[2], false);
    return m;
}

/* The largest work buffer any kernel of a step needs: every product, attention, experts. */
static size_t work_bytes_needed(const struct model *model, const struct model_weights *w, const struct exec_params *p) {
    const struct model_hparams *hp = &model->hp;
    const int64_t B = p->n_batch;
    size_t work = 0;
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        const struct layer_weights *l = &w->layers[il];
        const struct gguf_tensor *mats[] = {l->wq, l->wk, l->wv, l->wo, l->ffn_gate, l->ffn_up, l->ffn_down, l->gate_inp,
                                            l->gate_shexp, l->up_shexp, l->down_shexp};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            const struct cuda_matrix m = shape_of(mats[i]);
            if (mats[i]) grow_work(&work, cuda_matmul_work_bytes(&m, B));
        }
        if (l->gate_exps) {
            struct cuda_moe moe = {shape_of(l->gate_exps), shape_of(l->up_exps), shape_of(l->down_exps),
                                   (int)hp->n_expert, (int)hp->n_expert_used, NULL, NULL, NULL, NULL, 0, 0};
            /* Experts in VRAM and read in place take the tiled path past different bounds: each
             * way's largest step, and its matrix-vector kernel's largest. */
            struct cuda_moe in_place = moe;
            in_place.gate.in_place = in_place.up.in_place = in_place.down.in_place = true;
            const struct cuda_moe *ways[] = {&moe, &in_place};
            for (int i = 0; i < 2; i++) {
                const int64_t matvec = cuda_moe_matvec_bound(ways[i]);
                grow_work(&work, cuda_moe_work_bytes(ways[i], B));
                grow_work(&work, cuda_moe_work_bytes(ways[i], B < matvec ? B : matvec));
            }
        }
    }
    const struct cuda_matrix out = shape_of(w->output);
    grow_work(&work, cuda_matmul_work_bytes(&out, B));
    const struct cuda_attn_shape a = {(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v, 1};
    /* (fewer tokens cut the cache into more slices: a step of several sequences' tokens, which
     * takes the split-KV kernel at any count, can need more than the largest step) */
    for (int64_t n = 1; n <= B; n++) grow_work(&work, cuda_attention_decode_work_bytes(&a, n, p->n_ctx));
    grow_work(&work, cuda_attention_prefill_work_bytes(&a, B, p->n_ctx));
    return align_up(work);
}

/* One step's activation buffers for n_batch tokens, the same shapes as the CPU scratch (the
 * logits and the batch's indices apart): one list, summed for the planner and carved for the step,
 * each part into the field of struct exec_gpu at `field`. */
enum { ACT_PARTS = 13 };
struct act_part {
    size_t bytes, field;
};
static void activation_parts(const struct model_hparams *hp, const struct model_weights *w, size_t B, size_t k_width,
                             size_t v_width, struct act_part out[ACT_PARTS]) {
    const size_t f = sizeof(float), d = hp->n_embd;
    const size_t q_width = (size_t)hp->n_head * hp->head_dim_k, o_width = (size_t)hp->n_head * hp->head_dim_v;
    const size_t ff = w->ffn_rows ? (size_t)w->ffn_rows : 1; /* (0 in a model of experts alone: no dense FFN) */
    const size_t k_used = hp->n_expert_used ? hp->n_expert_used : 1, n_exp = hp->n_expert ? hp->n_expert : 1;
#define AT(name) offsetof(struct exec_gpu, name)
    const struct act_part parts[ACT_PARTS] = {
        {f * B * d, AT(x)},
        {f * B * d, AT(xn)},
        {f * B * d, AT(proj)},
        {f * B * q_width, AT(q)},
        {f * B * k_width, AT(k)},
        {f * B * v_width, AT(v)},
        {f * B * o_width, AT(attn)},
        {f * B * ff, AT(gate)},
        {f * B * ff, AT(up)},
        {f * B * n_exp, AT(router)},
        {f * B * k_used, AT(expert_weights)},
        {sizeof(int32_t) * B * k_used, AT(expert_ids)},
        {f * B * (size_t)w->rope.n_dims, AT(rope_cs)},
    };
#undef AT
    memcpy(out, parts, sizeof parts);
}

/* The activations' bytes in the arena, as carve_activations takes them (the logits separately). */
static size_t activation_bytes(const struct model_hparams *hp, const struct model_weights *w, const struct exec_params *p,
                               int64_t k_width, int64_t v_width, size_t *logits) {
    const size_t B = (size_t)p->n_batch;
    struct act_part parts[ACT_PARTS];
    activation_parts(hp, w, B, (size_t)k_width, (size_t)v_width, parts);
    size_t total = align_up(sizeof(int32_t) * B * GPU_BATCH_ROWS) + 2 * CUDA_ARENA_ALIGN;
    for (int i = 0; i < ACT_PARTS; i++) total += align_up(parts[i].bytes) + 2 * CUDA_ARENA_ALIGN;
    *logits = align_up(sizeof(float) * (size_t)gpu_logit_rows(p->n_batch, p->n_seq) * hp->n_vocab);
    return total;
}

pshard_status exec_gpu_costs(const struct model *model, const struct model_weights *w, const struct exec_params *p,
                             struct plan_gpu_costs *out) {
    const struct model_hparams *hp = &model->hp;
    size_t logits;
    out->activations = activation_bytes(hp, w, p, (int64_t)hp->n_head_kv * hp->head_dim_k,
                                        (int64_t)hp->n_head_kv * hp->head_dim_v, &logits);
    out->logits = logits;
    out->buffers = out->activations;
    out->work = work_bytes_needed(model, w, p);
    out->blas = CUDA_BLAS_WORKSPACE_BYTES;
    /* The kernels the steps run, by size, for the cost model: the rules the GPU code follows. */
    const struct cuda_attn_shape a = {(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v, 1};
    out->kernels.attention_prompt_from = cuda_attention_prefill_from(&a);
    /* (the experts' rule from VRAM, and for a call that reads some in place) */
    struct cuda_moe moe = {.n_expert = (int)hp->n_expert, .k = (int)hp->n_expert_used};
    for (uint32_t il = 0; il < hp->n_layers && !moe.gate.n_cols; il++) moe.gate = shape_of(w->layers[il].gate_exps);
    out->kernels.moe_matvec_max_tokens = cuda_moe_matvec_bound(&moe);
    moe.gate.in_place = true;
    out->kernels.moe_matvec_max_tokens_in_place = cuda_moe_matvec_bound(&moe);
    /* The KV block table, one row a sequence. */
    out->activations += align_up(sizeof(int32_t) * (size_t)p->n_seq * (size_t)((p->n_ctx + KV_BLOCK_CELLS - 1) / KV_BLOCK_CELLS));
    /* The driver maps registered host memory for the GPU with 8 bytes of page table per 4 KiB
     * page, as measured. */
    out->host_mapping = ((gguf_file_bytes(model->file) / 512 >> 20) + 2) << 20;
    /* Every tensor of a layer (and the KV cache) is carved on its own, each rounded up; and a
     * margin. */
    out->margin = 1 << 20;
    out->activations += (uint64_t)hp->n_layers * 32 * CUDA_ARENA_ALIGN + out->margin;
    /* An MoE layer's expert tables (one call) and its masks past the pieces' (in the slack above). */
    out->activations += (uint64_t)hp->n_layers * hp->n_expert * (3 * sizeof(void *) + 2 * PLAN_TIERS) +
                        (uint64_t)hp->n_layers * 2 * CUDA_ARENA_ALIGN;
    return PSHARD_OK;
}

static pshard_status carve(struct exec_gpu *g, size_t bytes, const char *what, void **out) {
    CORE_TRY(cuda_arena_alloc(&g->arena, bytes, what, out));
    return PSHARD_OK;
}

/* Activations of one step, for n_batch tokens (activation_parts), the logits where the head is
 * on the GPU, and the batch's indices. */
static pshard_status carve_activations(struct exec_gpu *g, const struct exec_ctx *ctx, bool head_on_gpu) {
    const struct model_hparams *hp = &ctx->model->hp;
    const size_t B = (size_t)ctx->params.n_batch;
    const size_t before = g->arena.used;
    struct act_part parts[ACT_PARTS];
    activation_parts(hp, &ctx->w, B, (size_t)ctx->kv.k_width, (size_t)ctx->kv.v_width, parts);
    for (int i = 0; i < ACT_PARTS; i++)
        CORE_TRY(carve(g, parts[i].bytes, "activations", (void **)((char *)g + parts[i].field)));
    g->logit_rows = gpu_logit_rows(ctx->params.n_batch, ctx->params.n_seq);
    if (head_on_gpu) CORE_TRY(carve(g, sizeof(float) * (size_t)g->logit_rows * hp->n_vocab, "logits", (void **)&g->logits));
    CORE_TRY(carve(g, sizeof(int32_t) * B * GPU_BATCH_ROWS, "activations", (void **)&g->tokens));
    g->pos = g->tokens + B, g->seq = g->pos + B, g->out_rows = g->seq + B, g->rope_pos = g->out_rows + B;
    g->report.activation_bytes = g->arena.used - before;
    return PSHARD_OK;
}

/* The KV block table's place, then each pool of the layers whose cache is in VRAM. */
static pshard_status carve_kv(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct kv_cache *kv = &ctx->kv;
    CORE_TRY(carve(g, sizeof(int32_t) * (size_t)kv->n_seq * (size_t)kv->max_blocks, "activations", (void **)&g->kv_table));
    g->table_stale = true;
    const size_t before = g->arena.used, cells = (size_t)kv_cache_cells(kv);
    for (int32_t il = 0; il < kv->n_layers; il++) {
        struct cuda_kv_layer *l = &g->kv[il];
        *l = (struct cuda_kv_layer){NULL, NULL, g->kv_table, kv->max_blocks, KV_BLOCK_CELLS};
        if (!ctx->active->kv_gpu[il]) continue; /* this layer's attention and KV stay on the host */
        CORE_TRY(carve(g, sizeof(uint16_t) * cells * (size_t)kv->k_width, "kv", (void **)&l->k));
        CORE_TRY(carve(g, sizeof(uint16_t) * cells * (size_t)kv->v_width, "kv", (void **)&l->v));
    }
    g->report.kv_bytes = g->arena.used - before;
    return PSHARD_OK;
}

/* Rows [row, row + n) of every layer's pool in VRAM: zeroed (dst NULL), or copied from src rows
 * (as rows, not bytes). */
static pshard_status kv_rows(struct exec_ctx *ctx, int64_t row, int64_t n, const int64_t *src) {
    struct exec_gpu *g = ctx->gpu;
    const struct kv_cache *kv = &ctx->kv;
    for (int32_t il = 0; il < kv->n_layers; il++) {
        const struct cuda_kv_layer *l = &g->kv[il];
        if (!l->k) continue;
        uint16_t *k = l->k + row * kv->k_width, *v = l->v + row * kv->v_width;
        const size_t kb = sizeof(uint16_t) * (size_t)(n * kv->k_width), vb = sizeof(uint16_t) * (size_t)(n * kv->v_width);
        if (!src) {
            CORE_TRY(cuda_memset(k, 0, kb, g->stream));
            CORE_TRY(cuda_memset(v, 0, vb, g->stream));
        } else {
            CORE_TRY(cuda_copy_d2d(k, l->k + *src * kv->k_width, kb, g->stream));
            CORE_TRY(cuda_copy_d2d(v, l->v + *src * kv->v_width, vb, g->stream));
        }
    }
    return PSHARD_OK;
}

pshard_status exec_gpu_clear_kv(struct exec_ctx *ctx, int32_t seq) {
    const struct kv_cache *kv = &ctx->kv;
    const int32_t *blocks = kv_cache_blocks(kv, seq);
    for (int32_t i = 0, n; i < kv->n_held[seq]; i += n) { /* a run of consecutive blocks at a time */
        for (n = 1; i + n < kv->n_held[seq] && blocks[i + n] == blocks[i] + n;) n++;
        CORE_TRY(kv_rows(ctx, (int64_t)blocks[i] * KV_BLOCK_CELLS, (int64_t)n * KV_BLOCK_CELLS, NULL));
    }
    return cuda_stream_sync(ctx->gpu->stream);
}

pshard_status exec_gpu_copy_cells(struct exec_ctx *ctx, int32_t dst, int32_t src, int32_t n_cells) {
    const int64_t from = (int64_t)src * KV_BLOCK_CELLS;
    return kv_rows(ctx, (int64_t)dst * KV_BLOCK_CELLS, n_cells, &from);
}

static bool experts_streamed(const struct plan *plan, int layer) {
    for (int t = 0; t < PLAN_TIERS; t++) {
        const struct plan_tier *tier = &plan->tier[t];
        if (tier->experts_gpu[layer] > plan->experts_resident[layer]) return true;
        /* (a routed tier may read some whatever its range) */
        if (tier->routed && tier->experts_gpu[layer] < plan->n_expert) return true;
    }
    return false;
}

/* Register the model file's mappings, so copies from them run at full speed and kernels can
 * read them in place. */
static pshard_status register_file(struct exec_gpu *g, const struct gguf_file *file) {
    const uint32_t n = gguf_part_count(file);
    g->registered = calloc(n, sizeof *g->registered);
    if (!g->registered) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    for (uint32_t p = 0; p < n; p++) {
        size_t size;
        const void *base = gguf_part_image(file, p, &size);
        CORE_TRY(cuda_host_register((void *)base, size, true, &g->registered[p]));
        g->n_registered = p + 1;
    }
    return PSHARD_OK;
}

/* Expert masks of every MoE layer: the resident range, each tier's streamed range, each tier's
 * GPU range (resident and streamed), and the staged pieces of the prompt tier; then the routed
 * tiers' quotas and their mask. */
static pshard_status make_masks(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct plan *plan = ctx->active;
    const uint32_t E = plan->n_expert, L = plan->n_layers;
    if (!E) return PSHARD_OK;
    const uint32_t P = plan->piece_experts ? (E + plan->piece_experts - 1) / plan->piece_experts : 0;
    const size_t per_layer = (size_t)E * (1 + 2 * PLAN_TIERS + P), quotas = PLAN_TIERS * (PLAN_MAX_ROUTED + 1);
    const size_t bytes = per_layer * L + quotas + E;
    uint8_t *host = calloc(bytes, 1);
    if (!host) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < L; l++) {
        uint8_t *m = host + l * per_layer;
        const uint32_t r = plan->experts_resident[l];
        for (uint32_t e = 0; e < r; e++) m[e] = 1;
        for (int t = 0; t < PLAN_TIERS; t++)
            for (uint32_t e = 0; e < plan->tier[t].experts_gpu[l] && e < E; e++) {
                if (e >= r) m[(size_t)E * (1 + t) + e] = 1;
                m[(size_t)E * (1 + PLAN_TIERS + t) + e] = 1;
            }
        for (uint32_t p = 0; p < P; p++)
            for (uint32_t e = r + p * plan->piece_experts; e < r + (p + 1) * plan->piece_experts && e < E; e++)
                m[(size_t)E * (1 + 2 * PLAN_TIERS + p) + e] = 1;
    }
    for (int t = 0; t < PLAN_TIERS; t++)
        memcpy(host + per_layer * L + t * (PLAN_MAX_ROUTED + 1), plan->tier[t].routed_quota, PLAN_MAX_ROUTED + 1);
    pshard_status st = carve(g, bytes, "activations", (void **)&g->masks);
    if (st == PSHARD_OK) st = upload(g, g->masks, host, bytes);
    free(host);
    CORE_TRY(st);
    for (uint32_t l = 0; l < L; l++) {
        const uint8_t *m = g->masks + l * per_layer;
        g->layers[l].mask_resident = m;
        for (int t = 0; t < PLAN_TIERS; t++) {
            g->layers[l].mask_streamed[t] = m + (size_t)E * (1 + t);
            g->layers[l].mask_gpu[t] = m + (size_t)E * (1 + PLAN_TIERS + t);
        }
        g->layers[l].mask_pieces = m + (size_t)E * (1 + 2 * PLAN_TIERS);
    }
    for (int t = 0; t < PLAN_TIERS; t++) g->routed_quota[t] = g->masks + per_layer * L + t * (PLAN_MAX_ROUTED + 1);
    g->routed_mask = g->masks + per_layer * L + quotas;
    return PSHARD_OK;
}

/* The staging ring and the units of the tiers that use it (they all stream everything not
 * resident, so they share one list), in the order a step uses them; also for a plan that lends
 * the slots to tiers without the ring. */
static pshard_status make_ring(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct plan *plan = ctx->active;
    const bool lends = plan_lends(plan);
    int ring = 0, gpu = -1;
    for (int t = PLAN_TIERS - 1; t >= 0; t--) gpu = plan->tier[t].family != PLAN_CPU ? t : gpu;
    while (ring < PLAN_TIERS && !plan->tier[ring].ring) ring++;
    if ((ring == PLAN_TIERS && !lends) || gpu < 0) return PSHARD_OK;
    const struct model *model = ctx->model;
    g->copy = cuda_ctx_copy_stream(g->cuda);
    for (uint32_t s = 0; s < plan->n_slots; s++) {
        CORE_TRY(carve(g, plan->slot_bytes, "staging", (void **)&g->slot[s]));
        if (!g->filled[s]) CORE_TRY(cuda_event_create(false, &g->filled[s]));
        if (!g->freed[s]) CORE_TRY(cuda_event_create(false, &g->freed[s]));
    }
    g->units = calloc(plan_ring_units_max(plan), sizeof *g->units);
    if (!g->units) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    g->n_units = plan_ring_units(plan, model, &plan->tier[ring < PLAN_TIERS ? ring : gpu], g->units);
    /* What the plan lends must be what a ring step leaves in the slots. */
    for (uint32_t i = 0; lends && i < plan->n_shards; i++) {
        bool last = false;
        for (uint32_t j = g->n_units > plan->n_slots ? g->n_units - plan->n_slots : 0; j < g->n_units; j++)
            last |= g->units[j].shard == i;
        if (plan->lent[i] && !last) return core_fail(PSHARD_ERR_INTERNAL, "shard %u is lent but not a last unit of the ring", i);
    }
    return PSHARD_OK;
}

/* The arena's contents under the active plan: cuBLAS's workspace, work buffers, the KV cache of
 * the layers in VRAM, activations, expert masks, the staging ring, and the resident weights
 * (uploaded) or the device views of the streamed ones. */
static pshard_status carve_plan(struct exec_gpu *g, struct exec_ctx *ctx) {
    const struct model *model = ctx->model;
    const struct model_hparams *hp = &model->hp;
    const struct plan *plan = ctx->active;
    void *blas;
    CORE_TRY(carve(g, CUDA_BLAS_WORKSPACE_BYTES, "cublas", &blas));
    CORE_TRY(cuda_ctx_set_blas_workspace(g->cuda, blas, CUDA_BLAS_WORKSPACE_BYTES));
    g->work_bytes = plan->budget.work;
    CORE_TRY(carve(g, g->work_bytes, "work", &g->work));
    g->report.work_bytes = g->work_bytes + CUDA_BLAS_WORKSPACE_BYTES;
    CORE_TRY(carve_kv(g, ctx));
    CORE_TRY(carve_activations(g, ctx, plan_shard_place(plan, model->n_shards - 1) != PLACE_CPU));
    CORE_TRY(make_masks(g, ctx));
    CORE_TRY(make_ring(g, ctx));
    g->report.staging_bytes = (uint64_t)plan->n_slots * plan->slot_bytes * (g->n_units > 0);
    g->report.weight_bytes = 0;
    for (uint32_t i = 0; i < model->n_shards; i++) {
        const struct shard *s = &model->shards[i];
        const enum placement place = plan_shard_place(plan, i);
        const bool resident = place == PLACE_RESIDENT;
        if (place == PLACE_CPU) continue;
        switch (s->kind) {
        case SHARD_EMBED: CORE_TRY(bind_matrix(g, ctx->w.token_embd, resident, &g->token_embd)); break;
        case SHARD_ATTN: CORE_TRY(upload_attn(g, &ctx->w.layers[s->layer], resident, &g->layers[s->layer])); break;
        case SHARD_FFN:
        case SHARD_MOE:
            CORE_TRY(upload_ffn(g, plan, i, s->layer, &ctx->w.layers[s->layer], hp, resident || s->kind == SHARD_MOE,
                                s->kind == SHARD_MOE && experts_streamed(plan, s->layer), &g->layers[s->layer]));
            break;
        case SHARD_HEAD:
            CORE_TRY(bind_matrix(g, ctx->w.output, resident, &g->output));
            CORE_TRY(vector(g, ctx->w.output_norm, &g->output_norm));
            break;
        case SHARD_KIND_COUNT: break;
        }
        if (s->kind == SHARD_ATTN && !g->rope_freqs) CORE_TRY(vector(g, ctx->w.rope_freqs, &g->rope_freqs));
    }
    return PSHARD_OK;
}

/* The captured decode step let go: the next decode step captures it again. */
static void drop_decode_graph(struct exec_gpu *g) {
    cuda_graph_destroy(g->decode_graph);
    g->decode_graph = NULL;
    g->decode_graph_bytes = g->decode_graph_streamed = 0;
}

static pshard_status reserve_logits(struct exec_gpu *g, const struct exec_ctx *ctx, int32_t n) {
    if (n <= g->host_logit_rows) return PSHARD_OK;
    const int32_t rows = exec_logit_rows_for(ctx, n);
    struct cuda_pinned grown;
    CORE_TRY(cuda_host_alloc(sizeof(float) * (size_t)rows * ctx->model->hp.n_vocab, &grown));
    drop_decode_graph(g);
    cuda_pinned_release(&g->host_logits);
    g->host_logits = grown;
    g->host_logit_rows = rows;
    return PSHARD_OK;
}

pshard_status exec_gpu_reserve_logits(struct exec_ctx *ctx, int32_t n) { return reserve_logits(ctx->gpu, ctx, n); }

/* Forget what the arena holds under the active plan, to carve it for another (copies still on
 * their way up are waited for first: they write into it). */
static void forget_plan(struct exec_gpu *g, const struct exec_ctx *ctx) {
    if (g->n_pending) cuda_stream_sync(g->uploads);
    g->n_pending = 0;
    drop_decode_graph(g);
    free(g->units);
    g->units = NULL;
    g->n_units = g->next_fill = g->next_use = 0;
    memset(g->slot, 0, sizeof g->slot);
    memset(g->slot_used, 0, sizeof g->slot_used);
    g->ring_tier = NULL;
    g->ring_passed = g->lent_ready = g->rope_ready = false;
    g->n_uploaded = 0;
    memset(g->layers, 0, sizeof *g->layers * ctx->model->hp.n_layers);
    memset(g->kv, 0, sizeof *g->kv * (size_t)ctx->kv.n_layers);
    memset(&g->token_embd, 0, sizeof g->token_embd);
    memset(&g->output, 0, sizeof g->output);
    g->output_norm = g->rope_freqs = NULL;
    g->masks = g->routed_mask = NULL;
    memset(g->routed_quota, 0, sizeof g->routed_quota);
    cuda_arena_reset(&g->arena, 0);
}

/* The blocks sequences hold, of every layer whose KV cache is in VRAM, copied to the host's
 * pool (down) or from it: a run of consecutive held blocks a copy. */
static pshard_status move_kv(struct exec_gpu *g, struct exec_ctx *ctx, bool down) {
    const struct kv_cache *kv = &ctx->kv;
    for (int32_t il = 0; il < kv->n_layers; il++) {
        const struct cuda_kv_layer *l = &g->kv[il];
        if (!l->k) continue;
        for (int32_t b = 0, n; b < kv->n_blocks; b += n) {
            n = 1;
            if (!kv->refs[b]) continue;
            while (b + n < kv->n_blocks && kv->refs[b + n]) n++;
            const int64_t row = (int64_t)b * KV_BLOCK_CELLS, cells = (int64_t)n * KV_BLOCK_CELLS;
            uint16_t *k = kv_cache_k(kv, il, row), *v = kv_cache_v(kv, il, row);
            uint16_t *dk = l->k + row * kv->k_width, *dv = l->v + row * kv->v_width;
            const size_t kb = sizeof(uint16_t) * (size_t)(cells * kv->k_width), vb = sizeof(uint16_t) * (size_t)(cells * kv->v_width);
            CORE_TRY(down ? cuda_copy_d2h(k, dk, kb, g->stream) : cuda_copy_h2d(dk, k, kb, g->stream));
            CORE_TRY(down ? cuda_copy_d2h(v, dv, vb, g->stream) : cuda_copy_h2d(dv, v, vb, g->stream));
        }
    }
    return cuda_stream_sync(g->stream);
}

/* The host's KV cache registered (pinned, where the system lets it), so moving cells between it
 * and VRAM runs at the speed of pinned copies; once. */
static pshard_status pin_host_kv(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct kv_cache *kv = &ctx->kv;
    if (g->kv_host[0].ptr || !kv->k) return PSHARD_OK;
    const size_t cells = (size_t)kv->n_layers * (size_t)kv_cache_cells(kv);
    CORE_TRY(cuda_host_register_writable(kv->k, sizeof(uint16_t) * cells * (size_t)kv->k_width, &g->kv_host[0]));
    return cuda_host_register_writable(kv->v, sizeof(uint16_t) * cells * (size_t)kv->v_width, &g->kv_host[1]);
}

/* Both streams drained, the KV cells of the layers in VRAM copied to the host's cache and the
 * plan the arena holds forgotten, its allocation kept: steps are refused (broken) until
 * exec_gpu_fill. `pin`: the host's cache pinned first (once), for copies at full speed; a change
 * of budget copies to it unpinned instead and pins it once the memory is back (pinning faults in
 * and locks every page of the cache: the program the memory goes to would wait for that). A
 * failure before the plan is forgotten changes nothing. */
static pshard_status empty(struct exec_gpu *g, struct exec_ctx *ctx, bool pin) {
    if (pin) CORE_TRY(pin_host_kv(g, ctx));
    CORE_TRY(cuda_stream_sync(g->stream));
    if (g->copy) CORE_TRY(cuda_stream_sync(g->copy));
    CORE_TRY(move_kv(g, ctx, true));
    g->broken = true;
    forget_plan(g, ctx);
    return PSHARD_OK;
}

pshard_status exec_gpu_empty(struct exec_ctx *ctx) { return empty(ctx->gpu, ctx, true); }

pshard_status exec_gpu_fill(struct exec_ctx *ctx) {
    struct exec_gpu *g = ctx->gpu;
    CORE_TRY(carve_plan(g, ctx));
    CORE_TRY(move_kv(g, ctx, false));
    g->broken = false;
    return PSHARD_OK;
}

pshard_status exec_gpu_switch(struct exec_ctx *ctx, const struct plan *to) {
    struct exec_gpu *g = ctx->gpu;
    if (g->broken) return core_fail(PSHARD_ERR_INTERNAL, "the GPU's memory was left half carved by a failed change of plan");
    const double t0 = core_now_ms();
    CORE_TRY(exec_gpu_empty(ctx));
    ctx->active = to;
    CORE_TRY(exec_gpu_fill(ctx));
    g->report.switches++;
    g->report.switch_ms += core_now_ms() - t0;
    return PSHARD_OK;
}

static bool plan_streams_kv(const struct plan *p) { return p->kv_stream; }

/* Whether the plan of either phase (plan.decode) has what `has` asks. */
static bool either_phase(const struct exec_ctx *ctx, bool (*has)(const struct plan *)) {
    return has(&ctx->plan) || (ctx->plan.decode && has(ctx->plan.decode));
}

/* Pinned host buffers of the hand-offs with the CPU (layers split between the two), made for the
 * first plan that needs them (at creation, or at a change of budget) and kept. */
static pshard_status handoff_buffers(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const struct model_hparams *hp = &ctx->model->hp;
    if (g->host_xn.ptr || !(hp->n_expert || either_phase(ctx, plan_splits_ffn))) return PSHARD_OK;
    const size_t B = (size_t)ctx->params.n_batch, d = hp->n_embd, k = hp->n_expert_used ? hp->n_expert_used : 1;
    CORE_TRY(cuda_host_alloc(sizeof(float) * B * d, &g->host_xn));
    CORE_TRY(cuda_host_alloc(sizeof(float) * B * d, &g->host_moe));
    CORE_TRY(cuda_host_alloc((sizeof(int32_t) + sizeof(float)) * B * k, &g->host_route));
    CORE_TRY(cuda_host_device_pointer(g->host_xn.ptr, (const void **)&g->xn_to_host));
    CORE_TRY(cuda_host_device_pointer(g->host_moe.ptr, (const void **)&g->moe_from_host));
    CORE_TRY(cuda_host_device_pointer(g->host_route.ptr, (const void **)&g->route_to_host));
    CORE_TRY(cuda_event_create(false, &g->route_ready));
    CORE_TRY(cuda_flags_alloc(2 * (size_t)hp->n_layers, &g->flags, &g->flags_dev));
    if (ctx->params.options.trace_handoffs) CORE_TRY(cuda_stamps_alloc(2 * (size_t)hp->n_layers, &g->stamps, &g->stamps_dev));
    return PSHARD_OK;
}

/* What the budget keeps for the driver's mapping of the model file: the most either phase does. */
static uint64_t mapping_reserve(const struct exec_ctx *ctx) {
    uint64_t mapping = ctx->plan.budget.mapping;
    if (ctx->plan.decode && ctx->plan.decode->budget.mapping > mapping) mapping = ctx->plan.decode->budget.mapping;
    return mapping;
}

static void unregister_file(struct exec_gpu *g) {
    for (uint32_t p = 0; p < g->n_registered; p++) cuda_pinned_release(&g->registered[p]);
    free(g->registered);
    g->registered = NULL;
    g->n_registered = 0;
    g->report.mapping_bytes = 0;
}

/* The model file registered while some phase streams (or always, once budget changes are
 * expected: keep_mapped), measuring what the driver took for it; else unregistered (after a change
 * of budget), so that memory goes back too. */
static pshard_status map_file(struct exec_gpu *g, const struct exec_ctx *ctx) {
    const bool streams = either_phase(ctx, plan_streams), wanted = streams || g->keep_mapped;
    if (!wanted) unregister_file(g);
    if (!wanted || g->n_registered) return PSHARD_OK;
    uint64_t before = 0, after = 0, total = 0;
    CORE_TRY(cuda_device_memory(&before, &total));
    CORE_TRY(register_file(g, ctx->model->file));
    CORE_TRY(cuda_device_memory(&after, &total));
    g->report.mapping_bytes = before > after ? before - after : 0;
    const uint64_t mapping = mapping_reserve(ctx);
    if (streams && g->report.mapping_bytes > mapping)
        LOG_W("mapping the model file for the GPU took %.1f MB of device memory, %.1f MB more than the plan "
              "reserved: the budget is exceeded by that much", g->report.mapping_bytes / 1e6,
              (g->report.mapping_bytes - mapping) / 1e6);
    return PSHARD_OK;
}

/* The arena is the plan's budget less the file mapping's reserve; the planner made sure each
 * phase's parts fit. Nothing carved yet. */
static pshard_status make_arena(struct exec_gpu *g, const struct exec_ctx *ctx) {
    CORE_TRY(cuda_arena_create(&g->arena, ctx->plan.budget.total - mapping_reserve(ctx)));
    g->report.arena_bytes = g->arena.size;
    return PSHARD_OK;
}

static pshard_status create(struct exec_gpu *g, struct exec_ctx *ctx) {
    const struct model *model = ctx->model;
    const struct model_hparams *hp = &model->hp;
    CORE_TRY(cuda_ctx_create(0, &g->cuda));
    g->stream = cuda_ctx_compute_stream(g->cuda);
    g->report.context_bytes = cuda_ctx_info(g->cuda)->context_bytes + cuda_ctx_info(g->cuda)->blas_bytes;
    g->attn_shape = (struct cuda_attn_shape){(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k,
                                             (int)hp->head_dim_v, 1.0f / sqrtf((float)hp->head_dim_k)};
    g->layers = calloc(hp->n_layers, sizeof *g->layers);
    g->kv = calloc((size_t)ctx->kv.n_layers, sizeof *g->kv);
    g->step_seq = calloc((size_t)ctx->kv.n_seq, sizeof *g->step_seq);
    g->seen = calloc((size_t)ctx->kv.n_seq, sizeof *g->seen);
    g->kv_marks = calloc((size_t)ctx->kv.n_blocks, sizeof *g->kv_marks);
    g->cap_uploaded = (uint32_t)gguf_tensor_count(model->file);
    g->uploaded = calloc(g->cap_uploaded ? g->cap_uploaded : 1, sizeof *g->uploaded);
    if (!g->layers || !g->kv || !g->uploaded || !g->step_seq || !g->seen || !g->kv_marks)
        return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    const size_t B = (size_t)ctx->params.n_batch, d = hp->n_embd;
    CORE_TRY(cuda_host_alloc(UPLOAD_CHUNK_BYTES, &g->staging));
    CORE_TRY(cuda_host_alloc(sizeof(int32_t) * B * GPU_BATCH_ROWS, &g->host_in));
    CORE_TRY(cuda_host_alloc(sizeof(int32_t) * (size_t)ctx->kv.n_seq * (size_t)ctx->kv.max_blocks, &g->host_table));
    CORE_TRY(reserve_logits(g, ctx, 1));
    CORE_TRY(cuda_host_alloc(sizeof(float) * B * d, &g->host_x)); /* activations crossing PCIe */
    CORE_TRY(cuda_host_alloc(sizeof(float) * (size_t)hp->n_head * (size_t)(hp->head_dim_k + hp->head_dim_v + 2), &g->host_attn));
    CORE_TRY(cuda_event_create(false, &g->q_ready));
    CORE_TRY(handoff_buffers(g, ctx));
    CORE_TRY(map_file(g, ctx));
    /* moved at each change of phase, or carried in the ring */
    if (ctx->plan.decode || either_phase(ctx, plan_streams_kv)) CORE_TRY(pin_host_kv(g, ctx));
    CORE_TRY(make_arena(g, ctx));
    CORE_TRY(carve_plan(g, ctx));
    return cuda_stream_sync(g->stream);
}

pshard_status exec_gpu_prepare_changes(struct exec_ctx *ctx) {
    struct exec_gpu *g = ctx->gpu;
    g->keep_mapped = true;
    CORE_TRY(pin_host_kv(g, ctx));
    return map_file(g, ctx);
}

/* Once a rise's copies are in VRAM (polled, never waited for): every pending matrix takes its
 * device copy, the expert tables that pointed at their host views are rewritten, and the decode
 * graph, which holds the views, is captured again at the next decode step. */
pshard_status exec_gpu_take_uploads(struct exec_ctx *ctx) {
    struct exec_gpu *g = ctx->gpu;
    if (!g->n_pending) return PSHARD_OK;
    bool done;
    CORE_TRY(cuda_event_done(g->uploads_done, &done));
    if (!done) return PSHARD_OK;
    for (uint32_t i = 0; i < g->n_pending; i++) *g->pending[i].m = g->pending[i].dev;
    g->n_pending = 0;
    const struct plan *plan = ctx->active;
    for (uint32_t i = 0; i < ctx->model->n_shards; i++) {
        const struct shard *s = &ctx->model->shards[i];
        struct gpu_layer *l = s->kind == SHARD_MOE ? &g->layers[s->layer] : NULL;
        if (!l || !l->moe_all.gate_ptrs) continue;
        const uint32_t lent = plan->experts_lent ? plan->experts_lent[s->layer] : 0;
        CORE_TRY(expert_tables(g, plan, &ctx->w.layers[s->layer], i, plan->experts_resident[s->layer], lent, l,
                               (void **)l->moe_all.gate_ptrs));
    }
    drop_decode_graph(g);
    g->report.budget_weights_ms = core_now_ms() - g->uploads_t0;
    return PSHARD_OK;
}

pshard_status exec_gpu_rebudget(struct exec_ctx *ctx, struct plan *next, double t0) {
    struct exec_gpu *g = ctx->gpu;
    const bool rise = next->budget.total > ctx->plan.budget.total;
    const double planned = core_now_ms();
    if (!g->cells_down) { /* (a change that failed after this left the host every cell: nothing to move) */
        if (g->broken) return core_fail(PSHARD_ERR_INTERNAL, "the GPU's memory was left half carved by a failed change of plan");
        CORE_TRY(empty(g, ctx, false));
        g->cells_down = true;
        cuda_arena_destroy(&g->arena); /* the driver has the memory back */
    }
    const double free_ms = core_now_ms() - t0;
    CORE_TRY(pin_host_kv(g, ctx)); /* (the cells go up from there) */
    const double pinned = core_now_ms();
    const bool decoding = ctx->active != &ctx->plan;
    plan_free(&ctx->plan);
    ctx->plan = *next;
    memset(next, 0, sizeof *next);
    ctx->active = decoding && ctx->plan.decode ? ctx->plan.decode : &ctx->plan;
    CORE_TRY(map_file(g, ctx));
    CORE_TRY(handoff_buffers(g, ctx));
    /* A rise copies its resident matrices up in the background, read in place from the registered
     * file meanwhile (exec_gpu_take_uploads switches them in). */
    if (rise && g->n_registered && !g->uploads) {
        CORE_TRY(cuda_stream_create(&g->uploads));
        CORE_TRY(cuda_event_create(false, &g->uploads_done));
    }
    g->background = rise && g->n_registered && g->uploads;
    pshard_status st = make_arena(g, ctx);
    const double allocated = core_now_ms();
    if (st == PSHARD_OK) st = exec_gpu_fill(ctx);
    g->background = false;
    if (st == PSHARD_OK && g->n_pending) st = cuda_event_record(g->uploads_done, g->uploads);
    g->uploads_t0 = t0;
    if (st != PSHARD_OK) { /* (the host's cells stay the ones a later change copies up) */
        forget_plan(g, ctx);
        if (g->arena.base) cuda_arena_destroy(&g->arena);
        return core_fail_context(st, "carving %.0f MB of VRAM for the new budget (the cells stay on the host; steps wait "
                                 "for a budget that fits)", ctx->plan.budget.total / 1048576.0);
    }
    g->cells_down = false;
    g->report.budget_changes++;
    g->report.budget_free_ms = free_ms;
    g->report.budget_change_ms = core_now_ms() - t0;
    g->report.budget_weights_ms = g->n_pending ? 0 : g->report.budget_change_ms;
    g->report.budget_plan_ms = planned - t0;
    g->report.budget_pin_ms = pinned - t0 - free_ms;
    g->report.budget_arena_ms = allocated - pinned;
    g->report.budget_fill_ms = core_now_ms() - allocated;
    return PSHARD_OK;
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
    if (g->uploads) { /* (nothing may still be writing into the arena) */
        cuda_stream_sync(g->uploads);
        cuda_stream_destroy(g->uploads);
    }
    if (g->uploads_done) cuda_event_destroy(g->uploads_done);
    free(g->pending);
    if (g->arena.base) cuda_arena_destroy(&g->arena);
    cuda_pinned_release(&g->staging);
    cuda_pinned_release(&g->host_in);
    cuda_pinned_release(&g->host_table);
    cuda_pinned_release(&g->host_logits);
    cuda_pinned_release(&g->host_x);
    cuda_pinned_release(&g->host_xn);
    cuda_pinned_release(&g->host_moe);
    cuda_pinned_release(&g->host_route);
    if (g->route_ready) cuda_event_destroy(g->route_ready);
    cuda_pinned_release(&g->host_attn);
    if (g->q_ready) cuda_event_destroy(g->q_ready);
    cuda_pinned_release(&g->flags);
    cuda_pinned_release(&g->stamps);
    for (int s = 0; s < PLAN_STAGING_SLOTS; s++) {
        if (g->filled[s]) cuda_event_destroy(g->filled[s]);
        if (g->freed[s]) cuda_event_destroy(g->freed[s]);
    }
    free(g->units);
    cuda_graph_destroy(g->decode_graph);
    unregister_file(g);
    cuda_pinned_release(&g->kv_host[0]);
    cuda_pinned_release(&g->kv_host[1]);
    if (g->cuda) cuda_ctx_destroy(g->cuda);
    free(g->layers);
    free(g->kv);
    free(g->step_seq);
    free(g->seen);
    free(g->kv_marks);
    free(g->uploaded);
    free(g);
}

const struct gpu_memory_report *exec_gpu_report(const struct exec_gpu *g) { return &g->report; }
