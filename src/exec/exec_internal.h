/* The executor's state, shared by its step loop and the shard implementations. */
#ifndef EXEC_INTERNAL_H
#define EXEC_INTERNAL_H

#include "core/threadpool.h"
#include "cpu/cpu_ops.h"
#include "cpu/moe.h"
#include "exec/exec.h"
#include "exec/kv_cache.h"
#include "model/weights.h"

/* A layer's matrices, viewed once at creation. */
struct layer_mats {
    struct cpu_matrix wq, wk, wv, wo;
    struct cpu_matrix ffn_gate, ffn_up, ffn_down;
    struct cpu_matrix gate_inp, gate_exps, up_exps, down_exps;
    struct cpu_matrix gate_inp_shexp, gate_shexp, up_shexp, down_shexp;
};

/* Per-step scratch, allocated once for n_batch tokens. */
struct exec_scratch {
    float *x;        /* [n_batch][n_embd] residual stream: activations in and out of every shard */
    float *xn;       /* [n_batch][n_embd] normalized input of a shard */
    float *q, *k, *v, *attn; /* [n_batch][widths] */
    float *attn_partial; /* a split attention step's partial sums (cpu_attention_partial_floats_max) */
    float *proj;     /* [n_batch][n_embd] a shard's output before the residual add */
    float *gate, *up; /* [n_batch][n_ff] dense FFN (also shared expert) */
    float *router;   /* [n_batch][n_expert] */
    int32_t *expert_ids;
    float *expert_weights;
    void *acts;      /* quantized activations, the widest any matrix needs */
    float *rope;     /* [n_batch][rope dims] cos/sin tables */
    float *logits;   /* [logit_rows][n_vocab], apart from the rest: exec_reserve_logits */
    int32_t *out_rows; /* batch index of each output */
    struct moe_scratch moe;
};

struct exec_ctx {
    const struct model *model;
    struct model_weights w;
    struct exec_params params;
    struct threadpool *pool;
    struct kv_cache kv;
    struct cpu_matrix token_embd, output;
    struct layer_mats *mats;
    struct exec_scratch s;
    void *scratch_mem;
    void *moe_mem;
    int32_t logit_rows; /* s.logits' rows */
    struct exec_stats stats;
    const float *logits; /* the last step's logits: s.logits, or the GPU's pinned copy of them (no second copy) */
    struct plan plan;          /* as built: the prompt phase's, and plan.decode where decode steps run their own */
    const struct plan *active; /* the plan the GPU's memory is carved for: &plan or plan.decode */
    int32_t *next_pos; /* [n_seq] validation scratch: the next position each sequence expects */
    struct exec_gpu *gpu; /* non-NULL: some shards run on the GPU */
    const struct exec_media *media; /* the step's rope positions and input embeddings, or NULL (exec_step_media) */
};

/* s.logits with room for n tokens' logits, or NOMEM and nothing changed. A step keeps logits for
 * the tokens that ask (in generation the last of each sequence), so the rows grow on first need to
 * the most any step asked for, at least n_seq: n_batch x n_vocab floats would be 2.5 GB at -b 4096
 * with a 152K vocabulary, held by every context and used by a caller that asks for every token's. */
pshard_status exec_reserve_logits(struct exec_ctx *ctx, int32_t n);
/* The rows a logits buffer grows to for n outputs (the host's and the GPU's pinned one alike). */
static inline int32_t exec_logit_rows_for(const struct exec_ctx *ctx, int32_t n) {
    return n > ctx->params.n_seq ? n : ctx->params.n_seq; /* (a decode step's outputs at least) */
}

/* The shards, CPU placement. Each reads ctx->s.x (the batch's activations) and updates it. */
void shard_embed_cpu(struct exec_ctx *ctx, const struct exec_batch *batch);
void shard_attn_cpu(struct exec_ctx *ctx, int layer, const struct exec_batch *batch);
/* One token's query q (its heads normed and rotated) over cells [0, n_cells) of sequence seq's
 * cache in the layer, at least 2 * CPU_ATTN_SPLIT_CELLS of them: every head's partial sums
 * (cpu_attention_merge_sums) into sums [n_head][head_v + 2]. */
pshard_status shard_attn_cpu_sums(struct exec_ctx *ctx, int layer, int32_t seq, const float *q, int64_t n_cells,
                                  float *sums);
void shard_ffn_cpu(struct exec_ctx *ctx, int layer, const struct exec_batch *batch);
void shard_moe_cpu(struct exec_ctx *ctx, int layer, const struct exec_batch *batch);
void shard_head_cpu(struct exec_ctx *ctx, const struct exec_batch *batch);
/* Rows [first, end) of a dense FFN (gate and up; the same columns of down) for the normalized
 * input ctx->s.xn: out [n][n_embd] = their part of the FFN's output (an FFN split with the GPU;
 * first and end are multiples of PLAN_SPLIT_ROWS, or end is n_ff). */
void shard_ffn_cpu_rows(struct exec_ctx *ctx, int layer, int64_t n, uint32_t first, uint32_t end, float *out);
/* The experts [first, end) of an MoE shard for routing decided elsewhere (the GPU), input
 * ctx->s.xn: out [n][n_embd] = their weighted sum (the GPU adds the other experts). */
void shard_moe_cpu_experts(struct exec_ctx *ctx, int layer, int64_t n, const int32_t *ids, const float *weights,
                           int32_t first, int32_t end, float *out);

#endif
