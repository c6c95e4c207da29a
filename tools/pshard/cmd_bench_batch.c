/* `pshard bench --batch`: many sequences at once, as llama.cpp's batched-bench names the sizes.
 * For each VRAM budget and each count of parallel sequences (-npl), that many requests of -npp
 * prompt tokens (random, each its own) and -ntg generated tokens (greedy, end-of-text ignored)
 * are added together and stepped to the end by the continuous-batching scheduler. Reported: the
 * prompt throughput (all prompt tokens over the time to the last first token), the generation
 * throughput (tokens generated after that, over the time after it), the steady generation
 * throughput (the steps after the one that gave the last first token, through the first that
 * ended a request: every step one token of each sequence, what llama.cpp's batched-bench times
 * with its prompts all read first; "-" where no step had them all), the whole run's, TTFT per
 * sequence (p50, p99) and the device memory pshard holds (its arena, the budget, plus the CUDA
 * context). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "cli.h"
#include "engine/tools_api.h"

enum { MAX_LIST = 16 };

struct batch_opts {
    const char *model;
    char default_path[4096];
    int64_t budgets[MAX_LIST], counts[MAX_LIST];
    int n_budgets, n_counts;
    int32_t npp, ntg, n_batch, n_threads;
    const char *json;
    int quiet;
    struct plan_options options; /* the comparison switches (cli_plan_options) */
    pshard_params planning;      /* --plan, --stream-share, --set, --decode-set, read as run reads them */
};

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: pshard bench --batch [-m MODEL] [--vram-budget SIZE[,SIZE...]] [-npp N] [-ntg N]\n"
            "                    [-npl N[,N...]] [-b BATCH] [-t THREADS] [--json FILE] [-q]\n"
            "                    [--plan auto|cpu|gpu|static|dynamic] [--stream-share F]\n"
            "                    [--set ring|no-ring|all-kv] [--decode-set ring|no-ring|all-kv|same]\n"
            "  For each budget (default 0: the CPU) and each count of parallel sequences (-npl, default\n"
            "  1,4,16), runs that many requests at once: -npp prompt tokens each (default 1024, random\n"
            "  tokens, each request its own), then -ntg generated tokens each (default 128, greedy).\n"
            "  A step carries up to -b tokens (default 2048): one of each generating sequence, the rest\n"
            "  prompt chunks. The KV cache holds npl * (npp + ntg) cells. Prints prompt and generation\n"
            "  throughput (\"steady\": while every sequence generates), TTFT per sequence (p50, p99) and\n"
            "  device memory; --json FILE writes one line per configuration (bench/batch_plot.py draws\n"
            "  throughput against sequences from it).\n"
            "  --plan, --stream-share, --set and --decode-set place every configuration as in `pshard run`.\n");
}

/* A whole number in [lo, hi], read as every subcommand reads one (cli_int). */
static int parse_count(const char *flag, const char *v, int32_t lo, int32_t hi, int32_t *out) {
    int64_t n;
    if (cli_int("bench", flag, v, lo, hi, &n)) return -1;
    *out = (int32_t)n;
    return 0;
}

static int parse_opts(int argc, char **argv, struct batch_opts *o) {
    memset(o, 0, sizeof *o);
    pshard_params_default(&o->planning);
    o->n_budgets = 1, o->budgets[0] = 0;
    o->n_counts = 3, o->counts[0] = 1, o->counts[1] = 4, o->counts[2] = 16;
    o->npp = 1024, o->ntg = 128, o->n_batch = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_usage(stdout);
            return 1;
        } else if (!strcmp(a, "--batch")) {
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "-m") && v) {
            o->model = argv[++i];
        } else if (!strcmp(a, "--json") && v) {
            o->json = argv[++i];
        } else if (!strcmp(a, "--vram-budget") && v) {
            int n = 0;
            char *copy = strdup(argv[++i]);
            o->n_budgets = 0;
            for (char *item = strtok(copy, ","); item && n < MAX_LIST; item = strtok(NULL, ",")) {
                if (cli_size("bench", a, item, &o->budgets[n])) {
                    free(copy);
                    return -1;
                }
                n++;
            }
            free(copy);
            if (!n) {
                fprintf(stderr, "pshard bench: --vram-budget needs a size\n");
                return -1;
            }
            o->n_budgets = n;
        } else if (!strcmp(a, "-npl") && v) {
            if (cli_parse_list(argv[++i], false, o->counts, MAX_LIST, &o->n_counts)) {
                fprintf(stderr, "pshard bench: -npl wants counts of sequences such as 1,4,16, got '%s'\n", argv[i]);
                return -1;
            }
            for (int k = 0; k < o->n_counts; k++)
                if (o->counts[k] > 4096) {
                    fprintf(stderr, "pshard bench: -npl: at most 4096 sequences\n");
                    return -1;
                }
        } else if (!strcmp(a, "-npp")) {
            if (parse_count(a, v, 1, 1 << 20, &o->npp)) return -1;
            i++;
        } else if (!strcmp(a, "-ntg")) {
            if (parse_count(a, v, 1, 1 << 20, &o->ntg)) return -1;
            i++;
        } else if (!strcmp(a, "-b")) {
            if (parse_count(a, v, 1, 65536, &o->n_batch)) return -1;
            i++;
        } else if (!strcmp(a, "-t")) {
            if (parse_count(a, v, 1, 1024, &o->n_threads)) return -1;
            i++;
        } else if ((r = cli_planning_option("bench", argc, argv, &i, false, &o->planning)) != 0) {
            if (r < 0) return -1;
        } else {
            cli_refuse("bench", a, "-m --json --vram-budget -npl");
            print_usage(stderr);
            return -1;
        }
    }
    if (!o->model) {
        if (cli_default_model(o->default_path, sizeof o->default_path)) return -1;
        o->model = o->default_path;
    }
    return 0;
}

/* What one configuration's requests heard. */
struct run {
    int32_t npl, ntg;
    double t0, *ttft_ms, *token_ms; /* token_ms: [npl][ntg], from t0 */
    int32_t *n_tokens;
    int32_t finished, failed;
    int32_t step, *token_step;      /* the step running; token_step: [npl][ntg], the step each token came in */
    double *step_end_ms;            /* [step]: when it returned, from t0 */
    int32_t step_cap;
};

static int on_event(void *user, const pshard_token_event *ev) {
    struct run *r = user;
    const int32_t s = ev->request % r->npl;
    if (ev->token >= 0 && r->n_tokens[s] < r->ntg) {
        r->token_step[(size_t)s * r->ntg + r->n_tokens[s]] = r->step;
        r->token_ms[(size_t)s * r->ntg + r->n_tokens[s]++] = core_now_ms() - r->t0;
    }
    if (ev->finish != PSHARD_FINISH_NONE) {
        r->finished++;
        r->ttft_ms[s] = ev->stats->ttft_ms;
        if (ev->finish == PSHARD_FINISH_ERROR) {
            if (!r->failed) fprintf(stderr, "pshard bench: a request failed: %s\n", ev->error);
            r->failed++;
        }
    }
    return 0;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-th percentile (0..100) of v (sorted in place), nearest rank. */
static double percentile(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    int k = (int)ceil(p / 100 * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static pshard_status run_config(const struct batch_opts *o, int64_t budget, int32_t npl, FILE *json) {
    pshard_params params = o->planning;
    params.model_path = o->model;
    params.n_parallel = npl;
    /* The pool holds every sequence at once: each its cells in whole blocks, as the pool hands
     * them out (28 cells take a block of 64: sized by cells alone, 64 such sequences would run
     * 28 at a time). */
    const int64_t per_seq = (int64_t)(o->npp + o->ntg + KV_BLOCK_CELLS - 1) / KV_BLOCK_CELLS * KV_BLOCK_CELLS;
    if ((int64_t)npl * per_seq > INT32_MAX)
        return core_fail(PSHARD_ERR_INVALID_ARG, "%d sequences of %lld cells: more than a KV pool holds", npl, (long long)per_seq);
    params.n_ctx = (int32_t)(npl * per_seq);
    params.n_batch = o->n_batch;
    params.n_threads = o->n_threads;
    params.n_predict = o->ntg;
    params.vram_budget = budget;
    params.max_queue = npl;
    pshard_ctx *ctx;
    CORE_TRY(engine_open(&params, &o->options, &ctx));
    pshard_info info;
    pshard_get_info(ctx, &info);
    struct run r = {npl, o->ntg, 0, calloc((size_t)npl, sizeof(double)), calloc((size_t)npl * o->ntg, sizeof(double)),
                    calloc((size_t)npl, sizeof(int32_t)), 0, 0, 0, calloc((size_t)npl * o->ntg, sizeof(int32_t)), NULL, 0};
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)o->npp);
    pshard_status st = r.ttft_ms && r.token_ms && r.n_tokens && r.token_step && prompt
                           ? PSHARD_OK
                           : core_fail(PSHARD_ERR_NOMEM, "out of memory");
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    r.t0 = core_now_ms();
    for (int32_t s = 0; st == PSHARD_OK && s < npl; s++) {
        for (int32_t i = 0; i < o->npp; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            prompt[i] = (int32_t)(100 + rng % (uint64_t)(info.n_vocab - 100)); /* clear of the first, special ids */
        }
        pshard_request req;
        pshard_request_default(&req);
        req.prompt_tokens = prompt, req.n_prompt_tokens = o->npp, req.n_predict = o->ntg, req.ignore_eos = 1;
        req.sampling.temperature = 0, req.on_event = on_event, req.user = &r;
        int32_t id;
        st = pshard_request_add(ctx, &req, &id);
    }
    int32_t pending = npl, steps = 0;
    while (st == PSHARD_OK && pending) {
        if (steps == r.step_cap) {
            const int32_t cap = r.step_cap ? 2 * r.step_cap : 256;
            double *grown = realloc(r.step_end_ms, sizeof(double) * (size_t)cap);
            if (!grown) {
                st = core_fail(PSHARD_ERR_NOMEM, "out of memory");
                break;
            }
            r.step_end_ms = grown, r.step_cap = cap;
        }
        r.step = steps;
        st = pshard_step(ctx, &pending);
        r.step_end_ms[steps++] = core_now_ms() - r.t0;
        if (!o->quiet && isatty(2))
            fprintf(stderr, "\r  %d sequences: step %d, %d finished\033[K", npl, steps, r.finished);
    }
    const double total_ms = core_now_ms() - r.t0;
    if (!o->quiet && isatty(2)) fprintf(stderr, "\r\033[K");
    if (st == PSHARD_OK && r.failed) st = core_fail(PSHARD_ERR_INTERNAL, "%d requests failed", r.failed);
    if (st == PSHARD_OK) {
        double pp_ms = 0;
        for (int32_t s = 0; s < npl; s++) pp_ms = r.token_ms[(size_t)s * o->ntg] > pp_ms ? r.token_ms[(size_t)s * o->ntg] : pp_ms;
        int64_t after = 0;
        for (int32_t s = 0; s < npl; s++)
            for (int32_t k = 0; k < r.n_tokens[s]; k++) after += r.token_ms[(size_t)s * o->ntg + k] > pp_ms;
        /* Steady: the steps after the one that gave the last first token, through the first that
         * ended a request -- each a token of every sequence. */
        int32_t first = -1, last = INT32_MAX;
        for (int32_t s = 0; s < npl; s++) {
            const int32_t *ts = r.token_step + (size_t)s * o->ntg;
            if (!r.n_tokens[s]) continue;
            first = ts[0] > first ? ts[0] : first;
            last = ts[r.n_tokens[s] - 1] < last ? ts[r.n_tokens[s] - 1] : last;
        }
        int64_t steady = 0;
        for (int32_t s = 0; s < npl; s++)
            for (int32_t k = 0; k < r.n_tokens[s]; k++) {
                const int32_t at = r.token_step[(size_t)s * o->ntg + k];
                steady += at > first && at <= last;
            }
        const double pp_tps = (double)npl * o->npp * 1e3 / pp_ms;
        const double tg_tps = total_ms > pp_ms ? after * 1e3 / (total_ms - pp_ms) : 0;
        const double steady_tps =
            first >= 0 && last > first ? steady * 1e3 / (r.step_end_ms[last] - r.step_end_ms[first]) : 0;
        const double all_tps = (double)npl * (o->npp + o->ntg) * 1e3 / total_ms;
        const double p50 = percentile(r.ttft_ms, npl, 50), p99 = percentile(r.ttft_ms, npl, 99);
        const double device_mib = (info.vram_arena_bytes + info.vram_context_bytes) / 1048576.0;
        char budget_text[32];
        snprintf(budget_text, sizeof budget_text, "%s", budget ? pshard_format_bytes((uint64_t)budget, budget_text, sizeof budget_text) : "cpu");
        char steady_text[16] = "-"; /* (none: a request ended before the last one's first token) */
        if (steady_tps > 0) snprintf(steady_text, sizeof steady_text, "%.1f", steady_tps);
        printf("%-9s %5d %6d %5d %10.1f %10.1f %10s %10.1f %9.0f %9.0f %10.0f  %s\n", budget_text, npl, o->npp, o->ntg,
               pp_tps, tg_tps, steady_text, all_tps, p50, p99, device_mib, info.plan);
        fflush(stdout);
        if (json) {
            fprintf(json,
                    "{\"model\": \"%s\", \"budget_bytes\": %lld, \"npl\": %d, \"npp\": %d, \"ntg\": %d, \"n_batch\": %d, "
                    "\"threads\": %d, \"prompt_tps\": %.2f, \"gen_tps\": %.2f, \"steady_gen_tps\": %.2f, \"total_tps\": %.2f, "
                    "\"prompt_ms\": %.1f, "
                    "\"total_ms\": %.1f, \"ttft_p50_ms\": %.1f, \"ttft_p99_ms\": %.1f, \"steps\": %d, "
                    "\"device_mib\": %.0f, \"context_mib\": %.0f, \"kv_bytes\": %llu, \"plan\": \"%s\"}\n",
                    o->model, (long long)budget, npl, o->npp, o->ntg, info.n_batch, info.n_threads, pp_tps, tg_tps, steady_tps, all_tps,
                    pp_ms, total_ms, p50, p99, steps, device_mib, info.vram_context_bytes / 1048576.0,
                    (unsigned long long)info.kv_bytes, info.plan);
            fflush(json);
        }
    }
    free(prompt);
    free(r.ttft_ms);
    free(r.token_ms);
    free(r.n_tokens);
    free(r.token_step);
    free(r.step_end_ms);
    pshard_close(ctx);
    return st;
}

int cmd_bench_batch(int argc, char **argv) {
    struct batch_opts o;
    const int rc = parse_opts(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    if (cli_plan_options(&o.options) != PSHARD_OK) {
        fprintf(stderr, "pshard bench: %s\n", pshard_last_error());
        return 2;
    }
    FILE *json = o.json ? fopen(o.json, "w") : NULL;
    if (o.json && !json) {
        perror(o.json);
        return 1;
    }
    printf("%-9s %5s %6s %5s %10s %10s %10s %10s %9s %9s %10s  %s\n", "budget", "npl", "npp", "ntg", "prompt t/s", "gen t/s",
           "steady t/s", "all t/s", "TTFT p50", "TTFT p99", "device MiB", "plan (decode/prompt)");
    for (int bi = 0; bi < o.n_budgets; bi++)
        for (int ci = 0; ci < o.n_counts; ci++) {
            const pshard_status st = run_config(&o, o.budgets[bi], (int32_t)o.counts[ci], json);
            if (st != PSHARD_OK) {
                fprintf(stderr, "pshard bench: %s\n", pshard_last_error());
                if (json) fclose(json);
                return 1;
            }
        }
    if (json) fclose(json);
    return 0;
}
