/* The executor on the default model: batches mixing sequences give each sequence the logits it
 * gets alone; bad batches are refused without changing any state; sequences are reused; an FFN
 * computed in two row ranges (as when split with the GPU) adds up to the whole; a decode token
 * over a long cache, attending in runs of cells, gets what a tile gives it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu/attention.h"
#include "exec/exec.h"
#include "exec/exec_internal.h"
#include "measure/measure_internal.h"
#include "plan/plan.h"

struct fixture {
    struct gguf_file *file;
    struct model model;
    struct exec_ctx *ctx;
};

static int setup(void **state) {
    static struct fixture f;
    const char *path = getenv("PSHARD_DEFAULT_MODEL");
    if (!path || gguf_open(path, &f.file) != PSHARD_OK) {
        fprintf(stderr, "PSHARD_DEFAULT_MODEL must name the default model (%s)\n", pshard_last_error());
        return -1;
    }
    if (model_load(f.file, &f.model) != PSHARD_OK) return -1;
    struct exec_params p = {.n_ctx = 64, .n_batch = 16, .n_seq = 3, .n_threads = 2, .plan = PLAN_CPU, .staging = -1,
                            .decode_set = PLAN_DECODE_WEIGHED};
    if (exec_create(&f.model, &p, &f.ctx) != PSHARD_OK) return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    if (!f) return 0; /* setup failed and said why */
    exec_free(f->ctx);
    model_free(&f->model);
    gguf_close(f->file);
    return 0;
}

static const int32_t seq_a[] = {1, 504, 3458, 282, 4649, 314};
static const int32_t seq_b[] = {1, 2000, 300, 12, 5000};

/* Run a whole sequence alone in slot `slot`; copy the logits of its last token. */
static void run_alone(struct exec_ctx *ctx, int32_t slot, const int32_t *tokens, int32_t n, float *out) {
    int32_t pos[16], seq[16];
    for (int32_t i = 0; i < n; i++) pos[i] = i, seq[i] = slot;
    exec_truncate_seq(ctx, slot, 0);
    struct exec_batch b = {n, tokens, pos, seq, NULL};
    assert_int_equal(exec_step(ctx, &b), PSHARD_OK);
    memcpy(out, exec_logits(ctx, 0), sizeof(float) * (size_t)exec_n_vocab(ctx));
}

static void test_mixed_batch_equals_separate(void **state) {
    struct fixture *f = *state;
    const int32_t n_vocab = exec_n_vocab(f->ctx);
    float *alone_a = malloc(sizeof(float) * n_vocab), *alone_b = malloc(sizeof(float) * n_vocab);
    run_alone(f->ctx, 0, seq_a, 6, alone_a);
    run_alone(f->ctx, 1, seq_b, 5, alone_b);
    /* Prefix of both alone, then the rest interleaved in one batch. */
    exec_truncate_seq(f->ctx, 0, 3);
    exec_truncate_seq(f->ctx, 1, 2);
    const int32_t tokens[] = {seq_a[3], seq_b[2], seq_a[4], seq_b[3], seq_a[5], seq_b[4]};
    const int32_t pos[] = {3, 2, 4, 3, 5, 4}, seq[] = {0, 1, 0, 1, 0, 1};
    const int8_t want[] = {0, 0, 0, 0, 1, 1};
    struct exec_batch b = {6, tokens, pos, seq, want};
    assert_int_equal(exec_step(f->ctx, &b), PSHARD_OK);
    assert_int_equal(exec_last_stats(f->ctx)->n_outputs, 2);
    const float *la = exec_logits(f->ctx, 0), *lb = exec_logits(f->ctx, 1);
    double max_a = 0, max_b = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        max_a = fmax(max_a, fabs(la[i] - alone_a[i]));
        max_b = fmax(max_b, fabs(lb[i] - alone_b[i]));
    }
    /* Same arithmetic per token whatever the batch: identical up to float rounding. */
    assert_true(max_a < 1e-3);
    assert_true(max_b < 1e-3);
    assert_int_equal(exec_seq_len(f->ctx, 0), 6);
    assert_int_equal(exec_seq_len(f->ctx, 1), 5);
    free(alone_a);
    free(alone_b);
}

/* A step that asks for every token's logits (more rows than the context's n_seq, so its logits
 * buffer grows) gives each position what the prefix ending there gives alone; a one-output step
 * after it reads its own logits from the grown buffer. */
static void test_every_token_logits(void **state) {
    struct fixture *f = *state;
    const int32_t n_vocab = exec_n_vocab(f->ctx), n = 6;
    float *alone = malloc(sizeof(float) * (size_t)n_vocab * n);
    for (int32_t i = 0; i < n; i++) run_alone(f->ctx, 0, seq_a, i + 1, alone + (size_t)i * n_vocab);
    int32_t pos[6], seq[6];
    const int8_t every[6] = {1, 1, 1, 1, 1, 1};
    for (int32_t i = 0; i < n; i++) pos[i] = i, seq[i] = 0;
    exec_truncate_seq(f->ctx, 0, 0);
    struct exec_batch b = {n, seq_a, pos, seq, every};
    assert_int_equal(exec_step(f->ctx, &b), PSHARD_OK);
    assert_int_equal(exec_last_stats(f->ctx)->n_outputs, n);
    for (int32_t i = 0; i < n; i++) {
        const float *l = exec_logits(f->ctx, i);
        double worst = 0;
        for (int32_t v = 0; v < n_vocab; v++) worst = fmax(worst, fabs(l[v] - alone[(size_t)i * n_vocab + v]));
        assert_true(worst < 1e-3);
    }
    assert_null(exec_logits(f->ctx, n));
    float *again = malloc(sizeof(float) * (size_t)n_vocab);
    run_alone(f->ctx, 0, seq_a, 4, again);
    assert_int_equal(exec_last_stats(f->ctx)->n_outputs, 1);
    assert_null(exec_logits(f->ctx, 1));
    double worst = 0;
    for (int32_t v = 0; v < n_vocab; v++) worst = fmax(worst, fabs(again[v] - alone[(size_t)3 * n_vocab + v]));
    assert_true(worst < 1e-3);
    free(again);
    free(alone);
}

/* A decode token over a long cache attends in runs of cells, merged after (cpu_attention_units):
 * its logits are those it gets in a step of two tokens of its sequence, whose attention reads the
 * cache whole (a tile), within rounding; and two sequences' tokens in one decode step each get
 * what they get alone. */
static void test_long_cache_decode_in_runs(void **state) {
    struct fixture *f = *state;
    struct exec_params p = *exec_get_params(f->ctx);
    p.n_ctx = 2048, p.n_batch = 64, p.n_seq = 2;
    struct exec_ctx *ctx;
    assert_int_equal(exec_create(&f->model, &p, &ctx), PSHARD_OK);
    const struct model_hparams *hp = &f->model.hp;
    const struct cpu_attn_shape shape = {(int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v, 1};
    struct cpu_attn_units u;
    const int32_t past = 1100; /* cells in zeros, then 64 computed */
    cpu_attention_units(&shape, 1, past + 65, false, 2, &u);
    assert_true(u.splits > 1);
    const int32_t n_vocab = exec_n_vocab(ctx);
    float *one[2];
    int32_t tokens[64], pos[64], seq[64];
    for (int32_t s = 0; s < 2; s++) /* (filling zeroes the whole cache: both first) */
        assert_int_equal(exec_fill_seq(ctx, s, past), PSHARD_OK);
    for (int32_t s = 0; s < 2; s++) {
        one[s] = malloc(sizeof(float) * n_vocab);
        for (int i = 0; i < 64; i++) tokens[i] = 100 + 37 * i + 500 * s, pos[i] = past + i, seq[i] = s;
        struct exec_batch prompt = {64, tokens, pos, seq, NULL};
        assert_int_equal(exec_step(ctx, &prompt), PSHARD_OK);
    }
    /* Each sequence's next token alone (runs), then both in one step (runs, two sequences). */
    for (int32_t s = 0; s < 2; s++) {
        const int32_t t = 7 + s, at = past + 64;
        struct exec_batch next = {1, &t, &at, &s, NULL};
        assert_int_equal(exec_step(ctx, &next), PSHARD_OK);
        memcpy(one[s], exec_logits(ctx, 0), sizeof(float) * n_vocab);
        exec_truncate_seq(ctx, s, past + 64);
    }
    const int32_t both_t[2] = {7, 8}, both_pos[2] = {past + 64, past + 64}, both_seq[2] = {0, 1};
    const int8_t want[2] = {1, 1};
    struct exec_batch both = {2, both_t, both_pos, both_seq, want};
    assert_int_equal(exec_step(ctx, &both), PSHARD_OK);
    for (int32_t s = 0; s < 2; s++) {
        const float *l = exec_logits(ctx, s);
        for (int32_t i = 0; i < n_vocab; i++) assert_true(fabsf(l[i] - one[s][i]) < 1e-3f);
    }
    /* Sequence 0's last prompt token and the next in one step: a tile, no runs. */
    exec_truncate_seq(ctx, 0, past + 63);
    const int32_t pair_t[2] = {100 + 37 * 63, 7}, pair_pos[2] = {past + 63, past + 64}, pair_seq[2] = {0, 0};
    const int8_t last[2] = {0, 1};
    struct exec_batch pair = {2, pair_t, pair_pos, pair_seq, last};
    assert_int_equal(exec_step(ctx, &pair), PSHARD_OK);
    const float *l = exec_logits(ctx, 0);
    double worst = 0;
    for (int32_t i = 0; i < n_vocab; i++) worst = fmax(worst, fabs(l[i] - one[0][i]));
    assert_true(worst < 1e-3);
    free(one[0]), free(one[1]);
    exec_free(ctx);
}

static void test_bad_batches_change_nothing(void **state) {
    struct fixture *f = *state;
    exec_truncate_seq(f->ctx, 2, 0);
    const int32_t one = 1, zero = 0, two = 2, bad_token = 1 << 30, bad_slot = 7, far = 5;
    struct exec_batch bad[] = {
        {1, &bad_token, &zero, &two, NULL}, /* token outside the vocabulary */
        {1, &one, &zero, &bad_slot, NULL},  /* no such sequence slot */
        {1, &one, &far, &two, NULL},        /* a gap in the positions */
        {0, &one, &zero, &two, NULL},       /* empty */
        {17, &one, &zero, &two, NULL},      /* larger than the batch */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_not_equal(exec_step(f->ctx, &bad[i]), PSHARD_OK);
        assert_int_equal(exec_seq_len(f->ctx, 2), 0);
    }
    const struct exec_batch fine = {1, &one, &zero, &two, NULL};
    const float row[1] = {0};
    const struct exec_media bad_media[] = {
        {&zero, NULL, 0, 0}, /* rope positions: not a multimodal-rope model */
        {NULL, row, 0, 2},   /* embeddings past the step */
        {NULL, row, -1, 1},  /* ... before it */
    };
    for (size_t i = 0; i < sizeof bad_media / sizeof bad_media[0]; i++) {
        assert_int_equal(exec_step_media(f->ctx, &fine, &bad_media[i]), PSHARD_ERR_INVALID_ARG);
        assert_int_equal(exec_seq_len(f->ctx, 2), 0);
    }
    /* A full context is refused with a clear message. */
    int32_t tokens[16], pos[16], seq[16];
    for (int32_t start = 0; start < 64; start += 16) {
        for (int i = 0; i < 16; i++) tokens[i] = 100 + i, pos[i] = start + i, seq[i] = 2;
        struct exec_batch b = {16, tokens, pos, seq, NULL};
        assert_int_equal(exec_step(f->ctx, &b), PSHARD_OK);
    }
    const int32_t p64 = 64;
    struct exec_batch full = {1, &one, &p64, &two, NULL};
    assert_int_equal(exec_step(f->ctx, &full), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "context full"));
    assert_int_equal(exec_seq_len(f->ctx, 2), 64);
}

/* Input embeddings in place of tokens' rows (an image's tokens): the token embedding's own rows
 * given as embeddings give the same logits to the bit; other rows give other logits. */
static void test_input_embeddings(void **state) {
    struct fixture *f = *state;
    const int32_t n_vocab = exec_n_vocab(f->ctx), d = (int32_t)f->model.hp.n_embd;
    float *want = malloc(sizeof(float) * n_vocab), *rows = malloc(sizeof(float) * 3 * d);
    run_alone(f->ctx, 0, seq_a, 6, want);
    for (int i = 0; i < 3; i++) cpu_get_row(&f->ctx->token_embd, seq_a[2 + i], rows + (int64_t)i * d);
    int32_t pos[6], seq[6];
    for (int32_t i = 0; i < 6; i++) pos[i] = i, seq[i] = 0;
    const int32_t placeholders[6] = {seq_a[0], seq_a[1], 0, 0, 0, seq_a[5]}; /* ids not looked up */
    exec_truncate_seq(f->ctx, 0, 0);
    const struct exec_batch b = {6, placeholders, pos, seq, NULL};
    const struct exec_media media = {NULL, rows, 2, 3};
    assert_int_equal(exec_step_media(f->ctx, &b, &media), PSHARD_OK);
    assert_memory_equal(exec_logits(f->ctx, 0), want, sizeof(float) * (size_t)n_vocab);
    for (int64_t i = 0; i < 3 * (int64_t)d; i++) rows[i] *= -1.0f;
    exec_truncate_seq(f->ctx, 0, 0);
    assert_int_equal(exec_step_media(f->ctx, &b, &media), PSHARD_OK);
    double diff = 0;
    for (int32_t i = 0; i < n_vocab; i++) diff = fmax(diff, fabs(exec_logits(f->ctx, 0)[i] - want[i]));
    assert_true(diff > 0.1);
    free(want);
    free(rows);
}

/* shard_ffn_cpu_rows over [0, n_ff) equals its parts over [0, f) and [f, n_ff), every layer
 * checked at two split points, on two tokens. */
static void test_ffn_rows_add_up(void **state) {
    struct fixture *f = *state;
    struct exec_ctx *ctx = f->ctx;
    const int64_t d = f->model.hp.n_embd, n = 2;
    const uint32_t ff = f->model.hp.n_ff;
    assert_int_equal(ff % PLAN_SPLIT_ROWS, 0);
    assert_true(ff >= 2 * PLAN_SPLIT_ROWS);
    float *whole = malloc(sizeof(float) * n * d), *a = malloc(sizeof(float) * n * d), *b = malloc(sizeof(float) * n * d);
    assert_true(whole && a && b);
    for (uint32_t layer = 0; layer < f->model.hp.n_layers; layer++) {
        const uint32_t cuts[] = {PLAN_SPLIT_ROWS, ff - PLAN_SPLIT_ROWS};
        for (int c = 0; c < 2; c++) {
            for (int64_t i = 0; i < n * d; i++) ctx->s.xn[i] = (float)((i * 37 + layer * 11) % 101 - 50) / 25.0f;
            shard_ffn_cpu_rows(ctx, (int)layer, n, 0, ff, whole);
            shard_ffn_cpu_rows(ctx, (int)layer, n, 0, cuts[c], a);
            shard_ffn_cpu_rows(ctx, (int)layer, n, cuts[c], ff, b);
            double err = 0, norm = 0;
            for (int64_t i = 0; i < n * d; i++) {
                err = fmax(err, fabs(whole[i] - (a[i] + b[i])));
                norm = fmax(norm, fabs(whole[i]));
            }
            assert_true(norm > 0);
            assert_true(err <= 1e-4 * norm + 1e-6); /* only the sum's order differs */
            assert_true(fabs(a[0]) > 0 && fabs(b[0]) > 0);
        }
    }
    free(whole), free(a), free(b);
}

/* Profiling sees other work on the cores: a child process spinning on every core for 0.6 s takes
 * most of the machine's CPU time, none of it this process's own; this process spinning itself
 * is not other work. */
static void test_others_share(void **state) {
    (void)state;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    struct measure_cpu_clock from;
    if (!measure_cpu_clock(&from)) skip(); /* no /proc/stat: profiling does without */
    const double spin_until = from.wall_s + 0.6;
    pid_t kids[64];
    int n_kids = 0;
    for (long i = 0; i < cores && n_kids < 64; i++) {
        const pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            struct measure_cpu_clock now;
            do measure_cpu_clock(&now);
            while (now.wall_s < spin_until);
            _exit(0);
        }
        kids[n_kids++] = pid;
    }
    for (int i = 0; i < n_kids; i++) waitpid(kids[i], NULL, 0);
    const double busy = measure_others_share(&from);
    assert_true(busy > 0.5 && busy <= 1.05);
    /* Its own spinning: not counted. */
    struct measure_cpu_clock mine, now;
    assert_true(measure_cpu_clock(&mine));
    do measure_cpu_clock(&now);
    while (now.wall_s < mine.wall_s + 0.3);
    const double own = measure_others_share(&mine);
    assert_true(own >= 0 && own < busy);
}

/* The model's weights_skew is how far past 256 bytes its first matrix after the embedding starts
 * in the mapping, a multiple of the file's alignment; the profile's off-alignment reads are timed
 * from there (0 without a model). */
static void test_shapes_host_skew(void **state) {
    struct fixture *f = *state;
    struct shapes s;
    measure_shapes_of(&f->model, &s);
    assert_int_equal(s.host_skew, f->model.weights_skew);
    const struct gguf_tensor *first = NULL;
    for (uint32_t i = 0; i < f->model.n_shards && !first; i++)
        for (uint32_t t = 0; t < f->model.shards[i].n_tensors && !first; t++) {
            const struct gguf_tensor *g = f->model.shards[i].tensors[t];
            if (f->model.shards[i].kind != SHARD_EMBED && model_tensor_is_matrix(g)) first = g;
        }
    assert_non_null(first);
    assert_int_equal(s.host_skew, (uintptr_t)first->data % 256);
    assert_int_equal(s.host_skew % gguf_alignment(f->file), 0);
    measure_shapes_of(NULL, &s);
    assert_int_equal(s.host_skew, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_others_share),
        cmocka_unit_test(test_shapes_host_skew),
        cmocka_unit_test(test_ffn_rows_add_up),
        cmocka_unit_test(test_mixed_batch_equals_separate),
        cmocka_unit_test(test_every_token_logits),
        cmocka_unit_test(test_long_cache_decode_in_runs),
        cmocka_unit_test(test_bad_batches_change_nothing),
        cmocka_unit_test(test_input_embeddings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
