/* Measuring the GPU: resident matmuls, experts and attention at every token count, pinned
 * copies by size, kernels reading host memory in place, launch/sync/hand-off latencies, and a
 * copy beside CPU work. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "cuda/cuda_backend.h"
#include "exec/kv_cache.h"
#include "measure/measure_internal.h"
#include "plan/cost.h"
#include "quant/types.h"

struct gpu_bench {
    struct cuda_ctx *cuda;
    cuda_stream s, copy;
    struct cuda_arena arena;
    float *x, *y;
    void *work;
    size_t work_bytes;
    int64_t n_tokens;
    struct cuda_matrix m;
    size_t m_bytes;
    int copies;
    const uint8_t *m_base;
    size_t big; /* working set of bandwidth-bound loops in VRAM (measure_gpu_room) */
    int64_t n_expert; /* experts of a layer held at once (measure_gpu_room) */
    /* experts */
    struct cuda_moe moe;
    int32_t *ids;
    float *weights;
    /* attention */
    struct cuda_attn_shape attn;
    struct cuda_kv_layer kv;
    int32_t *pos, *seq;
    int64_t cells;
    float *q, *out;
    /* copies */
    void *host, *dev;
    float *host_mapped; /* host, as the GPU writes and reads it in place */
    size_t copy_bytes;
    int n_copies;
    bool d2h;
    struct cuda_pinned pinned;
    cuda_event ready;
    cuda_graph handoffs; /* 50 hand-offs through flags, captured */
    uint32_t *flags, *flags_dev;
    struct threadpool *pool;
    pshard_status st;
};

static void keep(struct gpu_bench *b, pshard_status st) {
    if (b->st == PSHARD_OK) b->st = st;
}

static void gpu_sync_step(struct gpu_bench *b) { keep(b, cuda_stream_sync(b->s)); }

static void gpu_matmul_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    for (int i = 0; i < 4; i++) {
        struct cuda_matrix m = b->m;
        m.data = b->m_base + b->m_bytes * (size_t)((rep * 4 + i) % b->copies);
        keep(b, cuda_matmul(b->cuda, &m, b->x, b->n_tokens, b->y, m.n_rows, b->work, b->work_bytes, b->s));
    }
    gpu_sync_step(b);
}

static void gpu_experts_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    for (int i = 0; i < 4; i++)
        keep(b, cuda_moe_ffn(&b->moe, b->x, b->ids, b->weights, b->n_tokens, b->y, false, b->work, b->work_bytes, b->s));
    gpu_sync_step(b);
}

static void gpu_attn_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    for (int i = 0; i < 4; i++) {
        if (b->n_tokens >= PROFILE_PROMPT_ATTN && cuda_attention_prefill_supported(&b->attn))
            keep(b, cuda_attention_prefill(&b->attn, &b->kv, b->q, 0, b->pos, b->n_tokens, (int32_t)b->cells, b->out,
                                           b->work, b->work_bytes, b->s));
        else
            keep(b, cuda_attention_decode(&b->attn, &b->kv, b->q, b->seq, b->pos, b->n_tokens, (int32_t)b->cells, b->out,
                                          b->work, b->work_bytes, b->s));
    }
    gpu_sync_step(b);
}

static void copy_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    for (int i = 0; i < b->n_copies; i++)
        keep(b, b->d2h ? cuda_copy_d2h(b->host, b->dev, b->copy_bytes, b->copy)
                       : cuda_copy_h2d(b->dev, b->host, b->copy_bytes, b->copy));
    keep(b, cuda_stream_sync(b->copy));
}

static void launch_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    for (int i = 0; i < 200; i++) keep(b, cuda_add(b->y, b->x, 32, b->s));
    gpu_sync_step(b);
}

static void sync_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    for (int i = 0; i < 200; i++) gpu_sync_step(b);
}

/* The executor's hand-off of a split MoE layer: GPU work (a layer's worth, ~0.1 ms), a kernel
 * writing the input down into host memory, and an event; the host waits on it and runs its
 * thread-pool jobs; the GPU adds the result, reading host memory in place. With gpu_work
 * alone: the same GPU work without the hand-off. */
static void gpu_work(struct gpu_bench *b) {
    const size_t half = profile_sizes[PROFILE_SIZES - 1] / 2;
    keep(b, cuda_copy_d2d(b->dev, (uint8_t *)b->dev + half, half, b->s));
}

static void gpu_work_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    for (int i = 0; i < 50; i++) gpu_work(b);
    gpu_sync_step(b);
}

static void round_trip_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    for (int i = 0; i < 50; i++) {
        gpu_work(b);
        keep(b, cuda_rmsnorm_mirror(b->x, NULL, b->y, b->host_mapped, 1, 4096, 1e-6f, b->s));
        keep(b, cuda_event_record(b->ready, b->s));
        keep(b, cuda_event_sync(b->ready));
        for (int j = 0; j < 3; j++) threadpool_run(b->pool, measure_empty_job, NULL);
        keep(b, cuda_add(b->y, b->host_mapped, 4096, b->s));
    }
    gpu_sync_step(b);
}

/* The same hand-offs inside a replayed graph, as a decode step makes them: the GPU raises a
 * flag after the copy down and waits on one the host raises after its jobs. */
static pshard_status capture_handoffs(struct gpu_bench *b) {
    CORE_TRY(cuda_graph_capture_begin(b->s));
    pshard_status st = PSHARD_OK;
    for (int i = 0; i < 50 && st == PSHARD_OK; i++) {
        st = cuda_copy_d2d(b->dev, (uint8_t *)b->dev + profile_sizes[PROFILE_SIZES - 1] / 2,
                           profile_sizes[PROFILE_SIZES - 1] / 2, b->s);
        if (st == PSHARD_OK) st = cuda_rmsnorm_mirror(b->x, NULL, b->y, b->host_mapped, 1, 4096, 1e-6f, b->s);
        if (st == PSHARD_OK) st = cuda_flag_raise(b->flags_dev + 2 * i, NULL, b->s);
        if (st == PSHARD_OK) st = cuda_flag_wait(b->flags_dev + 2 * i + 1, NULL, b->s);
        if (st == PSHARD_OK) st = cuda_add(b->y, b->host_mapped, 4096, b->s);
    }
    const pshard_status end = cuda_graph_capture_end(b->s, &b->handoffs);
    return st ? st : end;
}

static void graph_round_trip_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    (void)rep;
    const pshard_status launched = cuda_graph_launch(b->handoffs, b->s);
    keep(b, launched);
    for (int i = 0; i < 50 && launched == PSHARD_OK; i++) {
        const pshard_status st = cuda_flag_host_wait(b->flags + 2 * i, b->s);
        if (st != PSHARD_OK) { /* the stream failed: nothing waits on the host any more */
            keep(b, st);
            return;
        }
        for (int j = 0; j < 3; j++) threadpool_run(b->pool, measure_empty_job, NULL);
        cuda_flag_host_raise(b->flags + 2 * i + 1);
    }
    gpu_sync_step(b);
}

/* Units of GPU work that use host memory: a pinned copy, or a matmul reading its weights in place. */
static pshard_status copy_unit(struct gpu_bench *b, int i) {
    (void)i;
    return cuda_copy_h2d(b->dev, b->host, b->copy_bytes, b->copy);
}

static pshard_status in_place_unit(struct gpu_bench *b, int i) {
    struct cuda_matrix m = b->m;
    m.data = b->m_base + b->m_bytes * (size_t)(i % b->copies);
    return cuda_matmul(b->cuda, &m, b->x, 1, b->y, m.n_rows, b->work, b->work_bytes, b->s);
}

/* About a quarter second of GPU units (each unit_alone seconds alone) running on s while the CPU
 * runs matmuls until they are done: the CPU's and the units' rates as shares of their rates
 * alone (at most 1). The units are captured as one graph first: queued one by one, thousands of
 * short units fill the launch queue, and the host, blocked in a launch while the GPU drains it,
 * would run no matmuls for most of the time measured. */
static pshard_status beside_cpu_once(struct gpu_bench *b, struct cpu_bench *c, step_fn cpu_step, double cpu_alone,
                                     double unit_alone, pshard_status (*unit)(struct gpu_bench *, int), cuda_stream s,
                                     double *cpu_share, double *gpu_share) {
    const int n_units = (int)(0.25 / (unit_alone > 1e-6 ? unit_alone : 1e-6)) + 2;
    cuda_event done_event = NULL;
    cuda_graph units = NULL;
    pshard_status st = cuda_event_create(false, &done_event);
    if (st == PSHARD_OK) st = cuda_graph_capture_begin(s);
    if (st == PSHARD_OK) {
        for (int i = 0; i < n_units && st == PSHARD_OK; i++) st = unit(b, i);
        const pshard_status end = cuda_graph_capture_end(s, &units);
        st = st ? st : end;
    }
    const double t0 = core_now_ms();
    if (st == PSHARD_OK) st = cuda_graph_launch(units, s);
    if (st == PSHARD_OK) st = cuda_event_record(done_event, s);
    int reps = 0;
    bool done = st != PSHARD_OK;
    while (!done) {
        cpu_step(c, ++reps);
        st = cuda_event_done(done_event, &done);
        done |= st != PSHARD_OK;
    }
    const double elapsed = (core_now_ms() - t0) / 1e3;
    if (done_event) cuda_event_destroy(done_event);
    if (st == PSHARD_OK) st = cuda_stream_sync(s);
    if (units) cuda_graph_destroy(units);
    if (st != PSHARD_OK) return st;
    *cpu_share = cpu_alone / (elapsed / (reps ? reps : 1));
    *gpu_share = unit_alone / (elapsed / n_units);
    if (*cpu_share > 1) *cpu_share = 1;
    if (*gpu_share > 1) *gpu_share = 1;
    return PSHARD_OK;
}

/* The best of three (anything else on the machine can only lower a share). A CPU step reads
 * cpu_bytes of host memory and a unit unit_bytes: what host memory served both at once, in GB/s,
 * raises p->host_served_gbps (a ceiling on the two together can be no lower). */
static pshard_status beside_cpu(struct gpu_bench *b, struct cpu_bench *c, step_fn cpu_step, double cpu_alone,
                                double cpu_bytes, double unit_alone, double unit_bytes,
                                pshard_status (*unit)(struct gpu_bench *, int), cuda_stream s, struct profile *p,
                                double *cpu_share, double *gpu_share) {
    *cpu_share = *gpu_share = 0;
    for (int i = 0; i < 3; i++) {
        double cs, gs;
        CORE_TRY(beside_cpu_once(b, c, cpu_step, cpu_alone, unit_alone, unit, s, &cs, &gs));
        *cpu_share = cs > *cpu_share ? cs : *cpu_share;
        *gpu_share = gs > *gpu_share ? gs : *gpu_share;
        if (cpu_alone > 0 && unit_alone > 0) {
            const double served = (cs * cpu_bytes / cpu_alone + gs * unit_bytes / unit_alone) / 1e9;
            p->host_served_gbps = served > p->host_served_gbps ? served : p->host_served_gbps;
        }
    }
    return PSHARD_OK;
}

/* The work buffer: 256 MB, or what the model's largest expert step needs (a large MoE's experts
 * at 1024 tokens may need more; unmeasured, their rate there would be missing). */
static size_t moe_work_bytes(const struct shapes *sh, int64_t n_tokens) {
    size_t bytes = (size_t)256 << 20;
    for (int f = 0; f < sh->n_moe; f++) {
        const struct cuda_moe m = {.gate = {.type = sh->gate[f], .n_cols = sh->n_embd, .n_rows = sh->n_ff_exp},
                                   .up = {.type = sh->gate[f], .n_cols = sh->n_embd, .n_rows = sh->n_ff_exp},
                                   .down = {.type = sh->down[f], .n_cols = sh->n_ff_exp, .n_rows = sh->n_embd},
                                   .n_expert = sh->n_expert, .k = sh->k};
        const size_t need = cuda_moe_work_bytes(&m, n_tokens);
        if (need > bytes) bytes = need;
    }
    return bytes;
}

void measure_gpu_room(size_t fixed, size_t work_bytes, uint64_t expert_bytes, int64_t n_expert, int k, int64_t cap,
                      struct gpu_room *out) {
    const size_t wanted = (size_t)6 * BIG_BYTES + ((size_t)768 << 20) + work_bytes;
    const size_t least = fixed + (size_t)6 * MIN_BIG_BYTES;
    size_t arena = wanted > least ? wanted : least;
    out->over_cap = false;
    if (cap > 0 && (uint64_t)cap < arena) {
        arena = (uint64_t)cap > least ? (size_t)cap : least;
        out->over_cap = (uint64_t)cap < least;
    }
    const size_t room = arena - fixed, big = room / 6 / (1 << 20) * (1 << 20);
    out->arena = arena;
    out->big = big < BIG_BYTES ? big : BIG_BYTES;
    out->experts = n_expert;
    if (expert_bytes && (uint64_t)n_expert * expert_bytes > room) {
        const int64_t fit = (int64_t)(room / (expert_bytes + 3 * CUDA_ARENA_ALIGN));
        out->experts = fit > k ? fit : k < n_expert ? k : n_expert;
    }
}

static pshard_status carve(struct gpu_bench *b, size_t bytes, void **out) {
    return cuda_arena_alloc(&b->arena, bytes, "measure", out);
}

/* A matrix of the model's shape in VRAM (copies of it, for bandwidth-bound loops), or in
 * pinned host memory (zero_copy), starting `skew` bytes past an aligned address. */
static pshard_status gpu_matrix(struct gpu_bench *b, enum quant_type t, int64_t rows, int64_t cols, int64_t experts,
                                size_t want, bool zero_copy, size_t skew) {
    const size_t row = quant_row_bytes(t, cols);
    b->m = (struct cuda_matrix){t, NULL, cols, rows, experts, row, zero_copy};
    b->m_bytes = cuda_align(row * (size_t)rows * (size_t)experts);
    b->copies = (int)((want + b->m_bytes - 1) / b->m_bytes);
    if (b->copies < 1) b->copies = 1;
    uint8_t *host = malloc(b->m_bytes);
    if (!host) return core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    measure_fill(host, b->m_bytes, 9);
    void *dev = NULL;
    pshard_status st;
    if (zero_copy) { /* `skew` bytes past an aligned address, as a model file's weights may lie */
        st = cuda_host_alloc(b->m_bytes * b->copies + skew, &b->pinned);
        for (int c = 0; st == PSHARD_OK && c < b->copies; c++)
            memcpy((uint8_t *)b->pinned.ptr + skew + b->m_bytes * c, host, b->m_bytes);
        if (st == PSHARD_OK) st = cuda_host_device_pointer(b->pinned.ptr, (const void **)&dev);
        if (st == PSHARD_OK) dev = (uint8_t *)dev + skew;
    } else {
        st = carve(b, b->m_bytes * b->copies, &dev);
        for (int c = 0; st == PSHARD_OK && c < b->copies; c++)
            st = cuda_copy_h2d((uint8_t *)dev + b->m_bytes * c, host, b->m_bytes, b->s), st = st ? st : cuda_stream_sync(b->s);
    }
    free(host);
    b->m_base = dev;
    b->m.data = dev;
    return st;
}

enum { ROUTINGS = 64 }; /* routings of a step the expert units cycle through */

/* A step's experts (b->n_tokens tokens) read from host memory in place, routed by one of
 * ROUTINGS routings (a single routing would read the same experts, soon from the GPU's L2). */
static pshard_status expert_read_unit(struct gpu_bench *b, int i) {
    const size_t at = (size_t)(i % ROUTINGS) * (size_t)b->n_tokens * (size_t)b->moe.k;
    return cuda_moe_ffn(&b->moe, b->x, b->ids + at, b->weights + at, b->n_tokens, b->y, false, b->work, b->work_bytes,
                        b->s);
}

static void expert_reads_step(void *arg, int rep) {
    struct gpu_bench *b = arg;
    for (int i = 0; i < 4; i++) keep(b, expert_read_unit(b, rep * 4 + i));
    gpu_sync_step(b);
}

/* The expert kernel reading a step's experts in place beside the CPU computing a step's experts
 * (n tokens each), as a split MoE layer runs them: each one's rate against its rate alone, into
 * *cpu_share and *reads_share (scattered expert reads slow more beside the CPU than the dense
 * probe's shares say). Alone, one token's reads are also timed at 2 experts a token: a call's
 * fixed part (into p) and its rate per byte (`expert` bytes an expert, into *per_byte) apart,
 * where they fit. ids and w: host room for ROUTINGS routings of n tokens. */
static pshard_status experts_beside_cpu(struct gpu_bench *b, const struct shapes *sh, struct profile *p, int32_t *ids,
                                        float *w, double expert, int64_t n, double *cpu_share, double *reads_share,
                                        double *per_byte) {
    struct cpu_bench route = {.ids = ids, .weights = w, .n_tokens = ROUTINGS * n, .k = sh->k};
    measure_route_random(&route, (int)sh->n_expert, 7);
    CORE_TRY(cuda_copy_h2d(b->ids, ids, sizeof *ids * ROUTINGS * n * sh->k, b->s));
    CORE_TRY(cuda_copy_h2d(b->weights, w, sizeof *w * ROUTINGS * n * sh->k, b->s));
    CORE_TRY(cuda_stream_sync(b->s));
    b->n_tokens = n;
    const double read_alone = measure_time_steps(expert_reads_step, b) / 4;
    CORE_TRY(b->st);
    if (n == 1 && sh->k > 2) { /* pairs of one routing's experts: distinct */
        b->moe.k = 2;
        const double two = measure_time_steps(expert_reads_step, b) / 4;
        b->moe.k = sh->k;
        CORE_TRY(b->st);
        const double each = (read_alone - two) / (sh->k - 2);
        if (each > 0 && two > 2 * each) {
            p->zero_copy_expert_call_s = two - 2 * each;
            *per_byte = each / expert;
        }
    }
    struct cpu_bench c;
    CORE_TRY(measure_cpu_experts_open(sh, b->pool, n, &c));
    const double cpu_alone = measure_time_steps(measure_cpu_experts_step, &c);
    const double E = (double)sh->n_expert, experts = cost_touched(E, E, sh->k, (double)n);
    const double touched = experts * (double)(c.gate.bytes + c.up.bytes + c.down.bytes) / E;
    const pshard_status st = beside_cpu(b, &c, measure_cpu_experts_step, cpu_alone, touched, read_alone, experts * expert,
                                        expert_read_unit, b->s, p, cpu_share, reads_share);
    measure_cpu_bench_close(&c);
    return st;
}

/* The expert matrices `skew` bytes into a pinned block (device pointer `base`: gate, up, down). */
static void place_experts(struct gpu_bench *b, const struct shapes *sh, const uint8_t *base, size_t gate, size_t skew) {
    const int64_t E = sh->n_expert, ff = sh->n_ff_exp, d = sh->n_embd;
    const uint8_t *dev = base + skew;
    b->moe.gate = (struct cuda_matrix){sh->gate[0], dev, d, ff, E, quant_row_bytes(sh->gate[0], d), true};
    b->moe.up = (struct cuda_matrix){sh->gate[0], dev + gate, d, ff, E, quant_row_bytes(sh->gate[0], d), true};
    b->moe.down = (struct cuda_matrix){sh->down[0], dev + 2 * gate, ff, d, E, quant_row_bytes(sh->down[0], ff), true};
    b->moe.n_expert = (int)E, b->moe.k = sh->k;
}

/* Seconds per touched expert byte of the expert kernel reading in place, at each token count:
 * each routing's first read, 4 routings per token count, each timed once. ids and w: host room
 * for a routing of the most tokens. */
static pshard_status expert_read_rates(struct gpu_bench *b, const struct shapes *sh, int32_t *ids, float *w,
                                       double expert, double rates[PROFILE_TOKENS]) {
    const int64_t E = sh->n_expert;
    pshard_status st = PSHARD_OK;
    for (int i = 0; st == PSHARD_OK && i < PROFILE_TOKENS; i++) {
        b->n_tokens = profile_tokens[i];
        if (cuda_moe_work_bytes(&b->moe, b->n_tokens) > b->work_bytes) continue;
        struct cpu_bench route = {.ids = ids, .weights = w, .n_tokens = b->n_tokens, .k = sh->k};
        double total = 0;
        for (int r = 0; st == PSHARD_OK && r < 4; r++) {
            measure_route_random(&route, (int)E, 100 * i + r);
            st = cuda_copy_h2d(b->ids, ids, sizeof *ids * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_copy_h2d(b->weights, w, sizeof *w * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            const double t0 = core_now_ms();
            if (st == PSHARD_OK)
                st = cuda_moe_ffn(&b->moe, b->x, b->ids, b->weights, b->n_tokens, b->y, false, b->work, b->work_bytes, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            total += (core_now_ms() - t0) / 1e3;
        }
        const double touched = cost_touched((double)E, (double)E, sh->k, (double)b->n_tokens);
        rates[i] = total / 4 / (touched * expert);
    }
    return st;
}

/* The expert kernel reading experts in place: rates from aligned memory and from p->in_place_skew
 * bytes past 256, then the shares beside the CPU (one token's and PROFILE_SPLIT_TOKENS'); the two
 * tables timed again after each, while the minute lasts, each point keeping its median, since
 * one timing varies enough from moment to moment to change the plan chosen (bench/RESULTS.md).
 * One token's off-alignment rate is scaled as the aligned one, whose call's fixed part the
 * shares' probe fits apart. */
static pshard_status zero_copy_experts(struct gpu_bench *b, const struct shapes *sh, struct profile *p) {
    const int64_t E = sh->n_expert, ff = sh->n_ff_exp, d = sh->n_embd;
    const size_t gate = cuda_align(quant_row_bytes(sh->gate[0], d) * (size_t)ff * E);
    const size_t down = cuda_align(quant_row_bytes(sh->down[0], ff) * (size_t)d * E);
    struct cuda_pinned host = {0};
    CORE_TRY(cuda_host_alloc(2 * gate + down + 256, &host)); /* room to start off alignment */
    measure_fill(host.ptr, 2 * gate + down + 256, 13);
    const uint8_t *dev = NULL;
    pshard_status st = cuda_host_device_pointer(host.ptr, (const void **)&dev);
    const int64_t B = profile_tokens[PROFILE_TOKENS - 1];
    int32_t *ids = malloc(sizeof *ids * B * sh->k);
    float *w = malloc(sizeof *w * B * sh->k);
    if (st == PSHARD_OK && (!ids || !w)) st = core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    const double expert = (double)(2 * gate + down) / E;
    double aligned[MEASURE_SAMPLES][PROFILE_TOKENS], off[MEASURE_SAMPLES][PROFILE_TOKENS];
    int n_aligned = 0, n_off = 0;
    double per_byte = 0; /* one token's reads without the call's fixed part, where fitted */
    p->zero_copy_expert_call_s = 0; /* unless fitted below, zero_copy_experts[0] holds it */
    for (int pass = 0; st == PSHARD_OK && pass < MEASURE_SAMPLES && (pass == 0 || !measure_out_of_time()); pass++) {
        memcpy(aligned[n_aligned], p->zero_copy_experts, sizeof aligned[0]); /* points past the work buffer stay */
        place_experts(b, sh, dev, gate, 0);
        st = expert_read_rates(b, sh, ids, w, expert, aligned[n_aligned]);
        if (st != PSHARD_OK) break;
        n_aligned++;
        if (!measure_out_of_time()) {
            memcpy(off[n_off], aligned[n_aligned - 1], sizeof off[0]);
            place_experts(b, sh, dev, gate, (size_t)p->in_place_skew);
            st = expert_read_rates(b, sh, ids, w, expert, off[n_off]);
            place_experts(b, sh, dev, gate, 0);
            if (st == PSHARD_OK) n_off++;
        }
        if (st != PSHARD_OK || !b->pool || measure_out_of_time()) continue;
        if (pass == 0) { /* the shares, and one token's call's fixed part */
            st = experts_beside_cpu(b, sh, p, ids, w, expert, 1, &p->cpu_share_under_expert_reads,
                                    &p->expert_reads_share_under_cpu, &per_byte);
            /* Steps of more tokens: where time is short, they keep one token's shares. */
            p->cpu_share_under_expert_reads_16 = p->cpu_share_under_expert_reads;
            p->expert_reads_share_under_cpu_16 = p->expert_reads_share_under_cpu;
        } else if (pass == 1 && PROFILE_SPLIT_TOKENS * ROUTINGS <= B)
            st = experts_beside_cpu(b, sh, p, ids, w, expert, PROFILE_SPLIT_TOKENS, &p->cpu_share_under_expert_reads_16,
                                    &p->expert_reads_share_under_cpu_16, &per_byte);
    }
    if (n_aligned > 0) {
        measure_median_table(aligned, n_aligned, p->zero_copy_experts);
        const double whole_call = p->zero_copy_experts[0];
        if (per_byte > 0) p->zero_copy_experts[0] = per_byte;
        memcpy(p->zero_copy_experts_off, p->zero_copy_experts, sizeof p->zero_copy_experts); /* unless measured */
        if (n_off > 0) {
            measure_median_table(off, n_off, p->zero_copy_experts_off);
            if (whole_call > 0) p->zero_copy_experts_off[0] *= p->zero_copy_experts[0] / whole_call;
        }
    }
    free(ids), free(w);
    cuda_pinned_release(&host);
    return st;
}

/* Seconds per byte of dense products reading pinned host memory in place, the matrices `skew`
 * bytes past 256, over the model's three matrix shapes, into rates[]. */
static pshard_status in_place_dense(struct gpu_bench *b, const struct shapes *sh, size_t skew,
                                    double rates[PROFILE_TOKENS]) {
    const int64_t shapes[3][2] = {{sh->rows, sh->n_embd}, {sh->n_embd, sh->rows}, {sh->n_embd, sh->n_embd}};
    double seconds[PROFILE_TOKENS] = {0}, bytes = 0;
    pshard_status st = PSHARD_OK;
    for (int k = 0; k < 3 && st == PSHARD_OK; k++) {
        st = gpu_matrix(b, sh->dense[0], shapes[k][0], shapes[k][1], 1, BIG_BYTES / 6, true, skew);
        for (int i = 0; st == PSHARD_OK && i < PROFILE_TOKENS; i++) {
            b->n_tokens = profile_tokens[i];
            if (cuda_matmul_work_bytes(&b->m, b->n_tokens) > b->work_bytes) continue;
            seconds[i] += measure_time_steps(gpu_matmul_step, b) / 4;
        }
        bytes += (double)b->m_bytes;
        cuda_pinned_release(&b->pinned);
    }
    for (int i = 0; st == PSHARD_OK && i < PROFILE_TOKENS; i++) rates[i] = seconds[i] / bytes;
    return st;
}

/* GPU attention's rates over a cache of `cells` cells (steps below PROFILE_PROMPT_ATTN tokens,
 * which attend all of it) and a prompt window of `window` cells (the larger steps, each token
 * attending its causal part): seconds per KV byte per new token, into rates[] (left as they
 * were where a step does not fit the work buffer). With find_call, the split-KV kernel's fixed
 * part is measured too, into *call_s (one token over a quarter of the cache against the whole);
 * otherwise *call_s is taken as given. */
static pshard_status attention_rates(struct gpu_bench *b, int64_t cells, int64_t window, int32_t *pos,
                                     double rates[PROFILE_TOKENS], bool find_call, double *call_s) {
    const struct cuda_attn_shape *a = &b->attn;
    const double kv_per_cell = (double)a->n_head_kv * (a->head_k + a->head_v) * 2;
    const int64_t room = cells > window ? cells : window;
    CORE_TRY(carve(b, sizeof(uint16_t) * room * a->n_head_kv * a->head_k, (void **)&b->kv.k));
    CORE_TRY(carve(b, sizeof(uint16_t) * room * a->n_head_kv * a->head_v, (void **)&b->kv.v));
    CORE_TRY(cuda_memset(b->kv.k, 0x22, sizeof(uint16_t) * room * a->n_head_kv * a->head_k, b->s));
    CORE_TRY(cuda_memset(b->kv.v, 0x22, sizeof(uint16_t) * room * a->n_head_kv * a->head_v, b->s));
    /* The cells through a block table as the executor's (its blocks in order: a sequence grown
     * alone has them so); every token reads the one sequence. */
    const int64_t n_blocks = (room + KV_BLOCK_CELLS - 1) / KV_BLOCK_CELLS;
    int32_t *blocks = malloc(sizeof *blocks * (size_t)n_blocks);
    if (!blocks) return core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    for (int64_t i = 0; i < n_blocks; i++) blocks[i] = (int32_t)i;
    pshard_status up = carve(b, sizeof *blocks * (size_t)n_blocks, (void **)&b->kv.blocks);
    if (up == PSHARD_OK) up = cuda_copy_h2d((void *)b->kv.blocks, blocks, sizeof *blocks * (size_t)n_blocks, b->s);
    if (up == PSHARD_OK) up = cuda_stream_sync(b->s);
    free(blocks);
    CORE_TRY(up);
    b->kv.blocks_stride = 0;
    b->kv.block_cells = KV_BLOCK_CELLS;
    double quarter_s = 0;
    pshard_status st = PSHARD_OK;
    for (int i = find_call ? -1 : 0; i < PROFILE_TOKENS && st == PSHARD_OK; i++) {
        /* i = -1: one token over a quarter of the cache. Decode-sized steps attend the whole
         * cache; prompt steps their own causal window. */
        const int64_t want = profile_tokens[i < 0 ? 0 : i];
        const bool small = want < PROFILE_PROMPT_ATTN;
        b->cells = i < 0 ? cells / 4 : small ? cells : window;
        const int64_t n = small ? want : (want < window ? want : window);
        for (int64_t t = 0; t < n; t++) pos[t] = (int32_t)(small ? b->cells - 1 : window - n + t);
        b->n_tokens = n;
        st = cuda_copy_h2d(b->pos, pos, sizeof *pos * n, b->s);
        if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
        if (st != PSHARD_OK || cuda_attention_decode_work_bytes(&b->attn, n, (int32_t)b->cells) > b->work_bytes ||
            cuda_attention_prefill_work_bytes(&b->attn, n, (int32_t)b->cells) > b->work_bytes)
            continue;
        const double seconds = measure_time_steps(gpu_attn_step, b) / 4;
        /* Prompt tokens attend on average half their window. */
        const double attended = small ? (double)b->cells : (double)window - n / 2.0;
        if (i < 0) {
            quarter_s = seconds;
            continue;
        }
        if (i == 0 && find_call) { /* a call at the full cache less its cells' share, from the quarter's */
            const double per_cell = (seconds - quarter_s) / (cells - cells / 4);
            *call_s = per_cell > 0 && seconds > cells * per_cell ? seconds - cells * per_cell : 0;
        }
        const double fixed = small ? *call_s : 0;
        rates[i] = (seconds > 2 * fixed ? seconds - fixed : seconds / 2) / ((double)n * attended * kv_per_cell);
    }
    return st;
}

static pshard_status measure_gpu_tables(const struct measure_request *req, const struct shapes *sh, struct gpu_bench *b,
                                        struct profile *p) {
    const size_t mark = cuda_arena_mark(&b->arena);
    for (int f = 0; f < sh->n_dense && !measure_out_of_time(); f++) {
        measure_report(req, "GPU matmul", 0.5 + 0.15 * f / sh->n_dense);
        struct profile_rate *r = profile_rate_add(p->gpu_matmul, quant_type_name(sh->dense[f]));
        if (!r || !cuda_type_supported(sh->dense[f])) continue;
        for (int i = 0; i < PROFILE_TOKENS; i++) {
            b->n_tokens = profile_tokens[i];
            CORE_TRY(gpu_matrix(b, sh->dense[f], sh->rows, sh->n_embd, 1, b->n_tokens <= 16 ? 4 * b->big : SMALL_BYTES,
                                false, 0));
            r->s_per_byte[i] = measure_time_steps(gpu_matmul_step, b) / 4 / (double)b->m_bytes;
            cuda_arena_reset(&b->arena, mark);
        }
    }
    for (int f = 0; f < sh->n_moe && !measure_out_of_time(); f++) {
        measure_report(req, "GPU experts", 0.65 + 0.1 * f / sh->n_moe);
        struct profile_rate *r = profile_rate_add(p->gpu_experts, quant_type_name(sh->gate[f]));
        if (!r || !cuda_type_supported(sh->gate[f]) || !cuda_type_supported(sh->down[f])) continue;
        const int64_t E = b->n_expert, ff = sh->n_ff_exp, d = sh->n_embd; /* (all of a layer's, but under a cap) */
        CORE_TRY(gpu_matrix(b, sh->gate[f], ff, d, E, 0, false, 0));
        b->moe.gate = b->m;
        CORE_TRY(gpu_matrix(b, sh->gate[f], ff, d, E, 0, false, 0));
        b->moe.up = b->m;
        CORE_TRY(gpu_matrix(b, sh->down[f], d, ff, E, 0, false, 0));
        b->moe.down = b->m;
        b->moe.n_expert = (int)E, b->moe.k = sh->k;
        const double expert = (double)(b->moe.gate.row_bytes * ff * 2 + b->moe.down.row_bytes * d);
        const int64_t B = profile_tokens[PROFILE_TOKENS - 1];
        int32_t *ids = malloc(sizeof *ids * B * sh->k);
        float *w = malloc(sizeof *w * B * sh->k);
        pshard_status st = ids && w ? PSHARD_OK : core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
        for (int i = 0; i < PROFILE_TOKENS && st == PSHARD_OK; i++) {
            b->n_tokens = profile_tokens[i];
            struct cpu_bench route = {.ids = ids, .weights = w, .n_tokens = b->n_tokens, .k = sh->k};
            measure_route_random(&route, (int)E, i);
            st = cuda_copy_h2d(b->ids, ids, sizeof *ids * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_copy_h2d(b->weights, w, sizeof *w * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            if (cuda_moe_work_bytes(&b->moe, b->n_tokens) > b->work_bytes) continue;
            const double touched = cost_touched((double)E, (double)E, sh->k, (double)b->n_tokens);
            r->s_per_byte[i] = measure_time_steps(gpu_experts_step, b) / 4 / (touched * expert);
        }
        free(ids), free(w);
        CORE_TRY(st);
        cuda_arena_reset(&b->arena, mark);
    }
    /* A small kernel's shortest run: products of a few rows, replayed as a graph (each product
     * is two kernels: the activations' quantization and the matvec). */
    if (sh->n_dense && cuda_type_supported(sh->dense[0])) {
        CORE_TRY(gpu_matrix(b, sh->dense[0], 256, sh->n_embd, 1, 0, false, 0));
        cuda_graph graph = NULL;
        pshard_status st = cuda_graph_capture_begin(b->s);
        for (int i = 0; i < 100 && st == PSHARD_OK; i++)
            st = cuda_matmul(b->cuda, &b->m, b->x, 1, b->y, b->m.n_rows, b->work, b->work_bytes, b->s);
        const pshard_status end = cuda_graph_capture_end(b->s, &graph);
        st = st ? st : end;
        if (st == PSHARD_OK) st = cuda_graph_launch(graph, b->s);
        if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
        const double t0 = core_now_ms();
        for (int r = 0; r < 10 && st == PSHARD_OK; r++) st = cuda_graph_launch(graph, b->s);
        if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
        if (st == PSHARD_OK) p->kernel_s = (core_now_ms() - t0) / 1e3 / (10 * 200);
        if (graph) cuda_graph_destroy(graph);
        CORE_TRY(st);
        cuda_arena_reset(&b->arena, mark);
    }
    /* Attention over a cache of ATTN_CTX cells (a quarter of it too, for the call's fixed part),
     * then over a long one, whose rate per cell differs: the cost model takes the rate between
     * the two by the cache's length. */
    measure_report(req, "GPU attention", 0.75);
    const struct cpu_attn_shape *a = &sh->attn;
    b->attn = (struct cuda_attn_shape){a->n_head, a->n_head_kv, a->head_k, a->head_v, a->scale};
    int32_t *pos = malloc(sizeof *pos * profile_tokens[PROFILE_TOKENS - 1]);
    if (!pos) return core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    pshard_status st = attention_rates(b, ATTN_CTX, ATTN_CTX_PROMPT, pos, p->gpu_attn, true, &p->gpu_attn_call_s);
    cuda_arena_reset(&b->arena, mark);
    /* The long cache is worth having, not needing: without room or time for it, the short one's
     * rates stand for both. */
    memcpy(p->gpu_attn_long, p->gpu_attn, sizeof p->gpu_attn);
    if (st == PSHARD_OK && !measure_out_of_time()) {
        double rates[PROFILE_TOKENS] = {0};
        if (attention_rates(b, PROFILE_ATTN_LONG_CELLS, PROFILE_ATTN_LONG_WINDOW, pos, rates, false, &p->gpu_attn_call_s) ==
                PSHARD_OK &&
            b->st == PSHARD_OK)
            for (int i = 0; i < PROFILE_TOKENS; i++)
                if (rates[i] > 0) p->gpu_attn_long[i] = rates[i];
        b->st = PSHARD_OK;
        core_clear_error();
        cuda_arena_reset(&b->arena, mark);
    }
    free(pos);
    return st ? st : b->st;
}

static pshard_status measure_transfers(const struct measure_request *req, const struct shapes *sh, struct gpu_bench *b,
                                       struct threadpool *pool, struct profile *p) {
    measure_report(req, "PCIe copies", 0.8);
    const size_t mark = cuda_arena_mark(&b->arena);
    struct cuda_pinned host = {0};
    CORE_TRY(cuda_host_alloc(profile_sizes[PROFILE_SIZES - 1], &host));
    pshard_status st = carve(b, profile_sizes[PROFILE_SIZES - 1], &b->dev);
    b->host = host.ptr;
    if (st == PSHARD_OK) st = cuda_host_device_pointer(host.ptr, (const void **)&b->host_mapped);
    for (int dir = 0; dir < 2 && st == PSHARD_OK; dir++)
        for (int i = 0; i < PROFILE_SIZES; i++) {
            b->d2h = dir == 1;
            b->copy_bytes = profile_sizes[i];
            b->n_copies = (int)(256 * 1048576.0 / b->copy_bytes) + 1;
            if (b->n_copies > 64) b->n_copies = 64;
            const double s = measure_time_steps(copy_step, b) / b->n_copies;
            (dir ? p->d2h_gbps : p->h2d_gbps)[i] = b->copy_bytes / s / 1e9;
        }
    /* Latencies. */
    if (st == PSHARD_OK) {
        measure_report(req, "latencies", 0.85);
        p->launch_s = measure_time_steps(launch_step, b) / 200;
        p->sync_s = measure_time_steps(sync_step, b) / 200;
        b->pool = pool;
        st = cuda_event_create(false, &b->ready);
        if (st == PSHARD_OK) p->round_trip_s = (measure_time_steps(round_trip_step, b) - measure_time_steps(gpu_work_step, b)) / 50;
        if (p->round_trip_s < p->sync_s) p->round_trip_s = p->sync_s;
        if (b->ready) cuda_event_destroy(b->ready);
        struct cuda_pinned flags = {0};
        if (st == PSHARD_OK) st = cuda_flags_alloc(100, &flags, &b->flags_dev);
        b->flags = flags.ptr;
        if (st == PSHARD_OK) st = capture_handoffs(b);
        if (st == PSHARD_OK)
            p->graph_round_trip_s = (measure_time_steps(graph_round_trip_step, b) - measure_time_steps(gpu_work_step, b)) / 50;
        if (p->graph_round_trip_s < 0) p->graph_round_trip_s = 0;
        cuda_graph_destroy(b->handoffs);
        b->handoffs = NULL;
        cuda_pinned_release(&flags);
        cuda_graph graph = NULL;
        st = cuda_graph_capture_begin(b->s);
        for (int i = 0; i < 200 && st == PSHARD_OK; i++) st = cuda_add(b->y, b->x, 32, b->s);
        pshard_status end = cuda_graph_capture_end(b->s, &graph);
        st = st ? st : end;
        if (st == PSHARD_OK) {
            st = cuda_graph_launch(graph, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            const double t0 = core_now_ms();
            for (int r = 0; r < 20 && st == PSHARD_OK; r++) st = cuda_graph_launch(graph, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            p->graph_node_s = (core_now_ms() - t0) / 1e3 / (20 * 200);
        }
        if (graph) cuda_graph_destroy(graph);
    }
    /* Kernels reading pinned host memory in place (how small steps stream weights), over the
     * model's three matrix shapes -- wide, tall and square -- since a many-token product may
     * read its weights more than once, depending on the shape; from aligned memory, then from
     * as far past 256 bytes as the model's weights lie (or 32 bytes where they are aligned). */
    if (st == PSHARD_OK && sh->n_dense) {
        measure_report(req, "reading host memory in place", 0.9);
        st = in_place_dense(b, sh, 0, p->zero_copy);
        memcpy(p->zero_copy_off, p->zero_copy, sizeof p->zero_copy); /* unless measured below */
        if (st == PSHARD_OK && !measure_out_of_time()) st = in_place_dense(b, sh, p->in_place_skew, p->zero_copy_off);
    }
    /* The expert kernel reading the experts a token chose from host memory in place. */
    if (st == PSHARD_OK && sh->n_moe && cuda_type_supported(sh->gate[0]) && cuda_type_supported(sh->down[0]) &&
        !measure_out_of_time()) {
        measure_report(req, "reading experts in place", 0.92);
        st = zero_copy_experts(b, sh, p);
    }
    /* A copy, then a kernel reading host memory in place, each beside CPU matmuls: each one's
     * rate against its rate alone. */
    if (st == PSHARD_OK && sh->n_dense && !measure_out_of_time()) {
        measure_report(req, "copies and the CPU together", 0.95);
        struct cpu_bench c = {.pool = pool, .n_tokens = 1};
        c.x = calloc((size_t)sh->n_embd, sizeof(float));
        c.y = calloc((size_t)sh->rows, sizeof(float));
        c.acts = malloc(cpu_acts_bytes(QUANT_F32, sh->n_embd, 1));
        st = c.x && c.y && c.acts ? measure_synth_make(sh->dense[0], sh->rows, sh->n_embd, 1, BIG_BYTES, &c.gate)
                                  : core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
        const double cpu_alone = st == PSHARD_OK ? measure_time_steps(measure_cpu_matmul_step, &c) : 0;
        if (st == PSHARD_OK) {
            b->d2h = false, b->copy_bytes = profile_sizes[PROFILE_SIZES - 2], b->n_copies = 1;
            const double copy_alone = measure_time_steps(copy_step, b);
            st = beside_cpu(b, &c, measure_cpu_matmul_step, cpu_alone, (double)c.gate.bytes, copy_alone,
                            (double)b->copy_bytes, copy_unit, b->copy, p, &p->cpu_share_under_h2d,
                            &p->h2d_share_under_cpu);
        }
        if (st == PSHARD_OK) {
            st = gpu_matrix(b, sh->dense[0], sh->rows, sh->n_embd, 1, BIG_BYTES / 6, true, 0);
            b->n_tokens = 1;
            const double read_alone = st == PSHARD_OK ? measure_time_steps(gpu_matmul_step, b) / 4 : 0;
            if (st == PSHARD_OK)
                st = beside_cpu(b, &c, measure_cpu_matmul_step, cpu_alone, (double)c.gate.bytes, read_alone,
                                (double)b->m_bytes, in_place_unit, b->s, p, &p->cpu_share_under_reads,
                                &p->reads_share_under_cpu);
            cuda_pinned_release(&b->pinned);
        }
        measure_cpu_bench_close(&c);
    }
    cuda_pinned_release(&host);
    cuda_arena_reset(&b->arena, mark);
    return st ? st : b->st;
}

pshard_status measure_gpu_rates(const struct measure_request *req, const struct shapes *sh, struct threadpool *pool,
                                 struct profile *p) {
    struct gpu_bench b = {0};
    CORE_TRY(cuda_ctx_create(0, &b.cuda));
    char name[256];
    pshard_status st = cuda_device_identify(0, name, sizeof name, &p->fp.driver);
    if (st == PSHARD_OK) {
        snprintf(p->fp.gpu, sizeof p->fp.gpu, "%.127s", name);
        p->host_served_gbps = 0; /* raised by the probes that run both sides at once */
        p->has_gpu = true;
    }
    b.s = cuda_ctx_compute_stream(b.cuda);
    b.copy = cuda_ctx_copy_stream(b.cuda);
    p->in_place_skew = (int32_t)(sh->host_skew % 128 ? sh->host_skew : 32); /* the off-alignment tables' */
    const int64_t B = profile_tokens[PROFILE_TOKENS - 1];
    const int64_t width = sh->rows > sh->n_embd ? sh->rows : sh->n_embd, k = sh->k > 0 ? sh->k : 1;
    b.work_bytes = moe_work_bytes(sh, B);
    /* The fixed buffers, then room for matrices: as much as measure_gpu_room gives. */
    void *blas = NULL;
    const struct { size_t bytes; void **out; } fixed[] = {
        {CUDA_BLAS_WORKSPACE_BYTES, &blas},
        {sizeof(float) * B * width, (void **)&b.x},
        {sizeof(float) * B * width * k, (void **)&b.y},
        {b.work_bytes, &b.work},
        {sizeof(int32_t) * B * k, (void **)&b.ids},
        {sizeof(float) * B * k, (void **)&b.weights},
        {sizeof(int32_t) * B, (void **)&b.pos},
        {sizeof(int32_t) * B, (void **)&b.seq},
        {sizeof(float) * B * sh->attn.n_head * sh->attn.head_k, (void **)&b.q},
        {sizeof(float) * B * sh->attn.n_head * sh->attn.head_v, (void **)&b.out},
    };
    const size_t n_fixed = sizeof fixed / sizeof fixed[0];
    size_t fixed_bytes = 0;
    for (size_t i = 0; i < n_fixed; i++) fixed_bytes += cuda_align(fixed[i].bytes);
    uint64_t expert_bytes = 0; /* one expert's gate, up and down, of the model's first expert format */
    if (sh->n_moe)
        expert_bytes = 2 * quant_row_bytes(sh->gate[0], sh->n_embd) * (uint64_t)sh->n_ff_exp +
                       quant_row_bytes(sh->down[0], sh->n_ff_exp) * (uint64_t)sh->n_embd;
    struct gpu_room room;
    measure_gpu_room(fixed_bytes, b.work_bytes, expert_bytes, sh->n_expert, (int)k, req->vram_cap, &room);
    b.big = room.big, b.n_expert = room.experts;
    if (room.over_cap && req->progress) {
        char note[200];
        snprintf(note, sizeof note, "measuring the GPU takes %.0f MB of device memory for its seconds, more than the "
                 "budget's %.0f MB", room.arena / 1048576.0, req->vram_cap / 1048576.0);
        req->progress(req->user, note, -1);
    }
    if (st == PSHARD_OK) st = cuda_arena_create(&b.arena, room.arena);
    for (size_t i = 0; i < n_fixed && st == PSHARD_OK; i++) st = carve(&b, fixed[i].bytes, fixed[i].out);
    if (st == PSHARD_OK) st = cuda_ctx_set_blas_workspace(b.cuda, blas, CUDA_BLAS_WORKSPACE_BYTES);
    if (st == PSHARD_OK) st = cuda_memset(b.x, 0, sizeof(float) * B * width, b.s);
    if (st == PSHARD_OK) st = cuda_memset(b.q, 0, sizeof(float) * B * sh->attn.n_head * sh->attn.head_k, b.s);
    if (st == PSHARD_OK) st = cuda_memset(b.seq, 0, sizeof(int32_t) * B, b.s);
    if (st == PSHARD_OK) st = measure_gpu_tables(req, sh, &b, p);
    if (st == PSHARD_OK) st = measure_transfers(req, sh, &b, pool, p);
    cuda_arena_destroy(&b.arena);
    cuda_ctx_destroy(b.cuda);
    return st;
}
