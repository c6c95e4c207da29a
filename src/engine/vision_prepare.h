/* An image's work before its encoder, which needs no context: its bytes (a file read, or given),
 * their identity (what a context keeps the encoded image under), and its patches (decoded,
 * resized, normalized and cut as the encoder takes them). The one-sequence calls and requests do it on the stepping
 * thread for images given as bytes; pshard_image_prepare does it on any thread beforehand. */
#ifndef ENGINE_VISION_PREPARE_H
#define ENGINE_VISION_PREPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"
#include "vision/mmproj.h"
#include "vision/preprocess.h"

/* Two independent 64-bit hashes of an image's bytes and their count. */
struct engine_image_id {
    uint64_t hash[2];
    size_t size;
};

struct pshard_prepared_image {
    struct engine_image_id id;
    struct vision_patches patches;
    /* The encoder settings they followed, checked against the encoder that takes them. */
    uint32_t patch_size, spatial_merge;
    uint64_t min_pixels, max_pixels;
    float image_mean[3], image_std[3];
};

/* The bytes of image `index` of a prompt (read from its file, or as given), under the decoder's
 * size limit, with their identity; label: its path, or "image N" (N = index + 1). *owned is what
 * was read (free it); *bytes points into it or into the caller's data. */
pshard_status engine_image_bytes(const pshard_image *im, int32_t index, uint8_t **owned, const uint8_t **bytes,
                                 struct engine_image_id *id, char *label, size_t label_size);

/* Decode `size` bytes and cut them into the patches the encoder `hp` takes (labelled in errors). */
pshard_status engine_image_patches(const struct vision_hparams *hp, const uint8_t *bytes, size_t size, const char *label,
                                   struct vision_patches *out);

/* Whether image p was prepared for an encoder that prepares images as hp says. */
bool engine_prepared_fits(const pshard_prepared_image *p, const struct vision_hparams *hp);

#endif
