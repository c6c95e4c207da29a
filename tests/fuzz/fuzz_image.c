/* libFuzzer target for images in: any byte string must decode as a JPEG or PNG or fail with a
 * message; what decodes is then preprocessed for a Qwen2.5-VL encoder (smart resize, bicubic
 * resampling, normalization, patches) and every patch value is read. Limits are smaller than
 * the library's defaults so each input runs in milliseconds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vision/image.h"
#include "vision/preprocess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy, so reading one byte past the input is caught. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    const struct vision_image_limits limits = {.max_file_bytes = 1 << 20, .max_pixels = 1 << 20, .max_side = 4096};
    struct vision_image img;
    if (vision_image_decode(copy, size, &limits, "fuzz", &img) == PSHARD_OK) {
        /* At most 256 image tokens (200,704 pixels) after resizing. */
        struct vision_hparams hp = {.patch_size = 14, .spatial_merge = 2, .min_pixels = 3136, .max_pixels = 200704,
                                    .image_mean = {0.5f, 0.5f, 0.5f}, .image_std = {0.25f, 0.25f, 0.25f}};
        struct vision_patches p;
        if (vision_preprocess(&hp, &img, &p) == PSHARD_OK) {
            volatile float sink = 0.0f;
            for (uint64_t i = 0; i < p.n_patches * p.patch_dim; i++) sink += p.data[i];
            (void)sink;
            vision_patches_free(&p);
        }
        vision_image_free(&img);
    }
    free(copy);
    return 0;
}
