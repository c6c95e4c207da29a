/* Building plans: the cpu, gpu, static and dynamic families under a VRAM budget, per token
 * tier, and printing them. */
#include "plan/plan.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

enum { ALIGN = 256 };

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

static uint64_t align_up(uint64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }
static bool is_matrix(const struct gguf_tensor *t) { return t->n_dims >= 2 && t->ne[1] > 1; }
static bool is_experts(const struct gguf_tensor *t) { return t->n_dims >= 3 && t->ne[2] > 1; }

/* A dense shard's matrices (what streaming moves; its vectors stay resident). */
static uint64_t matrix_bytes(const struct shard *s) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++)
        if (is_matrix(s->tensors[i]) && !is_experts(s->tensors[i])) n += s->tensors[i]->n_bytes;
    return n;
}

uint64_t plan_unit_bytes(const struct shard *s, uint32_t n_experts) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const struct gguf_tensor *t = s->tensors[i];
        if (n_experts && is_experts(t)) n += align_up(t->n_bytes / t->ne[2] * n_experts);
        if (!n_experts && is_matrix(t) && !is_experts(t)) n += align_up(t->n_bytes);
    }
    return n;
}

/* An MoE shard's always-used part: router, norm, shared expert. */
static uint64_t shared_bytes(const struct shard *s) { return s->weight_bytes - (uint64_t)s->n_expert * s->expert_bytes; }

static uint64_t kv_bytes(const struct shard *s, const struct plan_request *req) {
    return s->kind == SHARD_ATTN ? s->kv_bytes_per_token * (uint64_t)req->n_ctx * (uint64_t)req->n_seq : 0;
}

/* The per-token byte counts of a tier: who reads what from where. */
static void tier_account(const struct model *m, const struct plan *p, struct plan_tier *t) {
    t->any_gpu = false;
    t->all_gpu = true;
    t->host_bytes_per_token = t->pcie_bytes_per_token = t->gpu_bytes_per_token = 0;
    const uint64_t k = m->hp.n_expert_used;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        const enum placement place = t->shard[i];
        t->any_gpu |= place != PLACE_CPU;
        t->all_gpu &= place != PLACE_CPU;
        if (s->kind == SHARD_EMBED) {
            const uint64_t row = s->n_tensors && s->tensors[0]->ne[1] ? s->tensors[0]->n_bytes / s->tensors[0]->ne[1] : 0;
            *(place == PLACE_CPU ? &t->host_bytes_per_token
                                 : place == PLACE_STREAMED ? &t->pcie_bytes_per_token : &t->gpu_bytes_per_token) += row;
        } else if (s->kind == SHARD_MOE && place != PLACE_CPU) {
            const uint32_t r = p->experts_resident[s->layer], g = t->experts_gpu[s->layer], E = s->n_expert;
            t->all_gpu &= g == E;
            t->gpu_bytes_per_token += shared_bytes(s) + k * s->expert_bytes * r / E;
            t->pcie_bytes_per_token += k * s->expert_bytes * (g - r) / E;
            t->host_bytes_per_token += k * s->expert_bytes * (E - g) / E;
        } else if (place == PLACE_CPU) {
            t->host_bytes_per_token += s->kind == SHARD_MOE ? shared_bytes(s) + k * s->expert_bytes : s->weight_bytes;
        } else if (place == PLACE_STREAMED) {
            t->pcie_bytes_per_token += matrix_bytes(s);
            t->gpu_bytes_per_token += s->weight_bytes - matrix_bytes(s);
        } else {
            t->gpu_bytes_per_token += s->weight_bytes;
        }
    }
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

/* Resident weights and KV of the plan (what its tiers keep in VRAM), then the rest. */
static void account(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                    struct plan *p) {
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
        p->any_cpu_attention |= s->kind == SHARD_ATTN && !gpu;
        if (!gpu) continue;
        if (s->kind == SHARD_MOE) b->weights += shared_bytes(s) + (uint64_t)p->experts_resident[s->layer] * s->expert_bytes;
        else if (place == PLACE_RESIDENT) b->weights += s->weight_bytes;
        else if (s->kind != SHARD_EMBED) b->weights += s->weight_bytes - matrix_bytes(s);
        b->kv += kv_bytes(s, req);
    }
    if (p->any_gpu) b->activations += costs->activations + costs->logits, b->work = costs->work, b->blas = costs->blas;
    else b->staging = 0;
    b->mapping = plan_streams(p) ? costs->host_mapping : 0;
    const uint64_t used = b->weights + b->kv + b->activations + b->work + b->blas + b->staging + b->mapping;
    b->free = b->total > used ? b->total - used : 0;
    for (int t = 0; t < PLAN_TIERS; t++) tier_account(m, p, &p->tier[t]);
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

static void set_tier(struct plan *p, int t, enum plan_family family, int32_t min_tokens) {
    p->tier[t].family = family;
    p->tier[t].min_tokens = min_tokens;
}

/* Every tier's places from the resident set and the tier's family. */
static void place_tier(const struct model *m, const struct plan_request *req, struct plan *p, int ti, bool ring) {
    struct plan_tier *t = &p->tier[ti];
    const bool stream_all = t->family == PLAN_GPU || (t->family == PLAN_DYNAMIC && ti == PLAN_TIER_PROMPT && ring);
    float share = req->stream_share > 0 ? req->stream_share : 0.5f;
    if (share > 1) share = 1;
    const bool staged = ring && ti == PLAN_TIER_PROMPT; /* this tier copies streamed shards through the slots */
    t->ring = false;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        enum placement *place = &t->shard[i];
        if (*place == PLACE_RESIDENT && s->kind != SHARD_MOE) continue;
        if (s->kind == SHARD_MOE) {
            /* On the GPU when its shared part is resident (marked by the caller). */
            if (*place == PLACE_CPU) continue;
            const uint32_t r = p->experts_resident[s->layer], E = s->n_expert;
            uint32_t g = r;
            if (stream_all) g = E;
            else if (t->family == PLAN_DYNAMIC) g = r + (uint32_t)lroundf(share * (float)(E - r));
            t->experts_gpu[s->layer] = g;
            *place = r == E ? PLACE_RESIDENT : PLACE_STREAMED;
            t->ring |= staged && g > r;
        } else if (s->kind == SHARD_ATTN) {
            *place = p->kv_gpu[s->layer] ? PLACE_STREAMED : PLACE_CPU;
            t->ring |= staged && *place == PLACE_STREAMED;
        } else {
            *place = stream_all ? PLACE_STREAMED : PLACE_CPU;
            t->ring |= staged && *place == PLACE_STREAMED && s->kind == SHARD_FFN;
        }
    }
}

static pshard_status build(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                           struct plan *p) {
    const uint32_t n = m->n_shards;
    for (int t = 0; t < PLAN_TIERS; t++)
        for (uint32_t i = 0; i < n; i++) p->tier[t].shard[i] = PLACE_CPU;
    set_tier(p, PLAN_TIER_DECODE, PLAN_CPU, 1);
    set_tier(p, PLAN_TIER_PROMPT, PLAN_CPU, PLAN_PROMPT_MIN_TOKENS);
    if (req->family == PLAN_CPU || req->vram_budget == 0) {
        p->family = PLAN_CPU;
        account(m, req, costs, p);
        return PSHARD_OK;
    }
    uint64_t fixed = costs->activations + costs->logits + costs->work + costs->blas;
    uint64_t all = fixed;
    for (uint32_t i = 0; i < n; i++) all += m->shards[i].weight_bytes + kv_bytes(&m->shards[i], req);
    const uint64_t budget = req->vram_budget < 0 ? all : (uint64_t)req->vram_budget;
    p->budget.total = budget;
    p->family = req->family;

    /* Everything fits: all resident, one plan for every tier. */
    if (budget >= all) {
        for (int t = 0; t < PLAN_TIERS; t++) {
            set_tier(p, t, req->family == PLAN_AUTO ? PLAN_GPU : req->family, p->tier[t].min_tokens);
            for (uint32_t i = 0; i < n; i++) p->tier[t].shard[i] = PLACE_RESIDENT;
        }
        for (uint32_t l = 0; l < p->n_layers; l++) {
            p->kv_gpu[l] = true;
            p->experts_resident[l] = p->tier[0].experts_gpu[l] = p->tier[1].experts_gpu[l] = p->n_expert;
        }
        if (p->family == PLAN_AUTO) p->family = PLAN_GPU;
        account(m, req, costs, p);
        return PSHARD_OK;
    }

    /* Below everything resident, shards may stream: reserve the file's mapping. */
    fixed += costs->host_mapping;

    /* The staging ring, sized for the largest unit any shard may stream. */
    uint64_t slot = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct shard *s = &m->shards[i];
        if (s->kind == SHARD_ATTN || s->kind == SHARD_FFN) slot = plan_unit_bytes(s, 0) > slot ? plan_unit_bytes(s, 0) : slot;
        if (s->kind == SHARD_MOE && s->expert_bytes) {
            uint64_t per = PLAN_PIECE_MAX_BYTES / s->expert_bytes;
            per = per < 1 ? 1 : per > s->n_expert ? s->n_expert : per;
            p->piece_experts = (uint32_t)per;
            slot = plan_unit_bytes(s, (uint32_t)per) > slot ? plan_unit_bytes(s, (uint32_t)per) : slot;
        }
    }
    const bool moe = m->hp.n_expert > 0;
    enum plan_family decode = req->family == PLAN_AUTO ? (moe ? PLAN_DYNAMIC : PLAN_STATIC) : req->family;
    enum plan_family prompt = req->family == PLAN_AUTO ? PLAN_GPU : req->family;
    if (prompt == PLAN_DYNAMIC) prompt = PLAN_GPU;
    const bool wants_ring = prompt == PLAN_GPU;
    const uint32_t n_slots = budget >= 32 * PLAN_STAGING_SLOTS * slot ? PLAN_STAGING_SLOTS : PLAN_MIN_SLOTS;
    uint64_t staging = wants_ring ? n_slots * slot : 0;
    uint64_t kv_all = 0, attn_vectors = 0, moe_shared = 0, smallest_kv = UINT64_MAX;
    for (uint32_t i = 0; i < n; i++) {
        const struct shard *s = &m->shards[i];
        kv_all += kv_bytes(s, req);
        if (s->kind == SHARD_ATTN) {
            attn_vectors += s->weight_bytes - matrix_bytes(s);
            smallest_kv = kv_bytes(s, req) < smallest_kv ? kv_bytes(s, req) : smallest_kv;
        }
        if (s->kind == SHARD_MOE) moe_shared += shared_bytes(s);
    }
    if (req->family == PLAN_GPU) {
        const uint64_t need = fixed + staging + kv_all + attn_vectors + moe_shared;
        if (budget < need)
            return core_fail(PSHARD_ERR_RANGE, "the gpu plan needs at least %.0f MB of VRAM for this model and context "
                             "(buffers, %u staging slots of %.0f MB, the KV cache); the budget is %.0f MB",
                             need / 1048576.0 + 1, n_slots, slot / 1048576.0, budget / 1048576.0);
    } else if (wants_ring && budget < fixed + staging + smallest_kv) {
        /* No room for the ring: prompts run like decode steps. */
        staging = 0;
        prompt = decode == PLAN_DYNAMIC ? PLAN_STATIC : decode;
    }
    if (budget < fixed + staging + smallest_kv)
        return core_fail(PSHARD_ERR_RANGE, "a VRAM budget of %.0f MB cannot hold even one layer's KV cache besides the "
                         "GPU's buffers; the minimum for this model and context is %.0f MB (or use 0 to run on the CPU)",
                         budget / 1048576.0, (fixed + staging + smallest_kv) / 1048576.0 + 1);
    set_tier(p, PLAN_TIER_DECODE, decode, 1);
    set_tier(p, PLAN_TIER_PROMPT, prompt, PLAN_PROMPT_MIN_TOKENS);
    p->family = decode;
    if (staging) p->n_slots = n_slots, p->slot_bytes = slot;
    p->budget.staging = staging;

    /* Resident set, by priority: every GPU shard's vectors (norms, biases: small), KV by layer,
     * attention matrices, head, MoE shared parts, dense FFN, experts (evenly over the layers),
     * the embedding. */
    struct room room = {budget - fixed - staging};
    uint64_t vectors = 0;
    for (uint32_t i = 0; i < n; i++)
        if (m->shards[i].kind != SHARD_MOE && m->shards[i].kind != SHARD_EMBED)
            vectors += m->shards[i].weight_bytes - matrix_bytes(&m->shards[i]);
    if (!take(&room, vectors)) room.left = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct shard *s = &m->shards[i];
        if (s->kind == SHARD_ATTN && take(&room, kv_bytes(s, req))) p->kv_gpu[s->layer] = true;
    }
    uint32_t n_moe_gpu = 0;
    static const enum shard_kind priority[] = {SHARD_ATTN, SHARD_HEAD, SHARD_MOE, SHARD_FFN};
    for (size_t k = 0; k < sizeof priority / sizeof priority[0]; k++)
        for (uint32_t i = 0; i < n; i++) {
            const struct shard *s = &m->shards[i];
            if (s->kind != priority[k]) continue;
            enum placement place = PLACE_CPU;
            if (s->kind == SHARD_ATTN && p->kv_gpu[s->layer] && take(&room, matrix_bytes(s))) place = PLACE_RESIDENT;
            if ((s->kind == SHARD_HEAD || s->kind == SHARD_FFN) && take(&room, matrix_bytes(s))) place = PLACE_RESIDENT;
            if (s->kind == SHARD_MOE && take(&room, shared_bytes(s))) place = PLACE_STREAMED, n_moe_gpu++;
            for (int t = 0; t < PLAN_TIERS; t++) p->tier[t].shard[i] = place;
        }
    /* Experts: the same count per layer, the remainder to the first layers. */
    uint64_t expert_bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        if (m->shards[i].kind == SHARD_MOE) expert_bytes = m->shards[i].expert_bytes;
    if (n_moe_gpu && expert_bytes) {
        uint64_t fit = room.left / expert_bytes;
        const uint64_t per = fit / n_moe_gpu;
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
    if (req->family == PLAN_AUTO && decode == PLAN_DYNAMIC) {
        uint64_t streamed = 0;
        for (uint32_t i = 0; i < n; i++) {
            const struct shard *s = &m->shards[i];
            if (s->kind == SHARD_MOE && p->tier[0].shard[i] != PLACE_CPU)
                streamed += (uint64_t)m->hp.n_expert_used * s->expert_bytes * (s->n_expert - p->experts_resident[s->layer]) /
                            s->n_expert;
            else if (s->kind == SHARD_MOE) streamed = UINT64_MAX / 2;
        }
        if (streamed <= PLAN_AUTO_STREAM_BYTES) set_tier(p, PLAN_TIER_DECODE, PLAN_GPU, 1), p->family = PLAN_GPU;
    }
    const struct shard *embed = &m->shards[0];
    if (embed->kind == SHARD_EMBED && take(&room, embed->weight_bytes))
        for (int t = 0; t < PLAN_TIERS; t++) p->tier[t].shard[0] = PLACE_RESIDENT;
    for (int t = 0; t < PLAN_TIERS; t++) place_tier(m, req, p, t, staging > 0);
    account(m, req, costs, p);
    return PSHARD_OK;
}

pshard_status plan_build(const struct model *model, const struct plan_request *req, const struct plan_gpu_costs *costs,
                         struct plan *out) {
    memset(out, 0, sizeof *out);
    out->n_shards = model->n_shards;
    out->n_layers = model->hp.n_layers;
    out->n_expert = model->hp.n_expert;
    const size_t nl = out->n_layers ? out->n_layers : 1, ns = model->n_shards ? model->n_shards : 1;
    out->kv_gpu = calloc(nl, sizeof *out->kv_gpu);
    out->experts_resident = calloc(nl, sizeof *out->experts_resident);
    bool ok = out->kv_gpu && out->experts_resident;
    for (int t = 0; t < PLAN_TIERS; t++) {
        out->tier[t].shard = calloc(ns, sizeof *out->tier[t].shard);
        out->tier[t].experts_gpu = calloc(nl, sizeof *out->tier[t].experts_gpu);
        ok = ok && out->tier[t].shard && out->tier[t].experts_gpu;
    }
    pshard_status st = ok ? build(model, req, costs, out) : core_fail(PSHARD_ERR_NOMEM, "out of memory");
    if (st != PSHARD_OK) plan_free(out);
    return st;
}

void plan_free(struct plan *plan) {
    for (int t = 0; t < PLAN_TIERS; t++) {
        free(plan->tier[t].shard);
        free(plan->tier[t].experts_gpu);
        plan->tier[t].shard = NULL;
        plan->tier[t].experts_gpu = NULL;
    }
    free(plan->kv_gpu);
    free(plan->experts_resident);
    plan->kv_gpu = NULL;
    plan->experts_resident = NULL;
}

static double mb(uint64_t bytes) { return bytes / 1048576.0; }

static void print_place(const struct plan *p, const struct plan_tier *t, const struct shard *s, uint32_t i, FILE *out) {
    if (s->kind == SHARD_MOE && t->shard[i] != PLACE_CPU) {
        const uint32_t r = p->experts_resident[s->layer], g = t->experts_gpu[s->layer];
        char buf[48];
        snprintf(buf, sizeof buf, "%u/%u/%u", r, g - r, s->n_expert - g);
        fprintf(out, " %-12s", buf);
    } else {
        fprintf(out, " %-12s", placement_name(t->shard[i]));
    }
}

void plan_print(const struct plan *p, const struct model *m, FILE *out) {
    const struct plan_tier *d = &p->tier[PLAN_TIER_DECODE], *pr = &p->tier[PLAN_TIER_PROMPT];
    fprintf(out, "plan %s: VRAM budget %.0f MB; steps of 1-%d tokens run '%s', of %d or more '%s'\n",
            plan_family_name(p->family), mb(p->budget.total), pr->min_tokens - 1, plan_family_name(d->family),
            pr->min_tokens, plan_family_name(pr->family));
    if (p->n_expert)
        fprintf(out, "(MoE shards on the GPU: experts resident/streamed/on the CPU; router and shared parts resident)\n");
    fprintf(out, "  %-5s %-6s %5s %-12s %-12s %12s %6s\n", "#", "shard", "layer", "decode", "prompt", "weights MB", "KV");
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        char layer[16] = "-";
        if (s->layer >= 0) snprintf(layer, sizeof layer, "%d", s->layer);
        fprintf(out, "  %-5u %-6s %5s", i, shard_kind_name(s->kind), layer);
        print_place(p, d, s, i, out);
        print_place(p, pr, s, i, out);
        fprintf(out, " %12.1f", mb(s->weight_bytes));
        if (s->kind == SHARD_ATTN) fprintf(out, " %6s", p->kv_gpu[s->layer] ? "VRAM" : "host");
        fputc('\n', out);
    }
    const struct plan_budget *b = &p->budget;
    fprintf(out, "VRAM: weights %.1f MB + KV %.1f MB + activations %.1f MB + work %.1f MB + cuBLAS %.1f MB + staging "
                 "%.1f MB (%u slots of %.1f MB) + file mapping %.1f MB; %.1f MB of the budget unused\n",
            mb(b->weights), mb(b->kv), mb(b->activations), mb(b->work), mb(b->blas), mb(b->staging), p->n_slots,
            mb(p->slot_bytes), mb(b->mapping), mb(b->free));
    fprintf(out, "per decode token: %.1f MB of weights read by the CPU from host memory, %.1f MB streamed over PCIe, "
                 "%.1f MB read by the GPU from VRAM\n",
            mb(d->host_bytes_per_token), mb(d->pcie_bytes_per_token), mb(d->gpu_bytes_per_token));
}
