/* Many sequences at once on gguf-synth's tiny MoE model (routing per token), on the CPU: each request of a batch gives the
 * same tokens as when it runs alone (greedy and seeded sampling), requests that join while others
 * decode included; stop strings, token limits, cancelling, the queue's bound and prefix reuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pshard.h"

enum { N_PROMPTS = 5, MAX_OUT = 64, TEXT_MAX = 4096 };

static const char *const PROMPTS[N_PROMPTS] = {
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "Once upon a time, in a land far away, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The capital of France is",
    "List three colours of the rainbow: red,",
};

struct outcome {
    int32_t id, tokens[MAX_OUT], n_tokens, events_after_end;
    char text[TEXT_MAX];
    size_t n_text;
    pshard_finish_reason finish;
    pshard_request_stats stats;
    int cancel_after; /* 0: never; else return nonzero after that many tokens */
};

static int on_event(void *user, const pshard_token_event *ev) {
    struct outcome *o = user;
    if (o->finish != PSHARD_FINISH_NONE) o->events_after_end++;
    if (ev->token >= 0 && o->n_tokens < MAX_OUT) o->tokens[o->n_tokens++] = ev->token;
    if (ev->len && o->n_text + ev->len < TEXT_MAX) memcpy(o->text + o->n_text, ev->text, ev->len), o->n_text += ev->len;
    o->text[o->n_text] = 0;
    if (ev->finish != PSHARD_FINISH_NONE) {
        o->finish = ev->finish;
        o->stats = *ev->stats;
    }
    return o->cancel_after && o->n_tokens >= o->cancel_after;
}

static char model_path[256];

static pshard_ctx *open_pool(int32_t n_parallel, int32_t n_batch, int32_t max_queue, int32_t n_ctx) {
    const char *path = model_path;
    pshard_params params;
    pshard_params_default(&params);
    params.model_path = path;
    params.n_ctx = n_ctx, params.n_batch = n_batch, params.n_threads = 2, params.n_parallel = n_parallel;
    params.max_queue = max_queue;
    params.vram_budget = 0, params.prefault = 0, params.no_profile = 1;
    pshard_ctx *ctx = NULL;
    if (pshard_open(&params, &ctx) != PSHARD_OK) fail_msg("%s", pshard_last_error());
    return ctx;
}

static pshard_ctx *open_ctx(int32_t n_parallel, int32_t n_batch, int32_t max_queue) {
    return open_pool(n_parallel, n_batch, max_queue, 512);
}

static void request(pshard_ctx *ctx, const char *prompt, int32_t n_predict, float temperature, uint64_t seed,
                    struct outcome *o) {
    pshard_request req;
    pshard_request_default(&req);
    req.prompt = prompt;
    req.n_predict = n_predict;
    req.sampling.temperature = temperature;
    req.sampling.seed = seed;
    req.ignore_eos = 1;
    req.on_event = on_event, req.user = o;
    assert_int_equal(pshard_request_add(ctx, &req, &o->id), PSHARD_OK);
}

static void run_to_end(pshard_ctx *ctx) {
    int32_t pending = 1;
    for (int steps = 0; pending; steps++) {
        assert_true(steps < 10000);
        assert_int_equal(pshard_step(ctx, &pending), PSHARD_OK);
    }
}

static int on_text(void *user, const char *text, size_t len) {
    struct outcome *o = user;
    if (o->n_text + len < TEXT_MAX) memcpy(o->text + o->n_text, text, len), o->n_text += len;
    o->text[o->n_text] = 0;
    return 0;
}

/* Each prompt alone through the one-sequence call (pshard_generate, whose tokens the tests of
 * tests/py check against llama.cpp's): the reference. */
static void alone(const char *prompt, int32_t n_predict, float temperature, uint64_t seed, struct outcome *o) {
    pshard_ctx *ctx = open_ctx(1, 16, 0);
    memset(o, 0, sizeof *o);
    pshard_gen_opts opts;
    pshard_gen_opts_default(&opts);
    opts.n_predict = n_predict, opts.sampling.temperature = temperature, opts.sampling.seed = seed, opts.ignore_eos = 1;
    opts.out_tokens = o->tokens, opts.out_tokens_cap = MAX_OUT;
    pshard_gen_stats stats;
    assert_int_equal(pshard_generate(ctx, prompt, &opts, on_text, o, &stats), PSHARD_OK);
    o->n_tokens = stats.n_generated;
    pshard_close(ctx);
}

static void same_tokens(const struct outcome *a, const struct outcome *b) {
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens);
    assert_string_equal(a->text, b->text);
}

/* Greedy and seeded requests of a batch equal their runs alone, two of them joining while the
 * first three decode, in steps that mix prompt chunks (8 tokens a step) with decode tokens. */
static void test_batch_equals_alone(void **state) {
    (void)state;
    enum { N_OUT = 12 };
    struct outcome ref[N_PROMPTS], got[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) alone(PROMPTS[i], N_OUT, i % 2 ? 0.8f : 0.0f, 100 + (uint64_t)i, &ref[i]);
    pshard_ctx *ctx = open_ctx(4, 8, 0);
    memset(got, 0, sizeof got);
    for (int i = 0; i < 3; i++) request(ctx, PROMPTS[i], N_OUT, i % 2 ? 0.8f : 0.0f, 100 + (uint64_t)i, &got[i]);
    int32_t pending;
    int mixed = 0;
    for (int s = 0; s < 16; s++) {
        assert_int_equal(pshard_step(ctx, &pending), PSHARD_OK);
        pshard_batch_info info;
        pshard_get_batch_info(ctx, &info);
        mixed += info.n_active == 3 && info.last_step_tokens > 1;
    }
    assert_true(got[0].n_tokens > 0); /* the first is decoding when the others join */
    for (int i = 3; i < N_PROMPTS; i++) request(ctx, PROMPTS[i], N_OUT, i % 2 ? 0.8f : 0.0f, 100 + (uint64_t)i, &got[i]);
    pshard_batch_info info;
    pshard_get_batch_info(ctx, &info);
    assert_int_equal(info.n_queued, 2); /* one waits for a sequence: four run at once */
    run_to_end(ctx);
    assert_true(mixed > 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        same_tokens(&ref[i], &got[i]);
        assert_int_equal(got[i].finish, PSHARD_FINISH_LENGTH);
        assert_int_equal(got[i].stats.n_generated, N_OUT);
        assert_int_equal(got[i].events_after_end, 0);
        assert_true(got[i].stats.ttft_ms > 0 && got[i].stats.total_ms >= got[i].stats.ttft_ms);
    }
    assert_true(got[4].stats.queued_ms > 0);
    pshard_close(ctx);
}

/* A stop string ends the text before it; the text given out is what came before it. */
static void test_stop_string(void **state) {
    (void)state;
    struct outcome ref, got;
    alone(PROMPTS[1], 40, 0, 1, &ref);
    assert_true(ref.n_text > 12);
    /* a piece of the reply from its middle */
    char stop[8];
    size_t at = ref.n_text / 2;
    while (at + 4 < ref.n_text && memchr(ref.text + at, 0, 4)) at++; /* random weights: any byte */
    memcpy(stop, ref.text + at, 4);
    stop[4] = 0;
    assert_int_equal(strlen(stop), 4);
    const size_t before = (size_t)((const char *)memmem(ref.text, ref.n_text, stop, 4) - ref.text);
    pshard_ctx *ctx = open_ctx(2, 16, 0);
    memset(&got, 0, sizeof got);
    pshard_request req;
    pshard_request_default(&req);
    const char *const stops[] = {"never appears in any reply at all", stop};
    req.prompt = PROMPTS[1], req.n_predict = 40, req.sampling.temperature = 0, req.ignore_eos = 1;
    req.stop = stops, req.n_stop = 2, req.on_event = on_event, req.user = &got;
    assert_int_equal(pshard_request_add(ctx, &req, &got.id), PSHARD_OK);
    run_to_end(ctx);
    assert_int_equal(got.finish, PSHARD_FINISH_STOP);
    assert_int_equal(got.n_text, before);
    assert_memory_equal(got.text, ref.text, before);
    assert_true(got.n_tokens < ref.n_tokens);
    pshard_close(ctx);
}

/* Cancelling a running request and a queued one, and a callback that asks to stop: each hears
 * one last event, and the next request takes the freed sequence. */
static void test_cancel(void **state) {
    (void)state;
    pshard_ctx *ctx = open_ctx(1, 16, 0);
    struct outcome a = {0}, b = {0}, c = {0}, d = {0};
    request(ctx, PROMPTS[0], 30, 0, 1, &a);
    request(ctx, PROMPTS[1], 30, 0, 1, &b);
    for (int s = 0; s < 10; s++) assert_int_equal(pshard_step(ctx, NULL), PSHARD_OK);
    assert_true(a.n_tokens > 0 && b.n_tokens == 0);
    assert_int_equal(pshard_request_cancel(ctx, b.id), PSHARD_OK); /* queued */
    assert_int_equal(b.finish, PSHARD_FINISH_CANCELLED);
    assert_int_equal(pshard_request_cancel(ctx, a.id), PSHARD_OK); /* running */
    assert_int_equal(a.finish, PSHARD_FINISH_CANCELLED);
    assert_int_not_equal(pshard_request_cancel(ctx, a.id), PSHARD_OK); /* ended already */
    assert_int_not_equal(pshard_request_cancel(ctx, 12345), PSHARD_OK);
    c.cancel_after = 3;
    request(ctx, PROMPTS[2], 30, 0, 1, &c);
    request(ctx, PROMPTS[3], 5, 0, 1, &d);
    run_to_end(ctx);
    assert_int_equal(c.finish, PSHARD_FINISH_CANCELLED);
    assert_int_equal(c.n_tokens, 3);
    assert_int_equal(d.finish, PSHARD_FINISH_LENGTH);
    assert_int_equal(d.n_tokens, 5);
    assert_int_equal(a.events_after_end + b.events_after_end + c.events_after_end + d.events_after_end, 0);
    pshard_close(ctx);
}

/* Bad requests fail when added and queue nothing; a full queue says so. */
static void test_bad_requests(void **state) {
    (void)state;
    pshard_ctx *ctx = open_ctx(1, 16, 2);
    struct outcome o = {0};
    pshard_request req;
    pshard_request_default(&req);
    req.on_event = on_event, req.user = &o;
    int32_t id;
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_ERR_INVALID_ARG); /* no prompt */
    req.prompt = "";
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_ERR_INVALID_ARG);
    const int32_t bad[] = {1, -5};
    req.prompt = NULL, req.prompt_tokens = bad, req.n_prompt_tokens = 2;
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_ERR_INVALID_ARG);
    char *longer = malloc(8192);
    for (int i = 0; i < 8191; i++) longer[i] = i % 5 ? 'a' + i % 23 : ' ';
    longer[8191] = 0;
    req.prompt = longer;
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_ERR_RANGE);
    free(longer);
    const char *const empty_stop[] = {""};
    req.prompt = PROMPTS[0], req.stop = empty_stop, req.n_stop = 1;
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_ERR_INVALID_ARG);
    req.stop = NULL, req.n_stop = 0, req.top_logprobs = 21;
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_ERR_RANGE);
    req.top_logprobs = -1;
    pshard_batch_info info;
    pshard_get_batch_info(ctx, &info);
    assert_int_equal(info.n_queued + info.n_active, 0);
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_OK);
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_OK);
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_ERR_BUSY); /* two wait already */
    /* the one-sequence call refuses while requests run */
    pshard_gen_opts opts;
    pshard_gen_opts_default(&opts);
    assert_int_equal(pshard_generate(ctx, "Hello", &opts, NULL, NULL, NULL), PSHARD_ERR_INVALID_ARG);
    pshard_close(ctx); /* frees what still waits */
}

/* A request whose prompt starts with the cells a finished one left reuses them, and gives the
 * tokens it gives alone. */
static void test_prefix_reuse(void **state) {
    (void)state;
    char longer[512];
    snprintf(longer, sizeof longer, "%s Then it ran home.", PROMPTS[0]);
    struct outcome ref, first = {0}, second = {0};
    alone(longer, 10, 0, 1, &ref);
    pshard_ctx *ctx = open_ctx(2, 16, 0);
    request(ctx, PROMPTS[0], 4, 0, 1, &first);
    run_to_end(ctx);
    request(ctx, longer, 10, 0, 1, &second);
    run_to_end(ctx);
    assert_true(second.stats.n_prompt_cached >= first.stats.n_prompt - 1);
    same_tokens(&ref, &second);
    pshard_close(ctx);
}

/* One pool of cells for every sequence: eight short requests run at once in a pool that holds
 * two long ones, which then run at once too; a request the pool cannot hold yet waits. */
static void test_pool_short_and_long(void **state) {
    (void)state;
    enum { SHORT_OUT = 16, LONG_OUT = 40, BLOCK = 64 };
    char longer[3][2048];
    for (int i = 0; i < 3; i++) {
        longer[i][0] = 0;
        for (int k = 0; k < 9; k++) strcat(longer[i], PROMPTS[(i + k) % N_PROMPTS]), strcat(longer[i], " ");
    }
    /* a pool of the blocks two long requests take to their end, and one block more */
    pshard_ctx *probe = open_ctx(1, 16, 0);
    int32_t blocks = 0, most_short = 0;
    for (int i = 0; i < 3; i++) {
        int32_t *ids, n;
        assert_int_equal(pshard_tokenize(probe, longer[i], 1, &ids, &n), PSHARD_OK);
        free(ids);
        blocks = (n + LONG_OUT + BLOCK - 1) / BLOCK > blocks ? (n + LONG_OUT + BLOCK - 1) / BLOCK : blocks;
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        int32_t *ids, n;
        assert_int_equal(pshard_tokenize(probe, PROMPTS[i], 1, &ids, &n), PSHARD_OK);
        free(ids);
        most_short = (n + SHORT_OUT + BLOCK - 1) / BLOCK > most_short ? (n + SHORT_OUT + BLOCK - 1) / BLOCK : most_short;
    }
    pshard_close(probe);
    const int32_t pool = (2 * blocks + 1) * BLOCK;
    assert_true(8 * most_short * BLOCK <= pool); /* eight short ones fit it at once */
    pshard_ctx *ctx = open_pool(8, 64, 0, pool);
    pshard_batch_info info;
    pshard_get_batch_info(ctx, &info);
    assert_int_equal(info.n_cells, pool);
    struct outcome shorts[8], longs[3];
    memset(shorts, 0, sizeof shorts), memset(longs, 0, sizeof longs);
    for (int i = 0; i < 8; i++) request(ctx, PROMPTS[i % N_PROMPTS], SHORT_OUT, 0, 1, &shorts[i]);
    int most = 0;
    for (int32_t pending = 1; pending;) {
        assert_int_equal(pshard_step(ctx, &pending), PSHARD_OK);
        pshard_get_batch_info(ctx, &info);
        most = info.n_active > most ? info.n_active : most;
    }
    assert_int_equal(most, 8);
    /* two long ones fit at once; the third waits for one of them */
    for (int i = 0; i < 3; i++) request(ctx, longer[i], LONG_OUT, 0, 1, &longs[i]);
    most = 0;
    for (int32_t pending = 1; pending;) {
        assert_int_equal(pshard_step(ctx, &pending), PSHARD_OK);
        pshard_get_batch_info(ctx, &info);
        most = info.n_active > most ? info.n_active : most;
        assert_true(info.n_cells_free >= 0 && info.n_cells_free <= pool);
    }
    assert_int_equal(most, 2);
    for (int i = 0; i < 3; i++) {
        struct outcome ref;
        alone(longer[i], LONG_OUT, 0, 1, &ref);
        same_tokens(&ref, &longs[i]);
    }
    pshard_close(ctx);
}

/* A request that starts like a running one (a system prompt) shares that one's blocks instead of
 * computing them, and gives the tokens it gives alone; the first one's tokens are untouched. */
static void test_shared_prefix(void **state) {
    (void)state;
    char a[1024], b[1024];
    char common[768] = "";
    for (int k = 0; k < 8; k++) strcat(common, PROMPTS[k % N_PROMPTS]), strcat(common, " ");
    snprintf(a, sizeof a, "%sQuestion one: what is red?", common);
    snprintf(b, sizeof b, "%sQuestion two: why is grass green?", common);
    struct outcome ref_a, ref_b, got_a = {0}, got_b = {0};
    alone(a, 20, 0, 1, &ref_a);
    alone(b, 20, 0, 1, &ref_b);
    pshard_ctx *ctx = open_ctx(2, 16, 0);
    request(ctx, a, 20, 0, 1, &got_a);
    while (got_a.n_tokens == 0) assert_int_equal(pshard_step(ctx, NULL), PSHARD_OK);
    request(ctx, b, 20, 0, 1, &got_b);
    run_to_end(ctx);
    assert_true(got_b.stats.n_prompt_cached >= 64); /* whole blocks of the common part */
    assert_true(got_b.stats.n_prompt_cached < got_b.stats.n_prompt);
    same_tokens(&ref_a, &got_a);
    same_tokens(&ref_b, &got_b);
    pshard_close(ctx);
}

/* A token limit of 0 reads the prompt and samples nothing, in both calls. */
static void test_no_tokens(void **state) {
    (void)state;
    pshard_ctx *ctx = open_ctx(2, 16, 0);
    struct outcome o = {0};
    request(ctx, PROMPTS[0], 0, 0, 1, &o);
    run_to_end(ctx);
    assert_int_equal(o.finish, PSHARD_FINISH_LENGTH);
    assert_int_equal(o.n_tokens, 0);
    assert_int_equal(o.n_text, 0);
    assert_int_equal(o.stats.n_generated, 0);
    pshard_gen_opts opts;
    pshard_gen_opts_default(&opts);
    opts.n_predict = 0;
    pshard_gen_stats stats;
    struct outcome heard = {0};
    assert_int_equal(pshard_generate(ctx, PROMPTS[1], &opts, on_text, &heard, &stats), PSHARD_OK);
    assert_int_equal(stats.n_generated, 0);
    assert_int_equal(heard.n_text, 0);
    assert_true(stats.n_prompt > 0);
    pshard_close(ctx);
}

/* pshard_eval: every position's logits, in any steps; the last position's argmax is the first
 * greedy token; bad steps are refused. */
struct argmaxes {
    int32_t best[64], n;
};

static int keep_argmax(void *user, int32_t position, const float *logits, int32_t n_vocab) {
    struct argmaxes *a = user;
    assert_int_equal(position, a->n);
    int32_t best = 0;
    for (int32_t j = 1; j < n_vocab; j++) best = logits[j] > logits[best] ? j : best;
    a->best[a->n++] = best;
    return 0;
}

static void test_eval(void **state) {
    (void)state;
    pshard_ctx *ctx = open_ctx(1, 16, 0);
    int32_t *ids, n;
    assert_int_equal(pshard_tokenize(ctx, PROMPTS[0], 1, &ids, &n), PSHARD_OK);
    assert_true(n > 4 && n <= 64);
    struct argmaxes whole = {0}, stepped = {0};
    assert_int_equal(pshard_eval(ctx, ids, n, NULL, 0, keep_argmax, &whole), PSHARD_OK);
    const int32_t steps[] = {3, 1};
    assert_int_equal(pshard_eval(ctx, ids, n, steps, 2, keep_argmax, &stepped), PSHARD_OK);
    assert_int_equal(whole.n, n);
    assert_memory_equal(whole.best, stepped.best, sizeof(int32_t) * (size_t)n);
    const int32_t bad[] = {0};
    assert_int_equal(pshard_eval(ctx, ids, n, bad, 1, keep_argmax, &stepped), PSHARD_ERR_INVALID_ARG);
    struct outcome ref;
    alone(PROMPTS[0], 1, 0, 1, &ref);
    assert_int_equal(ref.tokens[0], whole.best[n - 1]);
    free(ids);
    pshard_close(ctx);
}

/* Log-probabilities: the greedy token is the most likely, its log-probability the top one's. */
static int on_logprob(void *user, const pshard_token_event *ev) {
    int *checked = user;
    if (ev->token < 0) return 0;
    assert_true(ev->n_top == 3 && ev->logprob <= 0);
    assert_int_equal(ev->top_tokens[0], ev->token);
    assert_true(ev->top_logprobs[0] == ev->logprob);
    assert_true(ev->top_logprobs[0] >= ev->top_logprobs[1] && ev->top_logprobs[1] >= ev->top_logprobs[2]);
    (*checked)++;
    return 0;
}

static void test_logprobs(void **state) {
    (void)state;
    pshard_ctx *ctx = open_ctx(1, 16, 0);
    int checked = 0;
    pshard_request req;
    pshard_request_default(&req);
    req.prompt = PROMPTS[3], req.n_predict = 5, req.sampling.temperature = 0, req.ignore_eos = 1;
    req.sampling.repeat_penalty = 1, req.top_logprobs = 3, req.on_event = on_logprob, req.user = &checked;
    int32_t id;
    assert_int_equal(pshard_request_add(ctx, &req, &id), PSHARD_OK);
    run_to_end(ctx);
    assert_int_equal(checked, 5);
    pshard_close(ctx);
}

int main(void) {
    const char *build = getenv("PSHARD_BUILD_DIR");
    snprintf(model_path, sizeof model_path, "/tmp/pshard-test-batch-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape tiny-moe --seed 7 --context 4096 --quiet -o '%s'", build ? build : ".",
             model_path);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot make the tiny model with gguf-synth (PSHARD_BUILD_DIR)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_alone), cmocka_unit_test(test_stop_string), cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_bad_requests),       cmocka_unit_test(test_prefix_reuse), cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_pool_short_and_long), cmocka_unit_test(test_shared_prefix), cmocka_unit_test(test_no_tokens), cmocka_unit_test(test_eval),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(model_path);
    return failed;
}
