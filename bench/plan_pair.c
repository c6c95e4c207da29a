/* Times a few plans of one model, budget and context against each other over several loads, with
 * where each step's host time went: the oracle's close calls taken apart. Each round loads every
 * plan in turn (the order alternating between rounds, as the oracle's rechecks do) and times steps
 * of each size as the oracle does: a warm-up, then REPS runs at the end of the context, each with
 * tokens of its own (the same tokens for every plan and round). Prints per plan, round and step
 * size the median step, the host's compute and wait within it, and the cost model's prediction.
 * Usage: plan_pair MODEL BUDGET_GB CTX TOKENS,... LOADS REPS PLAN...
 *   PLAN: FAMILY[/SHARE][@SET], for example dynamic@ring, dynamic/0.5@no-ring, static@ring
 *   (SHARE 0 or none: balanced; the profile is this machine's cached one, measured if missing). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "exec/exec.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "measure/measure.h"
#include "plan/cost.h"
#include "plan/plan.h"

enum { MAX_PLANS = 8, MAX_SIZES = 8, MAX_REPS = 15 };

struct spec {
    enum plan_family family;
    float share;
    enum plan_set set;
    const char *text;
};

static int parse_spec(char *text, struct spec *s) {
    s->text = strdup(text);
    s->share = 0;
    s->set = PLAN_SET_RING;
    char *at = strchr(text, '@'), *slash = strchr(text, '/');
    if (at) *at = '\0';
    if (slash) *slash = '\0';
    if (plan_parse_family(text, &s->family) != PSHARD_OK) return -1;
    if (slash && plan_parse_share(slash + 1, &s->share) != PSHARD_OK) return -1;
    if (at && plan_parse_set(at + 1, &s->set) != PSHARD_OK) return -1;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double s[MAX_REPS];
    memcpy(s, v, sizeof *v * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* One load of a plan: every step size timed, one line each. */
static pshard_status time_load(const struct model *m, const struct exec_params *params, const struct spec *s,
                               const int32_t *sizes, int n_sizes, int reps, int round) {
    /* Placed as the oracle places the planner's candidates. */
    const struct plan_candidate cand = {.family = s->family, .share = s->share, .set = s->set};
    const struct exec_params p = exec_params_for_candidate(params, &cand);
    struct exec_ctx *ex = NULL;
    const double t0 = core_now_ms();
    CORE_TRY(exec_create(m, &p, &ex));
    pshard_status st = exec_fill_seq(ex, 0, 0);
    const double load_s = (core_now_ms() - t0) / 1e3;
    for (int k = 0; st == PSHARD_OK && k < n_sizes; k++) {
        const int32_t n = sizes[k];
        int32_t *tokens = malloc(sizeof *tokens * (size_t)n), *pos = malloc(sizeof *pos * (size_t)n),
                *seq = calloc((size_t)n, sizeof *seq);
        if (!tokens || !pos || !seq) st = core_fail(PSHARD_ERR_NOMEM, "out of memory");
        double ms[MAX_REPS], host[MAX_REPS], wait[MAX_REPS];
        for (int r = -1; st == PSHARD_OK && r < reps; r++) {
            const uint32_t salt = (uint32_t)(r + 1) * 104729u;
            for (int32_t i = 0; i < n; i++) {
                tokens[i] = (int32_t)((salt + (uint32_t)i * 7919u + 17u) % m->hp.n_vocab);
                pos[i] = params->n_ctx - n + i;
            }
            st = exec_fill_seq(ex, 0, params->n_ctx - n);
            if (st != PSHARD_OK) break;
            struct exec_batch b = {n, tokens, pos, seq, NULL};
            const double s0 = core_now_ms();
            st = exec_step(ex, &b);
            const double took = core_now_ms() - s0;
            if (r < 0) continue;
            const struct exec_stats *es = exec_last_stats(ex);
            ms[r] = took, host[r] = es->host_compute_ms, wait[r] = es->host_wait_ms;
        }
        if (st == PSHARD_OK) {
            struct cost_step cs;
            cost_plan_step(params->profile, m, exec_get_plan(ex), n, params->n_ctx - n, &cs);
            printf("%-24s round %d  load %5.1f s  %5d tokens  step %8.3f ms  host compute %8.3f  wait %8.3f  "
                   "predicted %8.3f  runs",
                   s->text, round, load_s, n, median(ms, reps), median(host, reps), median(wait, reps), cs.seconds * 1e3);
            for (int r = 0; r < reps; r++) printf(" %.3f", ms[r]);
            putchar('\n');
            fflush(stdout);
        }
        free(tokens), free(pos), free(seq);
    }
    exec_free(ex);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: plan_pair MODEL BUDGET_GB CTX TOKENS,... LOADS REPS PLAN...\n"
                        "  PLAN: FAMILY[/SHARE][@SET], for example dynamic@ring dynamic/0.5@no-ring\n");
        return 2;
    }
    const double budget_gb = atof(argv[2]);
    const int32_t ctx = atoi(argv[3]);
    const int loads = atoi(argv[5]), reps = atoi(argv[6]);
    int32_t sizes[MAX_SIZES];
    int n_sizes = 0, n_batch = 1;
    for (char *t = strtok(argv[4], ","); t && n_sizes < MAX_SIZES; t = strtok(NULL, ",")) {
        sizes[n_sizes] = atoi(t);
        if (sizes[n_sizes] < 1 || sizes[n_sizes] >= ctx) {
            fprintf(stderr, "plan_pair: '%s' tokens do not fit a context of %d\n", t, ctx);
            return 2;
        }
        if (sizes[n_sizes] > n_batch) n_batch = sizes[n_sizes];
        n_sizes++;
    }
    struct spec specs[MAX_PLANS];
    int n_specs = 0;
    for (int a = 7; a < argc && n_specs < MAX_PLANS; a++)
        if (parse_spec(argv[a], &specs[n_specs++]) != 0) {
            fprintf(stderr, "plan_pair: '%s' is not FAMILY[/SHARE][@SET]\n", argv[a]);
            return 2;
        }
    if (budget_gb <= 0 || ctx < 2 || loads < 1 || reps < 1 || reps > MAX_REPS || !n_sizes) {
        fprintf(stderr, "plan_pair: BUDGET_GB and CTX must be positive, LOADS at least 1, REPS 1-%d\n", MAX_REPS);
        return 2;
    }
    struct gguf_file *file;
    struct model m;
    if (gguf_open(argv[1], &file) != PSHARD_OK || model_load(file, &m) != PSHARD_OK) {
        fprintf(stderr, "plan_pair: %s\n", pshard_last_error());
        return 1;
    }
    static struct profile prof;
    bool measured;
    if (measure_machine_profile(&m, 0, 0, PROFILE_MEASURE, NULL, NULL, &prof, &measured) != PSHARD_OK) {
        fprintf(stderr, "plan_pair: %s\n", pshard_last_error());
        return 1;
    }
    const struct exec_params params = {.n_ctx = ctx, .n_batch = n_batch, .n_seq = 1, .plan = PLAN_AUTO,
                                       .vram_budget = (int64_t)(budget_gb * 1073741824.0), .staging = -1,
                                       .profile = &prof, .decode_set = PLAN_DECODE_SAME, .dynamic_in_place = true};
    for (int round = 0; round < loads; round++)
        for (int j = 0; j < n_specs; j++) {
            const struct spec *s = &specs[round % 2 ? n_specs - 1 - j : j];
            if (time_load(&m, &params, s, sizes, n_sizes, reps, round) != PSHARD_OK)
                fprintf(stderr, "plan_pair: %s: %s\n", s->text, pshard_last_error());
        }
    model_free(&m);
    gguf_close(file);
    return 0;
}
