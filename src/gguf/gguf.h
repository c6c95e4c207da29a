/* GGUF reader: maps a model file (or all parts of a split model) read-only, validates it fully
 * at open, and gives typed access to metadata and to the tensor table.
 *
 * File layout (little-endian): magic "GGUF", version (u32, 2 or 3), tensor count (u64),
 * metadata count (u64), the metadata key/value pairs, the tensor infos (name, n_dims, dims,
 * type, offset), padding to general.alignment (default 32), then the tensor data section.
 * Strings are a u64 length followed by that many bytes, not NUL-terminated. */
#ifndef GGUF_GGUF_H
#define GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

enum gguf_value_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

enum { GGUF_MAX_DIMS = 4 };

/* A string inside the mapped file: `len` bytes at `data`, no terminating NUL. */
struct gguf_str {
    const char *data;
    uint64_t len;
};

/* An array value: `n` elements of `type` starting at `data` (possibly unaligned). For string
 * arrays the elements are variable-length; use gguf_array_strings(). */
struct gguf_array {
    enum gguf_value_type type;
    uint64_t n;
    const uint8_t *data;
    const uint8_t *end; /* one past the last byte of the array */
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_value_type type;
    const uint8_t *value;  /* the raw value (for strings: the length prefix) */
    struct gguf_array array; /* valid when type == GGUF_TYPE_ARRAY */
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* elements per dimension, ne[0] fastest; unused dims are 1 */
    uint32_t type;             /* enum quant_type id */
    uint64_t offset;           /* within its part's data section */
    uint64_t n_bytes;
    uint32_t part;             /* which split part holds the data (0 for unsplit files) */
    const void *data;          /* into the mapping */
};

struct gguf_file;

/* Open and validate `path`. If its name is NAME-00001-of-0000N.gguf, every part is opened and
 * the tensor tables are joined (metadata comes from the first part). On failure the message
 * names the file and the problem. */
pshard_status gguf_open(const char *path, struct gguf_file **out);

/* Validate an in-memory image (used by the fuzzer and tests); `label` names it in errors.
 * The buffer must outlive the returned handle. */
pshard_status gguf_open_memory(const void *data, size_t size, const char *label, struct gguf_file **out);

void gguf_close(struct gguf_file *file);

uint32_t gguf_version(const struct gguf_file *file);
uint32_t gguf_alignment(const struct gguf_file *file);
uint32_t gguf_part_count(const struct gguf_file *file);
/* The bytes of part `index` as they are mapped (NULL, 0 when out of range). */
const void *gguf_part_image(const struct gguf_file *file, uint32_t index, size_t *size);
const char *gguf_path(const struct gguf_file *file);
uint64_t gguf_file_bytes(const struct gguf_file *file); /* all parts together */

/* Metadata. */
uint64_t gguf_kv_count(const struct gguf_file *file);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *file, uint64_t index);
const struct gguf_kv *gguf_find(const struct gguf_file *file, const char *key);
const char *gguf_type_name(enum gguf_value_type type);

/* Typed lookups. PSHARD_ERR_NOT_FOUND if the key is absent, PSHARD_ERR_FORMAT if it holds a
 * value of another kind or one that does not fit (integers convert between widths when the
 * value fits; floats accept float32/float64). */
pshard_status gguf_get_u32(const struct gguf_file *file, const char *key, uint32_t *out);
pshard_status gguf_get_u64(const struct gguf_file *file, const char *key, uint64_t *out);
pshard_status gguf_get_i64(const struct gguf_file *file, const char *key, int64_t *out);
pshard_status gguf_get_f32(const struct gguf_file *file, const char *key, float *out);
pshard_status gguf_get_bool(const struct gguf_file *file, const char *key, bool *out);
pshard_status gguf_get_str(const struct gguf_file *file, const char *key, struct gguf_str *out);
pshard_status gguf_get_array(const struct gguf_file *file, const char *key, struct gguf_array *out);

/* Scalar values of a kv (same conversions as above). */
pshard_status gguf_kv_i64(const struct gguf_kv *kv, int64_t *out);
pshard_status gguf_kv_f64(const struct gguf_kv *kv, double *out);

/* Elements of numeric arrays (index must be < n; integers of any width, floats). */
int64_t gguf_array_int(const struct gguf_array *array, uint64_t index);
double gguf_array_float(const struct gguf_array *array, uint64_t index);

/* The strings of a string array, as a malloc'ed table pointing into the mapping (free it). */
pshard_status gguf_array_strings(const struct gguf_array *array, struct gguf_str **out);

/* Tensors. */
uint64_t gguf_tensor_count(const struct gguf_file *file);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *file, uint64_t index);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *file, const char *name);

/* Compare a gguf_str with a C string. */
bool gguf_str_eq(struct gguf_str s, const char *cstr);

#endif
