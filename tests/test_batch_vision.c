/* Requests with images in the batched engine, on gguf-synth's tiny Qwen2.5-VL pair on the CPU:
 * requests with different images (and one without) stepped together give the tokens each gives
 * alone through pshard_generate (whose tokens tests/py check against llama.cpp's), whether steps
 * hold whole images or cut them into pieces of 3 tokens; a finished request's image cells are
 * reused by a request that starts alike, never by one with another image at that place; bad image
 * requests fail at pshard_request_add, naming the image, and queue nothing; images prepared on
 * another thread beforehand (pshard_image_prepare) give the tokens of their bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/vision_prepare.h" /* (a prepared image's pixels and settings) */
#include "pshard.h"
#include "test_helpers.h"

enum { MAX_OUT = 16, N_PREDICT = 8, N_IMAGES = 3 };

static char lm_path[256], mmproj_path[256];
static pshard_image images[N_IMAGES]; /* bytes of the test data's images (40x30: 2 x 2 image tokens) */
static const char *const image_files[N_IMAGES] = {"image/gradient_40x30.png", "image/alpha_40x30.png", "image/gray_40x30.jpg"};

/* A prompt and the images its markers stand for (indices into images[]). */
struct ask {
    const char *prompt;
    int32_t n_images, which[2];
};

static const struct ask ASKS[] = {
    {"Look: " PSHARD_IMAGE_MARKER " says", 1, {0}},
    {PSHARD_IMAGE_MARKER " and " PSHARD_IMAGE_MARKER " differ in", 2, {1, 2}},
    {"A plain question without images, then", 0, {0}},
    {"Look: " PSHARD_IMAGE_MARKER " says", 1, {2}}, /* the first ask's text with another image */
};
enum { N_ASKS = sizeof ASKS / sizeof ASKS[0] };

struct outcome {
    int32_t id, tokens[MAX_OUT], n_tokens;
    pshard_finish_reason finish;
    pshard_request_stats stats;
};

static int on_event(void *user, const pshard_token_event *ev) {
    struct outcome *o = user;
    if (ev->token >= 0 && o->n_tokens < MAX_OUT) o->tokens[o->n_tokens++] = ev->token;
    if (ev->finish != PSHARD_FINISH_NONE) o->finish = ev->finish, o->stats = *ev->stats;
    return 0;
}

static pshard_ctx *open_vlm(int32_t n_parallel, int32_t n_batch, bool vision) {
    pshard_params params;
    pshard_params_default(&params);
    params.model_path = lm_path;
    params.n_ctx = 1024, params.n_batch = n_batch, params.n_threads = 2, params.n_parallel = n_parallel;
    params.vram_budget = 0, params.prefault = 0, params.no_profile = 1;
    pshard_ctx *ctx = NULL;
    if (pshard_open(&params, &ctx) != PSHARD_OK) fail_msg("%s", pshard_last_error());
    if (vision && pshard_vision_load(ctx, mmproj_path) != PSHARD_OK) fail_msg("%s", pshard_last_error());
    return ctx;
}

static void ask_images(const struct ask *a, pshard_image *out) {
    for (int32_t i = 0; i < a->n_images; i++) out[i] = images[a->which[i]];
}

/* Queue ask a with images im (NULL: its images' bytes). */
static void add_with(pshard_ctx *ctx, const struct ask *a, const pshard_image *given, struct outcome *o) {
    memset(o, 0, sizeof *o);
    pshard_image im[2];
    if (given) memcpy(im, given, sizeof im[0] * (size_t)a->n_images);
    else ask_images(a, im);
    pshard_request req;
    pshard_request_default(&req);
    req.prompt = a->prompt;
    req.images = im, req.n_images = a->n_images;
    req.n_predict = N_PREDICT, req.sampling.temperature = 0, req.ignore_eos = 1;
    req.on_event = on_event, req.user = o;
    if (pshard_request_add(ctx, &req, &o->id) != PSHARD_OK) fail_msg("%s", pshard_last_error());
}

static void add(pshard_ctx *ctx, const struct ask *a, struct outcome *o) { add_with(ctx, a, NULL, o); }

static void run_to_end(pshard_ctx *ctx) {
    int32_t pending = 1;
    for (int steps = 0; pending; steps++) {
        assert_true(steps < 10000);
        assert_int_equal(pshard_step(ctx, &pending), PSHARD_OK);
    }
}

/* Each ask alone through the one-sequence call. */
static void alone(const struct ask *a, struct outcome *o) {
    pshard_ctx *ctx = open_vlm(1, 64, true);
    memset(o, 0, sizeof *o);
    pshard_image im[2];
    ask_images(a, im);
    pshard_gen_opts opts;
    pshard_gen_opts_default(&opts);
    opts.n_predict = N_PREDICT, opts.sampling.temperature = 0, opts.ignore_eos = 1;
    opts.images = im, opts.n_images = a->n_images;
    opts.out_tokens = o->tokens, opts.out_tokens_cap = MAX_OUT;
    pshard_gen_stats stats;
    if (pshard_generate(ctx, a->prompt, &opts, NULL, NULL, &stats) != PSHARD_OK) fail_msg("%s", pshard_last_error());
    o->n_tokens = stats.n_generated;
    pshard_close(ctx);
}

static void same_tokens(const struct outcome *a, const struct outcome *b, int which) {
    if (a->n_tokens != b->n_tokens || memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens))
        fail_msg("ask %d: %d tokens (first %d) against %d (first %d)", which, a->n_tokens, a->tokens[0], b->n_tokens,
                 b->tokens[0]);
}

/* Every ask at once, in steps of 64 tokens (whole images) and of 3 (images cut into pieces, the
 * prompt chunks after one that reaches an image waiting): each as alone. Other images give other
 * tokens (the embeddings reach the model). */
static void test_together_equals_alone(void **state) {
    struct outcome ref[N_ASKS], got[N_ASKS];
    for (int i = 0; i < N_ASKS; i++) alone(&ASKS[i], &ref[i]);
    assert_true(ref[0].n_tokens == N_PREDICT && memcmp(ref[0].tokens, ref[3].tokens, sizeof ref[0].tokens));
    const int32_t steps[] = {64, 3};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        pshard_ctx *ctx = open_vlm(N_ASKS, steps[k], true);
        for (int i = 0; i < N_ASKS; i++) add(ctx, &ASKS[i], &got[i]);
        run_to_end(ctx);
        for (int i = 0; i < N_ASKS; i++) {
            assert_int_equal(got[i].finish, PSHARD_FINISH_LENGTH);
            same_tokens(&got[i], &ref[i], i);
        }
        pshard_close(ctx);
    }
}

/* A finished request's cells are reused by the next that starts alike, its image's included; a
 * request with another image at that place reuses only the cells before it, and gives its own
 * tokens. */
static void test_image_prefix_reuse(void **state) {
    struct outcome ref, o;
    alone(&ASKS[3], &ref);
    pshard_ctx *ctx = open_vlm(1, 64, true);
    add(ctx, &ASKS[0], &o);
    run_to_end(ctx);
    const int32_t n_prompt = o.stats.n_prompt;
    add(ctx, &ASKS[0], &o);
    run_to_end(ctx);
    assert_int_equal(o.stats.n_prompt_cached, n_prompt - 1); /* all but the last, which runs for logits */
    add(ctx, &ASKS[3], &o);
    run_to_end(ctx);
    assert_true(o.stats.n_prompt_cached > 0 && o.stats.n_prompt_cached <= n_prompt - 6); /* not past the image's start */
    same_tokens(&o, &ref, 3);
    pshard_close(ctx);
}

static void refused(pshard_ctx *ctx, const pshard_request *req, pshard_status want, const char *says) {
    int32_t id = -1;
    assert_int_equal(pshard_request_add(ctx, req, &id), want);
    if (!strstr(pshard_last_error(), says)) fail_msg("'%s' does not say '%s'", pshard_last_error(), says);
    pshard_batch_info info;
    pshard_get_batch_info(ctx, &info);
    assert_int_equal(info.n_queued, 0);
}

static void test_bad_requests(void **state) {
    pshard_ctx *ctx = open_vlm(2, 64, true);
    pshard_request req;
    pshard_request_default(&req);
    const uint8_t junk[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 0};
    pshard_image bad[2] = {images[0], {.data = junk, .size = sizeof junk}};
    req.prompt = PSHARD_IMAGE_MARKER PSHARD_IMAGE_MARKER;
    req.images = bad, req.n_images = 2;
    refused(ctx, &req, PSHARD_ERR_FORMAT, "image 2: ");
    req.n_images = 1;
    refused(ctx, &req, PSHARD_ERR_INVALID_ARG, "2 image markers");
    const int32_t tokens[] = {1, 2, 3};
    req.prompt = NULL, req.prompt_tokens = tokens, req.n_prompt_tokens = 3;
    refused(ctx, &req, PSHARD_ERR_INVALID_ARG, "text prompt");
    /* a good request runs after them; the encoder is not replaced while it runs */
    struct outcome o;
    add(ctx, &ASKS[0], &o);
    assert_int_equal(pshard_vision_load(ctx, mmproj_path), PSHARD_ERR_INVALID_ARG);
    run_to_end(ctx);
    assert_int_equal(o.finish, PSHARD_FINISH_LENGTH);
    pshard_close(ctx);
    /* without an encoder */
    ctx = open_vlm(2, 64, false);
    req.prompt = ASKS[0].prompt, req.prompt_tokens = NULL, req.images = images, req.n_images = 1;
    refused(ctx, &req, PSHARD_ERR_INVALID_ARG, "--mmproj");
    pshard_close(ctx);
}

/* Images prepared beforehand (pshard_image_prepare, as the server does on its request threads): the
 * tokens of their bytes, all asks at once; one kept already (by content) reuses its cells; errors
 * name the image; the preparer outlives its context; an image prepared for an encoder that
 * normalizes otherwise is refused. */
static void test_prepared_images(void **state) {
    struct outcome ref[N_ASKS], got[N_ASKS];
    for (int i = 0; i < N_ASKS; i++) alone(&ASKS[i], &ref[i]);
    pshard_ctx *ctx = open_vlm(N_ASKS, 64, true);
    pshard_image_preparer *preparer;
    assert_int_equal(pshard_image_preparer_create(ctx, &preparer), PSHARD_OK);
    pshard_prepared_image *prepared[N_IMAGES];
    pshard_image ready[N_IMAGES];
    for (int i = 0; i < N_IMAGES; i++) {
        assert_int_equal(pshard_image_prepare(preparer, &images[i], i, &prepared[i]), PSHARD_OK);
        ready[i] = (pshard_image){.prepared = prepared[i]};
    }
    for (int i = 0; i < N_ASKS; i++) {
        pshard_image im[2] = {ready[ASKS[i].which[0]], ready[ASKS[i].which[1]]};
        add_with(ctx, &ASKS[i], im, &got[i]);
    }
    run_to_end(ctx);
    for (int i = 0; i < N_ASKS; i++) same_tokens(&got[i], &ref[i], i);
    /* the first ask again, its image as bytes: kept (the same content), its cells reused */
    add(ctx, &ASKS[0], &got[0]);
    run_to_end(ctx);
    assert_int_equal(got[0].stats.n_prompt_cached, got[0].stats.n_prompt - 1);
    same_tokens(&got[0], &ref[0], 0);

    const uint8_t junk[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 0};
    pshard_prepared_image *bad = NULL;
    assert_int_equal(pshard_image_prepare(preparer, &(pshard_image){.data = junk, .size = sizeof junk}, 1, &bad),
                     PSHARD_ERR_FORMAT);
    assert_null(bad);
    assert_non_null(strstr(pshard_last_error(), "image 2: "));
    assert_int_equal(pshard_image_prepare(preparer, &(pshard_image){.path = "/nonexistent/a.png"}, 0, &bad), PSHARD_ERR_IO);
    assert_non_null(strstr(pshard_last_error(), "/nonexistent/a.png"));
    pshard_close(ctx);

    /* after its context: the same patches; into another context, as another encoder's, refused */
    pshard_prepared_image *again;
    assert_int_equal(pshard_image_prepare(preparer, &images[0], 0, &again), PSHARD_OK);
    pshard_image_preparer_free(preparer);
    const struct vision_patches *a = &again->patches, *b = &prepared[0]->patches;
    assert_true(a->n_patches == b->n_patches && a->patch_dim == b->patch_dim && a->n_patches > 0);
    assert_memory_equal(a->data, b->data, sizeof *a->data * a->n_patches * a->patch_dim);
    again->image_std[1] *= 2;
    ctx = open_vlm(1, 64, true);
    pshard_request req;
    pshard_request_default(&req);
    req.prompt = ASKS[0].prompt, req.images = &(pshard_image){.prepared = again}, req.n_images = 1;
    refused(ctx, &req, PSHARD_ERR_INVALID_ARG, "image 1: prepared for another vision encoder");
    pshard_close(ctx);
    pshard_prepared_image_free(again);
    for (int i = 0; i < N_IMAGES; i++) pshard_prepared_image_free(prepared[i]);
    /* a context without an encoder has no preparer */
    ctx = open_vlm(1, 64, false);
    assert_int_equal(pshard_image_preparer_create(ctx, &preparer), PSHARD_ERR_INVALID_ARG);
    assert_null(preparer);
    pshard_close(ctx);
}

int main(void) {
    if (test_synth_vision_pair("batch-vision", lm_path, sizeof lm_path, mmproj_path, sizeof mmproj_path) != 0) return 1;
    void *bytes[N_IMAGES];
    for (int i = 0; i < N_IMAGES; i++) {
        size_t size;
        if (!(bytes[i] = test_read_file(test_data_path(image_files[i]), &size))) {
            fprintf(stderr, "cannot read %s (PSHARD_TEST_DATA)\n", image_files[i]);
            return 1;
        }
        images[i] = (pshard_image){.data = bytes[i], .size = size};
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_together_equals_alone),
        cmocka_unit_test(test_image_prefix_reuse),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_prepared_images),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < N_IMAGES; i++) free(bytes[i]);
    unlink(lm_path);
    unlink(mmproj_path);
    return failed;
}
