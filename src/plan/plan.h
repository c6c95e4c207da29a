/* Plans: where every shard runs and what the VRAM budget holds. A shard is RESIDENT (its
 * weights live in VRAM for the plan's life), STREAMED (copied into a staging slot before use)
 * or CPU (computed by the thread pool from host memory); every layer's KV cache lives where its
 * attention runs. The executor follows a plan; `pshard plan` prints one. */
#ifndef PLAN_PLAN_H
#define PLAN_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

enum placement { PLACE_CPU, PLACE_RESIDENT, PLACE_STREAMED };

enum plan_family {
    PLAN_AUTO,   /* gpu when everything fits the budget, else static */
    PLAN_CPU,    /* every shard on the CPU */
    PLAN_GPU,    /* every shard on the GPU (what is not resident is streamed: not yet) */
    PLAN_STATIC, /* by priority, attention (with its KV), head, dense FFN resident; the rest on the CPU */
};

/* What the device arena holds, in bytes. total is the budget. */
struct plan_budget {
    uint64_t total, weights, kv, activations, work, blas, free;
};

struct plan_request {
    enum plan_family family;
    int64_t vram_budget;  /* bytes; < 0: as much as the plan needs (gpu) */
    int32_t n_ctx, n_batch, n_seq;
};

struct plan {
    enum plan_family family; /* the family that was built (AUTO resolved) */
    uint32_t n_shards;
    enum placement *shard;   /* per shard of the model */
    bool any_gpu, all_gpu, any_cpu_attention;
    struct plan_budget budget;
    uint64_t host_bytes_per_token; /* weight bytes CPU shards read per decode token */
    uint64_t gpu_bytes_per_token;  /* weight bytes GPU shards read per decode token */
};

/* Size of the GPU-side buffers a plan needs besides weights and KV, for these shapes: one
 * token's activations (for n_batch), work buffers, cuBLAS's workspace. Filled by the
 * executor's GPU code (it knows the kernels); see exec_gpu_fixed_bytes. */
struct plan_gpu_costs {
    uint64_t activations, logits, work, blas; /* logits: only when the head is on the GPU */
};

/* Build a plan for `model` under the request. Fails with a clear message when the budget
 * cannot hold even the fixed GPU buffers (naming the minimum), or a family cannot be built. */
pshard_status plan_build(const struct model *model, const struct plan_request *req, const struct plan_gpu_costs *costs,
                         struct plan *out);
void plan_free(struct plan *plan);

/* Parse "2G", "2048M", "512K", "0", "1.5G" into bytes. */
pshard_status plan_parse_size(const char *text, int64_t *bytes);
pshard_status plan_parse_family(const char *text, enum plan_family *family);
const char *plan_family_name(enum plan_family family);
const char *placement_name(enum placement p);

/* The plan as a table: per shard its place and bytes, then the budget. */
void plan_print(const struct plan *plan, const struct model *model, FILE *out);

#endif
