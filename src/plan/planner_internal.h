/* The planner's two halves: the resident set under a budget and what a plan holds in VRAM
 * (planner_resident.c), and the search that places every tier over a set (planner.c). */
#ifndef PLAN_PLANNER_INTERNAL_H
#define PLAN_PLANNER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "plan/planner.h"

/* A dense shard's matrices (what streaming moves; its vectors stay resident). */
uint64_t plan_matrix_bytes(const struct shard *s);
/* An MoE shard's always-used part: router, norm, shared expert. */
uint64_t plan_shared_bytes(const struct shard *s);
/* Bytes of an attention shard's KV cache (its layer's pool); 0 for other shards. */
uint64_t plan_kv_bytes(const struct shard *s, const struct plan_request *req);

/* Empty every tier and the resident set: everything on the CPU, no ring. */
void plan_reset_places(struct plan *p);
/* The resident set of a budget with or without the staging ring (and with every layer's KV first);
 * every tier starts from it. Fails naming the minimum where the budget cannot hold one layer's KV
 * besides the GPU's buffers. */
pshard_status plan_resident_set(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                                const struct profile *prof, uint64_t budget, bool staging, bool kv_first, struct plan *p);
/* Tier t's flags (any_gpu, all_gpu, shards_gpu) and per-token byte counts from its places: what
 * the cost model reads of a tier besides the places. */
void plan_tier_account(const struct model *m, const struct plan *p, struct plan_tier *t);
/* Seconds per token of steps placed as `tier` (tier t's or another placement of it) at both ends
 * of tier t (its fewest tokens and its most), at the end of the context: how the planner weighs a
 * tier's placements. */
double plan_tier_per_token(const struct profile *prof, const struct model *m, const struct plan_request *req,
                           const struct plan *p, const struct plan_tier *tier, int t);
/* The budget's parts (resident weights and KV, the GPU's buffers, the file mapping) and every
 * tier's account. */
void plan_account(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs, struct plan *p);

/* The largest unit any shard may stream (a slot's size), setting the plan's experts per staged
 * piece; attention with its KV cells for `kv` (NULL: the ring carries none). */
uint64_t plan_slot_size(const struct model *m, const struct plan_request *kv, struct plan *p);
/* Staging slots a budget holds: PLAN_STAGING_SLOTS where they are a small part of it. */
uint32_t plan_slots_for(uint64_t budget, uint64_t slot);
/* VRAM for every shard and its KV resident, with the GPU's buffers. */
uint64_t plan_all_resident_bytes(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs);
/* The least budget, whole MB up, that holds `base` bytes besides the slots it would then have
 * (with_slots), or the whole model where that is less: what an error names as the minimum. */
double plan_minimum_mb(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                       uint64_t base, uint64_t slot, bool with_slots);

#endif
