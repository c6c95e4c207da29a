/* Typed access to GGUF metadata values: integer and float conversions that refuse values
 * which do not fit, array elements, string arrays. Values may be unaligned: read by memcpy. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "gguf/gguf_internal.h"

const char *gguf_type_name(enum gguf_value_type type) {
    static const char *const names[GGUF_TYPE_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
        "bool",  "string", "array", "uint64", "int64", "float64",
    };
    return (unsigned)type < GGUF_TYPE_COUNT ? names[type] : "unknown";
}

/* Read one scalar at p as a signed or unsigned 64-bit value; false for non-integers. */
static bool read_integer(enum gguf_value_type type, const uint8_t *p, int64_t *as_signed, uint64_t *as_unsigned,
                         bool *is_unsigned) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; } v;
    *is_unsigned = true;
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: memcpy(&v.u8, p, 1); *as_unsigned = v.u8; break;
    case GGUF_TYPE_UINT16: memcpy(&v.u16, p, 2); *as_unsigned = v.u16; break;
    case GGUF_TYPE_UINT32: memcpy(&v.u32, p, 4); *as_unsigned = v.u32; break;
    case GGUF_TYPE_UINT64: memcpy(&v.u64, p, 8); *as_unsigned = v.u64; break;
    case GGUF_TYPE_INT8: memcpy(&v.i8, p, 1); *as_signed = v.i8; *is_unsigned = false; break;
    case GGUF_TYPE_INT16: memcpy(&v.i16, p, 2); *as_signed = v.i16; *is_unsigned = false; break;
    case GGUF_TYPE_INT32: memcpy(&v.i32, p, 4); *as_signed = v.i32; *is_unsigned = false; break;
    case GGUF_TYPE_INT64: memcpy(&v.i64, p, 8); *as_signed = v.i64; *is_unsigned = false; break;
    default: return false;
    }
    if (*is_unsigned) *as_signed = (int64_t)*as_unsigned;
    else *as_unsigned = (uint64_t)*as_signed;
    return true;
}

static bool read_float(enum gguf_value_type type, const uint8_t *p, double *out) {
    if (type == GGUF_TYPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
        return true;
    }
    if (type == GGUF_TYPE_FLOAT64) {
        memcpy(out, p, 8);
        return true;
    }
    return false;
}

static pshard_status wrong_type(const struct gguf_kv *kv, const char *wanted) {
    return core_fail(PSHARD_ERR_FORMAT, "metadata key '%.*s' holds a %s, expected %s", (int)kv->key.len, kv->key.data,
                     gguf_type_name(kv->type), wanted);
}

static pshard_status doesnt_fit(const struct gguf_kv *kv, const char *wanted) {
    return core_fail(PSHARD_ERR_FORMAT, "metadata key '%.*s' holds a value that does not fit in %s", (int)kv->key.len,
                     kv->key.data, wanted);
}

pshard_status gguf_kv_i64(const struct gguf_kv *kv, int64_t *out) {
    int64_t s;
    uint64_t u;
    bool is_unsigned;
    if (kv->type == GGUF_TYPE_BOOL || !read_integer(kv->type, kv->value, &s, &u, &is_unsigned))
        return wrong_type(kv, "an integer");
    if (is_unsigned && u > INT64_MAX) return doesnt_fit(kv, "int64");
    *out = s;
    return PSHARD_OK;
}

pshard_status gguf_kv_f64(const struct gguf_kv *kv, double *out) {
    if (read_float(kv->type, kv->value, out)) return PSHARD_OK;
    int64_t s;
    uint64_t u;
    bool is_unsigned;
    if (kv->type == GGUF_TYPE_BOOL || !read_integer(kv->type, kv->value, &s, &u, &is_unsigned))
        return wrong_type(kv, "a number");
    *out = is_unsigned ? (double)u : (double)s;
    return PSHARD_OK;
}

static pshard_status find(const struct gguf_file *file, const char *key, const struct gguf_kv **kv) {
    *kv = gguf_find(file, key);
    if (!*kv) return core_fail(PSHARD_ERR_NOT_FOUND, "%s: metadata key '%s' is missing", gguf_path(file), key);
    return PSHARD_OK;
}

pshard_status gguf_get_u64(const struct gguf_file *file, const char *key, uint64_t *out) {
    const struct gguf_kv *kv;
    CORE_TRY(find(file, key, &kv));
    int64_t s;
    bool is_unsigned;
    if (kv->type == GGUF_TYPE_BOOL || !read_integer(kv->type, kv->value, &s, out, &is_unsigned))
        return wrong_type(kv, "an integer");
    if (!is_unsigned && s < 0) return doesnt_fit(kv, "uint64");
    return PSHARD_OK;
}

pshard_status gguf_get_u32(const struct gguf_file *file, const char *key, uint32_t *out) {
    uint64_t v;
    CORE_TRY(gguf_get_u64(file, key, &v));
    if (v > UINT32_MAX) return doesnt_fit(gguf_find(file, key), "uint32");
    *out = (uint32_t)v;
    return PSHARD_OK;
}

pshard_status gguf_get_i64(const struct gguf_file *file, const char *key, int64_t *out) {
    const struct gguf_kv *kv;
    CORE_TRY(find(file, key, &kv));
    return gguf_kv_i64(kv, out);
}

pshard_status gguf_get_f32(const struct gguf_file *file, const char *key, float *out) {
    const struct gguf_kv *kv;
    CORE_TRY(find(file, key, &kv));
    double v;
    if (!read_float(kv->type, kv->value, &v)) return wrong_type(kv, "a float");
    *out = (float)v;
    return PSHARD_OK;
}

pshard_status gguf_get_bool(const struct gguf_file *file, const char *key, bool *out) {
    const struct gguf_kv *kv;
    CORE_TRY(find(file, key, &kv));
    if (kv->type != GGUF_TYPE_BOOL) return wrong_type(kv, "a bool");
    *out = kv->value[0] != 0;
    return PSHARD_OK;
}

pshard_status gguf_get_str(const struct gguf_file *file, const char *key, struct gguf_str *out) {
    const struct gguf_kv *kv;
    CORE_TRY(find(file, key, &kv));
    if (kv->type != GGUF_TYPE_STRING) return wrong_type(kv, "a string");
    memcpy(&out->len, kv->value, 8);
    out->data = (const char *)kv->value + 8;
    return PSHARD_OK;
}

pshard_status gguf_get_array(const struct gguf_file *file, const char *key, struct gguf_array *out) {
    const struct gguf_kv *kv;
    CORE_TRY(find(file, key, &kv));
    if (kv->type != GGUF_TYPE_ARRAY) return wrong_type(kv, "an array");
    *out = kv->array;
    return PSHARD_OK;
}

uint32_t gguf_scalar_bytes(enum gguf_value_type type) {
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

int64_t gguf_array_int(const struct gguf_array *array, uint64_t index) {
    uint32_t size = gguf_scalar_bytes(array->type);
    if (size == 0 || index >= array->n) return 0;
    const uint8_t *p = array->data + index * size;
    int64_t s;
    uint64_t u;
    bool is_unsigned;
    double f;
    if (read_integer(array->type, p, &s, &u, &is_unsigned)) return s;
    /* Floats convert only when they fit (NaN and out-of-range values read as 0). */
    if (read_float(array->type, p, &f)) return f > -9.2e18 && f < 9.2e18 ? (int64_t)f : 0;
    return 0;
}

double gguf_array_float(const struct gguf_array *array, uint64_t index) {
    uint32_t size = gguf_scalar_bytes(array->type);
    if (size == 0 || index >= array->n) return 0;
    const uint8_t *p = array->data + index * size;
    double f;
    int64_t s;
    uint64_t u;
    bool is_unsigned;
    if (read_float(array->type, p, &f)) return f;
    if (read_integer(array->type, p, &s, &u, &is_unsigned)) return is_unsigned ? (double)u : (double)s;
    return 0;
}

pshard_status gguf_array_strings(const struct gguf_array *array, struct gguf_str **out) {
    *out = NULL;
    if (array->type != GGUF_TYPE_STRING)
        return core_fail(PSHARD_ERR_FORMAT, "expected an array of strings, found an array of %s",
                         gguf_type_name(array->type));
    struct gguf_str *strings = malloc((array->n ? array->n : 1) * sizeof *strings);
    if (!strings) return core_fail(PSHARD_ERR_NOMEM, "out of memory for %" PRIu64 " strings", array->n);
    /* The parser checked every length against the array's extent when the file was opened. */
    const uint8_t *p = array->data;
    for (uint64_t i = 0; i < array->n; i++) {
        memcpy(&strings[i].len, p, 8);
        strings[i].data = (const char *)p + 8;
        p += 8 + strings[i].len;
    }
    *out = strings;
    return PSHARD_OK;
}
