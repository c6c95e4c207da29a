/* The shard list: every tensor is assigned to a shard by its name (token_embd -> embed,
 * blk.N.attn_* -> attn N, blk.N.ffn_* -> ffn N or moe N, output* -> head). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"

uint32_t shard_expert_type(const struct shard *s) {
    for (uint32_t i = 0; i < s->n_tensors; i++)
        if (model_tensor_is_experts(s->tensors[i])) return s->tensors[i]->type;
    return 0;
}

const char *shard_kind_name(enum shard_kind kind) {
    static const char *const names[SHARD_KIND_COUNT] = {"embed", "attn", "ffn", "moe", "head"};
    return (unsigned)kind < SHARD_KIND_COUNT ? names[kind] : "?";
}

static bool has_prefix(struct gguf_str s, const char *prefix) {
    size_t n = strlen(prefix);
    return s.len >= n && memcmp(s.data, prefix, n) == 0;
}

/* Parse "blk.N.<rest>": layer number and the rest of the name. */
static bool parse_block_name(struct gguf_str name, uint32_t *layer, struct gguf_str *rest) {
    if (!has_prefix(name, "blk.")) return false;
    uint64_t i = 4, value = 0;
    if (i >= name.len || name.data[i] < '0' || name.data[i] > '9') return false;
    while (i < name.len && name.data[i] >= '0' && name.data[i] <= '9' && value < 1000000)
        value = value * 10 + (uint64_t)(name.data[i++] - '0');
    if (i >= name.len || name.data[i] != '.') return false;
    *layer = (uint32_t)value;
    rest->data = name.data + i + 1;
    rest->len = name.len - i - 1;
    return true;
}

static bool is_expert_tensor(struct gguf_str rest) {
    return has_prefix(rest, "ffn_") && memmem(rest.data, rest.len, "_exps", 5) != NULL;
}

/* Which shard slot a tensor goes to: 0 embed, 1 + 2*layer attn, 2 + 2*layer ffn/moe, last head. */
static int64_t shard_slot(const struct model_hparams *hp, const struct gguf_tensor *t) {
    uint32_t layer;
    struct gguf_str rest;
    if (gguf_str_eq(t->name, "token_embd.weight")) return 0;
    if (has_prefix(t->name, "output")) return 1 + 2 * (int64_t)hp->n_layers;
    if (!parse_block_name(t->name, &layer, &rest) || layer >= hp->n_layers) return -1;
    if (has_prefix(rest, "attn_")) return 1 + 2 * (int64_t)layer;
    if (has_prefix(rest, "ffn_")) return 2 + 2 * (int64_t)layer;
    return -1;
}

static pshard_status add_tensor(struct shard *shard, const struct gguf_tensor *t, const char *path) {
    if (shard->n_tensors == SHARD_MAX_TENSORS)
        return core_fail(PSHARD_ERR_FORMAT, "%s: too many tensors for one %s shard (at '%.*s')", path,
                         shard_kind_name(shard->kind), (int)t->name.len, t->name.data);
    shard->tensors[shard->n_tensors++] = t;
    shard->weight_bytes += t->n_bytes;
    uint32_t layer;
    struct gguf_str rest;
    if (parse_block_name(t->name, &layer, &rest) && is_expert_tensor(rest)) {
        uint32_t n_expert = (uint32_t)t->ne[t->n_dims - 1];
        if (t->n_dims != 3 || (shard->n_expert && shard->n_expert != n_expert))
            return core_fail(PSHARD_ERR_FORMAT, "%s: expert tensor '%.*s' has an inconsistent shape", path,
                             (int)t->name.len, t->name.data);
        shard->n_expert = n_expert;
        shard->expert_bytes += t->n_bytes / n_expert;
        shard->kind = SHARD_MOE;
    }
    return PSHARD_OK;
}

/* model.weights_skew: the first matrix after the embedding's offset past 256 bytes. */
static uint32_t weights_skew(const struct model *m) {
    for (uint32_t i = 1; i < m->n_shards; i++)
        for (uint32_t t = 0; t < m->shards[i].n_tensors; t++)
            if (model_tensor_is_matrix(m->shards[i].tensors[t]))
                return (uint32_t)((uintptr_t)m->shards[i].tensors[t]->data % 256);
    return 0;
}

pshard_status model_load(struct gguf_file *file, struct model *out) {
    memset(out, 0, sizeof *out);
    out->file = file;
    CORE_TRY(model_read_hparams(file, &out->hp));
    const struct model_hparams *hp = &out->hp;
    if (hp->n_layers > 100000)
        return core_fail(PSHARD_ERR_FORMAT, "%s: absurd block_count %u", gguf_path(file), hp->n_layers);
    out->n_shards = 2 + 2 * hp->n_layers;
    out->shards = calloc(out->n_shards, sizeof *out->shards);
    if (!out->shards) return core_fail(PSHARD_ERR_NOMEM, "out of memory for the shard list");
    for (uint32_t i = 0; i < out->n_shards; i++) {
        struct shard *s = &out->shards[i];
        s->layer = (i == 0 || i == out->n_shards - 1) ? -1 : (int32_t)((i - 1) / 2);
        s->kind = i == 0 ? SHARD_EMBED : i == out->n_shards - 1 ? SHARD_HEAD : (i % 2 ? SHARD_ATTN : SHARD_FFN);
        if (s->kind == SHARD_ATTN)
            s->kv_bytes_per_token = 2ull * hp->n_head_kv * (hp->head_dim_k + hp->head_dim_v);
    }
    for (uint64_t i = 0; i < gguf_tensor_count(file); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(file, i);
        int64_t slot = shard_slot(hp, t);
        if (slot < 0) {
            out->n_unplaced++;
            continue;
        }
        pshard_status st = add_tensor(&out->shards[slot], t, gguf_path(file));
        if (st != PSHARD_OK) {
            model_free(out);
            return st;
        }
    }
    out->weights_skew = weights_skew(out);
    /* A tied head multiplies by the embedding matrix: it reads those bytes every token. */
    const struct gguf_tensor *embd = gguf_find_tensor(file, "token_embd.weight");
    if (hp->tied_embeddings && embd) {
        pshard_status st = add_tensor(&out->shards[out->n_shards - 1], embd, gguf_path(file));
        if (st != PSHARD_OK) {
            model_free(out);
            return st;
        }
    }
    return PSHARD_OK;
}

void model_free(struct model *model) {
    free(model->shards);
    model->shards = NULL;
    model->n_shards = 0;
}
