/* Mixture-of-experts FFN on the CPU: tokens are grouped by the experts the router chose, so
 * each chosen expert's weights are read once per step, and experts that no token chose are not
 * touched at all. */
#ifndef CPU_MOE_H
#define CPU_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/cpu_ops.h"

/* Routing of one step: for token t, slot j < k: expert ids[t*k + j] with weight w[t*k + j]. */
struct moe_routing {
    int64_t n_tokens;
    int k;
    const int32_t *ids;
    const float *weights;
    /* Only experts in [first, end) are computed here (end 0: all); the others' pairs are left
     * out of the sum, for another device to add. */
    int32_t first, end;
};

/* Scratch for cpu_moe, sized for a step of up to n_tokens tokens. */
struct moe_scratch {
    int32_t *expert_count;  /* [n_expert] */
    int32_t *expert_start;  /* [n_expert + 1] */
    int32_t *pairs;         /* [n_tokens * k]: (token * k + slot), grouped by expert */
    float *gate, *up;       /* [n_tokens * k][n_ff], in grouped order (expert by expert) */
    float *down;            /* [n_tokens * k][n_embd], grouped order */
    void *acts_grouped;     /* [n_tokens * k] gate/up activation rows in grouped order */
    void *act_buf;          /* quantized hidden rows for the down projection */
    int32_t *work;          /* [n_expert * 2]: the expert/row units threads share */
};

size_t cpu_moe_scratch_bytes(int64_t n_tokens, int k, int64_t n_expert, int64_t n_embd, int64_t n_ff,
                             enum quant_type down_type);
void cpu_moe_scratch_init(struct moe_scratch *s, void *mem, int64_t n_tokens, int k, int64_t n_expert, int64_t n_embd,
                          int64_t n_ff, enum quant_type down_type);

/* Router: probabilities (softmax over experts), top-k, optional renormalization to sum 1.
 * logits [n_tokens][n_expert] are overwritten with probabilities. */
void cpu_moe_route(float *logits, int64_t n_tokens, int64_t n_expert, int k, bool normalize, int32_t *ids,
                   float *weights);

/* out [n_tokens][n_embd] = sum_j w_j * down_e(silu(gate_e(x)) * up_e(x)), e = ids[t][j].
 * acts: x quantized for gate/up (one row per token). */
void cpu_moe(struct threadpool *pool, const struct cpu_matrix *gate_exps, const struct cpu_matrix *up_exps,
             const struct cpu_matrix *down_exps, const struct cpu_acts *acts, const struct moe_routing *routing,
             struct moe_scratch *s, float *out);

#endif
