/* The CPU vision encoder on a small Qwen2.5-VL mmproj built here (F32, random weights): the
 * output has one row of the language model's width per 2x2 patch group, is finite and depends
 * on the image; windows are assigned as the model's window index does. The numbers are checked
 * against an independent numpy version of the model's code in tests/py/test_vision_encoder.py. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "gguf_builder.h"
#include "mmproj_builder.h"
#include "core/threadpool.h"
#include "test_helpers.h"
#include "vision/encoder.h"

enum { E = 64, FF = 96, LAYERS = 2, PROJ = 48, P = 14 };

static uint8_t *build(size_t *size) {
    const struct tb_mmproj_shape shape = {P, E, FF, LAYERS, 4, PROJ, {0.48145466f, 0.4578275f, 0.40821073f},
                                          {0.26862954f, 0.26130258f, 0.27577711f}};
    return tb_mmproj(&shape, size);
}

/* Fill every tensor: norm gains near 1, the rest uniform with variance 1 / row length. */
static void fill(struct gguf_file *f) {
    uint64_t state = 12345;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        float *v = (float *)t->data; /* our own buffer */
        const bool gain = t->name.len > 7 && (memmem(t->name.data, t->name.len, "ln", 2) != NULL);
        const float scale = sqrtf(3.0f / (float)t->ne[0]);
        for (uint64_t j = 0; j < t->n_bytes / 4; j++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const float u = (float)((state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
            v[j] = gain ? 1.0f + 0.1f * u : u * scale;
        }
    }
}

static void test_encode_shapes_and_values(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = build(&size);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_memory(bytes, size, "encoder", &f), PSHARD_OK);
    fill(f);
    struct mmproj m;
    if (mmproj_load(f, &m) != PSHARD_OK) fail_msg("%s", pshard_last_error());
    struct vision_image img;
    assert_int_equal(vision_image_load(test_data_path("image/gradient_40x30.png"), NULL, &img), PSHARD_OK);
    struct vision_patches p;
    assert_int_equal(vision_preprocess(&m.hp, &img, &p), PSHARD_OK);
    struct vision_embeddings out;
    if (vision_encode(&m, &p, NULL, NULL, &out) != PSHARD_OK) fail_msg("%s", pshard_last_error());
    assert_int_equal(out.n_tokens, 6); /* 4 x 6 patches, 2 x 3 groups */
    assert_int_equal(out.n_embd, PROJ);
    double sum = 0, sum2 = 0;
    for (size_t i = 0; i < (size_t)out.n_tokens * PROJ; i++) {
        assert_true(isfinite(out.data[i]));
        sum += out.data[i], sum2 += (double)out.data[i] * out.data[i];
    }
    const double n = (double)out.n_tokens * PROJ, sd = sqrt(sum2 / n - (sum / n) * (sum / n));
    assert_true(sd > 0.01);
    /* Tokens differ from each other (the image and the positions reach the output). */
    assert_true(memcmp(out.data, out.data + PROJ, PROJ * sizeof(float)) != 0);
    /* On a pool of 3 threads: the same bits (each output is computed the same way, whoever
     * computes it). */
    struct threadpool *pool;
    assert_int_equal(threadpool_create(3, &pool), PSHARD_OK);
    struct vision_embeddings threaded;
    assert_int_equal(vision_encode(&m, &p, pool, NULL, &threaded), PSHARD_OK);
    assert_memory_equal(out.data, threaded.data, (size_t)out.n_tokens * PROJ * sizeof(float));
    vision_embeddings_free(&threaded);
    threadpool_free(pool);
    /* A different image gives different embeddings. */
    p.data[0] += 1.0f;
    struct vision_embeddings again;
    assert_int_equal(vision_encode(&m, &p, NULL, NULL, &again), PSHARD_OK);
    assert_true(memcmp(out.data, again.data, (size_t)out.n_tokens * PROJ * sizeof(float)) != 0);
    vision_embeddings_free(&again);
    /* Patches that do not fit the model are refused. */
    p.patch_dim = 100;
    assert_int_equal(vision_encode(&m, &p, NULL, NULL, &again), PSHARD_ERR_INVALID_ARG);
    vision_embeddings_free(&out);
    vision_patches_free(&p);
    vision_image_free(&img);
    mmproj_free(&m);
    gguf_close(f);
    free(bytes);
}

/* calls[0]: how many reports, calls[1]: the last one's done (and done == total at the end). */
static int count_progress(void *user, uint32_t done, uint32_t total) {
    uint32_t *calls = user;
    calls[0]++;
    calls[1] = done;
    assert_true(done <= total);
    return 0;
}

static int stop_progress(void *user, uint32_t done, uint32_t total) {
    (void)user, (void)done, (void)total;
    return 1;
}

/* Another patch size and a file from another writer (tests/data/mmproj): 40x30 resizes to
 * 68x52 (multiples of 4, at least 3136 pixels), 34 x 26 patches, 221 tokens of width 8. */
static void test_encode_patch2_file(void **state) {
    (void)state;
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(test_data_path("mmproj/tiny_patch2.gguf"), &f), PSHARD_OK);
    struct mmproj m;
    assert_int_equal(mmproj_load(f, &m), PSHARD_OK);
    struct vision_image img;
    assert_int_equal(vision_image_load(test_data_path("image/gradient_40x30.jpg"), NULL, &img), PSHARD_OK);
    struct vision_patches p;
    assert_int_equal(vision_preprocess(&m.hp, &img, &p), PSHARD_OK);
    assert_int_equal(p.width, 68);
    assert_int_equal(p.height, 52);
    assert_int_equal(p.patch_dim, 24);
    struct vision_embeddings out;
    uint32_t calls[2] = {0, 0};
    const struct vision_progress progress = {count_progress, calls};
    assert_int_equal(vision_encode(&m, &p, NULL, &progress, &out), PSHARD_OK);
    assert_int_equal(calls[0], m.hp.n_layer + 1); /* every block, then the merger */
    assert_int_equal(calls[1], m.hp.n_layer + 1);
    assert_int_equal(out.n_tokens, 221);
    assert_int_equal(out.n_embd, 8);
    for (size_t i = 0; i < 221 * 8; i++) assert_true(isfinite(out.data[i]));
    vision_embeddings_free(&out);
    /* A progress callback that says stop ends the encode with an error and no output. */
    const struct vision_progress stop = {stop_progress, NULL};
    assert_int_equal(vision_encode(&m, &p, NULL, &stop, &out), PSHARD_ERR_INVALID_ARG);
    assert_non_null(strstr(pshard_last_error(), "stopped after 1 of"));
    assert_null(out.data);
    vision_patches_free(&p);
    vision_image_free(&img);
    mmproj_free(&m);
    gguf_close(f);
}

static void test_windows(void **state) {
    (void)state;
    struct vision_hparams hp = {.patch_size = 14, .spatial_merge = 2, .window_size = 112};
    /* A grid 20 patches wide: 10 merged units, windows of 4 units, so 3 windows across. */
    assert_int_equal(vision_window_of(&hp, 20, 0, 0), 0);
    assert_int_equal(vision_window_of(&hp, 20, 7, 7), 0);
    assert_int_equal(vision_window_of(&hp, 20, 0, 8), 1);
    assert_int_equal(vision_window_of(&hp, 20, 0, 19), 2);
    assert_int_equal(vision_window_of(&hp, 20, 8, 0), 3);
    assert_int_equal(vision_window_of(&hp, 20, 17, 17), 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_encode_shapes_and_values),
                                       cmocka_unit_test(test_encode_patch2_file), cmocka_unit_test(test_windows)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
