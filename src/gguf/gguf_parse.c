/* Parsing and validating one GGUF image (header, metadata, tensor infos) held in memory.
 * Every read is bounds-checked against the image; every count and size is checked for
 * overflow before it is used, so a hostile file gives an error, never a bad read. */
#include "gguf/gguf_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/types.h"

enum {
    GGUF_MAX_KEY_BYTES = 65536,
    GGUF_MAX_NAME_BYTES = 4096,
    GGUF_MAX_ALIGNMENT = 1u << 20,
};
/* No dimension of a real model comes near this; it keeps element counts far from overflow. */
#define GGUF_MAX_DIM ((int64_t)1 << 40)
#define GGUF_MAX_ELEMS ((int64_t)1 << 50)

struct cursor {
    const uint8_t *base, *p, *end;
    const char *label;
};

static pshard_status truncated(const struct cursor *c, const char *what) {
    return core_fail(PSHARD_ERR_FORMAT, "%s: file is truncated at byte %zu while reading %s", c->label,
                     (size_t)(c->p - c->base), what);
}

static pshard_status take(struct cursor *c, uint64_t n, const char *what, const uint8_t **out) {
    if (n > (uint64_t)(c->end - c->p)) return truncated(c, what);
    *out = c->p;
    c->p += n;
    return PSHARD_OK;
}

static pshard_status read_u32(struct cursor *c, const char *what, uint32_t *out) {
    const uint8_t *bytes = NULL;
    CORE_TRY(take(c, 4, what, &bytes));
    memcpy(out, bytes, 4);
    return PSHARD_OK;
}

static pshard_status read_u64(struct cursor *c, const char *what, uint64_t *out) {
    const uint8_t *bytes = NULL;
    CORE_TRY(take(c, 8, what, &bytes));
    memcpy(out, bytes, 8);
    return PSHARD_OK;
}

static pshard_status read_str(struct cursor *c, const char *what, uint64_t max_len, struct gguf_str *out) {
    uint64_t len;
    const uint8_t *bytes = NULL;
    CORE_TRY(read_u64(c, what, &len));
    if (len > max_len)
        return core_fail(PSHARD_ERR_FORMAT, "%s: %s at byte %zu is %" PRIu64 " bytes long (limit %" PRIu64 ")",
                         c->label, what, (size_t)(c->p - c->base - 8), len, max_len);
    CORE_TRY(take(c, len, what, &bytes));
    out->data = (const char *)bytes;
    out->len = len;
    return PSHARD_OK;
}

static pshard_status check_bools(const struct cursor *c, const struct gguf_str *key, const uint8_t *v, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (v[i] > 1)
            return core_fail(PSHARD_ERR_FORMAT, "%s: key '%.*s' holds a bool of value %u (must be 0 or 1)",
                             c->label, (int)key->len, key->data, v[i]);
    return PSHARD_OK;
}

static pshard_status parse_array(struct cursor *c, const struct gguf_str *key, struct gguf_array *array) {
    uint32_t elem_type;
    CORE_TRY(read_u32(c, "array element type", &elem_type));
    CORE_TRY(read_u64(c, "array length", &array->n));
    array->type = (enum gguf_value_type)elem_type;
    array->data = c->p;
    if (elem_type == GGUF_TYPE_ARRAY)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: key '%.*s' is an array of arrays, which pshard does not read",
                         c->label, (int)key->len, key->data);
    if (elem_type == GGUF_TYPE_STRING) {
        /* Each string needs at least its 8-byte length: a cheap bound before walking them. */
        if (array->n > (uint64_t)(c->end - c->p) / 8) return truncated(c, "string array");
        for (uint64_t i = 0; i < array->n; i++) {
            struct gguf_str s;
            CORE_TRY(read_str(c, "string array element", UINT64_MAX, &s));
        }
    } else {
        uint32_t elem_bytes = gguf_scalar_bytes((enum gguf_value_type)elem_type);
        if (elem_bytes == 0)
            return core_fail(PSHARD_ERR_FORMAT, "%s: key '%.*s' is an array of unknown value type %u", c->label,
                             (int)key->len, key->data, elem_type);
        if (array->n > (uint64_t)(c->end - c->p) / elem_bytes) return truncated(c, "array data");
        const uint8_t *bytes = NULL;
        CORE_TRY(take(c, array->n * elem_bytes, "array data", &bytes));
        if (elem_type == GGUF_TYPE_BOOL) CORE_TRY(check_bools(c, key, bytes, array->n));
    }
    array->end = c->p;
    return PSHARD_OK;
}

static pshard_status parse_kv(struct cursor *c, struct gguf_kv *kv) {
    uint32_t type;
    CORE_TRY(read_str(c, "metadata key", GGUF_MAX_KEY_BYTES, &kv->key));
    if (kv->key.len == 0) return core_fail(PSHARD_ERR_FORMAT, "%s: empty metadata key", c->label);
    CORE_TRY(read_u32(c, "metadata value type", &type));
    kv->type = (enum gguf_value_type)type;
    kv->value = c->p;
    if (type == GGUF_TYPE_STRING) {
        struct gguf_str s;
        return read_str(c, "metadata string", UINT64_MAX, &s);
    }
    if (type == GGUF_TYPE_ARRAY) return parse_array(c, &kv->key, &kv->array);
    uint32_t bytes = gguf_scalar_bytes(kv->type);
    if (bytes == 0)
        return core_fail(PSHARD_ERR_FORMAT, "%s: key '%.*s' has unknown value type %u", c->label, (int)kv->key.len,
                         kv->key.data, type);
    const uint8_t *value = NULL;
    CORE_TRY(take(c, bytes, "metadata value", &value));
    if (type == GGUF_TYPE_BOOL) CORE_TRY(check_bools(c, &kv->key, value, 1));
    return PSHARD_OK;
}

static pshard_status parse_tensor_info(struct cursor *c, struct gguf_tensor *t) {
    CORE_TRY(read_str(c, "tensor name", GGUF_MAX_NAME_BYTES, &t->name));
    if (t->name.len == 0) return core_fail(PSHARD_ERR_FORMAT, "%s: a tensor has an empty name", c->label);
    CORE_TRY(read_u32(c, "tensor dimension count", &t->n_dims));
    const int name_len = (int)t->name.len;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' has %u dimensions (1 to %d allowed)", c->label,
                         name_len, t->name.data, t->n_dims, GGUF_MAX_DIMS);
    int64_t n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t dim = 1;
        if (d < t->n_dims) CORE_TRY(read_u64(c, "tensor dimension", &dim));
        if (dim == 0 || dim > (uint64_t)GGUF_MAX_DIM)
            return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' has an absurd dimension %u of size %" PRIu64,
                             c->label, name_len, t->name.data, d, dim);
        t->ne[d] = (int64_t)dim;
        if (n_elems > GGUF_MAX_ELEMS / (int64_t)dim)
            return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' has too many elements", c->label, name_len,
                             t->name.data);
        n_elems *= (int64_t)dim;
    }
    CORE_TRY(read_u32(c, "tensor type", &t->type));
    CORE_TRY(read_u64(c, "tensor offset", &t->offset));
    const struct quant_type_info *info = quant_type_info(t->type);
    if (!info)
        return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' has unknown type id %u", c->label, name_len,
                         t->name.data, t->type);
    if (t->ne[0] % info->block_elems != 0)
        return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' of type %s has a row of %" PRId64
                         " elements, not a multiple of its block size %u", c->label, name_len, t->name.data,
                         info->name, t->ne[0], info->block_elems);
    /* n_elems < 2^50 and block_bytes / block_elems <= 8, so this cannot overflow. */
    t->n_bytes = (uint64_t)(n_elems / info->block_elems) * info->block_bytes;
    return PSHARD_OK;
}

static uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

static pshard_status read_alignment(struct gguf_image *img, const char *label) {
    img->alignment = 32;
    for (uint64_t i = 0; i < img->n_kv; i++) {
        const struct gguf_kv *kv = &img->kv[i];
        if (!gguf_str_eq(kv->key, "general.alignment")) continue;
        int64_t value;
        /* (the format asks a multiple of 8: less would leave F32 weights misaligned) */
        if (kv->type != GGUF_TYPE_UINT32 || gguf_kv_i64(kv, &value) != PSHARD_OK || value < 8 ||
            value > GGUF_MAX_ALIGNMENT || (value & (value - 1)) != 0)
            return core_fail(PSHARD_ERR_FORMAT, "%s: general.alignment must be a power of two uint32 from 8 to %u",
                             label, GGUF_MAX_ALIGNMENT);
        img->alignment = (uint32_t)value;
    }
    return PSHARD_OK;
}

/* Keys must be unique: a sorted copy of the key list finds duplicates in n log n. */
static int compare_str(const void *a, const void *b) {
    const struct gguf_str *x = a, *y = b;
    uint64_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->data, y->data, n);
    if (r) return r;
    return (x->len > y->len) - (x->len < y->len);
}

pshard_status gguf_find_duplicate(const struct gguf_str *names, uint64_t n, const struct gguf_str **dup) {
    *dup = NULL;
    if (n < 2) return PSHARD_OK;
    struct gguf_str *sorted = malloc(n * sizeof *sorted);
    if (!sorted) return core_fail(PSHARD_ERR_NOMEM, "out of memory checking %" PRIu64 " names", n);
    memcpy(sorted, names, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, compare_str);
    for (uint64_t i = 1; i < n && !*dup; i++)
        if (compare_str(&sorted[i - 1], &sorted[i]) == 0)
            for (uint64_t j = 0; j < n; j++)
                if (compare_str(&names[j], &sorted[i]) == 0) { *dup = &names[j]; break; }
    free(sorted);
    return PSHARD_OK;
}

static pshard_status check_unique_keys(const struct gguf_image *img, const char *label) {
    struct gguf_str *keys = malloc((img->n_kv ? img->n_kv : 1) * sizeof *keys);
    if (!keys) return core_fail(PSHARD_ERR_NOMEM, "%s: out of memory", label);
    for (uint64_t i = 0; i < img->n_kv; i++) keys[i] = img->kv[i].key;
    const struct gguf_str *dup;
    pshard_status st = gguf_find_duplicate(keys, img->n_kv, &dup);
    if (st == PSHARD_OK && dup)
        st = core_fail(PSHARD_ERR_FORMAT, "%s: metadata key '%.*s' appears more than once", label, (int)dup->len,
                       dup->data);
    free(keys);
    return st;
}

static pshard_status place_tensors(struct gguf_image *img, const char *label) {
    for (uint64_t i = 0; i < img->n_tensors; i++) {
        struct gguf_tensor *t = &img->tensors[i];
        const int name_len = (int)t->name.len;
        if (t->offset % img->alignment != 0)
            return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' has offset %" PRIu64
                             ", not a multiple of the alignment %u", label, name_len, t->name.data, t->offset,
                             img->alignment);
        uint64_t data_bytes = img->size - img->data_offset;
        if (t->offset > data_bytes || t->n_bytes > data_bytes - t->offset)
            return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%.*s' (%" PRIu64 " bytes at offset %" PRIu64
                             ") lies outside the file's %" PRIu64 " data bytes", label, name_len, t->name.data,
                             t->n_bytes, t->offset, data_bytes);
        t->data = img->base + img->data_offset + t->offset;
    }
    return PSHARD_OK;
}

pshard_status gguf_parse_image(struct gguf_image *img, const char *label) {
    struct cursor c = {img->base, img->base, img->base + img->size, label};
    uint32_t magic;
    if (img->size < 4 || memcmp(img->base, "GGUF", 4) != 0)
        return core_fail(PSHARD_ERR_FORMAT, "%s: not a GGUF file (bad magic)", label);
    CORE_TRY(read_u32(&c, "magic", &magic));
    CORE_TRY(read_u32(&c, "version", &img->version));
    if (img->version == 1)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: GGUF version 1 is obsolete; convert the model again", label);
    if (img->version != 2 && img->version != 3)
        return core_fail(PSHARD_ERR_FORMAT, "%s: unknown GGUF version %u (2 and 3 are supported)", label,
                         img->version);
    CORE_TRY(read_u64(&c, "tensor count", &img->n_tensors));
    CORE_TRY(read_u64(&c, "metadata count", &img->n_kv));
    /* A key/value takes at least 13 bytes and a tensor info 32: bound the counts by the file. */
    uint64_t left = (uint64_t)(c.end - c.p);
    if (img->n_kv > left / 13)
        return core_fail(PSHARD_ERR_FORMAT, "%s: metadata count %" PRIu64 " cannot fit in the file", label, img->n_kv);
    if (img->n_tensors > left / 32)
        return core_fail(PSHARD_ERR_FORMAT, "%s: tensor count %" PRIu64 " cannot fit in the file", label,
                         img->n_tensors);
    img->kv = calloc(img->n_kv ? img->n_kv : 1, sizeof *img->kv);
    img->tensors = calloc(img->n_tensors ? img->n_tensors : 1, sizeof *img->tensors);
    if (!img->kv || !img->tensors) return core_fail(PSHARD_ERR_NOMEM, "%s: out of memory reading the header", label);
    for (uint64_t i = 0; i < img->n_kv; i++) CORE_TRY(parse_kv(&c, &img->kv[i]));
    CORE_TRY(check_unique_keys(img, label));
    CORE_TRY(read_alignment(img, label));
    for (uint64_t i = 0; i < img->n_tensors; i++) CORE_TRY(parse_tensor_info(&c, &img->tensors[i]));
    img->data_offset = align_up((uint64_t)(c.p - c.base), img->alignment);
    if (img->data_offset > img->size) {
        if (img->n_tensors > 0) return truncated(&c, "padding before the tensor data");
        img->data_offset = img->size;
    }
    return place_tensors(img, label);
}

void gguf_image_free(struct gguf_image *img) {
    free(img->kv);
    free(img->tensors);
    img->kv = NULL;
    img->tensors = NULL;
}
