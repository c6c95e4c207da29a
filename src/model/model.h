/* A model: hyperparameters read from GGUF metadata and the shard list built from the tensor
 * table. Shards are the units the planner places (DESIGN.md): embed, then per layer attn and
 * ffn or moe, then head. */
#ifndef MODEL_MODEL_H
#define MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"

/* ARCH_QWEN2VL: the language model of Qwen2-VL / Qwen2.5-VL, a qwen2 whose rotary positions are
 * multimodal (M-RoPE: the rotated pairs are cut into sections turned by time, row and column).
 * For text every section gets the token's position, which is plain rope (neox order). */
enum model_arch { ARCH_UNKNOWN, ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_QWEN3MOE, ARCH_QWEN2VL };

struct model_hparams {
    char arch_name[64];
    enum model_arch arch;
    uint32_t n_layers, n_embd, n_vocab, n_ctx_train;
    uint32_t n_head, n_head_kv;
    uint32_t head_dim_k, head_dim_v; /* per head; default n_embd / n_head */
    uint32_t n_ff;                   /* dense FFN width (0 for MoE-only models) */
    uint32_t n_expert, n_expert_used, n_ff_expert, n_ff_shared_expert;
    uint32_t rope_dim;
    uint32_t rope_sections[4]; /* qwen2vl: rotated pairs per section (time, row, column, unused) */
    float rope_freq_base, rms_eps;
    bool tied_embeddings; /* no output.weight: the head reuses token_embd */
};

enum shard_kind { SHARD_EMBED, SHARD_ATTN, SHARD_FFN, SHARD_MOE, SHARD_HEAD, SHARD_KIND_COUNT };

enum { SHARD_MAX_TENSORS = 16 };

struct shard {
    enum shard_kind kind;
    int32_t layer; /* -1 for embed and head */
    uint32_t n_tensors;
    const struct gguf_tensor *tensors[SHARD_MAX_TENSORS];
    uint64_t weight_bytes;
    /* MoE: the expert tensors (3-D, last dimension = expert) and one expert's bytes across
     * gate, up and down; weight_bytes - n_expert * expert_bytes is the always-used part. */
    uint32_t n_expert;
    uint64_t expert_bytes;
    uint64_t kv_bytes_per_token; /* attn: K and V in f16 */
};

struct model {
    struct gguf_file *file;
    struct model_hparams hp;
    uint32_t n_shards;
    struct shard *shards;
    /* Tensors that belong to no shard (reported by `pshard info`). */
    uint32_t n_unplaced;
    /* Bytes past a 256-byte boundary where the first matrix after the embedding lies in the
     * mapped file (GGUF aligns tensors to 32 bytes; a file's tensors share the offset where
     * their sizes are multiples of 256). Weights read in place off 128-byte alignment read
     * markedly slower (bench/RESULTS.md), so the profile times both. */
    uint32_t weights_skew;
};

/* Read hyperparameters and build the shard list from an open GGUF. Unknown architectures still
 * load (arch = ARCH_UNKNOWN) so they can be inspected; running them is refused later. */
pshard_status model_load(struct gguf_file *file, struct model *out);
void model_free(struct model *model);

/* Only the hyperparameters (used by model_load; also by tools that need no shards). */
pshard_status model_read_hparams(const struct gguf_file *file, struct model_hparams *hp);

const char *shard_kind_name(enum shard_kind kind);

/* A weight matrix (2-D or more, more than one row), and a 3-D tensor of MoE experts. */
static inline bool model_tensor_is_matrix(const struct gguf_tensor *t) { return t->n_dims >= 2 && t->ne[1] > 1; }
static inline bool model_tensor_is_experts(const struct gguf_tensor *t) { return t->n_dims >= 3 && t->ne[2] > 1; }
/* An MoE layer's router: the matrix of its shard with a row for each expert. */
static inline bool model_tensor_is_router(const struct model *m, const struct shard *s, const struct gguf_tensor *t) {
    return s->kind == SHARD_MOE && model_tensor_is_matrix(t) && !model_tensor_is_experts(t) &&
           t->ne[1] == (int64_t)m->hp.n_expert;
}
/* The tensor type of a shard's experts (its first expert tensor), 0 when it has none. */
uint32_t shard_expert_type(const struct shard *s);
const char *model_arch_name(enum model_arch arch);

#endif
