/* An image's work before its encoder: its bytes and their identity, its patches (engine/
 * vision_prepare.h), and the public preparer that does it on any thread. */
#include "engine/vision_prepare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/vision.h"
#include "vision/image.h"

struct pshard_image_preparer {
    struct vision_hparams hp; /* a copy: the preparer outlives the context's encoder */
};

/* FNV-1a, and a multiply-rotate over 8-byte words. */
static void content_hash(const uint8_t *p, size_t n, uint64_t h[2]) {
    uint64_t a = 0xcbf29ce484222325ull, b = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) a = (a ^ p[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        memcpy(&w, p + i, n - i < 8 ? n - i : 8);
        b = ((b ^ w) * 0xff51afd7ed558ccdull);
        b = (b << 31) | (b >> 33);
    }
    h[0] = a, h[1] = b;
}

pshard_status engine_image_bytes(const pshard_image *im, int32_t index, uint8_t **owned, const uint8_t **bytes,
                                 struct engine_image_id *id, char *label, size_t label_size) {
    *owned = NULL;
    if (im->path) {
        snprintf(label, label_size, "%s", im->path);
        CORE_TRY(vision_image_read(im->path, NULL, owned, &id->size));
        *bytes = *owned;
    } else {
        snprintf(label, label_size, "image %d", index + 1);
        if (!im->data || !im->size) return core_fail(PSHARD_ERR_INVALID_ARG, "%s: neither a path nor bytes", label);
        if (im->size > VISION_IMAGE_MAX_FILE_BYTES)
            return core_fail(PSHARD_ERR_RANGE, "%s: %zu bytes, more than the limit of %d", label, im->size,
                             (int)VISION_IMAGE_MAX_FILE_BYTES);
        *bytes = im->data, id->size = im->size;
    }
    content_hash(*bytes, id->size, id->hash);
    return PSHARD_OK;
}

pshard_status engine_image_patches(const struct vision_hparams *hp, const uint8_t *bytes, size_t size, const char *label,
                                   struct vision_patches *out) {
    memset(out, 0, sizeof *out);
    struct vision_image img;
    CORE_TRY(vision_image_decode(bytes, size, NULL, label, &img));
    const pshard_status st = vision_preprocess(hp, &img, out);
    vision_image_free(&img);
    if (st != PSHARD_OK) return core_fail_context(st, "%s: ", label);
    return PSHARD_OK;
}

bool engine_prepared_fits(const pshard_prepared_image *p, const struct vision_hparams *hp) {
    return p->patch_size == hp->patch_size && p->spatial_merge == hp->spatial_merge && p->min_pixels == hp->min_pixels &&
           p->max_pixels == hp->max_pixels && !memcmp(p->image_mean, hp->image_mean, sizeof p->image_mean) &&
           !memcmp(p->image_std, hp->image_std, sizeof p->image_std);
}

/* ---- the public preparer */

pshard_status pshard_image_preparer_create(const pshard_ctx *ctx, pshard_image_preparer **out) {
    *out = NULL;
    const struct vision_hparams *hp = ctx ? engine_vision_hparams(ctx) : NULL;
    if (!hp)
        return core_fail(PSHARD_ERR_INVALID_ARG, "images need the model's vision encoder: load its mmproj file (--mmproj)");
    pshard_image_preparer *p = malloc(sizeof *p);
    if (!p) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    p->hp = *hp;
    *out = p;
    return PSHARD_OK;
}

void pshard_image_preparer_free(pshard_image_preparer *preparer) { free(preparer); }

pshard_status pshard_image_prepare(const pshard_image_preparer *preparer, const pshard_image *image, int32_t index,
                                   pshard_prepared_image **out) {
    *out = NULL;
    if (!preparer || !image || index < 0) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_image_prepare: a bad argument");
    if (image->prepared) return core_fail(PSHARD_ERR_INVALID_ARG, "image %d: prepared already", index + 1);
    pshard_prepared_image *p = calloc(1, sizeof *p);
    if (!p) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    const struct vision_hparams *hp = &preparer->hp;
    p->patch_size = hp->patch_size, p->spatial_merge = hp->spatial_merge;
    p->min_pixels = hp->min_pixels, p->max_pixels = hp->max_pixels;
    memcpy(p->image_mean, hp->image_mean, sizeof p->image_mean);
    memcpy(p->image_std, hp->image_std, sizeof p->image_std);
    char label[512];
    uint8_t *owned;
    const uint8_t *bytes;
    pshard_status st = engine_image_bytes(image, index, &owned, &bytes, &p->id, label, sizeof label);
    if (st == PSHARD_OK) st = engine_image_patches(hp, bytes, p->id.size, label, &p->patches);
    free(owned);
    if (st == PSHARD_OK) *out = p;
    else pshard_prepared_image_free(p);
    return st;
}

void pshard_prepared_image_free(pshard_prepared_image *image) {
    if (!image) return;
    vision_patches_free(&image->patches);
    free(image);
}

size_t pshard_prepared_image_bytes(const pshard_prepared_image *image) {
    if (!image) return 0;
    return sizeof *image + sizeof(float) * (size_t)image->patches.n_patches * image->patches.patch_dim;
}
