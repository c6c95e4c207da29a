/* Plans: where every shard, every MoE expert and every layer's KV cache lives, under a VRAM
 * budget, for each token tier (decode steps and prompt steps may run differently).
 *
 * A shard is RESIDENT (its weights live in VRAM for the plan's life), STREAMED (the GPU
 * computes it from host memory: small steps read the weights in place over PCIe, large steps
 * copy them through a ring of staging slots ahead of the compute) or CPU (the thread pool
 * computes it from host memory). An MoE shard on the GPU keeps its router and shared parts
 * resident and places its experts by range: [0, experts_resident) in VRAM, [experts_resident,
 * experts_gpu) streamed, [experts_gpu, n_expert) on the CPU, which computes them while the GPU
 * computes its own. A dense FFN shard of a dynamic tier may be split the same way by rows (see
 * ffn_rows_gpu). A layer's KV cache lives in VRAM when its attention runs on the GPU, which
 * every tier agrees on. The planner builds a plan (plan/planner.h); the executor follows one;
 * `pshard plan` prints one. This header is the plan as data and the queries of a built plan. */
#ifndef PLAN_PLAN_H
#define PLAN_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

struct profile;

enum placement { PLACE_CPU, PLACE_RESIDENT, PLACE_STREAMED };

enum plan_family {
    PLAN_AUTO,    /* per tier, the candidate the cost model predicts fastest (see plan_build) */
    PLAN_CPU,     /* every shard on the CPU */
    PLAN_GPU,     /* every shard on the GPU: resident by priority, the rest streamed */
    PLAN_STATIC,  /* resident by priority, the rest on the CPU (attention follows its KV) */
    PLAN_DYNAMIC, /* resident by priority; of the rest, a share (MoE experts, or dense FFN shards)
                     streamed and the rest on the CPU, both working at once; ring tiers stream
                     everything */
};
enum { PLAN_FAMILY_COUNT = PLAN_DYNAMIC + 1 };

/* Token tiers: a step of n new tokens runs the last tier whose min_tokens <= n (tiers past the
 * micro-batch size never run). Each tier has its own plan over one shared resident set, so
 * switching between tiers copies nothing (but for decode steps over a set of their own:
 * plan.decode). */
enum { PLAN_TIERS = 6, PLAN_TIER_DECODE = 0 };
extern const int32_t plan_tier_tokens[PLAN_TIERS]; /* 1, 4, 16, 64, 256, 1024 */
/* The staging ring: gpu tiers of at least PLAN_RING_MIN_TOKENS tokens, and dynamic ones of at
 * least PLAN_RING_ALL_MIN_TOKENS asked for alone (not plan_request.dynamic_in_place), copy the
 * weights they stream through it (smaller steps, and dynamic tiers between the two, read them in
 * place: reading in place costs more per token as steps grow, but a dynamic step of 16-63 tokens
 * may still gain from splitting with the CPU). auto's dynamic candidates split in place at every
 * size: a dynamic tier through the ring streams everything, as gpu's does. PLAN_STAGING_SLOTS
 * slots where the budget is at least 32 slots' worth (a deeper ring absorbs uneven compute), else
 * PLAN_MIN_SLOTS; an MoE shard is staged in pieces of at most PLAN_PIECE_MAX_BYTES of experts
 * (each piece is one grouped-expert launch, so fewer, larger pieces waste less;
 * bench/RESULTS.md). */
/* A split FFN's rows on each side are a multiple of PLAN_SPLIT_ROWS (whole blocks of every
 * format, so down's columns split on a block boundary). */
enum { PLAN_SPLIT_ROWS = 256 };
enum { PLAN_RING_MIN_TOKENS = 16, PLAN_RING_ALL_MIN_TOKENS = 64, PLAN_STAGING_SLOTS = 4, PLAN_MIN_SLOTS = 2, PLAN_PIECE_MAX_BYTES = 128 << 20 };
/* auto: a resident set whose typical request is predicted within this fraction of the soonest
 * wins when its first token comes sooner by more than this fraction too (plan_soonest_set). */
#define PLAN_SET_MARGIN 0.05
/* Phases (auto, one sequence): steps of fewer than PLAN_PHASE_TOKENS tokens (decoding) may run a
 * plan of their own over another resident set than prompt steps (plan.decode), over caches of some
 * lengths only (plan.decode_from, decode_until); VRAM is carved anew when the phase changes. The
 * lengths where another set decodes faster are sought on PLAN_BAND_STEPS cache lengths, evenly
 * spaced in log cells from the typical request's end to the context's. */
enum { PLAN_PHASE_TOKENS = PLAN_RING_MIN_TOKENS, PLAN_BAND_STEPS = 12 };
/* Candidates the planner weighs for a tier (auto): families, with dynamic at several shares. */
enum { PLAN_MAX_CANDIDATES = 24 };
/* What the budget holds, in bytes: total is the budget; the device arena is all of it but
 * `mapping`, the device memory the driver takes to map the model file for the GPU's reads of
 * host memory (its page tables), reserved only when the plan streams. */
struct plan_budget {
    uint64_t total, weights, kv, activations, work, blas, staging, mapping, free;
    /* Of activations: the step's buffers (the logits' included) and the margin no carving takes
     * (plan_gpu_costs), for what the executor will lend between steps. */
    uint64_t buffers, margin;
};

/* auto: the typical request's prompt, 1K tokens or half the context. */
static inline int32_t plan_typical_prompt(int32_t n_ctx) { return n_ctx / 2 < 1024 ? n_ctx / 2 : 1024; }

/* The most experts a token routes to for which a tier can split them by routing. */
enum { PLAN_MAX_ROUTED = 16 };

/* Switches that turn one of the planner's or the executor's ideas off, or fix what it would
 * choose, to measure what the idea buys (bench/RESULTS.md) and to test each path on its own.
 * Zeroed, every idea is on: what the library always runs (pshard_open). Only the tools that compare
 * placements fill it, from the environment (tools/pshard/plan_options.c; docs/cli.md); the
 * planner reads the first part through plan_request (exec's request_for), the executor the last. */
struct plan_options {
    bool no_split_ffn;       /* dynamic tiers stream dense FFNs whole: split_ffn off */
    bool no_stage_static;    /* static tiers read streamed attention in place: stage_static off */
    bool no_kv_stream;       /* no KV up through the ring: kv_stream off */
    bool no_kv_split;        /* carried layers' attention not split with the CPU: kv_split off */
    float kv_cpu_share;      /* > 0: one-token ring tiers that carry KV split each carried layer so
                                (plan_request.kv_cpu_share); 0: the cost model's share */
    bool no_long_decode;     /* decode over long caches keeps the short ones' set: long_decode off */
    int32_t decode_from;     /* with a decode set asked for, decode over it from this many cells on
                                (plan_request.decode_from); 0: every cache */
    /* The routed tiers' GPU counts for 1..routed_quota_count experts not resident (entry n for n;
     * [0] unused), in place of the cost model's (plan_request.routed_quota); count 0: the model's. */
    uint8_t routed_quota[PLAN_MAX_ROUTED + 1];
    int routed_quota_count;
    bool trace_handoffs;     /* the executor stamps the GPU's clock at each hand-off of a replayed
                                decode step (exec_step_stats.gpu_handoff_ms and the rest) */
};

struct plan_tier {
    enum plan_family family;
    int32_t min_tokens;
    enum placement *shard;   /* per shard of the model */
    uint32_t *experts_gpu;   /* per layer (MoE shards on the GPU): experts below this run on the GPU */
    uint32_t *ffn_rows_gpu;  /* per layer (a STREAMED dense FFN split with the CPU): rows [0, n) of
                                gate and up, and those columns of down, run on the GPU reading host
                                memory in place, the rest on the CPU at the same time; 0: not split */
    bool any_gpu, all_gpu;   /* all_gpu: no shard and no expert on the CPU */
    bool shards_gpu;         /* every shard on the GPU but perhaps the embedding (an MoE layer may
                                still split its experts): a decode step is replayed as a graph */
    bool ring;               /* streamed shards are copied through the staging slots */
    /* One-token steps split each MoE layer's experts by the token's routing instead of by range:
     * of the N experts it routes to past the resident ones, the GPU reads the first
     * routed_quota[N] (in routing order) in place and the CPU computes the rest, so every token
     * gives each side its share (a range split leaves one side waiting whenever the routing
     * falls unevenly on the two ranges). Balanced dynamic tiers without the ring; larger steps
     * of the tier split by experts_gpu as usual. */
    bool routed;
    uint8_t routed_quota[PLAN_MAX_ROUTED + 1];
    /* A ring tier that runs the attention of the layers whose KV cache is in host memory on the
     * GPU, their cells carried in the slots (plan.kv_stream); other tiers run it on the CPU. */
    bool kv_stream;
    /* A kv_stream tier's steps of one token split each carried layer's attention with the CPU:
     * the CPU attends the first plan_kv_cpu_cells of the token's cached cells from the host's
     * cache while only the rest go up in the slot for the GPU's attention, and the GPU merges the
     * two sides' partial sums (max, sum, unnormalized output). The share of the cached cells the
     * CPU takes (0: none). */
    float kv_cpu_share;
    uint64_t host_bytes_per_token; /* weight bytes the CPU reads from host memory per decode token */
    uint64_t pcie_bytes_per_token; /* weight bytes streamed over PCIe per decode token */
    uint64_t gpu_bytes_per_token;  /* weight bytes the GPU reads from VRAM per decode token */
};

/* The resident sets the planner weighs: by benefit per byte, without or with room for the
 * staging ring; or with the ring and every layer's KV first (every attention on the GPU). */
enum plan_set { PLAN_SET_NO_RING, PLAN_SET_RING, PLAN_SET_ALL_KV, PLAN_SETS };

/* A plan the planner weighed (auto), with its predicted step time in every tier. */
struct plan_candidate {
    enum plan_family family;
    float share;            /* dynamic; 0: balanced (streaming and the CPU finish together) */
    enum plan_set set;      /* its resident set */
    double seconds[PLAN_TIERS]; /* a step of the tier's fewest tokens */
    double score[PLAN_TIERS];   /* what the choice minimizes: seconds per token (prompt tiers: at both ends) */
    uint64_t key[PLAN_TIERS]; /* the tier's placement (resident set included): equal keys, same plan */
    uint64_t vram_weights, vram_kv, vram_staging;
    uint64_t host_bytes_per_token, pcie_bytes_per_token;
};

/* A unit of the staging ring: a dense shard's matrices (first = end = 0), or experts [first,
 * end) of an MoE shard. */
struct plan_unit {
    uint32_t shard;
    uint32_t first, end;
};

/* Which GPU kernel a step runs where the choice depends on the step's size, so that the cost
 * model prices the kernel the executor runs. exec_gpu_costs fills it from the CUDA backend's own
 * rules (cuda_attention_prefill_from, cuda_moe_matvec_bound). */
struct plan_kernels {
    int64_t attention_prompt_from; /* steps of one sequence of this many tokens or more attend on
                                      the prompt kernel, fewer on the split-KV one (0: never) */
    int64_t moe_matvec_max_tokens; /* MoE steps of up to this many tokens run their experts in VRAM
                                      on the matrix-vector kernel, more on the tiled GEMM */
    int64_t moe_matvec_max_tokens_in_place; /* the same for a call that reads experts in place */
};

struct plan {
    enum plan_family family;  /* what was asked, AUTO resolved to the decode tier's family */
    uint32_t n_shards, n_layers, n_expert;
    struct plan_tier tier[PLAN_TIERS];
    bool *kv_gpu;              /* per layer: KV in VRAM (attention on the GPU in every tier) */
    /* The ring carries a unit for the attention of each layer whose KV is in host memory: its
     * matrices, then the layer's cached cells of the step's sequences (the KV pool's blocks they
     * hold, at their places in a copy of the pool: its cells of K, then of V, as in VRAM), copied
     * up with them; the attention writes the step's new cells there
     * and copies them down to the host's cache. Tiers with plan_tier.kv_stream run it so; the
     * others pass over those units. */
    bool kv_stream;
    uint32_t *experts_resident; /* per layer */
    uint32_t piece_experts;    /* experts per staged piece of an MoE shard */
    uint32_t n_slots;
    uint64_t slot_bytes;
    /* Per shard: a dense shard among the ring's last n_slots units. A ring step leaves those
     * units in their slots (unit j in slot j % n_slots), so tiers that do not use the ring read
     * them there, from VRAM, instead of from host memory (the executor fills the slots itself
     * when no ring step ran since); all false where the ring lends nothing. */
    bool *lent;
    /* Per layer: experts [r, r + experts_lent) of an MoE shard (r resident) among the ring's last
     * units, which tiers without the ring read from their slots too (plan_experts_vram). An MoE
     * shard's pieces then go through the ring from its highest experts down, so the last pieces
     * of a layer are those just past its resident ones. NULL for a dense model. */
    uint32_t *experts_lent;
    bool any_gpu, any_cpu_attention;
    struct plan_kernels kernels; /* as plan_gpu_costs gave them */
    struct plan_budget budget;
    /* auto: what was weighed and what each tier was predicted to take (seconds per step) */
    uint32_t n_candidates;
    struct plan_candidate candidates[PLAN_MAX_CANDIDATES];
    int8_t chosen[PLAN_TIERS];   /* index into candidates, -1 when not searched */
    double predicted[PLAN_TIERS];
    double predicted_ttft, predicted_decode; /* a 1K-token prompt (or half the context) */
    /* auto: the typical request each resident set served (its tiers at their best), and the CPU
     * alone; ttft 0 where the set was not weighed (it does not fit, or equals the ring's). */
    struct { double ttft, decode; } weighed_set[PLAN_SETS], weighed_cpu;
    /* auto, phases: the best pair of a prompt set and another decode set, with the switches of
     * one typical request (to decode after its prompt, back before the next prompt); weighed
     * false where no pair was (one sequence only, or a single set fits). */
    struct plan_phases { bool weighed; enum plan_set prompt, decode; double to_decode, to_prompt; } weighed_phases;
    /* auto, phases: where decode steps over long caches run over another set than short ones. The
     * attention of layers whose KV is in host memory grows with the cache, and a set that carries
     * it to the GPU (or keeps more of it in VRAM) may decode a long cache faster than the set the
     * typical request decodes best over. From `from` cells on, decoding over `set` is predicted
     * faster than over `below` by more than PLAN_SET_MARGIN, and the tokens of a typical request
     * pay its changes (to_long, and back where `set` is not the prompt's). */
    struct plan_band {
        bool weighed;
        enum plan_set below, set;
        int32_t from;
        double below_s, set_s; /* seconds per decode token over each set at `from` cells */
        double to_long, back;
    } weighed_band;
    /* auto, phases: steps of fewer than PLAN_PHASE_TOKENS tokens whose cache (the step's cells
     * included) holds [decode_from, decode_until) cells run this plan, over another resident set
     * (the executor carves VRAM anew between the two: the other set's weights are copied up and
     * the KV cache of the layers whose attention moves goes across). Its predicted tiers are also
     * this plan's where it runs at the end of the context, and its chosen tiers where it runs there
     * or at the typical request's decode (chosen indexes this plan's candidates). NULL: one plan
     * serves every step. */
    struct plan *decode;
    int32_t decode_from, decode_until;
    int32_t n_batch, n_ctx;
    int32_t n_decode; /* the tokens the typical request generated, as weighed (planner.c: typical_generated) */
    int32_t n_seq;    /* the requests weighed at once: predicted_ttft is until every one's prompt is read,
                         predicted_decode a step of one token of each */
};

/* The resident set whose typical request (weighed_set, n_out tokens generated) ends soonest, or
 * within PLAN_SET_MARGIN of that one whose first token comes sooner by more than the margin; -1
 * where no set was weighed. *soonest (if not NULL): the soonest request's seconds. */
int plan_soonest_set(const struct plan *p, int32_t n_out, double *soonest);

/* Free what plan_build allocated in a plan, its decode phase's plan included. */
void plan_free(struct plan *plan);

/* The tier a step of n new tokens runs. */
static inline const struct plan_tier *plan_tier_for(const struct plan *p, int32_t n_tokens) {
    int t = PLAN_TIERS - 1;
    while (t > 0 && n_tokens < p->tier[t].min_tokens) t--;
    return &p->tier[t];
}

/* The tier whose candidates a step of n tokens is weighed in (plan_tier_tokens; the plan's own
 * tiers may start sooner: plan_tier_for). */
static inline int plan_weighed_tier(int32_t n_tokens) {
    int t = PLAN_TIERS - 1;
    while (t > 0 && n_tokens < plan_tier_tokens[t]) t--;
    return t;
}

/* Tier t's placement as a number: two plans that place everything alike there share it. */
uint64_t plan_tier_key(const struct plan *p, int t);

/* auto: the candidate a step of n tokens over a cache of n_cells cells (its own included) runs
 * as: the first candidate placing the step as the plan does (its weighed tier's choice where that
 * one does); -1 where none does. */
int plan_step_candidate(const struct plan *p, int32_t n_tokens, int32_t n_cells);

/* The plan a step of n tokens over a cache of n_cells cells (its own included) runs: the decode
 * phase's below PLAN_PHASE_TOKENS over the caches it serves, where there is one. */
static inline const struct plan *plan_for_step(const struct plan *p, int32_t n_tokens, int32_t n_cells) {
    return p->decode && n_tokens < PLAN_PHASE_TOKENS && n_cells >= p->decode_from && n_cells < p->decode_until ? p->decode
                                                                                                                 : p;
}

/* The tier a step of n tokens over n_cells cells runs, in the plan it runs (plan_for_step). */
static inline const struct plan_tier *plan_step_tier(const struct plan *p, int32_t n_tokens, int32_t n_cells) {
    return plan_tier_for(plan_for_step(p, n_tokens, n_cells), n_tokens);
}

/* Whether a one-output step of n tokens in tier t is captured once as a CUDA graph and replayed:
 * one token, every shard on the GPU but perhaps the embedding, no ring. */
static inline bool plan_tier_replays(const struct plan_tier *t, int32_t n_tokens) {
    return n_tokens == 1 && t->shards_gpu && !t->ring;
}

/* The cached cells [0, c) the CPU attends in a one-token step of tier t over n_cached cached
 * cells (plan_tier.kv_cpu_share): whole runs of PLAN_KV_CPU_RUN cells (whole KV blocks, as the
 * ring carries them), at least two, else none. */
enum { PLAN_KV_CPU_RUN = 512 };
static inline int64_t plan_kv_cpu_cells(const struct plan_tier *t, int64_t n_cached) {
    const int64_t c = (int64_t)(t->kv_cpu_share * (double)n_cached) / PLAN_KV_CPU_RUN * PLAN_KV_CPU_RUN;
    return c >= 2 * PLAN_KV_CPU_RUN && c <= n_cached ? c : 0;
}

/* Tokens of the step tier t is judged by and `pshard plan` shows: its fewest, capped by the
 * micro-batch (taken at the end of the context). */
static inline int32_t plan_tier_step_tokens(const struct plan *p, int t) {
    return plan_tier_tokens[t] < p->n_batch ? plan_tier_tokens[t] : p->n_batch;
}

/* The tier of the plan's largest steps (a full micro-batch of a prompt). */
static inline int plan_prompt_tier(const struct plan *p) {
    return (int)(plan_tier_for(p, p->n_batch > 0 ? p->n_batch : 1) - p->tier);
}

/* Which of one token's k routed experts (ids) the GPU reads in place in a routed tier: gpu[j]
 * for the first quota[N] in routing order of the N not resident (id >= first, the layer's
 * experts_resident). The GPU applies the same rule (cuda_moe_routed_mask). */
static inline void plan_routed_split(const int32_t *ids, int k, int32_t first, const uint8_t *quota, bool *gpu) {
    int n = 0, taken = 0;
    for (int j = 0; j < k; j++) n += ids[j] >= first;
    for (int j = 0; j < k; j++) {
        gpu[j] = ids[j] >= first && taken < quota[n];
        taken += gpu[j];
    }
}

/* Where shard i lives across the tiers: RESIDENT, STREAMED (in some tier) or CPU. */
enum placement plan_shard_place(const struct plan *p, uint32_t i);

/* Whether some tier reads weights from host memory on the GPU (streamed shards or experts). */
bool plan_streams(const struct plan *p);

/* A staged unit's tensors each take a whole number of PLAN_ALIGN bytes in a slot. */
enum { PLAN_ALIGN = 256 };
static inline uint64_t plan_align_up(uint64_t n) { return (n + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }
/* Bytes of one staged unit: a dense shard's matrices, or a piece of an MoE shard's experts. */
uint64_t plan_unit_bytes(const struct shard *s, uint32_t n_experts);

/* The staging ring's units in the order a ring step uses them: everything not resident that the
 * GPU can run (attention whose KV is in VRAM, or any attention where plan.kv_stream; dense FFNs;
 * pieces of experts past the resident ones of MoE layers whose shared part is resident), as any
 * GPU tier of the plan marks it (ring tiers stream exactly these, or pass over some). Returns the
 * count; out, if not NULL, holds plan_ring_units_max. */
uint32_t plan_ring_units(const struct plan *p, const struct model *m, const struct plan_tier *marks,
                         struct plan_unit *out);
/* How many of those units shard s makes, placed as `place` in a GPU tier. */
uint32_t plan_shard_units(const struct plan *p, const struct shard *s, enum placement place);
static inline size_t plan_ring_units_max(const struct plan *p) {
    return (size_t)p->n_shards * (p->n_expert / (p->piece_experts ? p->piece_experts : 1) + 2);
}
/* Whether a step of ring tier t copies unit u into its slot: a static tier runs its FFNs and the
 * experts past the resident ones on the CPU, so its steps pass over those units. */
bool plan_tier_stages(const struct model *m, const struct plan_tier *t, const struct plan_unit *u);
/* Whether the plan lends any slot (see plan.lent). */
bool plan_lends(const struct plan *p);
/* Whether some tier splits a dense FFN by rows between the GPU and the CPU. */
bool plan_splits_ffn(const struct plan *p);
/* Whether tier t splits dense FFN shard s by rows between the GPU and the CPU (ffn_rows_gpu). */
static inline bool plan_ffn_split(const struct plan_tier *t, const struct shard *s) {
    return s->kind == SHARD_FFN && s->layer >= 0 && t->ffn_rows_gpu[s->layer] > 0;
}
/* The experts of layer l tier t computes from VRAM: the resident ones and, in a tier without the
 * ring, those the ring's last pieces left in the slots (plan.experts_lent), [0, this) in all. */
static inline uint32_t plan_experts_vram(const struct plan *p, const struct plan_tier *t, uint32_t l) {
    return p->experts_resident[l] + (p->experts_lent && !t->ring ? p->experts_lent[l] : 0);
}

/* Whether ring unit u is one a tier without the ring reads from its slot (plan.lent, and
 * plan.experts_lent for an MoE shard's pieces). */
bool plan_unit_lent(const struct plan *p, const struct model *m, const struct plan_unit *u);

/* Whether tier t reads shard i from the slot the ring left it in (see plan.lent). */
static inline bool plan_reads_lent(const struct plan *p, const struct plan_tier *t, uint32_t i) {
    return p->lent[i] && !t->ring && t->shard[i] == PLACE_STREAMED;
}

/* auto: decode steps' resident set as asked (exec_params.decode_set): as the planner weighs, the
 * prompt steps' set, or one named. */
enum { PLAN_DECODE_WEIGHED = -1, PLAN_DECODE_SAME = -2 };
/* "ring", "no-ring", "all-kv" (that set) or "same" (PLAN_DECODE_SAME). */
pshard_status plan_parse_decode_set(const char *text, int32_t *decode_set);
/* Parse "2G", "2048M", "512K", "0", "1.5G" into bytes. */
pshard_status plan_parse_size(const char *text, int64_t *bytes);
pshard_status plan_parse_family(const char *text, enum plan_family *family);
/* A stream share: a number from 0 to 1. */
pshard_status plan_parse_share(const char *text, float *share);
/* A resident set as the command line names it: "no-ring", "ring" or "all-kv". */
pshard_status plan_parse_set(const char *text, enum plan_set *set);
/* Whether a family is placed over a resident set one may name (gpu, static, dynamic; auto
 * weighs every set itself, cpu has none). */
static inline bool plan_takes_set(enum plan_family family) {
    return family == PLAN_GPU || family == PLAN_STATIC || family == PLAN_DYNAMIC;
}
const char *plan_family_name(enum plan_family family);
const char *placement_name(enum placement p);
const char *plan_set_name(enum plan_set set);
/* "gpu", "dynamic 0.50 (no ring)", "static (all KV)": a candidate as `pshard plan` names it. */
void plan_candidate_name(const struct plan_candidate *c, char *buf, size_t size);

/* A line of prose, formatted, then wrapped at 100 columns on spaces (pshard plan's notes). */
void plan_note(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The plan as a table: per shard its place in each tier and its bytes, then the budget. Unless
 * every_shard, a run of layers placed alike prints as its first layer and one line. */
void plan_print(const struct plan *plan, const struct model *model, bool every_shard, FILE *out);
/* Where each tier's predicted step goes (GPU, CPU, PCIe, launches and waits), by the profile the
 * plan was made with (NULL: the conservative defaults). */
void plan_print_times(const struct plan *plan, const struct model *model, const struct profile *prof, FILE *out);
/* The profile plans are predicted with: prof, or else the conservative defaults, filled into
 * scratch. */
const struct profile *plan_profile(const struct profile *prof, struct profile *scratch);

#endif
