/* KV cache storage: the pool, its free blocks, and the block table's bookkeeping. */
#include "exec/kv_cache.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

/* The host's K or V storage on whole pages of its own: the GPU placement registers (pins) it by
 * pages, and a page shared with another allocation (K's last and V's first, say) would leave a
 * copy to or from that one spanning pinned and pageable memory, which the driver refuses. */
static void *own_pages(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = NULL;
    return posix_memalign(&p, page, (bytes + page - 1) / page * page) == 0 ? p : NULL;
}

static int32_t blocks_for(int64_t cells) { return (int32_t)((cells + KV_BLOCK_CELLS - 1) / KV_BLOCK_CELLS); }

int64_t kv_cache_pool_cells(int32_t n_seq, int32_t n_ctx, int32_t n_cells) {
    /* (by default every sequence can be full at once, each rounded up to whole blocks) */
    const int64_t blocks = n_cells > 0 ? blocks_for(n_cells) : (int64_t)n_seq * blocks_for(n_ctx);
    return blocks * KV_BLOCK_CELLS;
}

pshard_status kv_cache_init(struct kv_cache *kv, int32_t n_layers, int32_t n_seq, int32_t n_ctx, int32_t n_cells,
                            int64_t k_width, int64_t v_width, bool host_storage) {
    memset(kv, 0, sizeof *kv);
    const int64_t pool = kv_cache_pool_cells(n_seq, n_ctx, n_cells);
    if (n_layers <= 0 || n_seq <= 0 || n_ctx <= 0 || n_cells < 0 || k_width <= 0 || v_width <= 0 ||
        pool / KV_BLOCK_CELLS > INT32_MAX / KV_BLOCK_CELLS)
        return core_fail(PSHARD_ERR_INVALID_ARG, "KV cache: bad size (%d layers, %d sequences, context %d, %d cells)",
                         n_layers, n_seq, n_ctx, n_cells);
    kv->n_layers = n_layers;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->n_blocks = (int32_t)(pool / KV_BLOCK_CELLS);
    kv->max_blocks = blocks_for(n_ctx);
    kv->k_width = k_width;
    kv->v_width = v_width;
    const size_t cells = (size_t)n_layers * (size_t)pool, slots = (size_t)n_seq * (size_t)kv->max_blocks;
    kv->seq_len = calloc((size_t)n_seq, sizeof *kv->seq_len);
    kv->n_held = calloc((size_t)n_seq, sizeof *kv->n_held);
    kv->table = malloc(slots * sizeof *kv->table);
    kv->refs = calloc((size_t)kv->n_blocks, sizeof *kv->refs);
    kv->free_blocks = malloc((size_t)kv->n_blocks * sizeof *kv->free_blocks);
    if (host_storage) {
        kv->k = own_pages(cells * (size_t)k_width * sizeof(uint16_t));
        kv->v = own_pages(cells * (size_t)v_width * sizeof(uint16_t));
    }
    if (!kv->seq_len || !kv->n_held || !kv->table || !kv->refs || !kv->free_blocks || (host_storage && (!kv->k || !kv->v))) {
        uint64_t bytes = (uint64_t)cells * (uint64_t)(k_width + v_width) * 2;
        kv_cache_free(kv);
        return core_fail(PSHARD_ERR_NOMEM, "KV cache: cannot allocate %.1f MB (reduce the context with -c)", bytes / 1e6);
    }
    for (size_t i = 0; i < slots; i++) kv->table[i] = -1;
    /* Lowest blocks on top: a sequence grown alone gets consecutive blocks (fewer, longer copies). */
    for (int32_t b = 0; b < kv->n_blocks; b++) kv->free_blocks[b] = kv->n_blocks - 1 - b;
    kv->n_free = kv->n_blocks;
    return PSHARD_OK;
}

pshard_status kv_cache_add_host_storage(struct kv_cache *kv) {
    if (kv->k) return PSHARD_OK;
    const size_t cells = (size_t)kv->n_layers * (size_t)kv_cache_cells(kv);
    kv->k = own_pages(cells * (size_t)kv->k_width * sizeof(uint16_t));
    kv->v = own_pages(cells * (size_t)kv->v_width * sizeof(uint16_t));
    if (kv->k && kv->v) return PSHARD_OK;
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
    return core_fail(PSHARD_ERR_NOMEM, "KV cache: cannot allocate %.1f MB of host memory for the cells the GPU holds",
                     kv_cache_bytes(kv) / 1e6);
}

void kv_cache_free(struct kv_cache *kv) {
    free(kv->k);
    free(kv->v);
    free(kv->seq_len);
    free(kv->n_held);
    free(kv->table);
    free(kv->refs);
    free(kv->free_blocks);
    memset(kv, 0, sizeof *kv);
}

uint64_t kv_cache_bytes(const struct kv_cache *kv) {
    return (uint64_t)kv->n_layers * (uint64_t)kv_cache_cells(kv) * (uint64_t)(kv->k_width + kv->v_width) * 2;
}

static int32_t *row_of(const struct kv_cache *kv, int32_t seq) { return kv->table + (int64_t)seq * kv->max_blocks; }

static int32_t take_block(struct kv_cache *kv) {
    const int32_t b = kv->free_blocks[--kv->n_free];
    kv->refs[b] = 1;
    return b;
}

static void release_block(struct kv_cache *kv, int32_t b) {
    if (--kv->refs[b] == 0) kv->free_blocks[kv->n_free++] = b;
}

/* Cells [0, n) of block src into block dst: the host's storage, then wherever else it lives. */
static pshard_status copy_block(struct kv_cache *kv, int32_t dst, int32_t src, int32_t n, const struct kv_copier *copier) {
    for (int32_t il = 0; kv->k && il < kv->n_layers; il++) {
        memcpy(kv_cache_k(kv, il, (int64_t)dst * KV_BLOCK_CELLS), kv_cache_k(kv, il, (int64_t)src * KV_BLOCK_CELLS),
               sizeof(uint16_t) * (size_t)n * (size_t)kv->k_width);
        memcpy(kv_cache_v(kv, il, (int64_t)dst * KV_BLOCK_CELLS), kv_cache_v(kv, il, (int64_t)src * KV_BLOCK_CELLS),
               sizeof(uint16_t) * (size_t)n * (size_t)kv->v_width);
    }
    return copier && copier->copy ? copier->copy(copier->arg, dst, src, n) : PSHARD_OK;
}

int32_t kv_cache_blocks_needed(const struct kv_cache *kv, int32_t seq, int32_t len) {
    const int32_t held = kv->n_held[seq], want = blocks_for(len), *row = kv_cache_blocks(kv, seq);
    int32_t need = want > held ? want - held : 0;
    /* Held blocks the write reaches (from the one holding its first cell) that others hold too. */
    for (int32_t i = kv->seq_len[seq] / KV_BLOCK_CELLS; len > kv->seq_len[seq] && i < held && i < want; i++)
        need += kv->refs[row[i]] > 1;
    return need;
}

pshard_status kv_cache_reserve(struct kv_cache *kv, int32_t seq, int32_t len, const struct kv_copier *copier) {
    int32_t *row = row_of(kv, seq);
    const int32_t want = blocks_for(len), len_now = kv->seq_len[seq];
    for (int32_t i = len_now / KV_BLOCK_CELLS; len > len_now && i < kv->n_held[seq] && i < want; i++) {
        if (kv->refs[row[i]] == 1) continue;
        /* Copy on write: this sequence's cells of the block go to a block of its own. */
        const int32_t fresh = take_block(kv), kept = len_now - i * KV_BLOCK_CELLS;
        pshard_status st = kept > 0 ? copy_block(kv, fresh, row[i], kept, copier) : PSHARD_OK;
        release_block(kv, row[i]);
        row[i] = fresh;
        kv->table_version++;
        CORE_TRY(st);
    }
    while (kv->n_held[seq] < want) {
        row[kv->n_held[seq]++] = take_block(kv);
        kv->table_version++;
    }
    return PSHARD_OK;
}

void kv_cache_truncate(struct kv_cache *kv, int32_t seq, int32_t len) {
    if (seq < 0 || seq >= kv->n_seq || len < 0 || len > kv->seq_len[seq]) return;
    kv->seq_len[seq] = len;
    int32_t *row = row_of(kv, seq);
    for (const int32_t keep = blocks_for(len); kv->n_held[seq] > keep;) {
        const int32_t i = --kv->n_held[seq];
        release_block(kv, row[i]);
        row[i] = -1;
        kv->table_version++;
    }
}

pshard_status kv_cache_share(struct kv_cache *kv, int32_t dst, int32_t src, int32_t n_cells,
                             const struct kv_copier *copier) {
    if (dst < 0 || dst >= kv->n_seq || src < 0 || src >= kv->n_seq || dst == src)
        return core_fail(PSHARD_ERR_INVALID_ARG, "sharing a prefix: sequences %d and %d (of %d slots, not the same)", dst,
                         src, kv->n_seq);
    if (kv->seq_len[dst] != 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "sharing a prefix: sequence %d holds %d cells (it must be empty)", dst,
                         kv->seq_len[dst]);
    if (n_cells < 0 || n_cells > kv->seq_len[src])
        return core_fail(PSHARD_ERR_INVALID_ARG, "sharing a prefix of %d cells of sequence %d, which holds %d", n_cells,
                         src, kv->seq_len[src]);
    const int32_t whole = n_cells / KV_BLOCK_CELLS, rest = n_cells % KV_BLOCK_CELLS;
    /* (blocks dst holds past its length, left by a failed step, are its own and come back first) */
    int32_t own = 0;
    for (int32_t i = 0; i < kv->n_held[dst]; i++) own += kv->refs[kv_cache_blocks(kv, dst)[i]] == 1;
    if (rest && kv->n_free + own < 1)
        return core_fail(PSHARD_ERR_RANGE, "KV cache full: no free block of %d cells to copy the end of a shared prefix "
                         "into (raise -c)", (int)KV_BLOCK_CELLS);
    kv_cache_truncate(kv, dst, 0);
    int32_t *to = row_of(kv, dst);
    const int32_t *from = kv_cache_blocks(kv, src);
    for (int32_t i = 0; i < whole; i++) {
        to[i] = from[i];
        kv->refs[from[i]]++;
    }
    kv->n_held[dst] = whole;
    kv->table_version++;
    if (rest) {
        to[whole] = take_block(kv);
        kv->n_held[dst] = whole + 1;
        CORE_TRY(copy_block(kv, to[whole], from[whole], rest, copier));
    }
    kv->seq_len[dst] = n_cells;
    return PSHARD_OK;
}

int32_t kv_cache_run(const struct kv_cache *kv, int32_t seq, int32_t pos, int32_t end, int64_t *row) {
    const int32_t *blocks = kv_cache_blocks(kv, seq);
    *row = kv_cache_row(kv, seq, pos);
    int32_t i = pos / KV_BLOCK_CELLS, n = (i + 1) * KV_BLOCK_CELLS - pos;
    while (pos + n < end && blocks[i + 1] == blocks[i] + 1) i++, n += KV_BLOCK_CELLS;
    return pos + n < end ? n : end - pos;
}
