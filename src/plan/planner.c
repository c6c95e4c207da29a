/* The planner's search: places every token tier over a resident set by its family, and for auto
 * weighs the families (and dynamic shares) per tier, the resident sets and the decode phase's set
 * by the cost model's predictions. The resident sets and the budget's accounting are
 * planner_resident.c's. Reads the cost model; the cost model reads only the plan it builds (plan.h). */
#include "plan/planner.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/cost.h"
#include "plan/planner_internal.h"
#include "plan/profile.h"
#include "quant/types.h"

static uint32_t expert_type(const struct model *m) {
    for (uint32_t i = 0; i < m->n_shards; i++)
        if (shard_expert_type(&m->shards[i])) return shard_expert_type(&m->shards[i]);
    return 0;
}

/* The format of the dense FFNs' matrices (not of their norm vectors). */
static uint32_t ffn_type(const struct model *m) {
    for (uint32_t i = 0; i < m->n_shards; i++)
        for (uint32_t k = 0; m->shards[i].kind == SHARD_FFN && k < m->shards[i].n_tensors; k++)
            if (model_tensor_is_matrix(m->shards[i].tensors[k])) return m->shards[i].tensors[k]->type;
    return 0;
}

/* The stream share at which streaming and the CPU take equally long for steps of n tokens: the
 * share x of the bytes streamed at s seconds per byte against (1 - x) computed by the CPU at c
 * seconds per byte is balanced at x = c / (c + s). */
static float balanced_share(const struct model *m, const struct profile *prof, int32_t n) {
    double cpu, stream;
    if (m->hp.n_expert) {
        const double E = m->hp.n_expert, k = m->hp.n_expert_used;
        cpu = cost_expert_rate(prof->cpu_experts, expert_type(m), E, k, n);
        stream = cost_expert_rate_of(profile_in_place(prof, m->weights_skew, true), E, k, n);
    } else {
        cpu = cost_rate(prof->cpu_matmul, ffn_type(m), n);
        stream = profile_at_tokens(profile_in_place(prof, m->weights_skew, false), n);
    }
    return cpu + stream > 0 ? (float)(cpu / (cpu + stream)) : 0.5f;
}

/* The rows of a dense FFN split at stream share `share` that the GPU takes: whole multiples of
 * PLAN_SPLIT_ROWS on both sides; 0 (no split) where the FFN is too narrow or the share rounds to
 * all or nothing. */
static uint32_t split_rows(const struct model *m, float share) {
    const uint32_t ff = m->hp.n_ff, units = ff / PLAN_SPLIT_ROWS;
    if (ff % PLAN_SPLIT_ROWS || units < 2) return 0;
    const long gpu = lroundf(share * (float)units);
    return gpu >= 1 && gpu < (long)units ? (uint32_t)gpu * PLAN_SPLIT_ROWS : 0;
}

/* The layers whose KV cache is in host memory. */
static uint32_t host_kv_layers(const struct plan *p) {
    uint32_t n = 0;
    for (uint32_t l = 0; l < p->n_layers; l++) n += !p->kv_gpu[l];
    return n;
}

/* Every tier's places from the resident set and the tier's family. Dynamic streams a share of
 * what is not resident -- MoE experts by range, dense FFN shards by layer (the first ones) --
 * given, or else balanced so both sides finish together; ring tiers (staged copies) stream
 * everything. A ring tier runs the attention of kv_up of the layers whose KV is in host memory
 * on the GPU, their cells carried up (spread evenly among those layers), and the others' on the
 * CPU. */
static void place_tier(const struct model *m, const struct plan_request *req, const struct profile *prof, struct plan *p,
                       int ti, float share, bool staging, uint32_t kv_up) {
    struct plan_tier *t = &p->tier[ti];
    /* Ring tiers stream everything not resident, so they all stage the same units. */
    const bool dynamic_ring = req->family != PLAN_AUTO && !req->dynamic_in_place;
    const bool ring_ok = staging && ((t->family == PLAN_GPU && t->min_tokens >= PLAN_RING_MIN_TOKENS) ||
                                     (t->family == PLAN_DYNAMIC && dynamic_ring && t->min_tokens >= PLAN_RING_ALL_MIN_TOKENS) ||
                                     (t->family == PLAN_STATIC && req->stage_static));
    const bool stream_all = t->family == PLAN_GPU || (t->family == PLAN_DYNAMIC && ring_ok);
    const bool balanced = share <= 0 && req->stream_share <= 0;
    if (share <= 0) share = req->stream_share > 0 ? req->stream_share : balanced_share(m, prof, t->min_tokens);
    if (share > 1) share = 1;
    uint32_t n_ffn = 0, ffn_seen = 0, host_kv_seen = 0;
    const uint32_t n_host_kv = host_kv_layers(p);
    for (uint32_t i = 0; i < m->n_shards; i++)
        n_ffn += m->shards[i].kind == SHARD_FFN && t->shard[i] != PLACE_RESIDENT;
    t->ring = t->kv_stream = false;
    t->kv_cpu_share = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        enum placement *place = &t->shard[i];
        if (*place == PLACE_RESIDENT && s->kind != SHARD_MOE) continue;
        if (s->kind == SHARD_MOE) {
            /* On the GPU when its shared part is resident (marked by the caller). */
            if (*place == PLACE_CPU) continue;
            const uint32_t r = p->experts_resident[s->layer], E = s->n_expert;
            /* (a tier that cannot take the ring computes the experts lent it from their slots) */
            const uint32_t vram = r + (p->experts_lent && !ring_ok ? p->experts_lent[s->layer] : 0);
            uint32_t g = vram;
            if (stream_all) g = E;
            else if (t->family == PLAN_DYNAMIC) g = vram + (uint32_t)lroundf(share * (float)(E - vram));
            t->experts_gpu[s->layer] = g;
            *place = r == E ? PLACE_RESIDENT : PLACE_STREAMED;
            t->ring |= ring_ok && g > r;
        } else if (s->kind == SHARD_ATTN) {
            bool up = false;
            if (!p->kv_gpu[s->layer]) { /* the j-th such layer goes up where floor(j * kv_up / n) steps */
                const uint64_t j = host_kv_seen++;
                up = (j + 1) * kv_up / n_host_kv > j * kv_up / n_host_kv;
            }
            const bool streams_kv = up && ring_ok && p->kv_stream;
            *place = p->kv_gpu[s->layer] || streams_kv ? PLACE_STREAMED : PLACE_CPU;
            t->ring |= ring_ok && *place == PLACE_STREAMED;
            t->kv_stream |= streams_kv;
        } else {
            bool stream = stream_all;
            const bool dynamic_ffn = s->kind == SHARD_FFN && t->family == PLAN_DYNAMIC && !ring_ok;
            const uint32_t rows = dynamic_ffn && req->split_ffn ? split_rows(m, share) : 0;
            if (rows) {
                t->ffn_rows_gpu[s->layer] = rows;
                stream = true;
            } else if (dynamic_ffn) {
                stream = ffn_seen++ < lroundf(share * (float)n_ffn);
            }
            *place = stream ? PLACE_STREAMED : PLACE_CPU;
            t->ring |= ring_ok && *place == PLACE_STREAMED && s->kind == SHARD_FFN;
        }
    }
    t->routed = balanced && t->family == PLAN_DYNAMIC && !t->ring && t->min_tokens == 1 &&
                m->hp.n_expert && m->hp.n_expert_used <= PLAN_MAX_ROUTED;
    memset(t->routed_quota, 0, sizeof t->routed_quota);
    if (t->routed && req->routed_quota) {
        memcpy(t->routed_quota, req->routed_quota, (size_t)req->routed_quota_count + 1);
    } else if (t->routed) {
        cost_routed_quota(prof, m, p, t, t->routed_quota);
        bool reads = false; /* none read in place: the CPU takes them all, as a range split would */
        for (int n = 1; n <= PLAN_MAX_ROUTED; n++) reads |= t->routed_quota[n] > 0;
        t->routed = reads;
    }
    /* Without the ring, the units it leaves in the slots run on the GPU from there. */
    if (!t->ring)
        for (uint32_t i = 0; i < m->n_shards; i++)
            if (p->lent[i]) {
                t->shard[i] = PLACE_STREAMED;
                if (m->shards[i].kind == SHARD_FFN) t->ffn_rows_gpu[m->shards[i].layer] = 0;
            }
    for (uint32_t i = 0; !t->ring && p->experts_lent && i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        if (s->kind != SHARD_MOE || t->shard[i] == PLACE_CPU) continue;
        const uint32_t vram = plan_experts_vram(p, t, s->layer);
        if (t->experts_gpu[s->layer] < vram) t->experts_gpu[s->layer] = vram;
    }
}

/* The predicted seconds of a step of n tokens placed as `tier`, at the end of the context. */
static double tier_step_seconds(const struct profile *prof, const struct model *m, const struct plan_request *req,
                                const struct plan *p, const struct plan_tier *tier, int32_t n) {
    struct cost_step cs;
    cost_step(prof, m, p, tier, n, req->n_ctx > n ? req->n_ctx - n : 0, &cs);
    return cs.seconds;
}

/* The same for tier t of the plan. */
static double step_seconds(const struct profile *prof, const struct model *m, const struct plan_request *req,
                           const struct plan *p, int t, int32_t n) {
    return tier_step_seconds(prof, m, req, p, &p->tier[t], n);
}

/* Tier t's largest step (capped by the micro-batch). A prompt tier spans 4x in tokens, and a plan
 * that reads weights in place can win at the low end and lose by far at the high end. */
static int32_t tier_top_tokens(const struct plan_request *req, int t) {
    const int32_t top = t + 1 < PLAN_TIERS ? plan_tier_tokens[t + 1] - 1 : req->n_batch;
    return top < req->n_batch ? top : req->n_batch;
}

double plan_tier_per_token(const struct profile *prof, const struct model *m, const struct plan_request *req,
                           const struct plan *p, const struct plan_tier *tier, int t) {
    const int32_t lo = plan_tier_tokens[t], hi = tier_top_tokens(req, t);
    return tier_step_seconds(prof, m, req, p, tier, lo) / lo +
           (hi > lo ? tier_step_seconds(prof, m, req, p, tier, hi) / hi : 0);
}

static double tier_per_token(const struct profile *prof, const struct model *m, const struct plan_request *req,
                             const struct plan *p, int t) {
    return plan_tier_per_token(prof, m, req, p, &p->tier[t], t);
}

/* How finely a ring tier's count of layers carrying KV up is sought, and the share of their cells
 * the CPU attends (set_tier): a grid of KV_UP_GRID counts, then finer around the best; shares in
 * steps of 1 / KV_SHARE_GRID up to KV_SHARE_MAX, then halfway to the neighbours of the best. */
enum { KV_UP_GRID = 8, KV_SHARE_GRID = 16 };
static const float KV_SHARE_MAX = 0.75f;

/* A ring tier's placement of the attention of layers whose KV is in host memory: how many of
 * them carry their cells up (the rest attend on the CPU), the share of those cells the CPU
 * attends in one-token steps, and the seconds a token the tier takes so. */
struct kv_choice {
    uint32_t up;
    float cpu_share;
    double seconds;
};

static double place_kv(const struct model *m, const struct plan_request *req, const struct profile *prof, struct plan *p,
                       int t, float share, struct kv_choice c) {
    place_tier(m, req, prof, p, t, share, true, c.up);
    p->tier[t].kv_cpu_share = c.cpu_share;
    plan_tier_account(m, p, &p->tier[t]);
    return tier_per_token(prof, m, req, p, t);
}

/* Weighs `c` changed to up, cpu_share, keeping the faster in *best. */
static void weigh_kv(const struct model *m, const struct plan_request *req, const struct profile *prof, struct plan *p,
                     int t, float share, uint32_t up, float cpu_share, struct kv_choice *best) {
    const struct kv_choice c = {up, cpu_share, 0};
    const double sec = place_kv(m, req, prof, p, t, share, c);
    if (sec < best->seconds) *best = (struct kv_choice){up, cpu_share, sec};
}

static struct kv_choice best_kv_up(const struct model *m, const struct plan_request *req, const struct profile *prof,
                                   struct plan *p, int t, float share, struct kv_choice best) {
    const uint32_t n_host_kv = host_kv_layers(p), coarse = n_host_kv / KV_UP_GRID > 1 ? n_host_kv / KV_UP_GRID : 1;
    const float cpu_share = best.cpu_share;
    for (int pass = 0; pass < 2; pass++) {
        const uint32_t from = pass ? (best.up > coarse ? best.up - coarse : 0) : 0;
        const uint32_t to = pass ? (best.up + coarse < n_host_kv ? best.up + coarse : n_host_kv) : n_host_kv;
        const uint32_t step = pass ? (coarse / KV_UP_GRID > 1 ? coarse / KV_UP_GRID : 1) : coarse;
        for (uint32_t up = from; up <= to; up += step)
            if (up != best.up && !(pass && up % coarse == 0)) /* (weighed already) */
                weigh_kv(m, req, prof, p, t, share, up, cpu_share, &best);
    }
    return best;
}

static struct kv_choice best_kv_cpu_share(const struct model *m, const struct plan_request *req,
                                          const struct profile *prof, struct plan *p, int t, float share,
                                          struct kv_choice best) {
    if (!best.up) return best;
    for (int k = 1; k <= (int)(KV_SHARE_MAX * KV_SHARE_GRID); k++)
        weigh_kv(m, req, prof, p, t, share, best.up, (float)k / KV_SHARE_GRID, &best);
    const float at = best.cpu_share, half = 0.5f / KV_SHARE_GRID;
    if (at > 0) weigh_kv(m, req, prof, p, t, share, best.up, at - half, &best);
    if (at > 0 && at < KV_SHARE_MAX) weigh_kv(m, req, prof, p, t, share, best.up, at + half, &best);
    return best;
}

/* Set tier t to a family (and dynamic share) over the resident set, and account for it: the cost
 * model reads the tier's flags (any_gpu, shards_gpu), so each placement is accounted before it is
 * priced, here and by whoever prices the tier next (move_boundaries, the weighed sets). */
static void set_tier(const struct model *m, const struct plan_request *req, const struct profile *prof, struct plan *p,
                     int t, enum plan_family family, float share) {
    struct plan_tier *tier = &p->tier[t];
    tier->family = family;
    tier->min_tokens = plan_tier_tokens[t];
    for (uint32_t i = 0; i < p->n_shards; i++)
        if (tier->shard[i] != PLACE_RESIDENT && m->shards[i].kind != SHARD_MOE) tier->shard[i] = PLACE_CPU;
    for (uint32_t l = 0; l < p->n_layers; l++) tier->ffn_rows_gpu[l] = 0;
    if (family == PLAN_CPU) {
        for (uint32_t i = 0; i < p->n_shards; i++) tier->shard[i] = PLACE_CPU;
        for (uint32_t l = 0; l < p->n_layers; l++) tier->experts_gpu[l] = 0;
        tier->ring = tier->routed = false;
        plan_tier_account(m, p, tier);
        return;
    }
    const uint32_t n_host_kv = host_kv_layers(p);
    place_tier(m, req, prof, p, t, share, p->n_slots > 0, n_host_kv);
    plan_tier_account(m, p, tier);
    if (!tier->kv_stream) return;
    /* A ring tier runs the attention of layers whose KV is on the host on the GPU, its cells
     * copied up and down, or on the CPU, beside the copies of the others: as many of each as the
     * cost model finds fastest. A tier of one-token steps may also split each carried layer
     * with the CPU (kv_split): the share of its cells the CPU attends is sought at the best
     * count, and the count again at that share. */
    struct kv_choice best = {n_host_kv, 0, tier_per_token(prof, m, req, p, t)};
    best = best_kv_up(m, req, prof, p, t, share, best);
    if (req->kv_split && tier->min_tokens == 1) {
        const struct kv_choice counted = best;
        if (req->kv_cpu_share > 0) {
            best.cpu_share = req->kv_cpu_share;
            best.seconds = place_kv(m, req, prof, p, t, share, best);
        } else {
            best = best_kv_cpu_share(m, req, prof, p, t, share, best);
        }
        if (best.cpu_share != counted.cpu_share) best = best_kv_up(m, req, prof, p, t, share, best);
    }
    place_kv(m, req, prof, p, t, share, best);
}

/* A step runs its tier's plan up to the next tier's fewest tokens. Where the next tier's plan is
 * predicted faster before that, the next tier starts there: a tier's plan is chosen at the tier's
 * fewest tokens (record_candidate), and a plan that splits with the CPU or reads weights in
 * place grows with the tokens where the ring's copies do not. Prompt tiers only: decode tiers
 * (and phases) keep theirs. The boundary is sought on a grid of BOUNDARY_STEPS points per tier,
 * evenly spaced in log n. */
enum { BOUNDARY_STEPS = 8 };

static void move_boundaries(const struct model *m, const struct plan_request *req, const struct profile *prof,
                            struct plan *p) {
    for (int t = 1; t < PLAN_TIERS; t++) {
        const int32_t prev = plan_tier_tokens[t - 1], lo = plan_tier_tokens[t];
        p->tier[t].min_tokens = lo;
        if (prev < PLAN_RING_MIN_TOKENS || lo > req->n_batch || plan_tier_key(p, t) == plan_tier_key(p, t - 1)) continue;
        for (int k = BOUNDARY_STEPS - 1; k >= 1; k--) {
            const int32_t n = (int32_t)lround(prev * pow((double)lo / prev, (double)k / BOUNDARY_STEPS));
            if (n <= prev || n >= p->tier[t].min_tokens) continue;
            if (step_seconds(prof, m, req, p, t, n) >= step_seconds(prof, m, req, p, t - 1, n)) break;
            p->tier[t].min_tokens = n;
        }
    }
}

/* The plan as it stands, as a candidate: its VRAM, the bytes a decode token moves, and every
 * tier's predicted step and placement. */
static void record_candidate(const struct profile *prof, const struct model *m, const struct plan_request *req,
                             const struct plan *p, struct plan_candidate *cand) {
    cand->vram_weights = p->budget.weights, cand->vram_kv = p->budget.kv, cand->vram_staging = p->budget.staging;
    cand->host_bytes_per_token = p->tier[0].host_bytes_per_token;
    cand->pcie_bytes_per_token = p->tier[0].pcie_bytes_per_token;
    for (int t = 0; t < PLAN_TIERS; t++) {
        const int32_t lo = plan_tier_step_tokens(p, t), hi = tier_top_tokens(req, t);
        cand->seconds[t] = step_seconds(prof, m, req, p, t, lo);
        /* A tier is judged at its fewest tokens, where its steps start; move_boundaries then
         * starts the next tier's plan wherever that is the faster. The last tier of prompt
         * chunks (where the ring may run) has none after it and weighs both its ends per token:
         * reading weights in place costs more per token as steps grow, copying them less. A
         * middle tier judged at both ends would lose its low end to a plan that only wins near
         * its top, where the next tier's plan takes over anyway (bench/RESULTS.md). */
        const bool last = t + 1 >= PLAN_TIERS || plan_tier_tokens[t + 1] > req->n_batch;
        cand->score[t] = cand->seconds[t] / lo;
        cand->score[t] += lo < PLAN_RING_MIN_TOKENS || hi <= lo || !last ? cand->score[t] : step_seconds(prof, m, req, p, t, hi) / hi;
        cand->key[t] = plan_tier_key(p, t);
    }
}

static bool family_applies(const struct model *m, const struct plan *p, enum plan_family f) {
    if (f != PLAN_DYNAMIC) return true;
    if (m->hp.n_expert) return true;
    for (uint32_t i = 0; i < m->n_shards; i++)
        if (m->shards[i].kind == SHARD_FFN && p->tier[0].shard[i] != PLACE_RESIDENT) return true;
    return false;
}

/* The tokens the typical request generates after its prompt (plan_typical_prompt): as asked, or
 * PLAN_TYPICAL_DECODE, within what the context holds. */
static int32_t typical_generated(const struct plan_request *req) {
    const int32_t want = req->n_decode > 0 ? req->n_decode : PLAN_TYPICAL_DECODE;
    const int32_t room = req->n_ctx - plan_typical_prompt(req->n_ctx);
    return want < room ? want : room > 1 ? room : 1;
}

/* The cache lengths a band is sought on (PLAN_BAND_STEPS of them, evenly spaced in log cells from
 * the typical request's end to the context's); 0 where the context ends no later than that. */
static int band_cells(const struct plan_request *req, int32_t n_prompt, int32_t n_out, int32_t cells[PLAN_BAND_STEPS]) {
    const double lo = n_prompt + n_out, hi = req->n_ctx;
    if (hi <= lo) return 0;
    for (int g = 0; g < PLAN_BAND_STEPS; g++)
        cells[g] = (int32_t)lround(lo * pow(hi / lo, (double)g / (PLAN_BAND_STEPS - 1)));
    return PLAN_BAND_STEPS;
}

/* Decode steps over long caches (plan.weighed_band): for each set weighed besides `below` (the one
 * decode steps run over at the typical request's length; where that is not the prompt's set,
 * only the prompt's), the least length from which on it decodes faster than `below` by more than
 * PLAN_SET_MARGIN at every longer length on the grid, and where the typical request's tokens,
 * decoded that much faster, pay for its changes of set there. The set whose band starts soonest
 * wins. */
static void weigh_band(const struct profile *prof, const struct model *m, struct plan *p, int prompt, int below, int32_t n_out,
                       int n_cells, const int32_t *cells, double decode_at[][PLAN_BAND_STEPS], const double *weights,
                       const double *kv_position) {
    struct plan_band *band = &p->weighed_band;
    memset(band, 0, sizeof *band);
    for (int set = 0; set < PLAN_SETS; set++) {
        if (set == below || !(p->weighed_set[set].ttft > 0) || (below != prompt && set != prompt)) continue;
        int g = n_cells;
        while (g > 0 && decode_at[set][g - 1] < decode_at[below][g - 1] * (1 - PLAN_SET_MARGIN)) g--;
        for (; g < n_cells; g++) {
            const double c = cells[g];
            const double to_long = cost_switch(prof, m, weights[set] + c * kv_position[set], c * kv_position[below]);
            const double back = set == prompt ? 0
                                              : cost_switch(prof, m, weights[prompt] + c * kv_position[prompt], c * kv_position[set]);
            if (n_out * (decode_at[below][g] - decode_at[set][g]) <= to_long + back) continue;
            if (!band->weighed || cells[g] < band->from)
                *band = (struct plan_band){true, (enum plan_set)below, (enum plan_set)set, cells[g], decode_at[below][g],
                                           decode_at[set][g], to_long, back};
            break;
        }
    }
}

/* A zeroed plan of the model's shape with its arrays, as the request asks for them (lending);
 * false where memory ran out (plan_free frees what was allocated). */
static bool alloc_plan(const struct model *model, const struct plan_request *req, struct plan *out) {
    memset(out, 0, sizeof *out);
    out->n_shards = model->n_shards;
    out->n_layers = model->hp.n_layers;
    out->n_expert = model->hp.n_expert;
    const size_t nl = out->n_layers ? out->n_layers : 1, ns = model->n_shards ? model->n_shards : 1;
    out->kv_gpu = calloc(nl, sizeof *out->kv_gpu);
    out->experts_resident = calloc(nl, sizeof *out->experts_resident);
    out->lent = calloc(ns, sizeof *out->lent);
    out->experts_lent = model->hp.n_expert ? calloc(nl, sizeof *out->experts_lent) : NULL;
    bool ok = out->kv_gpu && out->experts_resident && out->lent && (out->experts_lent || !model->hp.n_expert);
    for (int t = 0; t < PLAN_TIERS; t++) {
        out->tier[t].shard = calloc(ns, sizeof *out->tier[t].shard);
        out->tier[t].experts_gpu = calloc(nl, sizeof *out->tier[t].experts_gpu);
        out->tier[t].ffn_rows_gpu = calloc(nl, sizeof *out->tier[t].ffn_rows_gpu);
        ok = ok && out->tier[t].shard && out->tier[t].experts_gpu && out->tier[t].ffn_rows_gpu;
    }
    return ok;
}

/* Copy plan src into dst, a plan of the same shape (alloc_plan): every field, its arrays' contents
 * into dst's own (dst keeps its decode phase's plan). */
static void copy_plan(struct plan *dst, const struct plan *src) {
    const struct plan own = *dst;
    const size_t ns = src->n_shards, nl = src->n_layers;
    *dst = *src;
    dst->decode = own.decode;
    for (int t = 0; t < PLAN_TIERS; t++) {
        dst->tier[t].shard = memcpy(own.tier[t].shard, src->tier[t].shard, ns * sizeof *src->tier[t].shard);
        dst->tier[t].experts_gpu = memcpy(own.tier[t].experts_gpu, src->tier[t].experts_gpu, nl * sizeof *src->tier[t].experts_gpu);
        dst->tier[t].ffn_rows_gpu = memcpy(own.tier[t].ffn_rows_gpu, src->tier[t].ffn_rows_gpu, nl * sizeof *src->tier[t].ffn_rows_gpu);
    }
    dst->kv_gpu = memcpy(own.kv_gpu, src->kv_gpu, nl * sizeof *src->kv_gpu);
    dst->experts_resident = memcpy(own.experts_resident, src->experts_resident, nl * sizeof *src->experts_resident);
    dst->lent = memcpy(own.lent, src->lent, ns * sizeof *src->lent);
    dst->experts_lent = src->experts_lent ? memcpy(own.experts_lent, src->experts_lent, nl * sizeof *src->experts_lent) : NULL;
}

/* Whether some resident set the request allows fits `budget` (the set left in p). */
static bool some_set_fits(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                          const struct profile *prof, uint64_t budget, const enum plan_set *sets, int n_sets, struct plan *p) {
    for (int si = 0; si < n_sets; si++)
        if ((req->staging < 0 || sets[si] == (enum plan_set)req->staging) &&
            plan_resident_set(m, req, costs, prof, budget, sets[si] != PLAN_SET_NO_RING, sets[si] == PLAN_SET_ALL_KV, p) ==
                PSHARD_OK)
            return true;
    return false;
}

/* Where no resident set fits the budget: the error naming the least budget, in whole MB, at which
 * one does (each set's check names its own least, and one set can fit below another's), found by
 * halving between the budget and everything resident; the sets' own message where not even that
 * fits. */
static pshard_status least_budget_error(const struct model *m, const struct plan_request *req,
                                        const struct plan_gpu_costs *costs, const struct profile *prof, uint64_t budget,
                                        const enum plan_set *sets, int n_sets, struct plan *p) {
    char message[512];
    snprintf(message, sizeof message, "%s", pshard_last_error());
    const uint64_t mb = 1 << 20;
    uint64_t lo = budget / mb, hi = (plan_all_resident_bytes(m, req, costs) + costs->host_mapping) / mb + 1;
    if (hi <= lo || !some_set_fits(m, req, costs, prof, hi * mb, sets, n_sets, p))
        return core_fail(PSHARD_ERR_RANGE, "%s", message);
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (some_set_fits(m, req, costs, prof, mid * mb, sets, n_sets, p)) hi = mid;
        else lo = mid;
    }
    return core_fail(PSHARD_ERR_RANGE, "a VRAM budget of %.0f MB cannot hold even one layer's KV cache besides the GPU's "
                     "buffers; the minimum for this model and context is %llu MB (or use 0 to run on the CPU)",
                     budget / 1048576.0, (unsigned long long)hi);
}

/* auto: for each resident set (with and without room for the staging ring), every tier weighs
 * static, gpu and dynamic at several shares by the cost model and keeps the fastest; the
 * resident set whose tiers serve a typical request (a prompt of up to 1K tokens, then the tokens
 * it generates: typical_generated) soonest wins. A plan with everything on the CPU is weighed too. */
static pshard_status search(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                            const struct profile *prof, uint64_t budget, struct plan *p, struct plan *trial) {
    /* Dynamic at share 0: balanced, so streaming and the CPU finish together. */
    static const struct { enum plan_family family; float share; } menu[] = {
        {PLAN_STATIC, 0}, {PLAN_GPU, 0}, {PLAN_DYNAMIC, 0}, {PLAN_DYNAMIC, 0.25f}, {PLAN_DYNAMIC, 0.5f}, {PLAN_DYNAMIC, 0.75f}};
    const int32_t n_prompt = plan_typical_prompt(req->n_ctx), n_out = typical_generated(req);
    struct plan_candidate cands[PLAN_MAX_CANDIDATES];
    uint32_t n_cands = 0;
    int8_t chosen[PLAN_SETS][PLAN_TIERS];
    struct { enum plan_family family; float share; } pick[PLAN_SETS][PLAN_TIERS];
    static const enum plan_set sets[] = {PLAN_SET_RING, PLAN_SET_NO_RING, PLAN_SET_ALL_KV};
    pshard_status fits = PSHARD_OK;
    bool any_fits = false, ring_has_all_kv = false;
    double weights[PLAN_SETS] = {0}, kv_position[PLAN_SETS] = {0};
    int32_t cells[PLAN_BAND_STEPS];
    const int n_cells = req->phases && req->long_decode && req->n_seq == 1 && req->decode_set < 0
                            ? band_cells(req, n_prompt, n_out, cells)
                            : 0;
    double decode_at[PLAN_SETS][PLAN_BAND_STEPS]; /* seconds per decode token over each set at cells[g] */
    memset(p->weighed_set, 0, sizeof p->weighed_set);
    memset(&p->weighed_phases, 0, sizeof p->weighed_phases);
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        const enum plan_set set = sets[si];
        if (req->staging >= 0 && set != (enum plan_set)req->staging) continue; /* one set asked for */
        fits = plan_resident_set(m, req, costs, prof, budget, set != PLAN_SET_NO_RING, set == PLAN_SET_ALL_KV, p);
        if (fits != PSHARD_OK) continue;
        any_fits = true;
        for (int t = 0; t < PLAN_TIERS; t++) chosen[set][t] = -1;
        bool all_kv = true;
        for (uint32_t l = 0; l < p->n_layers; l++) all_kv &= p->kv_gpu[l];
        if (set == PLAN_SET_RING) ring_has_all_kv = all_kv;
        /* The all-KV set is weighed when it differs from the ring's: every layer's KV fits only
         * when it comes first. */
        if (set == PLAN_SET_ALL_KV && (!all_kv || ring_has_all_kv)) continue;
        plan_account(m, req, costs, p);
        for (size_t c = 0; c < sizeof menu / sizeof menu[0] && n_cands < PLAN_MAX_CANDIDATES; c++) {
            if (!family_applies(m, p, menu[c].family)) continue;
            struct plan_candidate *cand = &cands[n_cands];
            memset(cand, 0, sizeof *cand);
            cand->family = menu[c].family, cand->share = menu[c].share, cand->set = set;
            copy_plan(trial, p); /* the candidate's tiers over the set, in a plan of its own */
            for (int t = 0; t < PLAN_TIERS; t++) set_tier(m, req, prof, trial, t, menu[c].family, menu[c].share);
            plan_account(m, req, costs, trial);
            record_candidate(prof, m, req, trial, cand);
            for (int t = 0; t < PLAN_TIERS; t++) {
                if (chosen[set][t] < 0 || cand->score[t] < cands[chosen[set][t]].score[t]) {
                    chosen[set][t] = (int8_t)n_cands;
                    pick[set][t].family = menu[c].family, pick[set][t].share = menu[c].share;
                }
            }
            n_cands++;
        }
        if (chosen[set][0] < 0) continue;
        for (int t = 0; t < PLAN_TIERS; t++) set_tier(m, req, prof, p, t, pick[set][t].family, pick[set][t].share);
        double ttft, decode;
        cost_request(prof, m, p, n_prompt, req->n_batch, n_out, req->n_seq, &ttft, &decode);
        p->weighed_set[set].ttft = ttft, p->weighed_set[set].decode = decode;
        for (int g = 0; g < n_cells; g++) {
            struct cost_step cs;
            cost_step(prof, m, p, &p->tier[PLAN_TIER_DECODE], 1, cells[g] - 1, &cs);
            decode_at[set][g] = cs.seconds;
        }
        plan_account(m, req, costs, p);
        weights[set] = (double)p->budget.weights, kv_position[set] = cost_kv_position_bytes(m, p);
    }
    if (!any_fits) /* not even without the ring: the message names the least budget where a set fits */
        return fits == PSHARD_ERR_RANGE ? least_budget_error(m, req, costs, prof, budget, sets, PLAN_SETS, p) : fits;
    double best_total;
    const int best_set = plan_soonest_set(p, n_out, &best_total);
    /* Phases: decode steps over another set than the prompt's, paying a request's two switches,
     * when that beats the one set by more than PLAN_SET_MARGIN (the margin the cost model's
     * decode error between sets asks for). */
    int decode_set = best_set;
    double beyond_prompt = INFINITY;
    const bool forced = req->decode_set >= 0;
    for (int set = 0; best_set >= 0 && req->phases && req->n_seq == 1 && set < PLAN_SETS; set++) {
        if (set == best_set || !(p->weighed_set[set].ttft > 0) || (forced && set != req->decode_set)) continue;
        const double to_decode = cost_switch(prof, m, weights[set] + n_prompt * kv_position[set], n_prompt * kv_position[best_set]);
        const double to_prompt = cost_switch(prof, m, weights[best_set] + (n_prompt + n_out) * kv_position[best_set],
                                             (n_prompt + n_out) * kv_position[set]);
        const double beyond = to_decode + n_out * p->weighed_set[set].decode + to_prompt;
        if (beyond >= beyond_prompt) continue;
        beyond_prompt = beyond;
        p->weighed_phases = (struct plan_phases){true, (enum plan_set)best_set, (enum plan_set)set, to_decode, to_prompt};
    }
    const double one_set = best_set >= 0 ? p->weighed_set[best_set].ttft + n_out * p->weighed_set[best_set].decode : INFINITY;
    if (p->weighed_phases.weighed && (forced || p->weighed_set[best_set].ttft + beyond_prompt < one_set * (1 - PLAN_SET_MARGIN)))
        decode_set = (int)p->weighed_phases.decode;
    memset(&p->weighed_band, 0, sizeof p->weighed_band);
    if (best_set >= 0 && n_cells)
        weigh_band(prof, m, p, best_set, decode_set, n_out, n_cells, cells, decode_at, weights, kv_position);
    /* Everything on the CPU. */
    plan_reset_places(p);
    plan_account(m, req, costs, p);
    double cpu_ttft, cpu_decode;
    cost_request(prof, m, p, n_prompt, req->n_batch, n_out, req->n_seq, &cpu_ttft, &cpu_decode);
    if (n_cands < PLAN_MAX_CANDIDATES) {
        struct plan_candidate *cand = &cands[n_cands];
        memset(cand, 0, sizeof *cand);
        cand->family = PLAN_CPU;
        record_candidate(prof, m, req, p, cand);
        n_cands++;
    }
    memcpy(p->candidates, cands, sizeof cands[0] * n_cands);
    p->n_candidates = n_cands;
    if (best_set < 0 || (req->staging < 0 && cpu_ttft + n_out * cpu_decode < best_total)) {
        for (int t = 0; t < PLAN_TIERS; t++) p->chosen[t] = (int8_t)(n_cands - 1);
        memset(&p->weighed_band, 0, sizeof p->weighed_band); /* (no set decodes: nothing changes) */
        p->family = PLAN_CPU;
        p->budget.total = budget;
    } else {
        CORE_TRY(plan_resident_set(m, req, costs, prof, budget, best_set != PLAN_SET_NO_RING, best_set == PLAN_SET_ALL_KV, p));
        for (int t = 0; t < PLAN_TIERS; t++) {
            set_tier(m, req, prof, p, t, pick[best_set][t].family, pick[best_set][t].share);
            p->chosen[t] = chosen[best_set][t];
        }
        p->family = p->tier[0].family;
        move_boundaries(m, req, prof, p);
        /* The decode phase: over decode_set for every cache, or where a band applies, over the
         * band's set from its length on (decode_set is the prompt's) or over decode_set below it
         * (the band's set is the prompt's). */
        const struct plan_band *band = &p->weighed_band;
        const int other = decode_set != best_set ? decode_set : band->weighed ? (int)band->set : best_set;
        if (other != best_set) {
            /* The decode phase's plan: the same search over its set alone. */
            struct plan_request one = *req;
            one.staging = other, one.phases = false;
            p->decode = calloc(1, sizeof *p->decode);
            if (!p->decode) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
            CORE_TRY(plan_build(m, &one, costs, p->decode));
            p->decode_from = band->weighed && decode_set == best_set ? band->from : forced ? req->decode_from : 0;
            p->decode_until = band->weighed && decode_set != best_set ? band->from : INT32_MAX;
            for (int t = 0; t < PLAN_TIERS; t++) /* the choice at the end of the context */
                if (plan_tier_tokens[t] < PLAN_PHASE_TOKENS && p->decode_until == INT32_MAX) p->chosen[t] = chosen[other][t];
        }
    }
    plan_account(m, req, costs, p);
    p->weighed_cpu.ttft = cpu_ttft, p->weighed_cpu.decode = cpu_decode;
    return PSHARD_OK;
}

/* auto's search, with the plan each candidate is built in. */
static pshard_status search_auto(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                                 const struct profile *prof, uint64_t budget, struct plan *p) {
    struct plan trial;
    const pshard_status st = alloc_plan(m, req, &trial) ? search(m, req, costs, prof, budget, p, &trial)
                                                        : core_fail(PSHARD_ERR_NOMEM, "out of memory");
    plan_free(&trial);
    return st;
}

static pshard_status build(const struct model *m, const struct plan_request *req, const struct plan_gpu_costs *costs,
                           const struct profile *prof, struct plan *p) {
    const uint32_t n = m->n_shards;
    for (int t = 0; t < PLAN_TIERS; t++) p->chosen[t] = -1;
    plan_reset_places(p);
    if (req->family == PLAN_CPU || req->vram_budget == 0) {
        p->family = PLAN_CPU;
        plan_account(m, req, costs, p);
        return PSHARD_OK;
    }
    uint64_t fixed = costs->activations + costs->logits + costs->work + costs->blas;
    const uint64_t all = plan_all_resident_bytes(m, req, costs);
    const uint64_t budget = req->vram_budget < 0 ? all : (uint64_t)req->vram_budget;
    p->budget.total = budget;
    p->family = req->family;

    /* Everything fits: all resident, one plan for every tier. */
    if (budget >= all) {
        for (int t = 0; t < PLAN_TIERS; t++) {
            p->tier[t].family = req->family == PLAN_AUTO ? PLAN_GPU : req->family;
            for (uint32_t i = 0; i < n; i++) p->tier[t].shard[i] = PLACE_RESIDENT;
        }
        for (uint32_t l = 0; l < p->n_layers; l++) {
            p->kv_gpu[l] = true;
            p->experts_resident[l] = p->n_expert;
            for (int t = 0; t < PLAN_TIERS; t++) p->tier[t].experts_gpu[l] = p->n_expert;
        }
        if (p->family == PLAN_AUTO) p->family = PLAN_GPU;
        plan_account(m, req, costs, p);
        return PSHARD_OK;
    }
    if (req->family == PLAN_AUTO) return search_auto(m, req, costs, prof, budget, p);

    /* One family in every tier. gpu streams its largest steps through the ring, and dynamic too
     * unless in place (plan_request.dynamic_in_place, as auto's candidates). */
    const enum plan_family family = req->family;
    /* With the ring asked for or refused, this is a candidate as the planner weighs it: its
     * resident set by benefit alone. Otherwise gpu keeps every layer's KV in VRAM first, so
     * every attention runs on the GPU. */
    const bool candidate = req->staging >= 0;
    const bool all_attention = candidate ? req->staging == PLAN_SET_ALL_KV : family == PLAN_GPU;
    bool staging = candidate ? req->staging != PLAN_SET_NO_RING : family == PLAN_GPU || family == PLAN_DYNAMIC;
    if (all_attention) {
        /* Every attention on the GPU: its KV, every shard's vectors and every MoE router resident. */
        const uint64_t slot = plan_slot_size(m, NULL, p);
        uint64_t need = fixed + costs->host_mapping; /* besides the slots */
        for (uint32_t j = 0; j < n; j++) {
            const struct shard *q = &m->shards[j];
            need += plan_kv_bytes(q, req) + (q->kind == SHARD_MOE ? plan_shared_bytes(q) : 0) +
                    (q->kind != SHARD_MOE && q->kind != SHARD_EMBED ? q->weight_bytes - plan_matrix_bytes(q) : 0);
        }
        if (budget < need + plan_slots_for(budget, slot) * slot)
            return core_fail(PSHARD_ERR_RANGE, "the %s plan needs at least %.0f MB of VRAM for this model and context "
                             "(every layer's attention on the GPU: buffers, the staging slots of %.1f MB, the KV cache); "
                             "the budget is %.0f MB",
                             plan_family_name(family), plan_minimum_mb(m, req, costs, need, slot, true), slot / 1048576.0,
                             budget / 1048576.0);
    }
    pshard_status st = plan_resident_set(m, req, costs, prof, budget, staging, all_attention, p);
    if (st != PSHARD_OK && staging && family != PLAN_GPU && !candidate) {
        staging = false; /* no room for the ring: large steps run like small ones */
        st = plan_resident_set(m, req, costs, prof, budget, false, false, p);
    }
    CORE_TRY(st);
    for (int t = 0; t < PLAN_TIERS; t++) set_tier(m, req, prof, p, t, family, 0);
    plan_account(m, req, costs, p);
    return PSHARD_OK;
}

pshard_status plan_build(const struct model *model, const struct plan_request *req, const struct plan_gpu_costs *costs,
                         struct plan *out) {
    memset(out, 0, sizeof *out);
    if (req->routed_quota && model->hp.n_expert) { /* (a dense model has nothing to split by routing) */
        const int k = (int)model->hp.n_expert_used;
        if (req->routed_quota_count != k)
            return core_fail(PSHARD_ERR_INVALID_ARG, "the routed quota gives %d counts; this model routes a token to %d experts",
                             req->routed_quota_count, k);
        for (int n = 1; n <= k; n++)
            if (req->routed_quota[n] > n)
                return core_fail(PSHARD_ERR_INVALID_ARG, "the routed quota gives %d of %d experts not resident to the GPU",
                                 req->routed_quota[n], n);
    }
    const bool ok = alloc_plan(model, req, out);
    out->n_batch = req->n_batch;
    out->n_ctx = req->n_ctx;
    out->n_decode = typical_generated(req);
    out->kernels = costs->kernels;
    struct profile defaults;
    const struct profile *prof = plan_profile(req->profile, &defaults);
    pshard_status st = ok ? build(model, req, costs, prof, out) : core_fail(PSHARD_ERR_NOMEM, "out of memory");
    if (st != PSHARD_OK) {
        plan_free(out);
        return st;
    }
    /* What the cost model predicts for the plan as built, at the end of the context (the decode
     * phase's steps by the plan that runs there). */
    for (int t = 0; t < PLAN_TIERS; t++) {
        const int32_t n = plan_tier_step_tokens(out, t);
        out->predicted[t] = step_seconds(prof, model, req, plan_for_step(out, n, req->n_ctx), t, n);
    }
    out->n_seq = req->n_seq;
    cost_request(prof, model, out, plan_typical_prompt(req->n_ctx), req->n_batch, out->n_decode, req->n_seq,
                 &out->predicted_ttft, &out->predicted_decode);
    return PSHARD_OK;
}
