/* `pshard plan --mmproj VISION.gguf --image-size WxH`: the vision encoder's phase under the plan
 * (plan_image.c). */
#ifndef PSHARD_PLAN_IMAGE_H
#define PSHARD_PLAN_IMAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/tools_api.h"

struct plan_image {
    const char *mmproj;     /* --mmproj */
    int64_t width, height;  /* --image-size; 0: not given */
    bool no_offload;        /* --no-mmproj-offload: the engine would encode on the CPU */
};

/* --image-size's value: WxH, each side a whole number from 1 to VISION_IMAGE_MAX_SIDE and at most
 * VISION_IMAGE_MAX_PIXELS in all (the limits of an image pshard decodes). 0, or -1 after a message
 * on stderr that names the option. */
int plan_image_parse_size(const char *text, struct plan_image *image);

/* Prints, after plan `plan` of language model lm (priced with prof; NULL: the defaults), the
 * image's size after the model's resize, its patches and tokens, the encoder's predicted time on
 * the GPU and the CPU, its peak VRAM, where it runs under the plan, and the first token of a
 * request with that image. Fails (with the message set) where the mmproj file cannot be read or
 * is not lm's, or lm takes no images. */
pshard_status plan_image_print(const struct model *lm, const struct plan *plan, const struct profile *prof,
                               const struct plan_image *image, FILE *out);

#endif
