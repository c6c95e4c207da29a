/* The planner's resident sets and accounting: which units live in VRAM under a budget (by
 * benefit per byte, with or without room for the staging ring), the units the ring lends its
 * slots to, and what a plan holds: the budget's parts and each tier's bytes per token. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/cost.h"
#include "plan/planner_internal.h"
#include "plan/profile.h"

/* A dense shard's matrices (what streaming moves; its vectors stay resident). */
uint64_t plan_matrix_bytes(const struct shard *s) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++)
        if (model_tensor_is_matrix(s->tensors[i]) && !model_tensor_is_experts(s->tensors[i]))
            n += s->tensors[i]->n_bytes;
    return n;
}

/* An MoE shard's always-used part: router, norm, shared expert. */
uint64_t plan_shared_bytes(const struct shard *s) { return s->weight_bytes - (uint64_t)s->n_expert * s->expert_bytes; }

/* The cells of each layer's KV pool, which the sequences share. */
static uint64_t kv_cells(const struct plan_request *req) {
    return req->kv_cells > 0 ? (uint64_t)req->kv_cells : (uint64_t)req->n_ctx * (uint64_t)req->n_seq;
}


uint64_t plan_kv_bytes(const struct shard *s, const struct plan_request *req) {
    return s->kind == SHARD_ATTN ? s->kv_bytes_per_token * kv_cells(req) : 0;
}

/* The per-token byte counts of a tier: who reads what from where. */
void plan_tier_account(const struct model *m, const struct plan *p, struct plan_tier *t) {
    t->any_gpu = false;
    t->all_gpu = t->shards_gpu = true;
    t->host_bytes_per_token = t->pcie_bytes_per_token = t->gpu_bytes_per_token = 0;
    const uint64_t k = m->hp.n_expert_used;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        const enum placement place = t->shard[i];
        t->any_gpu |= place != PLACE_CPU;
        t->all_gpu &= place != PLACE_CPU;
        t->shards_gpu &= place != PLACE_CPU || s->kind == SHARD_EMBED;
        if (s->kind == SHARD_EMBED) {
            const uint64_t row = s->n_tensors && s->tensors[0]->ne[1] ? s->tensors[0]->n_bytes / s->tensors[0]->ne[1] : 0;
            *(place == PLACE_CPU ? &t->host_bytes_per_token
                                 : place == PLACE_STREAMED ? &t->pcie_bytes_per_token : &t->gpu_bytes_per_token) += row;
        } else if (s->kind == SHARD_MOE && place != PLACE_CPU) {
            const uint32_t r = plan_experts_vram(p, t, s->layer), g = t->experts_gpu[s->layer], E = s->n_expert;
            t->all_gpu &= g == E;
            t->gpu_bytes_per_token += plan_shared_bytes(s) + k * s->expert_bytes * r / E;
            t->pcie_bytes_per_token += k * s->expert_bytes * (g - r) / E;
            t->host_bytes_per_token += k * s->expert_bytes * (E - g) / E;
        } else if (place == PLACE_CPU) {
            t->host_bytes_per_token += s->kind == SHARD_MOE ? plan_shared_bytes(s) + k * s->expert_bytes : s->weight_bytes;
        } else if (place == PLACE_STREAMED && plan_ffn_split(t, s)) {
            const uint64_t gpu = plan_matrix_bytes(s) * t->ffn_rows_gpu[s->layer] / m->hp.n_ff;
            t->all_gpu = false;
            t->pcie_bytes_per_token += gpu;
            t->host_bytes_per_token += plan_matrix_bytes(s) - gpu;
            t->gpu_bytes_per_token += s->weight_bytes - plan_matrix_bytes(s);
        } else if (place == PLACE_STREAMED) {
            *(plan_reads_lent(p, t, i) ? &t->gpu_bytes_per_token : &t->pcie_bytes_per_token) += plan_matrix_bytes(s);
            t->gpu_bytes_per_token += s->weight_bytes - plan_matrix_bytes(s);
        } else {
            t->gpu_bytes_per_token += s->weight_bytes;
        }
    }
}

/* plan.lent and plan.experts_lent from the resident set (marked in tier 0): the dense shards and
 * the MoE pieces among the ring's last n_slots units. */
static pshard_status lend_slots(const struct model *m, struct plan *p) {
    struct plan_unit *units = malloc(sizeof *units * plan_ring_units_max(p));
    if (!units) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    const uint32_t n = plan_ring_units(p, m, &p->tier[0], units);
    for (uint32_t j = n > p->n_slots ? n - p->n_slots : 0; j < n; j++) {
        const struct shard *s = &m->shards[units[j].shard];
        if (s->kind == SHARD_MOE) {
            /* (a layer's pieces run from its highest experts down, so those among the last units
             * are the lowest past its resident ones: one range) */
            if (p->experts_lent) p->experts_lent[s->layer] += units[j].end - units[j].first;
            continue;
        }
        /* (attention whose KV is on the host needs its cells in the slot, which only ring steps bring) */
        p->lent[units[j].shard] |= s->kind == SHARD_FFN || (s->kind == SHARD_ATTN && p->kv_gpu[s->layer]);
    }
    free(units);
    return PSHARD_OK;
}

/* Resident weights and KV of the plan (what its tiers keep in VRAM), then the rest. */
void plan_account(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs, struct plan *p) {
    struct plan_budget *b = &p->budget;
    const uint64_t total = b->total, staging = b->staging;
    memset(b, 0, sizeof *b);
    b->total = total;
    b->staging = staging;
    p->any_gpu = p->any_cpu_attention = false;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        const enum placement place = plan_shard_place(p, i);
        const bool gpu = place != PLACE_CPU;
        p->any_gpu |= gpu;
        p->any_cpu_attention |= s->kind == SHARD_ATTN && !p->kv_gpu[s->layer];
        if (!gpu) continue;
        if (s->kind == SHARD_MOE) b->weights += plan_shared_bytes(s) + (uint64_t)p->experts_resident[s->layer] * s->expert_bytes;
        else if (place == PLACE_RESIDENT) b->weights += s->weight_bytes;
        else if (s->kind != SHARD_EMBED) b->weights += s->weight_bytes - plan_matrix_bytes(s);
        if (s->kind == SHARD_ATTN && p->kv_gpu[s->layer]) b->kv += plan_kv_bytes(s, req);
    }
    if (p->any_gpu) {
        b->activations += costs->activations + costs->logits, b->work = costs->work, b->blas = costs->blas;
        if (costs->buffers) b->buffers = costs->buffers + costs->logits, b->margin = costs->margin;
    }
    else b->staging = 0;
    b->mapping = plan_streams(p) ? costs->host_mapping : 0;
    const uint64_t used = b->weights + b->kv + b->activations + b->work + b->blas + b->staging + b->mapping;
    b->free = b->total > used ? b->total - used : 0;
    for (int t = 0; t < PLAN_TIERS; t++) plan_tier_account(m, p, &p->tier[t]);
}

/* Room left in the budget while choosing what is resident. */
struct room {
    uint64_t left;
};


static bool take(struct room *r, uint64_t bytes) {
    if (bytes > r->left) return false;
    r->left -= bytes;
    return true;
}

/* A unit of the resident set: a shard's matrices (with its layer's KV, for attention) or an
 * MoE shard's shared part, and how much a decode step saves per byte of VRAM it takes. */
struct unit {
    uint32_t shard;
    uint64_t bytes;
    double benefit; /* seconds saved per decode token per byte */
    int rank;       /* the kind's priority, breaking near-ties */
};


static void unit_benefit(const struct model *m, const struct plan_request *req, const struct profile *prof, bool kv_separate,
                         struct unit *u) {
    const struct shard *s = &m->shards[u->shard];
    double saved = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const struct gguf_tensor *t = s->tensors[i];
        if (model_tensor_is_matrix(t) && !model_tensor_is_experts(t))
            saved += t->n_bytes * (cost_rate(prof->cpu_matmul, t->type, 1) - cost_rate(prof->gpu_matmul, t->type, 1));
    }
    if (s->kind == SHARD_ATTN)
        saved += (double)s->kv_bytes_per_token * (kv_cells(req) < (uint64_t)req->n_ctx ? kv_cells(req) : (uint64_t)req->n_ctx) *
                 (prof->cpu_attn[0] * cost_query_heads_per_kv(m) - prof->gpu_attn[0]); /* a sequence's longest cache */
    u->benefit = saved / (double)(u->bytes ? u->bytes : 1);
    /* An MoE layer's shared part (its router: a few MB) is what lets the GPU take any of the
     * layer's experts, streamed, read in place or split; without it every tier, prompts
     * included, computes them on the CPU. Weighed by the router alone, attention would come
     * first, and a small budget would keep almost no layer's router. */
    if (s->kind == SHARD_MOE && s->expert_bytes) u->benefit = DBL_MAX;
    (void)kv_separate;
}


static int unit_order(const void *a, const void *b) {
    const struct unit *x = a, *y = b;
    const double hi = x->benefit > y->benefit ? x->benefit : y->benefit;
    if (fabs(x->benefit - y->benefit) > 0.05 * hi) return x->benefit > y->benefit ? -1 : 1;
    if (x->rank != y->rank) return x->rank - y->rank;
    return x->shard < y->shard ? -1 : x->shard > y->shard;
}

/* The resident set under a budget: every GPU shard's vectors (norms, biases: small), then units
 * by benefit per byte (a layer's attention with its KV; the head; MoE shared parts; dense
 * FFNs), then experts (the same count per layer), then the embedding. When every attention must
 * run on the GPU (the gpu family), all KV comes first. */
static pshard_status choose_resident(const struct model *m, const struct plan_request *req, const struct profile *prof,
                                     uint64_t room_bytes, bool kv_first, struct plan *p) {
    const uint32_t n = m->n_shards;
    struct room room = {room_bytes};
    uint64_t vectors = 0;
    for (uint32_t i = 0; i < n; i++)
        if (m->shards[i].kind != SHARD_MOE && m->shards[i].kind != SHARD_EMBED)
            vectors += m->shards[i].weight_bytes - plan_matrix_bytes(&m->shards[i]);
    if (!take(&room, vectors)) room.left = 0;
    if (kv_first)
        for (uint32_t i = 0; i < n; i++) {
            const struct shard *s = &m->shards[i];
            if (s->kind == SHARD_ATTN && take(&room, plan_kv_bytes(s, req))) p->kv_gpu[s->layer] = true;
        }
    struct unit *units = calloc(n, sizeof *units);
    if (!units) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    uint32_t n_units = 0;
    static const int rank[SHARD_KIND_COUNT] = {9, 0, 3, 2, 1};
    for (uint32_t i = 0; i < n; i++) {
        const struct shard *s = &m->shards[i];
        if (s->kind == SHARD_EMBED) continue;
        struct unit *u = &units[n_units++];
        u->shard = i;
        u->rank = rank[s->kind];
        u->bytes = s->kind == SHARD_MOE ? plan_shared_bytes(s) : plan_matrix_bytes(s);
        if (s->kind == SHARD_ATTN && !kv_first) u->bytes += plan_kv_bytes(s, req);
        unit_benefit(m, req, prof, kv_first, u);
    }
    qsort(units, n_units, sizeof *units, unit_order);
    uint32_t n_moe_gpu = 0;
    for (uint32_t k = 0; k < n_units; k++) {
        const struct shard *s = &m->shards[units[k].shard];
        enum placement place = PLACE_CPU;
        if (s->kind == SHARD_ATTN) {
            if (kv_first ? p->kv_gpu[s->layer] && take(&room, units[k].bytes) : take(&room, units[k].bytes))
                place = PLACE_RESIDENT, p->kv_gpu[s->layer] = true;
        } else if (take(&room, units[k].bytes)) {
            place = s->kind == SHARD_MOE ? PLACE_STREAMED : PLACE_RESIDENT;
            n_moe_gpu += s->kind == SHARD_MOE;
        }
        for (int t = 0; t < PLAN_TIERS; t++) p->tier[t].shard[units[k].shard] = place;
    }
    free(units);
    /* Attention whose matrices did not fit still runs on the GPU where its KV is (kv_first). */
    /* Experts: the same count per layer, the remainder to the first layers. */
    uint64_t expert_bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        if (m->shards[i].kind == SHARD_MOE) expert_bytes = m->shards[i].expert_bytes;
    if (n_moe_gpu && expert_bytes) {
        const uint64_t fit = room.left / expert_bytes, per = fit / n_moe_gpu;
        uint64_t extra = fit % n_moe_gpu;
        for (uint32_t i = 0; i < n; i++) {
            const struct shard *s = &m->shards[i];
            if (s->kind != SHARD_MOE || p->tier[0].shard[i] == PLACE_CPU) continue;
            uint64_t r = per + (extra ? 1 : 0);
            if (extra) extra--;
            if (r > s->n_expert) r = s->n_expert;
            p->experts_resident[s->layer] = (uint32_t)r;
            room.left -= r * s->expert_bytes;
        }
    }
    const struct shard *embed = &m->shards[0];
    if (embed->kind == SHARD_EMBED && take(&room, embed->weight_bytes))
        for (int t = 0; t < PLAN_TIERS; t++) p->tier[t].shard[0] = PLACE_RESIDENT;
    return PSHARD_OK;
}

/* Bytes of a layer's KV cells in a slot (plan.kv_stream): a copy of its pool, K then V. */
static uint64_t kv_unit_bytes(const struct shard *s, const struct plan_request *req) {
    return plan_align_up(plan_kv_bytes(s, req)) + PLAN_ALIGN;
}

/* The largest unit any shard may stream (a slot's size), and experts per staged piece; attention
 * with its KV cells for `kv` (NULL: the ring carries none). */
uint64_t plan_slot_size(const struct model *m, const struct plan_request *kv, struct plan *p) {
    uint64_t slot = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        uint64_t unit = plan_unit_bytes(s, 0);
        if (s->kind == SHARD_ATTN && kv) unit += kv_unit_bytes(s, kv);
        if (s->kind == SHARD_ATTN || s->kind == SHARD_FFN) slot = unit > slot ? unit : slot;
        if (s->kind == SHARD_MOE && s->expert_bytes) {
            uint64_t per = PLAN_PIECE_MAX_BYTES / s->expert_bytes;
            per = per < 1 ? 1 : per > s->n_expert ? s->n_expert : per;
            p->piece_experts = (uint32_t)per;
            slot = plan_unit_bytes(s, (uint32_t)per) > slot ? plan_unit_bytes(s, (uint32_t)per) : slot;
        }
    }
    return slot;
}


void plan_reset_places(struct plan *p) {
    for (int t = 0; t < PLAN_TIERS; t++) {
        p->tier[t].family = PLAN_CPU;
        p->tier[t].routed = p->tier[t].ring = p->tier[t].kv_stream = false;
        p->tier[t].kv_cpu_share = 0;
        p->tier[t].min_tokens = plan_tier_tokens[t];
        for (uint32_t i = 0; i < p->n_shards; i++) p->tier[t].shard[i] = PLACE_CPU;
        for (uint32_t l = 0; l < p->n_layers; l++) p->tier[t].experts_gpu[l] = p->tier[t].ffn_rows_gpu[l] = 0;
    }
    for (uint32_t l = 0; l < p->n_layers; l++) p->kv_gpu[l] = false, p->experts_resident[l] = 0;
    p->n_slots = 0;
    p->slot_bytes = 0;
    p->kv_stream = false;
    p->budget.staging = 0;
    memset(p->lent, 0, sizeof *p->lent * p->n_shards);
    if (p->experts_lent) memset(p->experts_lent, 0, sizeof *p->experts_lent * p->n_layers);
}

/* Staging slots a budget holds: PLAN_STAGING_SLOTS where they are a small part of it. */
uint32_t plan_slots_for(uint64_t budget, uint64_t slot) {
    return budget >= 32 * PLAN_STAGING_SLOTS * slot ? PLAN_STAGING_SLOTS : PLAN_MIN_SLOTS;
}

/* VRAM for every shard and its KV resident, with the GPU's buffers: a budget this large holds
 * the whole model, one plan for every tier. */
uint64_t plan_all_resident_bytes(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs) {
    uint64_t all = costs->activations + costs->logits + costs->work + costs->blas;
    for (uint32_t i = 0; i < m->n_shards; i++) all += m->shards[i].weight_bytes + plan_kv_bytes(&m->shards[i], req);
    return all;
}

/* The least budget that holds `base` bytes besides the slots it would then have (with_slots),
 * or the whole model where that is less, whole MB up: what an error names as the minimum. */
double plan_minimum_mb(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                       uint64_t base, uint64_t slot, bool with_slots) {
    uint64_t least = base;
    if (with_slots) {
        least = base + PLAN_MIN_SLOTS * slot;
        if (plan_slots_for(least, slot) == PLAN_STAGING_SLOTS) least = base + PLAN_STAGING_SLOTS * slot;
    }
    const uint64_t all = plan_all_resident_bytes(m, req, costs);
    return ceil((all < least ? all : least) / 1048576.0);
}

/* The resident set of a budget with or without the staging ring; every tier starts from it. */
pshard_status plan_resident_set(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                                const struct profile *prof, uint64_t budget, bool staging, bool kv_first, struct plan *p) {
    plan_reset_places(p);
    p->budget.total = budget;
    const uint64_t fixed = costs->activations + costs->logits + costs->work + costs->blas + costs->host_mapping;
    /* (a set that takes every KV first keeps the rest of it too: its ring carries no cells; with
     * several sequences a slot would hold every sequence's cells of a layer, the whole pool's, so
     * they ride only where they fit in the slots the experts' pieces make anyway) */
    const uint64_t bare_slot = plan_slot_size(m, NULL, p), kv_slot = plan_slot_size(m, req, p);
    const bool carries_kv = staging && req->kv_stream && !kv_first && (req->n_seq == 1 || kv_slot == bare_slot);
    const uint64_t slot = carries_kv ? kv_slot : bare_slot;
    const uint32_t n_slots = plan_slots_for(budget, slot);
    const uint64_t ring = staging ? n_slots * slot : 0;
    uint64_t smallest_kv = UINT64_MAX;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const uint64_t kv = plan_kv_bytes(&m->shards[i], req);
        if (m->shards[i].kind == SHARD_ATTN && kv < smallest_kv) smallest_kv = kv;
    }
    if (budget < fixed + ring + smallest_kv)
        return core_fail(PSHARD_ERR_RANGE, "a VRAM budget of %.0f MB cannot hold even one layer's KV cache besides the "
                         "GPU's buffers; the minimum for this model and context is %.0f MB (or use 0 to run on the CPU)",
                         budget / 1048576.0, plan_minimum_mb(m, req, costs, fixed + smallest_kv, slot, staging));
    if (staging) p->n_slots = n_slots, p->slot_bytes = slot, p->budget.staging = ring;
    CORE_TRY(choose_resident(m, req, prof, budget - fixed - ring, kv_first, p));
    for (uint32_t l = 0; carries_kv && l < p->n_layers; l++) p->kv_stream |= !p->kv_gpu[l];
    return staging ? lend_slots(m, p) : PSHARD_OK;
}
