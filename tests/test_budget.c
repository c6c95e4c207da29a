/* The VRAM budget while running, its CPU side: budgets as text (auto, keep=), the API's errors
 * (nothing changes on a refused budget), and re-planning a running context for another budget
 * giving the plan a context opened at that budget would have (qwen30b's shape, 8G -> 2G -> 6G). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/budget.h"
#include "engine/engine_internal.h"
#include "exec/exec_budget.h"
#include "plan/plan.h"
#include "pshard.h"

static char tiny_path[256], qwen_path[256];
static const int64_t GIB = 1ll << 30, MIB = 1ll << 20;

static void test_parse(void **state) {
    (void)state;
    int64_t bytes, keep;
    int follow;
    assert_int_equal(pshard_parse_vram_budget("4G", &bytes, &follow, &keep), PSHARD_OK);
    assert_true(bytes == 4 * GIB && follow == 0);
    assert_int_equal(pshard_parse_vram_budget("1536M", &bytes, &follow, &keep), PSHARD_OK);
    assert_true(bytes == 1536 * MIB && follow == 0);
    assert_int_equal(pshard_parse_vram_budget("0", &bytes, &follow, &keep), PSHARD_OK);
    assert_true(bytes == 0 && follow == 0);
    assert_int_equal(pshard_parse_vram_budget("auto", &bytes, &follow, &keep), PSHARD_OK);
    assert_true(follow == 1 && keep == GIB && bytes == 0);
    assert_int_equal(pshard_parse_vram_budget("auto:keep=2G", &bytes, &follow, &keep), PSHARD_OK);
    assert_true(follow == 1 && keep == 2 * GIB);
    assert_int_equal(pshard_parse_vram_budget("auto:keep=512M", &bytes, &follow, &keep), PSHARD_OK);
    assert_true(follow == 1 && keep == 512 * MIB);
    const char *bad[] = {"", "auto:", "auto:keep=", "auto:kep=1G", "autox", "auto:keep=1Q", "auto:keep=-1G", "4Q", "-2G",
                         "auto keep=1G", "G", "auto:keep=0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        follow = 7;
        assert_int_not_equal(pshard_parse_vram_budget(bad[i], &bytes, &follow, &keep), PSHARD_OK);
        assert_true(strlen(pshard_last_error()) > 0);
    }
    assert_int_equal(pshard_parse_vram_budget(NULL, &bytes, &follow, &keep), PSHARD_ERR_INVALID_ARG);
}

/* Following free memory: cut at once, grow only after free memory stayed high a while, never past
 * what fits whole, and the arithmetic in whole MiB. */
static void test_follow_rule(void **state) {
    (void)state;
    double since = 0;
    const int64_t held = 8 * GIB;
    /* free exactly the keep: nothing to do */
    assert_int_equal(engine_follow_target(held, GIB, GIB, false, 0, &since), held);
    /* a game took 3G of the free memory: cut by what keep lacks, at once */
    assert_int_equal(engine_follow_target(held, 0, GIB, false, 10, &since), 7 * GIB);
    /* within the slack below the keep: hold */
    assert_int_equal(engine_follow_target(held, GIB - 32 * MIB, GIB, false, 20, &since), held);
    /* far below (more taken than pshard holds): the least step, 1 MiB (the planner then refuses it) */
    assert_int_equal(engine_follow_target(MIB * 100, 0, GIB, false, 30, &since), MIB);
    /* free memory rises: not taken before it has stayed high for the hold time */
    assert_int_equal(engine_follow_target(held, 5 * GIB, GIB, false, 1000, &since), held);
    assert_true(since == 1000);
    assert_int_equal(engine_follow_target(held, 5 * GIB, GIB, false, 1000 + FOLLOW_GROW_HOLD_MS - 1, &since), held);
    assert_int_equal(engine_follow_target(held, 5 * GIB, GIB, false, 1000 + FOLLOW_GROW_HOLD_MS, &since), 12 * GIB);
    /* a dip in between starts the wait again */
    since = 0;
    assert_int_equal(engine_follow_target(held, 5 * GIB, GIB, false, 5000, &since), held);
    assert_int_equal(engine_follow_target(held, GIB, GIB, false, 5500, &since), held);
    assert_true(since == 0);
    assert_int_equal(engine_follow_target(held, 5 * GIB, GIB, false, 6000 + FOLLOW_GROW_HOLD_MS / 2, &since), held);
    /* a small rise (within the grow step) or a model that fits whole: never grow */
    assert_int_equal(engine_follow_target(held, GIB + 256 * MIB, GIB, false, 9e9, &since), held);
    since = 1;
    assert_int_equal(engine_follow_target(held, 50 * GIB, GIB, true, 9e9, &since), held);
    /* whole MiB */
    assert_int_equal(engine_follow_target(held, 12345678, GIB, false, 0, &since) % MIB, 0);
}

static pshard_ctx *open_cpu(const char *path, int32_t n_ctx) {
    pshard_params p;
    pshard_params_default(&p);
    p.model_path = path;
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.prefault = 0;
    p.no_profile = 1;
    pshard_ctx *ctx = NULL;
    assert_int_equal(pshard_open(&p, &ctx), PSHARD_OK);
    return ctx;
}

/* On a context of the CPU alone (CI has no GPU): every refused budget says why and changes nothing. */
static void test_api_errors(void **state) {
    (void)state;
    pshard_ctx *ctx = open_cpu(tiny_path, 512);
    pshard_info before, after;
    pshard_get_info(ctx, &before);
    assert_int_equal(before.vram_budget, 0);
    assert_int_equal(pshard_set_vram_budget(NULL, GIB), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(pshard_set_vram_budget(ctx, -1), PSHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(pshard_last_error(), "negative"));
    /* below the least the model needs: the planner names it */
    assert_int_equal(pshard_set_vram_budget(ctx, 1), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "minimum"));
    /* a budget that would place shards on the GPU, on a context of the CPU alone */
    assert_int_equal(pshard_set_vram_budget(ctx, 8 * GIB), PSHARD_ERR_UNSUPPORTED);
    assert_non_null(strstr(pshard_last_error(), "CPU alone"));
    assert_int_equal(pshard_set_vram_budget(ctx, 0), PSHARD_OK); /* nothing to change */
    assert_int_equal(pshard_follow_free_vram(ctx, -1), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(pshard_follow_free_vram(ctx, GIB), PSHARD_ERR_UNSUPPORTED);
    assert_int_equal(pshard_budget_poll(ctx), PSHARD_OK);
    assert_int_equal(pshard_budget_poll(NULL), PSHARD_ERR_INVALID_ARG);
    pshard_get_info(ctx, &after);
    assert_int_equal(after.vram_budget, 0);
    assert_int_equal(after.vram_follow, 0);
    assert_int_equal(after.budget_changes, 0);
    assert_string_equal(after.plan, before.plan);
    /* and it still generates */
    pshard_gen_opts o;
    pshard_gen_opts_default(&o);
    o.n_predict = 3, o.sampling.temperature = 0, o.ignore_eos = 1;
    pshard_gen_stats st;
    assert_int_equal(pshard_generate(ctx, "Hello", &o, NULL, NULL, &st), PSHARD_OK);
    assert_int_equal(st.n_generated, 3);
    pshard_close(ctx);
}

static void test_open_errors(void **state) {
    (void)state;
    pshard_params p;
    pshard_params_default(&p);
    p.model_path = tiny_path;
    p.prefault = 0;
    pshard_ctx *ctx = NULL;
    p.vram_keep = -1;
    assert_int_equal(pshard_open(&p, &ctx), PSHARD_ERR_INVALID_ARG);
    p.vram_keep = 0, p.vram_poll_ms = -5;
    assert_int_equal(pshard_open(&p, &ctx), PSHARD_ERR_INVALID_ARG);
    p.vram_poll_ms = 0, p.vram_follow = 1, p.gpu = 1;
    assert_int_equal(pshard_open(&p, &ctx), PSHARD_ERR_INVALID_ARG);
    assert_null(ctx);
    if (exec_device_count() == 0) { /* auto needs a GPU to follow */
        p.gpu = 0;
        assert_int_equal(pshard_open(&p, &ctx), PSHARD_ERR_UNSUPPORTED);
        assert_non_null(strstr(pshard_last_error(), "no CUDA device"));
        assert_null(ctx);
    }
}

/* A plan as `pshard plan` prints it, with its candidates' predictions. */
static char *describe(const struct plan *plan, const struct model *model) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    plan_print(plan, model, true, f);
    plan_print_times(plan, model, NULL, f);
    for (uint32_t c = 0; c < plan->n_candidates; c++) {
        char name[64];
        plan_candidate_name(&plan->candidates[c], name, sizeof name);
        fprintf(f, "%s", name);
        for (int t = 0; t < PLAN_TIERS; t++) fprintf(f, " %.9g", plan->candidates[c].seconds[t]);
        fputc('\n', f);
    }
    fclose(f);
    return text;
}

/* A running context re-planned for 8G, 2G, then 6G plans as one opened at each would. */
static void test_replan_equals_fresh(void **state) {
    (void)state;
    pshard_ctx *ctx = open_cpu(qwen_path, 4096);
    const int64_t budgets[] = {8 * GIB, 2 * GIB, 6 * GIB, 3 * GIB / 2};
    const struct model *model = &ctx->model;
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        struct plan live, fresh;
        assert_int_equal(exec_replan(ctx->exec, budgets[i], NULL, false, &live), PSHARD_OK);
        pshard_params p = ctx->params;
        p.vram_budget = budgets[i];
        struct exec_params ep;
        engine_exec_params(&p, &ctx->options, model, &ep);
        assert_int_equal(exec_make_plan(model, &ep, &fresh), PSHARD_OK);
        assert_true(live.any_gpu);
        assert_int_equal(live.budget.total, budgets[i]);
        char *a = describe(&live, model), *b = describe(&fresh, model);
        assert_string_equal(a, b);
        /* budgets this far apart do place differently (the comparison can fail) */
        if (i > 0) {
            struct plan prev;
            assert_int_equal(exec_replan(ctx->exec, budgets[i - 1], NULL, false, &prev), PSHARD_OK);
            char *c = describe(&prev, model);
            assert_string_not_equal(a, c);
            free(c);
            plan_free(&prev);
        }
        free(a);
        free(b);
        plan_free(&live);
        plan_free(&fresh);
    }
    /* below the least: refused, naming it */
    struct plan tiny;
    assert_int_equal(exec_replan(ctx->exec, 64 * MIB, NULL, false, &tiny), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "minimum"));
    pshard_close(ctx);
}

/* A budget above what the model needs whole comes down to that with trim (auto never holds
 * memory no plan uses), and stays as given without. */
static void test_trim(void **state) {
    (void)state;
    pshard_ctx *ctx = open_cpu(tiny_path, 512);
    struct plan whole, trimmed;
    assert_int_equal(exec_replan(ctx->exec, 4 * GIB, NULL, false, &whole), PSHARD_OK);
    assert_int_equal(whole.budget.total, 4 * GIB);
    assert_true(whole.budget.free > (uint64_t)GIB);
    assert_int_equal(exec_replan(ctx->exec, 4 * GIB, NULL, true, &trimmed), PSHARD_OK);
    const uint64_t used = whole.budget.total - whole.budget.free;
    assert_true(trimmed.budget.total >= used && trimmed.budget.total < used + MIB);
    assert_int_equal(trimmed.budget.total % MIB, 0);
    assert_true(trimmed.any_gpu && trimmed.n_candidates == 0); /* still every shard resident */
    plan_free(&whole);
    plan_free(&trimmed);
    pshard_close(ctx);
}

static int synth(const char *args, const char *path) {
    const char *build = getenv("PSHARD_BUILD_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/gguf-synth' %s --quiet -o '%s'", build ? build : ".", args, path);
    return system(cmd);
}

int main(void) {
    snprintf(tiny_path, sizeof tiny_path, "/tmp/pshard-test-budget-tiny-%d.gguf", (int)getpid());
    snprintf(qwen_path, sizeof qwen_path, "/tmp/pshard-test-budget-qwen-%d.gguf", (int)getpid());
    if (synth("--shape tiny-llama --seed 3", tiny_path) || synth("--shape qwen30b --header-only", qwen_path)) {
        fprintf(stderr, "cannot make the test models with gguf-synth (PSHARD_BUILD_DIR)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse), cmocka_unit_test(test_follow_rule), cmocka_unit_test(test_api_errors), cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_replan_equals_fresh), cmocka_unit_test(test_trim),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(tiny_path);
    unlink(qwen_path);
    return failed;
}
