/* The generation API on the default model, on the CPU: a prompt's steps are reported as they run
 * (on_prompt), and a prompt stopped there fails cleanly and leaves the context usable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pshard.h"

enum { BATCH = 16, MAX_CALLS = 64, N_OUT = 8 };

static const char PROMPT[] = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
                             "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. "
                             "The five boxing wizards jump quickly.";

struct heard {
    int calls, stop_at;
    int32_t done[MAX_CALLS], total[MAX_CALLS];
};

static int on_prompt(void *user, int32_t done, int32_t total) {
    struct heard *h = user;
    if (h->calls < MAX_CALLS) h->done[h->calls] = done, h->total[h->calls] = total;
    return ++h->calls == h->stop_at;
}

static int setup(void **state) {
    const char *path = getenv("PSHARD_DEFAULT_MODEL");
    if (!path || !*path) {
        fprintf(stderr, "PSHARD_DEFAULT_MODEL must name the default model\n");
        return -1;
    }
    pshard_params params;
    pshard_params_default(&params);
    params.model_path = path;
    params.n_ctx = 512, params.n_batch = BATCH, params.n_threads = 2;
    params.vram_budget = 0, params.prefault = 0, params.no_profile = 1;
    pshard_ctx *ctx = NULL;
    if (pshard_open(&params, &ctx) != PSHARD_OK) {
        fprintf(stderr, "%s\n", pshard_last_error());
        return -1;
    }
    *state = ctx;
    return 0;
}

static int teardown(void **state) {
    pshard_close(*state);
    return 0;
}

static pshard_status generate(pshard_ctx *ctx, struct heard *h, int32_t *ids, pshard_gen_stats *stats) {
    pshard_gen_opts opts;
    pshard_gen_opts_default(&opts);
    opts.n_predict = N_OUT, opts.sampling.temperature = 0, opts.ignore_eos = 1;
    opts.out_tokens = ids, opts.out_tokens_cap = N_OUT;
    opts.on_prompt = on_prompt, opts.prompt_user = h;
    return pshard_generate(ctx, PROMPT, &opts, NULL, NULL, stats);
}

/* Plan families, resident sets and sizes by name, and a family outside the enum refused by pshard_open with no context. */
static void test_plan_family(void **state) {
    (void)state;
    pshard_plan_family f = PSHARD_PLAN_CPU;
    const char *names[] = {"auto", "cpu", "gpu", "static", "dynamic"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(pshard_parse_plan_family(names[i], &f), PSHARD_OK);
        assert_int_equal(f, PSHARD_PLAN_AUTO + i);
    }
    assert_int_equal(pshard_parse_plan_family("fast", &f), PSHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(pshard_last_error(), "fast"));
    assert_int_equal(f, PSHARD_PLAN_DYNAMIC); /* unchanged */
    assert_int_equal(pshard_parse_plan_family(NULL, &f), PSHARD_ERR_INVALID_ARG);
    int set = 0;
    assert_int_equal(pshard_parse_resident_set("ring", &set), PSHARD_OK);
    assert_int_equal(set, 2);
    assert_int_equal(pshard_parse_resident_set("same", &set), PSHARD_ERR_INVALID_ARG); /* decode sets only */
    assert_int_equal(pshard_parse_decode_set("same", &set), PSHARD_OK);
    assert_int_equal(set, -1);
    assert_int_equal(pshard_parse_decode_set("all-kv", &set), PSHARD_OK);
    assert_int_equal(set, 3);
    int64_t bytes = 0;
    assert_int_equal(pshard_parse_size("1536M", &bytes), PSHARD_OK);
    assert_int_equal(bytes, 1536ll << 20);
    assert_int_equal(pshard_parse_size("lots", &bytes), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(bytes, 1536ll << 20);
    pshard_params params;
    pshard_params_default(&params);
    params.model_path = getenv("PSHARD_DEFAULT_MODEL");
    params.plan = (pshard_plan_family)7;
    pshard_ctx *ctx = (pshard_ctx *)&params;
    assert_int_equal(pshard_open(&params, &ctx), PSHARD_ERR_INVALID_ARG);
    assert_null(ctx);
    assert_non_null(strstr(pshard_last_error(), "plan family 7"));
}

struct loading {
    int calls, stop;
    uint64_t last_done, total;
    int monotonic;
};

static int on_load(void *user, uint64_t done, uint64_t total) {
    struct loading *l = user;
    if (l->calls++ == 0) l->total = total, l->monotonic = 1;
    l->monotonic &= done > l->last_done && done <= total && total == l->total;
    l->last_done = done;
    return l->stop;
}

/* Reading the weights in at load is heard as it goes, up to the whole of them (at least the
 * tensors' bytes); a callback that says stop fails the open with a clear error and no context. */
static void test_load_progress(void **state) {
    (void)state;
    pshard_params params;
    pshard_params_default(&params);
    params.model_path = getenv("PSHARD_DEFAULT_MODEL");
    params.n_ctx = 256, params.n_threads = 2, params.vram_budget = 0, params.no_profile = 1;
    struct loading l = {0};
    params.progress = on_load, params.progress_user = &l;
    pshard_ctx *ctx = NULL;
    assert_int_equal(pshard_open(&params, &ctx), PSHARD_OK);
    assert_true(l.calls >= 1 && l.monotonic);
    assert_true(l.last_done == l.total && l.total > 50u << 20); /* the default model is ~100 MB */
    pshard_info info;
    pshard_get_info(ctx, &info);
    assert_true(info.load_pages_ms >= 0);
    pshard_close(ctx);

    struct loading stop = {.stop = 1};
    params.progress_user = &stop;
    ctx = (pshard_ctx *)&params;
    assert_int_equal(pshard_open(&params, &ctx), PSHARD_ERR_INVALID_ARG);
    assert_null(ctx);
    assert_int_equal(stop.calls, 1);
    assert_non_null(strstr(pshard_last_error(), "loading cancelled"));
}

/* Every step of the prompt is heard, in order, ending at the whole prompt; the tokens a later
 * call reuses are not counted; a prompt stopped after its second step fails with a clear error,
 * keeps no KV cells (the next call reuses nothing), and the next call generates what the first
 * did. */
static void test_prompt_steps_heard_and_stopped(void **state) {
    pshard_ctx *ctx = *state;
    int32_t first[N_OUT], again[N_OUT], after[N_OUT];
    pshard_gen_stats stats;
    struct heard h = {0};
    assert_int_equal(generate(ctx, &h, first, &stats), PSHARD_OK);
    const int32_t n = stats.n_prompt;
    assert_true(n > 2 * BATCH);
    assert_int_equal(h.calls, (n + BATCH - 1) / BATCH);
    for (int i = 0; i < h.calls; i++) {
        assert_int_equal(h.total[i], n);
        assert_int_equal(h.done[i], i + 1 < h.calls ? (i + 1) * BATCH : n);
    }

    /* The same prompt again: all but its last token reused, one step heard. */
    struct heard reused = {0};
    assert_int_equal(generate(ctx, &reused, again, &stats), PSHARD_OK);
    assert_int_equal(stats.n_prompt_cached, n - 1);
    assert_int_equal(reused.calls, 1);
    assert_int_equal(reused.done[0], 1);
    assert_int_equal(reused.total[0], 1);
    assert_memory_equal(again, first, sizeof first);

    /* Stopped after two steps: a clear error, and nothing kept. */
    pshard_close(ctx);
    assert_int_equal(setup(state), 0);
    ctx = *state;
    struct heard stopped = {.stop_at = 2};
    assert_int_not_equal(generate(ctx, &stopped, after, &stats), PSHARD_OK);
    assert_non_null(strstr(pshard_last_error(), "prompt cancelled after 32 of"));
    assert_int_equal(stopped.calls, 2);
    struct heard resumed = {0};
    assert_int_equal(generate(ctx, &resumed, after, &stats), PSHARD_OK);
    assert_int_equal(stats.n_prompt_cached, 0);
    assert_int_equal(stats.n_prompt, n);
    assert_int_equal(resumed.calls, h.calls);
    assert_memory_equal(after, first, sizeof first);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test_setup_teardown(test_prompt_steps_heard_and_stopped, setup, teardown),
                                       cmocka_unit_test(test_plan_family), cmocka_unit_test(test_load_progress)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
