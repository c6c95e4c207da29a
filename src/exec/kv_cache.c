/* KV cache storage. */
#include "exec/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

pshard_status kv_cache_init(struct kv_cache *kv, int32_t n_layers, int32_t n_seq, int32_t n_ctx, int64_t k_width,
                            int64_t v_width, bool host_storage) {
    memset(kv, 0, sizeof *kv);
    if (n_layers <= 0 || n_seq <= 0 || n_ctx <= 0 || k_width <= 0 || v_width <= 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "KV cache: bad size (%d layers, %d sequences, context %d)", n_layers,
                         n_seq, n_ctx);
    kv->n_layers = n_layers;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->k_width = k_width;
    kv->v_width = v_width;
    const size_t cells = (size_t)n_layers * (size_t)n_seq * (size_t)n_ctx;
    kv->seq_len = calloc((size_t)n_seq, sizeof *kv->seq_len);
    if (host_storage) {
        kv->k = malloc(cells * (size_t)k_width * sizeof(uint16_t));
        kv->v = malloc(cells * (size_t)v_width * sizeof(uint16_t));
    }
    if (!kv->seq_len || (host_storage && (!kv->k || !kv->v))) {
        uint64_t bytes = (uint64_t)cells * (uint64_t)(k_width + v_width) * 2;
        kv_cache_free(kv);
        return core_fail(PSHARD_ERR_NOMEM, "KV cache: cannot allocate %.1f MB (reduce the context with -c)", bytes / 1e6);
    }
    return PSHARD_OK;
}

void kv_cache_free(struct kv_cache *kv) {
    free(kv->k);
    free(kv->v);
    free(kv->seq_len);
    memset(kv, 0, sizeof *kv);
}

uint64_t kv_cache_bytes(const struct kv_cache *kv) {
    return (uint64_t)kv->n_layers * (uint64_t)kv->n_seq * (uint64_t)kv->n_ctx * (uint64_t)(kv->k_width + kv->v_width) * 2;
}

void kv_cache_truncate(struct kv_cache *kv, int32_t seq, int32_t len) {
    if (seq >= 0 && seq < kv->n_seq && len >= 0 && len < kv->seq_len[seq]) kv->seq_len[seq] = len;
}
