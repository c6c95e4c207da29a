/* Images in: JPEG and PNG decoding (pixels of known images, every truncation, garbage, the size
 * limits) and Qwen2.5-VL preprocessing (smart resize against values computed independently with
 * the processor's rule in Python, resampling, normalization, patch order). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_helpers.h"
#include "vision/image.h"
#include "vision/preprocess.h"

static const char *const images[] = {
    "image/gradient_40x30.png", "image/gradient_40x30.jpg", "image/gradient_40x30_444_progressive.jpg",
    "image/gray_40x30.png",     "image/gray_40x30.jpg",     "image/palette_40x30.png",
    "image/alpha_40x30.png",
};

static void decode_file(const char *name, struct vision_image *img) {
    pshard_status st = vision_image_load(test_data_path(name), NULL, img);
    if (st != PSHARD_OK) fail_msg("%s: %s", name, pshard_last_error());
}

/* The generator's pixel (make_images.py). */
static void gradient_pixel(uint32_t x, uint32_t y, int rgb[3]) {
    rgb[0] = (int)(x * 255 / 39);
    rgb[1] = (int)(y * 255 / 29);
    rgb[2] = (int)((x * 7 + y * 13) % 256);
}

static void test_decode_known_images(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof images / sizeof images[0]; i++) {
        struct vision_image img;
        decode_file(images[i], &img);
        assert_int_equal(img.width, 40);
        assert_int_equal(img.height, 30);
        vision_image_free(&img);
    }
    /* Lossless: exact. JPEG at quality 90-95: within 16 levels on this smooth image. */
    struct vision_image png, jpg;
    decode_file("image/gradient_40x30.png", &png);
    decode_file("image/gradient_40x30_444_progressive.jpg", &jpg);
    int worst = 0;
    for (uint32_t y = 0; y < 30; y++)
        for (uint32_t x = 0; x < 40; x++) {
            int want[3];
            gradient_pixel(x, y, want);
            for (int c = 0; c < 3; c++) {
                assert_int_equal(png.rgb[(y * 40 + x) * 3 + c], want[c]);
                int diff = abs(jpg.rgb[(y * 40 + x) * 3 + c] - want[c]);
                if (c < 2 && diff > worst) worst = diff; /* blue is a noisy pattern JPEG smooths */
            }
        }
    assert_true(worst <= 16);
    vision_image_free(&png);
    vision_image_free(&jpg);
    struct vision_image gray, alpha;
    decode_file("image/gray_40x30.png", &gray);
    for (size_t i = 0; i < 40 * 30; i++) {
        assert_int_equal(gray.rgb[3 * i], gray.rgb[3 * i + 1]);
        assert_int_equal(gray.rgb[3 * i], gray.rgb[3 * i + 2]);
    }
    vision_image_free(&gray);
    /* Alpha grows from 0 (top) to 255 (bottom): the top row is the white background. */
    decode_file("image/alpha_40x30.png", &alpha);
    for (int c = 0; c < 3; c++) assert_true(alpha.rgb[c] >= 250);
    vision_image_free(&alpha);
}

static void test_truncated_and_garbage(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof images / sizeof images[0]; i++) {
        size_t size = 0;
        unsigned char *bytes = test_read_file(test_data_path(images[i]), &size);
        assert_non_null(bytes);
        for (size_t n = 0; n < size; n++) {
            unsigned char *cut = malloc(n ? n : 1); /* exact size: sanitizers see any overread */
            memcpy(cut, bytes, n);
            struct vision_image img;
            pshard_status st = vision_image_decode(cut, n, NULL, "cut", &img);
            /* libspng does not miss the empty IEND chunk's own checksum (its last 4 bytes);
             * anything cut shorter fails. */
            if (st == PSHARD_OK && n + 4 < size) fail_msg("%s cut to %zu of %zu bytes decoded", images[i], n, size);
            if (st != PSHARD_OK) assert_non_null(strstr(pshard_last_error(), "cut"));
            vision_image_free(&img);
            free(cut);
        }
        free(bytes);
    }
    static const unsigned char text[] = "GIF89a definitely not a png";
    struct vision_image img;
    assert_int_equal(vision_image_decode(text, sizeof text, NULL, "gif", &img), PSHARD_ERR_UNSUPPORTED);
    assert_non_null(strstr(pshard_last_error(), "not a JPEG or PNG"));
    static const unsigned char fake_jpeg[] = {0xff, 0xd8, 0xff, 0xe0, 0, 16, 'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1};
    assert_int_equal(vision_image_decode(fake_jpeg, sizeof fake_jpeg, NULL, "fake", &img), PSHARD_ERR_FORMAT);
    assert_int_equal(vision_image_load("/nonexistent/x.png", NULL, &img), PSHARD_ERR_IO);
}

static void test_limits(void **state) {
    (void)state;
    struct vision_image img;
    struct vision_image_limits l = vision_image_default_limits();
    l.max_pixels = 1000; /* 40 x 30 = 1200 */
    assert_int_equal(vision_image_load(test_data_path("image/gradient_40x30.jpg"), &l, &img), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "1200 pixels, more than the limit of 1000"));
    assert_int_equal(vision_image_load(test_data_path("image/gradient_40x30.png"), &l, &img), PSHARD_ERR_RANGE);
    l = vision_image_default_limits();
    l.max_side = 32;
    assert_int_equal(vision_image_load(test_data_path("image/gradient_40x30.png"), &l, &img), PSHARD_ERR_RANGE);
    l = vision_image_default_limits();
    l.max_file_bytes = 100;
    assert_int_equal(vision_image_load(test_data_path("image/gradient_40x30.jpg"), &l, &img), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "more than the limit of 100"));
}

/* Expected values from the processor's rule run in Python (tests/py/test_vision_preprocess.py
 * checks many more against the library). */
static void test_smart_resize(void **state) {
    (void)state;
    static const struct {
        uint32_t h, w;
        uint64_t max_pixels;
        uint32_t want_h, want_w;
    } cases[] = {
        {30, 40, 12845056, 56, 84},         {480, 640, 12845056, 476, 644},    {1080, 1920, 12845056, 1092, 1932},
        {2240, 4032, 12845056, 2240, 4032}, {1, 1, 12845056, 56, 56},         {42, 70, 12845056, 56, 56}, /* 1.5, 2.5: ties to even */
        {100, 20000, 12845056, 112, 19992}, {4000, 4000, 1003520, 980, 980},  {8192, 8192, 12845056, 3584, 3584},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t h = 0, w = 0;
        assert_int_equal(vision_smart_resize(cases[i].h, cases[i].w, 28, 3136, cases[i].max_pixels, &h, &w), PSHARD_OK);
        if (h != cases[i].want_h || w != cases[i].want_w)
            fail_msg("%ux%u -> %ux%u, expected %ux%u", cases[i].w, cases[i].h, w, h, cases[i].want_w, cases[i].want_h);
    }
    uint32_t h, w;
    assert_int_equal(vision_smart_resize(100, 20001, 28, 3136, 12845056, &h, &w), PSHARD_ERR_RANGE);
    assert_non_null(strstr(pshard_last_error(), "aspect ratio"));
    assert_int_equal(vision_smart_resize(0, 10, 28, 3136, 12845056, &h, &w), PSHARD_ERR_INVALID_ARG);
}

static struct vision_hparams qwen_hparams(void) {
    struct vision_hparams hp = {.patch_size = 14, .spatial_merge = 2, .min_pixels = 3136, .max_pixels = 12845056,
                                .image_mean = {0.48145466f, 0.4578275f, 0.40821073f},
                                .image_std = {0.26862954f, 0.26130258f, 0.27577711f}};
    return hp;
}

static void test_resize_and_patches(void **state) {
    (void)state;
    /* A solid image stays solid (each pixel's weights sum to one), up or down. */
    struct vision_image solid, up, down;
    decode_file("image/solid_3x2.png", &solid);
    assert_int_equal(vision_resize_bicubic(&solid, 57, 31, &up), PSHARD_OK);
    assert_int_equal(vision_resize_bicubic(&up, 5, 4, &down), PSHARD_OK);
    for (size_t i = 0; i < 57 * 31; i++) assert_memory_equal(up.rgb + 3 * i, solid.rgb, 3);
    for (size_t i = 0; i < 5 * 4; i++) assert_memory_equal(down.rgb + 3 * i, solid.rgb, 3);
    vision_image_free(&solid), vision_image_free(&up), vision_image_free(&down);

    /* Patch order: 2x2 groups in row order, rows then columns inside a group. */
    static const uint32_t want[8][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}};
    for (uint64_t i = 0; i < 8; i++) {
        uint32_t row, col;
        vision_patch_position(6, 2, i, &row, &col);
        assert_int_equal(row, want[i][0]);
        assert_int_equal(col, want[i][1]);
    }
    uint32_t row, col;
    vision_patch_position(6, 2, 12, &row, &col); /* the first patch of the second group row */
    assert_true(row == 2 && col == 0);

    /* The whole path: 40x30 -> 84x56 (smart resize), 4x6 patches of 3x2x14x14, each value the
     * normalized resized pixel, both frames equal. */
    struct vision_hparams hp = qwen_hparams();
    struct vision_image img, resized;
    decode_file("image/gradient_40x30.png", &img);
    struct vision_patches p;
    assert_int_equal(vision_preprocess(&hp, &img, &p), PSHARD_OK);
    assert_int_equal(p.width, 84);
    assert_int_equal(p.height, 56);
    assert_int_equal(p.grid_t, 1);
    assert_int_equal(p.grid_h, 4);
    assert_int_equal(p.grid_w, 6);
    assert_int_equal(p.patch_dim, 1176);
    assert_int_equal(p.n_patches, 24);
    assert_int_equal(vision_resize_bicubic(&img, 84, 56, &resized), PSHARD_OK);
    for (uint64_t i = 0; i < p.n_patches; i++) {
        vision_patch_position(p.grid_w, 2, i, &row, &col);
        for (int c = 0; c < 3; c++)
            for (int py = 0; py < 14; py++)
                for (int px = 0; px < 14; px++) {
                    const uint8_t v = resized.rgb[(((size_t)row * 14 + py) * 84 + col * 14 + px) * 3 + c];
                    const float want_v = ((float)(v / 255.0) - hp.image_mean[c]) / hp.image_std[c];
                    const float *patch = p.data + i * p.patch_dim;
                    assert_float_equal(patch[((c * 2 + 0) * 14 + py) * 14 + px], want_v, 1e-6);
                    assert_float_equal(patch[((c * 2 + 1) * 14 + py) * 14 + px], want_v, 1e-6);
                }
    }
    /* White in every channel normalizes to (1 - mean) / std. */
    assert_float_equal(((1.0f - hp.image_mean[0]) / hp.image_std[0]), 1.9303361f, 1e-6);
    vision_patches_free(&p);
    vision_image_free(&resized);
    vision_image_free(&img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_known_images), cmocka_unit_test(test_truncated_and_garbage),
        cmocka_unit_test(test_limits),              cmocka_unit_test(test_smart_resize),
        cmocka_unit_test(test_resize_and_patches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
