/* From a decoded image to the encoder's input, as Qwen2.5-VL's image processor (Hugging Face's
 * Qwen2VLImageProcessor) prepares it: "smart resize" to sides that are multiples of
 * patch_size x spatial_merge (28) with the total pixel count between min_pixels and max_pixels,
 * bicubic resampling, scaling to [0, 1] and normalizing with the mmproj file's mean and std,
 * then cutting into patches. A still image is repeated to fill the temporal patch (2 frames).
 *
 * Patch order and layout (what the encoder expects): patches run over 2x2 merge groups in row
 * order, and within a group over its rows then columns, so each group of spatial_merge^2
 * consecutive patches becomes one image token after the merger. Each patch is channel-major:
 * [channel][frame][row][column], 3 x 2 x 14 x 14 = 1176 floats. */
#ifndef VISION_PREPROCESS_H
#define VISION_PREPROCESS_H

#include <stdint.h>

#include "vision/image.h"
#include "vision/mmproj.h"

/* The resized height and width: each the nearest multiple of `factor` (ties to even, as Python
 * rounds), then scaled down (floor) to at most max_pixels or up (ceil) to at least min_pixels,
 * keeping the aspect ratio. Refuses an aspect ratio over 200 (the processor does too). */
pshard_status vision_smart_resize(uint32_t height, uint32_t width, uint32_t factor, uint64_t min_pixels,
                                  uint64_t max_pixels, uint32_t *out_height, uint32_t *out_width);

/* Bicubic resampling of an RGB image to out_width x out_height (see preprocess.c for the filter). */
pshard_status vision_resize_bicubic(const struct vision_image *in, uint32_t out_width, uint32_t out_height,
                                    struct vision_image *out);

struct vision_patches {
    uint32_t height, width;         /* the resized image */
    uint32_t grid_t, grid_h, grid_w; /* patches in time (1 for an image), down and across */
    uint32_t patch_dim;             /* 3 * temporal * patch_size^2 */
    uint64_t n_patches;             /* grid_t * grid_h * grid_w */
    float *data;                    /* n_patches x patch_dim */
};

/* What vision_preprocess makes of an image of width x height, without its pixels (data NULL): the
 * resized size, the grid and the patches' count and size (the planner prices an image so). */
pshard_status vision_patches_size(const struct vision_hparams *hp, uint32_t width, uint32_t height,
                                  struct vision_patches *out);
/* Resize, normalize and cut `img` for the encoder `hp` describes. */
pshard_status vision_preprocess(const struct vision_hparams *hp, const struct vision_image *img,
                                struct vision_patches *out);
void vision_patches_free(struct vision_patches *p);

/* The row and column (in patches) of patch `index` of a grid, for the 2D rotary positions. */
void vision_patch_position(uint32_t grid_w, uint32_t merge, uint64_t index, uint32_t *row, uint32_t *col);

#endif
