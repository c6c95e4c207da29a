/* `pshard plan`: where every shard would run under a VRAM budget, without loading weights. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine/tools_api.h"
#include "plan_image.h"

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard plan [-m MODEL] --vram-budget SIZE [--plan auto|cpu|gpu|static|dynamic] [-c CTX]\n"
                 "                   [-b BATCH] [--parallel N] [-t THREADS] [--stream-share F]\n"
                 "                   [--set ring|no-ring|all-kv] [--decode-set ring|no-ring|all-kv|same]\n"
                 "                   [--no-profile | --profile FILE] [--tokens N,N,...] [-n N] [--shards]\n"
                 "                   [--mmproj VISION.gguf --image-size WxH [--no-mmproj-offload]]\n"
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
                 "  generated tokens, or N with -n N (-1: to the context's end), as `pshard run -n N` does;\n"
                 "  with --parallel N, N such requests at once, and -c is the KV cells they share (as in\n"
                 "  `pshard batch` and `pshard serve`). Without -b, under a budget the model does not fit\n"
                 "  whole, auto also weighs micro-batches of 512 and 1024 tokens by that request and\n"
                 "  says which it takes (`micro-batch:`), as `pshard run` does; else -b is 512. Nothing is\n"
                 "  loaded onto the GPU. With --mmproj and --image-size, after the plan: the image's size after\n"
                 "  the model's resize, its patches and tokens, the vision encoder's predicted time on the GPU\n"
                 "  and on the CPU, its peak VRAM, where it runs under this plan (the GPU where it fits the\n"
                 "  memory the plan lends between steps), and the first token of a request with that image and\n"
                 "  a short question; --no-mmproj-offload prices it as `pshard run --no-mmproj-offload` runs\n"
                 "  it, on the CPU.\n");
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

/* The micro-batch chosen without -b, and each size's typical request. */
static void print_batch_choice(const struct exec_batch_choice *c, FILE *out) {
    char sizes[96] = "", times[96] = "";
    for (int i = 0, a = 0, b = 0; i < c->n; i++) {
        a += snprintf(sizes + a, sizeof sizes - (size_t)a, "%s%d", i ? " / " : "", c->n_batch[i]);
        b += isfinite(c->request_s[i]) ? snprintf(times + b, sizeof times - (size_t)b, "%s%.3f", i ? " / " : "", c->request_s[i])
                                       : snprintf(times + b, sizeof times - (size_t)b, "%sdoes not fit", i ? " / " : "");
    }
    plan_note(out, "micro-batch: %d tokens a prompt step, chosen without -b: of %s, the largest whose typical request is "
                   "predicted within %.0f%% of the soonest (%s s); larger steps read a long prompt's streamed weights "
                   "fewer times", c->n_batch[c->chosen], sizes, EXEC_BATCH_MARGIN * 100, times);
}

int cmd_plan(int argc, char **argv) {
    const char *model_path = NULL;
    bool no_profile = false, every_shard = false;
    const char *profile_file = NULL;
    struct exec_params p = {.n_ctx = 4096, .n_batch = 512, .n_seq = 1};
    pshard_params planning; /* the planning options, read as run reads them */
    pshard_params_default(&planning);
    int64_t tokens[MAX_TOKENS];
    int n_tokens = 0;
    bool budget_given = false, batch_given = false;
    struct plan_image image = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t k;
        int r;
        /* Reads the option's value (consuming it) into k; nonzero: refused, said why. */
#define INT(lo, hi) (i++, cli_int("plan", a, v, lo, hi, &k))
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && v) {
            model_path = argv[++i];
        } else if ((r = cli_planning_option("plan", argc, argv, &i, false, &planning)) != 0) {
            if (r < 0) return 2;
            budget_given = budget_given || !strcmp(a, "--vram-budget");
        } else if (!strcmp(a, "--shards")) {
            every_shard = true;
        } else if (!strcmp(a, "--no-profile")) {
            no_profile = true;
        } else if (!strcmp(a, "--profile") && v) {
            profile_file = argv[++i];
        } else if (!strcmp(a, "--mmproj") && v) {
            image.mmproj = argv[++i];
        } else if (!strcmp(a, "--no-mmproj-offload")) {
            image.no_offload = true;
        } else if (!strcmp(a, "--image-size") && v) {
            if (plan_image_parse_size(argv[++i], &image)) return 2;
        } else if (!strcmp(a, "--tokens") && v) {
            if (cli_parse_list(argv[++i], false, tokens, MAX_TOKENS, &n_tokens) != 0) {
                fprintf(stderr,
                        "pshard plan: --tokens takes up to %d whole numbers from 1 to 16777216, such as 16,32,63, "
                        "got '%s'\n", MAX_TOKENS, argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "-n") && v) {
            if (INT(-1, 1000000000)) return 2;
            p.n_decode = cli_request_tokens(k);
        } else if (!strcmp(a, "--parallel") && v) {
            if (INT(1, 65536)) return 2;
            p.n_seq = (int32_t)k;
        } else if (!strcmp(a, "-t") && v) {
            if (INT(1, 1024)) return 2;
            p.n_threads = (int32_t)k;
        } else if (!strcmp(a, "-c") && v) {
            if (INT(1, 1 << 24)) return 2;
            p.n_ctx = (int32_t)k;
        } else if (!strcmp(a, "-b") && v) {
            if (INT(1, 65536)) return 2;
            p.n_batch = (int32_t)k;
            batch_given = true;
        } else {
            cli_refuse("plan", a, "-m --profile --mmproj --image-size --tokens -n --parallel -t -c -b");
            print_usage(stderr);
            return 2;
        }
#undef INT
    }
    engine_planning_params(&planning, &p);
    if (!budget_given) {
        fprintf(stderr, "pshard plan: --vram-budget SIZE is required: the device memory to plan for, such as 2G or\n"
                        "1536M (0: the CPU alone)\n");
        return 2;
    }
    if (image.width && !image.mmproj) {
        fprintf(stderr, "pshard plan: --image-size prices the vision encoder: give its file with --mmproj VISION.gguf\n");
        return 2;
    }
    if (image.no_offload && !image.mmproj) {
        fprintf(stderr, "pshard plan: --no-mmproj-offload prices the vision encoder on the CPU: give its file with "
                        "--mmproj VISION.gguf and an image's size with --image-size WxH\n");
        return 2;
    }
    if (image.mmproj && !image.width) {
        fprintf(stderr, "pshard plan: --mmproj prices the vision encoder for an image: give its size with --image-size WxH\n");
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
    if (cli_plan_options(&p.options) != PSHARD_OK) {
        model_free(&model);
        gguf_close(file);
        goto fail;
    }
    if (p.n_seq > 1) exec_params_share_pool(&p, model.hp.n_ctx_train); /* --parallel: -c is the pool they share */
    else p.n_ctx = cli_cap_context("plan", model.hp.n_ctx_train, p.n_ctx);
    struct profile profile;
    bool measured_now;
    pshard_status st = profile_file ? profile_load(profile_file, NULL, &profile)
                                    : measure_machine_profile(&model, p.n_threads, 0, no_profile ? PROFILE_DEFAULTS : PROFILE_CACHED,
                                                           NULL, NULL, &profile, &measured_now);
    /* Every plan's predictions use the profile, the CPU's alone included (--tokens, -b 0). */
    if (st == PSHARD_OK) {
        p.profile = &profile;
        const bool gpu_steps = p.vram_budget != 0 && p.plan != PLAN_CPU;
        const bool no_device = gpu_steps && cuda_device_count() == 0;
        const bool unpriced = gpu_steps && profile.measured && !profile.has_gpu; /* every GPU step: inf */
        if (profile.measured)
            plan_note(stdout, "profile: measured in %.0f s on %s, %d threads%s%s%s", profile.seconds, profile.fp.cpu,
                   profile.fp.threads, profile.fp.gpu[0] ? ", " : "", profile.fp.gpu,
                   !unpriced ? ""
                   : no_device ? ", without a GPU"
                               : "; it has no GPU, so steps on one are not priced (inf): plan with the GPU machine's "
                                 "profile (--profile FILE)");
        else
            plan_note(stdout, "profile: %s; predictions use conservative defaults",
                   no_profile ? "not used (--no-profile)" : "none cached for this machine (run `pshard profile`)");
        /* Said once, with what to do instead. */
        if (no_device && unpriced)
            plan_note(stderr, "pshard plan: this machine has no CUDA device and the profile has no GPU figures, so "
                              "steps on a GPU are not priced (inf) and their times below say nothing. `pshard run` "
                              "here runs on the CPU alone (--vram-budget 0). To plan for a machine with a GPU, give "
                              "its profile (--profile FILE, saved by `pshard profile` there) or plan with "
                              "conservative defaults (--no-profile)");
        else if (no_device)
            plan_note(stderr, "pshard plan: this machine has no CUDA device, so `pshard run` here runs on the CPU "
                              "alone (--vram-budget 0); this plan is for a machine with one");
    }
    /* Without -b, the micro-batch a run would choose (exec_choose_batch), before --tokens is held to it. */
    if (st == PSHARD_OK && !batch_given && p.plan == PLAN_AUTO && p.vram_budget > 0) {
        struct exec_batch_choice choice;
        st = exec_choose_batch(&model, &p, &choice);
        if (st == PSHARD_OK && choice.n) print_batch_choice(&choice, stdout);
    }
    for (int k = 0; st == PSHARD_OK && k < n_tokens; k++)
        if (tokens[k] > p.n_batch || tokens[k] > p.n_ctx) {
            fprintf(stderr, "pshard plan: --tokens: a step of %lld tokens is over the micro-batch (-b %d) or the context (-c %d)\n",
                    (long long)tokens[k], p.n_batch, p.n_ctx);
            model_free(&model);
            gguf_close(file);
            return 2;
        }
    if (st == PSHARD_OK) st = exec_make_plan(&model, &p, &plan);
    if (st == PSHARD_OK) {
        plan_print(&plan, &model, every_shard, stdout);
        plan_print_times(&plan, &model, p.profile, stdout);
        if (n_tokens) st = print_steps(&model, &p, &plan, tokens, n_tokens);
        if (st == PSHARD_OK && image.mmproj) st = plan_image_print(&model, &plan, p.profile, &image, stdout);
        plan_free(&plan);
    }
    model_free(&model);
    gguf_close(file);
    if (st != PSHARD_OK) goto fail;
    return 0;
fail:
    fprintf(stderr, "pshard plan: %s\n", pshard_last_error());
    return 1;
}
