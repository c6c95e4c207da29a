/* `pshard plan`: where every shard would run under a VRAM budget, without loading weights. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "plan/cost.h"
#include "exec/exec.h"
#include "exec/measure.h"
#include "plan/profile.h"
#include "gguf/gguf.h"

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard plan [-m MODEL] --vram-budget SIZE [--plan auto|cpu|gpu|static|dynamic] [-c CTX]\n"
                 "                   [-b BATCH] [--parallel N] [-t THREADS] [--stream-share F]\n"
                 "                   [--set ring|no-ring|all-kv] [--decode-set ring|no-ring|all-kv|same]\n"
                 "                   [--no-profile | --profile FILE] [--tokens N,N,...] [-n N] [--shards]\n"
                 "  Prints the plan of every token tier (steps of 1-3, 4-15, ... tokens) and, for auto, every\n"
                 "  candidate the planner weighed with its predicted seconds per step, VRAM and bytes moved\n"
                 "  per token; then each shard's place in decode and in full prompt steps (RESIDENT in VRAM,\n"
                 "  STREAMED from host memory, or CPU; MoE experts per range), the VRAM breakdown and the\n"
                 "  weight bytes read per decode token from host memory, over PCIe and from VRAM. A run of\n"
                 "  layers placed alike shows its first layer and one line (--shards: every shard).\n"
                 "  Predictions use this machine's profile (`pshard profile`) when one is cached, else\n"
                 "  conservative defaults (always with --no-profile); --profile FILE plans with a profile\n"
                 "  saved elsewhere (another machine's). --set places gpu, static or dynamic over one of the\n"
                 "  resident sets auto weighs: room for the staging ring or not, or the ring and every\n"
                 "  layer's KV cache first. auto may run decode steps over another set than prompt steps\n"
                 "  (VRAM carved anew when the phase changes); --decode-set SET asks for that set, or\n"
                 "  `same` for one set throughout. --tokens prices steps of those many tokens (at the end of\n"
                 "  the context) under every candidate, and marks the one the plan runs there. auto weighs\n"
                 "  resident sets by a typical request: a prompt of 1K tokens (or half the context), then 128\n"
                 "  generated tokens, or N with -n N (-1: to the context's end), as `pshard run -n N` does.\n"
                 "  Nothing is loaded onto the GPU.\n");
}

enum { MAX_TOKENS = 16 };

/* One row of --tokens: a plan's predicted seconds per step of each listed size. */
static void print_step_row(const char *label, const struct model *m, const struct exec_params *p, const struct plan *plan,
                           const int64_t *tokens, int n_tokens, const bool *mark) {
    struct profile defaults;
    const struct profile *prof = plan_profile(p->profile, &defaults);
    printf("  %-28s", label);
    for (int k = 0; k < n_tokens; k++) {
        const int32_t n = (int32_t)tokens[k];
        struct cost_step c;
        cost_plan_step(prof, m, plan, n, p->n_ctx > n ? p->n_ctx - n : 0, &c);
        printf(" %11.6g%c", c.seconds, mark && mark[k] ? '*' : ' ');
    }
    putchar('\n');
}

/* --tokens: every candidate's predicted step at each size, as the candidate alone would run it,
 * the one the automatic plan runs marked (its tier's choice, or where a tier starts sooner the
 * candidate that places the step alike), as `pshard bench --oracle` counts it. */
static pshard_status print_steps(const struct model *m, const struct exec_params *p, const struct plan *plan,
                                 const int64_t *tokens, int n_tokens) {
    printf("steps (predicted seconds per step at the end of the context%s):\n  %-28s",
           plan->n_candidates ? "; * = the candidate the plan runs there" : "", "plan");
    for (int k = 0; k < n_tokens; k++) printf(" %11lld ", (long long)tokens[k]);
    putchar('\n');
    if (!plan->n_candidates) {
        print_step_row("this plan", m, p, plan, tokens, n_tokens, NULL);
        return PSHARD_OK;
    }
    for (uint32_t c = 0; c < plan->n_candidates; c++) {
        bool mark[MAX_TOKENS] = {false};
        for (int k = 0; k < n_tokens; k++) mark[k] = plan_step_candidate(plan, (int32_t)tokens[k], p->n_ctx) == (int)c;
        const struct exec_params cp = exec_params_for_candidate(p, &plan->candidates[c]);
        struct plan alone;
        CORE_TRY(exec_make_plan(m, &cp, &alone));
        char label[48];
        plan_candidate_name(&plan->candidates[c], label, sizeof label);
        print_step_row(label, m, p, &alone, tokens, n_tokens, mark);
        plan_free(&alone);
    }
    return PSHARD_OK;
}

int cmd_plan(int argc, char **argv) {
    const char *model_path = NULL;
    bool no_profile = false, every_shard = false;
    const char *profile_file = NULL;
    struct exec_params p = {4096, 512, 1, 0, PLAN_AUTO, -1, 0.0f, -1, NULL, PLAN_DECODE_WEIGHED, 0, false};
    int64_t tokens[MAX_TOKENS];
    int n_tokens = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-m") && v) {
            model_path = argv[++i];
        } else if (!strcmp(argv[i], "--vram-budget") && v) {
            if (plan_parse_size(argv[++i], &p.vram_budget) != PSHARD_OK) goto bad;
        } else if (!strcmp(argv[i], "--plan") && v) {
            if (plan_parse_family(argv[++i], &p.plan) != PSHARD_OK) goto bad;
        } else if (!strcmp(argv[i], "--stream-share") && v) {
            if (plan_parse_share(argv[++i], &p.stream_share) != PSHARD_OK) {
                fprintf(stderr, "pshard plan: --stream-share: %s\n", pshard_last_error());
                return 2;
            }
        } else if (!strcmp(argv[i], "--shards")) {
            every_shard = true;
        } else if (!strcmp(argv[i], "--no-profile")) {
            no_profile = true;
        } else if (!strcmp(argv[i], "--profile") && v) {
            profile_file = argv[++i];
        } else if (!strcmp(argv[i], "--set") && v) {
            enum plan_set set;
            if (plan_parse_set(argv[++i], &set) != PSHARD_OK) {
                fprintf(stderr, "pshard plan: --set: %s\n", pshard_last_error());
                return 2;
            }
            p.staging = (int32_t)set;
        } else if (!strcmp(argv[i], "--decode-set") && v) {
            if (plan_parse_decode_set(argv[++i], &p.decode_set) != PSHARD_OK) {
                fprintf(stderr, "pshard plan: --decode-set: %s\n", pshard_last_error());
                return 2;
            }
        } else if (!strcmp(argv[i], "--tokens") && v) {
            if (cli_parse_list(argv[++i], false, tokens, MAX_TOKENS, &n_tokens) != 0) {
                fprintf(stderr, "pshard plan: --tokens takes up to %d whole numbers of tokens, such as 16,32,63\n", MAX_TOKENS);
                return 2;
            }
        } else if (!strcmp(argv[i], "-n") && v) {
            char *end;
            const long n = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || n < -1 || n > 1000000000L) {
                fprintf(stderr, "pshard plan: -n takes the tokens a request generates (-1: to the context's end)\n");
                return 2;
            }
            p.n_decode = cli_request_tokens(n);
        } else if (!strcmp(argv[i], "--parallel") && v) {
            p.n_seq = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-t") && v) {
            p.n_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-c") && v) {
            p.n_ctx = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-b") && v) {
            p.n_batch = atoi(argv[++i]);
        } else {
            print_usage(stderr);
            return 2;
        }
    }
    if (p.n_ctx <= 0 || p.n_batch <= 0 || p.n_seq <= 0 || p.n_threads < 0) {
        fprintf(stderr, "pshard plan: -c, -b and --parallel must be positive\n");
        return 2;
    }
    for (int k = 0; k < n_tokens; k++)
        if (tokens[k] > p.n_batch || tokens[k] > p.n_ctx) {
            fprintf(stderr, "pshard plan: --tokens: a step of %lld tokens is over the micro-batch (-b %d) or the context (-c %d)\n",
                    (long long)tokens[k], p.n_batch, p.n_ctx);
            return 2;
        }
    if (p.staging >= 0 && !plan_takes_set(p.plan)) {
        fprintf(stderr, "pshard plan: --set places a gpu, static or dynamic plan; name one with --plan\n");
        return 2;
    }
    char default_path[4096];
    if (!model_path) {
        if (cli_default_model(default_path, sizeof default_path) != 0) return 1;
        model_path = default_path;
    }
    struct gguf_file *file;
    struct model model;
    struct plan plan;
    if (gguf_open(model_path, &file) != PSHARD_OK) goto fail;
    if (model_load(file, &model) != PSHARD_OK) {
        gguf_close(file);
        goto fail;
    }
    struct profile profile;
    bool measured_now;
    pshard_status st = profile_file ? profile_load(profile_file, NULL, &profile)
                                    : exec_machine_profile(&model, p.n_threads, 0, no_profile ? PROFILE_DEFAULTS : PROFILE_CACHED,
                                                           NULL, NULL, &profile, &measured_now);
    /* Every plan's predictions use the profile, the CPU's alone included (--tokens, -b 0). */
    if (st == PSHARD_OK) {
        p.profile = &profile;
        const bool gpu_steps = p.vram_budget != 0 && p.plan != PLAN_CPU;
        if (profile.measured)
            plan_note(stdout, "profile: measured in %.0f s on %s, %d threads%s%s%s", profile.seconds, profile.fp.cpu,
                   profile.fp.threads, profile.fp.gpu[0] ? ", " : "", profile.fp.gpu,
                   gpu_steps && !profile.has_gpu ? "; it has no GPU, so steps on one are not priced (inf): plan with "
                                                   "the GPU machine's profile (--profile FILE)"
                                                 : "");
        else
            plan_note(stdout, "profile: %s; predictions use conservative defaults",
                   no_profile ? "not used (--no-profile)" : "none cached for this machine (run `pshard profile`)");
        if (gpu_steps && cuda_device_count() == 0)
            plan_note(stderr, "pshard plan: this machine has no CUDA device, so `pshard run` here runs on the CPU "
                              "alone (--vram-budget 0); this plan is for a machine with one");
    }
    if (st == PSHARD_OK) st = exec_make_plan(&model, &p, &plan);
    if (st == PSHARD_OK) {
        plan_print(&plan, &model, every_shard, stdout);
        plan_print_times(&plan, &model, p.profile, stdout);
        if (n_tokens) st = print_steps(&model, &p, &plan, tokens, n_tokens);
        plan_free(&plan);
    }
    model_free(&model);
    gguf_close(file);
    if (st != PSHARD_OK) goto fail;
    return 0;
bad:
    fprintf(stderr, "pshard plan: %s\n", pshard_last_error());
    return 2;
fail:
    fprintf(stderr, "pshard plan: %s\n", pshard_last_error());
    return 1;
}
