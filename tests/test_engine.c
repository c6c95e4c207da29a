/* Sampling and chat formatting. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sampler.h"
#include "tok/chat.h"

enum { N_VOCAB = 1000 };

static void fill_logits(float *l, uint32_t seed) {
    for (int i = 0; i < N_VOCAB; i++) {
        seed = seed * 1664525u + 1013904223u;
        l[i] = (float)((seed >> 8) & 0xffff) / 8192.0f;
    }
}

static int argmax(const float *l) {
    int best = 0;
    for (int i = 1; i < N_VOCAB; i++) best = l[i] > l[best] ? i : best;
    return best;
}

static void test_greedy_is_argmax(void **state) {
    (void)state;
    struct sampler_params p;
    sampler_default_params(&p);
    p.temperature = 0;
    struct sampler *s;
    assert_int_equal(sampler_create(&p, N_VOCAB, &s), PSHARD_OK);
    float l[N_VOCAB];
    for (uint32_t seed = 1; seed < 20; seed++) {
        fill_logits(l, seed);
        assert_int_equal(sampler_sample(s, l), argmax(l));
    }
    sampler_free(s);
}

/* Greedy picks what a scan keeping the first strictly greater logit picks: the first of equal
 * maxima, in any position (the tail past a multiple of eight too), never a NaN, and the first
 * logit where nothing beats it (all NaN). */
static void test_greedy_ties_and_nans(void **state) {
    (void)state;
    struct sampler_params p;
    sampler_default_params(&p);
    p.temperature = 0;
    enum { N = 1003 };
    struct sampler *s;
    assert_int_equal(sampler_create(&p, N, &s), PSHARD_OK);
    float l[N];
    for (int i = 0; i < N; i++) l[i] = -1.0f - (float)(i % 7);
    const int at[] = {0, 5, 7, 8, 500, 999, 1000, 1002};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        float t[N];
        memcpy(t, l, sizeof t);
        t[at[k]] = 3.0f;
        if (at[k] + 9 < N) t[at[k] + 9] = 3.0f; /* a later equal one loses */
        assert_int_equal(sampler_sample(s, t), at[k]);
        t[at[k] == 1 ? 2 : 1] = NAN; /* a NaN elsewhere (not first) never wins */
        assert_int_equal(sampler_sample(s, t), at[k]);
    }
    for (int i = 0; i < N; i++) l[i] = NAN;
    assert_int_equal(sampler_sample(s, l), 0);
    l[0] = -INFINITY, l[N - 1] = -INFINITY; /* NaN at 0 only where nothing beats it */
    assert_int_equal(sampler_sample(s, l), 0);
    l[0] = NAN, l[700] = 0.0f;
    assert_int_equal(sampler_sample(s, l), 0); /* nothing beats a NaN first logit in such a scan */
    for (int i = 0; i < N; i++) l[i] = 0.0f;
    l[3] = -0.0f;
    assert_int_equal(sampler_sample(s, l), 0); /* +0 and -0 are equal: the first */
    sampler_free(s);
}

static void test_same_seed_same_tokens(void **state) {
    (void)state;
    struct sampler_params p;
    sampler_default_params(&p);
    p.temperature = 1.5f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    int32_t a[64], b[64], c[64];
    float l[N_VOCAB];
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 99 : 42;
        struct sampler *s;
        assert_int_equal(sampler_create(&p, N_VOCAB, &s), PSHARD_OK);
        for (int i = 0; i < 64; i++) {
            fill_logits(l, (uint32_t)i);
            for (int j = 0; j < N_VOCAB; j++) l[j] *= 0.02f; /* flat: many candidates */
            (run == 0 ? a : run == 1 ? b : c)[i] = sampler_sample(s, l);
        }
        sampler_free(s);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
}

static void test_filters(void **state) {
    (void)state;
    struct sampler_params p;
    sampler_default_params(&p);
    p.temperature = 1.0f;
    float l[N_VOCAB];
    fill_logits(l, 5);
    /* top-k 1 and a tiny top-p always give the argmax, whatever the draw */
    for (int mode = 0; mode < 3; mode++) {
        sampler_default_params(&p);
        p.temperature = 2.0f;
        p.top_k = mode == 0 ? 1 : 0;
        p.top_p = mode == 1 ? 1e-6f : 1.0f;
        p.min_p = mode == 2 ? 0.999f : 0.0f;
        struct sampler *s;
        assert_int_equal(sampler_create(&p, N_VOCAB, &s), PSHARD_OK);
        for (int i = 0; i < 20; i++) assert_int_equal(sampler_sample(s, l), argmax(l));
        sampler_free(s);
    }
    /* top-k 5: only the five best ever come out */
    sampler_default_params(&p);
    p.temperature = 100.0f;
    p.top_k = 5;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    struct sampler *s;
    assert_int_equal(sampler_create(&p, N_VOCAB, &s), PSHARD_OK);
    int best = argmax(l);
    for (int i = 0; i < 200; i++) {
        int t = sampler_sample(s, l);
        int better = 0;
        for (int j = 0; j < N_VOCAB; j++) better += l[j] > l[t];
        assert_true(better < 5);
    }
    sampler_free(s);
    (void)best;
}

struct ranked {
    int32_t id;
    float logit;
};

static int ranked_desc(const void *a, const void *b) {
    const struct ranked *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Top-k picks the k best without sorting the whole vocabulary: over qwen3's 151,936 tokens, with
 * logits on a coarse grid (ties everywhere, broken by id), sampling with top-k gives the same
 * tokens as sampling the whole sorted vocabulary with every token outside those k pushed to
 * -1e30 (so only they can come out), for the same seed, at every k tried. */
static void test_top_k_selects_as_a_full_sort(void **state) {
    (void)state;
    enum { V = 151936, DRAWS = 40 };
    float *l = malloc(sizeof *l * V), *only = malloc(sizeof *only * V);
    struct ranked *r = malloc(sizeof *r * V);
    assert_true(l && only && r);
    const int ks[] = {1, 2, 40, 333};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        uint32_t seed = 77u + (uint32_t)ki;
        for (int i = 0; i < V; i++) {
            seed = seed * 1664525u + 1013904223u;
            l[i] = (float)((seed >> 20) & 63) / 8.0f; /* 64 values: ties at the top too */
            r[i] = (struct ranked){i, l[i]};
        }
        qsort(r, V, sizeof *r, ranked_desc);
        for (int i = 0; i < V; i++) only[i] = -1e30f;
        for (int i = 0; i < ks[ki]; i++) only[r[i].id] = l[r[i].id];
        struct sampler_params p;
        sampler_default_params(&p);
        p.temperature = 3.0f, p.top_p = 1.0f, p.min_p = 0.0f, p.top_k = ks[ki];
        struct sampler *fast, *full;
        assert_int_equal(sampler_create(&p, V, &fast), PSHARD_OK);
        p.top_k = 0;
        assert_int_equal(sampler_create(&p, V, &full), PSHARD_OK);
        int distinct = 0, last = -1;
        for (int d = 0; d < DRAWS; d++) {
            const int32_t a = sampler_sample(fast, l), b = sampler_sample(full, only);
            assert_int_equal(a, b);
            assert_true(only[a] > -1e30f); /* one of the k best */
            distinct += a != last, last = a;
        }
        if (ks[ki] > 1) assert_true(distinct > 1); /* the draws do vary */
        sampler_free(fast);
        sampler_free(full);
    }
    free(l), free(only), free(r);
}

static void test_penalties(void **state) {
    (void)state;
    struct sampler_params p;
    sampler_default_params(&p);
    p.temperature = 0;
    p.repeat_penalty = 1e3f;
    struct sampler *s;
    assert_int_equal(sampler_create(&p, N_VOCAB, &s), PSHARD_OK);
    float l[N_VOCAB];
    fill_logits(l, 9);
    const int first = argmax(l);
    sampler_accept(s, first);
    assert_int_not_equal(sampler_sample(s, l), first); /* penalized away */
    sampler_reset(s);
    assert_int_equal(sampler_sample(s, l), first);
    sampler_free(s);
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 1e6f;
    assert_int_equal(sampler_create(&p, N_VOCAB, &s), PSHARD_OK);
    sampler_accept(s, first);
    assert_int_not_equal(sampler_sample(s, l), first);
    sampler_free(s);
    p.top_p = 0.0f; /* invalid */
    assert_int_equal(sampler_create(&p, N_VOCAB, &s), PSHARD_ERR_INVALID_ARG);
}

static void test_chat_formats(void **state) {
    (void)state;
    const char *smol = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}"
                       "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}";
    struct chat_template t;
    chat_template_detect(smol, strlen(smol), &t);
    assert_int_equal(t.format, CHAT_CHATML);
    assert_string_equal(t.default_system, "You are SmolLM");
    t.use_default_system = 1;
    struct chat_message msgs[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
    char out[512];
    size_t n;
    assert_int_equal(chat_format_messages(&t, msgs, 1, 1, out, sizeof out, &n), PSHARD_OK);
    assert_string_equal(out, "<|im_start|>system\nYou are SmolLM<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    assert_int_equal(n, strlen(out));
    struct chat_message with_system[] = {{"system", "Be brief."}, {"user", "Hi"}};
    assert_int_equal(chat_format_messages(&t, with_system, 2, 0, out, sizeof out, &n), PSHARD_OK);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    assert_int_equal(chat_format_messages(&t, msgs, 3, 1, out, 10, &n), PSHARD_ERR_RANGE);
    assert_true(n > 10);

    const char *llama3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}";
    chat_template_detect(llama3, strlen(llama3), &t);
    assert_int_equal(t.format, CHAT_LLAMA3);
    assert_int_equal(chat_format_messages(&t, msgs, 2, 1, out, sizeof out, &n), PSHARD_OK);
    assert_string_equal(out, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
                             "<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");

    const char *mistral = "{{ '[INST] ' + message['content'] + ' [/INST]' }}";
    chat_template_detect(mistral, strlen(mistral), &t);
    assert_int_equal(t.format, CHAT_MISTRAL);
    assert_int_equal(chat_format_messages(&t, msgs, 3, 1, out, sizeof out, &n), PSHARD_OK);
    assert_string_equal(out, "[INST] Hi [/INST] Hello!</s>[INST] Bye [/INST]");

    chat_template_detect(NULL, 0, &t);
    assert_int_equal(t.format, CHAT_NONE);
    struct chat_message bad[] = {{"user", NULL}};
    assert_int_equal(chat_format_messages(&t, bad, 1, 1, out, sizeof out, &n), PSHARD_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_is_argmax), cmocka_unit_test(test_greedy_ties_and_nans), cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_filters), cmocka_unit_test(test_top_k_selects_as_a_full_sort),          cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_chat_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
