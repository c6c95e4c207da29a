/* Measuring the CPU: matmuls and expert matmuls of the model's shapes and formats at every
 * token count, attention per KV byte, host reads, the thread pool's job cost. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "measure/measure_internal.h"
#include "plan/cost.h"
#include "quant/types.h"

void measure_cpu_matmul_step(void *arg, int rep) {
    struct cpu_bench *b = arg;
    const struct cpu_matrix m = measure_synth_copy(&b->gate, rep);
    cpu_matmul(b->pool, &m, b->x, b->n_tokens, b->y, b->acts);
}

void measure_route_random(struct cpu_bench *b, int n_expert, int rep) {
    uint32_t seed = 12345u + 7919u * (uint32_t)rep;
    for (int64_t t = 0; t < b->n_tokens; t++)
        for (int j = 0; j < b->k; j++) {
            int32_t e;
            bool again;
            do {
                seed = seed * 1664525u + 1013904223u;
                e = (int32_t)((seed >> 8) % (uint32_t)n_expert);
                again = false;
                for (int i = 0; i < j; i++) again |= b->ids[t * b->k + i] == e;
            } while (again);
            b->ids[t * b->k + j] = e;
            b->weights[t * b->k + j] = 1.0f / (float)b->k;
        }
}

void measure_cpu_experts_step(void *arg, int rep) {
    struct cpu_bench *b = arg;
    measure_route_random(b, (int)b->gate.m.n_experts, rep);
    const struct cpu_matrix g = measure_synth_copy(&b->gate, rep), u = measure_synth_copy(&b->up, rep), d = measure_synth_copy(&b->down, rep);
    struct cpu_acts acts;
    cpu_quantize_acts(b->pool, &g, b->x, b->n_tokens, b->acts, &acts);
    struct moe_routing routing = {b->n_tokens, b->k, b->ids, b->weights, 0, 0};
    cpu_moe(b->pool, &g, &u, &d, &acts, &routing, &b->scratch, b->y);
}

void measure_cpu_bench_close(struct cpu_bench *b) {
    free(b->x), free(b->y), free(b->acts), free(b->ids), free(b->weights), free(b->scratch_mem);
    free(b->kv), free(b->q), free(b->out), free(b->partial);
    free(b->gate.data), free(b->up.data), free(b->down.data);
    memset(b, 0, sizeof *b);
}

/* One token's experts limited to the last expert: the fixed cost of a call that computes few. */
static void cpu_experts_call_step(void *arg, int rep) {
    struct cpu_bench *b = arg;
    measure_route_random(b, (int)b->gate.m.n_experts, rep);
    struct cpu_acts acts;
    cpu_quantize_acts(b->pool, &b->gate.m, b->x, 1, b->acts, &acts);
    const int32_t last = (int32_t)b->gate.m.n_experts - 1;
    struct moe_routing routing = {1, b->k, b->ids, b->weights, last, last + 1};
    cpu_moe(b->pool, &b->gate.m, &b->up.m, &b->down.m, &acts, &routing, &b->scratch, b->y);
}

/* The units the executor runs (b->attn_units), split evenly: every token attends as many cells
 * here. */
static void cpu_attn_job(void *arg, int thread, int n_threads) {
    struct cpu_bench *b = arg;
    const struct cpu_attn_shape *a = b->attn;
    const struct cpu_attn_units *units = &b->attn_units;
    int64_t begin, end;
    threadpool_range(units->count, 1, thread, n_threads, &begin, &end);
    const struct cpu_kv_view kv = cpu_kv_contiguous(b->kv_at, b->kv_at + b->cells * a->n_head_kv * a->head_k);
    int64_t n_cells[CPU_ATTN_TILE_TOKENS];
    for (int i = 0; i < CPU_ATTN_TILE_TOKENS; i++) n_cells[i] = b->cells;
    for (int64_t u = begin; u < end; u++) {
        int64_t t0, t1;
        int h0, h1, split;
        cpu_attention_unit(a, units, u, &t0, &t1, &h0, &h1, &split);
        cpu_attention_run_unit(a, units, t0, t1, h0, h1, split, b->q, &kv, n_cells, b->partial, b->out);
    }
}

/* Each rep attends another copy of the cache (BIG_BYTES of them in all): a decode step's layers
 * each read their own, so the cache comes from memory, not from the L3. A layer's cache of 4096
 * cells is several MB, and read over and over from one copy it is timed far faster than a step
 * runs it. */
static void cpu_attn_step(void *arg, int rep) {
    struct cpu_bench *b = arg;
    b->kv_at = b->kv + b->kv_elems * (size_t)(rep % b->kv_copies);
    threadpool_run(b->pool, cpu_attn_job, arg);
    if (b->attn_units.splits > 1) cpu_attention_merge(b->attn, &b->attn_units, b->partial, b->out);
}

static void read_job(void *arg, int thread, int n_threads) {
    struct cpu_bench *b = arg;
    int64_t begin, end;
    threadpool_range((int64_t)b->mem_words, 512, thread, n_threads, &begin, &end);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t i = begin; i + 4 <= end; i += 4) s0 += b->mem[i], s1 += b->mem[i + 1], s2 += b->mem[i + 2], s3 += b->mem[i + 3];
    b->sums[thread & 255] += s0 ^ s1 ^ s2 ^ s3;
}

static void read_step(void *arg, int rep) {
    (void)rep;
    threadpool_run(((struct cpu_bench *)arg)->pool, read_job, arg);
}

/* GB/s of b->pool's threads reading BIG_BYTES of host memory, the best of three timings: the
 * profile's host_read_gbps. NAN when the buffer cannot be had. */
static double host_read_gbps(struct cpu_bench *b) {
    const size_t words = BIG_BYTES / 8;
    uint64_t *mem = malloc(words * 8);
    if (!mem) return NAN;
    measure_fill((uint8_t *)mem, words * 8, 5);
    b->mem = mem, b->mem_words = words;
    const double gbps = (double)words * 8 / measure_time_best(read_step, b) / 1e9;
    free(mem);
    b->mem = NULL, b->mem_words = 0;
    return gbps;
}

pshard_status measure_host_read(int n_threads, double *gbps) {
    struct cpu_bench b;
    memset(&b, 0, sizeof b);
    CORE_TRY(threadpool_create(n_threads, &b.pool));
    *gbps = host_read_gbps(&b);
    threadpool_free(b.pool);
    return isfinite(*gbps) ? PSHARD_OK : core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring host reads");
}

void measure_empty_job(void *arg, int thread, int n_threads) { (void)arg, (void)thread, (void)n_threads; }

static void empty_step(void *arg, int rep) {
    (void)rep;
    for (int i = 0; i < 100; i++) threadpool_run(((struct cpu_bench *)arg)->pool, measure_empty_job, arg);
}


/* Seconds per weight byte of a dense matmul of format t, `rows` rows of the model's width, at
 * the first n_points token counts (into s_per_byte): up to 4 tokens over BIG_BYTES, past that
 * SMALL_BYTES, each made once. */
static pshard_status measure_cpu_matmul_rows(struct cpu_bench *b, const struct shapes *sh, enum quant_type t, int64_t rows,
                                             int n_points, double *s_per_byte) {
    pshard_status st = PSHARD_OK;
    size_t made = 0;
    for (int i = 0; i < n_points && st == PSHARD_OK; i++) {
        b->n_tokens = profile_tokens[i];
        const size_t want = b->n_tokens <= 4 ? BIG_BYTES : SMALL_BYTES;
        if (want != made) {
            free(b->gate.data);
            b->gate.data = NULL;
            st = measure_synth_make(t, rows, sh->n_embd, 1, want, &b->gate);
            made = want;
        }
        if (st != PSHARD_OK) break;
        const double s = b->n_tokens <= 16 ? measure_time_best(measure_cpu_matmul_step, b) : measure_time_steps(measure_cpu_matmul_step, b);
        s_per_byte[i] = s / (double)b->gate.bytes;
    }
    free(b->gate.data);
    b->gate.data = NULL;
    return st;
}

/* The model's dense matrices' shape. */
static pshard_status measure_cpu_matmul(struct cpu_bench *b, const struct shapes *sh, enum quant_type t, int n_points,
                                        double *s_per_byte) {
    return measure_cpu_matmul_rows(b, sh, t, sh->rows, n_points, s_per_byte);
}

/* Every expert of a layer in the model's f-th formats (gate, up, down), BIG_BYTES in all; on a
 * failure the caller's close frees what was made. */
static pshard_status experts_make(struct cpu_bench *b, const struct shapes *sh, int f) {
    const int64_t E = sh->n_expert, ff = sh->n_ff_exp, d = sh->n_embd;
    CORE_TRY(measure_synth_make(sh->gate[f], ff, d, E, BIG_BYTES / 3, &b->gate));
    CORE_TRY(measure_synth_make(sh->gate[f], ff, d, E, BIG_BYTES / 3, &b->up));
    return measure_synth_make(sh->down[f], d, ff, E, BIG_BYTES / 3, &b->down);
}

/* Seconds per byte of the experts a step touches, for MoE FFNs of the model's f-th formats, at
 * the first n_points token counts (into s_per_byte); with call_s, a call's fixed cost too. */
static pshard_status measure_cpu_experts(struct cpu_bench *b, const struct shapes *sh, int f, int n_points,
                                         double *s_per_byte, double *call_s) {
    const int64_t E = sh->n_expert;
    b->k = sh->k;
    pshard_status st = experts_make(b, sh, f);
    const double expert = (double)(b->gate.bytes + b->up.bytes + b->down.bytes) / E;
    for (int i = 0; i < n_points && st == PSHARD_OK; i++) {
        b->n_tokens = profile_tokens[i];
        /* Bytes of the experts a random routing touches, on average. */
        const double touched = cost_touched((double)E, (double)E, sh->k, (double)b->n_tokens);
        const double s = b->n_tokens <= 16 ? measure_time_best(measure_cpu_experts_step, b) : measure_time_steps(measure_cpu_experts_step, b);
        s_per_byte[i] = s / (touched * expert);
        if (i == 0 && call_s) *call_s = measure_time_steps(cpu_experts_call_step, b);
    }
    free(b->gate.data), free(b->up.data), free(b->down.data);
    b->gate.data = b->up.data = b->down.data = NULL;
    return st;
}

/* Buffers for timing n_tokens tokens at most of sh's matmuls and experts (and with `attention`,
 * its attention); closed with measure_cpu_bench_close. */
static pshard_status bench_open(const struct shapes *sh, struct threadpool *pool, int64_t n_tokens, bool attention,
                                struct cpu_bench *b) {
    memset(b, 0, sizeof *b);
    b->pool = pool;
    const int64_t B = n_tokens;
    const int64_t width = sh->rows > sh->n_embd ? sh->rows : sh->n_embd;
    const int64_t k = sh->k > 0 ? sh->k : 1, E = sh->n_expert > 0 ? sh->n_expert : 1;
    b->x = calloc((size_t)B * width, sizeof(float));
    b->y = calloc((size_t)B * width * k, sizeof(float));
    b->acts = malloc(cpu_acts_bytes(QUANT_F32, width, B * k));
    b->ids = calloc((size_t)B * k, sizeof *b->ids);
    b->weights = calloc((size_t)B * k, sizeof *b->weights);
    const size_t scratch = sh->n_expert ? cpu_moe_scratch_bytes(B, (int)k, E, sh->n_embd, sh->n_ff_exp, QUANT_F32) : 0;
    b->scratch_mem = scratch ? malloc(scratch) : NULL;
    bool ok = b->x && b->y && b->acts && b->ids && b->weights && (!scratch || b->scratch_mem);
    if (attention) {
        const size_t kv_elems = (size_t)ATTN_CTX * sh->attn.n_head_kv * (sh->attn.head_k + sh->attn.head_v);
        b->kv_elems = kv_elems;
        b->kv_copies = (int)((BIG_BYTES + kv_elems * sizeof *b->kv - 1) / (kv_elems * sizeof *b->kv));
        b->kv = malloc(kv_elems * sizeof *b->kv * (size_t)b->kv_copies);
        b->q = calloc((size_t)B * sh->attn.n_head * sh->attn.head_k, sizeof(float));
        b->out = calloc((size_t)B * sh->attn.n_head * sh->attn.head_v, sizeof(float));
        b->partial = malloc(sizeof(float) * (size_t)cpu_attention_partial_floats_max(&sh->attn));
        ok = ok && b->kv && b->q && b->out && b->partial;
    }
    if (!ok) {
        measure_cpu_bench_close(b);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    }
    for (int64_t i = 0; i < B * width; i++) b->x[i] = (float)((i * 37) % 101 - 50) / 50.0f;
    if (attention) {
        for (int64_t i = 0; i < B * sh->attn.n_head * sh->attn.head_k; i++) b->q[i] = (float)((i * 13) % 29 - 14) / 14.0f;
        measure_fill((uint8_t *)b->kv, b->kv_elems * sizeof *b->kv * (size_t)b->kv_copies, 3);
    }
    if (scratch) cpu_moe_scratch_init(&b->scratch, b->scratch_mem, B, (int)k, E, sh->n_embd, sh->n_ff_exp, QUANT_F32);
    return PSHARD_OK;
}

pshard_status measure_cpu_experts_open(const struct shapes *sh, struct threadpool *pool, int64_t n_tokens,
                                       struct cpu_bench *b) {
    CORE_TRY(bench_open(sh, pool, n_tokens, false, b));
    b->n_tokens = n_tokens, b->k = sh->k;
    const pshard_status st = experts_make(b, sh, 0);
    if (st != PSHARD_OK) measure_cpu_bench_close(b);
    return st;
}

pshard_status measure_cpu_rates(const struct measure_request *req, const struct shapes *sh, struct threadpool *pool,
                                 struct profile *p) {
    struct cpu_bench b;
    pshard_status st = bench_open(sh, pool, profile_tokens[PROFILE_TOKENS - 1], true, &b);
    if (st != PSHARD_OK) return st;
    measure_report(req, "host memory", 0.0);
    const double gbps = host_read_gbps(&b);
    if (isfinite(gbps)) p->host_read_gbps = gbps;
    p->cpu_step_s = measure_time_best(empty_step, &b) / 100;
    for (int f = 0; f < sh->n_dense && st == PSHARD_OK && !measure_out_of_time(); f++) {
        measure_report(req, "CPU matmul", 0.05 + 0.25 * f / sh->n_dense);
        struct profile_rate *r = profile_rate_add(p->cpu_matmul, quant_type_name(sh->dense[f]));
        if (r) st = measure_cpu_matmul(&b, sh, sh->dense[f], PROFILE_TOKENS, r->s_per_byte);
    }
    /* An MoE layer's router (n_expert rows, often F32, about 1 MB) runs well below the rate of
     * the model's large matrices of its format (bench/RESULTS.md): timed at its own shape. */
    if (sh->has_router && st == PSHARD_OK && !measure_out_of_time()) {
        double router[PROFILE_TOKENS] = {0};
        measure_report(req, "CPU router", 0.29);
        st = measure_cpu_matmul_rows(&b, sh, sh->router, sh->n_expert, PROFILE_TOKENS, router);
        if (st == PSHARD_OK) memcpy(p->cpu_router, router, sizeof router);
    }
    for (int f = 0; f < sh->n_moe && st == PSHARD_OK && !measure_out_of_time(); f++) {
        measure_report(req, "CPU experts", 0.3 + 0.15 * f / sh->n_moe);
        struct profile_rate *r = profile_rate_add(p->cpu_experts, quant_type_name(sh->gate[f]));
        if (r) st = measure_cpu_experts(&b, sh, f, PROFILE_TOKENS, r->s_per_byte, f == 0 ? &p->cpu_moe_call_s : NULL);
    }
    if (st == PSHARD_OK) {
        measure_report(req, "CPU attention", 0.45);
        b.attn = &sh->attn;
        /* Per query head: each reads its KV head's cells (a format-9 profile counted each KV
         * byte once, which made a model with more query heads per KV head look faster). */
        const double kv_per_cell = (double)sh->attn.n_head * (sh->attn.head_k + sh->attn.head_v) * 2;
        for (int i = 0; i < PROFILE_TOKENS; i++) {
            b.n_tokens = profile_tokens[i] < 64 ? profile_tokens[i] : 64; /* the rate is flat past this */
            b.cells = profile_tokens[i] < 64 ? ATTN_CTX : ATTN_CTX_PROMPT;
            cpu_attention_units(b.attn, b.n_tokens, b.cells, true, threadpool_size(b.pool), &b.attn_units);
            p->cpu_attn[i] = measure_time_best(cpu_attn_step, &b) / ((double)b.n_tokens * b.cells * kv_per_cell);
        }
    }
    measure_cpu_bench_close(&b);
    return st;
}

_Static_assert(CPU_SAMPLE_DENSE <= CPU_SAMPLE_EXPERTS, "a sample's buffers are sized for its experts' steps");

pshard_status measure_cpu_sample(const struct shapes *sh, struct threadpool *pool, const struct cpu_sample *which,
                                 struct cpu_sample *s) {
    memset(s, 0, sizeof *s);
    struct cpu_bench b;
    CORE_TRY(bench_open(sh, pool, profile_tokens[CPU_SAMPLE_EXPERTS - 1], false, &b));
    const double gbps = host_read_gbps(&b);
    s->host_read_gbps = isfinite(gbps) ? gbps : 0;
    pshard_status st = PSHARD_OK;
    for (int f = 0; f < sh->n_dense && st == PSHARD_OK && !measure_out_of_time(); f++)
        if (which->dense[f][0] > 0) st = measure_cpu_matmul(&b, sh, sh->dense[f], CPU_SAMPLE_DENSE, s->dense[f]);
    for (int f = 0; f < sh->n_moe && st == PSHARD_OK && !measure_out_of_time(); f++)
        if (which->experts[f][0] > 0) st = measure_cpu_experts(&b, sh, f, CPU_SAMPLE_EXPERTS, s->experts[f], NULL);
    measure_cpu_bench_close(&b);
    return st;
}

void measure_cpu_sample_of(const struct profile *p, const struct shapes *sh, struct cpu_sample *s) {
    memset(s, 0, sizeof *s);
    s->host_read_gbps = p->host_read_gbps;
    for (int f = 0; f < sh->n_dense; f++) {
        const struct profile_rate *r = profile_rate_find(p->cpu_matmul, quant_type_name(sh->dense[f]));
        for (int i = 0; r && i < CPU_SAMPLE_DENSE; i++) s->dense[f][i] = r->s_per_byte[i];
    }
    for (int f = 0; f < sh->n_moe; f++) {
        const struct profile_rate *r = profile_rate_find(p->cpu_experts, quant_type_name(sh->gate[f]));
        for (int i = 0; r && i < CPU_SAMPLE_EXPERTS; i++) s->experts[f][i] = r->s_per_byte[i];
    }
}

/* The rate of `format` in table, where the table has one. */
static struct profile_rate *rate_of(struct profile_rate table[PROFILE_FORMATS], enum quant_type format) {
    return profile_rate_find(table, quant_type_name(format)) ? profile_rate_add(table, quant_type_name(format)) : NULL;
}

void measure_cpu_settle(const struct shapes *sh, const struct cpu_sample *s, int n, struct profile *p) {
    double v[CPU_SAMPLES];
    if (n < 1 || n > CPU_SAMPLES) return;
    for (int k = 0; k < n; k++) v[k] = s[k].host_read_gbps;
    measure_median(v, n, &p->host_read_gbps);
    for (int f = 0; f < sh->n_dense; f++) {
        struct profile_rate *r = rate_of(p->cpu_matmul, sh->dense[f]);
        for (int i = 0; r && i < CPU_SAMPLE_DENSE; i++) {
            for (int k = 0; k < n; k++) v[k] = s[k].dense[f][i];
            measure_median(v, n, &r->s_per_byte[i]);
        }
    }
    for (int f = 0; f < sh->n_moe; f++) {
        struct profile_rate *r = rate_of(p->cpu_experts, sh->gate[f]);
        for (int i = 0; r && i < CPU_SAMPLE_EXPERTS; i++) {
            for (int k = 0; k < n; k++) v[k] = s[k].experts[f][i];
            measure_median(v, n, &r->s_per_byte[i]);
        }
    }
}
