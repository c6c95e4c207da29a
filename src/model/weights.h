/* The tensors of a runnable model, by role, checked against the architecture: what each shard
 * computes with. Binding fails with a clear message for unknown architectures or missing or
 * mis-shaped tensors. */
#ifndef MODEL_WEIGHTS_H
#define MODEL_WEIGHTS_H

#include <stdbool.h>

#include "model/rope.h"
#include "model/model.h"

struct layer_weights {
    /* attn shard */
    const struct gguf_tensor *attn_norm, *wq, *wk, *wv, *wo;
    const struct gguf_tensor *bq, *bk, *bv, *bo; /* qwen2 biases */
    const struct gguf_tensor *q_norm, *k_norm;   /* qwen3 per-head norms */
    /* ffn or moe shard */
    const struct gguf_tensor *ffn_norm, *ffn_gate, *ffn_up, *ffn_down;
    const struct gguf_tensor *gate_inp, *gate_exps, *up_exps, *down_exps;
    const struct gguf_tensor *gate_inp_shexp, *gate_shexp, *up_shexp, *down_shexp;
};

struct model_weights {
    const struct gguf_tensor *token_embd, *output_norm, *output; /* output = token_embd if tied */
    const struct gguf_tensor *rope_freqs;                        /* Llama 3 frequency factors */
    struct layer_weights *layers;
    bool moe;
    bool norm_expert_weights; /* renormalize the chosen experts' router weights to sum 1 */
    int64_t ffn_rows;         /* the widest dense FFN or shared expert a layer runs (0: none, all experts) */
    struct rope_params rope;
};

pshard_status model_bind_weights(const struct model *model, struct model_weights *out);
void model_weights_free(struct model_weights *w);

#endif
