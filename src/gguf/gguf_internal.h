/* What the GGUF reader's files share: one parsed image per file (part). */
#ifndef GGUF_INTERNAL_H
#define GGUF_INTERNAL_H

#include "gguf/gguf.h"

struct gguf_image {
    const uint8_t *base; /* the whole file, mapped */
    uint64_t size;
    uint32_t version, alignment;
    uint64_t n_kv, n_tensors;
    struct gguf_kv *kv;
    struct gguf_tensor *tensors;
    uint64_t data_offset; /* where the tensor data section starts */
};

/* Parse and validate the image at img->base/img->size; `label` names it in errors. Fills the
 * kv and tensor tables (free with gguf_image_free even on failure). */
pshard_status gguf_parse_image(struct gguf_image *img, const char *label);
void gguf_image_free(struct gguf_image *img);

/* Set *dup to one of the names that occurs twice, or NULL. */
pshard_status gguf_find_duplicate(const struct gguf_str *names, uint64_t n, const struct gguf_str **dup);

/* Bytes of one scalar value of a fixed-size type; 0 for strings, arrays and unknown ids. */
uint32_t gguf_scalar_bytes(enum gguf_value_type type);

#endif
