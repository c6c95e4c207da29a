/* GGUF v3 bytes: a growing buffer, typed metadata values and the header with tensor infos.
 * Layout: "GGUF", version, tensor count, kv count, kvs, tensor infos, padding, data. All
 * integers little-endian; a string is a u64 length and its bytes (no NUL). */
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h" /* the value type ids the reader uses */
#include "synth.h"

void synth_buf_free(struct synth_buf *buf) {
    free(buf->data);
    *buf = (struct synth_buf){0};
}

static bool buf_reserve(struct synth_buf *buf, size_t extra) {
    if (buf->failed) return false;
    if (buf->len + extra <= buf->cap) return true;
    size_t cap = buf->cap ? buf->cap : 4096;
    while (cap < buf->len + extra) cap *= 2;
    uint8_t *data = realloc(buf->data, cap);
    if (!data) {
        buf->failed = true;
        return false;
    }
    buf->data = data;
    buf->cap = cap;
    return true;
}

void synth_buf_put(struct synth_buf *buf, const void *bytes, size_t n) {
    if (!buf_reserve(buf, n)) return;
    memcpy(buf->data + buf->len, bytes, n);
    buf->len += n;
}

/* The machines we run on are little-endian, as GGUF is; memcpy keeps it alignment-safe. */
void synth_buf_u32(struct synth_buf *buf, uint32_t v) { synth_buf_put(buf, &v, sizeof v); }
void synth_buf_u64(struct synth_buf *buf, uint64_t v) { synth_buf_put(buf, &v, sizeof v); }

void synth_buf_str(struct synth_buf *buf, const char *s) {
    size_t n = strlen(s);
    synth_buf_u64(buf, n);
    synth_buf_put(buf, s, n);
}

static void kv_key(struct synth_kv *kv, const char *key, uint32_t type) {
    synth_buf_str(&kv->buf, key);
    synth_buf_u32(&kv->buf, type);
    kv->count++;
}

void synth_kv_str(struct synth_kv *kv, const char *key, const char *value) {
    kv_key(kv, key, GGUF_TYPE_STRING);
    synth_buf_str(&kv->buf, value);
}

void synth_kv_u32(struct synth_kv *kv, const char *key, uint32_t value) {
    kv_key(kv, key, GGUF_TYPE_UINT32);
    synth_buf_u32(&kv->buf, value);
}

void synth_kv_u64(struct synth_kv *kv, const char *key, uint64_t value) {
    kv_key(kv, key, GGUF_TYPE_UINT64);
    synth_buf_u64(&kv->buf, value);
}

void synth_kv_f32(struct synth_kv *kv, const char *key, float value) {
    kv_key(kv, key, GGUF_TYPE_FLOAT32);
    synth_buf_put(&kv->buf, &value, sizeof value);
}

void synth_kv_bool(struct synth_kv *kv, const char *key, bool value) {
    kv_key(kv, key, GGUF_TYPE_BOOL);
    uint8_t byte = value ? 1 : 0;
    synth_buf_put(&kv->buf, &byte, 1);
}

void synth_kv_str_array(struct synth_kv *kv, const char *key, char *const *values, size_t n) {
    kv_key(kv, key, GGUF_TYPE_ARRAY);
    synth_buf_u32(&kv->buf, GGUF_TYPE_STRING);
    synth_buf_u64(&kv->buf, n);
    for (size_t i = 0; i < n; i++) synth_buf_str(&kv->buf, values[i]);
}

void synth_kv_i32_array(struct synth_kv *kv, const char *key, const int32_t *values, size_t n) {
    kv_key(kv, key, GGUF_TYPE_ARRAY);
    synth_buf_u32(&kv->buf, GGUF_TYPE_INT32);
    synth_buf_u64(&kv->buf, n);
    synth_buf_put(&kv->buf, values, n * sizeof *values);
}

void synth_kv_f32_array(struct synth_kv *kv, const char *key, const float *values, size_t n) {
    kv_key(kv, key, GGUF_TYPE_ARRAY);
    synth_buf_u32(&kv->buf, GGUF_TYPE_FLOAT32);
    synth_buf_u64(&kv->buf, n);
    synth_buf_put(&kv->buf, values, n * sizeof *values);
}

pshard_status synth_gguf_header(struct synth_buf *out, const struct synth_kv *kv,
                                const struct synth_model *model) {
    synth_buf_put(out, "GGUF", 4);
    synth_buf_u32(out, 3);
    synth_buf_u64(out, model->n_tensors);
    synth_buf_u64(out, kv->count);
    synth_buf_put(out, kv->buf.data, kv->buf.len);
    for (size_t i = 0; i < model->n_tensors; i++) {
        const struct synth_tensor *t = &model->tensors[i];
        synth_buf_str(out, t->name);
        synth_buf_u32(out, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) synth_buf_u64(out, (uint64_t)t->ne[d]);
        synth_buf_u32(out, (uint32_t)t->type);
        synth_buf_u64(out, t->offset);
    }
    static const uint8_t zeros[SYNTH_ALIGNMENT];
    size_t pad = (SYNTH_ALIGNMENT - out->len % SYNTH_ALIGNMENT) % SYNTH_ALIGNMENT;
    synth_buf_put(out, zeros, pad);
    if (out->failed || kv->buf.failed)
        return core_fail(PSHARD_ERR_NOMEM, "out of memory building the GGUF header");
    return PSHARD_OK;
}
