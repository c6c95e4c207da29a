/* The planner on the default model's shard list: families, budgets, priorities, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan/plan.h"

static struct gguf_file *file;
static struct model model;
static const struct plan_gpu_costs costs = {100 << 20, 20 << 20, 10 << 20, 32 << 20};
static const struct plan_request base = {PLAN_AUTO, 0, 2048, 512, 1};

static int setup(void **state) {
    (void)state;
    const char *path = getenv("PSHARD_DEFAULT_MODEL");
    if (!path || gguf_open(path, &file) != PSHARD_OK || model_load(file, &model) != PSHARD_OK) {
        fprintf(stderr, "PSHARD_DEFAULT_MODEL must name the default model (%s)\n", pshard_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    model_free(&model);
    gguf_close(file);
    return 0;
}

static uint64_t used(const struct plan *p) {
    const struct plan_budget *b = &p->budget;
    return b->weights + b->kv + b->activations + b->work + b->blas;
}

static void test_budget_zero_is_cpu(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    assert_int_equal(plan_build(&model, &r, &costs, &p), PSHARD_OK);
    assert_int_equal(p.family, PLAN_CPU);
    assert_false(p.any_gpu);
    assert_int_equal(used(&p), 0);
    assert_true(p.host_bytes_per_token > 80000000);
    plan_free(&p);
}

static void test_everything_fits_is_gpu(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    r.vram_budget = (int64_t)4 << 30;
    assert_int_equal(plan_build(&model, &r, &costs, &p), PSHARD_OK);
    assert_int_equal(p.family, PLAN_GPU);
    assert_true(p.all_gpu);
    assert_int_equal(p.budget.total, (uint64_t)4 << 30); /* the arena is exactly the budget */
    assert_true(used(&p) <= p.budget.total);
    assert_int_equal(p.host_bytes_per_token, 0);
    plan_free(&p);
    r.vram_budget = -1; /* no budget: what the plan needs */
    assert_int_equal(plan_build(&model, &r, &costs, &p), PSHARD_OK);
    assert_int_equal(p.budget.total, used(&p));
    plan_free(&p);
}

static void test_static_fills_by_priority(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    /* Room for the fixed buffers, every attention shard with its KV, and a little more. */
    uint64_t attn = 0;
    for (uint32_t i = 0; i < model.n_shards; i++)
        if (model.shards[i].kind == SHARD_ATTN)
            attn += model.shards[i].weight_bytes + model.shards[i].kv_bytes_per_token * 2048;
    r.vram_budget = (int64_t)(costs.activations + costs.work + costs.blas + attn + (4 << 20));
    assert_int_equal(plan_build(&model, &r, &costs, &p), PSHARD_OK);
    assert_int_equal(p.family, PLAN_STATIC);
    assert_true(used(&p) <= p.budget.total);
    for (uint32_t i = 0; i < model.n_shards; i++) {
        if (model.shards[i].kind == SHARD_ATTN) assert_int_equal(p.shard[i], PLACE_RESIDENT);
        if (model.shards[i].kind == SHARD_HEAD) assert_int_equal(p.shard[i], PLACE_CPU); /* 30 MB: no room */
    }
    assert_true(p.any_gpu && !p.all_gpu && !p.any_cpu_attention);
    assert_true(p.host_bytes_per_token > 0 && p.gpu_bytes_per_token > 0);
    plan_free(&p);
}

static void test_too_small_names_the_minimum(void **state) {
    (void)state;
    struct plan p;
    struct plan_request r = base;
    r.vram_budget = 64 << 20;
    assert_int_equal(plan_build(&model, &r, &costs, &p), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "minimum"));
    r.family = PLAN_GPU;
    r.vram_budget = 300 << 20;
    assert_int_equal(plan_build(&model, &r, &costs, &p), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "gpu plan needs"));
}

static void test_parse(void **state) {
    (void)state;
    int64_t b;
    assert_int_equal(plan_parse_size("2G", &b), PSHARD_OK);
    assert_true(b == (int64_t)2 << 30);
    assert_int_equal(plan_parse_size("2048M", &b), PSHARD_OK);
    assert_true(b == (int64_t)2 << 30);
    assert_int_equal(plan_parse_size("1.5GiB", &b), PSHARD_OK);
    assert_true(b == (int64_t)3 << 29);
    assert_int_equal(plan_parse_size("0", &b), PSHARD_OK);
    assert_int_equal(b, 0);
    const char *bad[] = {"", "G", "-1G", "2X", "1e30", "nan", "2GG"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(plan_parse_size(bad[i], &b), PSHARD_ERR_INVALID_ARG);
    enum plan_family f;
    assert_int_equal(plan_parse_family("static", &f), PSHARD_OK);
    assert_int_equal(f, PLAN_STATIC);
    assert_int_equal(plan_parse_family("dynamic", &f), PSHARD_ERR_UNSUPPORTED);
    assert_int_equal(plan_parse_family("fast", &f), PSHARD_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_zero_is_cpu),       cmocka_unit_test(test_everything_fits_is_gpu),
        cmocka_unit_test(test_static_fills_by_priority), cmocka_unit_test(test_too_small_names_the_minimum),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
