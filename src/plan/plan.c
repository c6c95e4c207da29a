/* The plan as data, and the queries of a built plan that the executor, the cost model and the
 * printer read: the names and parsers of families and sets, where a shard lives across the tiers,
 * the staging ring's units and the slots they lend, a tier's placement key and the candidate a
 * step runs as. Building a plan is the planner's (planner.c). */
#include "plan/plan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/profile.h"

const int32_t plan_tier_tokens[PLAN_TIERS] = {1, 4, 16, 64, 256, 1024};

const char *plan_family_name(enum plan_family family) {
    switch (family) {
    case PLAN_AUTO: return "auto";
    case PLAN_CPU: return "cpu";
    case PLAN_GPU: return "gpu";
    case PLAN_STATIC: return "static";
    case PLAN_DYNAMIC: return "dynamic";
    }
    return "?";
}

const char *placement_name(enum placement p) {
    switch (p) {
    case PLACE_CPU: return "CPU";
    case PLACE_RESIDENT: return "RESIDENT";
    case PLACE_STREAMED: return "STREAMED";
    }
    return "?";
}

pshard_status plan_parse_family(const char *text, enum plan_family *family) {
    for (int f = 0; f < PLAN_FAMILY_COUNT; f++)
        if (!strcmp(text, plan_family_name((enum plan_family)f))) {
            *family = (enum plan_family)f;
            return PSHARD_OK;
        }
    return core_fail(PSHARD_ERR_INVALID_ARG, "unknown plan '%s' (cpu, gpu, static, dynamic or auto)", text);
}

pshard_status plan_parse_share(const char *text, float *share) {
    char *end;
    errno = 0;
    const double value = strtod(text, &end);
    if (end == text || *end || errno || !(value >= 0 && value <= 1))
        return core_fail(PSHARD_ERR_INVALID_ARG, "'%s' is not a share (a number from 0 to 1)", text);
    *share = (float)value;
    return PSHARD_OK;
}

pshard_status plan_parse_set(const char *text, enum plan_set *set) {
    static const char *const names[PLAN_SETS] = {"no-ring", "ring", "all-kv"};
    for (int s = 0; s < PLAN_SETS; s++)
        if (!strcmp(text, names[s])) {
            *set = (enum plan_set)s;
            return PSHARD_OK;
        }
    return core_fail(PSHARD_ERR_INVALID_ARG, "unknown resident set '%s' (ring, no-ring or all-kv)", text);
}

pshard_status plan_parse_decode_set(const char *text, int32_t *decode_set) {
    enum plan_set set;
    if (!strcmp(text, "same")) {
        *decode_set = PLAN_DECODE_SAME;
        return PSHARD_OK;
    }
    if (plan_parse_set(text, &set) != PSHARD_OK)
        return core_fail(PSHARD_ERR_INVALID_ARG, "unknown decode set '%s' (ring, no-ring, all-kv or same)", text);
    *decode_set = (int32_t)set;
    return PSHARD_OK;
}

pshard_status plan_parse_size(const char *text, int64_t *bytes) {
    char *end;
    errno = 0;
    const double value = strtod(text, &end);
    if (end == text) return core_fail(PSHARD_ERR_INVALID_ARG, "'%s' is not a size (examples: 2G, 2048M, 0)", text);
    double scale = 1;
    switch (*end) {
    case 'k': case 'K': scale = 1024.0, end++; break;
    case 'm': case 'M': scale = 1024.0 * 1024, end++; break;
    case 'g': case 'G': scale = 1024.0 * 1024 * 1024, end++; break;
    case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024, end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end += *end == 'i' ? (end[1] == 'B' ? 2 : 1) : 1;
    if (errno || *end || !isfinite(value) || value < 0 || value * scale > 9e18)
        return core_fail(PSHARD_ERR_INVALID_ARG, "'%s' is not a size (examples: 2G, 2048M, 0)", text);
    *bytes = (int64_t)(value * scale);
    return PSHARD_OK;
}

uint64_t plan_unit_bytes(const struct shard *s, uint32_t n_experts) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const struct gguf_tensor *t = s->tensors[i];
        if (n_experts && model_tensor_is_experts(t)) n += plan_align_up(t->n_bytes / t->ne[2] * n_experts);
        if (!n_experts && model_tensor_is_matrix(t) && !model_tensor_is_experts(t)) n += plan_align_up(t->n_bytes);
    }
    return n;
}

bool plan_splits_ffn(const struct plan *p) {
    for (int t = 0; t < PLAN_TIERS; t++)
        for (uint32_t l = 0; l < p->n_layers; l++)
            if (p->tier[t].ffn_rows_gpu[l]) return true;
    return false;
}

enum placement plan_shard_place(const struct plan *p, uint32_t i) {
    enum placement place = PLACE_CPU;
    for (int t = 0; t < PLAN_TIERS; t++)
        if (p->tier[t].shard[i] != PLACE_CPU) place = p->tier[t].shard[i];
    return place;
}

bool plan_streams(const struct plan *p) {
    for (uint32_t i = 0; i < p->n_shards; i++)
        if (plan_shard_place(p, i) == PLACE_STREAMED) return true;
    for (int t = 0; t < PLAN_TIERS; t++)
        for (uint32_t l = 0; l < p->n_layers; l++)
            if (p->tier[t].experts_gpu[l] > p->experts_resident[l]) return true;
    return false;
}

uint32_t plan_shard_units(const struct plan *p, const struct shard *s, enum placement place) {
    if (s->kind == SHARD_ATTN && !p->kv_gpu[s->layer]) return p->kv_stream;
    if (s->kind == SHARD_ATTN || s->kind == SHARD_FFN) return place != PLACE_RESIDENT;
    if (s->kind != SHARD_MOE || place == PLACE_CPU) return 0;
    const uint32_t piece = p->piece_experts ? p->piece_experts : 1, r = p->experts_resident[s->layer];
    return r < s->n_expert ? (s->n_expert - r + piece - 1) / piece : 0;
}

uint32_t plan_ring_units(const struct plan *p, const struct model *m, const struct plan_tier *marks,
                         struct plan_unit *out) {
    const uint32_t piece = p->piece_experts ? p->piece_experts : 1;
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        const uint32_t units = plan_shard_units(p, s, marks->shard[i]);
        for (uint32_t u = 0; u < units; u++, n++) {
            if (!out) continue;
            if (s->kind != SHARD_MOE) {
                out[n] = (struct plan_unit){i, 0, 0};
            } else {
                /* (highest pieces first, so a layer's last pieces, which may be lent, follow its
                 * resident experts) */
                const uint32_t e = p->experts_resident[s->layer] + (units - 1 - u) * piece;
                out[n] = (struct plan_unit){i, e, e + piece < s->n_expert ? e + piece : s->n_expert};
            }
        }
    }
    return n;
}

bool plan_tier_stages(const struct model *m, const struct plan_tier *t, const struct plan_unit *u) {
    const struct shard *s = &m->shards[u->shard];
    if (t->shard[u->shard] == PLACE_CPU) return false;
    return s->kind != SHARD_MOE || u->first < t->experts_gpu[s->layer];
}

bool plan_lends(const struct plan *p) {
    for (uint32_t i = 0; i < p->n_shards; i++)
        if (p->lent[i]) return true;
    for (uint32_t l = 0; p->experts_lent && l < p->n_layers; l++)
        if (p->experts_lent[l]) return true;
    return false;
}

bool plan_unit_lent(const struct plan *p, const struct model *m, const struct plan_unit *u) {
    const struct shard *s = &m->shards[u->shard];
    if (s->kind != SHARD_MOE) return p->lent[u->shard];
    return p->experts_lent && u->first < p->experts_resident[s->layer] + p->experts_lent[s->layer];
}

/* A tier's placement as a number: two candidates that place everything alike in a tier (gpu and
 * static in a tier whose weights are all resident, say) are one plan there. */
uint64_t plan_tier_key(const struct plan *p, int t) {
    uint64_t h = 1469598103934665603ull;
    const struct plan_tier *tier = &p->tier[t];
    for (uint32_t i = 0; i < p->n_shards; i++) h = (h ^ (uint64_t)tier->shard[i]) * 1099511628211ull;
    for (uint32_t l = 0; l < p->n_layers; l++)
        h = (h ^ tier->experts_gpu[l] ^ (uint64_t)tier->ffn_rows_gpu[l] << 32 ^ (uint64_t)p->experts_resident[l] << 20 ^
             (uint64_t)p->kv_gpu[l] << 40 ^
             (uint64_t)(plan_experts_vram(p, tier, l) - p->experts_resident[l]) << 48) * 1099511628211ull;
    h = (h ^ tier->ring) * 1099511628211ull;
    h = (h ^ (uint64_t)lroundf(tier->kv_cpu_share * 65536)) * 1099511628211ull;
    if (tier->routed)
        for (int n = 0; n <= PLAN_MAX_ROUTED; n++) h = (h ^ (uint64_t)tier->routed_quota[n] << 8 ^ 1) * 1099511628211ull;
    return h;
}

int plan_step_candidate(const struct plan *p, int32_t n_tokens, int32_t n_cells) {
    const struct plan *runs = plan_for_step(p, n_tokens, n_cells);
    const int tier = plan_weighed_tier(n_tokens), at = (int)(plan_tier_for(runs, n_tokens) - runs->tier);
    const uint64_t key = plan_tier_key(runs, at);
    if (p->chosen[tier] >= 0 && p->candidates[p->chosen[tier]].key[tier] == key) return p->chosen[tier];
    for (uint32_t c = 0; c < p->n_candidates; c++)
        if (p->candidates[c].key[tier] == key) return (int)c;
    return -1;
}

/* Within PLAN_SET_MARGIN of the soonest, the set with the soonest first token wins, where that
 * is sooner by more than the margin too. Sets that lend or keep different weights differ in
 * decode by less than the cost model's error, while a prompt read in place instead of copied
 * through the ring is slower by far; a first token sooner by less than the margin says nothing
 * either (bench/RESULTS.md). */
int plan_soonest_set(const struct plan *p, int32_t n_out, double *soonest) {
    int best = -1;
    double best_total = INFINITY;
    for (int set = 0; set < PLAN_SETS; set++) {
        const double ttft = p->weighed_set[set].ttft, total = ttft + n_out * p->weighed_set[set].decode;
        if (ttft > 0 && total < best_total) best_total = total, best = set;
    }
    for (int set = 0; best >= 0 && set < PLAN_SETS; set++) {
        const double ttft = p->weighed_set[set].ttft, total = ttft + n_out * p->weighed_set[set].decode;
        if (ttft > 0 && total <= best_total * (1 + PLAN_SET_MARGIN) && ttft < p->weighed_set[best].ttft * (1 - PLAN_SET_MARGIN))
            best = set;
    }
    if (soonest) *soonest = best_total;
    return best;
}

/* Without a profile, the conservative defaults (which describe a mid-range GPU). */
const struct profile *plan_profile(const struct profile *prof, struct profile *scratch) {
    if (prof) return prof;
    profile_defaults(scratch);
    scratch->has_gpu = true;
    return scratch;
}

void plan_free(struct plan *plan) {
    if (plan->decode) plan_free(plan->decode);
    free(plan->decode);
    plan->decode = NULL;
    for (int t = 0; t < PLAN_TIERS; t++) {
        free(plan->tier[t].shard);
        free(plan->tier[t].experts_gpu);
        free(plan->tier[t].ffn_rows_gpu);
        plan->tier[t].ffn_rows_gpu = NULL;
        plan->tier[t].shard = NULL;
        plan->tier[t].experts_gpu = NULL;
    }
    free(plan->kv_gpu);
    free(plan->experts_resident);
    free(plan->lent);
    free(plan->experts_lent);
    plan->experts_lent = NULL;
    plan->kv_gpu = NULL;
    plan->experts_resident = NULL;
    plan->lent = NULL;
}
