/* The KV cache: per layer and sequence, n_ctx cells of K and V in f16. A cell's index is its
 * position, so a sequence's cache is the prefix [0, len). Sequences are slots that can be
 * cleared and reused. */
#ifndef EXEC_KV_CACHE_H
#define EXEC_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "pshard.h"

struct kv_cache {
    int32_t n_layers, n_seq, n_ctx;
    int64_t k_width, v_width; /* f16 values per cell */
    uint16_t *k, *v;          /* [layer][seq][cell][width] */
    int32_t *seq_len;         /* cells in use per sequence */
};

/* host_storage false: the shape and sequence lengths only (the cells live on the GPU). */
pshard_status kv_cache_init(struct kv_cache *kv, int32_t n_layers, int32_t n_seq, int32_t n_ctx, int64_t k_width,
                            int64_t v_width, bool host_storage);
void kv_cache_free(struct kv_cache *kv);

/* Bytes the cache holds. */
uint64_t kv_cache_bytes(const struct kv_cache *kv);

/* Keep the first len cells of a sequence; 0 forgets it (its slot can take a new one). */
void kv_cache_truncate(struct kv_cache *kv, int32_t seq, int32_t len);

/* First cell of a layer/sequence. */
static inline uint16_t *kv_cache_k(const struct kv_cache *kv, int32_t layer, int32_t seq) {
    return kv->k + (((int64_t)layer * kv->n_seq + seq) * kv->n_ctx) * kv->k_width;
}
static inline uint16_t *kv_cache_v(const struct kv_cache *kv, int32_t layer, int32_t seq) {
    return kv->v + (((int64_t)layer * kv->n_seq + seq) * kv->n_ctx) * kv->v_width;
}

#endif
