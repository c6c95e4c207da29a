/* Images in: JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libspng) decoded to 8-bit RGB, with
 * the file size and the decoded size checked against stated limits before any pixel buffer is
 * allocated. Untrusted bytes, so every failure (not an image, truncated, corrupt, too large) is
 * an error with a message, never a crash; tests/fuzz/fuzz_image.c holds the decoders to that.
 *
 * What the Qwen2-VL processor sees is PIL's RGB conversion of the file, so we match it: gray
 * and palette images become RGB, and transparency is composited over white. EXIF orientation
 * is not applied (PIL does not apply it on open either). */
#ifndef VISION_IMAGE_H
#define VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

/* Default limits: a 64 MiB file, 50 million decoded pixels (8K UHD is 33.2 million), and 16384
 * pixels a side; a larger image is refused with an error that says which limit it broke. */
enum {
    VISION_IMAGE_MAX_FILE_BYTES = 64 << 20,
    VISION_IMAGE_MAX_PIXELS = 50000000,
    VISION_IMAGE_MAX_SIDE = 16384,
};

struct vision_image_limits {
    uint64_t max_file_bytes;
    uint64_t max_pixels;
    uint32_t max_side;
};

/* An 8-bit RGB image, rows top to bottom, 3 bytes a pixel, no padding. */
struct vision_image {
    uint32_t width, height;
    uint8_t *rgb;
};

enum vision_image_format { VISION_IMAGE_UNKNOWN, VISION_IMAGE_JPEG, VISION_IMAGE_PNG };

struct vision_image_limits vision_image_default_limits(void);

/* The format by its magic bytes. */
enum vision_image_format vision_image_sniff(const void *data, size_t size);

/* Decode `size` bytes. `limits` NULL means the defaults; `label` names the input in errors. */
pshard_status vision_image_decode(const void *data, size_t size, const struct vision_image_limits *limits,
                                  const char *label, struct vision_image *out);

/* Read a file's bytes (its size checked against the limit first); *bytes is malloc'd. */
pshard_status vision_image_read(const char *path, const struct vision_image_limits *limits, uint8_t **bytes,
                                size_t *size);

/* Read and decode a file (its size is checked before it is read). */
pshard_status vision_image_load(const char *path, const struct vision_image_limits *limits, struct vision_image *out);

void vision_image_free(struct vision_image *img);

#endif
