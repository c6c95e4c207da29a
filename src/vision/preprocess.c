/* Qwen2.5-VL image preprocessing: smart resize, bicubic resampling, normalization, patches.
 *
 * The resampling filter is Pillow's BICUBIC, because that is what the Hugging Face processor
 * calls (transformers' resize() goes through PIL with resample=BICUBIC), so the model was
 * trained on images made by it; matching it keeps our pixels the model's pixels. It is the
 * Keys cubic convolution with a = -0.5, whose support of 2 input pixels is widened by the scale
 * factor when shrinking (so downscaling averages, i.e. antialiases, instead of skipping pixels);
 * the weights of each output pixel are normalized to sum 1 and held in 22-bit fixed point; one
 * pass runs into an 8-bit image, then the other, each rounding half up and clamping to 0..255.
 * Pillow (13) runs the horizontal pass first except when the width grows while the height
 * shrinks (then the shrinking vertical pass first), which we follow since the 8-bit rounding
 * in between makes the order visible. tests/py/test_vision_preprocess.py compares with Pillow. */
#include "vision/preprocess.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

pshard_status vision_smart_resize(uint32_t height, uint32_t width, uint32_t factor, uint64_t min_pixels,
                                  uint64_t max_pixels, uint32_t *out_height, uint32_t *out_width) {
    if (height == 0 || width == 0 || factor == 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "smart resize of a %ux%u image by %u", width, height, factor);
    const uint32_t lo = height < width ? height : width, hi = height < width ? width : height;
    if ((double)hi / lo > 200.0)
        return core_fail(PSHARD_ERR_RANGE, "image is %ux%u: an aspect ratio over 200 is refused", width, height);
    if (max_pixels < (uint64_t)factor * factor || min_pixels > max_pixels)
        return core_fail(PSHARD_ERR_INVALID_ARG, "smart resize limits %llu..%llu pixels with factor %u",
                         (unsigned long long)min_pixels, (unsigned long long)max_pixels, factor);
    const double f = factor, h = height, w = width;
    /* nearbyint rounds ties to even under the default rounding mode, as Python's round(). */
    double h_bar = nearbyint(h / f) * f, w_bar = nearbyint(w / f) * f;
    if (h_bar * w_bar > (double)max_pixels) {
        const double beta = sqrt(h * w / (double)max_pixels);
        h_bar = fmax(f, floor(h / beta / f) * f);
        w_bar = fmax(f, floor(w / beta / f) * f);
    } else if (h_bar * w_bar < (double)min_pixels) {
        const double beta = sqrt((double)min_pixels / (h * w));
        h_bar = ceil(h * beta / f) * f;
        w_bar = ceil(w * beta / f) * f;
    }
    if (h_bar < f || w_bar < f || h_bar > 1048576.0 || w_bar > 1048576.0)
        return core_fail(PSHARD_ERR_RANGE, "image %ux%u resizes to %.0fx%.0f, outside what can be encoded", width, height,
                         w_bar, h_bar);
    *out_height = (uint32_t)h_bar;
    *out_width = (uint32_t)w_bar;
    return PSHARD_OK;
}

/* ---- resampling */

enum { PRECISION_BITS = 22 };

struct coeffs {
    uint32_t ksize;  /* taps per output pixel (the widest any needs) */
    uint32_t *first; /* first input pixel of each output pixel */
    uint32_t *count; /* taps used by each output pixel */
    int32_t *k;      /* out x ksize fixed-point weights */
};

static double cubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

static void coeffs_free(struct coeffs *c) {
    free(c->first);
    free(c->count);
    free(c->k);
}

static pshard_status coeffs_make(uint32_t in_size, uint32_t out_size, struct coeffs *c) {
    memset(c, 0, sizeof *c);
    const double scale = (double)in_size / out_size, filter_scale = scale < 1.0 ? 1.0 : scale;
    const double support = 2.0 * filter_scale, inv = 1.0 / filter_scale;
    c->ksize = (uint32_t)ceil(support) * 2 + 1;
    c->first = malloc(out_size * sizeof *c->first);
    c->count = malloc(out_size * sizeof *c->count);
    c->k = calloc((size_t)out_size * c->ksize, sizeof *c->k);
    double *w = malloc(c->ksize * sizeof *w);
    if (!c->first || !c->count || !c->k || !w) {
        free(w);
        coeffs_free(c);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory for resampling weights");
    }
    for (uint32_t o = 0; o < out_size; o++) {
        const double center = (o + 0.5) * scale;
        int64_t lo = (int64_t)(center - support + 0.5), hi = (int64_t)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        const uint32_t n = (uint32_t)(hi - lo);
        double sum = 0.0;
        for (uint32_t x = 0; x < n; x++) sum += w[x] = cubic(((double)x + (double)lo - center + 0.5) * inv);
        for (uint32_t x = 0; x < n; x++) {
            const double v = sum != 0.0 ? w[x] / sum : 0.0;
            c->k[(size_t)o * c->ksize + x] = (int32_t)(v < 0.0 ? v * (1 << PRECISION_BITS) - 0.5 : v * (1 << PRECISION_BITS) + 0.5);
        }
        c->first[o] = (uint32_t)lo;
        c->count[o] = n;
    }
    free(w);
    return PSHARD_OK;
}

static inline uint8_t clamp8(int32_t acc) {
    const int32_t v = acc >> PRECISION_BITS; /* arithmetic shift: floor */
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One pass along rows (horizontal) or columns: `in` is in_w x rows, `out` out_w x rows, or the
 * transpose of that for the vertical pass (strides say which). */
static void resample_pass(const uint8_t *in, uint8_t *out, const struct coeffs *c, uint32_t n_out, uint32_t n_lines,
                          size_t in_line_stride, size_t in_step, size_t out_line_stride, size_t out_step) {
    for (uint32_t line = 0; line < n_lines; line++) {
        const uint8_t *src = in + line * in_line_stride;
        uint8_t *dst = out + line * out_line_stride;
        for (uint32_t o = 0; o < n_out; o++) {
            const int32_t *k = c->k + (size_t)o * c->ksize;
            const uint8_t *p = src + c->first[o] * in_step;
            int32_t acc[3] = {1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1)};
            for (uint32_t x = 0; x < c->count[o]; x++, p += in_step)
                for (int ch = 0; ch < 3; ch++) acc[ch] += p[ch] * k[x];
            for (int ch = 0; ch < 3; ch++) dst[o * out_step + ch] = clamp8(acc[ch]);
        }
    }
}

pshard_status vision_resize_bicubic(const struct vision_image *in, uint32_t out_width, uint32_t out_height,
                                    struct vision_image *out) {
    memset(out, 0, sizeof *out);
    if (!in->rgb || in->width == 0 || in->height == 0 || out_width == 0 || out_height == 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "resize of a %ux%u image to %ux%u", in->width, in->height, out_width, out_height);
    struct coeffs ch = {0}, cv = {0};
    uint8_t *tmp = NULL;
    pshard_status st = coeffs_make(in->width, out_width, &ch);
    if (st == PSHARD_OK) st = coeffs_make(in->height, out_height, &cv);
    const bool vertical_first = out_width > in->width && out_height < in->height;
    const uint32_t tmp_w = vertical_first ? in->width : out_width, tmp_h = vertical_first ? out_height : in->height;
    if (st == PSHARD_OK) {
        tmp = malloc((size_t)tmp_w * tmp_h * 3);
        out->rgb = malloc((size_t)out_width * out_height * 3);
        if (!tmp || !out->rgb) st = core_fail(PSHARD_ERR_NOMEM, "out of memory resizing to %ux%u", out_width, out_height);
    }
    if (st == PSHARD_OK) {
        /* A pass whose size does not change is the identity (the taps at integer offsets of the
         * cubic are 1, 0, 0), so it is a copy. */
        if (vertical_first) {
            resample_pass(in->rgb, tmp, &cv, out_height, in->width, 3, (size_t)in->width * 3, 3, (size_t)in->width * 3);
            resample_pass(tmp, out->rgb, &ch, out_width, out_height, (size_t)in->width * 3, 3, (size_t)out_width * 3, 3);
        } else {
            if (out_width == in->width)
                memcpy(tmp, in->rgb, (size_t)out_width * in->height * 3);
            else
                resample_pass(in->rgb, tmp, &ch, out_width, in->height, (size_t)in->width * 3, 3, (size_t)out_width * 3, 3);
            if (out_height == in->height)
                memcpy(out->rgb, tmp, (size_t)out_width * out_height * 3);
            else
                resample_pass(tmp, out->rgb, &cv, out_height, out_width, 3, (size_t)out_width * 3, 3, (size_t)out_width * 3);
        }
        out->width = out_width;
        out->height = out_height;
    } else {
        free(out->rgb);
        out->rgb = NULL;
    }
    free(tmp);
    coeffs_free(&ch);
    coeffs_free(&cv);
    return st;
}

/* ---- normalization and patches */

void vision_patch_position(uint32_t grid_w, uint32_t merge, uint64_t index, uint32_t *row, uint32_t *col) {
    const uint64_t group = index / ((uint64_t)merge * merge), within = index % ((uint64_t)merge * merge);
    const uint32_t groups_across = grid_w / merge;
    *row = (uint32_t)(group / groups_across) * merge + (uint32_t)(within / merge);
    *col = (uint32_t)(group % groups_across) * merge + (uint32_t)(within % merge);
}

pshard_status vision_patches_size(const struct vision_hparams *hp, uint32_t width, uint32_t height,
                                  struct vision_patches *out) {
    memset(out, 0, sizeof *out);
    const uint32_t p = hp->patch_size, m = hp->spatial_merge, t = VISION_TEMPORAL_PATCH;
    uint32_t h, w;
    CORE_TRY(vision_smart_resize(height, width, p * m, hp->min_pixels, hp->max_pixels, &h, &w));
    out->height = h;
    out->width = w;
    out->grid_t = 1;
    out->grid_h = h / p;
    out->grid_w = w / p;
    out->patch_dim = 3 * t * p * p;
    out->n_patches = (uint64_t)out->grid_h * out->grid_w;
    return PSHARD_OK;
}

pshard_status vision_preprocess(const struct vision_hparams *hp, const struct vision_image *img,
                                struct vision_patches *out) {
    CORE_TRY(vision_patches_size(hp, img->width, img->height, out));
    const uint32_t p = hp->patch_size, m = hp->spatial_merge, t = VISION_TEMPORAL_PATCH, h = out->height, w = out->width;
    struct vision_image resized = *img, owned = {0};
    if (h != img->height || w != img->width) {
        CORE_TRY(vision_resize_bicubic(img, w, h, &owned));
        resized = owned;
    }
    out->data = malloc(out->n_patches * out->patch_dim * sizeof *out->data);
    if (!out->data) {
        vision_image_free(&owned);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory for %llu patches", (unsigned long long)out->n_patches);
    }
    /* Scale then normalize in float32, as the processor does (x * (1/255) computed in double and
     * stored as float32, then (x - mean) / std in float32): one table per channel. */
    float table[3][256];
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) {
            const float scaled = (float)((double)v * (1.0 / 255.0));
            table[c][v] = (scaled - hp->image_mean[c]) / hp->image_std[c];
        }
    for (uint64_t i = 0; i < out->n_patches; i++) {
        uint32_t row, col;
        vision_patch_position(out->grid_w, m, i, &row, &col);
        float *dst = out->data + i * out->patch_dim;
        for (uint32_t c = 0; c < 3; c++)
            for (uint32_t py = 0; py < p; py++) {
                const uint8_t *src = resized.rgb + (((size_t)row * p + py) * w + (size_t)col * p) * 3 + c;
                float *d0 = dst + ((size_t)c * t * p + py) * p;
                for (uint32_t px = 0; px < p; px++) d0[px] = table[c][src[3 * px]];
                for (uint32_t f = 1; f < t; f++) memcpy(d0 + (size_t)f * p * p, d0, p * sizeof *d0); /* a still image repeats */
            }
    }
    vision_image_free(&owned);
    return PSHARD_OK;
}

void vision_patches_free(struct vision_patches *p) {
    free(p->data);
    memset(p, 0, sizeof *p);
}
