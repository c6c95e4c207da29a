/* The cost model: how long one step of a plan's tier takes on this machine, predicted from the
 * machine profile without running anything.
 *
 * A step walks the shards in order, as the executor does. Each shard's time is a roofline over
 * the profile's measured rates (seconds per weight or KV byte at the step's token count,
 * interpolated in log n): on the GPU from VRAM, from host memory read in place, or through the
 * staging ring (copies overlapped with compute, so the slower of the two plus the first fill);
 * on the CPU through the thread pool. Activations cross PCIe where placement changes (a copy and
 * a host wait). An MoE layer split between the GPU and the CPU takes the longer of the two sides
 * plus a hand-off, each side slowed by the other's use of host memory as measured together.
 * Kernel launches cost their measured latency (graph nodes for replayed decode steps). */
#ifndef PLAN_COST_H
#define PLAN_COST_H

#include "model/model.h"
#include "plan/plan.h"
#include "plan/profile.h"

struct cost_step {
    double seconds;      /* the step, scaled by what running has taught (profile refine) */
    double raw_seconds;  /* the step as the profile's measurements alone predict it */
    double gpu_s, cpu_s; /* busy time of each side (they overlap in split MoE layers) */
    double pcie_s;       /* weight streaming and activation transfers */
    double overhead_s;   /* launches, host waits, hand-offs */
};

/* Seconds per byte of an op from a rate table at n tokens: the format's row, or the slowest
 * row when the format was not measured (a conservative guess). */
double cost_rate(const struct profile_rate table[PROFILE_FORMATS], uint32_t type, double n);

/* Seconds to copy `bytes` of pinned host memory to the GPU (up) or back, at the profile's rate for
 * copies of that size. */
double cost_copy_s(const struct profile *prof, double bytes, bool up);

/* The GPU's busy time for compute_s of kernels besides small_kernels small ones, each at least its
 * shortest run: replayed as a graph (graph), or launched one by one by `ops` host launches, which
 * pace the GPU where its kernels are shorter: a shard of a step, or a block of the vision encoder. */
double cost_gpu_busy_s(const struct profile *prof, double compute_s, int small_kernels, int ops, bool graph);

/* Expected distinct experts a step of n tokens touches among `range` of E, each token choosing k
 * at random. */
double cost_touched(double range, double E, double k, double n);

/* Seconds per touched expert byte at n tokens (k of E experts per token) from rates measured so:
 * a table's format row as cost_rate picks it, or one row of values. Between the measured token
 * counts it interpolates the time per token-expert pair, not per touched byte: from 16 tokens
 * the CPU's experts take time by pairs, and per touched byte they would be priced as if a step
 * of 32 tokens were half way (in log tokens) between 16 and 64, too slow. */
double cost_expert_rate(const struct profile_rate table[PROFILE_FORMATS], uint32_t type, double E, double k, double n);
double cost_expert_rate_of(const double values[PROFILE_TOKENS], double E, double k, double n); /* E = 0: per byte */

/* Query heads per KV head (the CPU's attention rates are per KV byte each of them attends; the
 * kernel reads a KV head once for the heads of a unit, cpu_attention_units). */
double cost_query_heads_per_kv(const struct model *m);

/* A routed tier's quota (plan_tier.routed_quota): for each count N of a token's experts that
 * are not resident, how many of them the GPU reads in place so the layer, split with the CPU,
 * takes least. */
void cost_routed_quota(const struct profile *prof, const struct model *m, const struct plan *p, const struct plan_tier *t,
                       uint8_t quota[PLAN_MAX_ROUTED + 1]);

/* A step of n_tokens as plan p runs it: in its phase's plan (plan_for_step), in the tier that
 * step takes there (cost_step, below). */
void cost_plan_step(const struct profile *prof, const struct model *m, const struct plan *p, int32_t n_tokens,
                    int32_t n_past, struct cost_step *out);

/* The mean of n_steps one-token decode steps after an n_prompt-token prompt as plan p runs them
 * (seconds and raw_seconds), from COST_DECODE_SAMPLES cache lengths evenly spread over them;
 * *one_plan: whether they all ran one plan (a band over long caches may change it among them). */
enum { COST_DECODE_SAMPLES = 8 };
void cost_decode_mean(const struct profile *prof, const struct model *m, const struct plan *p, int32_t n_prompt,
                      int32_t n_steps, struct cost_step *out, bool *one_plan);

/* One step of `n_tokens` new tokens after `n_past` cached positions, under tier t of plan p. */
void cost_step(const struct profile *prof, const struct model *m, const struct plan *p, const struct plan_tier *t,
               int32_t n_tokens, int32_t n_past, struct cost_step *out);

/* Learn from a measured run of model m: measured over raw predicted seconds of steps of this
 * family and size (n_tokens) folds into m's entry of prof->refine (an even running mean, kept
 * within 1/4 .. 4); a model not seen yet takes a free entry, or the oldest one's. */
void cost_learn(struct profile *prof, const struct model *m, enum plan_family family, int32_t n_tokens,
                double raw_predicted_s, double measured_s);

/* The name a model's learning is kept under: architecture, layers x width, experts, size. */
void cost_model_key(const struct model *m, char *out, size_t size);

/* n_seq requests at once: their prompts of n_prompt tokens each, read in steps of at most n_batch
 * tokens (a step takes the next prompt's tokens where one ends), then n_gen decode steps of one
 * token of each; seconds until every prompt is read (one request: to its first token) and per
 * decode step. */
void cost_request(const struct profile *prof, const struct model *m, const struct plan *p, int32_t n_prompt,
                  int32_t n_batch, int32_t n_gen, int32_t n_seq, double *ttft_s, double *decode_s);

/* KV bytes per cached position (one sequence) of the layers plan p keeps in VRAM. */
double cost_kv_position_bytes(const struct model *m, const struct plan *p);

/* Seconds to carve VRAM anew when the phase changes (plan.decode): up_bytes copied to the GPU
 * (the other set's resident weights, the KV of its layers in VRAM) and down_bytes back (the KV
 * of the layers the set before kept there), besides draining the streams and capturing the
 * decode step's graph again. */
double cost_switch(const struct profile *prof, const struct model *m, double up_bytes, double down_bytes);

#endif
