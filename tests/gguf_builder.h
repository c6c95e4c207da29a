/* A small in-memory GGUF v3 writer for tests that need files with one key or tensor wrong:
 * metadata of a few types, tensor infos, and a zeroed data section. Test code only. */
#ifndef TEST_GGUF_BUILDER_H
#define TEST_GGUF_BUILDER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TB_MAX_TENSORS = 512 };

struct tb_tensor {
    char name[96];
    uint32_t n_dims, type; /* type: 0 F32, 1 F16 */
    uint64_t ne[4];
};

struct tb_file {
    uint8_t *kv;
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    struct tb_tensor tensors[TB_MAX_TENSORS];
    uint32_t n_tensors;
};

static inline void tb_put(struct tb_file *f, const void *data, size_t n) {
    if (f->kv_len + n > f->kv_cap) {
        f->kv_cap = (f->kv_len + n) * 2 + 256;
        f->kv = realloc(f->kv, f->kv_cap);
    }
    memcpy(f->kv + f->kv_len, data, n);
    f->kv_len += n;
}

static inline void tb_u32(struct tb_file *f, uint32_t v) { tb_put(f, &v, 4); }
static inline void tb_u64(struct tb_file *f, uint64_t v) { tb_put(f, &v, 8); }
static inline void tb_str(struct tb_file *f, const char *s) {
    tb_u64(f, strlen(s));
    tb_put(f, s, strlen(s));
}
static inline void tb_key(struct tb_file *f, const char *key, uint32_t type) {
    tb_str(f, key);
    tb_u32(f, type);
    f->n_kv++;
}

static inline void tb_kv_str(struct tb_file *f, const char *key, const char *v) { tb_key(f, key, 8), tb_str(f, v); }
static inline void tb_kv_u32(struct tb_file *f, const char *key, uint32_t v) { tb_key(f, key, 4), tb_u32(f, v); }
static inline void tb_kv_f32(struct tb_file *f, const char *key, float v) { tb_key(f, key, 6), tb_put(f, &v, 4); }
static inline void tb_kv_bool(struct tb_file *f, const char *key, bool v) {
    uint8_t b = v;
    tb_key(f, key, 7), tb_put(f, &b, 1);
}
static inline void tb_kv_f32s(struct tb_file *f, const char *key, const float *v, uint64_t n) {
    tb_key(f, key, 9), tb_u32(f, 6), tb_u64(f, n), tb_put(f, v, n * 4);
}
static inline void tb_kv_i32s(struct tb_file *f, const char *key, const int32_t *v, uint64_t n) {
    tb_key(f, key, 9), tb_u32(f, 5), tb_u64(f, n), tb_put(f, v, n * 4);
}

static inline void tb_tensor(struct tb_file *f, const char *name, uint32_t type, uint32_t n_dims, uint64_t ne0,
                             uint64_t ne1, uint64_t ne2, uint64_t ne3) {
    struct tb_tensor *t = &f->tensors[f->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = n_dims;
    const uint64_t ne[4] = {ne0, ne1, ne2, ne3};
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
}

/* The whole file, malloc'ed (free it); *size gets its length. */
static inline uint8_t *tb_finish(struct tb_file *f, size_t *size) {
    struct tb_file head = {0};
    tb_put(&head, "GGUF", 4);
    tb_u32(&head, 3);
    tb_u64(&head, f->n_tensors);
    tb_u64(&head, f->n_kv);
    tb_put(&head, f->kv, f->kv_len);
    uint64_t offset = 0;
    for (uint32_t i = 0; i < f->n_tensors; i++) {
        const struct tb_tensor *t = &f->tensors[i];
        tb_str(&head, t->name);
        tb_u32(&head, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) tb_u64(&head, t->ne[d]);
        tb_u32(&head, t->type);
        tb_u64(&head, offset);
        const uint64_t bytes = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] * (t->type == 1 ? 2 : 4);
        offset += (bytes + 31) / 32 * 32;
    }
    const size_t header = (head.kv_len + 31) / 32 * 32;
    uint8_t *out = calloc(1, header + offset);
    memcpy(out, head.kv, head.kv_len);
    free(head.kv);
    free(f->kv);
    f->kv = NULL;
    *size = header + offset;
    return out;
}

#endif
