/* Measuring this machine (see measure.h). Every figure is a timed loop of the kernels the
 * executor runs, on buffers of the model's shapes larger than the caches. Weight bytes are a
 * fixed pattern whose every 16- and 32-bit float is normal and small, so no format's kernel
 * meets NaNs or denormals. */
#include "measure/measure.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>

#include "core/error.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "cuda/cuda_backend.h"
#include "gguf/gguf.h"
#include "measure/measure_internal.h"
#include "quant/quant.h"

static const double TARGET_S = 0.03; /* time per measured point */
/* Measuring stops adding formats and optional figures past this (what is left keeps the
 * defaults, or the slowest measured format's rates), so a run stays under a minute. */
static const double BUDGET_S = 50;
static double deadline_ms;

bool measure_out_of_time(void) { return deadline_ms > 0 && core_now_ms() > deadline_ms; } /* 0: no budget set */

/* ---- shapes to measure */

static void add_type(enum quant_type *list, int *n, enum quant_type t) {
    for (int i = 0; i < *n; i++)
        if (list[i] == t) return;
    if (*n < PROFILE_FORMATS && quant_kernels_get(t)) list[(*n)++] = t;
}

static bool name_has(const struct gguf_str *name, const char *part) {
    return name->data && memmem(name->data, name->len, part, strlen(part)) != NULL;
}

void measure_shapes_of(const struct model *m, struct shapes *s) {
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
    s->host_skew = m->weights_skew;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *sh = &m->shards[i];
        for (uint32_t t = 0; t < sh->n_tensors; t++) {
            const struct gguf_tensor *g = sh->tensors[t];
            if (!model_tensor_is_matrix(g)) continue;
            if (model_tensor_is_router(m, sh, g) && !s->has_router) s->has_router = true, s->router = (enum quant_type)g->type;
            if (model_tensor_is_experts(g)) {
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



double measure_time_steps(step_fn fn, void *arg) {
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

double measure_time_best(step_fn fn, void *arg) {
    double best = measure_time_steps(fn, arg);
    for (int i = 0; i < 2; i++) {
        const double t = measure_time_steps(fn, arg);
        best = t < best ? t : best;
    }
    return best;
}

/* Eight bytes a step of a xorshift generator, each byte's top five bits (0-31) put over 0x1c. The
 * profile fills a 384 MB buffer for every figure it times, so it goes eight bytes at a time
 * rather than one. */
void measure_fill(uint8_t *p, size_t n, uint32_t seed) {
    uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint64_t w = ((x >> 3) & 0x1f1f1f1f1f1f1f1full) + 0x1c1c1c1c1c1c1c1cull;
        memcpy(p + i, &w, sizeof w);
    }
    for (; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)(0x1c + (x >> 59));
    }
}

void measure_median(const double *v, int n, double *out) {
    double x[MEASURE_SAMPLES];
    if (n < 1 || n > MEASURE_SAMPLES) return;
    for (int i = 0; i < n; i++) {
        if (!(v[i] > 0)) return;
        int j = i; /* insertion sort: n is 3 at most */
        for (; j > 0 && x[j - 1] > v[i]; j--) x[j] = x[j - 1];
        x[j] = v[i];
    }
    *out = n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

void measure_median_table(const double (*v)[PROFILE_TOKENS], int n, double out[PROFILE_TOKENS]) {
    for (int i = 0; i < PROFILE_TOKENS; i++) {
        double at[MEASURE_SAMPLES];
        for (int k = 0; k < n && k < MEASURE_SAMPLES; k++) at[k] = v[k][i];
        measure_median(at, n, &out[i]);
    }
}

pshard_status measure_synth_make(enum quant_type type, int64_t rows, int64_t cols, int64_t experts, size_t want,
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
    measure_fill(s->data, s->bytes, 7);
    for (int c = 1; c < s->copies; c++) memcpy(s->data + s->bytes * c, s->data, s->bytes);
    s->m = (struct cpu_matrix){type, s->data, cols, rows, experts, row, quant_kernels_get(type)};
    return PSHARD_OK;
}

struct cpu_matrix measure_synth_copy(const struct synth *s, int rep) {
    struct cpu_matrix m = s->m;
    m.data = s->data + s->bytes * (size_t)(rep % s->copies);
    return m;
}

void measure_report(const struct measure_request *req, const char *what, double done) {
    if (req->progress) req->progress(req->user, what, done);
}

/* Other work on the cores makes the CPU's rates, host memory and the thread pool's step look
 * many times slower than they are, and the planner then chooses badly (bench/RESULTS.md). So
 * the CPU's rates are measured when other work leaves the cores alone; this clock tells. */
bool measure_cpu_clock(struct measure_cpu_clock *c) {
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    const int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                             &v[6], &v[7])
                    : 0;
    if (f) fclose(f);
    struct rusage ru;
    if (n < 4 || getrusage(RUSAGE_SELF, &ru)) return false;
    const double tick = (double)sysconf(_SC_CLK_TCK);
    c->busy_s = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick; /* not idle, not iowait */
    c->own_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    c->wall_s = core_now_ms() / 1e3;
    return true;
}

double measure_others_share(const struct measure_cpu_clock *from) {
    struct measure_cpu_clock to;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (!measure_cpu_clock(&to) || cores < 1 || to.wall_s - from->wall_s < 0.05) return -1;
    const double others = (to.busy_s - from->busy_s) - (to.own_s - from->own_s);
    return others > 0 ? others / ((to.wall_s - from->wall_s) * (double)cores) : 0;
}

/* Other work's share above this: measure again, and warn if it stays. */
static const double BUSY_SHARE = 0.2;

/* Waits a few seconds at most for other work to leave the cores. */
static void wait_for_quiet(void) {
    for (int i = 0; i < 10; i++) {
        struct measure_cpu_clock c;
        if (!measure_cpu_clock(&c)) return;
        nanosleep(&(struct timespec){0, 300000000L}, NULL);
        if (measure_others_share(&c) <= BUSY_SHARE) return;
    }
}

/* The CPU's rates, measured once more if other work held the cores meanwhile; *busy: other
 * work's share of the cores during the last try. */
static pshard_status cpu_rates_when_quiet(const struct measure_request *req, const struct shapes *sh,
                                          struct threadpool *pool, struct profile *p, double *busy) {
    for (int attempt = 0;; attempt++) {
        wait_for_quiet();
        struct measure_cpu_clock c;
        const bool clocked = measure_cpu_clock(&c);
        const double t0 = core_now_ms();
        CORE_TRY(measure_cpu_rates(req, sh, pool, p));
        *busy = clocked ? measure_others_share(&c) : -1;
        /* Once more only where it still fits the minute. */
        if (*busy <= BUSY_SHARE || attempt == 1 || 2 * core_now_ms() - t0 > deadline_ms) return PSHARD_OK;
    }
}

/* The CPU's figures that follow the host memory's load (struct cpu_sample), timed once more into
 * s[*n] where the time budget allows. Timing them again is optional: one that fails (memory
 * short) is left out. */
static void sample_cpu_again(const struct measure_request *req, const struct shapes *sh, struct threadpool *pool,
                             double done, struct cpu_sample s[CPU_SAMPLES], int *n) {
    if (*n < 1 || *n >= CPU_SAMPLES || measure_out_of_time()) return;
    measure_report(req, "CPU again", done);
    if (measure_cpu_sample(sh, pool, &s[0], &s[*n]) == PSHARD_OK) ++*n;
}

/* Each figure of the n samples keeps its median; a note where host reads moved by more than a
 * fifth. */
static void settle_cpu_rates(const struct measure_request *req, const struct shapes *sh,
                             const struct cpu_sample s[CPU_SAMPLES], int n, struct profile *p) {
    double lo = s[0].host_read_gbps, hi = lo;
    for (int k = 1; k < n; k++) {
        lo = fmin(lo, s[k].host_read_gbps);
        hi = fmax(hi, s[k].host_read_gbps);
    }
    measure_cpu_settle(sh, s, n, p);
    if (n > 1 && lo > 0 && hi > 1.2 * lo) {
        char note[160];
        snprintf(note, sizeof note, "host memory read %.0f to %.0f GB/s at %d moments (other work on the machine?); "
                 "the profile keeps each CPU figure's median", lo, hi, n);
        measure_report(req, note, -1);
    }
}

pshard_status measure_profile(const struct measure_request *req, struct profile *p) {
    const double t0 = core_now_ms();
    deadline_ms = t0 + BUDGET_S * 1e3;
    struct shapes sh;
    measure_shapes_of(req->model, &sh);
    const int threads = req->n_threads > 0 ? req->n_threads : threadpool_cpu_count();
    struct threadpool *pool;
    CORE_TRY(threadpool_create(threads, &pool));
    profile_fingerprint_here(threads, NULL, 0, &p->fp);
    if (!p->measured) { /* starting from the defaults: keep only the formats measured here */
        memset(p->cpu_matmul, 0, sizeof p->cpu_matmul), memset(p->cpu_experts, 0, sizeof p->cpu_experts);
        memset(p->gpu_matmul, 0, sizeof p->gpu_matmul), memset(p->gpu_experts, 0, sizeof p->gpu_experts);
    }
    double busy = 0;
    pshard_status st = cpu_rates_when_quiet(req, &sh, pool, p, &busy);
    /* The figures that follow host memory, timed again straight after and once the GPU's are
     * done: three moments spread over the run, each figure keeping its median. */
    struct cpu_sample samples[CPU_SAMPLES];
    int n_samples = 0;
    if (st == PSHARD_OK) {
        measure_cpu_sample_of(p, &sh, &samples[n_samples++]);
        sample_cpu_again(req, &sh, pool, 0.47, samples, &n_samples);
    }
    p->has_gpu = false;
    if (st == PSHARD_OK && req->gpu && cuda_device_count() > 0) st = measure_gpu_rates(req, &sh, pool, p);
    if (st == PSHARD_OK) {
        sample_cpu_again(req, &sh, pool, 0.98, samples, &n_samples);
        settle_cpu_rates(req, &sh, samples, n_samples, p);
    }
    threadpool_free(pool);
    if (st != PSHARD_OK) return core_fail_context(st, "measuring this machine: ");
    p->measured = true;
    p->version = PROFILE_VERSION;
    snprintf(p->pshard, sizeof p->pshard, "%s", PSHARD_VERSION);
    p->seconds = (core_now_ms() - t0) / 1e3;
    measure_report(req, "done", 1.0);
    if (busy > BUSY_SHARE)
        LOG_W("other work used %.0f%% of the CPU while its rates were measured, so they may read slow and the planner "
              "choose worse plans; run `pshard profile` again when the machine is idle", 100 * busy);
    return PSHARD_OK;
}

pshard_status measure_cpu_now(const struct model *model, int n_threads, struct profile *p) {
    struct shapes sh;
    measure_shapes_of(model, &sh);
    struct threadpool *pool;
    CORE_TRY(threadpool_create(n_threads > 0 ? n_threads : threadpool_cpu_count(), &pool));
    deadline_ms = 0; /* no minute to keep to (one left from a profile measured before would skip figures) */
    struct cpu_sample which, now;
    measure_cpu_sample_of(p, &sh, &which);
    const pshard_status st = measure_cpu_sample(&sh, pool, &which, &now);
    threadpool_free(pool);
    if (st != PSHARD_OK) return core_fail_context(st, "timing the CPU again: ");
    measure_cpu_settle(&sh, &now, 1, p);
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

pshard_status measure_machine_profile(const struct model *model, int n_threads, int64_t vram_cap, enum profile_use use,
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
    measure_shapes_of(model, &sh);
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
    struct measure_request req = {model, threads, gpu, progress, user, vram_cap > 0 ? vram_cap : 0};
    CORE_TRY(measure_profile(&req, &p));
    p.fp = here;
    p.created = (int64_t)time(NULL);
    *measured_now = true;
    *out = p;
    if (have_path) CORE_TRY(profile_save(path, &p));
    return PSHARD_OK;
}
