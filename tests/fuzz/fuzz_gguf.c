/* libFuzzer target for the GGUF reader: any byte string must open cleanly or fail with a
 * message; when it opens, every accessor, the shard builder and the mmproj reader must stay in
 * bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "vision/mmproj.h"

static void touch_everything(struct gguf_file *f) {
    volatile uint64_t sink = 0;
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        int64_t iv;
        double fv;
        if (gguf_kv_i64(kv, &iv) == PSHARD_OK) sink += (uint64_t)iv;
        if (gguf_kv_f64(kv, &fv) == PSHARD_OK) sink += (uint64_t)(fv == fv);
        if (kv->type != GGUF_TYPE_ARRAY) continue;
        struct gguf_str *strings;
        if (gguf_array_strings(&kv->array, &strings) == PSHARD_OK) {
            for (uint64_t j = 0; j < kv->array.n; j++)
                if (strings[j].len) sink += (uint8_t)strings[j].data[strings[j].len - 1];
            free(strings);
        } else {
            for (uint64_t j = 0; j < kv->array.n && j < 64; j++) sink += (uint64_t)gguf_array_int(&kv->array, j);
        }
    }
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->n_bytes) sink += ((const uint8_t *)t->data)[t->n_bytes - 1];
        char name[256];
        size_t n = t->name.len < sizeof name - 1 ? t->name.len : sizeof name - 1;
        memcpy(name, t->name.data, n);
        name[n] = '\0';
        sink += gguf_find_tensor(f, name) != NULL;
    }
    struct model model;
    if (model_load(f, &model) == PSHARD_OK) model_free(&model);
    struct mmproj mmproj; /* an mmproj file's checks (tests/data/mmproj seeds them) */
    if (mmproj_is_mmproj(f) && mmproj_load(f, &mmproj) == PSHARD_OK) mmproj_free(&mmproj);
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy, so reading one byte past the input is caught. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    struct gguf_file *f = NULL;
    if (gguf_open_memory(copy, size, "fuzz", &f) == PSHARD_OK) {
        touch_everything(f);
        gguf_close(f);
    }
    free(copy);
    return 0;
}
