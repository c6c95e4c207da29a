/* Binding tensors to roles per architecture, with shape checks, and RoPE settings from the
 * metadata. */
#include "model/weights.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct binder {
    const struct model *model;
    const char *path;
};

static pshard_status find(const struct binder *b, int layer, const char *role, bool required,
                          const struct gguf_tensor **out) {
    char name[96];
    if (layer >= 0) snprintf(name, sizeof name, "blk.%d.%s.weight", layer, role);
    else snprintf(name, sizeof name, "%s.weight", role);
    if (strstr(role, ".bias")) { /* roles naming a bias carry their own suffix */
        if (layer >= 0) snprintf(name, sizeof name, "blk.%d.%s", layer, role);
        else snprintf(name, sizeof name, "%s", role);
    }
    *out = gguf_find_tensor(b->model->file, name);
    if (!*out && required)
        return core_fail(PSHARD_ERR_FORMAT, "%s: the %s model lacks tensor '%s'", b->path, b->model->hp.arch_name, name);
    return PSHARD_OK;
}

/* Check a tensor's leading dimensions (0 = any). */
static pshard_status check_shape(const struct binder *b, const struct gguf_tensor *t, int64_t ne0, int64_t ne1,
                                 int64_t ne2) {
    if (!t) return PSHARD_OK;
    const int64_t want[3] = {ne0, ne1, ne2};
    for (int d = 0; d < 3; d++)
        if (want[d] && t->ne[d] != want[d])
            return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' has shape [%" PRId64 ", %" PRId64 ", %" PRId64
                             "], expected dimension %d to be %" PRId64, b->path, (int)t->name.len, t->name.data,
                             t->ne[0], t->ne[1], t->ne[2], d, want[d]);
    return PSHARD_OK;
}

static pshard_status bind_attn(const struct binder *b, int il, struct layer_weights *l) {
    const struct model_hparams *hp = &b->model->hp;
    const int64_t d = hp->n_embd, q_width = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t k_width = (int64_t)hp->n_head_kv * hp->head_dim_k, v_width = (int64_t)hp->n_head_kv * hp->head_dim_v;
    CORE_TRY(find(b, il, "attn_norm", true, &l->attn_norm));
    CORE_TRY(find(b, il, "attn_q", true, &l->wq));
    CORE_TRY(find(b, il, "attn_k", true, &l->wk));
    CORE_TRY(find(b, il, "attn_v", true, &l->wv));
    CORE_TRY(find(b, il, "attn_output", true, &l->wo));
    const bool qwen2 = hp->arch == ARCH_QWEN2 || hp->arch == ARCH_QWEN2VL, qk_norm = hp->arch == ARCH_QWEN3 || hp->arch == ARCH_QWEN3MOE;
    CORE_TRY(find(b, il, "attn_q.bias", qwen2, &l->bq));
    CORE_TRY(find(b, il, "attn_k.bias", qwen2, &l->bk));
    CORE_TRY(find(b, il, "attn_v.bias", qwen2, &l->bv));
    CORE_TRY(find(b, il, "attn_output.bias", false, &l->bo));
    CORE_TRY(find(b, il, "attn_q_norm", qk_norm, &l->q_norm));
    CORE_TRY(find(b, il, "attn_k_norm", qk_norm, &l->k_norm));
    CORE_TRY(check_shape(b, l->attn_norm, d, 1, 1));
    CORE_TRY(check_shape(b, l->wq, d, q_width, 1));
    CORE_TRY(check_shape(b, l->wk, d, k_width, 1));
    CORE_TRY(check_shape(b, l->wv, d, v_width, 1));
    CORE_TRY(check_shape(b, l->wo, (int64_t)hp->n_head * hp->head_dim_v, d, 1));
    CORE_TRY(check_shape(b, l->bq, q_width, 1, 1));
    CORE_TRY(check_shape(b, l->bk, k_width, 1, 1));
    CORE_TRY(check_shape(b, l->bv, v_width, 1, 1));
    CORE_TRY(check_shape(b, l->bo, d, 1, 1));
    CORE_TRY(check_shape(b, l->q_norm, hp->head_dim_k, 1, 1));
    return check_shape(b, l->k_norm, hp->head_dim_k, 1, 1);
}

static pshard_status bind_ffn(const struct binder *b, int il, bool moe, struct layer_weights *l) {
    const struct model_hparams *hp = &b->model->hp;
    const int64_t d = hp->n_embd;
    CORE_TRY(find(b, il, "ffn_norm", true, &l->ffn_norm));
    CORE_TRY(check_shape(b, l->ffn_norm, d, 1, 1));
    if (!moe) {
        if (hp->n_ff == 0) /* (the FFN's buffers are sized by it) */
            return core_fail(PSHARD_ERR_FORMAT, "%s: the metadata lacks %s.feed_forward_length", b->path, hp->arch_name);
        CORE_TRY(find(b, il, "ffn_gate", true, &l->ffn_gate));
        CORE_TRY(find(b, il, "ffn_up", true, &l->ffn_up));
        CORE_TRY(find(b, il, "ffn_down", true, &l->ffn_down));
        CORE_TRY(check_shape(b, l->ffn_gate, d, hp->n_ff, 1));
        CORE_TRY(check_shape(b, l->ffn_up, d, hp->n_ff, 1));
        return check_shape(b, l->ffn_down, hp->n_ff, d, 1);
    }
    const int64_t ne = hp->n_expert, ff = hp->n_ff_expert;
    CORE_TRY(find(b, il, "ffn_gate_inp", true, &l->gate_inp));
    CORE_TRY(find(b, il, "ffn_gate_exps", true, &l->gate_exps));
    CORE_TRY(find(b, il, "ffn_up_exps", true, &l->up_exps));
    CORE_TRY(find(b, il, "ffn_down_exps", true, &l->down_exps));
    CORE_TRY(check_shape(b, l->gate_inp, d, ne, 1));
    CORE_TRY(check_shape(b, l->gate_exps, d, ff, ne));
    CORE_TRY(check_shape(b, l->up_exps, d, ff, ne));
    CORE_TRY(check_shape(b, l->down_exps, ff, d, ne));
    CORE_TRY(find(b, il, "ffn_gate_inp_shexp", false, &l->gate_inp_shexp));
    CORE_TRY(find(b, il, "ffn_gate_shexp", false, &l->gate_shexp));
    CORE_TRY(find(b, il, "ffn_up_shexp", l->gate_shexp != NULL, &l->up_shexp));
    CORE_TRY(find(b, il, "ffn_down_shexp", l->gate_shexp != NULL, &l->down_shexp));
    CORE_TRY(check_shape(b, l->gate_inp_shexp, d, 1, 1));
    if (!l->gate_shexp) return PSHARD_OK;
    /* A shared expert's width comes from the metadata, as the buffers it writes are sized. */
    const int64_t sff = hp->n_ff_shared_expert;
    if (sff == 0)
        return core_fail(PSHARD_ERR_FORMAT, "%s: layer %d has a shared expert but the metadata lacks %s.expert_shared_feed_forward_length",
                         b->path, il, hp->arch_name);
    CORE_TRY(check_shape(b, l->gate_shexp, d, sff, 1));
    CORE_TRY(check_shape(b, l->up_shexp, d, sff, 1));
    return check_shape(b, l->down_shexp, sff, d, 1);
}

/* RoPE settings: ordering by architecture, scaling as the metadata declares. */
static pshard_status read_rope(const struct binder *b, struct model_weights *w) {
    const struct model_hparams *hp = &b->model->hp;
    const struct gguf_file *f = b->model->file;
    struct rope_params *r = &w->rope;
    r->n_dims = (int)hp->rope_dim;
    r->neox = hp->arch != ARCH_LLAMA;
    r->freq_base = hp->rope_freq_base;
    r->freq_scale = 1.0f;
    r->attn_factor = 1.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->n_ctx_orig = (int)hp->n_ctx_train;
    char key[128];
    struct gguf_str type = {"none", 4};
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch_name);
    if (gguf_find(f, key)) CORE_TRY(gguf_get_str(f, key, &type));
    float factor = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", hp->arch_name);
    if (gguf_find(f, key)) CORE_TRY(gguf_get_f32(f, key, &factor));
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", hp->arch_name);
    uint32_t orig;
    if (gguf_find(f, key) && gguf_get_u32(f, key, &orig) == PSHARD_OK) r->n_ctx_orig = (int)orig;
    if (!(isfinite(factor) && factor > 0.0f))
        return core_fail(PSHARD_ERR_FORMAT, "%s: rope scaling factor must be positive", b->path);
    if (gguf_str_eq(type, "linear")) {
        r->freq_scale = 1.0f / factor;
    } else if (gguf_str_eq(type, "yarn")) {
        r->freq_scale = 1.0f / factor;
        r->ext_factor = 1.0f;
    } else if (!gguf_str_eq(type, "none") && type.len) {
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: rope scaling '%.*s' is not supported", b->path, (int)type.len, type.data);
    }
    if (r->n_dims <= 0 || r->n_dims > (int)hp->head_dim_k || r->n_dims % 2)
        return core_fail(PSHARD_ERR_FORMAT, "%s: rope dimension %d does not fit head size %u", b->path, r->n_dims,
                         hp->head_dim_k);
    if (w->rope_freqs) {
        if (w->rope_freqs->type != 0 || w->rope_freqs->ne[0] != r->n_dims / 2)
            return core_fail(PSHARD_ERR_FORMAT, "%s: rope_freqs must be F32 of %d values", b->path, r->n_dims / 2);
        r->freq_factors = w->rope_freqs->data;
    }
    if (hp->arch == ARCH_QWEN2VL) { /* M-RoPE: hparams checked the sections cover the rotated pairs */
        if (hp->rope_sections[3])
            return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: a fourth rope section (%u pairs) is not supported (Qwen2-VL has none)",
                             b->path, hp->rope_sections[3]);
        for (int i = 0; i < 3; i++) r->sections[i] = (int)hp->rope_sections[i];
    }
    return PSHARD_OK;
}

static pshard_status bind(const struct binder *b, struct model_weights *w) {
    const struct model_hparams *hp = &b->model->hp;
    if (hp->arch == ARCH_UNKNOWN)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: llama, qwen2, qwen2vl, qwen3, qwen3moe)",
                         b->path, hp->arch_name);
    if (hp->n_layers == 0 || hp->n_embd == 0 || hp->n_head == 0 || hp->n_vocab == 0 || hp->head_dim_k == 0 ||
        hp->head_dim_v == 0 || hp->head_dim_k > 512 || hp->head_dim_v > 512)
        return core_fail(PSHARD_ERR_FORMAT, "%s: hyperparameters are missing or out of range", b->path);
    w->moe = hp->arch == ARCH_QWEN3MOE;
    if (w->moe && (hp->n_expert == 0 || hp->n_expert_used == 0 || hp->n_ff_expert == 0))
        return core_fail(PSHARD_ERR_FORMAT, "%s: MoE model lacks expert_count/expert_used_count/expert_feed_forward_length", b->path);
    w->norm_expert_weights = true;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", hp->arch_name);
    if (gguf_find(b->model->file, key)) CORE_TRY(gguf_get_bool(b->model->file, key, &w->norm_expert_weights));
    CORE_TRY(find(b, -1, "token_embd", true, &w->token_embd));
    CORE_TRY(find(b, -1, "output_norm", true, &w->output_norm));
    CORE_TRY(find(b, -1, "output", false, &w->output));
    CORE_TRY(find(b, -1, "rope_freqs", false, &w->rope_freqs));
    if (!w->output) w->output = w->token_embd;
    CORE_TRY(check_shape(b, w->token_embd, hp->n_embd, hp->n_vocab, 1));
    CORE_TRY(check_shape(b, w->output, hp->n_embd, hp->n_vocab, 1));
    CORE_TRY(check_shape(b, w->output_norm, hp->n_embd, 1, 1));
    w->layers = calloc(hp->n_layers, sizeof *w->layers);
    if (!w->layers) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    for (uint32_t il = 0; il < hp->n_layers; il++) {
        CORE_TRY(bind_attn(b, (int)il, &w->layers[il]));
        CORE_TRY(bind_ffn(b, (int)il, w->moe, &w->layers[il]));
        const int64_t ff = !w->moe ? hp->n_ff : w->layers[il].gate_shexp ? hp->n_ff_shared_expert : 0;
        if (ff > w->ffn_rows) w->ffn_rows = ff;
    }
    return read_rope(b, w);
}

pshard_status model_bind_weights(const struct model *model, struct model_weights *out) {
    memset(out, 0, sizeof *out);
    struct binder b = {model, gguf_path(model->file)};
    pshard_status st = bind(&b, out);
    if (st != PSHARD_OK) model_weights_free(out);
    return st;
}

void model_weights_free(struct model_weights *w) {
    free(w->layers);
    w->layers = NULL;
}
