/* The KV cache as one pool of blocks shared by all sequences: blocks are taken and given back;
 * 64 short sequences and 4 long ones fit the memory of a few long ones; a step that needs a block
 * when none is free fails with PSHARD_ERR_RANGE and changes nothing; on a tiny synthetic model, a
 * sequence whose blocks interleave with another's in the pool gets the logits it gets alone; a
 * shared prefix gives the logits of computing it, and writing after it (or truncating into a
 * shared block and going on) never changes what the other sequence computes; the host's K and V
 * storage each sit on pages of their own (the GPU placement pins them by pages: a page shared by
 * the two would leave copies spanning pinned and pageable memory, which the driver refuses). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "exec/exec.h"
#include "exec/exec_internal.h"
#include "exec/kv_cache.h"

struct fixture {
    char path[256];
    struct gguf_file *file;
    struct model model;
};

static int setup(void **state) {
    static struct fixture f;
    const char *build = getenv("PSHARD_BUILD_DIR");
    snprintf(f.path, sizeof f.path, "/tmp/pshard-test-kv-pool-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape tiny-llama --seed 3 --quiet -o '%s'", build ? build : ".", f.path);
    if (system(cmd) != 0 || gguf_open(f.path, &f.file) != PSHARD_OK || model_load(f.file, &f.model) != PSHARD_OK) {
        fprintf(stderr, "cannot make the tiny model with gguf-synth (PSHARD_BUILD_DIR): %s\n", pshard_last_error());
        return -1;
    }
    *state = &f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    if (!f) return 0;
    model_free(&f->model);
    gguf_close(f->file);
    unlink(f->path);
    return 0;
}

static struct exec_ctx *make_ctx(struct fixture *f, int32_t n_ctx, int32_t n_seq, int32_t n_cells) {
    struct exec_params p = {.n_ctx = n_ctx, .n_batch = 64, .n_seq = n_seq, .n_threads = 2, .plan = PLAN_CPU,
                            .staging = -1, .decode_set = PLAN_DECODE_WEIGHED, .n_cells = n_cells};
    struct exec_ctx *ctx;
    assert_int_equal(exec_create(&f->model, &p, &ctx), PSHARD_OK);
    return ctx;
}

/* Token i of a made-up text `which`. */
static int32_t token_of(int which, int32_t i) { return 1 + (int32_t)((i * 37 + which * 101 + (i * i) % 13) % 1000); }

/* Steps sequence seq with tokens [from, to) of text `which`, n a step; the last token's logits
 * into out (may be NULL). */
static void extend(struct exec_ctx *ctx, int32_t seq, int which, int32_t from, int32_t to, int32_t n, float *out) {
    int32_t tokens[64], pos[64], seqs[64];
    for (int32_t at = from; at < to; at += n) {
        const int32_t count = to - at < n ? to - at : n;
        for (int32_t i = 0; i < count; i++) tokens[i] = token_of(which, at + i), pos[i] = at + i, seqs[i] = seq;
        struct exec_batch b = {count, tokens, pos, seqs, NULL};
        assert_int_equal(exec_step(ctx, &b), PSHARD_OK);
    }
    assert_int_equal(exec_seq_len(ctx, seq), to);
    if (out) memcpy(out, exec_logits(ctx, 0), sizeof(float) * (size_t)exec_n_vocab(ctx));
}

static double max_diff(const float *a, const float *b, int32_t n) {
    double worst = 0;
    for (int32_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    return worst;
}

/* ---- the pool's bookkeeping */

static void test_blocks_taken_and_given_back(void **state) {
    (void)state;
    struct kv_cache kv;
    /* 68 sequences of up to 1024 cells over 8192: a fifth of 68 * 1024 */
    assert_int_equal(kv_cache_init(&kv, 2, 68, 1024, 8192, 8, 8, true), PSHARD_OK);
    assert_int_equal(kv.n_blocks, 8192 / KV_BLOCK_CELLS);
    assert_int_equal(kv.n_free, kv.n_blocks);
    /* 64 short sequences (60 cells: a block each) and 4 long ones (1024 cells: 16 blocks each) */
    for (int32_t s = 0; s < 68; s++) {
        const int32_t len = s < 64 ? 60 : 1024;
        const int32_t need = kv_cache_blocks_needed(&kv, s, len);
        assert_int_equal(need, (len + KV_BLOCK_CELLS - 1) / KV_BLOCK_CELLS);
        assert_true(need <= kv.n_free);
        assert_int_equal(kv_cache_reserve(&kv, s, len, NULL), PSHARD_OK);
        kv.seq_len[s] = len;
    }
    assert_int_equal(kv.n_free, 0);
    /* Every block held once. */
    int32_t *held = calloc((size_t)kv.n_blocks, sizeof *held);
    for (int32_t s = 0; s < 68; s++)
        for (int32_t i = 0; i < kv.n_held[s]; i++) held[kv_cache_blocks(&kv, s)[i]]++;
    for (int32_t b = 0; b < kv.n_blocks; b++) assert_int_equal(held[b], 1);
    free(held);
    /* Full: one more cell past a block's end needs a block there is not. */
    assert_int_equal(kv_cache_blocks_needed(&kv, 0, 65), 1);
    assert_int_equal(kv_cache_blocks_needed(&kv, 0, 64), 0);
    /* Truncation gives blocks back at once: a long sequence to 100 cells keeps 2 of 16. */
    kv_cache_truncate(&kv, 65, 100);
    assert_int_equal(kv.n_free, 14);
    assert_int_equal(kv.n_held[65], 2);
    kv_cache_truncate(&kv, 65, 0);
    assert_int_equal(kv.n_free, 16);
    for (int32_t s = 0; s < 68; s++) kv_cache_truncate(&kv, s, 0);
    assert_int_equal(kv.n_free, kv.n_blocks);
    kv_cache_free(&kv);
    /* The default pool: every sequence at n_ctx, each rounded up to whole blocks. */
    assert_int_equal(kv_cache_pool_cells(3, 100, 0), 3 * 128);
    assert_int_equal(kv_cache_pool_cells(3, 100, 130), 192);
}

/* Sharing by reference: whole blocks held twice, the rest copied; truncating into a shared block
 * keeps it shared until the next write, which copies it first. */
static void test_share_and_copy_on_write(void **state) {
    (void)state;
    struct kv_cache kv;
    assert_int_equal(kv_cache_init(&kv, 2, 3, 512, 0, 4, 4, true), PSHARD_OK);
    assert_int_equal(kv_cache_reserve(&kv, 0, 150, NULL), PSHARD_OK);
    kv.seq_len[0] = 150;
    for (int32_t il = 0; il < 2; il++)
        for (int32_t p = 0; p < 150; p++) *kv_cache_k(&kv, il, kv_cache_row(&kv, 0, p)) = (uint16_t)(p + 1000 * il);
    const int32_t free_before = kv.n_free;
    assert_int_equal(kv_cache_share(&kv, 1, 0, 150, NULL), PSHARD_OK);
    assert_int_equal(kv.seq_len[1], 150);
    assert_int_equal(kv.n_free, free_before - 1); /* 2 blocks shared, 22 cells copied into one */
    assert_int_equal(kv_cache_blocks(&kv, 1)[0], kv_cache_blocks(&kv, 0)[0]);
    assert_int_equal(kv_cache_blocks(&kv, 1)[1], kv_cache_blocks(&kv, 0)[1]);
    assert_int_not_equal(kv_cache_blocks(&kv, 1)[2], kv_cache_blocks(&kv, 0)[2]);
    for (int32_t il = 0; il < 2; il++)
        for (int32_t p = 0; p < 150; p++) assert_int_equal(*kv_cache_k(&kv, il, kv_cache_row(&kv, 1, p)), p + 1000 * il);
    /* Errors change nothing: dst not empty, too long a prefix, the same sequence. */
    assert_int_equal(kv_cache_share(&kv, 1, 0, 10, NULL), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(kv_cache_share(&kv, 2, 0, 151, NULL), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(kv_cache_share(&kv, 0, 0, 10, NULL), PSHARD_ERR_INVALID_ARG);
    assert_int_equal(kv.n_free, free_before - 1);
    /* Truncating seq 0 into its second block (shared): nothing copied yet; writing there takes one. */
    kv_cache_truncate(&kv, 0, 100);
    assert_int_equal(kv.n_free, free_before); /* its third block came back */
    assert_int_equal(kv_cache_blocks_needed(&kv, 0, 101), 1);
    const int32_t shared = kv_cache_blocks(&kv, 0)[1];
    assert_int_equal(kv_cache_reserve(&kv, 0, 101, NULL), PSHARD_OK);
    assert_int_not_equal(kv_cache_blocks(&kv, 0)[1], shared);
    assert_int_equal(kv.refs[shared], 1);
    for (int32_t p = 0; p < 100; p++) assert_int_equal(*kv_cache_k(&kv, 1, kv_cache_row(&kv, 0, p)), p + 1000);
    *kv_cache_k(&kv, 1, kv_cache_row(&kv, 0, 100)) = 7; /* seq 0's write lands in its own block */
    assert_int_equal(*kv_cache_k(&kv, 1, kv_cache_row(&kv, 1, 100)), 100 + 1000);
    kv_cache_free(&kv);
    /* A full pool: sharing a prefix that needs a copied block fails and changes nothing; whole
     * blocks alone need none. */
    assert_int_equal(kv_cache_init(&kv, 1, 2, 512, 3 * KV_BLOCK_CELLS, 4, 4, true), PSHARD_OK);
    assert_int_equal(kv_cache_reserve(&kv, 0, 150, NULL), PSHARD_OK);
    kv.seq_len[0] = 150;
    assert_int_equal(kv.n_free, 0);
    const uint64_t version = kv.table_version;
    assert_int_equal(kv_cache_share(&kv, 1, 0, 150, NULL), PSHARD_ERR_RANGE);
    assert_int_equal(kv.n_held[1], 0);
    assert_int_equal(kv.seq_len[1], 0);
    assert_int_equal(kv.table_version, version);
    for (int32_t i = 0; i < 3; i++) assert_int_equal(kv.refs[kv_cache_blocks(&kv, 0)[i]], 1);
    assert_int_equal(kv_cache_share(&kv, 1, 0, 128, NULL), PSHARD_OK);
    assert_int_equal(kv.refs[kv_cache_blocks(&kv, 0)[1]], 2);
    assert_int_equal(kv.refs[kv_cache_blocks(&kv, 0)[2]], 1);
    kv_cache_free(&kv);
}

/* ---- the executor over the pool, on gguf-synth's tiny-llama */

/* 64 short sequences and 4 long ones in a pool a fifth the size of n_seq * n_ctx; then a step
 * needing a block the pool lacks fails with PSHARD_ERR_RANGE and changes nothing, in the
 * sequences' lengths or the free cells; freeing a sequence lets it through. */
static void test_full_pool_fails_cleanly(void **state) {
    struct fixture *f = *state;
    struct exec_ctx *ctx = make_ctx(f, 1024, 68, 8192);
    assert_int_equal(exec_block_cells(ctx), KV_BLOCK_CELLS);
    assert_int_equal(exec_free_cells(ctx), 8192);
    for (int32_t s = 64; s < 68; s++) assert_int_equal(exec_fill_seq(ctx, s, 1000), PSHARD_OK);
    for (int32_t s = 0; s < 63; s++) assert_int_equal(exec_fill_seq(ctx, s, 50), PSHARD_OK);
    extend(ctx, 63, 0, 0, 60, 30, NULL); /* one computed */
    assert_int_equal(exec_free_cells(ctx), 0);
    /* Within their blocks, sequences go on; past them, the step fails whole. */
    extend(ctx, 63, 0, 60, 64, 4, NULL);
    const int32_t tokens[2] = {5, 6}, pos[2] = {50, 64}, seq[2] = {0, 63};
    struct exec_batch b = {2, tokens, pos, seq, NULL};
    assert_int_equal(exec_step(ctx, &b), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "KV cache full"));
    assert_int_equal(exec_seq_len(ctx, 0), 50);
    assert_int_equal(exec_seq_len(ctx, 63), 64);
    assert_int_equal(exec_free_cells(ctx), 0);
    assert_int_equal(exec_fill_seq(ctx, 0, 100), PSHARD_ERR_RANGE); /* 2 blocks: has 1 */
    assert_int_equal(exec_seq_len(ctx, 0), 50);
    assert_int_equal(exec_share_prefix(ctx, 63, 64, 10), PSHARD_ERR_INVALID_ARG); /* dst not empty */
    exec_truncate_seq(ctx, 65, 0);
    assert_int_equal(exec_free_cells(ctx), 16 * KV_BLOCK_CELLS);
    assert_int_equal(exec_step(ctx, &b), PSHARD_OK);
    assert_int_equal(exec_seq_len(ctx, 63), 65);
    exec_free(ctx);
    /* A pool smaller than one full sequence: legal, and full before the context is. */
    ctx = make_ctx(f, 256, 1, 100);
    assert_int_equal(exec_free_cells(ctx), 128);
    extend(ctx, 0, 1, 0, 128, 64, NULL);
    const int32_t t = 9, p128 = 128, s0 = 0;
    struct exec_batch one = {1, &t, &p128, &s0, NULL};
    assert_int_equal(exec_step(ctx, &one), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "KV cache full"));
    assert_int_equal(exec_seq_len(ctx, 0), 128);
    exec_free(ctx);
}

/* Two sequences stepped together take blocks in turns, so each's blocks interleave with the
 * other's in the pool; each gets the logits it gets alone in a pool of its own. */
static void test_interleaved_blocks_equal_alone(void **state) {
    struct fixture *f = *state;
    struct exec_ctx *alone = make_ctx(f, 512, 1, 0);
    const int32_t V = exec_n_vocab(alone);
    float *want[2], *got = malloc(sizeof(float) * (size_t)V);
    for (int w = 0; w < 2; w++) {
        want[w] = malloc(sizeof(float) * (size_t)V);
        exec_truncate_seq(alone, 0, 0);
        extend(alone, 0, w, 0, 130, 64, want[w]);
    }
    exec_free(alone);
    struct exec_ctx *ctx = make_ctx(f, 512, 3, 0);
    int32_t tokens[64], pos[64], seq[64];
    int8_t logits[64];
    for (int32_t at = 0; at < 130; at += 26) { /* 26 tokens of each a step, the two alternating */
        for (int32_t i = 0; i < 52; i++) {
            const int w = i % 2;
            tokens[i] = token_of(w, at + i / 2), pos[i] = at + i / 2, seq[i] = w, logits[i] = at + i / 2 == 129;
        }
        struct exec_batch b = {52, tokens, pos, seq, logits};
        assert_int_equal(exec_step(ctx, &b), PSHARD_OK);
    }
    const int32_t *a = kv_cache_blocks(&ctx->kv, 0), *b = kv_cache_blocks(&ctx->kv, 1);
    assert_int_equal(ctx->kv.n_held[0], 3);
    bool interleaved = false;
    for (int32_t i = 0; i + 1 < 3; i++) interleaved |= a[i + 1] != a[i] + 1 && b[i] > a[i] && b[i] < a[i + 1];
    assert_true(interleaved);
    assert_int_equal(exec_last_stats(ctx)->n_outputs, 2);
    for (int w = 0; w < 2; w++) assert_true(max_diff(exec_logits(ctx, w), want[w], V) < 1e-3);
    free(got), free(want[0]), free(want[1]);
    exec_free(ctx);
}

/* The reference: text `a` for cells [0, cut), text `b` for [cut, end), computed in a sequence of
 * its own; the last token's logits into out. */
static void reference(struct exec_ctx *ref, int a, int32_t cut, int b, int32_t end, float *out) {
    exec_truncate_seq(ref, 0, 0);
    extend(ref, 0, a, 0, cut, 64, NULL);
    extend(ref, 0, b, cut, end, 64, out);
}

/* A prefix shared from sequence 0 into sequence 1 (one whole block shared and 36 cells copied; or
 * two whole blocks shared) gives sequence 1 the logits of computing prefix and continuation
 * itself, and sequence 1 writing after it leaves sequence 0's next logits as they were; truncating
 * either into the block they share (the source in the first round, the copy in the second), then
 * going on, gives what computing that from scratch gives, the other's next logits unchanged. */
static void test_shared_prefix(void **state) {
    struct fixture *f = *state;
    struct exec_ctx *ref = make_ctx(f, 512, 1, 0), *ctx = make_ctx(f, 512, 3, 0);
    const int32_t V = exec_n_vocab(ctx), all = exec_free_cells(ctx);
    float *want = malloc(sizeof(float) * (size_t)V), *before = malloc(sizeof(float) * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)V);
    const int32_t cuts[2] = {100, 128};
    for (int c = 0; c < 2; c++) {
        const int32_t cut = cuts[c];
        for (int32_t s = 0; s < 3; s++) exec_truncate_seq(ctx, s, 0);
        extend(ctx, 0, 0, 0, 140, 64, NULL);
        extend(ctx, 0, 2, 140, 141, 1, before); /* sequence 0's next, before anyone shares */
        exec_truncate_seq(ctx, 0, 140);
        const int32_t free_before = exec_free_cells(ctx);
        assert_int_equal(exec_share_prefix(ctx, 1, 0, cut), PSHARD_OK);
        assert_int_equal(exec_seq_len(ctx, 1), cut);
        assert_int_equal(exec_free_cells(ctx), free_before - (cut % KV_BLOCK_CELLS ? KV_BLOCK_CELLS : 0));
        assert_int_equal(kv_cache_blocks(&ctx->kv, 1)[0], kv_cache_blocks(&ctx->kv, 0)[0]);
        extend(ctx, 1, 1, cut, cut + 20, 20, got);
        reference(ref, 0, cut, 1, cut + 20, want);
        assert_true(max_diff(got, want, V) < 1e-3);
        extend(ctx, 0, 2, 140, 141, 1, got);
        assert_true(max_diff(got, before, V) == 0); /* the same cells, the same step */
        exec_truncate_seq(ctx, 0, 140);
        /* One of them truncated into the first block, which both hold: its next write copies it. */
        const int32_t moved = c == 0 ? 0 : 1, other = 1 - moved, other_len = exec_seq_len(ctx, other);
        extend(ctx, other, 2, other_len, other_len + 1, 1, before);
        exec_truncate_seq(ctx, other, other_len);
        exec_truncate_seq(ctx, moved, 40);
        extend(ctx, moved, 3, 40, 60, 20, got);
        reference(ref, 0, 40, 3, 60, want);
        assert_true(max_diff(got, want, V) < 1e-3);
        assert_int_not_equal(kv_cache_blocks(&ctx->kv, 0)[0], kv_cache_blocks(&ctx->kv, 1)[0]);
        extend(ctx, other, 2, other_len, other_len + 1, 1, got);
        assert_true(max_diff(got, before, V) == 0);
    }
    for (int32_t s = 0; s < 3; s++) exec_truncate_seq(ctx, s, 0);
    assert_int_equal(exec_free_cells(ctx), all);
    free(want), free(before), free(got);
    exec_free(ref), exec_free(ctx);
}

static void assert_own_pages(const void *p, size_t bytes, const void *other, size_t other_bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, b = (uintptr_t)other;
    assert_int_equal(a % page, 0);
    /* the last page of one is not the first of the other */
    const uintptr_t a_last = (a + bytes - 1) / page, b_first = b / page, b_last = (b + other_bytes - 1) / page;
    assert_true(a_last < b_first || b_last < a / page);
}

static void test_host_storage_on_own_pages(void **state) {
    (void)state;
    /* odd widths: sizes that are no multiple of a page */
    for (int grow = 0; grow < 2; grow++) {
        struct kv_cache kv;
        assert_int_equal(kv_cache_init(&kv, 3, 1, 100, 0, 7, 5, !grow), PSHARD_OK);
        if (grow) {
            assert_null(kv.k);
            assert_int_equal(kv_cache_add_host_storage(&kv), PSHARD_OK);
        }
        const size_t cells = (size_t)kv.n_layers * (size_t)kv_cache_cells(&kv);
        const size_t kb = cells * (size_t)kv.k_width * 2, vb = cells * (size_t)kv.v_width * 2;
        assert_non_null(kv.k);
        assert_non_null(kv.v);
        assert_own_pages(kv.k, kb, kv.v, vb);
        assert_own_pages(kv.v, vb, kv.k, kb);
        memset(kv.k, 1, kb), memset(kv.v, 2, vb); /* the whole of each is writable */
        kv_cache_free(&kv);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_taken_and_given_back),
        cmocka_unit_test(test_share_and_copy_on_write),
        cmocka_unit_test(test_full_pool_fails_cleanly),
        cmocka_unit_test(test_interleaved_blocks_equal_alone),
        cmocka_unit_test(test_shared_prefix),
        cmocka_unit_test(test_host_storage_on_own_pages),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
