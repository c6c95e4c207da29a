/* The planner's inputs and its one entry: a request (the family, the VRAM budget, the context,
 * the switches of plan_options) and the GPU's buffer sizes, from which plan_build makes a plan
 * (plan.h). It predicts candidates with the cost model; the cost model reads plans alone and does
 * not include this header. */
#ifndef PLAN_PLANNER_H
#define PLAN_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "plan/plan.h"

struct profile;

/* What a plan is asked to be. */
struct plan_request {
    enum plan_family family;
    int64_t vram_budget;  /* bytes; < 0: as much as the plan needs (gpu) */
    int32_t n_ctx, n_batch, n_seq;
    float stream_share;   /* dynamic: share of what is not resident streamed (0: balanced from the profile) */
    int32_t staging;      /* the resident set: -1 as the family wants; else as the planner weighs a
                             candidate: PLAN_SET_NO_RING, PLAN_SET_RING or PLAN_SET_ALL_KV */
    const struct profile *profile; /* auto: the machine's profile (NULL: conservative defaults) */
    bool split_ffn;       /* dynamic tiers without the ring split every dense FFN they do not keep
                             resident by rows between the GPU (reading in place) and the CPU, both
                             at once, instead of streaming whole layers */
    bool stage_static;    /* static tiers copy the attention they stream into the ring's slots
                             ahead of use, while the CPU computes the FFN before it, instead of
                             reading it in place */
    const uint8_t *routed_quota; /* [1 + n_expert_used]: the routed tiers' quota given (entry n for n
                             experts not resident; plan_options, for tests and comparison); NULL:
                             the cost model's */
    int routed_quota_count;      /* entries given after [0] */
    bool phases;          /* auto, one sequence: decode steps may run a plan of their own over
                             another resident set (plan.decode) */
    int32_t decode_set;   /* phases: -1 as the planner weighs; else decode steps over this set
                             whenever it differs from the prompt's (tests, comparison) */
    int32_t n_decode;     /* auto: the tokens the typical request generates after its prompt, which
                             resident sets and phases are weighed by (0: PLAN_TYPICAL_DECODE) */
    bool kv_stream;       /* ring tiers may run the attention of layers whose KV cache is in host
                             memory on the GPU: the layer's cached cells travel up in its slot with
                             its matrices, the step's new cells come back down (plan.kv_stream;
                             with several sequences where the pool's cells fit the slots) */
    bool kv_split;        /* ring tiers' one-token steps may split a carried layer's attention with
                             the CPU: it attends the first cells from the host's cache beside the
                             GPU's attention of the rest (plan_tier.kv_cpu_share) */
    float kv_cpu_share;   /* kv_split: > 0 fixes the share (plan_options, for tests and comparison);
                             0: the cost model's */
    bool long_decode;     /* phases: decode steps over long caches may run over another set than
                             short ones (plan.decode_from, decode_until) */
    int32_t decode_from;  /* with decode_set asked for: decode steps run over it only over caches of
                             this many cells or more (tests, comparison); 0: every cache */
    bool dynamic_in_place; /* dynamic: every tier splits with the CPU, reading in place (auto always
                             weighs dynamic so: streaming everything through the ring is gpu's) */
    int64_t kv_cells;     /* cells of each layer's KV pool, shared by the sequences (0: n_ctx * n_seq) */
};

/* auto: the typical request generates this many tokens unless told (plan_request.n_decode). */
enum { PLAN_TYPICAL_DECODE = 128 };

/* Size of the GPU-side buffers a plan needs besides weights and KV, for these shapes, and the
 * kernels its steps run. Filled by the executor's GPU code (it knows the kernels); see
 * exec_gpu_costs. */
struct plan_gpu_costs {
    uint64_t activations, logits, work, blas; /* logits: only when the head is on the GPU */
    uint64_t host_mapping; /* device memory for mapping the model file, when anything streams */
    struct plan_kernels kernels;
    /* Of activations: the step's buffers, carved as one span (what the executor lends between
     * steps with the logits), and a margin carved by nothing (left at the arena's end); the rest
     * is carved elsewhere (the KV block table, each tensor's rounding, the expert tables). */
    uint64_t buffers, margin;
};

/* Build a plan for `model` under the request. Fails with a clear message when the budget
 * cannot hold even the fixed GPU buffers (naming the minimum), or a family cannot be built. */
pshard_status plan_build(const struct model *model, const struct plan_request *req, const struct plan_gpu_costs *costs,
                         struct plan *out);

#endif
