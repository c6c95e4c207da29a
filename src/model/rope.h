/* A model's rotary position embedding, as its metadata gives it: how many dimensions of a head
 * turn, in which pair ordering, at which frequencies, and for multimodal rope (M-RoPE, Qwen2-VL)
 * which of a token's three positions (time, row, column) turns each pair. The CPU (cpu/rope.h)
 * and the GPU (cuda/cuda_backend.h) apply it. */
#ifndef MODEL_ROPE_H
#define MODEL_ROPE_H

#include <stdbool.h>

struct rope_params {
    int n_dims;          /* rotated dimensions per head (<= head size) */
    bool neox;
    float freq_base;
    float freq_scale;    /* 1 / linear scaling factor */
    float ext_factor;    /* YaRN extrapolation mix; 0 = off */
    float attn_factor;   /* magnitude scale of cos/sin */
    float beta_fast, beta_slow;
    int n_ctx_orig;      /* training context, for YaRN's correction range */
    const float *freq_factors; /* n_dims / 2 divisors of theta, or NULL */
    /* M-RoPE: rotated pairs turned by the time, row and column positions, counted cyclically
     * over their sum (llama.cpp's sections); all 0: one position. */
    int sections[3];
};

static inline bool rope_is_multi(const struct rope_params *p) {
    return p->sections[0] + p->sections[1] + p->sections[2] > 0;
}

#endif
