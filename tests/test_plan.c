/* The planner on the default model's shard list (dense) and on a tiny synthetic MoE: families,
 * budgets, priorities, token tiers, per-expert placement, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cuda/cuda_backend.h"

#include "plan/cost.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/planner_internal.h"
#include "plan/profile.h"
#include "quant/types.h"

static struct gguf_file *file, *moe_file;
static struct model model, moe;
static char moe_path[256];
/* The GPU buffers' sizes; the kernels are each model's own (costs_for). */
static const struct plan_gpu_costs costs = {.activations = 100 << 20, .logits = 20 << 20, .work = 10 << 20, .blas = 32 << 20,
                                            .host_mapping = 256 << 10};
/* Every idea the planner may turn on (split_ffn, kv_stream, ...) off; tests turn on the ones they weigh.
 * Lending the ring's dense units to tiers without it is always on. */
static const struct plan_request base = {.family = PLAN_AUTO, .n_ctx = 2048, .n_batch = 512, .n_seq = 1, .staging = -1,
                                         .decode_set = -1};

static int setup(void **state) {
    (void)state;
    const char *path = getenv("PSHARD_DEFAULT_MODEL"), *build = getenv("PSHARD_BUILD_DIR");
    if (!path || gguf_open(path, &file) != PSHARD_OK || model_load(file, &model) != PSHARD_OK) {
        fprintf(stderr, "PSHARD_DEFAULT_MODEL must name the default model (%s)\n", pshard_last_error());
        return -1;
    }
    snprintf(moe_path, sizeof moe_path, "/tmp/pshard-test-plan-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape tiny-moe --layers 8 -o '%s' > /dev/null", build ? build : ".",
             moe_path);
    if (system(cmd) != 0 || gguf_open(moe_path, &moe_file) != PSHARD_OK || model_load(moe_file, &moe) != PSHARD_OK) {
        fprintf(stderr, "cannot make the tiny MoE with gguf-synth (PSHARD_BUILD_DIR)\n");
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    model_free(&model);
    gguf_close(file);
    model_free(&moe);
    gguf_close(moe_file);
    unlink(moe_path);
    return 0;
}

static uint64_t used(const struct plan *p) {
    const struct plan_budget *b = &p->budget;
    return b->weights + b->kv + b->activations + b->work + b->blas + b->staging + b->mapping;
}

static uint64_t attention_and_kv(const struct model *m, int32_t n_ctx) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < m->n_shards; i++)
        if (m->shards[i].kind == SHARD_ATTN) n += m->shards[i].weight_bytes + m->shards[i].kv_bytes_per_token * n_ctx;
    return n;
}

/* `costs` with the kernels m's steps run, as exec_gpu_costs fills them. */
static const struct plan_gpu_costs *costs_for(const struct model *m) {
    static struct plan_gpu_costs c;
    c = costs;
    const struct model_hparams *hp = &m->hp;
    const struct cuda_attn_shape a = {(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v, 1};
    c.kernels.attention_prompt_from = cuda_attention_prefill_from(&a);
    c.kernels.moe_matvec_max_tokens = c.kernels.moe_matvec_max_tokens_in_place =
        cuda_moe_matvec_max_tokens(hp->n_expert, hp->n_expert_used);
    return &c;
}

static uint64_t fixed(void) { return costs.activations + costs.logits + costs.work + costs.blas; }

/* A budget that streams most weights: the buffers, every layer's attention and KV, and 8 MB. */
static int64_t small_budget(void) { return (int64_t)(fixed() + attention_and_kv(&model, 2048) + (8 << 20)); }

/* A request of `family` under small_budget, priced with `prof` (NULL: the defaults). */
static struct plan_request small_request(enum plan_family family, const struct profile *prof) {
    struct plan_request r = base;
    r.family = family;
    r.profile = prof;
    r.vram_budget = small_budget();
    return r;
}

/* Below everything resident the plan reserves the file mapping too. */
static uint64_t fixed_streaming(void) { return fixed() + costs.host_mapping; }

static void test_budget_zero_is_cpu(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_int_equal(p.family, PLAN_CPU);
    assert_false(p.any_gpu);
    assert_int_equal(used(&p), 0);
    for (int t = 0; t < PLAN_TIERS; t++) {
        assert_false(p.tier[t].any_gpu);
        assert_true(p.tier[t].host_bytes_per_token > 80000000);
    }
    plan_free(&p);
}

static void test_everything_fits_is_gpu(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    r.vram_budget = (int64_t)4 << 30;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_int_equal(p.family, PLAN_GPU);
    for (int t = 0; t < PLAN_TIERS; t++) {
        assert_true(p.tier[t].all_gpu);
        assert_false(p.tier[t].ring);
        assert_int_equal(p.tier[t].host_bytes_per_token + p.tier[t].pcie_bytes_per_token, 0);
    }
    assert_int_equal(p.budget.total, (uint64_t)4 << 30); /* the arena is exactly the budget */
    assert_int_equal(p.budget.staging, 0);
    assert_true(used(&p) <= p.budget.total);
    plan_free(&p);
    r.vram_budget = -1; /* no budget: what the plan needs */
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_int_equal(p.budget.total, used(&p));
    plan_free(&p);
}

/* The KV cache is sized as the pool the sequences share (plan_request.kv_cells), not n_seq full
 * contexts: the gpu plan's KV is every layer's bytes per cell times the pool's cells. */
static void test_kv_sized_as_the_pool(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    r.family = PLAN_GPU, r.vram_budget = -1, r.n_seq = 8;
    uint64_t per_cell = 0;
    for (uint32_t i = 0; i < model.n_shards; i++)
        if (model.shards[i].kind == SHARD_ATTN) per_cell += model.shards[i].kv_bytes_per_token;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    const uint64_t whole = p.budget.kv; /* 0: n_ctx * n_seq cells */
    assert_true(whole >= per_cell * 2048 * 8);
    plan_free(&p);
    r.kv_cells = 3000;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_true(p.budget.kv >= per_cell * 3000 && p.budget.kv < per_cell * 3000 + (whole - per_cell * 2048 * 8) + (1 << 20));
    assert_true(p.budget.kv < whole / 4);
    plan_free(&p);
}

static void test_static_fills_by_priority(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    r.family = PLAN_STATIC;
    /* Room for the fixed buffers, every attention shard with its KV, and a little more. */
    r.vram_budget = (int64_t)(fixed() + attention_and_kv(&model, 2048) + (4 << 20));
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_int_equal(p.family, PLAN_STATIC);
    assert_true(used(&p) <= p.budget.total);
    assert_int_equal(p.budget.staging, 0); /* static never streams through slots */
    for (int t = 0; t < PLAN_TIERS; t++) {
        const struct plan_tier *tier = &p.tier[t];
        assert_int_equal(tier->family, PLAN_STATIC);
        for (uint32_t i = 0; i < model.n_shards; i++) {
            if (model.shards[i].kind == SHARD_ATTN) assert_int_equal(tier->shard[i], PLACE_RESIDENT);
            if (model.shards[i].kind == SHARD_HEAD) assert_int_equal(tier->shard[i], PLACE_CPU); /* 30 MB: no room */
            if (model.shards[i].kind == SHARD_FFN) assert_int_not_equal(tier->shard[i], PLACE_STREAMED);
        }
        assert_true(tier->any_gpu && !tier->all_gpu);
        assert_true(tier->host_bytes_per_token > 0 && tier->gpu_bytes_per_token > 0);
        assert_int_equal(tier->pcie_bytes_per_token, 0);
    }
    assert_false(p.any_cpu_attention);
    plan_free(&p);
}

/* gpu under a budget: every shard on the GPU, the rest streamed, prompts through the ring. */
static void test_gpu_streams_what_does_not_fit(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = small_request(PLAN_GPU, NULL);
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_true(used(&p) <= p.budget.total);
    assert_true(p.n_slots == PLAN_MIN_SLOTS || p.n_slots == PLAN_STAGING_SLOTS);
    assert_int_equal(p.budget.staging, (uint64_t)p.n_slots * p.slot_bytes);
    for (uint32_t i = 0; i < model.n_shards; i++) /* the largest unit fits a slot */
        if (model.shards[i].kind == SHARD_FFN || model.shards[i].kind == SHARD_ATTN)
            assert_true(plan_unit_bytes(&model.shards[i], 0) <= p.slot_bytes);
    int streamed = 0;
    for (int t = 0; t < PLAN_TIERS; t++) {
        const struct plan_tier *tier = &p.tier[t];
        assert_true(tier->all_gpu);
        assert_int_equal(tier->host_bytes_per_token, 0);
        assert_true(tier->pcie_bytes_per_token > 0);
        for (uint32_t i = 0; i < model.n_shards; i++) streamed += tier->shard[i] == PLACE_STREAMED;
    }
    assert_true(streamed > 0);
    for (int t = 0; t < PLAN_TIERS; t++) /* small steps read streamed weights in place, large ones stage them */
        assert_int_equal(p.tier[t].ring, p.tier[t].min_tokens >= PLAN_RING_MIN_TOKENS);
    assert_int_equal(plan_tier_for(&p, 1), &p.tier[PLAN_TIER_DECODE]);
    assert_int_equal(plan_tier_for(&p, 3), &p.tier[PLAN_TIER_DECODE]);
    assert_int_equal(plan_tier_for(&p, 4), &p.tier[1]);
    assert_int_equal(plan_tier_for(&p, PLAN_RING_MIN_TOKENS - 1), &p.tier[1]);
    assert_true(plan_tier_for(&p, PLAN_RING_MIN_TOKENS)->ring);
    assert_int_equal(plan_tier_for(&p, 100000), &p.tier[PLAN_TIERS - 1]);
    assert_int_equal(plan_prompt_tier(&p), 4); /* -b 512: steps of 256-1023 tokens */
    plan_free(&p);
}

/* dynamic on a dense model at the balanced share, which differs by tokens per step: the ring tiers
 * still stream everything not resident, alike, since the staged units are made once from the
 * first of them (a tier streaming other FFN shards would find the ring out of step). */
static void test_dynamic_ring_tiers_stage_alike(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    for (int f = 0; f < PROFILE_FORMATS; f++) /* the CPU's matmuls fall behind as steps grow */
        for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_matmul[f].s_per_byte[i] = prof.zero_copy[i] * (1 + i);
    struct plan_request r = small_request(PLAN_DYNAMIC, &prof);
    struct plan p;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    int ring_tiers = 0, first = -1;
    for (int t = 0; t < PLAN_TIERS; t++) {
        if (!p.tier[t].ring) continue;
        ring_tiers++;
        if (first < 0) first = t;
        for (uint32_t i = 0; i < model.n_shards; i++) assert_int_equal(p.tier[t].shard[i], p.tier[first].shard[i]);
    }
    assert_true(ring_tiers >= 2);
    /* Dynamic stages from PLAN_RING_ALL_MIN_TOKENS on; below it a step still splits with the CPU. */
    assert_false(plan_tier_for(&p, PLAN_RING_MIN_TOKENS)->ring);
    assert_true(plan_tier_for(&p, PLAN_RING_ALL_MIN_TOKENS)->ring);
    int cpu_ffn = 0; /* the small steps do split the FFN shards with the CPU */
    for (uint32_t i = 0; i < model.n_shards; i++)
        cpu_ffn += model.shards[i].kind == SHARD_FFN && p.tier[PLAN_TIER_DECODE].shard[i] == PLACE_CPU;
    assert_true(cpu_ffn > 0);
    plan_free(&p);
    /* In place (as auto weighs dynamic): no tier takes the ring, over the same resident set; the
     * units the ring would leave in its slots run from there, and the rest split with the CPU,
     * less as steps grow (the CPU's matmuls fall behind). */
    r.dynamic_in_place = true;
    struct plan q;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &q), PSHARD_OK);
    assert_true(q.n_slots > 0);
    int split_before = INT32_MAX;
    for (int t = 0; t < PLAN_TIERS; t++) {
        assert_false(q.tier[t].ring);
        int split = 0, in_slot = 0;
        for (uint32_t i = 0; i < model.n_shards; i++) {
            const struct shard *s = &model.shards[i];
            if (s->kind != SHARD_FFN) continue;
            if (plan_reads_lent(&q, &q.tier[t], i)) {
                assert_int_equal(q.tier[t].ffn_rows_gpu[s->layer], 0);
                in_slot++;
                continue;
            }
            split += q.tier[t].shard[i] == PLACE_CPU || q.tier[t].ffn_rows_gpu[s->layer] > 0;
        }
        assert_true(in_slot > 0 && (uint32_t)in_slot <= q.n_slots);
        assert_true(split <= split_before && (t > 0 || split > 0));
        split_before = split;
    }
    plan_free(&q);
}

/* An MoE layer's router on the CPU is priced at the rate the profile timed at its own shape
 * (cpu_router) where it has one, else at the model's large matrices' rate; where the layer runs
 * on the GPU, nothing moves. */
static void test_cpu_router_rate(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults: no router timed */
    uint64_t router_bytes = 0;
    uint32_t type = 0;
    for (uint32_t i = 0; i < moe.n_shards; i++)
        for (uint32_t t = 0; moe.shards[i].kind == SHARD_MOE && t < moe.shards[i].n_tensors; t++) {
            const struct gguf_tensor *g = moe.shards[i].tensors[t];
            if (model_tensor_is_router(&moe, &moe.shards[i], g))
                router_bytes += g->n_bytes, type = g->type;
        }
    assert_true(router_bytes > 0);
    struct plan_request r = base;
    r.family = PLAN_CPU;
    struct plan cpu, gpu;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &cpu), PSHARD_OK);
    r = base;
    r.family = PLAN_GPU;
    r.vram_budget = (int64_t)8 << 30; /* every shard resident */
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &gpu), PSHARD_OK);
    for (int n = 1; n <= 64; n *= 4) {
        struct profile timed = prof;
        for (int i = 0; i < PROFILE_TOKENS; i++) timed.cpu_router[i] = 3 * cost_rate(prof.cpu_matmul, type, profile_tokens[i]);
        struct cost_step a, b;
        cost_step(&prof, &moe, &cpu, &cpu.tier[0], n, 100, &a);
        cost_step(&timed, &moe, &cpu, &cpu.tier[0], n, 100, &b);
        const double more = (double)router_bytes * 2 * cost_rate(prof.cpu_matmul, type, n);
        assert_true(more > 0 && fabs(b.seconds - a.seconds - more) <= 1e-6 * more);
        assert_true(fabs(b.cpu_s - a.cpu_s - more) <= 1e-6 * more);
        cost_step(&prof, &moe, &gpu, &gpu.tier[0], n, 100, &a);
        cost_step(&timed, &moe, &gpu, &gpu.tier[0], n, 100, &b);
        assert_true(a.seconds == b.seconds);
    }
    plan_free(&cpu);
    plan_free(&gpu);
}

/* Lending the slots (plan.lent): the dense shards among the ring's last units (what a ring step
 * leaves in the slots) run from there in tiers without the ring, in every family that has the
 * ring's room, and those tiers neither stream them over PCIe nor pay for it; the ring tier
 * stages the same shards through PCIe. */
static void test_lent_slots(void **state) {
    (void)state;
    struct plan_request r = small_request(PLAN_GPU, NULL);
    struct plan lent;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &lent), PSHARD_OK);
    assert_non_null(lent.lent);
    int ring = -1;
    for (int t = PLAN_TIERS - 1; t >= 0; t--) ring = lent.tier[t].ring ? t : ring;
    assert_true(ring > 0 && lent.n_slots > 0);
    struct plan_unit *units = malloc(sizeof *units * plan_ring_units_max(&lent));
    assert_non_null(units);
    const uint32_t n = plan_ring_units(&lent, &model, &lent.tier[ring], units);
    assert_true(n > lent.n_slots);
    for (uint32_t j = 0; j < n; j++) /* the ring tier streams exactly its units */
        assert_int_equal(lent.tier[ring].shard[units[j].shard], PLACE_STREAMED);
    uint64_t lent_bytes = 0;
    int n_lent = 0;
    for (uint32_t i = 0; i < model.n_shards; i++) {
        bool last = false;
        for (uint32_t j = n - lent.n_slots; j < n; j++) last |= units[j].shard == i;
        assert_int_equal(lent.lent[i], last && model.shards[i].kind != SHARD_MOE);
        if (!lent.lent[i]) continue;
        n_lent++;
        lent_bytes += plan_unit_bytes(&model.shards[i], 0);
        assert_true(plan_reads_lent(&lent, &lent.tier[PLAN_TIER_DECODE], i));
        assert_false(plan_reads_lent(&lent, &lent.tier[ring], i)); /* the ring stages it as before */
    }
    assert_int_equal(n_lent, lent.n_slots);
    /* The decode tier places every shard as the ring tier does; what it reads from the slots
     * moves from PCIe to VRAM in its bytes a token, byte for byte. */
    const struct plan_tier *a = &lent.tier[ring], *b = &lent.tier[PLAN_TIER_DECODE];
    assert_false(b->ring);
    for (uint32_t i = 0; i < model.n_shards; i++) assert_int_equal(a->shard[i], b->shard[i]);
    assert_int_equal(a->host_bytes_per_token, b->host_bytes_per_token);
    assert_int_equal(a->pcie_bytes_per_token - b->pcie_bytes_per_token, lent_bytes);
    assert_int_equal(b->gpu_bytes_per_token - a->gpu_bytes_per_token, lent_bytes);
    /* The cost model prices the lent shards as VRAM reads: the same tier with nothing lent (its
     * shards read in place) is slower, by its PCIe time. */
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    struct cost_step ca, cb;
    cost_step(&prof, &model, &lent, b, 1, 1000, &cb);
    bool *given = lent.lent, *none = calloc(model.n_shards, sizeof *none);
    assert_non_null(none);
    lent.lent = none;
    cost_step(&prof, &model, &lent, b, 1, 1000, &ca);
    lent.lent = given;
    free(none);
    assert_true(cb.pcie_s < ca.pcie_s && cb.seconds < ca.seconds);
    free(units);
    plan_free(&lent);

    /* static with the ring's room (as auto weighs it): the lent shards leave the CPU. */
    r.family = PLAN_STATIC;
    r.staging = PLAN_SET_RING;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &lent), PSHARD_OK);
    int on_gpu = 0, on_cpu = 0;
    for (uint32_t i = 0; i < model.n_shards; i++) {
        if (model.shards[i].kind != SHARD_FFN || lent.tier[0].shard[i] == PLACE_RESIDENT) continue;
        if (lent.lent[i]) assert_true(plan_reads_lent(&lent, &lent.tier[0], i)), on_gpu++;
        else assert_int_equal(lent.tier[0].shard[i], PLACE_CPU), on_cpu++;
    }
    assert_true(on_gpu > 0 && on_cpu > 0);
    plan_free(&lent);
}

/* With the CPU's attention at rates from fast to slow, each ring tier that carries KV up runs
 * the attention of as many of the host's layers on the GPU as the cost model finds fastest, the
 * rest on the CPU: never slower than all of them either way (checked by placing the tier so),
 * and at some rate a mix of both. */
static void kv_stream_mixes(struct profile *prof, const struct plan_request *req) {
    struct plan_request static_ring = *req; /* (static's tiers take the ring from one token: decode steps weigh it too) */
    static_ring.family = PLAN_STATIC;
    static_ring.stage_static = true;
    const struct plan_request *r = &static_ring;
    bool mixed = false;
    for (double rate = 1e-13; rate < 1e-8; rate *= 1.4) {
        for (int i = 0; i < PROFILE_TOKENS; i++) prof->cpu_attn[i] = rate;
        struct plan p;
        assert_int_equal(plan_build(&model, r, costs_for(&model), &p), PSHARD_OK);
        for (int t = 0; t < PLAN_TIERS; t++) {
            if (!p.tier[t].ring || !p.kv_stream) continue;
            uint32_t up = 0, cpu = 0;
            for (uint32_t i = 0; i < model.n_shards; i++) {
                const struct shard *s = &model.shards[i];
                if (s->kind != SHARD_ATTN || p.kv_gpu[s->layer]) continue;
                up += p.tier[t].shard[i] == PLACE_STREAMED, cpu += p.tier[t].shard[i] == PLACE_CPU;
            }
            assert_int_equal(p.tier[t].kv_stream, up > 0);
            mixed |= up > 0 && cpu > 0;
            const double chosen = plan_tier_per_token(prof, &model, r, &p, &p.tier[t], t);
            for (int way = 0; way < 2; way++) {
                struct plan_tier alike = p.tier[t];
                for (uint32_t i = 0; i < model.n_shards; i++) {
                    const struct shard *s = &model.shards[i];
                    if (s->kind == SHARD_ATTN && !p.kv_gpu[s->layer]) alike.shard[i] = way ? PLACE_STREAMED : PLACE_CPU;
                }
                alike.kv_stream = way;
                plan_tier_account(&model, &p, &alike);
                assert_true(chosen <= plan_tier_per_token(prof, &model, r, &p, &alike, t) * (1 + 1e-9));
            }
        }
        plan_free(&p);
    }
    assert_true(mixed);
}

/* One-token ring tiers that carry KV up may split each carried layer's attention with the CPU
 * (kv_split), static tiers of a long context here: at CPU attention rates from fast to slow, the
 * decode tier's choice is never slower than without the split (the plan built with kv_split off,
 * which weighs the same counts at share 0), and at some rate faster with a share given the CPU,
 * whose cells the ring then does not copy (the tier's copies priced less than the same tier's at
 * share 0); only one-token tiers split; kv_split off, none does; a share the request fixes is the
 * decode tier's. */
static void test_kv_split(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    struct plan_request r = base;
    r.family = PLAN_STATIC;
    r.stage_static = true;
    r.staging = PLAN_SET_RING;
    r.profile = &prof;
    r.kv_stream = true;
    r.n_ctx = 8192;
    r.vram_budget = (int64_t)(fixed_streaming() + 40 * 1048576ull);
    bool faster = false;
    for (double rate = 1e-13; rate < 1e-8; rate *= 2) {
        for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_attn[i] = rate;
        struct plan split, whole;
        r.kv_split = true;
        assert_int_equal(plan_build(&model, &r, costs_for(&model), &split), PSHARD_OK);
        r.kv_split = false;
        assert_int_equal(plan_build(&model, &r, costs_for(&model), &whole), PSHARD_OK);
        assert_true(split.kv_stream && split.tier[0].ring);
        for (int t = 0; t < PLAN_TIERS; t++) {
            assert_true(whole.tier[t].kv_cpu_share == 0);
            if (split.tier[t].min_tokens > 1) assert_true(split.tier[t].kv_cpu_share == 0);
        }
        const double with = plan_tier_per_token(&prof, &model, &r, &split, &split.tier[0], 0);
        const double without = plan_tier_per_token(&prof, &model, &r, &whole, &whole.tier[0], 0);
        assert_true(with <= without * (1 + 1e-9));
        if (split.tier[0].kv_cpu_share > 0) {
            assert_true(split.tier[0].kv_stream);
            faster |= with < without * 0.99;
            struct plan_tier unsplit = split.tier[0];
            unsplit.kv_cpu_share = 0;
            struct cost_step a, b;
            cost_step(&prof, &model, &split, &split.tier[0], 1, r.n_ctx - 1, &a);
            cost_step(&prof, &model, &split, &unsplit, 1, r.n_ctx - 1, &b);
            assert_true(a.pcie_s < b.pcie_s && a.cpu_s > b.cpu_s);
        }
        plan_free(&split);
        plan_free(&whole);
    }
    assert_true(faster);
    r.kv_split = true;
    r.kv_cpu_share = 0.3f;
    struct plan p;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_true(p.tier[0].kv_stream);
    assert_true(p.tier[0].kv_cpu_share == 0.3f);
    assert_int_equal(plan_kv_cpu_cells(&p.tier[0], 8191), 2048); /* whole runs of 512 */
    assert_int_equal(plan_kv_cpu_cells(&p.tier[0], 3000), 0);    /* 900: under two runs */
    plan_free(&p);
}

/* The KV cells of layers whose cache is on the host ride the ring (plan.kv_stream): ring tiers run
 * that attention on the GPU when the cost model finds it faster, the other tiers on the CPU; the
 * ring has a unit for each such layer, large enough for its cells, never lent; only the layers in
 * VRAM count as VRAM KV; and a tier that streams KV prices the cells it copies up. */
static void test_kv_stream(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_attn[i] = 1e-8; /* the CPU's attention: slow */
    struct plan_request r = base;
    r.family = PLAN_DYNAMIC;
    r.staging = PLAN_SET_RING;
    r.profile = &prof;
    r.kv_stream = true;
    r.vram_budget = (int64_t)(fixed_streaming() + 40 * 1048576ull);
    struct plan p;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_true(p.kv_stream);
    uint64_t kv_vram = 0, kv_layer = 0;
    uint32_t host_layers = 0;
    for (uint32_t i = 0; i < model.n_shards; i++) {
        const struct shard *s = &model.shards[i];
        if (s->kind != SHARD_ATTN) continue;
        kv_layer = s->kv_bytes_per_token * (uint64_t)r.n_ctx;
        if (p.kv_gpu[s->layer]) kv_vram += kv_layer;
        else host_layers++;
        if (!p.kv_gpu[s->layer]) {
            assert_true(p.slot_bytes >= plan_unit_bytes(s, 0) + kv_layer);
            assert_false(p.lent[i]);
        }
    }
    assert_true(host_layers > 0);
    assert_int_equal(p.budget.kv, kv_vram);
    assert_true(used(&p) <= p.budget.total);
    int streaming_tiers = 0;
    for (int t = 0; t < PLAN_TIERS; t++) {
        const struct plan_tier *tier = &p.tier[t];
        assert_true(!tier->kv_stream || tier->ring);
        streaming_tiers += tier->kv_stream;
        for (uint32_t i = 0; i < model.n_shards; i++) {
            const struct shard *s = &model.shards[i];
            if (s->kind == SHARD_ATTN && !p.kv_gpu[s->layer])
                assert_int_equal(tier->shard[i], tier->kv_stream ? PLACE_STREAMED : PLACE_CPU);
        }
    }
    assert_true(streaming_tiers > 0);
    int t = PLAN_TIERS - 1;
    while (!p.tier[t].kv_stream) t--;
    struct plan_unit *units = malloc(sizeof *units * plan_ring_units_max(&p));
    assert_non_null(units);
    const uint32_t n = plan_ring_units(&p, &model, &p.tier[t], units);
    uint32_t host_units = 0;
    for (uint32_t j = 0; j < n; j++) {
        const struct shard *s = &model.shards[units[j].shard];
        if (s->kind != SHARD_ATTN || p.kv_gpu[s->layer]) continue;
        host_units++;
        assert_true(plan_tier_stages(&model, &p.tier[t], &units[j]));
        assert_false(plan_tier_stages(&model, &p.tier[0], &units[j])); /* decode steps: on the CPU */
    }
    assert_int_equal(host_units, host_layers);
    /* The cells copied up cost their copy: 1000 cached cells more add at least their time at the
     * profile's fastest copy rate. */
    struct cost_step at0, at1000;
    cost_step(&prof, &model, &p, &p.tier[t], 64, 0, &at0);
    cost_step(&prof, &model, &p, &p.tier[t], 64, 1000, &at1000);
    double fastest = 0;
    for (int i = 0; i < PROFILE_SIZES; i++) fastest = prof.h2d_gbps[i] > fastest ? prof.h2d_gbps[i] : fastest;
    assert_true(at1000.pcie_s - at0.pcie_s >= 0.99 * host_layers * 1000.0 * (double)(kv_layer / r.n_ctx) / (fastest * 1e9));
    free(units);
    plan_free(&p);
    kv_stream_mixes(&prof, &r);

    /* Several sequences: a slot would hold a layer's cells of every sequence (the whole pool's),
     * so the ring carries them only where they fit in the slots it has without them -- the slots
     * never grow for them. A pool of 256 cells fits there; one of 4K cells does not. Each pool
     * at the budgets from the buffers up in steps of 1 MB, until some layer's KV is on the host. */
    r.n_seq = 3;
    const int32_t pools[2] = {256, 4096};
    for (int k = 0; k < 2; k++) {
        bool any_host = false;
        r.n_ctx = pools[k];
        for (uint64_t extra = 1; !any_host && extra <= 40; extra++) {
            r.vram_budget = (int64_t)(fixed_streaming() + extra * 1048576ull);
            r.kv_stream = false;
            if (plan_build(&model, &r, costs_for(&model), &p) != PSHARD_OK) continue;
            const uint64_t bare = p.slot_bytes;
            plan_free(&p);
            r.kv_stream = true;
            assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
            assert_int_equal(p.slot_bytes, bare);
            for (uint32_t l = 0; l < p.n_layers; l++) any_host |= !p.kv_gpu[l];
            if (any_host) {
                print_message("pool of %d cells at %.0f MB: slots of %.2f MB, cells carried: %d\n", pools[k],
                              r.vram_budget / 1048576.0, bare / 1048576.0, p.kv_stream);
                assert_int_equal(p.kv_stream, k == 0);
            }
            for (uint32_t i = 0; i < model.n_shards; i++) {
                const struct shard *s = &model.shards[i];
                if (s->kind == SHARD_ATTN && !p.kv_stream)
                    assert_int_equal(p.tier[PLAN_TIERS - 1].shard[i] == PLACE_CPU, !p.kv_gpu[s->layer]);
            }
            for (int t = 0; t < PLAN_TIERS; t++) assert_true(p.kv_stream || !p.tier[t].kv_stream);
            plan_free(&p);
        }
        assert_true(any_host);
    }
    r.n_ctx = base.n_ctx;
    r.n_seq = 1;
    r.vram_budget = (int64_t)(fixed_streaming() + 40 * 1048576ull);

    /* The CPU's attention made free and copies slow: ring tiers leave it on the CPU (all of it,
     * or for the prompt's largest steps, where the activations' hand-offs over the slow copies
     * weigh too, some of it), and pass over the units of the layers it stays with. */
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_attn[i] = 0;
    for (int f = 0; f < PROFILE_FORMATS; f++)
        for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_matmul[f].s_per_byte[i] = 0;
    for (int i = 0; i < PROFILE_SIZES; i++) prof.h2d_gbps[i] = 0.05;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_true(p.kv_stream);
    units = malloc(sizeof *units * plan_ring_units_max(&p));
    assert_non_null(units);
    const uint32_t n_all = plan_ring_units(&p, &model, &p.tier[PLAN_TIERS - 1], units);
    uint32_t on_cpu = 0;
    for (int k = 0; k < PLAN_TIERS; k++) {
        for (uint32_t j = 0; j < n_all; j++) {
            const struct shard *s = &model.shards[units[j].shard];
            if (s->kind != SHARD_ATTN || p.kv_gpu[s->layer] || p.tier[k].shard[units[j].shard] != PLACE_CPU) continue;
            on_cpu++;
            assert_false(plan_tier_stages(&model, &p.tier[k], &units[j]));
        }
        if (p.tier[k].min_tokens < 1024) assert_false(p.tier[k].kv_stream);
    }
    assert_true(on_cpu > 0);
    free(units);
    plan_free(&p);

    /* Not asked for: no tier streams KV and the ring has no unit for that attention. */
    r.kv_stream = false;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_false(p.kv_stream);
    units = malloc(sizeof *units * plan_ring_units_max(&p));
    assert_non_null(units);
    const uint32_t n_off = plan_ring_units(&p, &model, &p.tier[PLAN_TIERS - 1], units);
    for (uint32_t j = 0; j < n_off; j++) {
        const struct shard *s = &model.shards[units[j].shard];
        assert_false(s->kind == SHARD_ATTN && !p.kv_gpu[s->layer]);
    }
    for (int k = 0; k < PLAN_TIERS; k++) assert_false(p.tier[k].kv_stream);
    free(units);
    plan_free(&p);
}

/* Static over the all-KV set where some attention streams: with stage_static its tiers take the
 * ring and stage exactly the attention (the FFNs, on the CPU, are passed over); the copies run
 * while the CPU computes, so a decode step is predicted faster than reading in place, and never
 * faster than with free copies. */
static void test_static_stages_attention(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    for (int f = 0; f < PROFILE_FORMATS; f++) /* the CPU's FFNs take far longer than a copy */
        for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_matmul[f].s_per_byte[i] = 1e-9;
    struct plan_request r = base;
    r.family = PLAN_STATIC;
    r.staging = PLAN_SET_ALL_KV;
    r.profile = &prof;
    r.stage_static = true;
    struct plan staged = {0}, in_place = {0};
    int streamed = 0;
    for (r.vram_budget = (int64_t)fixed(); streamed == 0 && r.vram_budget < (int64_t)fixed() + (64 << 20);
         r.vram_budget += 64 << 10) {
        plan_free(&staged);
        if (plan_build(&model, &r, costs_for(&model), &staged) != PSHARD_OK) continue;
        for (uint32_t i = 0; i < model.n_shards; i++)
            streamed += model.shards[i].kind == SHARD_ATTN && staged.tier[0].shard[i] == PLACE_STREAMED;
    }
    r.vram_budget -= 64 << 10;
    assert_true(streamed > 0);
    for (int t = 0; t < PLAN_TIERS; t++) assert_true(staged.tier[t].ring);
    struct plan_unit *units = malloc(sizeof *units * plan_ring_units_max(&staged));
    assert_non_null(units);
    const uint32_t n = plan_ring_units(&staged, &model, &staged.tier[0], units);
    int staged_units = 0;
    for (uint32_t j = 0; j < n; j++) {
        const bool attn = model.shards[units[j].shard].kind == SHARD_ATTN;
        assert_int_equal(plan_tier_stages(&model, &staged.tier[0], &units[j]), attn);
        staged_units += attn;
    }
    assert_int_equal(staged_units, streamed);
    r.stage_static = false;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &in_place), PSHARD_OK);
    assert_false(in_place.tier[0].ring);
    /* The same places but for the units the ring would leave in its slots: without the ring they
     * run from there (lent; an FFN the staged plan runs on the CPU too). Priced with nothing lent
     * and those places as the staged plan's, the two plans differ in how they read the attention
     * alone. */
    bool *lent = in_place.lent, *none = calloc(model.n_shards, sizeof *none);
    assert_non_null(none);
    int in_slot = 0;
    for (uint32_t i = 0; i < model.n_shards; i++) {
        if (plan_reads_lent(&in_place, &in_place.tier[0], i)) {
            in_place.tier[0].shard[i] = staged.tier[0].shard[i];
            in_slot++;
        }
        assert_int_equal(in_place.tier[0].shard[i], staged.tier[0].shard[i]);
    }
    assert_true(in_slot > 0);
    in_place.lent = none;
    struct cost_step a, b, free_copies;
    cost_step(&prof, &model, &staged, &staged.tier[0], 1, 1000, &a);
    cost_step(&prof, &model, &in_place, &in_place.tier[0], 1, 1000, &b);
    for (int i = 0; i < PROFILE_SIZES; i++) prof.h2d_gbps[i] = 1e9;
    cost_step(&prof, &model, &staged, &staged.tier[0], 1, 1000, &free_copies);
    assert_true(a.seconds < b.seconds);
    /* hidden behind the CPU: the copies add (next to) nothing to the step */
    assert_true(a.seconds >= free_copies.seconds && a.pcie_s > 0);
    assert_true(a.seconds - free_copies.seconds < 0.2 * (a.pcie_s - free_copies.pcie_s));
    /* The copies share host memory with the CPU's FFNs they run beside: with the measured shares
     * at 1 and room for both nothing slows; with the ceiling below what the two ask, the staged
     * step grows (the CPU's part of it too), and the step reading in place does not. */
    for (int i = 0; i < PROFILE_SIZES; i++) prof.h2d_gbps[i] = 12;
    prof.cpu_share_under_h2d = prof.h2d_share_under_cpu = 1;
    prof.host_read_gbps = 1e6;
    struct cost_step wide_staged, wide_in_place, narrow_staged, narrow_in_place;
    cost_step(&prof, &model, &staged, &staged.tier[0], 1, 1000, &wide_staged);
    cost_step(&prof, &model, &in_place, &in_place.tier[0], 1, 1000, &wide_in_place);
    prof.host_read_gbps = 1; /* the CPU reads at 1 GB/s here, the copies at 12 */
    cost_step(&prof, &model, &staged, &staged.tier[0], 1, 1000, &narrow_staged);
    cost_step(&prof, &model, &in_place, &in_place.tier[0], 1, 1000, &narrow_in_place);
    assert_true(narrow_staged.seconds > wide_staged.seconds && narrow_staged.cpu_s > wide_staged.cpu_s);
    assert_true(fabs(narrow_in_place.seconds - wide_in_place.seconds) < 1e-12);
    in_place.lent = lent;
    free(none);
    free(units);
    plan_free(&staged);
    plan_free(&in_place);
}

/* Dynamic with split_ffn: the small tiers split every FFN they do not keep resident by rows
 * (whole PLAN_SPLIT_ROWS on both sides) instead of by layer; the bytes a token reads stay the
 * same, the ring tiers stream whole FFNs as before, and a decode step, both sides working at
 * once, is predicted faster than alternating whole layers. */
static void test_dynamic_splits_ffn_rows(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    struct plan_request r = small_request(PLAN_DYNAMIC, &prof);
    struct plan by_layer, split;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &by_layer), PSHARD_OK);
    assert_false(plan_splits_ffn(&by_layer));
    r.split_ffn = true;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &split), PSHARD_OK);
    assert_true(plan_splits_ffn(&split));
    const uint32_t ff = model.hp.n_ff;
    int n_split = 0;
    for (int t = 0; t < PLAN_TIERS; t++) {
        const struct plan_tier *tier = &split.tier[t];
        for (uint32_t i = 0; i < model.n_shards; i++) {
            const struct shard *s = &model.shards[i];
            if (s->kind != SHARD_FFN) continue;
            const uint32_t rows = tier->ffn_rows_gpu[s->layer];
            if (tier->ring || tier->shard[i] == PLACE_RESIDENT || plan_reads_lent(&split, tier, i)) {
                assert_int_equal(rows, 0); /* (those lent run whole from their slots) */
                continue;
            }
            assert_int_equal(tier->shard[i], PLACE_STREAMED);
            assert_true(rows > 0 && rows < ff && rows % PLAN_SPLIT_ROWS == 0 && (ff - rows) % PLAN_SPLIT_ROWS == 0);
            assert_true(plan_ffn_split(tier, s));
            n_split += t == PLAN_TIER_DECODE;
        }
    }
    assert_true(n_split > 0);
    const struct plan_tier *a = &by_layer.tier[PLAN_TIER_DECODE], *b = &split.tier[PLAN_TIER_DECODE];
    assert_false(b->all_gpu);
    assert_int_equal(a->host_bytes_per_token + a->pcie_bytes_per_token + a->gpu_bytes_per_token,
                     b->host_bytes_per_token + b->pcie_bytes_per_token + b->gpu_bytes_per_token);
    assert_true(b->host_bytes_per_token > 0 && b->pcie_bytes_per_token > 0);
    /* This model's FFNs are small (1.6 MB): with hand-offs this cheap both sides working at once
     * wins; at the defaults' hand-off cost, alternating layers does (the planner weighs both). */
    prof.round_trip_s = prof.graph_round_trip_s = 2e-6;
    struct cost_step ca, cb;
    cost_step(&prof, &model, &by_layer, a, 1, 1000, &ca);
    cost_step(&prof, &model, &split, b, 1, 1000, &cb);
    assert_true(cb.seconds < ca.seconds);
    assert_true(cb.seconds < cb.gpu_s + cb.cpu_s); /* the sides overlap */
    /* Both sides read host memory at once, from one bandwidth: with room for both (and the
     * measured shares at 1) nothing slows; with the ceiling at half of what they ask together,
     * the split's step grows (the CPU's part of it too) and alternating whole layers (one side at
     * a time) does not change. */
    prof.cpu_share_under_reads = prof.reads_share_under_cpu = 1;
    prof.host_read_gbps = 1e6;
    struct cost_step wide_a, wide_b, narrow_a, narrow_b;
    cost_step(&prof, &model, &by_layer, a, 1, 1000, &wide_a);
    cost_step(&prof, &model, &split, b, 1, 1000, &wide_b);
    prof.host_read_gbps = 15; /* the defaults' CPU reads at 20 GB/s, in-place reads at 10 */
    cost_step(&prof, &model, &by_layer, a, 1, 1000, &narrow_a);
    cost_step(&prof, &model, &split, b, 1, 1000, &narrow_b);
    assert_true(narrow_b.seconds > wide_b.seconds && narrow_b.cpu_s > wide_b.cpu_s);
    assert_true(fabs(narrow_a.seconds - wide_a.seconds) < 1e-12);
    /* Host memory seen serving both at once faster than the cores read alone: that is the
     * ceiling (the cores' own rate is no bound on the two together). */
    prof.host_served_gbps = 1e6;
    struct cost_step served_b;
    cost_step(&prof, &model, &split, b, 1, 1000, &served_b);
    assert_true(fabs(served_b.seconds - wide_b.seconds) < 1e-12);
    prof.host_served_gbps = 10; /* below the cores' 15: the cores' rate holds */
    cost_step(&prof, &model, &split, b, 1, 1000, &served_b);
    assert_true(fabs(served_b.seconds - narrow_b.seconds) < 1e-12);
    plan_free(&by_layer);
    plan_free(&split);
}

/* auto on a dense model under a budget: each tier runs the candidate the cost model predicts
 * fastest among those it weighed (per token at both ends of the tier), all over one resident set. */
static void test_auto_picks_the_fastest_per_tier(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    r.vram_budget = (int64_t)(fixed() + attention_and_kv(&model, 2048) + (24 << 20));
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_true(p.n_candidates >= 4); /* static, gpu, dynamic at shares, cpu */
    for (int t = 0; t < PLAN_TIERS; t++) {
        assert_true(p.chosen[t] >= 0 && p.chosen[t] < (int)p.n_candidates);
        const struct plan_candidate *c = &p.candidates[p.chosen[t]];
        assert_int_equal(c->family, p.tier[t].family);
        assert_true(p.predicted[t] > 0 && isfinite(p.predicted[t]));
        for (uint32_t k = 0; k < p.n_candidates; k++) /* nothing weighed for its resident set was faster */
            if (p.candidates[k].set == c->set && p.candidates[k].family != PLAN_CPU)
                assert_true(c->score[t] <= p.candidates[k].score[t]);
    }
    for (uint32_t i = 0; i < model.n_shards; i++) {
        for (int t = 1; t < PLAN_TIERS; t++)
            assert_int_equal(p.tier[0].shard[i] == PLACE_RESIDENT, p.tier[t].shard[i] == PLACE_RESIDENT);
        if (model.shards[i].kind == SHARD_ATTN) /* where its KV is, in every tier */
            assert_int_equal(p.tier[0].shard[i] != PLACE_CPU, p.kv_gpu[model.shards[i].layer]);
    }
    assert_true(p.predicted_ttft > 0 && p.predicted_decode > 0);
    /* pshard plan's breakdown: a row per tier, its step the plan's prediction (defaults as built). */
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    assert_non_null(out);
    plan_print_times(&p, &model, NULL, out);
    fclose(out);
    const char *row = strstr(text, "\n  1 ");
    assert_non_null(row);
    double step = 0, gpu = -1, cpu = -1, pcie = -1, waits = -1;
    assert_int_equal(sscanf(row, " 1 %lf %lf %lf %lf %lf", &step, &gpu, &cpu, &pcie, &waits), 5);
    assert_true(fabs(step - p.predicted[0] * 1e3) <= 0.01);
    assert_true(gpu >= 0 && cpu >= 0 && pcie >= 0 && waits >= 0 && gpu + cpu > 0);
    assert_non_null(strstr(text, "\n  256 "));
    free(text);
    plan_free(&p);
}

/* N requests at once (pshard plan --parallel N): their prompts go through steps that take the next
 * prompt's tokens where one ends, each token attending only its own sequence's cells, so four
 * 256-token prompts in one 1024-token step cost less than a 1024-token prompt's step; decode steps
 * carry a token of each. The plan prints the time until every prompt is read. */
static void test_request_mix_of_many(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    r.vram_budget = (int64_t)(fixed() + attention_and_kv(&model, 2048) + (24 << 20));
    r.n_seq = 4;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    assert_int_equal(p.n_seq, 4);
    struct profile prof;
    profile_defaults(&prof);
    prof.has_gpu = true;
    double four_ttft, four_decode, one_ttft, one_decode;
    cost_request(&prof, &model, &p, 256, 1024, 128, 4, &four_ttft, &four_decode);
    cost_request(&prof, &model, &p, 256, 1024, 128, 1, &one_ttft, &one_decode);
    struct cost_step whole;
    cost_plan_step(&prof, &model, &p, 1024, 0, &whole); /* one 1024-token prompt: attends more */
    assert_true(four_ttft > one_ttft && four_ttft < whole.seconds);
    struct cost_step four;
    cost_plan_step(&prof, &model, &p, 4, 256 + 64, &four);
    assert_true(four_decode > one_decode && fabs(four_decode / four.seconds - 1) < 0.05);
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    assert_non_null(out);
    plan_print(&p, &model, false, out);
    fclose(out);
    assert_non_null(strstr(text, "predicted for 4 requests at once"));
    assert_non_null(strstr(text, "4 times at once"));
    free(text);
    plan_free(&p);
}

/* The resident set: the soonest typical request, or within PLAN_SET_MARGIN of it the soonest
 * first token; checked against every set weighed, at budgets from tight to ample. */
static void test_auto_resident_set(void **state) {
    (void)state;
    int checked = 0;
    for (int mb = 8; mb <= 160; mb += 8) {
        struct plan p;
        struct plan_request r = base;
        r.vram_budget = (int64_t)(fixed_streaming() + attention_and_kv(&model, 2048)) + ((int64_t)mb << 20);
        assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
        if (p.n_candidates && p.chosen[0] >= 0 && p.candidates[p.chosen[0]].family != PLAN_CPU) {
            const int set = p.candidates[p.chosen[0]].set;
            double soonest = INFINITY;
            for (int s = 0; s < PLAN_SETS; s++)
                if (p.weighed_set[s].ttft > 0) soonest = fmin(soonest, p.weighed_set[s].ttft + 128 * p.weighed_set[s].decode);
            const double ttft = p.weighed_set[set].ttft, total = ttft + 128 * p.weighed_set[set].decode;
            assert_true(ttft > 0 && total <= soonest * (1 + PLAN_SET_MARGIN) + 1e-12);
            for (int s = 0; s < PLAN_SETS; s++) /* none as soon within the margin came first sooner */
                if (s != set && p.weighed_set[s].ttft > 0 &&
                    p.weighed_set[s].ttft + 128 * p.weighed_set[s].decode <= soonest * (1 + PLAN_SET_MARGIN))
                    assert_true(p.weighed_set[s].ttft >= ttft);
            for (int t = 0; t < PLAN_TIERS; t++) /* every tier over that set */
                assert_int_equal(p.candidates[p.chosen[t]].set, set);
            checked++;
        }
        plan_free(&p);
    }
    assert_true(checked > 4);
}

/* Phases: decode steps get a plan of their own over another resident set only for one sequence,
 * only where the request with both changes counted beats the one set by more than the margin;
 * its plan is that set's, and it is what the decode tiers choose and predict. The ring's set
 * decodes from the units it lends about as fast as the others while every layer's KV fits (2K):
 * a context of 8K, whose KV the sets keep in VRAM in different shares, has one budget where two
 * phases win. */
static void test_auto_phases(void **state) {
    (void)state;
    int two = 0, weighed = 0;
    for (int mb = 4; mb <= 200; mb += 4) {
        for (int variant = 0; variant < 4; variant++) {
            struct plan p;
            struct plan_request r = base;
            r.phases = variant != 1;
            r.n_seq = variant == 2 ? 2 : 1;
            r.n_ctx = variant == 3 ? 8192 : 2048;
            r.vram_budget = (int64_t)(fixed_streaming() + attention_and_kv(&model, 2048) * r.n_seq) + ((int64_t)mb << 20);
            assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
            const struct plan_phases *ph = &p.weighed_phases;
            if (variant == 1 || variant == 2) assert_null(p.decode), assert_false(ph->weighed);
            if (ph->weighed) {
                weighed++;
                const double one = p.weighed_set[ph->prompt].ttft + 128 * p.weighed_set[ph->prompt].decode;
                const double pair = p.weighed_set[ph->prompt].ttft + ph->to_decode + 128 * p.weighed_set[ph->decode].decode +
                                    ph->to_prompt;
                assert_true(ph->to_decode > 0 && ph->to_prompt > 0 && ph->prompt != ph->decode);
                assert_true((p.decode != NULL) == (pair < one * (1 - PLAN_SET_MARGIN)));
                assert_int_equal(p.candidates[p.chosen[plan_prompt_tier(&p)]].set, ph->prompt);
            }
            if (p.decode) {
                two++;
                assert_ptr_equal(plan_for_step(&p, 1, 1), p.decode);
                assert_ptr_equal(plan_for_step(&p, PLAN_PHASE_TOKENS, 1), &p);
                assert_null(p.decode->decode);
                for (int t = 0; t < PLAN_TIERS; t++) {
                    const enum plan_set set = plan_tier_tokens[t] < PLAN_PHASE_TOKENS ? ph->decode : ph->prompt;
                    assert_int_equal(p.candidates[p.chosen[t]].set, set);
                    assert_true(p.decode->chosen[t] >= 0 && p.decode->candidates[p.decode->chosen[t]].set == ph->decode);
                }
                assert_true(fabs(p.predicted[0] - p.decode->predicted[0]) <= 1e-12);
                const struct plan_budget *b = &p.decode->budget;
                assert_true(b->weights + b->kv + b->activations + b->work + b->blas + b->staging + b->mapping <= b->total);
                assert_true(b->total == p.budget.total);
            }
            plan_free(&p);
        }
    }
    fprintf(stderr, "phases weighed at %d budgets, two phases at %d\n", weighed, two);
    assert_true(weighed > 4 && two > 0);
}

/* The resident set a plan the step runs (p itself or p->decode) is over. */
static enum plan_set set_of(const struct plan *p, const struct plan *runs) {
    const int t = runs == p ? plan_prompt_tier(p) : PLAN_TIER_DECODE;
    return runs->candidates[runs->chosen[t]].set;
}

/* A decode token's predicted seconds over plan `runs` at a cache of c cells. */
static double decode_seconds(const struct profile *prof, const struct model *m, const struct plan *runs, int32_t c) {
    struct cost_step cs;
    cost_step(prof, m, runs, &runs->tier[PLAN_TIER_DECODE], 1, c - 1, &cs);
    return cs.seconds;
}

/* Bands: decode steps over long caches run over another set than short ones exactly from the
 * band's length on, where that set is predicted faster by more than the margin at every longer
 * length and the typical request's tokens pay for the changes there, not at the length before;
 * the decode plan serves the band (the prompt's set below it) or the caches below it (the prompt's
 * set from it on); the plan's prediction and choice at the end of the context are the plan that
 * runs there. Not without the switch, nor for two sequences. */
static void test_long_decode_band(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    int bands = 0, prompt_below = 0, prompt_above = 0;
    for (int ctx = 4096; ctx <= 16384; ctx *= 4) {
        for (int mb = 120; mb <= 480; mb += 4) {
            for (int variant = 0; variant < 4; variant++) {
                struct plan p;
                struct plan_request r = base;
                r.n_ctx = ctx, r.phases = true, r.long_decode = variant != 1;
                r.n_seq = variant == 2 ? 2 : 1;
                r.n_decode = variant == 3 ? 2 : 0; /* a request too short to pay for most changes */
                r.vram_budget = (int64_t)mb << 20;
                if (plan_build(&moe, &r, costs_for(&moe), &p) != PSHARD_OK) continue;
                const struct plan_band *b = &p.weighed_band;
                if (variant == 1 || variant == 2) assert_false(b->weighed);
                for (int t = 0; t < PLAN_TIERS; t++) /* prompt steps always run the prompt's plan */
                    if (plan_tier_tokens[t] >= PLAN_PHASE_TOKENS) assert_ptr_equal(plan_for_step(&p, plan_tier_tokens[t], ctx), &p);
                if (p.n_candidates && p.chosen[0] >= 0) {
                    const struct plan *end = plan_for_step(&p, 1, ctx);
                    assert_true(fabs(p.predicted[0] - decode_seconds(&prof, &moe, end, ctx)) <= 1e-12);
                    const int c = plan_step_candidate(&p, 1, ctx);
                    assert_true(c >= 0 && p.candidates[c].key[0] == plan_tier_key(end, 0));
                }
                if (!b->weighed) {
                    plan_free(&p);
                    continue;
                }
                bands++;
                const int32_t n_prompt = plan_typical_prompt(ctx), n_out = p.n_decode;
                assert_non_null(p.decode);
                assert_true(b->set != b->below && b->from >= n_prompt + n_out && b->from <= ctx);
                const struct plan *lo = plan_for_step(&p, 1, b->from - 1), *hi = plan_for_step(&p, 1, b->from);
                assert_ptr_not_equal(lo, hi);
                assert_int_equal(set_of(&p, lo), b->below);
                assert_int_equal(set_of(&p, hi), b->set);
                assert_ptr_equal(plan_for_step(&p, 1, ctx), hi);
                assert_ptr_equal(plan_for_step(&p, PLAN_PHASE_TOKENS - 1, b->from), hi);
                if (lo == &p) prompt_below++, assert_true(p.decode_from == b->from && p.decode_until == INT32_MAX);
                else prompt_above++, assert_true(p.decode_from == 0 && p.decode_until == b->from);
                /* faster by the margin from `from` to the context's end, and paying there */
                assert_true(fabs(decode_seconds(&prof, &moe, lo, b->from) - b->below_s) <= 1e-12);
                assert_true(fabs(decode_seconds(&prof, &moe, hi, b->from) - b->set_s) <= 1e-12);
                assert_true(b->set_s < b->below_s * (1 - PLAN_SET_MARGIN));
                assert_true(decode_seconds(&prof, &moe, hi, ctx) < decode_seconds(&prof, &moe, lo, ctx) * (1 - PLAN_SET_MARGIN));
                assert_true(b->to_long > 0 && n_out * (b->below_s - b->set_s) > b->to_long + b->back);
                /* A call's mean decode step: within one plan below the band, between its first
                 * and last step's; across the band, two plans (so it teaches nothing). */
                struct cost_step mean, first, last;
                bool one;
                cost_decode_mean(&prof, &moe, &p, b->from - 200, 100, &mean, &one);
                cost_plan_step(&prof, &moe, &p, 1, b->from - 200, &first);
                cost_plan_step(&prof, &moe, &p, 1, b->from - 101, &last);
                assert_true(one);
                assert_true(mean.seconds >= fmin(first.seconds, last.seconds) - 1e-12 &&
                            mean.seconds <= fmax(first.seconds, last.seconds) + 1e-12);
                cost_decode_mean(&prof, &moe, &p, b->from - 50, 100, &mean, &one);
                assert_false(one);
                cost_decode_mean(&prof, &moe, &p, b->from, 0, &mean, &one); /* no decode step: the first's */
                cost_plan_step(&prof, &moe, &p, 1, b->from, &first);
                assert_true(one && fabs(mean.seconds - first.seconds) <= 1e-15);
                /* not so at the grid's length before (changes cost less over a shorter cache) */
                const double lo_c = n_prompt + n_out, step = pow((double)ctx / lo_c, 1.0 / (PLAN_BAND_STEPS - 1));
                const int32_t before = (int32_t)lround(b->from / step);
                if (before >= lo_c) {
                    const double s_lo = decode_seconds(&prof, &moe, lo, before), s_hi = decode_seconds(&prof, &moe, hi, before);
                    assert_false(s_hi < s_lo * (1 - PLAN_SET_MARGIN) && n_out * (s_lo - s_hi) > b->to_long + b->back);
                }
                plan_free(&p);
            }
        }
    }
    fprintf(stderr, "bands at %d budgets: %d over the prompt's set below, %d above\n", bands, prompt_below, prompt_above);
    assert_true(bands > 0);
}

/* Experts: resident evenly over the layers, the rest split by the stream share (dynamic) or on
 * the CPU (static); the router stays resident. */
/* Room for 15 experts beyond tiny-moe's dense part, the routers and the staging slots (a piece
 * is every expert of this tiny model): 8 layers get 1 or 2 each. *m0_out: its first MoE shard,
 * *slot_out: the staging slot's size. */
static int64_t moe_split_budget(const struct shard **m0_out, uint64_t *slot_out) {
    const struct shard *m0 = NULL;
    uint64_t shared = 0;
    for (uint32_t i = 0; i < moe.n_shards; i++)
        if (moe.shards[i].kind == SHARD_MOE) {
            m0 = &moe.shards[i];
            shared += m0->weight_bytes - (uint64_t)m0->n_expert * m0->expert_bytes;
        }
    assert_non_null(m0);
    uint64_t everything = 0;
    for (uint32_t i = 0; i < moe.n_shards; i++)
        if (moe.shards[i].kind != SHARD_MOE && moe.shards[i].kind != SHARD_EMBED)
            everything += moe.shards[i].weight_bytes + moe.shards[i].kv_bytes_per_token * 2048;
    uint64_t slot = plan_unit_bytes(m0, m0->n_expert);
    for (uint32_t i = 0; i < moe.n_shards; i++)
        if (moe.shards[i].kind == SHARD_ATTN && plan_unit_bytes(&moe.shards[i], 0) > slot)
            slot = plan_unit_bytes(&moe.shards[i], 0);
    *m0_out = m0;
    *slot_out = slot;
    return (int64_t)(fixed_streaming() + everything + shared + 15 * m0->expert_bytes + PLAN_MIN_SLOTS * slot + 4096);
}

/* Lending expert pieces (plan.experts_lent): an MoE shard's pieces go through the ring from its
 * highest experts down, so the pieces among the ring's last units are, in each layer, the range
 * just past its resident experts; tiers without the ring compute those from the slots (in VRAM,
 * split or not), ring tiers stage them as before, and the cost model takes them as resident. */
static void test_lent_experts(void **state) {
    (void)state;
    /* qwen30b's shape in two layers, Q2_K experts: a layer's experts take several pieces */
    char path[256], cmd[640];
    snprintf(path, sizeof path, "/tmp/pshard-test-lent-%d.gguf", (int)getpid());
    const char *build = getenv("PSHARD_BUILD_DIR");
    snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape qwen30b --layers 2 --vocab 259 --expert-type Q2_K --quiet -o '%s'",
             build ? build : ".", path);
    struct gguf_file *f = NULL;
    struct model big;
    assert_int_equal(system(cmd), 0);
    assert_int_equal(gguf_open(path, &f), PSHARD_OK);
    assert_int_equal(model_load(f, &big), PSHARD_OK);
    unlink(path); /* (mapped: gone once closed, whatever fails below) */
    struct plan_request r = base;
    r.family = PLAN_DYNAMIC;
    r.stream_share = 0.25f;
    r.vram_budget = 520ll << 20;
    struct plan p;
    assert_int_equal(plan_build(&big, &r, costs_for(&big), &p), PSHARD_OK);
    assert_non_null(p.experts_lent);
    assert_true(plan_lends(&p) && p.n_slots > 0);
    int ring = -1;
    for (int t = PLAN_TIERS - 1; t >= 0; t--) ring = p.tier[t].ring ? t : ring;
    assert_true(ring > 0);
    struct plan_unit *units = malloc(sizeof *units * plan_ring_units_max(&p));
    assert_non_null(units);
    const uint32_t n = plan_ring_units(&p, &big, &p.tier[ring], units);
    assert_true(n > p.n_slots);
    uint32_t lent_total = 0, lent_units = 0, after = 0;
    for (uint32_t j = 0; j < n; j++) {
        const struct shard *s = &big.shards[units[j].shard];
        const bool last = j >= n - p.n_slots;
        assert_int_equal(plan_unit_lent(&p, &big, &units[j]), last && (s->kind == SHARD_MOE || p.lent[units[j].shard]));
        if (s->kind != SHARD_MOE) continue;
        if (j + 1 < n && units[j + 1].shard == units[j].shard) { /* a layer's pieces: highest first */
            assert_int_equal(units[j + 1].end, units[j].first);
            after++;
        } else {
            assert_int_equal(units[j].first, p.experts_resident[s->layer]); /* its last follows the resident */
        }
        if (last) lent_units++, lent_total += units[j].end - units[j].first;
    }
    assert_true(after > 0 && lent_units > 0); /* several pieces a layer, some lent */
    uint32_t sum = 0;
    for (uint32_t l = 0; l < big.hp.n_layers; l++) sum += p.experts_lent[l];
    assert_int_equal(sum, lent_total);
    const struct plan_tier *d = &p.tier[PLAN_TIER_DECODE];
    assert_false(d->ring);
    for (uint32_t i = 0; i < big.n_shards; i++) {
        const struct shard *s = &big.shards[i];
        if (s->kind != SHARD_MOE) continue;
        const uint32_t l = s->layer, r0 = p.experts_resident[l], lent = p.experts_lent[l];
        assert_true(r0 + lent <= s->n_expert);
        assert_int_equal(plan_experts_vram(&p, &p.tier[ring], l), r0); /* the ring stages them */
        assert_int_equal(p.tier[ring].experts_gpu[l], s->n_expert);
        assert_int_equal(plan_experts_vram(&p, d, l), r0 + lent);
        /* the split starts past them: the same share of what is left */
        assert_int_equal(d->experts_gpu[l] - r0 - lent, (uint32_t)lroundf(0.25f * (float)(s->n_expert - r0 - lent)));
    }
    /* The same tier with nothing lent reads those experts in place: its bytes a token move from
     * VRAM to host memory, and the cost model finds its step slower. */
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    struct cost_step ca, cb;
    cost_step(&prof, &big, &p, d, 1, 1000, &cb);
    uint32_t *given = p.experts_lent, *none = calloc(big.hp.n_layers, sizeof *none);
    assert_non_null(none);
    p.experts_lent = none;
    struct plan_tier a = *d;
    plan_tier_account(&big, &p, &a);
    cost_step(&prof, &big, &p, d, 1, 1000, &ca);
    p.experts_lent = given;
    free(none);
    assert_true(d->gpu_bytes_per_token > a.gpu_bytes_per_token);
    assert_true(d->host_bytes_per_token + d->pcie_bytes_per_token < a.host_bytes_per_token + a.pcie_bytes_per_token);
    assert_int_equal(d->host_bytes_per_token + d->pcie_bytes_per_token + d->gpu_bytes_per_token,
                     a.host_bytes_per_token + a.pcie_bytes_per_token + a.gpu_bytes_per_token);
    assert_true(cb.seconds < ca.seconds);
    /* static over the ring's room: the lent experts leave the CPU for the GPU's one call */
    plan_free(&p);
    r.family = PLAN_STATIC;
    r.staging = PLAN_SET_RING;
    r.stream_share = 0;
    assert_int_equal(plan_build(&big, &r, costs_for(&big), &p), PSHARD_OK);
    assert_false(p.tier[0].ring);
    uint32_t lent_static = 0;
    for (uint32_t l = 0; l < big.hp.n_layers; l++) {
        lent_static += p.experts_lent[l];
        assert_int_equal(p.tier[0].experts_gpu[l], p.experts_resident[l] + p.experts_lent[l]);
    }
    assert_true(lent_static > 0);
    free(units);
    plan_free(&p);
    model_free(&big);
    gguf_close(f);
}

static void test_moe_experts_by_range(void **state) {
    (void)state;
    struct plan_request r = base;
    struct plan p;
    const struct shard *m0;
    uint64_t slot;
    r.family = PLAN_DYNAMIC;
    r.stream_share = 0.25f;
    r.vram_budget = moe_split_budget(&m0, &slot);
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
    if (p.n_slots > PLAN_MIN_SLOTS) { /* a budget this size gets the deeper ring: give it the room */
        r.vram_budget += (int64_t)((p.n_slots - PLAN_MIN_SLOTS) * slot);
        plan_free(&p);
        assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
    }
    assert_true(p.budget.staging > 0);
    uint32_t total = 0;
    for (uint32_t l = 0; l < moe.hp.n_layers; l++) {
        const uint32_t res = p.experts_resident[l];
        total += res;
        assert_true(res == 1 || res == 2);
        /* (past the experts resident and those lent from the ring's slots) */
        const uint32_t dec = p.tier[PLAN_TIER_DECODE].experts_gpu[l], vram = plan_experts_vram(&p, &p.tier[PLAN_TIER_DECODE], l);
        assert_int_equal(vram, res + p.experts_lent[l]);
        assert_int_equal(dec, vram + (uint32_t)lroundf(0.25f * (float)(m0->n_expert - vram)));
        assert_int_equal(p.tier[plan_prompt_tier(&p)].experts_gpu[l], m0->n_expert); /* prompts stream the rest */
    }
    assert_true(total == 15);
    assert_int_equal(p.slot_bytes, slot);
    assert_false(p.tier[PLAN_TIER_DECODE].all_gpu);
    assert_true(p.tier[PLAN_TIER_DECODE].host_bytes_per_token > 0 && p.tier[PLAN_TIER_DECODE].pcie_bytes_per_token > 0);
    assert_true(used(&p) <= p.budget.total);
    plan_free(&p);

    r.family = PLAN_STATIC;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
    for (uint32_t l = 0; l < moe.hp.n_layers; l++)
        assert_int_equal(p.tier[PLAN_TIER_DECODE].experts_gpu[l], p.experts_resident[l]);
    assert_int_equal(p.tier[PLAN_TIER_DECODE].pcie_bytes_per_token, 0);
    plan_free(&p);
}

/* An MoE layer's router is what lets the GPU take its experts at all, so every layer's comes
 * before any attention matrix or the head, however these weigh per byte (qwen235b at 2 GB kept one
 * router of 94 and computed the other layers' experts on the CPU, prompts included). Over budgets
 * from the least a dynamic plan takes to room for everything, with the CPU's attention slow (so
 * attention weighs the most per byte): wherever an attention matrix or the head is resident,
 * every MoE layer is on the GPU, and with the ring streams all its experts in prompts. */
static void test_moe_routers_first(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_attn[i] *= 100;
    uint64_t everything = 0, step = UINT64_MAX;
    for (uint32_t i = 0; i < moe.n_shards; i++) {
        everything += moe.shards[i].weight_bytes + moe.shards[i].kv_bytes_per_token * 2048;
        if (moe.shards[i].kind == SHARD_MOE && moe.shards[i].expert_bytes) {
            const uint64_t router = moe.shards[i].weight_bytes - (uint64_t)moe.shards[i].n_expert * moe.shards[i].expert_bytes;
            if (router / 2 < step) step = router / 2;
        }
    }
    struct plan_request r = base;
    r.family = PLAN_DYNAMIC;
    r.profile = &prof;
    int built = 0, some_attention = 0;
    for (uint64_t budget = fixed_streaming(); budget < fixed_streaming() + everything; budget += step) {
        r.vram_budget = (int64_t)budget;
        struct plan p;
        if (plan_build(&moe, &r, costs_for(&moe), &p) != PSHARD_OK) continue;
        built++;
        const struct plan_tier *prompt = &p.tier[plan_prompt_tier(&p)];
        bool dense_resident = false, routers_all = true;
        for (uint32_t i = 0; i < moe.n_shards; i++) {
            const struct shard *s = &moe.shards[i];
            if (s->kind == SHARD_MOE)
                routers_all &= prompt->shard[i] != PLACE_CPU && (!p.n_slots || prompt->experts_gpu[s->layer] == s->n_expert);
            else if (s->kind != SHARD_EMBED)
                dense_resident |= prompt->shard[i] == PLACE_RESIDENT;
        }
        some_attention += dense_resident;
        assert_true(!dense_resident || routers_all);
        assert_true(used(&p) <= p.budget.total);
        plan_free(&p);
    }
    assert_true(built > 10 && some_attention > 0);
}

/* A split MoE layer's experts read in place beside the CPU's take the expert kernel's measured
 * shares (expert_reads_share_under_cpu, cpu_share_under_expert_reads), not the dense kernel's:
 * lowering them slows both sides of tiny-moe's decode step, and lowering the dense pair does not. */
/* tiny-moe, dynamic at share 0.5 at a budget where its MoE layers split with the CPU. */
static void split_moe_plan(const struct profile *prof, struct plan *p) {
    struct plan_request r = base;
    const struct shard *m0;
    uint64_t slot;
    r.family = PLAN_DYNAMIC;
    r.stream_share = 0.5f;
    r.vram_budget = moe_split_budget(&m0, &slot);
    r.profile = prof;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), p), PSHARD_OK);
}

static void test_cost_expert_reads_beside_cpu(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    prof.host_read_gbps = 1e6; /* no shared ceiling: the shares alone */
    prof.launch_s = 0;         /* the GPU's side is its kernels, not the host's launches */
    struct plan p;
    split_moe_plan(&prof, &p);
    const struct plan_tier *t = &p.tier[PLAN_TIER_DECODE];
    assert_false(t->ring);
    assert_true(t->host_bytes_per_token > 0 && t->pcie_bytes_per_token > 0); /* split, read in place */
    prof.expert_reads_share_under_cpu = prof.cpu_share_under_expert_reads = 1;
    prof.reads_share_under_cpu = prof.cpu_share_under_reads = 1;
    struct cost_step alone, dense_low, expert_low;
    cost_step(&prof, &moe, &p, t, 1, 1000, &alone);
    prof.reads_share_under_cpu = prof.cpu_share_under_reads = 0.5;
    cost_step(&prof, &moe, &p, t, 1, 1000, &dense_low);
    assert_true(fabs(dense_low.gpu_s - alone.gpu_s) < 1e-12 && fabs(dense_low.cpu_s - alone.cpu_s) < 1e-12);
    prof.expert_reads_share_under_cpu = prof.cpu_share_under_expert_reads = 0.5;
    cost_step(&prof, &moe, &p, t, 1, 1000, &expert_low);
    assert_true(expert_low.gpu_s > alone.gpu_s && expert_low.cpu_s > alone.cpu_s);
    assert_true(expert_low.seconds > alone.seconds);
    plan_free(&p);
}

/* A ring tier's copies run on their own clock in MoE layers too: where the copies are the longer
 * side, more GPU work (attention twice as slow) hides behind them instead of adding to the step. */
static void test_cost_moe_ring_copies_hide_gpu_work(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    for (int i = 0; i < PROFILE_SIZES; i++) prof.h2d_gbps[i] = 0.5; /* copies the longer side */
    struct plan_request r = base;
    const struct shard *m0;
    uint64_t slot;
    r.family = PLAN_GPU;
    r.vram_budget = moe_split_budget(&m0, &slot);
    r.profile = &prof;
    struct plan p;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
    const struct plan_tier *t = &p.tier[plan_prompt_tier(&p)];
    assert_true(t->ring);
    struct cost_step a, b;
    cost_step(&prof, &moe, &p, t, 64, 1000, &a);
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.gpu_attn[i] *= 2;
    cost_step(&prof, &moe, &p, t, 64, 1000, &b);
    assert_true(b.gpu_s > a.gpu_s);
    assert_true(a.pcie_s > a.gpu_s);
    assert_true(b.seconds - a.seconds < 0.1 * (b.gpu_s - a.gpu_s));
    plan_free(&p);
}

/* Launches and hand-offs in the cost model: a one-token step whose shards are all on the GPU is
 * replayed as a graph (launch latency does not pace it; its split MoE layers meet the host at
 * the graph's hand-off), a two-token step is launched kernel by kernel (paced by launches; the
 * event hand-off). */
/* GPU attention in the cost model follows the executor's kernel (plan_kernels, by the rule of
 * cuda_attention_prefill_pays): a split-KV step pays the profile's fixed part once per layer and
 * takes the split-KV points' rate; a prompt-kernel step pays no fixed part, takes the prompt
 * kernel's rate (its points from PROFILE_PROMPT_ATTN tokens) and, below a full tile, costs what a
 * tile of 64 queries does. */
static void test_cost_attention_call(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    prof.launch_s = 0; /* launched steps are paced by their kernels, not by the host's launches */
    struct plan_request r = base;
    r.family = PLAN_GPU;
    r.vram_budget = -1; /* everything resident */
    r.profile = &prof;
    struct plan p;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    uint32_t layers = 0;
    double kv = 0;
    for (uint32_t i = 0; i < model.n_shards; i++) {
        layers += model.shards[i].kind == SHARD_ATTN;
        kv += (double)model.shards[i].kv_bytes_per_token;
    }
    const struct cuda_attn_shape shape = {(int)model.hp.n_head, (int)model.hp.n_head_kv, (int)model.hp.head_dim_k,
                                          (int)model.hp.head_dim_v, 1};
    static const int32_t steps[] = {1, 4, 16, 40, 63, 64, 256};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        const int32_t n = steps[k];
        const bool prompt = cuda_attention_prefill_pays(&shape, n);
        if (n < 8) assert_false(prompt); /* a few tokens: always the split-KV kernel */
        const struct plan_tier *t = plan_tier_for(&p, n);
        struct cost_step a, b, c;
        prof.gpu_attn_call_s = 0;
        cost_step(&prof, &model, &p, t, n, 1000, &a);
        prof.gpu_attn_call_s = 1e-4;
        cost_step(&prof, &model, &p, t, n, 1000, &b);
        assert_true(fabs(b.seconds - a.seconds - (prompt ? 0 : layers * 1e-4)) < 1e-9);
        /* One kernel's rates changed by d: the step's time by what it reads at the new rate. */
        prof.gpu_attn_call_s = 0;
        const double d = 1e-12;
        for (int i = 0; i < PROFILE_TOKENS; i++)
            if ((profile_tokens[i] >= PROFILE_PROMPT_ATTN) == prompt) prof.gpu_attn[i] += d, prof.gpu_attn_long[i] += d;
        cost_step(&prof, &model, &p, t, n, 1000, &c);
        const double tokens = prompt && n < PROFILE_PROMPT_ATTN ? PROFILE_PROMPT_ATTN : n;
        const double want = tokens * (1000 + (n + 1) / 2.0) * kv * d;
        assert_true(fabs(c.seconds - a.seconds - want) < 1e-9 * want);
        for (int i = 0; i < PROFILE_TOKENS; i++)
            if ((profile_tokens[i] >= PROFILE_PROMPT_ATTN) == prompt) prof.gpu_attn[i] -= d, prof.gpu_attn_long[i] -= d;
    }
    plan_free(&p);
}

/* The CPU's attention reads each KV head once per query head it serves: its time is the rate
 * per query head's KV byte times the KV bytes times the query heads per KV head. */
static void test_cost_cpu_attention_per_query_head(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    struct plan_request r = base;
    r.family = PLAN_CPU;
    r.profile = &prof;
    struct plan p;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    const double group = (double)model.hp.n_head / model.hp.n_head_kv;
    assert_true(model.hp.n_head_kv > 0 && fabs(cost_query_heads_per_kv(&model) - group) < 1e-12);
    double kv = 0;
    for (uint32_t i = 0; i < model.n_shards; i++) kv += (double)model.shards[i].kv_bytes_per_token;
    struct cost_step a, b;
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_attn[i] = 1e-11;
    cost_step(&prof, &model, &p, &p.tier[PLAN_TIER_DECODE], 1, 1000, &a);
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.cpu_attn[i] = 2e-11;
    cost_step(&prof, &model, &p, &p.tier[PLAN_TIER_DECODE], 1, 1000, &b);
    /* (the step attends its own cell too) */
    assert_true(fabs((b.seconds - a.seconds) / (1000 * kv * group * 1e-11) - 1) < 0.005);
    plan_free(&p);
}

static void test_cost_launches_and_hand_offs(void **state) {
    (void)state;
    struct profile base_prof;
    plan_profile(NULL, &base_prof); /* the defaults, with a GPU */
    struct plan_request r = base;
    r.family = PLAN_STATIC;
    r.profile = &base_prof;
    uint64_t room = fixed_streaming() + 4096; /* every shard's always-used part and two experts a layer */
    for (uint32_t i = 0; i < moe.n_shards; i++) {
        const struct shard *s = &moe.shards[i];
        if (s->kind == SHARD_MOE) room += s->weight_bytes - (uint64_t)s->n_expert * s->expert_bytes + 2 * s->expert_bytes;
        else if (s->kind != SHARD_EMBED) room += s->weight_bytes + s->kv_bytes_per_token * 2048;
    }
    r.vram_budget = (int64_t)room;
    struct plan p;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
    const struct plan_tier *t = &p.tier[PLAN_TIER_DECODE];
    assert_true(t->shards_gpu && !t->all_gpu && !t->ring); /* experts split with the CPU */
    uint32_t split = 0;
    for (uint32_t l = 0; l < moe.hp.n_layers; l++) split += t->experts_gpu[l] < moe.hp.n_expert;
    assert_true(split > 0);

    struct cost_step one, two, one_slow, two_slow;
    cost_step(&base_prof, &moe, &p, t, 1, 100, &one);
    cost_step(&base_prof, &moe, &p, t, 2, 100, &two);
    struct profile prof = base_prof;
    const double extra = 1e-3;
    prof.launch_s += extra;
    cost_step(&prof, &moe, &p, t, 1, 100, &one_slow);
    cost_step(&prof, &moe, &p, t, 2, 100, &two_slow);
    assert_true(one_slow.seconds - one.seconds <= 2 * extra);               /* at most the upload of x */
    assert_true(two_slow.seconds - two.seconds >= moe.n_shards / 2 * extra); /* every shard's launches */

    prof = base_prof;
    prof.graph_round_trip_s += extra;
    cost_step(&prof, &moe, &p, t, 1, 100, &one_slow);
    cost_step(&prof, &moe, &p, t, 2, 100, &two_slow);
    assert_true(one_slow.seconds - one.seconds >= 0.99 * split * extra);
    assert_true(two_slow.seconds == two.seconds);
    prof = base_prof;
    prof.round_trip_s += extra;
    cost_step(&prof, &moe, &p, t, 1, 100, &one_slow);
    cost_step(&prof, &moe, &p, t, 2, 100, &two_slow);
    assert_true(one_slow.seconds == one.seconds);
    /* Less a little: where the later side was in doubt, the expected wait for it (cost.c,
     * later_side) already held part of what a side known to be later adds. */
    assert_true(two_slow.seconds - two.seconds >= 0.95 * split * extra);
    plan_free(&p);
}

/* The MB figure after `words` in the last error. */
static int64_t named_mb(const char *words) {
    const char *at = strstr(pshard_last_error(), words);
    assert_non_null(at);
    return strtoll(at + strlen(words), NULL, 10);
}

/* A budget too small names the minimum: the named budget builds, one MB less does not. */
static void test_too_small_names_the_minimum(void **state) {
    (void)state;
    static const struct {
        enum plan_family family;
        int set; /* plan_request.staging: -1, or a PLAN_SET_* */
        const char *words;
    } cases[] = {{PLAN_STATIC, -1, "minimum for this model and context is "},
                 {PLAN_DYNAMIC, PLAN_SET_RING, "minimum for this model and context is "},
                 {PLAN_GPU, -1, "gpu plan needs at least "},
                 {PLAN_STATIC, PLAN_SET_ALL_KV, "static plan needs at least "}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct plan p;
        struct plan_request r = base;
        r.family = cases[i].family, r.staging = cases[i].set;
        r.vram_budget = 1 << 20;
        assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_ERR_RANGE);
        const int64_t mb = named_mb(cases[i].words);
        r.vram_budget = mb << 20;
        assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
        plan_free(&p);
        r.vram_budget = (mb - 1) << 20;
        assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_ERR_RANGE);
    }
}

/* The cost model: more VRAM never predicts a slower gpu plan; learning from measured steps
 * scales later predictions by measured over predicted, within bounds. */
/* Weights read in place cost the profile's aligned rates where the model's lie on 128 bytes, its
 * off-alignment rates (zero_copy_off) otherwise. */
static void test_in_place_rates_follow_alignment(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.zero_copy_off[i] = 2 * prof.zero_copy[i];
    struct plan_request r = small_request(PLAN_GPU, &prof);
    struct plan p;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &p), PSHARD_OK);
    struct model aligned = model, off = model, next_line = model;
    aligned.weights_skew = 0, off.weights_skew = 96, next_line.weights_skew = 128;
    struct cost_step a, o, n;
    cost_step(&prof, &aligned, &p, &p.tier[0], 1, 1000, &a);
    cost_step(&prof, &off, &p, &p.tier[0], 1, 1000, &o);
    cost_step(&prof, &next_line, &p, &p.tier[0], 1, 1000, &n);
    assert_true(a.pcie_s > 0);
    /* PCIe time is the reads (twice as long) and the activations' crossings (the same). */
    assert_true(o.pcie_s > 1.99 * a.pcie_s && o.pcie_s <= 2 * a.pcie_s && o.seconds > a.seconds);
    assert_true(n.seconds == a.seconds);
    plan_free(&p);
}

static void test_cost_model_and_learning(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    struct plan_request r = base;
    r.family = PLAN_DYNAMIC;
    r.profile = &prof;
    struct plan small, large;
    r.vram_budget = small_budget();
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &small), PSHARD_OK);
    r.vram_budget = (int64_t)(fixed() + attention_and_kv(&model, 2048) + (64 << 20));
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &large), PSHARD_OK);
    struct cost_step a, b;
    cost_step(&prof, &model, &small, &small.tier[0], 1, 1000, &a);
    cost_step(&prof, &model, &large, &large.tier[0], 1, 1000, &b);
    assert_true(a.seconds > 0 && b.seconds > 0 && b.seconds < a.seconds); /* less streamed */
    assert_true(a.pcie_s > b.pcie_s);
    assert_true(a.seconds == a.raw_seconds);

    cost_learn(&prof, &model, PLAN_GPU, 1, a.raw_seconds, 2 * a.raw_seconds);
    struct cost_step c;
    cost_step(&prof, &model, &small, &small.tier[0], 1, 1000, &c);
    assert_true(fabs(c.seconds / (2 * a.raw_seconds) - 1) < 1e-9 && c.raw_seconds == a.raw_seconds);
    cost_learn(&prof, &model, PLAN_GPU, 1, a.raw_seconds, a.raw_seconds); /* a running mean: (2 + 1) / 2 */
    assert_true(fabs(prof.refine[0].scale[PLAN_GPU][0] - 1.5) < 1e-12);
    cost_learn(&prof, &model, PLAN_GPU, 100, 1.0, 1000.0); /* bounded; steps of 64-255 tokens */
    assert_true(prof.refine[0].scale[PLAN_GPU][3] == 4 && prof.refine[0].scale[PLAN_GPU][2] == 0 &&
                prof.refine[0].scale[PLAN_GPU][4] == 0);
    cost_step(&prof, &model, &small, plan_tier_for(&small, 100), 100, 0, &c); /* steps scale by their size's own */
    assert_true(fabs(c.seconds / c.raw_seconds - 4) < 1e-9);
    cost_step(&prof, &model, &small, plan_tier_for(&small, 512), 512, 0, &c);
    assert_true(c.seconds == c.raw_seconds);
    cost_learn(&prof, &model, PLAN_STATIC, 1, 0, 1.0); /* nothing to learn from */
    assert_true(prof.refine[0].scale[PLAN_STATIC][0] == 0);
    /* A GPU family not run at a size takes the others' (geometric) mean there, so one family's
     * measurement does not make the unmeasured ones look faster; the CPU plan keeps its own. */
    struct plan st;
    r.family = PLAN_STATIC;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &st), PSHARD_OK);
    cost_step(&prof, &model, &st, &st.tier[0], 1, 1000, &c);
    assert_true(fabs(c.seconds / c.raw_seconds - 1.5) < 1e-9);
    cost_learn(&prof, &model, PLAN_DYNAMIC, 1, 1.0, 3.375);
    cost_step(&prof, &model, &st, &st.tier[0], 1, 1000, &c);
    assert_true(fabs(c.seconds / c.raw_seconds - 2.25) < 1e-9); /* sqrt(1.5 * 3.375) */
    cost_learn(&prof, &model, PLAN_STATIC, 1, 1.0, 1.0);
    cost_step(&prof, &model, &st, &st.tier[0], 1, 1000, &c);
    assert_true(fabs(c.seconds / c.raw_seconds - 1) < 1e-9); /* its own, once run */
    plan_free(&st);
    struct plan cpu;
    r.family = PLAN_CPU;
    assert_int_equal(plan_build(&model, &r, costs_for(&model), &cpu), PSHARD_OK);
    cost_step(&prof, &model, &cpu, &cpu.tier[0], 1, 1000, &c);
    assert_true(c.seconds == c.raw_seconds);
    plan_free(&cpu);

    /* What one model taught stays with it: another model's steps are not scaled. */
    struct model other = model;
    snprintf(other.hp.arch_name, sizeof other.hp.arch_name, "other");
    cost_step(&prof, &other, &small, &small.tier[0], 1, 1000, &c);
    assert_true(c.seconds == c.raw_seconds);
    /* Up to PROFILE_MODELS models are kept; a new one past that replaces the oldest. */
    for (int i = 0; i < PROFILE_MODELS; i++) {
        snprintf(other.hp.arch_name, sizeof other.hp.arch_name, "other%d", i);
        cost_learn(&prof, &other, PLAN_GPU, 1, 1.0, 3.0);
    }
    assert_true(prof.refine[PROFILE_MODELS - 1].scale[PLAN_GPU][0] == 3);
    cost_step(&prof, &model, &small, &small.tier[0], 1, 1000, &c); /* the first model's entry went */
    assert_true(c.seconds == c.raw_seconds);
    cost_step(&prof, &other, &small, &small.tier[0], 1, 1000, &c);
    assert_true(fabs(c.seconds / c.raw_seconds - 3) < 1e-9);
    plan_free(&small);
    plan_free(&large);
}

/* dynamic without a share balances streaming against the CPU from the profile: equal costs per
 * byte stream half of what is not resident, a CPU three times slower than the stream three
 * quarters. */
static void test_dynamic_balances_from_the_profile(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    const char *type = NULL;
    for (uint32_t i = 0; i < moe.n_shards && !type; i++)
        for (uint32_t k = 0; k < moe.shards[i].n_tensors; k++)
            if (moe.shards[i].tensors[k]->n_dims == 3) type = quant_type_name(moe.shards[i].tensors[k]->type);
    assert_non_null(type);
    struct profile_rate *cpu = profile_rate_add(prof.cpu_experts, type);
    assert_non_null(cpu);
    struct plan_request r = base;
    r.family = PLAN_DYNAMIC;
    r.profile = &prof;
    /* Room for everything but most experts (as in test_moe_experts_by_range). */
    uint64_t room = fixed_streaming() + 4096;
    for (uint32_t i = 0; i < moe.n_shards; i++) {
        const struct shard *s = &moe.shards[i];
        if (s->kind == SHARD_MOE) room += s->weight_bytes - (uint64_t)s->n_expert * s->expert_bytes + 2 * s->expert_bytes +
                                          PLAN_STAGING_SLOTS * plan_unit_bytes(s, s->n_expert);
        else if (s->kind != SHARD_EMBED) room += s->weight_bytes + s->kv_bytes_per_token * 2048;
    }
    r.vram_budget = (int64_t)room;
    static const double cpu_over_stream[] = {1, 3};
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < PROFILE_TOKENS; i++)
            cpu->s_per_byte[i] = cpu_over_stream[c] * prof.zero_copy_experts[0], prof.zero_copy_experts[i] = prof.zero_copy_experts[0];
        struct plan p;
        assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
        const double share = cpu_over_stream[c] / (cpu_over_stream[c] + 1);
        int checked = 0;
        for (uint32_t l = 0; l < moe.hp.n_layers; l++) {
            if (p.tier[0].shard[2 * l + 2] == PLACE_CPU) continue; /* an MoE shard not on the GPU */
            const uint32_t res = p.experts_resident[l], E = moe.hp.n_expert;
            assert_int_equal(p.tier[0].experts_gpu[l], res + (uint32_t)lroundf((float)share * (float)(E - res)));
            checked++;
        }
        assert_true(checked > 0);
        plan_free(&p);
    }
}

/* Routed tiers: balanced dynamic one-token tiers split each token's experts by its routing, by
 * the quota the cost model finds least, which it predicts no slower than the range split. */
static void test_routed_split(void **state) {
    (void)state;
    const int32_t ids[4] = {5, 1, 9, 12};
    uint8_t quota[PLAN_MAX_ROUTED + 1] = {0};
    bool gpu[4];
    quota[3] = 2; /* three past the resident four: the GPU reads the first two in routing order */
    plan_routed_split(ids, 4, 4, quota, gpu);
    assert_true(gpu[0] && !gpu[1] && gpu[2] && !gpu[3]);
    quota[3] = 0;
    plan_routed_split(ids, 4, 4, quota, gpu);
    assert_true(!gpu[0] && !gpu[1] && !gpu[2] && !gpu[3]);

    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    const char *type = NULL;
    for (uint32_t i = 0; i < moe.n_shards && !type; i++)
        for (uint32_t k = 0; k < moe.shards[i].n_tensors; k++)
            if (moe.shards[i].tensors[k]->n_dims == 3) type = quant_type_name(moe.shards[i].tensors[k]->type);
    struct profile_rate *cpu = profile_rate_add(prof.cpu_experts, type);
    assert_non_null(cpu);
    struct plan_request r = base;
    const struct shard *m0;
    uint64_t slot;
    r.family = PLAN_DYNAMIC;
    r.vram_budget = moe_split_budget(&m0, &slot);
    r.profile = &prof;
    const int k = (int)moe.hp.n_expert_used;
    assert_true(k >= 2 && k <= PLAN_MAX_ROUTED);
    /* Bytes alone decide: no fixed costs of calls, launches and hand-offs. */
    prof.cpu_moe_call_s = prof.cpu_step_s = prof.launch_s = prof.graph_node_s = prof.kernel_s = prof.sync_s = 0;
    prof.round_trip_s = prof.graph_round_trip_s = prof.zero_copy_expert_call_s = 0;
    static const double cpu_over_stream[] = {20, 1, 0.05};
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < PROFILE_TOKENS; i++) cpu->s_per_byte[i] = cpu_over_stream[c] * prof.zero_copy_experts[i];
        struct plan p;
        assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
        struct plan_tier *t = &p.tier[PLAN_TIER_DECODE];
        assert_false(p.tier[1].routed); /* four-token steps split by range */
        if (c == 2) { /* a fast CPU: the GPU would read none in place, so no routed split */
            assert_false(t->routed);
            plan_free(&p);
            continue;
        }
        assert_true(t->routed && !t->ring);
        assert_int_equal(t->routed_quota[0], 0);
        for (int n = 1; n <= k; n++) assert_true(t->routed_quota[n] <= n);
        if (c == 0) assert_int_equal(t->routed_quota[k], k); /* a slow CPU: the GPU reads them all */
        else assert_true(t->routed_quota[k] > 0 && t->routed_quota[k] < k); /* alike: they share */
        struct cost_step routed, by_range;
        cost_step(&prof, &moe, &p, t, 1, 1000, &routed);
        /* A one-token call reading experts in place pays a fixed part besides their bytes. */
        prof.zero_copy_expert_call_s = 1e-3;
        struct cost_step with_call;
        cost_step(&prof, &moe, &p, t, 1, 1000, &with_call);
        assert_true(with_call.seconds > routed.seconds);
        if (c == 1) { /* reading any in place now costs a millisecond: the CPU takes them all */
            struct plan q;
            assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &q), PSHARD_OK);
            for (int n = 0; q.tier[PLAN_TIER_DECODE].routed && n <= k; n++)
                assert_int_equal(q.tier[PLAN_TIER_DECODE].routed_quota[n], 0);
            plan_free(&q);
        }
        prof.zero_copy_expert_call_s = 0;
        t->routed = false;
        cost_step(&prof, &moe, &p, t, 1, 1000, &by_range);
        assert_true(routed.seconds <= by_range.seconds + 1e-12);
        plan_free(&p);
    }
    struct plan p;
    /* A quota given (tests, comparison) replaces the cost model's, if it fits the model. */
    assert_int_equal(k, 2); /* tiny-moe: top 2 */
    const uint8_t given[3] = {0, 0, 1}, too_many[3] = {0, 2, 1};
    r.routed_quota = given;
    r.routed_quota_count = k;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
    assert_true(p.tier[PLAN_TIER_DECODE].routed);
    assert_memory_equal(p.tier[PLAN_TIER_DECODE].routed_quota, given, 3);
    plan_free(&p);
    r.routed_quota = too_many;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_ERR_INVALID_ARG);
    r.routed_quota = given;
    r.routed_quota_count = k - 1;
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_ERR_INVALID_ARG);
    r.routed_quota = NULL;
    r.stream_share = 0.5f; /* a share given: by range */
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), &p), PSHARD_OK);
    assert_false(p.tier[PLAN_TIER_DECODE].routed);
    plan_free(&p);
}

/* One expert call: an MoE layer's resident experts and those read in place in one call's kernels.
 * Every layer half resident, the rest read in place, the reads outlasting the resident experts:
 * slower resident experts cost a step of the matrix-vector kernel their whole added time (the
 * reads come after them, not hidden behind them: on the H200 they were not), and one of more than
 * 256 tokens (512) too; in a step of the tiled kernel (the first count past the matrix-vector
 * kernel's) half of it, the other half hidden behind the reads. */
/* The GPU time a step of n tokens adds where the GPU's experts take twice as long (*resident:
 * the resident experts' time at that size, summed over the layers). */
static double slower_experts_add(struct profile *prof, const struct plan *p, const struct plan_tier *t, int32_t n,
                                 double *resident) {
    const uint32_t E = moe.hp.n_expert, k = moe.hp.n_expert_used;
    *resident = 0;
    for (uint32_t i = 0; i < moe.n_shards; i++) {
        const struct shard *s = &moe.shards[i];
        if (s->kind != SHARD_MOE) continue;
        *resident += cost_touched(E / 2, E, k, n) * (double)s->expert_bytes *
                     cost_expert_rate(prof->gpu_experts, shard_expert_type(s), E, k, n);
    }
    struct cost_step fast, slow;
    cost_step(prof, &moe, p, t, n, 1000, &fast);
    for (int f = 0; f < PROFILE_FORMATS; f++)
        for (int i = 0; i < PROFILE_TOKENS; i++) prof->gpu_experts[f].s_per_byte[i] *= 2;
    cost_step(prof, &moe, p, t, n, 1000, &slow);
    for (int f = 0; f < PROFILE_FORMATS; f++)
        for (int i = 0; i < PROFILE_TOKENS; i++) prof->gpu_experts[f].s_per_byte[i] /= 2;
    return slow.gpu_s - fast.gpu_s;
}

static void test_cost_one_expert_call(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof); /* the defaults, with a GPU */
    struct plan p;
    split_moe_plan(&prof, &p);
    const struct plan_tier *t = &p.tier[PLAN_TIER_DECODE];
    assert_false(t->ring);
    const uint32_t E = moe.hp.n_expert, k = moe.hp.n_expert_used;
    for (uint32_t l = 0; l < p.n_layers; l++) {
        p.experts_resident[l] = E / 2, p.tier[PLAN_TIER_DECODE].experts_gpu[l] = E;
        if (p.experts_lent) p.experts_lent[l] = 0;
    }
    for (int i = 0; i < PROFILE_TOKENS; i++) prof.zero_copy_experts[i] *= 1e4, prof.zero_copy_experts_off[i] *= 1e4;
    const int32_t matvec = (int32_t)cuda_moe_matvec_max_tokens(E, k);
    assert_true(matvec + 1 < 256);
    const int32_t tokens[3] = {matvec, matvec + 1, 512};
    double resident;
    for (int n = 0; n < 3; n++) {
        const double added = slower_experts_add(&prof, &p, t, tokens[n], &resident);
        assert_true(resident > 0);
        assert_true(fabs(added - (n == 1 ? resident / 2 : resident)) <= 1e-6 * resident);
    }
    /* The call reads experts in place, so the in-place rule decides its kernel: experts in VRAM
     * tiled from fewer tokens (the int8 kernel's bound) leave a step of `matvec` tokens on the
     * matrix-vector kernel, its resident experts' time added whole. */
    p.kernels.moe_matvec_max_tokens = 1;
    p.kernels.moe_matvec_max_tokens_in_place = matvec;
    const double added = slower_experts_add(&prof, &p, t, matvec, &resident);
    assert_true(fabs(added - resident) <= 1e-6 * resident);
    p.kernels.moe_matvec_max_tokens_in_place = 1; /* and tiled there, half of it hidden */
    assert_true(fabs(slower_experts_add(&prof, &p, t, matvec, &resident) - resident / 2) <= 1e-6 * resident);
    plan_free(&p);
}

/* A plan of `family` for tiny-moe under moe_split_budget, costed with prof (*m0: its first MoE
 * shard). */
static void build_moe_split(enum plan_family family, struct profile *prof, struct plan *p, const struct shard **m0) {
    struct plan_request r = base;
    uint64_t slot;
    r.family = family;
    r.profile = prof;
    r.vram_budget = moe_split_budget(m0, &slot);
    assert_int_equal(plan_build(&moe, &r, costs_for(&moe), p), PSHARD_OK);
}

/* The GPU's experts a thousand times slower than measured, so their compute is the longer side. */
static void slow_gpu_experts(struct profile *prof) {
    for (int f = 0; f < PROFILE_FORMATS; f++)
        for (int i = 0; i < PROFILE_TOKENS; i++) prof->gpu_experts[f].s_per_byte[i] *= 1000;
}

/* An expert call of many tokens costs the GPU at least the time of a share of a layer's experts
 * (its tiles do not fill the GPU below that). A ring step computes a layer's resident experts in
 * one call and its streamed piece in another: where the GPU's experts outlast the copies, a piece
 * of 1 of tiny-moe's 8 experts costs as much as one of 2, and the step more than with pieces of 4
 * (counted by bytes alone, every split of the 8 cost the same). */
static void test_cost_small_expert_calls(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    slow_gpu_experts(&prof); /* compute outlasts the copies */
    const struct shard *m0;
    struct plan p;
    build_moe_split(PLAN_GPU, &prof, &p, &m0);
    const struct plan_tier *t = plan_tier_for(&p, 64);
    assert_true(t->ring);
    struct cost_step step[3];
    const uint32_t streamed[3] = {1, 2, 4};
    for (int c = 0; c < 3; c++) {
        for (uint32_t l = 0; l < p.n_layers; l++) p.experts_resident[l] = m0->n_expert - streamed[c];
        cost_step(&prof, &moe, &p, t, 64, 1000, &step[c]);
    }
    /* 7 resident + a piece of 1 costing as 2.24 experts, 6 + 2.24, then 4 + 4. */
    assert_true(step[0].gpu_s > step[1].gpu_s * 1.05);
    assert_true(step[1].gpu_s > step[2].gpu_s);
    assert_true(step[0].gpu_s > step[2].gpu_s * 1.1);
    plan_free(&p);
}

/* A one-token step reading experts in place pays the call's fixed part only where its token
 * routes to one of them: with one expert a layer not resident, in k of E steps. */
static void test_cost_in_place_call_by_odds(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    const struct shard *m0;
    struct plan p;
    build_moe_split(PLAN_GPU, &prof, &p, &m0);
    const struct plan_tier *t = plan_tier_for(&p, 1);
    assert_false(t->ring);
    const uint32_t moe_layers = p.n_layers; /* every layer of tiny-moe */
    for (uint32_t l = 0; l < p.n_layers; l++) {
        assert_true(t->experts_gpu[l] >= m0->n_expert);
        p.experts_resident[l] = m0->n_expert - 1;
        p.experts_lent[l] = 0; /* (the one expert left is read in place, not from a slot) */
    }
    struct cost_step without, with;
    prof.zero_copy_expert_call_s = 0;
    cost_step(&prof, &moe, &p, t, 1, 1000, &without);
    prof.zero_copy_expert_call_s = 1; /* a second: the rest is noise beside it */
    cost_step(&prof, &moe, &p, t, 1, 1000, &with);
    const double odds = (double)moe.hp.n_expert_used / m0->n_expert;
    assert_float_equal(with.seconds - without.seconds, moe_layers * odds, 0.01 * moe_layers * odds);
    plan_free(&p);
}

/* A layer split with the CPU hands its input down and the CPU's sum back up through the GPU's
 * own kernels: the transfer lengthens the GPU's side too, even where that side is the longer. */
static void test_cost_hand_off_on_gpu_side(void **state) {
    (void)state;
    struct profile prof;
    plan_profile(NULL, &prof);
    slow_gpu_experts(&prof); /* the GPU's experts are by far the longer side */
    const struct shard *m0;
    struct plan p;
    build_moe_split(PLAN_STATIC, &prof, &p, &m0);
    const int64_t n = 256;
    const struct plan_tier *t = plan_tier_for(&p, n);
    uint32_t split = 0;
    for (uint32_t i = 0; i < moe.n_shards; i++)
        split += moe.shards[i].kind == SHARD_MOE && t->shard[i] != PLACE_CPU && t->experts_gpu[moe.shards[i].layer] < m0->n_expert;
    assert_true(split > 0);
    struct cost_step fast, slow;
    for (int i = 0; i < PROFILE_SIZES; i++) prof.d2h_gbps[i] = 1e6;
    cost_step(&prof, &moe, &p, t, n, 1000, &fast);
    for (int i = 0; i < PROFILE_SIZES; i++) prof.d2h_gbps[i] = 1;
    cost_step(&prof, &moe, &p, t, n, 1000, &slow);
    const double moved = split * (double)n * moe.hp.n_embd * 4 * 2 / 1e9; /* at 1 GB/s */
    assert_true(slow.gpu_s - fast.gpu_s > 0.99 * moved);
    assert_true(slow.seconds - fast.seconds > 0.99 * moved);
    plan_free(&p);
}

/* The soonest request's set wins, or within the margin one whose first token is sooner by more
 * than the margin; a first token sooner by less decides nothing. */
static void test_soonest_set(void **state) {
    (void)state;
    struct plan p;
    memset(&p, 0, sizeof p);
    double soonest = 0;
    assert_int_equal(plan_soonest_set(&p, 128, &soonest), -1);
    p.weighed_set[PLAN_SET_NO_RING].ttft = 1.00, p.weighed_set[PLAN_SET_NO_RING].decode = 0.0100; /* 2.28 s */
    p.weighed_set[PLAN_SET_RING].ttft = 0.98, p.weighed_set[PLAN_SET_RING].decode = 0.0102;       /* 2.2856 s */
    assert_int_equal(plan_soonest_set(&p, 128, &soonest), PLAN_SET_NO_RING);
    assert_float_equal(soonest, 2.28, 1e-9);
    p.weighed_set[PLAN_SET_RING].ttft = 0.90, p.weighed_set[PLAN_SET_RING].decode = 0.0108; /* 2.2824 s */
    assert_int_equal(plan_soonest_set(&p, 128, NULL), PLAN_SET_RING);
    p.weighed_set[PLAN_SET_RING].decode = 0.0120; /* 2.436 s: beyond the margin */
    assert_int_equal(plan_soonest_set(&p, 128, NULL), PLAN_SET_NO_RING);
    p.weighed_set[PLAN_SET_ALL_KV].ttft = 0.50, p.weighed_set[PLAN_SET_ALL_KV].decode = 0.0120; /* 2.036 s */
    assert_int_equal(plan_soonest_set(&p, 128, &soonest), PLAN_SET_ALL_KV);
    assert_float_equal(soonest, 2.036, 1e-9);
}

static void test_parse(void **state) {
    (void)state;
    int64_t b;
    assert_int_equal(plan_parse_size("2G", &b), PSHARD_OK);
    assert_true(b == (int64_t)2 << 30);
    assert_int_equal(plan_parse_size("2048M", &b), PSHARD_OK);
    assert_true(b == (int64_t)2 << 30);
    assert_int_equal(plan_parse_size("1.5GiB", &b), PSHARD_OK);
    assert_true(b == (int64_t)3 << 29);
    assert_int_equal(plan_parse_size("0", &b), PSHARD_OK);
    assert_int_equal(b, 0);
    const char *bad[] = {"", "G", "-1G", "2X", "1e30", "nan", "2GG"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(plan_parse_size(bad[i], &b), PSHARD_ERR_INVALID_ARG);
    enum plan_family f;
    assert_int_equal(plan_parse_family("static", &f), PSHARD_OK);
    assert_int_equal(f, PLAN_STATIC);
    assert_int_equal(plan_parse_family("dynamic", &f), PSHARD_OK);
    assert_int_equal(f, PLAN_DYNAMIC);
    assert_int_equal(plan_parse_family("fast", &f), PSHARD_ERR_INVALID_ARG);
    float share;
    assert_int_equal(plan_parse_share("0.25", &share), PSHARD_OK);
    assert_true(share == 0.25f);
    const char *bad_share[] = {"", "abc", "1.5", "-0.1", "0.5x", "nan"};
    for (size_t i = 0; i < sizeof bad_share / sizeof bad_share[0]; i++)
        assert_int_equal(plan_parse_share(bad_share[i], &share), PSHARD_ERR_INVALID_ARG);
}

/* Expert rates between the measured token counts go by token-expert pairs: where the time of a
 * step is proportional to its pairs (compute-bound), a step between two measured counts costs in
 * proportion too; at the measured counts the rate is what was measured. */
static void test_cost_expert_rate_by_pairs(void **state) {
    (void)state;
    const double E = 128, k = 8;
    double v[PROFILE_TOKENS];
    for (int i = 0; i < PROFILE_TOKENS; i++) /* one second per pair, per touched byte of one expert */
        v[i] = profile_tokens[i] / cost_touched(E, E, k, profile_tokens[i]);
    for (int i = 0; i < PROFILE_TOKENS; i++)
        assert_float_equal(cost_expert_rate_of(v, E, k, profile_tokens[i]), v[i], 1e-9 * v[i]);
    const double n = 32, pairs_rate = n / cost_touched(E, E, k, n);
    assert_float_equal(cost_expert_rate_of(v, E, k, n), pairs_rate, 1e-9 * pairs_rate);
    /* Per touched byte, half way (in log tokens) between 16 and 64 would be a sixth dearer. */
    assert_true((v[2] + v[3]) / 2 > 1.15 * pairs_rate);
    /* A table's row is found by format, as cost_rate finds it. */
    struct profile_rate table[PROFILE_FORMATS];
    memset(table, 0, sizeof table);
    struct profile_rate *row = profile_rate_add(table, "Q4_0");
    memcpy(row->s_per_byte, v, sizeof v);
    assert_float_equal(cost_expert_rate(table, QUANT_Q4_0, E, k, n), pairs_rate, 1e-9 * pairs_rate);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_zero_is_cpu),          cmocka_unit_test(test_everything_fits_is_gpu),
        cmocka_unit_test(test_kv_sized_as_the_pool),
        cmocka_unit_test(test_static_fills_by_priority),    cmocka_unit_test(test_gpu_streams_what_does_not_fit),
        cmocka_unit_test(test_auto_picks_the_fastest_per_tier), cmocka_unit_test(test_request_mix_of_many),
        cmocka_unit_test(test_auto_resident_set), cmocka_unit_test(test_moe_experts_by_range),
        cmocka_unit_test(test_too_small_names_the_minimum), cmocka_unit_test(test_in_place_rates_follow_alignment),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_cost_model_and_learning), cmocka_unit_test(test_dynamic_balances_from_the_profile),
        cmocka_unit_test(test_dynamic_ring_tiers_stage_alike), cmocka_unit_test(test_cost_launches_and_hand_offs),
        cmocka_unit_test(test_lent_slots), cmocka_unit_test(test_cost_attention_call),
        cmocka_unit_test(test_cpu_router_rate),
        cmocka_unit_test(test_cost_expert_reads_beside_cpu), cmocka_unit_test(test_cost_moe_ring_copies_hide_gpu_work),
        cmocka_unit_test(test_static_stages_attention), cmocka_unit_test(test_lent_experts), cmocka_unit_test(test_dynamic_splits_ffn_rows),
        cmocka_unit_test(test_routed_split), cmocka_unit_test(test_cost_cpu_attention_per_query_head),
        cmocka_unit_test(test_cost_one_expert_call),
        cmocka_unit_test(test_cost_small_expert_calls), cmocka_unit_test(test_cost_in_place_call_by_odds), cmocka_unit_test(test_cost_hand_off_on_gpu_side), cmocka_unit_test(test_soonest_set),
        cmocka_unit_test(test_cost_expert_rate_by_pairs), cmocka_unit_test(test_kv_stream), cmocka_unit_test(test_kv_split),
        cmocka_unit_test(test_moe_routers_first), cmocka_unit_test(test_auto_phases), cmocka_unit_test(test_long_decode_band),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
