/* Decoding JPEG and PNG with Debian's libraries (libjpeg-turbo, libspng) into 8-bit RGB, under
 * the limits of image.h. Both decoders are told to stop rather than guess: a truncated JPEG
 * (a libjpeg warning) and a PNG with a bad checksum or missing data are errors. */
#include "vision/image.h"

#include <errno.h>
#include <spng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include "core/error.h"

struct vision_image_limits vision_image_default_limits(void) {
    return (struct vision_image_limits){VISION_IMAGE_MAX_FILE_BYTES, VISION_IMAGE_MAX_PIXELS, VISION_IMAGE_MAX_SIDE};
}

enum vision_image_format vision_image_sniff(const void *data, size_t size) {
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    const uint8_t *b = data;
    if (size >= 8 && memcmp(b, png_magic, 8) == 0) return VISION_IMAGE_PNG;
    if (size >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return VISION_IMAGE_JPEG;
    return VISION_IMAGE_UNKNOWN;
}

/* Refuse a decoded size outside the limits before allocating for it. */
static pshard_status check_size(const char *label, uint32_t width, uint32_t height, const struct vision_image_limits *l) {
    if (width == 0 || height == 0) return core_fail(PSHARD_ERR_FORMAT, "%s: image has no pixels (%ux%u)", label, width, height);
    if (width > l->max_side || height > l->max_side)
        return core_fail(PSHARD_ERR_RANGE, "%s: image is %ux%u, larger than the limit of %u pixels a side", label, width,
                         height, l->max_side);
    if ((uint64_t)width * height > l->max_pixels)
        return core_fail(PSHARD_ERR_RANGE, "%s: image is %ux%u = %llu pixels, more than the limit of %llu", label, width,
                         height, (unsigned long long)width * height, (unsigned long long)l->max_pixels);
    return PSHARD_OK;
}

static pshard_status decode_jpeg(const uint8_t *data, size_t size, const struct vision_image_limits *l, const char *label,
                                 struct vision_image *out) {
    if (size > (size_t)0x7fffffff) return core_fail(PSHARD_ERR_RANGE, "%s: JPEG too large", label);
    tjhandle tj = tjInitDecompress();
    if (!tj) return core_fail(PSHARD_ERR_NOMEM, "%s: cannot start the JPEG decoder", label);
    int width = 0, height = 0, subsamp = 0, colorspace = 0;
    pshard_status st = PSHARD_OK;
    if (tjDecompressHeader3(tj, data, (unsigned long)size, &width, &height, &subsamp, &colorspace) != 0) {
        st = core_fail(PSHARD_ERR_FORMAT, "%s: not a readable JPEG (%s)", label, tjGetErrorStr2(tj));
    } else if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
        st = core_fail(PSHARD_ERR_UNSUPPORTED, "%s: CMYK JPEG images are not supported; convert it to RGB", label);
    } else if ((st = check_size(label, (uint32_t)width, (uint32_t)height, l)) == PSHARD_OK) {
        out->rgb = malloc((size_t)width * (size_t)height * 3);
        if (!out->rgb) {
            st = core_fail(PSHARD_ERR_NOMEM, "%s: out of memory for a %dx%d image", label, width, height);
        } else if (tjDecompress2(tj, data, (unsigned long)size, out->rgb, width, 0, height, TJPF_RGB,
                                 TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
            /* Default (accurate integer) IDCT and smooth chroma upsampling, as PIL decodes. */
            st = core_fail(PSHARD_ERR_FORMAT, "%s: JPEG data is corrupt or truncated (%s)", label, tjGetErrorStr2(tj));
        } else {
            out->width = (uint32_t)width;
            out->height = (uint32_t)height;
        }
    }
    tjDestroy(tj);
    return st;
}

/* Straight alpha over white, rounded: what PIL's alpha_composite onto a white background gives
 * (the processor's convert_to_rgb) within one level. */
static void composite_on_white(const uint8_t *rgba, size_t n_pixels, uint8_t *rgb) {
    for (size_t i = 0; i < n_pixels; i++) {
        const unsigned a = rgba[4 * i + 3];
        for (int c = 0; c < 3; c++) rgb[3 * i + c] = (uint8_t)((rgba[4 * i + c] * a + 255u * (255u - a) + 127u) / 255u);
    }
}

static pshard_status decode_png(const uint8_t *data, size_t size, const struct vision_image_limits *l, const char *label,
                                struct vision_image *out) {
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return core_fail(PSHARD_ERR_NOMEM, "%s: cannot start the PNG decoder", label);
    pshard_status st = PSHARD_OK;
    uint8_t *rgba = NULL;
    struct spng_ihdr ihdr;
    size_t rgba_bytes = 0;
    int rc = spng_set_png_buffer(ctx, data, size);
    /* Bound what the decoder may hold besides the pixels: chunks no bigger than the file and at
     * most 16 MiB of cached ancillary chunks (text, ICC profiles, ...). The image size is
     * checked by check_size below, with our message, before the pixels are allocated. */
    if (!rc) rc = spng_set_chunk_limits(ctx, size, 16u << 20);
    if (!rc) rc = spng_get_ihdr(ctx, &ihdr);
    if (rc) {
        st = core_fail(PSHARD_ERR_FORMAT, "%s: not a readable PNG (%s)", label, spng_strerror(rc));
        goto done;
    }
    if ((st = check_size(label, ihdr.width, ihdr.height, l)) != PSHARD_OK) goto done;
    rc = spng_decoded_image_size(ctx, SPNG_FMT_RGBA8, &rgba_bytes);
    if (rc || rgba_bytes != (size_t)ihdr.width * ihdr.height * 4) {
        st = core_fail(PSHARD_ERR_FORMAT, "%s: PNG image size does not add up (%s)", label, spng_strerror(rc));
        goto done;
    }
    rgba = malloc(rgba_bytes);
    out->rgb = malloc((size_t)ihdr.width * ihdr.height * 3);
    if (!rgba || !out->rgb) {
        st = core_fail(PSHARD_ERR_NOMEM, "%s: out of memory for a %ux%u image", label, ihdr.width, ihdr.height);
        goto done;
    }
    /* Any bit depth and color type to 8-bit RGBA, with tRNS transparency applied. */
    rc = spng_decode_image(ctx, rgba, rgba_bytes, SPNG_FMT_RGBA8, SPNG_DECODE_TRNS);
    /* Then read on to IEND, so a file cut after its pixels (a lost checksum, no end) fails too. */
    if (!rc) rc = spng_decode_chunks(ctx);
    if (rc) {
        st = core_fail(PSHARD_ERR_FORMAT, "%s: PNG data is corrupt or truncated (%s)", label, spng_strerror(rc));
        goto done;
    }
    composite_on_white(rgba, (size_t)ihdr.width * ihdr.height, out->rgb);
    out->width = ihdr.width;
    out->height = ihdr.height;
done:
    free(rgba);
    spng_ctx_free(ctx);
    return st;
}

pshard_status vision_image_decode(const void *data, size_t size, const struct vision_image_limits *limits,
                                  const char *label, struct vision_image *out) {
    memset(out, 0, sizeof *out);
    const struct vision_image_limits l = limits ? *limits : vision_image_default_limits();
    if (!label) label = "image";
    if (!data && size) return core_fail(PSHARD_ERR_INVALID_ARG, "%s: no data", label);
    if (size > l.max_file_bytes)
        return core_fail(PSHARD_ERR_RANGE, "%s: image file is %zu bytes, more than the limit of %llu", label, size,
                         (unsigned long long)l.max_file_bytes);
    pshard_status st;
    switch (vision_image_sniff(data, size)) {
    case VISION_IMAGE_JPEG: st = decode_jpeg(data, size, &l, label, out); break;
    case VISION_IMAGE_PNG: st = decode_png(data, size, &l, label, out); break;
    default: return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: not a JPEG or PNG image", label);
    }
    if (st != PSHARD_OK) vision_image_free(out);
    return st;
}

pshard_status vision_image_read(const char *path, const struct vision_image_limits *limits, uint8_t **bytes,
                                size_t *size) {
    *bytes = NULL, *size = 0;
    const struct vision_image_limits l = limits ? *limits : vision_image_default_limits();
    FILE *f = fopen(path, "rb");
    if (!f) return core_fail(PSHARD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    pshard_status st = PSHARD_OK;
    uint8_t *data = NULL;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = core_fail(PSHARD_ERR_IO, "%s: not a regular file", path);
    } else if ((uint64_t)sb.st_size > l.max_file_bytes) {
        st = core_fail(PSHARD_ERR_RANGE, "%s: image file is %lld bytes, more than the limit of %llu", path,
                       (long long)sb.st_size, (unsigned long long)l.max_file_bytes);
    } else if (!(data = malloc(sb.st_size > 0 ? (size_t)sb.st_size : 1))) {
        st = core_fail(PSHARD_ERR_NOMEM, "%s: out of memory reading the file", path);
    } else if (fread(data, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        st = core_fail(PSHARD_ERR_IO, "%s: read failed", path);
    }
    fclose(f);
    if (st != PSHARD_OK) {
        free(data);
        return st;
    }
    *bytes = data, *size = (size_t)sb.st_size;
    return PSHARD_OK;
}

pshard_status vision_image_load(const char *path, const struct vision_image_limits *limits, struct vision_image *out) {
    memset(out, 0, sizeof *out);
    uint8_t *bytes;
    size_t size;
    CORE_TRY(vision_image_read(path, limits, &bytes, &size));
    pshard_status st = vision_image_decode(bytes, size, limits, path, out);
    free(bytes);
    return st;
}

void vision_image_free(struct vision_image *img) {
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}
