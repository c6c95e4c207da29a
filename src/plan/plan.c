/* Building plans: the cpu, gpu and static families under a VRAM budget, and printing them. */
#include "plan/plan.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const char *plan_family_name(enum plan_family family) {
    switch (family) {
    case PLAN_AUTO: return "auto";
    case PLAN_CPU: return "cpu";
    case PLAN_GPU: return "gpu";
    case PLAN_STATIC: return "static";
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
    for (enum plan_family f = PLAN_AUTO; f <= PLAN_STATIC; f++)
        if (!strcmp(text, plan_family_name(f))) {
            *family = f;
            return PSHARD_OK;
        }
    if (!strcmp(text, "dynamic"))
        return core_fail(PSHARD_ERR_UNSUPPORTED, "plan 'dynamic' (streaming beside CPU work) is not implemented yet");
    return core_fail(PSHARD_ERR_INVALID_ARG, "unknown plan '%s' (cpu, gpu, static or auto)", text);
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

/* Bytes a shard reads for one decode token: an MoE shard its shared part and k experts. */
static uint64_t bytes_per_token(const struct model *m, const struct shard *s) {
    if (s->kind == SHARD_EMBED) return s->n_tensors ? s->tensors[0]->n_bytes / (s->tensors[0]->ne[1] ? (uint64_t)s->tensors[0]->ne[1] : 1) : 0;
    if (s->kind == SHARD_MOE)
        return s->weight_bytes - (uint64_t)s->n_expert * s->expert_bytes + (uint64_t)m->hp.n_expert_used * s->expert_bytes;
    return s->weight_bytes;
}

static uint64_t kv_bytes(const struct shard *s, const struct plan_request *req) {
    return s->kind == SHARD_ATTN ? s->kv_bytes_per_token * (uint64_t)req->n_ctx * (uint64_t)req->n_seq : 0;
}

/* The budget a plan uses: the fixed GPU buffers, then its resident shards and their KV. */
static void account(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                    struct plan *p) {
    struct plan_budget *b = &p->budget;
    const uint64_t total = b->total;
    memset(b, 0, sizeof *b);
    b->total = total;
    p->any_gpu = p->any_cpu_attention = false;
    p->all_gpu = true;
    p->host_bytes_per_token = p->gpu_bytes_per_token = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        const bool gpu = p->shard[i] != PLACE_CPU;
        p->any_gpu |= gpu;
        p->all_gpu &= gpu;
        p->any_cpu_attention |= s->kind == SHARD_ATTN && !gpu;
        if (gpu) b->weights += s->weight_bytes, b->kv += kv_bytes(s, req);
        if (s->kind == SHARD_HEAD && gpu) b->activations += costs->logits;
        *(gpu ? &p->gpu_bytes_per_token : &p->host_bytes_per_token) += bytes_per_token(m, s);
    }
    if (p->any_gpu) b->activations += costs->activations, b->work = costs->work, b->blas = costs->blas;
    const uint64_t used = b->weights + b->kv + b->activations + b->work + b->blas;
    b->free = b->total > used ? b->total - used : 0;
}

static pshard_status build(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                           struct plan *p) {
    for (uint32_t i = 0; i < m->n_shards; i++) p->shard[i] = PLACE_CPU;
    if (req->family == PLAN_CPU || req->vram_budget == 0) {
        p->family = PLAN_CPU;
        p->budget.total = 0;
        account(m, req, costs, p);
        return PSHARD_OK;
    }
    /* Everything resident (embedding rows are fetched on the GPU too). */
    for (uint32_t i = 0; i < m->n_shards; i++) p->shard[i] = PLACE_RESIDENT;
    p->budget.total = 0;
    account(m, req, costs, p);
    const uint64_t all = p->budget.weights + p->budget.kv + p->budget.activations + p->budget.work + p->budget.blas;
    if (req->family == PLAN_GPU || (req->family == PLAN_AUTO && (req->vram_budget < 0 || (uint64_t)req->vram_budget >= all))) {
        if (req->vram_budget >= 0 && (uint64_t)req->vram_budget < all)
            return core_fail(PSHARD_ERR_RANGE, "the gpu plan needs %.2f GB of VRAM for this model and context; the budget "
                             "is %.2f GB (streaming the rest is not implemented yet: use --plan static)", all / 1e9,
                             req->vram_budget / 1e9);
        p->family = PLAN_GPU;
        p->budget.total = req->vram_budget < 0 ? all : (uint64_t)req->vram_budget;
        account(m, req, costs, p);
        return PSHARD_OK;
    }
    /* static: resident by priority while the budget lasts, the rest on the CPU. */
    p->family = PLAN_STATIC;
    const uint64_t budget = req->vram_budget < 0 ? all : (uint64_t)req->vram_budget;
    const uint64_t fixed = costs->activations + costs->work + costs->blas;
    uint64_t smallest = UINT64_MAX;
    for (uint32_t i = 0; i < m->n_shards; i++)
        if (m->shards[i].kind == SHARD_ATTN && m->shards[i].weight_bytes + kv_bytes(&m->shards[i], req) < smallest)
            smallest = m->shards[i].weight_bytes + kv_bytes(&m->shards[i], req);
    if (budget < fixed + smallest)
        return core_fail(PSHARD_ERR_RANGE, "a VRAM budget of %.0f MB cannot hold even one attention shard; the minimum "
                         "for this model and context is %.0f MB (or use 0 to run on the CPU)", budget / 1048576.0,
                         (fixed + smallest) / 1048576.0 + 1);
    for (uint32_t i = 0; i < m->n_shards; i++) p->shard[i] = PLACE_CPU;
    uint64_t left = budget - fixed;
    static const enum shard_kind priority[] = {SHARD_ATTN, SHARD_HEAD, SHARD_FFN, SHARD_MOE};
    for (size_t k = 0; k < sizeof priority / sizeof priority[0]; k++)
        for (uint32_t i = 0; i < m->n_shards; i++) {
            const struct shard *s = &m->shards[i];
            uint64_t cost = s->weight_bytes + kv_bytes(s, req) + (s->kind == SHARD_HEAD ? costs->logits : 0);
            if (s->kind != priority[k] || cost > left) continue;
            p->shard[i] = PLACE_RESIDENT;
            left -= cost;
        }
    p->budget.total = budget;
    account(m, req, costs, p);
    return PSHARD_OK;
}

pshard_status plan_build(const struct model *model, const struct plan_request *req, const struct plan_gpu_costs *costs,
                         struct plan *out) {
    memset(out, 0, sizeof *out);
    out->n_shards = model->n_shards;
    out->shard = calloc(model->n_shards ? model->n_shards : 1, sizeof *out->shard);
    if (!out->shard) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    pshard_status st = build(model, req, costs, out);
    if (st != PSHARD_OK) plan_free(out);
    return st;
}

void plan_free(struct plan *plan) {
    free(plan->shard);
    plan->shard = NULL;
}

static double mb(uint64_t bytes) { return bytes / 1048576.0; }

void plan_print(const struct plan *p, const struct model *m, FILE *out) {
    fprintf(out, "plan %s: VRAM budget %.0f MB\n", plan_family_name(p->family), mb(p->budget.total));
    fprintf(out, "  %-5s %-6s %5s %-9s %12s %12s\n", "#", "shard", "layer", "place", "weights MB", "KV MB");
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        char layer[16] = "-";
        if (s->layer >= 0) snprintf(layer, sizeof layer, "%d", s->layer);
        fprintf(out, "  %-5u %-6s %5s %-9s %12.1f", i, shard_kind_name(s->kind), layer, placement_name(p->shard[i]),
                mb(s->weight_bytes));
        if (s->kind == SHARD_ATTN) fprintf(out, " %12s", p->shard[i] == PLACE_CPU ? "host" : "VRAM");
        fputc('\n', out);
    }
    const struct plan_budget *b = &p->budget;
    fprintf(out, "VRAM: weights %.1f MB + KV %.1f MB + activations %.1f MB + work %.1f MB + cuBLAS %.1f MB; "
                 "%.1f MB of the budget unused\n", mb(b->weights), mb(b->kv), mb(b->activations), mb(b->work), mb(b->blas),
            mb(b->free));
    fprintf(out, "per decode token: %.1f MB of weights read by the CPU from host memory, %.1f MB by the GPU from VRAM\n",
            mb(p->host_bytes_per_token), mb(p->gpu_bytes_per_token));
}
