/* `pshard bench --oracle`: does the planner choose the plan that really is fastest? For each
 * configuration (model, VRAM budget, context length, tokens per step) it runs every candidate
 * the planner weighed, times its steps, and compares: how often the planner's choice was the
 * measured best, how much slower it was when not, and how far the cost model's predictions
 * were from the measured times.
 *
 * A step of n tokens at context c runs at positions c-n .. c-1 over a cache filled to c-n
 * without being computed (zero K and V: attention costs the same), and is timed several times
 * (the cache truncated back between runs), each run with tokens of its own, so with a routing of
 * its own (PSHARD_ORACLE_SAME_TOKENS=1: the same tokens every run, as the runs in bench/oracle/
 * up to start AM were timed); the median counts. The planner's choices run first;
 * a candidate slower than three times the best so far is cut short after two such runs (it is
 * not the best, and its time is known), and one the cost model predicts at over SKIP_FACTOR times the
 * best measured time (where none is measured yet, the prediction for the tier's choice) is not
 * run at all -- it could be the best only if the predictions were off by that factor; the summary
 * counts these. A candidate that places a tier exactly as one
 * already measured is that plan: it takes the measured time instead of running again, and is
 * not loaded at all when that holds in every tier. Close calls are timed over several loads:
 * the choice and the plans that contend with it (measured faster, or within CLOSE of it; the
 * MAX_CONTENDERS fastest) are loaded again (twice by default), and each plan's time is the median
 * over its loads. Loads of one plan differ by 5-18% (where its host buffers land, how the threads
 * fall on cores), more than most close calls, so one load would decide such a pair by chance. The
 * loads go in rounds whose order alternates (the first pass's order reversed, then as it was), so
 * a machine that drifts over the minutes favours no plan; and every contender takes part, since
 * one timed only in the first pass would be compared across minutes (plans have run up to twice
 * as slow in the rounds as in the first pass: bench/RESULTS.md, "Oracle"). Around each
 * configuration the host's read speed is measured as the profile measured it, and before it the
 * CPU's figures that follow host memory are timed again, all recorded with its rows (--cpu-now
 * weighs its plans with those figures): the profile is one moment of a host whose speed drifts. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine/tools_api.h"

enum { MAX_LIST = 16, MAX_MODELS = 4, SKIP_FACTOR = 3, MAX_LOADS = 5, MAX_CONTENDERS = 4 };
static const double CLOSE = 0.15;

struct oracle_opts {
    const char *models[MAX_MODELS];
    int n_models;
    int64_t budgets[MAX_LIST];
    int32_t contexts[MAX_LIST], tiers[MAX_LIST];
    int n_budgets, n_contexts, n_tiers;
    int32_t n_batch, n_threads, reps;
    int recheck; /* loads more of each close call (--recheck N, default 2; 0 with --no-recheck) */
    bool cpu_now; /* --cpu-now: weigh plans with the CPU's figures timed just before, not the profile's */
    const char *json;
    struct plan_options options; /* the comparison switches (cli_plan_options) */
};

/* One configuration's results. */
struct oracle_row {
    int32_t n_tokens;
    double measured[PLAN_MAX_CANDIDATES], predicted[PLAN_MAX_CANDIDATES];
    bool cut[PLAN_MAX_CANDIDATES]; /* stopped after one run */
    bool skipped[PLAN_MAX_CANDIDATES]; /* predicted over SKIP_FACTOR times a measured time (or the choice's
                                          prediction, none measured yet): not run */
    bool rechecked[PLAN_MAX_CANDIDATES]; /* a close call: timed over more loads, the median counts */
    double loads[PLAN_MAX_CANDIDATES][MAX_LOADS]; /* a rechecked candidate's time on each load */
    int n_loads[PLAN_MAX_CANDIDATES];
    int chosen, tier;
};

/* The host around one configuration, recorded with each of its rows. */
struct oracle_host {
    double read[2];            /* GB/s, as the profile's host_read_gbps: before and after the configuration */
    const struct profile *now; /* the profile with its CPU figures timed again just before */
    bool weighed_now;          /* the plans were weighed with `now` (else with the profile as cached) */
};

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard bench --batch ... (many sequences at once: pshard bench --batch --help)\n"
                 "       pshard bench --oracle -m MODEL [-m MODEL ...] [--budgets 2G,4G,8G,16G]\n"
                 "                    [--contexts 1024,4096,16384] [--tiers 1,16,256,1024] [-b BATCH] [-t THREADS]\n"
                 "                    [--reps N] [--recheck N | --no-recheck] [--cpu-now] [--json FILE]\n"
                 "  For every model, budget, context and tokens per step: runs every candidate plan the\n"
                 "  planner weighs, times a step of each, and reports whether the planner chose the fastest,\n"
                 "  how much slower its choice was when not, and the cost model's prediction error. Uses\n"
                 "  this machine's profile (measured first when none is cached). A step is timed N times\n"
                 "  (default 5) below 16 tokens, twice below 256, once from 256, after one warm-up run.\n"
                 "  The choice and the plans measured faster or within 15%% of it (the four fastest) are\n"
                 "  loaded and timed N more times (default 2, at most 4; --no-recheck: none), in rounds of\n"
                 "  alternating order, and each one's time is the median over its loads. Before each\n"
                 "  configuration the profile's CPU figures that follow host memory (host reads, matmuls of\n"
                 "  up to 4 tokens, experts of up to 16) are timed again, as the host's speed drifts; plans\n"
                 "  are weighed with the profile as cached, as `pshard run` weighs them (--cpu-now: with\n"
                 "  the figures just timed). --json FILE writes one line per configuration (with the\n"
                 "  figures timed again), and beside it FILE less .json plus .profile.json: the profile as\n"
                 "  cached (bench/oracle_replay.py scores a run with them).\n");
}

/* Where --json FILE's profile goes: FILE less a ".json" ending, plus ".profile.json". */
static bool profile_beside(const char *json, char *out, size_t size) {
    const size_t n = strlen(json), stem = n > 5 && !strcmp(json + n - 5, ".json") ? n - 5 : n;
    return snprintf(out, size, "%.*s.profile.json", (int)stem, json) < (int)size;
}

static int parse_opts(int argc, char **argv, struct oracle_opts *o) {
    static const int64_t budgets[] = {2ll << 30, 4ll << 30, 8ll << 30, 16ll << 30};
    static const int32_t contexts[] = {1024, 4096, 16384}, tiers[] = {1, 16, 256, 1024};
    memset(o, 0, sizeof *o);
    o->n_budgets = 4, o->n_contexts = 3, o->n_tiers = 4;
    memcpy(o->budgets, budgets, sizeof budgets);
    memcpy(o->contexts, contexts, sizeof contexts);
    memcpy(o->tiers, tiers, sizeof tiers);
    o->n_batch = 1024, o->reps = 5, o->recheck = 2;
    bool oracle = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t list[MAX_LIST];
        int n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_usage(stdout);
            return 1;
        } else if (!strcmp(a, "--oracle")) {
            oracle = true;
        } else if (!strcmp(a, "-m") && v && o->n_models < MAX_MODELS) {
            o->models[o->n_models++] = argv[++i];
        } else if ((!strcmp(a, "--budgets") || !strcmp(a, "--contexts") || !strcmp(a, "--tiers")) && v) {
            const bool budgets = !strcmp(a, "--budgets");
            if (cli_parse_list(argv[++i], budgets, list, MAX_LIST, &n)) {
                fprintf(stderr, "pshard bench: %s takes up to %d %s, got '%s'\n", a, MAX_LIST,
                        budgets ? "sizes above 0 such as 2G,4G" : "whole numbers from 1 to 16777216 such as 1024,4096",
                        argv[i]);
                return -1;
            }
            if (budgets) {
                memcpy(o->budgets, list, sizeof list[0] * (size_t)n);
                o->n_budgets = n;
            } else {
                const bool contexts = !strcmp(a, "--contexts");
                int32_t *into = contexts ? o->contexts : o->tiers;
                for (int k = 0; k < n; k++) into[k] = (int32_t)list[k];
                *(contexts ? &o->n_contexts : &o->n_tiers) = n;
            }
        } else if ((!strcmp(a, "-b") || !strcmp(a, "-t") || !strcmp(a, "--reps")) && v) {
            int64_t k;
            if (cli_int("bench", a, argv[++i], 1, !strcmp(a, "-b") ? 65536 : 1024, &k)) return -1;
            *(!strcmp(a, "-b") ? &o->n_batch : !strcmp(a, "-t") ? &o->n_threads : &o->reps) = (int32_t)k;
        } else if (!strcmp(a, "--recheck") && v) {
            int64_t k;
            if (cli_int("bench", a, argv[++i], 0, MAX_LOADS - 1, &k)) return -1;
            o->recheck = (int)k;
        } else if (!strcmp(a, "--no-recheck")) {
            o->recheck = 0;
        } else if (!strcmp(a, "--cpu-now")) {
            o->cpu_now = true;
        } else if (!strcmp(a, "--json") && v) {
            o->json = argv[++i];
        } else {
            if (!strcmp(a, "-m") && v)
                fprintf(stderr, "pshard bench: at most %d models (-m) in one run\n", MAX_MODELS);
            else
                cli_refuse("bench", a, "-m --budgets --contexts --tiers -b -t --reps --recheck --json");
            print_usage(stderr);
            return -1;
        }
    }
    if (!oracle || !o->n_models) {
        fprintf(stderr, "pshard bench: give --batch, or --oracle and at least one -m MODEL\n");
        return -1;
    }
    for (int k = 0; k < o->n_tiers; k++)
        if (o->tiers[k] > o->n_batch) o->n_batch = o->tiers[k];
    return 0;
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds of a step of n tokens at context ctx: the median of reps runs after a warm-up (graph
 * capture, first touches: not timed). Two runs in a row slower than `cut_above` stop it (the
 * faster of the two counts); one alone may be a hiccup of the machine. A warm-up over twice
 * `cut_above` stops it at once. */
static pshard_status time_step(struct exec_ctx *ex, const struct model *m, int32_t n, int32_t ctx, int reps,
                               double cut_above, double *seconds, bool *cut) {
    int32_t *tokens = malloc(sizeof *tokens * n), *pos = malloc(sizeof *pos * n), *seq = calloc((size_t)n, sizeof *seq);
    pshard_status st = tokens && pos && seq ? PSHARD_OK : PSHARD_ERR_NOMEM;
    for (int32_t i = 0; st == PSHARD_OK && i < n; i++) pos[i] = ctx - n + i;
    const bool same_tokens = getenv("PSHARD_ORACLE_SAME_TOKENS") != NULL;
    double runs[33];
    int done = 0, slow = 0;
    *cut = false;
    for (int r = -1; st == PSHARD_OK && r < reps + (slow > 0) && r < 32; r++) {
        /* Each run its own tokens, as decoding has: the same ones again route to the same experts,
         * whose weights the host's cache may still hold from the run before (one routing, timed
         * warm). Every candidate runs the same tokens. */
        const uint32_t salt = same_tokens ? 0 : (uint32_t)(r + 1) * 104729u;
        for (int32_t i = 0; i < n; i++)
            tokens[i] = (int32_t)((salt + (uint32_t)i * 7919u + 17u) % m->hp.n_vocab);
        exec_truncate_seq(ex, 0, ctx - n);
        struct exec_batch b = {n, tokens, pos, seq, NULL};
        const double t0 = core_now_ms();
        st = exec_step(ex, &b);
        const double s = (core_now_ms() - t0) / 1e3;
        if (r < 0) { /* the warm-up: cut only when far beyond (long steps would otherwise run thrice) */
            if (s > 2 * cut_above) {
                *cut = true;
                *seconds = s;
                break;
            }
            continue;
        }
        runs[done++] = s;
        slow = s > cut_above ? slow + 1 : 0;
        if (slow == 2) {
            *cut = true;
            *seconds = runs[done - 1] < runs[done - 2] ? runs[done - 1] : runs[done - 2];
            break;
        }
    }
    if (!*cut) *seconds = done ? median(runs, done) : INFINITY;
    free(tokens), free(pos), free(seq);
    return st;
}

/* A plan's measured time in a tier: the mean over the candidates that place everything alike
 * there (they are one plan; their runs differ only by noise). */
static double plan_time(const struct plan *weighed, const struct oracle_row *r, int c) {
    double sum = 0;
    int n = 0;
    for (uint32_t e = 0; e < weighed->n_candidates; e++)
        if (weighed->candidates[e].key[r->tier] == weighed->candidates[c].key[r->tier] && isfinite(r->measured[e]))
            sum += r->measured[e], n++;
    return n ? sum / n : INFINITY;
}

/* Runs of a step of n tokens: fewer for longer steps. */
static int reps_for(const struct oracle_opts *o, int32_t n) { return n >= 256 ? 1 : n >= 16 && o->reps > 2 ? 2 : o->reps; }

/* The plans that contend with the choice in row r: every other plan measured faster than it, or
 * within CLOSE of it, the fastest first and at most MAX_CONTENDERS (one candidate per placement;
 * none cut short) into out[]; returns how many. */
static int contenders(const struct plan *weighed, const struct oracle_row *r, int out[MAX_CONTENDERS]) {
    const double chosen = plan_time(weighed, r, r->chosen);
    int n = 0;
    for (uint32_t e = 0; e < weighed->n_candidates; e++) {
        const uint64_t key = weighed->candidates[e].key[r->tier];
        const double t = plan_time(weighed, r, (int)e);
        bool seen = key == weighed->candidates[r->chosen].key[r->tier];
        for (int j = 0; j < n && !seen; j++) seen = weighed->candidates[out[j]].key[r->tier] == key;
        if (seen || r->cut[e] || !isfinite(t) || t >= chosen * (1 + CLOSE)) continue;
        int at = n; /* insert by time; a full list drops its slowest */
        while (at > 0 && plan_time(weighed, r, out[at - 1]) > t) at--;
        if (at == MAX_CONTENDERS) continue;
        if (n < MAX_CONTENDERS) n++;
        memmove(&out[at + 1], &out[at], sizeof out[0] * (size_t)(n - 1 - at));
        out[at] = (int)e;
    }
    return n;
}

/* Close calls timed again (see the top of this file): every candidate in one loaded o->recheck
 * more times, in rounds that run the first pass's order reversed, then as it was; each plan's
 * time becomes the median over its loads. A load that fails leaves the times it had. */
static void recheck_close_calls(const struct oracle_opts *o, const struct model *m, const struct exec_params *params,
                                const struct plan *weighed, int32_t ctx, const int *order, int n_order,
                                struct oracle_row *rows, int n_rows) {
    bool want[PLAN_MAX_CANDIDATES][MAX_LIST] = {{false}};
    for (int k = 0; k < n_rows; k++) {
        const struct oracle_row *r = &rows[k];
        int others[MAX_CONTENDERS];
        if (r->chosen < 0 || r->cut[r->chosen] || !isfinite(plan_time(weighed, r, r->chosen))) continue;
        const int n = contenders(weighed, r, others);
        for (int j = 0; j < n; j++) want[others[j]][k] = true;
        want[r->chosen][k] |= n > 0;
    }
    for (int k = 0; k < n_rows; k++) /* the first pass is each plan's first load */
        for (uint32_t c = 0; c < weighed->n_candidates; c++)
            if (want[c][k]) rows[k].loads[c][0] = plan_time(weighed, &rows[k], (int)c), rows[k].n_loads[c] = 1;
    for (int round = 0; round < o->recheck; round++) {
        for (int j = 0; j < n_order; j++) {
            const int c = order[round % 2 ? j : n_order - 1 - j];
            int n_want = 0;
            for (int k = 0; k < n_rows; k++) n_want += want[c][k];
            if (!n_want) continue;
            char label[48];
            plan_candidate_name(&weighed->candidates[c], label, sizeof label);
            fprintf(stderr, "  again: %-15s", label);
            const struct exec_params cp = exec_params_for_candidate(params, &weighed->candidates[c]);
            struct exec_ctx *ex = NULL;
            pshard_status st = exec_create(m, &cp, &ex);
            if (st == PSHARD_OK) st = exec_fill_seq(ex, 0, 0);
            for (int k = 0; st == PSHARD_OK && k < n_rows; k++) {
                struct oracle_row *r = &rows[k];
                if (!want[c][k]) continue;
                double again;
                bool cut;
                st = exec_fill_seq(ex, 0, ctx - r->n_tokens);
                if (st == PSHARD_OK) st = time_step(ex, m, r->n_tokens, ctx, reps_for(o, r->n_tokens), INFINITY, &again, &cut);
                if (st != PSHARD_OK) break;
                r->loads[c][r->n_loads[c]++] = again;
                fprintf(stderr, " %d:%.4g", r->n_tokens, again);
            }
            fputc('\n', stderr);
            exec_free(ex);
            if (st != PSHARD_OK) fprintf(stderr, "  (%s not timed again: %s)\n", label, pshard_last_error());
        }
    }
    /* The plan's median over its loads, for every candidate that is this plan in the tier. */
    for (int k = 0; k < n_rows; k++) {
        struct oracle_row *r = &rows[k];
        for (uint32_t c = 0; c < weighed->n_candidates; c++) {
            if (r->n_loads[c] < 2) continue;
            double v[MAX_LOADS];
            memcpy(v, r->loads[c], sizeof v[0] * (size_t)r->n_loads[c]);
            const double mid = median(v, r->n_loads[c]);
            for (uint32_t e = 0; e < weighed->n_candidates; e++)
                if (weighed->candidates[e].key[r->tier] == weighed->candidates[c].key[r->tier] && isfinite(r->measured[e]))
                    r->measured[e] = mid, r->rechecked[e] = true;
        }
    }
}

/* Every candidate of one model, budget and context, at every tokens-per-step. */
static pshard_status oracle_config(const struct oracle_opts *o, const struct model *m, const struct profile *prof,
                                   int64_t budget, int32_t ctx, struct oracle_row *rows, int *n_rows,
                                   struct plan *weighed, double cpu_cache[MAX_LIST]) {
    struct exec_params params = {.n_ctx = ctx, .n_batch = o->n_batch, .n_seq = 1, .n_threads = o->n_threads,
                                 .plan = PLAN_AUTO, .vram_budget = budget, .staging = -1, .profile = prof,
                                 .decode_set = PLAN_DECODE_WEIGHED, .options = o->options};
    CORE_TRY(exec_make_plan(m, &params, weighed));
    *n_rows = 0;
    for (int k = 0; k < o->n_tiers; k++)
        if (o->tiers[k] < ctx) {
            struct oracle_row *r = &rows[(*n_rows)++];
            memset(r, 0, sizeof *r);
            r->n_tokens = o->tiers[k];
            r->tier = plan_weighed_tier(r->n_tokens);
            r->chosen = plan_step_candidate(weighed, r->n_tokens, ctx);
            if (r->chosen < 0 && weighed->n_candidates)
                fprintf(stderr, "  %d tokens: the plan runs a placement no candidate has here (not counted)\n", r->n_tokens);
            for (uint32_t c = 0; c < PLAN_MAX_CANDIDATES; c++) r->measured[c] = r->predicted[c] = INFINITY;
        }
    if (!weighed->n_candidates) { /* everything fits: one plan, nothing to choose */
        fprintf(stderr, "  the model fits the budget whole: one plan, nothing to choose (not counted)\n");
        *n_rows = 0;
        return PSHARD_OK;
    }
    /* The planner's choices first: the best time so far lets slow candidates be cut short. */
    int order[PLAN_MAX_CANDIDATES], n_order = 0;
    for (int k = 0; k < *n_rows; k++) {
        bool seen = false;
        for (int j = 0; j < n_order; j++) seen |= order[j] == rows[k].chosen;
        if (!seen && rows[k].chosen >= 0) order[n_order++] = rows[k].chosen;
    }
    for (uint32_t c = 0; c < weighed->n_candidates; c++) {
        bool seen = false;
        for (int j = 0; j < n_order; j++) seen |= order[j] == (int)c;
        if (!seen) order[n_order++] = (int)c;
    }
    for (int oi = 0; oi < n_order; oi++) {
        const int c = order[oi];
        const struct plan_candidate *cand = &weighed->candidates[c];
        /* A tier placed as a candidate already measured there: the same plan, the same time. */
        int same[MAX_LIST], resolved = 0;
        for (int k = 0; k < *n_rows; k++) {
            same[k] = -1;
            for (int j = 0; j < oi && same[k] < 0; j++)
                if (weighed->candidates[order[j]].key[rows[k].tier] == cand->key[rows[k].tier] &&
                    isfinite(rows[k].measured[order[j]]))
                    same[k] = order[j];
            resolved += same[k] >= 0;
        }
        const struct exec_params cp = exec_params_for_candidate(&params, cand);
        char label[48];
        plan_candidate_name(cand, label, sizeof label);
        fprintf(stderr, "  %-22s", label);
        if (resolved == *n_rows) {
            for (int k = 0; k < *n_rows; k++) {
                rows[k].measured[c] = rows[k].measured[same[k]], rows[k].cut[c] = rows[k].cut[same[k]];
                rows[k].predicted[c] = rows[k].predicted[same[k]];
            }
            fprintf(stderr, " the same plan as one measured in every tier\n");
            continue;
        }
        const double t0 = core_now_ms();
        struct exec_ctx *ex = NULL;
        pshard_status st = exec_create(m, &cp, &ex);
        if (st == PSHARD_OK) st = exec_fill_seq(ex, 0, 0);
        fprintf(stderr, " load %.1f s", (core_now_ms() - t0) / 1e3);
        for (int k = 0; st == PSHARD_OK && k < *n_rows; k++) {
            struct oracle_row *r = &rows[k];
            const struct plan *plan = exec_get_plan(ex);
            struct cost_step cs;
            cost_plan_step(prof, m, plan, r->n_tokens, ctx - r->n_tokens, &cs);
            r->predicted[c] = cs.seconds;
            if (same[k] >= 0) {
                r->measured[c] = r->measured[same[k]], r->cut[c] = r->cut[same[k]];
                fprintf(stderr, " %d:=", r->n_tokens);
                continue;
            }
            if (cand->family == PLAN_CPU && cpu_cache[k] > 0) { /* the CPU's plan does not depend on the budget */
                r->measured[c] = cpu_cache[k];
                continue;
            }
            double best = INFINITY;
            for (uint32_t j = 0; j < weighed->n_candidates; j++) best = r->measured[j] < best ? r->measured[j] : best;
            /* Predicted far slower than a time already measured, or, where none is yet, than the
             * prediction of the tier's choice (a plan chosen for another tier runs here first):
             * not run (counted as skipped). */
            const double bound = isfinite(best)                       ? best
                                 : r->chosen >= 0 && r->chosen != c ? weighed->candidates[r->chosen].seconds[r->tier]
                                                                    : INFINITY;
            if (isfinite(bound) && r->predicted[c] > SKIP_FACTOR * bound) {
                r->skipped[c] = true;
                fprintf(stderr, " %d:skip", r->n_tokens);
                continue;
            }
            st = exec_fill_seq(ex, 0, ctx - r->n_tokens);
            if (st == PSHARD_OK)
                st = time_step(ex, m, r->n_tokens, ctx, reps_for(o, r->n_tokens), isfinite(best) ? 3 * best : INFINITY,
                               &r->measured[c], &r->cut[c]);
            if (cand->family == PLAN_CPU && !r->cut[c]) cpu_cache[k] = r->measured[c];
            fprintf(stderr, " %d:%.4g", r->n_tokens, r->measured[c]);
        }
        fputc('\n', stderr);
        exec_free(ex);
        if (st != PSHARD_OK) { /* a candidate that cannot run here is not a choice */
            fprintf(stderr, "  (%s: %s)\n", label, pshard_last_error());
            for (int k = 0; k < *n_rows; k++) rows[k].measured[c] = INFINITY;
        }
    }
    if (o->recheck) recheck_close_calls(o, m, &params, weighed, ctx, order, n_order, rows, *n_rows);
    return PSHARD_OK;
}

struct summary {
    int configs, best, within2, within5, within10, skipped, runs;
    double worst_slowdown;
    /* The same against the candidates over the chosen plan's resident set (and the CPU alone):
     * a plan's tiers share one set, weighed for the whole request, so a tier's best over another
     * set is out of its reach. */
    int best_in_set, within10_in_set;
    double worst_in_set;
    double errors[4096], all_errors[16384];
    int n_errors, n_all;
    double spreads[4096]; /* a close call's loads: slowest over fastest, less one */
    int n_spreads;
    int overlapped; /* choices not the best, both timed over loads, the choice's fastest load faster than the best's slowest */
    int overlapped_in_set; /* the same against the best over the choice's resident set */
};

/* The candidate that holds the loads of the plan c places, c or a twin (a close call's loads are
 * kept on one of them); -1 if it was not timed over loads. */
static int with_loads(const struct plan *weighed, const struct oracle_row *r, int c) {
    for (uint32_t e = 0; e < weighed->n_candidates; e++)
        if (weighed->candidates[e].key[r->tier] == weighed->candidates[c].key[r->tier] && r->n_loads[e] > 1) return (int)e;
    return -1;
}

/* A candidate's fastest and slowest time over its loads. */
static void load_range(const struct oracle_row *r, int c, double *lo, double *hi) {
    *lo = INFINITY, *hi = 0;
    for (int i = 0; i < r->n_loads[c]; i++) *lo = fmin(*lo, r->loads[c][i]), *hi = fmax(*hi, r->loads[c][i]);
}


/* The fastest candidate measured in row r; with `set`, only those over that resident set (and
 * the CPU alone, which takes none); -1 if none was. */
static int fastest(const struct plan *weighed, const struct oracle_row *r, const enum plan_set *set) {
    int best = -1;
    for (uint32_t c = 0; c < weighed->n_candidates; c++) {
        const struct plan_candidate *cand = &weighed->candidates[c];
        if (set && cand->family != PLAN_CPU && cand->set != *set) continue;
        if (isfinite(plan_time(weighed, r, (int)c)) && (best < 0 || plan_time(weighed, r, (int)c) < plan_time(weighed, r, best)))
            best = (int)c;
    }
    return best;
}

/* A rate table as JSON, {"FORMAT": [seconds per byte at each token count], ...}. */
static void rates_json(FILE *json, const struct profile_rate table[PROFILE_FORMATS]) {
    fprintf(json, "{");
    for (int f = 0, n = 0; f < PROFILE_FORMATS; f++) {
        if (!table[f].format[0]) continue;
        fprintf(json, "%s\"%s\": [", n++ ? ", " : "", table[f].format);
        for (int i = 0; i < PROFILE_TOKENS; i++) fprintf(json, "%s%.6g", i ? ", " : "", table[f].s_per_byte[i]);
        fprintf(json, "]");
    }
    fprintf(json, "}");
}

/* The one-token rates of the first format of each CPU table, now against the profile's. */
static void print_cpu_now(const struct profile *prof, const struct profile *now) {
    const struct profile_rate *tables[2][2] = {{prof->cpu_matmul, now->cpu_matmul}, {prof->cpu_experts, now->cpu_experts}};
    static const char *const what[2] = {"matmul", "experts"};
    fprintf(stderr, "  CPU timed again:");
    for (int t = 0; t < 2; t++)
        if (tables[t][0][0].format[0] && tables[t][0][0].s_per_byte[0] > 0 && tables[t][1][0].s_per_byte[0] > 0)
            fprintf(stderr, " %s %s at one token %.1f GB/s (the profile: %.1f);", what[t], tables[t][1][0].format,
                    1e-9 / tables[t][1][0].s_per_byte[0], 1e-9 / tables[t][0][0].s_per_byte[0]);
    fprintf(stderr, " host reads %.1f GB/s (%.1f)\n", now->host_read_gbps, prof->host_read_gbps);
}

/* Whether one more load could have ranked candidates a and b the other way: both timed over loads
 * (as different plans), a's fastest load faster than b's slowest. */
static bool loads_overlap(const struct plan *weighed, const struct oracle_row *r, int a, int b) {
    const int a_loads = with_loads(weighed, r, a), b_loads = with_loads(weighed, r, b);
    if (a_loads < 0 || b_loads < 0 || a_loads == b_loads) return false;
    double a_lo, a_hi, b_lo, b_hi;
    load_range(r, a_loads, &a_lo, &a_hi);
    load_range(r, b_loads, &b_lo, &b_hi);
    return a_lo <= b_hi;
}

static void summarize_row(const struct plan *weighed, const struct oracle_row *r, const struct oracle_host *host,
                          struct summary *s, FILE *json, const char *model, int64_t budget, int32_t ctx) {
    const int best = fastest(weighed, r, NULL);
    if (best < 0 || r->chosen < 0) return;
    const int in_set = fastest(weighed, r, &weighed->candidates[r->chosen].set);
    const double chosen = plan_time(weighed, r, r->chosen), slowdown = chosen / plan_time(weighed, r, best) - 1;
    const double set_slowdown = in_set >= 0 ? chosen / plan_time(weighed, r, in_set) - 1 : slowdown;
    s->configs++;
    s->best += r->chosen == best || slowdown <= 0.0;
    s->within2 += slowdown <= 0.02, s->within5 += slowdown <= 0.05, s->within10 += slowdown <= 0.10;
    if (slowdown > s->worst_slowdown) s->worst_slowdown = slowdown;
    s->best_in_set += set_slowdown <= 0.0;
    s->within10_in_set += set_slowdown <= 0.10;
    if (set_slowdown > s->worst_in_set) s->worst_in_set = set_slowdown;
    if (isfinite(chosen) && s->n_errors < 4096) s->errors[s->n_errors++] = fabs(r->predicted[r->chosen] / chosen - 1);
    for (uint32_t c = 0; c < weighed->n_candidates; c++) s->skipped += r->skipped[c], s->runs += isfinite(r->measured[c]);
    for (uint32_t c = 0; c < weighed->n_candidates; c++) {
        if (r->n_loads[c] < 2 || s->n_spreads == 4096) continue;
        double lo, hi;
        load_range(r, (int)c, &lo, &hi);
        s->spreads[s->n_spreads++] = hi / lo - 1;
    }
    s->overlapped += slowdown > 0 && loads_overlap(weighed, r, r->chosen, best);
    s->overlapped_in_set += set_slowdown > 0 && in_set >= 0 && loads_overlap(weighed, r, r->chosen, in_set);
    for (uint32_t c = 0; c < weighed->n_candidates; c++)
        if (isfinite(r->measured[c]) && !r->cut[c] && s->n_all < 16384)
            s->all_errors[s->n_all++] = fabs(r->predicted[c] / r->measured[c] - 1);
    char chosen_label[48], best_label[48];
    plan_candidate_name(&weighed->candidates[r->chosen], chosen_label, sizeof chosen_label);
    plan_candidate_name(&weighed->candidates[best], best_label, sizeof best_label);
    printf("%-28s %6.0fG %6d %6d  %-24s %-24s %9.4f %9.4f %+7.1f%% %+7.1f%%\n", model, budget / 1073741824.0, ctx,
           r->n_tokens, chosen_label, best_label, chosen, plan_time(weighed, r, best), 100 * slowdown,
           100 * (r->predicted[r->chosen] / chosen - 1));
    if (json) {
        fprintf(json, "{\"model\": \"%s\", \"budget_gb\": %.0f, \"context\": %d, \"tokens\": %d, \"chosen\": \"%s\", "
                      "\"best\": \"%s\", \"host_read_gbps\": [%.1f, %.1f], \"candidates\": [",
                model, budget / 1073741824.0, ctx, r->n_tokens, chosen_label, best_label, host->read[0], host->read[1]);
        for (uint32_t c = 0; c < weighed->n_candidates; c++) {
            char label[48];
            plan_candidate_name(&weighed->candidates[c], label, sizeof label);
            fprintf(json, "%s{\"plan\": \"%s\", \"measured_s\": %.6g, \"predicted_s\": %.6g, \"cut\": %s, \"skipped\": %s, "
                          "\"rechecked\": %s, \"placement\": \"%016llx\"",
                    c ? ", " : "", label, isfinite(r->measured[c]) ? r->measured[c] : -1,
                    isfinite(r->predicted[c]) ? r->predicted[c] : -1, r->cut[c] ? "true" : "false",
                    r->skipped[c] ? "true" : "false", r->rechecked[c] ? "true" : "false",
                    (unsigned long long)weighed->candidates[c].key[r->tier]);
            if (r->n_loads[c] > 1) {
                fprintf(json, ", \"loads\": [");
                for (int i = 0; i < r->n_loads[c]; i++) fprintf(json, "%s%.6g", i ? ", " : "", r->loads[c][i]);
                fprintf(json, "]");
            }
            fprintf(json, "}");
        }
        fprintf(json, "], \"weighed_with\": \"%s\", \"cpu_now\": {\"host_read_gbps\": %.6g, \"cpu_matmul\": ",
                host->weighed_now ? "cpu_now" : "profile", host->now->host_read_gbps);
        rates_json(json, host->now->cpu_matmul);
        fprintf(json, ", \"cpu_experts\": ");
        rates_json(json, host->now->cpu_experts);
        fprintf(json, "}}\n");
    }
}

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--batch")) return cmd_bench_batch(argc, argv);
    struct oracle_opts o;
    const int rc = parse_opts(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    if (cli_plan_options(&o.options) != PSHARD_OK) {
        fprintf(stderr, "pshard bench: %s\n", pshard_last_error());
        return 2;
    }
    char profile_copy[4096];
    if (o.json && !profile_beside(o.json, profile_copy, sizeof profile_copy)) {
        fprintf(stderr, "pshard bench: --json: '%s' is too long a path\n", o.json);
        return 2;
    }
    if (cuda_device_count() == 0) {
        fprintf(stderr, "pshard bench: --oracle compares plans that use a GPU, and no CUDA device is present\n");
        return 1;
    }
    FILE *json = o.json ? fopen(o.json, "w") : NULL;
    if (o.json && !json) {
        perror(o.json);
        return 1;
    }
    static struct summary s;
    memset(&s, 0, sizeof s);
    const double t0 = core_now_ms();
    printf("%-28s %7s %6s %6s  %-24s %-24s %9s %9s %8s %8s\n", "model", "budget", "ctx", "tokens", "chosen", "best",
           "chosen s", "best s", "slower", "pred err");
    for (int mi = 0; mi < o.n_models; mi++) {
        struct gguf_file *file;
        struct model m;
        if (gguf_open(o.models[mi], &file) != PSHARD_OK) goto fail;
        if (model_load(file, &m) != PSHARD_OK) {
            gguf_close(file);
            goto fail;
        }
        struct profile prof;
        bool measured_now;
        pshard_status st = measure_machine_profile(&m, o.n_threads, 0, PROFILE_MEASURE, NULL, NULL, &prof, &measured_now);
        /* The profile as this model's plans are weighed with it: a model whose formats the cached
         * one lacked has added them, so the copy holds every model's so far. */
        if (st == PSHARD_OK && o.json) st = profile_save(profile_copy, &prof);
        const char *name = strrchr(o.models[mi], '/') ? strrchr(o.models[mi], '/') + 1 : o.models[mi];
        for (int ci = 0; st == PSHARD_OK && ci < o.n_contexts; ci++) {
            double cpu_cache[MAX_LIST] = {0};
            for (int bi = 0; st == PSHARD_OK && bi < o.n_budgets; bi++) {
                fprintf(stderr, "%s, %.0f GB, context %d:\n", name, o.budgets[bi] / 1073741824.0, o.contexts[ci]);
                struct oracle_row rows[MAX_LIST];
                int n_rows;
                struct plan weighed;
                /* The host's read speed around the configuration, beside the profile's: CPU work runs
                 * slower or faster than predicted by as much (bench/RESULTS.md, start AO); and the
                 * CPU's figures that follow it, timed again now: the plans are weighed with them
                 * when asked (--cpu-now), else with the profile as a run weighs them. */
                struct profile now = prof;
                st = measure_cpu_now(&m, o.n_threads, &now);
                struct oracle_host host = {{now.host_read_gbps, 0}, &now, o.cpu_now};
                if (st == PSHARD_OK) print_cpu_now(&prof, &now);
                if (st == PSHARD_OK)
                    st = oracle_config(&o, &m, o.cpu_now ? &now : &prof, o.budgets[bi], o.contexts[ci], rows, &n_rows,
                                       &weighed, cpu_cache);
                if (st != PSHARD_OK) break;
                st = measure_host_read(o.n_threads, &host.read[1]);
                if (st == PSHARD_OK) {
                    fprintf(stderr, "  host reads %.1f GB/s before, %.1f after (the profile: %.1f)\n", host.read[0],
                            host.read[1], prof.host_read_gbps);
                    for (int k = 0; k < n_rows; k++)
                        summarize_row(&weighed, &rows[k], &host, &s, json, name, o.budgets[bi], o.contexts[ci]);
                    fflush(stdout);
                    if (json) fflush(json);
                }
                plan_free(&weighed);
            }
        }
        model_free(&m);
        gguf_close(file);
        if (st != PSHARD_OK) goto fail;
    }
    if (json) fclose(json);
    printf("\n%d configurations in %.0f s: the planner chose the measured best in %d (%.0f%%), within 2%% of it in %d, "
           "5%% in %d, 10%% in %d; at worst %.1f%% slower\n",
           s.configs, (core_now_ms() - t0) / 1e3, s.best, s.configs ? 100.0 * s.best / s.configs : 0, s.within2,
           s.within5, s.within10, 100 * s.worst_slowdown);
    printf("of the %d where it was not, %d were timed over several loads with the choice's fastest load faster than the "
           "best's slowest\n",
           s.configs - s.best, s.overlapped);
    printf("against the candidates over the resident set the choice runs over (a phase's tiers share one): the measured best in %d "
           "(%.0f%%), within 10%% in %d; at worst %.1f%% slower\n",
           s.best_in_set, s.configs ? 100.0 * s.best_in_set / s.configs : 0, s.within10_in_set, 100 * s.worst_in_set);
    printf("of the %d where it was not, %d were timed over several loads with the choice's fastest load faster than the "
           "best's slowest (the best there, or not told from it by its loads, in %d)\n",
           s.configs - s.best_in_set, s.overlapped_in_set, s.best_in_set + s.overlapped_in_set);
    printf("prediction error (|predicted/measured - 1|): median %.1f%% for the chosen plans, %.1f%% over all %d "
           "candidates measured in full\n",
           s.n_errors ? 100 * median(s.errors, s.n_errors) : 0, s.n_all ? 100 * median(s.all_errors, s.n_all) : 0, s.n_all);
    printf("candidate steps timed: %d; not run, predicted over %dx slower than one measured (or than the choice's "
           "prediction, before any was measured): %d\n", s.runs, SKIP_FACTOR,
           s.skipped);
    const double spread = s.n_spreads ? median(s.spreads, s.n_spreads) : 0; /* sorts them */
    if (s.n_spreads)
        printf("close calls timed over more loads: %d times of a plan; its slowest load over its fastest, median "
               "+%.1f%%, at most +%.1f%%\n",
               s.n_spreads, 100 * spread, 100 * s.spreads[s.n_spreads - 1]);
    return 0;
fail:
    if (json) fclose(json);
    fprintf(stderr, "pshard bench: %s\n", pshard_last_error());
    return 1;
}
