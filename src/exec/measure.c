/* Measuring this machine (see measure.h). Every figure is a timed loop of the kernels the
 * executor runs, on buffers of the model's shapes larger than the caches. Weight bytes are a
 * fixed pattern whose every 16- and 32-bit float is normal and small, so no format's kernel
 * meets NaNs or denormals. */
#include "exec/measure.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "cpu/attention.h"
#include "cpu/cpu_ops.h"
#include "cpu/moe.h"
#include "cuda/cuda_backend.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

enum {
    BIG_BYTES = 384 << 20,   /* working set of bandwidth-bound loops: past any L3 */
    SMALL_BYTES = 48 << 20,  /* compute-bound loops (many tokens) */
    ATTN_CTX = 4096,         /* cells a decode token attends */
    ATTN_CTX_PROMPT = 1024,  /* cells each prompt token attends (prompt steps) */
};
static const double TARGET_S = 0.03; /* time per measured point */
/* Measuring stops adding formats and optional figures past this (what is left keeps the
 * defaults, or the slowest measured format's rates), so a run stays under a minute. */
static const double BUDGET_S = 50;
static double deadline_ms;

static bool out_of_time(void) { return core_now_ms() > deadline_ms; }

/* ---- shapes to measure */

struct shapes {
    int64_t n_embd, rows, n_ff_exp;
    int n_expert, k;
    struct cpu_attn_shape attn;
    enum quant_type dense[PROFILE_FORMATS], gate[PROFILE_FORMATS], down[PROFILE_FORMATS];
    int n_dense, n_moe;
};

static void add_type(enum quant_type *list, int *n, enum quant_type t) {
    for (int i = 0; i < *n; i++)
        if (list[i] == t) return;
    if (*n < PROFILE_FORMATS && quant_kernels_get(t)) list[(*n)++] = t;
}

static bool name_has(const struct gguf_str *name, const char *part) {
    return name->data && memmem(name->data, name->len, part, strlen(part)) != NULL;
}

static void shapes_of(const struct model *m, struct shapes *s) {
    memset(s, 0, sizeof *s);
    if (!m) {
        s->n_embd = s->rows = 4096;
        s->attn = (struct cpu_attn_shape){32, 8, 128, 128, 0.088f};
        add_type(s->dense, &s->n_dense, QUANT_Q4_0);
        add_type(s->dense, &s->n_dense, QUANT_Q8_0);
        add_type(s->dense, &s->n_dense, QUANT_F16);
        return;
    }
    const struct model_hparams *hp = &m->hp;
    s->n_embd = hp->n_embd;
    s->rows = hp->n_ff ? hp->n_ff : 4 * (int64_t)hp->n_embd;
    s->n_ff_exp = hp->n_ff_expert;
    s->n_expert = (int)hp->n_expert;
    s->k = (int)hp->n_expert_used;
    s->attn = (struct cpu_attn_shape){(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v,
                                      1.0f / sqrtf((float)hp->head_dim_k)};
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *sh = &m->shards[i];
        for (uint32_t t = 0; t < sh->n_tensors; t++) {
            const struct gguf_tensor *g = sh->tensors[t];
            if (g->n_dims < 2 || g->ne[1] <= 1) continue;
            if (g->n_dims >= 3 && g->ne[2] > 1) {
                if (name_has(&g->name, "gate_exps")) add_type(s->gate, &s->n_moe, (enum quant_type)g->type);
                if (name_has(&g->name, "down_exps") && s->n_moe) s->down[s->n_moe - 1] = (enum quant_type)g->type;
            } else if (sh->kind != SHARD_EMBED) {
                add_type(s->dense, &s->n_dense, (enum quant_type)g->type);
            }
        }
    }
    for (int i = 0; i < s->n_moe; i++)
        if (!s->down[i]) s->down[i] = s->gate[i];
}

/* ---- timing */

typedef void (*step_fn)(void *arg, int rep);

/* Mean seconds of one call of fn after a warm-up call, over at least 2 calls and TARGET_S. */
static double time_steps(step_fn fn, void *arg);

/* The best of three such means: a loop that shares the machine with something else for a moment
 * (the kernel settling after a large write, another process) reads slower, never faster. */
static double time_best(step_fn fn, void *arg);

static double time_steps(step_fn fn, void *arg) {
    fn(arg, 0);
    const double t0 = core_now_ms();
    int reps = 0;
    double elapsed;
    do {
        fn(arg, ++reps);
        elapsed = (core_now_ms() - t0) / 1e3;
    } while (reps < 2 || elapsed < TARGET_S);
    return elapsed / reps;
}

static double time_best(step_fn fn, void *arg) {
    double best = time_steps(fn, arg);
    for (int i = 0; i < 2; i++) {
        const double t = time_steps(fn, arg);
        best = t < best ? t : best;
    }
    return best;
}

/* Bytes of the fill pattern: each byte in [0x11, 0x3b]. */
static void fill_pattern(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(0x11 + (seed >> 24) % 0x2b);
    }
}

/* n copies of a rows x cols matrix (copies cycle, so a loop reads fresh memory each call). */
struct synth {
    struct cpu_matrix m;
    size_t bytes; /* one copy */
    int copies;
    uint8_t *data;
};

static pshard_status synth_make(enum quant_type type, int64_t rows, int64_t cols, int64_t experts, size_t want,
                                struct synth *s) {
    memset(s, 0, sizeof *s);
    const size_t row = quant_row_bytes(type, cols);
    if (!row) return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: a row of %lld does not fill blocks", quant_type_name(type),
                               (long long)cols);
    s->bytes = row * (size_t)rows * (size_t)experts;
    s->copies = (int)((want + s->bytes - 1) / s->bytes);
    if (s->copies < 1) s->copies = 1;
    s->data = malloc(s->bytes * s->copies);
    if (!s->data) return core_fail(PSHARD_ERR_NOMEM, "cannot allocate %.0f MB to measure", s->bytes * s->copies / 1e6);
    fill_pattern(s->data, s->bytes, 7);
    for (int c = 1; c < s->copies; c++) memcpy(s->data + s->bytes * c, s->data, s->bytes);
    s->m = (struct cpu_matrix){type, s->data, cols, rows, experts, row, quant_kernels_get(type)};
    return PSHARD_OK;
}

static struct cpu_matrix synth_copy(const struct synth *s, int rep) {
    struct cpu_matrix m = s->m;
    m.data = s->data + s->bytes * (size_t)(rep % s->copies);
    return m;
}

/* ---- the CPU */

struct cpu_bench {
    struct threadpool *pool;
    float *x, *y;
    void *acts;
    int64_t n_tokens;
    struct synth gate, up, down;
    /* experts */
    int32_t *ids;
    float *weights;
    struct moe_scratch scratch;
    void *scratch_mem;
    int k;
    uint64_t touched_bytes;
    /* attention */
    const struct cpu_attn_shape *attn;
    uint16_t *kv;
    int64_t cells;
    float *q, *out;
    /* host reads */
    const uint64_t *mem;
    size_t mem_words;
    uint64_t sums[256];
    double call_s; /* cpu_moe's fixed cost */
};

static void cpu_matmul_step(void *arg, int rep) {
    struct cpu_bench *b = arg;
    const struct cpu_matrix m = synth_copy(&b->gate, rep);
    cpu_matmul(b->pool, &m, b->x, b->n_tokens, b->y, b->acts);
}

static void route_random(struct cpu_bench *b, int n_expert, int rep) {
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

static void cpu_experts_step(void *arg, int rep) {
    struct cpu_bench *b = arg;
    route_random(b, (int)b->gate.m.n_experts, rep);
    const struct cpu_matrix g = synth_copy(&b->gate, rep), u = synth_copy(&b->up, rep), d = synth_copy(&b->down, rep);
    struct cpu_acts acts;
    cpu_quantize_acts(b->pool, &g, b->x, b->n_tokens, b->acts, &acts);
    struct moe_routing routing = {b->n_tokens, b->k, b->ids, b->weights, 0, 0};
    cpu_moe(b->pool, &g, &u, &d, &acts, &routing, &b->scratch, b->y);
}

/* One token's experts limited to the last expert: the fixed cost of a call that computes few. */
static void cpu_experts_call_step(void *arg, int rep) {
    struct cpu_bench *b = arg;
    route_random(b, (int)b->gate.m.n_experts, rep);
    struct cpu_acts acts;
    cpu_quantize_acts(b->pool, &b->gate.m, b->x, 1, b->acts, &acts);
    const int32_t last = (int32_t)b->gate.m.n_experts - 1;
    struct moe_routing routing = {1, b->k, b->ids, b->weights, last, last + 1};
    cpu_moe(b->pool, &b->gate.m, &b->up.m, &b->down.m, &acts, &routing, &b->scratch, b->y);
}

static void cpu_attn_job(void *arg, int thread, int n_threads) {
    struct cpu_bench *b = arg;
    const struct cpu_attn_shape *a = b->attn;
    const int64_t units = b->n_tokens * a->n_head;
    int64_t begin, end;
    threadpool_range(units, 1, thread, n_threads, &begin, &end);
    const uint16_t *k = b->kv, *v = b->kv + b->cells * a->n_head_kv * a->head_k;
    for (int64_t u = begin; u < end; u++) {
        const int64_t t = u / a->n_head, h = u % a->n_head;
        cpu_attention_heads(a, b->q + t * a->n_head * a->head_k, k, v, b->cells, (int)h, (int)h + 1,
                            b->out + t * a->n_head * a->head_v);
    }
}

static void cpu_attn_step(void *arg, int rep) {
    (void)rep;
    threadpool_run(((struct cpu_bench *)arg)->pool, cpu_attn_job, arg);
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

static void empty_job(void *arg, int thread, int n_threads) { (void)arg, (void)thread, (void)n_threads; }

static void empty_step(void *arg, int rep) {
    (void)rep;
    for (int i = 0; i < 100; i++) threadpool_run(((struct cpu_bench *)arg)->pool, empty_job, arg);
}

static void report(const struct measure_request *req, const char *what, double done) {
    if (req->progress) req->progress(req->user, what, done);
}

/* Seconds per weight byte of a dense matmul of format t at every token count. */
static pshard_status measure_cpu_matmul(struct cpu_bench *b, const struct shapes *sh, enum quant_type t,
                                        struct profile_rate *rate) {
    for (int i = 0; i < PROFILE_TOKENS; i++) {
        b->n_tokens = profile_tokens[i];
        CORE_TRY(synth_make(t, sh->rows, sh->n_embd, 1, b->n_tokens <= 4 ? BIG_BYTES : SMALL_BYTES, &b->gate));
        const double s = b->n_tokens <= 16 ? time_best(cpu_matmul_step, b) : time_steps(cpu_matmul_step, b);
        rate->s_per_byte[i] = s / (double)b->gate.bytes;
        free(b->gate.data);
        b->gate.data = NULL;
    }
    return PSHARD_OK;
}

/* Seconds per byte of the experts a step touches, for MoE FFNs of these formats. */
static pshard_status measure_cpu_experts(struct cpu_bench *b, const struct shapes *sh, int f, struct profile_rate *rate) {
    const int64_t E = sh->n_expert, ff = sh->n_ff_exp, d = sh->n_embd;
    pshard_status st = PSHARD_OK;
    for (int i = 0; i < PROFILE_TOKENS && st == PSHARD_OK; i++) {
        b->n_tokens = profile_tokens[i];
        b->k = sh->k;
        st = synth_make(sh->gate[f], ff, d, E, BIG_BYTES / 3, &b->gate);
        if (st == PSHARD_OK) st = synth_make(sh->gate[f], ff, d, E, BIG_BYTES / 3, &b->up);
        if (st == PSHARD_OK) st = synth_make(sh->down[f], d, ff, E, BIG_BYTES / 3, &b->down);
        if (st == PSHARD_OK) {
            /* Bytes of the experts a random routing touches, on average. */
            const double touched = E * (1 - pow(1 - (double)sh->k / E, (double)b->n_tokens));
            const double expert = (double)(b->gate.bytes + b->up.bytes + b->down.bytes) / E;
            const double s = b->n_tokens <= 16 ? time_best(cpu_experts_step, b) : time_steps(cpu_experts_step, b);
            rate->s_per_byte[i] = s / (touched * expert);
            if (i == 0) {
                b->n_tokens = 1;
                b->call_s = time_steps(cpu_experts_call_step, b);
            }
        }
        free(b->gate.data), free(b->up.data), free(b->down.data);
        b->gate.data = b->up.data = b->down.data = NULL;
    }
    return st;
}

static pshard_status measure_cpu(const struct measure_request *req, const struct shapes *sh, struct threadpool *pool,
                                 struct profile *p) {
    struct cpu_bench b = {.pool = pool};
    const int64_t B = profile_tokens[PROFILE_TOKENS - 1];
    const int64_t width = sh->rows > sh->n_embd ? sh->rows : sh->n_embd;
    const int64_t k = sh->k > 0 ? sh->k : 1, E = sh->n_expert > 0 ? sh->n_expert : 1;
    const size_t kv_cells = ATTN_CTX, kv_elems = kv_cells * (size_t)sh->attn.n_head_kv * (sh->attn.head_k + sh->attn.head_v);
    b.x = calloc((size_t)B * width, sizeof(float));
    b.y = calloc((size_t)B * width * k, sizeof(float));
    b.acts = malloc(cpu_acts_bytes(QUANT_F32, width, B * k));
    b.ids = calloc((size_t)B * k, sizeof *b.ids);
    b.weights = calloc((size_t)B * k, sizeof *b.weights);
    b.kv = malloc(kv_elems * sizeof *b.kv);
    b.q = calloc((size_t)B * sh->attn.n_head * sh->attn.head_k, sizeof(float));
    b.out = calloc((size_t)B * sh->attn.n_head * sh->attn.head_v, sizeof(float));
    const size_t scratch = sh->n_expert ? cpu_moe_scratch_bytes(B, (int)k, E, sh->n_embd, sh->n_ff_exp, QUANT_F32) : 0;
    b.scratch_mem = scratch ? malloc(scratch) : NULL;
    pshard_status st = PSHARD_OK;
    if (!b.x || !b.y || !b.acts || !b.ids || !b.weights || !b.kv || !b.q || !b.out || (scratch && !b.scratch_mem))
        st = core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    if (st == PSHARD_OK) {
        for (int64_t i = 0; i < B * width; i++) b.x[i] = (float)((i * 37) % 101 - 50) / 50.0f;
        for (int64_t i = 0; i < B * sh->attn.n_head * sh->attn.head_k; i++) b.q[i] = (float)((i * 13) % 29 - 14) / 14.0f;
        fill_pattern((uint8_t *)b.kv, kv_elems * sizeof *b.kv, 3);
        if (scratch) cpu_moe_scratch_init(&b.scratch, b.scratch_mem, B, (int)k, E, sh->n_embd, sh->n_ff_exp, QUANT_F32);

        report(req, "host memory", 0.0);
        const size_t words = BIG_BYTES / 8;
        uint64_t *mem = malloc(words * 8);
        if (mem) {
            fill_pattern((uint8_t *)mem, words * 8, 5);
            b.mem = mem, b.mem_words = words;
            p->host_read_gbps = (double)words * 8 / time_best(read_step, &b) / 1e9;
            free(mem);
        }
        p->cpu_step_s = time_steps(empty_step, &b) / 100;
    }
    for (int f = 0; f < sh->n_dense && st == PSHARD_OK && !out_of_time(); f++) {
        report(req, "CPU matmul", 0.05 + 0.25 * f / sh->n_dense);
        struct profile_rate *r = profile_rate_add(p->cpu_matmul, quant_type_name(sh->dense[f]));
        if (r) st = measure_cpu_matmul(&b, sh, sh->dense[f], r);
    }
    for (int f = 0; f < sh->n_moe && st == PSHARD_OK && !out_of_time(); f++) {
        report(req, "CPU experts", 0.3 + 0.15 * f / sh->n_moe);
        struct profile_rate *r = profile_rate_add(p->cpu_experts, quant_type_name(sh->gate[f]));
        if (r) st = measure_cpu_experts(&b, sh, f, r);
        if (f == 0) p->cpu_moe_call_s = b.call_s;
    }
    if (st == PSHARD_OK) {
        report(req, "CPU attention", 0.45);
        b.attn = &sh->attn;
        const double kv_per_cell = (double)sh->attn.n_head_kv * (sh->attn.head_k + sh->attn.head_v) * 2;
        for (int i = 0; i < PROFILE_TOKENS; i++) {
            b.n_tokens = profile_tokens[i] < 64 ? profile_tokens[i] : 64; /* the rate is flat past this */
            b.cells = profile_tokens[i] < 64 ? ATTN_CTX : ATTN_CTX_PROMPT;
            p->cpu_attn[i] = time_best(cpu_attn_step, &b) / ((double)b.n_tokens * b.cells * kv_per_cell);
        }
    }
    free(b.x), free(b.y), free(b.acts), free(b.ids), free(b.weights), free(b.kv), free(b.q), free(b.out);
    free(b.scratch_mem);
    return st;
}

/* ---- the GPU */

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
    size_t copy_bytes;
    int n_copies;
    bool d2h;
    struct cuda_pinned pinned;
    cuda_event ready;
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
        if (b->n_tokens > 1 && cuda_attention_prefill_supported(&b->attn))
            keep(b, cuda_attention_prefill(&b->attn, &b->kv, b->q, 0, b->pos, b->n_tokens, b->out, b->s));
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

/* The executor's hand-off of a split MoE layer: GPU work (a layer's worth, ~0.1 ms), the
 * routing copied down and an event; the host waits on it, runs its thread-pool jobs, copies the
 * result up; the GPU adds it. With gpu_work alone: the same GPU work without the hand-off. */
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
        keep(b, cuda_copy_d2h(b->host, b->x, 16384, b->s));
        keep(b, cuda_event_record(b->ready, b->s));
        keep(b, cuda_event_sync(b->ready));
        for (int j = 0; j < 3; j++) threadpool_run(b->pool, empty_job, NULL);
        keep(b, cuda_copy_h2d(b->x, b->host, 16384, b->s));
        keep(b, cuda_add(b->y, b->x, 4096, b->s));
    }
    gpu_sync_step(b);
}

static pshard_status carve(struct gpu_bench *b, size_t bytes, void **out) {
    return cuda_arena_alloc(&b->arena, bytes, "measure", out);
}

/* A matrix of the model's shape in VRAM (copies of it, for bandwidth-bound loops), or in
 * pinned host memory (zero_copy). */
static pshard_status gpu_matrix(struct gpu_bench *b, enum quant_type t, int64_t rows, int64_t cols, int64_t experts,
                                size_t want, bool zero_copy) {
    const size_t row = quant_row_bytes(t, cols);
    b->m = (struct cuda_matrix){t, NULL, cols, rows, experts, row};
    b->m_bytes = cuda_align(row * (size_t)rows * (size_t)experts);
    b->copies = (int)((want + b->m_bytes - 1) / b->m_bytes);
    if (b->copies < 1) b->copies = 1;
    uint8_t *host = malloc(b->m_bytes);
    if (!host) return core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    fill_pattern(host, b->m_bytes, 9);
    void *dev = NULL;
    pshard_status st;
    if (zero_copy) {
        st = cuda_host_alloc(b->m_bytes * b->copies, &b->pinned);
        for (int c = 0; st == PSHARD_OK && c < b->copies; c++) memcpy((uint8_t *)b->pinned.ptr + b->m_bytes * c, host, b->m_bytes);
        if (st == PSHARD_OK) st = cuda_host_device_pointer(b->pinned.ptr, (const void **)&dev);
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

static pshard_status zero_copy_experts(struct gpu_bench *b, const struct shapes *sh, struct profile *p) {
    const int64_t E = sh->n_expert, ff = sh->n_ff_exp, d = sh->n_embd;
    const size_t gate = cuda_align(quant_row_bytes(sh->gate[0], d) * (size_t)ff * E);
    const size_t down = cuda_align(quant_row_bytes(sh->down[0], ff) * (size_t)d * E);
    struct cuda_pinned host = {0};
    CORE_TRY(cuda_host_alloc(2 * gate + down, &host));
    fill_pattern(host.ptr, 2 * gate + down, 13);
    const uint8_t *dev = NULL;
    pshard_status st = cuda_host_device_pointer(host.ptr, (const void **)&dev);
    b->moe.gate = (struct cuda_matrix){sh->gate[0], dev, d, ff, E, quant_row_bytes(sh->gate[0], d)};
    b->moe.up = (struct cuda_matrix){sh->gate[0], dev + gate, d, ff, E, quant_row_bytes(sh->gate[0], d)};
    b->moe.down = (struct cuda_matrix){sh->down[0], dev + 2 * gate, ff, d, E, quant_row_bytes(sh->down[0], ff)};
    b->moe.n_expert = (int)E, b->moe.k = sh->k;
    const int64_t B = profile_tokens[PROFILE_TOKENS - 1];
    int32_t *ids = malloc(sizeof *ids * B * sh->k);
    float *w = malloc(sizeof *w * B * sh->k);
    if (!ids || !w) st = core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    const double expert = (double)(2 * gate + down) / E;
    /* Each routing's first read: 4 routings per token count, each timed once. */
    for (int i = 0; st == PSHARD_OK && i < PROFILE_TOKENS; i++) {
        b->n_tokens = profile_tokens[i];
        if (cuda_moe_work_bytes(&b->moe, b->n_tokens) > b->work_bytes) continue;
        struct cpu_bench route = {.ids = ids, .weights = w, .n_tokens = b->n_tokens, .k = sh->k};
        double total = 0;
        for (int r = 0; st == PSHARD_OK && r < 4; r++) {
            route_random(&route, (int)E, 100 * i + r);
            st = cuda_copy_h2d(b->ids, ids, sizeof *ids * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_copy_h2d(b->weights, w, sizeof *w * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            const double t0 = core_now_ms();
            if (st == PSHARD_OK)
                st = cuda_moe_ffn(&b->moe, b->x, b->ids, b->weights, b->n_tokens, b->y, false, b->work, b->work_bytes, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            total += (core_now_ms() - t0) / 1e3;
        }
        const double touched = E * (1 - pow(1 - (double)sh->k / E, (double)b->n_tokens));
        p->zero_copy_experts[i] = total / 4 / (touched * expert);
    }
    free(ids), free(w);
    cuda_pinned_release(&host);
    return st;
}

static pshard_status measure_gpu_tables(const struct measure_request *req, const struct shapes *sh, struct gpu_bench *b,
                                        struct profile *p) {
    const size_t mark = cuda_arena_mark(&b->arena);
    for (int f = 0; f < sh->n_dense && !out_of_time(); f++) {
        report(req, "GPU matmul", 0.5 + 0.15 * f / sh->n_dense);
        struct profile_rate *r = profile_rate_add(p->gpu_matmul, quant_type_name(sh->dense[f]));
        if (!r || !cuda_type_supported(sh->dense[f])) continue;
        for (int i = 0; i < PROFILE_TOKENS; i++) {
            b->n_tokens = profile_tokens[i];
            CORE_TRY(gpu_matrix(b, sh->dense[f], sh->rows, sh->n_embd, 1, b->n_tokens <= 16 ? 4 * BIG_BYTES : SMALL_BYTES,
                                false));
            r->s_per_byte[i] = time_steps(gpu_matmul_step, b) / 4 / (double)b->m_bytes;
            cuda_arena_reset(&b->arena, mark);
        }
    }
    for (int f = 0; f < sh->n_moe && !out_of_time(); f++) {
        report(req, "GPU experts", 0.65 + 0.1 * f / sh->n_moe);
        struct profile_rate *r = profile_rate_add(p->gpu_experts, quant_type_name(sh->gate[f]));
        if (!r || !cuda_type_supported(sh->gate[f]) || !cuda_type_supported(sh->down[f])) continue;
        const int64_t E = sh->n_expert, ff = sh->n_ff_exp, d = sh->n_embd;
        CORE_TRY(gpu_matrix(b, sh->gate[f], ff, d, E, 0, false));
        b->moe.gate = b->m;
        CORE_TRY(gpu_matrix(b, sh->gate[f], ff, d, E, 0, false));
        b->moe.up = b->m;
        CORE_TRY(gpu_matrix(b, sh->down[f], d, ff, E, 0, false));
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
            route_random(&route, (int)E, i);
            st = cuda_copy_h2d(b->ids, ids, sizeof *ids * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_copy_h2d(b->weights, w, sizeof *w * b->n_tokens * sh->k, b->s);
            if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
            if (cuda_moe_work_bytes(&b->moe, b->n_tokens) > b->work_bytes) continue;
            const double touched = E * (1 - pow(1 - (double)sh->k / E, (double)b->n_tokens));
            r->s_per_byte[i] = time_steps(gpu_experts_step, b) / 4 / (touched * expert);
        }
        free(ids), free(w);
        CORE_TRY(st);
        cuda_arena_reset(&b->arena, mark);
    }
    /* A small kernel's shortest run: products of a few rows, replayed as a graph (each product
     * is two kernels: the activations' quantization and the matvec). */
    if (sh->n_dense && cuda_type_supported(sh->dense[0])) {
        CORE_TRY(gpu_matrix(b, sh->dense[0], 256, sh->n_embd, 1, 0, false));
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
    /* Attention over a cache of ATTN_CTX cells. */
    report(req, "GPU attention", 0.75);
    const struct cpu_attn_shape *a = &sh->attn;
    b->attn = (struct cuda_attn_shape){a->n_head, a->n_head_kv, a->head_k, a->head_v, a->scale};
    const double kv_per_cell = (double)a->n_head_kv * (a->head_k + a->head_v) * 2;
    CORE_TRY(carve(b, sizeof(uint16_t) * ATTN_CTX * a->n_head_kv * a->head_k, (void **)&b->kv.k));
    CORE_TRY(carve(b, sizeof(uint16_t) * ATTN_CTX * a->n_head_kv * a->head_v, (void **)&b->kv.v));
    CORE_TRY(cuda_memset(b->kv.k, 0x22, sizeof(uint16_t) * ATTN_CTX * a->n_head_kv * a->head_k, b->s));
    CORE_TRY(cuda_memset(b->kv.v, 0x22, sizeof(uint16_t) * ATTN_CTX * a->n_head_kv * a->head_v, b->s));
    b->kv.seq_stride_k = (int64_t)ATTN_CTX * a->n_head_kv * a->head_k;
    b->kv.seq_stride_v = (int64_t)ATTN_CTX * a->n_head_kv * a->head_v;
    const int64_t B = profile_tokens[PROFILE_TOKENS - 1];
    int32_t *pos = malloc(sizeof *pos * B);
    if (!pos) return core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
    for (int i = 0; i < PROFILE_TOKENS; i++) {
        b->n_tokens = profile_tokens[i];
        /* Decode-sized steps attend the whole cache; prompt steps their own causal window. */
        b->cells = b->n_tokens < 64 ? ATTN_CTX : ATTN_CTX_PROMPT;
        const int64_t n = b->n_tokens < 64 ? b->n_tokens : (b->n_tokens < ATTN_CTX_PROMPT ? b->n_tokens : ATTN_CTX_PROMPT);
        for (int64_t t = 0; t < n; t++) pos[t] = (int32_t)(b->n_tokens < 64 ? ATTN_CTX - 1 : ATTN_CTX_PROMPT - n + t);
        b->n_tokens = n;
        pshard_status st = cuda_copy_h2d(b->pos, pos, sizeof *pos * n, b->s);
        if (st == PSHARD_OK) st = cuda_stream_sync(b->s);
        if (st != PSHARD_OK) {
            free(pos);
            return st;
        }
        if (cuda_attention_decode_work_bytes(&b->attn, n, (int32_t)b->cells) > b->work_bytes) continue;
        /* Prompt tokens attend on average half their window. */
        const double cells = b->n_tokens < 64 && profile_tokens[i] < 64 ? (double)b->cells : (double)ATTN_CTX_PROMPT - n / 2.0;
        p->gpu_attn[i] = time_steps(gpu_attn_step, b) / 4 / ((double)n * cells * kv_per_cell);
    }
    free(pos);
    cuda_arena_reset(&b->arena, mark);
    return b->st;
}

static pshard_status measure_transfers(const struct measure_request *req, const struct shapes *sh, struct gpu_bench *b,
                                       struct threadpool *pool, struct profile *p) {
    report(req, "PCIe copies", 0.8);
    const size_t mark = cuda_arena_mark(&b->arena);
    struct cuda_pinned host = {0};
    CORE_TRY(cuda_host_alloc(profile_sizes[PROFILE_SIZES - 1], &host));
    pshard_status st = carve(b, profile_sizes[PROFILE_SIZES - 1], &b->dev);
    b->host = host.ptr;
    for (int dir = 0; dir < 2 && st == PSHARD_OK; dir++)
        for (int i = 0; i < PROFILE_SIZES; i++) {
            b->d2h = dir == 1;
            b->copy_bytes = profile_sizes[i];
            b->n_copies = (int)(256 * 1048576.0 / b->copy_bytes) + 1;
            if (b->n_copies > 64) b->n_copies = 64;
            const double s = time_steps(copy_step, b) / b->n_copies;
            (dir ? p->d2h_gbps : p->h2d_gbps)[i] = b->copy_bytes / s / 1e9;
        }
    /* Latencies. */
    if (st == PSHARD_OK) {
        report(req, "latencies", 0.85);
        p->launch_s = time_steps(launch_step, b) / 200;
        p->sync_s = time_steps(sync_step, b) / 200;
        b->pool = pool;
        st = cuda_event_create(false, &b->ready);
        if (st == PSHARD_OK) p->round_trip_s = (time_steps(round_trip_step, b) - time_steps(gpu_work_step, b)) / 50;
        if (p->round_trip_s < p->sync_s) p->round_trip_s = p->sync_s;
        if (b->ready) cuda_event_destroy(b->ready);
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
     * read its weights more than once, depending on the shape. */
    if (st == PSHARD_OK && sh->n_dense) {
        report(req, "reading host memory in place", 0.9);
        const int64_t shapes[3][2] = {{sh->rows, sh->n_embd}, {sh->n_embd, sh->rows}, {sh->n_embd, sh->n_embd}};
        double seconds[PROFILE_TOKENS] = {0}, bytes = 0;
        for (int k = 0; k < 3 && st == PSHARD_OK; k++) {
            st = gpu_matrix(b, sh->dense[0], shapes[k][0], shapes[k][1], 1, BIG_BYTES / 6, true);
            for (int i = 0; st == PSHARD_OK && i < PROFILE_TOKENS; i++) {
                b->n_tokens = profile_tokens[i];
                if (cuda_matmul_work_bytes(&b->m, b->n_tokens) > b->work_bytes) continue;
                seconds[i] += time_steps(gpu_matmul_step, b) / 4;
            }
            bytes += (double)b->m_bytes;
            cuda_pinned_release(&b->pinned);
        }
        for (int i = 0; st == PSHARD_OK && i < PROFILE_TOKENS; i++) p->zero_copy[i] = seconds[i] / bytes;
    }
    /* The expert kernel reading the experts a token chose from host memory in place. */
    if (st == PSHARD_OK && sh->n_moe && cuda_type_supported(sh->gate[0]) && cuda_type_supported(sh->down[0]) &&
        !out_of_time()) {
        report(req, "reading experts in place", 0.92);
        st = zero_copy_experts(b, sh, p);
    }
    /* A copy and CPU matmuls at the same time: each one's rate against its rate alone. */
    if (st == PSHARD_OK && sh->n_dense && !out_of_time()) {
        report(req, "copies and the CPU together", 0.95);
        struct cpu_bench c = {.pool = pool, .n_tokens = 1};
        c.x = calloc((size_t)sh->n_embd, sizeof(float));
        c.y = calloc((size_t)sh->rows, sizeof(float));
        c.acts = malloc(cpu_acts_bytes(QUANT_F32, sh->n_embd, 1));
        st = c.x && c.y && c.acts ? synth_make(sh->dense[0], sh->rows, sh->n_embd, 1, BIG_BYTES, &c.gate)
                                  : core_fail(PSHARD_ERR_NOMEM, "out of memory while measuring");
        if (st == PSHARD_OK) {
            const double cpu_alone = time_steps(cpu_matmul_step, &c);
            b->d2h = false, b->copy_bytes = profile_sizes[PROFILE_SIZES - 2], b->n_copies = 1;
            const double copy_alone = time_steps(copy_step, b);
            b->n_copies = (int)(0.25 / copy_alone) + 2;
            cuda_event copied = NULL;
            st = cuda_event_create(false, &copied);
            const double t0 = core_now_ms();
            for (int i = 0; i < b->n_copies && st == PSHARD_OK; i++)
                st = cuda_copy_h2d(b->dev, b->host, b->copy_bytes, b->copy);
            if (st == PSHARD_OK) st = cuda_event_record(copied, b->copy);
            int reps = 0;
            bool done = st != PSHARD_OK;
            while (!done) {
                cpu_matmul_step(&c, ++reps);
                st = cuda_event_done(copied, &done);
                done |= st != PSHARD_OK;
            }
            const double elapsed = (core_now_ms() - t0) / 1e3;
            if (copied) cuda_event_destroy(copied);
            const double cpu_busy = elapsed / (reps ? reps : 1), copies = elapsed / b->n_copies;
            p->cpu_share_under_h2d = cpu_alone / cpu_busy;
            p->h2d_share_under_cpu = copy_alone / copies;
            if (p->h2d_share_under_cpu > 1) p->h2d_share_under_cpu = 1;
            if (p->cpu_share_under_h2d > 1) p->cpu_share_under_h2d = 1;
        }
        free(c.x), free(c.y), free(c.acts), free(c.gate.data);
    }
    cuda_pinned_release(&host);
    cuda_arena_reset(&b->arena, mark);
    return st ? st : b->st;
}

static pshard_status measure_gpu(const struct measure_request *req, const struct shapes *sh, struct threadpool *pool,
                                 struct profile *p) {
    struct gpu_bench b = {0};
    CORE_TRY(cuda_ctx_create(0, &b.cuda));
    char name[256];
    pshard_status st = cuda_device_identify(0, name, sizeof name, &p->fp.driver);
    if (st == PSHARD_OK) {
        snprintf(p->fp.gpu, sizeof p->fp.gpu, "%.127s", name);
        p->has_gpu = true;
    }
    b.s = cuda_ctx_compute_stream(b.cuda);
    b.copy = cuda_ctx_copy_stream(b.cuda);
    const size_t arena = (size_t)6 * BIG_BYTES + ((size_t)1 << 30);
    if (st == PSHARD_OK) st = cuda_arena_create(&b.arena, arena);
    const int64_t B = profile_tokens[PROFILE_TOKENS - 1];
    const int64_t width = sh->rows > sh->n_embd ? sh->rows : sh->n_embd, k = sh->k > 0 ? sh->k : 1;
    void *blas = NULL;
    b.work_bytes = (size_t)256 << 20;
    if (st == PSHARD_OK) st = carve(&b, CUDA_BLAS_WORKSPACE_BYTES, &blas);
    if (st == PSHARD_OK) st = cuda_ctx_set_blas_workspace(b.cuda, blas, CUDA_BLAS_WORKSPACE_BYTES);
    if (st == PSHARD_OK) st = carve(&b, sizeof(float) * B * width, (void **)&b.x);
    if (st == PSHARD_OK) st = carve(&b, sizeof(float) * B * width * k, (void **)&b.y);
    if (st == PSHARD_OK) st = carve(&b, b.work_bytes, &b.work);
    if (st == PSHARD_OK) st = carve(&b, sizeof(int32_t) * B * k, (void **)&b.ids);
    if (st == PSHARD_OK) st = carve(&b, sizeof(float) * B * k, (void **)&b.weights);
    if (st == PSHARD_OK) st = carve(&b, sizeof(int32_t) * B, (void **)&b.pos);
    if (st == PSHARD_OK) st = carve(&b, sizeof(int32_t) * B, (void **)&b.seq);
    if (st == PSHARD_OK) st = carve(&b, sizeof(float) * B * sh->attn.n_head * sh->attn.head_k, (void **)&b.q);
    if (st == PSHARD_OK) st = carve(&b, sizeof(float) * B * sh->attn.n_head * sh->attn.head_v, (void **)&b.out);
    if (st == PSHARD_OK) st = cuda_memset(b.x, 0, sizeof(float) * B * width, b.s);
    if (st == PSHARD_OK) st = cuda_memset(b.q, 0, sizeof(float) * B * sh->attn.n_head * sh->attn.head_k, b.s);
    if (st == PSHARD_OK) st = cuda_memset(b.seq, 0, sizeof(int32_t) * B, b.s);
    if (st == PSHARD_OK) st = measure_gpu_tables(req, sh, &b, p);
    if (st == PSHARD_OK) st = measure_transfers(req, sh, &b, pool, p);
    cuda_arena_destroy(&b.arena);
    cuda_ctx_destroy(b.cuda);
    return st;
}

pshard_status exec_measure(const struct measure_request *req, struct profile *p) {
    const double t0 = core_now_ms();
    deadline_ms = t0 + BUDGET_S * 1e3;
    struct shapes sh;
    shapes_of(req->model, &sh);
    const int threads = req->n_threads > 0 ? req->n_threads : threadpool_cpu_count();
    struct threadpool *pool;
    CORE_TRY(threadpool_create(threads, &pool));
    profile_fingerprint_here(threads, NULL, 0, &p->fp);
    if (!p->measured) { /* starting from the defaults: keep only the formats measured here */
        memset(p->cpu_matmul, 0, sizeof p->cpu_matmul), memset(p->cpu_experts, 0, sizeof p->cpu_experts);
        memset(p->gpu_matmul, 0, sizeof p->gpu_matmul), memset(p->gpu_experts, 0, sizeof p->gpu_experts);
    }
    pshard_status st = measure_cpu(req, &sh, pool, p);
    p->has_gpu = false;
    if (st == PSHARD_OK && req->gpu && cuda_device_count() > 0) st = measure_gpu(req, &sh, pool, p);
    threadpool_free(pool);
    if (st != PSHARD_OK) return core_fail_context(st, "measuring this machine: ");
    p->measured = true;
    p->version = PROFILE_VERSION;
    snprintf(p->pshard, sizeof p->pshard, "%s", PSHARD_VERSION);
    p->seconds = (core_now_ms() - t0) / 1e3;
    report(req, "done", 1.0);
    return PSHARD_OK;
}

/* Whether p has rates for every format the model computes with. */
static bool has_formats(const struct profile *p, const struct shapes *sh) {
    for (int i = 0; i < sh->n_dense; i++)
        if (!profile_rate_find(p->cpu_matmul, quant_type_name(sh->dense[i])) ||
            (p->has_gpu && !profile_rate_find(p->gpu_matmul, quant_type_name(sh->dense[i]))))
            return false;
    for (int i = 0; i < sh->n_moe; i++)
        if (!profile_rate_find(p->cpu_experts, quant_type_name(sh->gate[i])) ||
            (p->has_gpu && !profile_rate_find(p->gpu_experts, quant_type_name(sh->gate[i]))))
            return false;
    return true;
}

pshard_status exec_machine_profile(const struct model *model, int n_threads, enum profile_use use,
                                   measure_progress_fn progress, void *user, struct profile *out, bool *measured_now) {
    *measured_now = false;
    const int threads = n_threads > 0 ? n_threads : threadpool_cpu_count();
    char gpu_name[256] = "";
    int driver = 0;
    const bool gpu = cuda_device_count() > 0 && cuda_device_identify(0, gpu_name, sizeof gpu_name, &driver) == PSHARD_OK;
    struct profile_fingerprint here;
    profile_fingerprint_here(threads, gpu ? gpu_name : NULL, gpu ? driver : 0, &here);
    char path[4096];
    const bool have_path = profile_path(&here, path, sizeof path) == PSHARD_OK;
    struct shapes sh;
    shapes_of(model, &sh);
    struct profile p;
    const pshard_status loaded = use != PROFILE_DEFAULTS && have_path ? profile_load(path, &here, &p) : PSHARD_ERR_NOT_FOUND;
    const bool cached = loaded == PSHARD_OK;
    if (cached && (has_formats(&p, &sh) || use == PROFILE_CACHED)) {
        *out = p;
        return PSHARD_OK;
    }
    /* Say why a cached file is not used (stale, another machine's, damaged). */
    if (loaded != PSHARD_OK && loaded != PSHARD_ERR_NOT_FOUND && progress) {
        char why[600];
        snprintf(why, sizeof why, "the cached profile is not used: %s", pshard_last_error());
        progress(user, why, -1);
    }
    if (use != PROFILE_MEASURE) {
        profile_defaults(out);
        out->has_gpu = true; /* the defaults describe a mid-range GPU, for plans that use one */
        return PSHARD_OK;
    }
    if (!cached) profile_defaults(&p);
    struct measure_request req = {model, threads, gpu, progress, user};
    CORE_TRY(exec_measure(&req, &p));
    p.fp = here;
    p.created = (int64_t)time(NULL);
    *measured_now = true;
    *out = p;
    if (have_path) CORE_TRY(profile_save(path, &p));
    return PSHARD_OK;
}
