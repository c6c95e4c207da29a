/* The KV cache: per layer, one pool of blocks of KV_BLOCK_CELLS cells of K and V in f16, shared
 * by every sequence. A sequence holds a list of blocks (its row of the block table): its cell at
 * position p lives in block table[p / KV_BLOCK_CELLS], at p % KV_BLOCK_CELLS. The table is the
 * same for every layer (block b of a sequence is block b of each layer's pool). Blocks are
 * counted by holders: a shared prompt prefix is held by every sequence that starts with it, and
 * no cell is ever written in a block that another sequence holds (a write there copies the block
 * first). */
#ifndef EXEC_KV_CACHE_H
#define EXEC_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "pshard.h"

/* Cells per block. The kernels walk the cache in tiles whose first cell is a multiple of 64:
 * the CPU scores 64 keys at a time (and cuts long caches into runs of multiples of 64), the GPU's
 * prompt kernel loads tiles of 64 cells, so with blocks of 64 each tile is one block and needs
 * one lookup of the table (the GPU's decode kernel, 128 cells a tile, takes two). Small blocks
 * waste little: a sequence leaves at most 63 cells of its last block unused, and sharing a
 * prefix copies at most 63 cells; the table is n_ctx / 64 entries a sequence. Larger blocks
 * would save nothing the tiles need. */
enum { KV_BLOCK_CELLS = 64 };

struct kv_cache {
    int32_t n_layers, n_seq, n_ctx;
    int32_t n_blocks;         /* in each layer's pool */
    int32_t max_blocks;       /* the most one sequence holds (n_ctx cells): a table row's length */
    int64_t k_width, v_width; /* f16 values per cell */
    uint16_t *k, *v;          /* [layer][block][cell][width]; NULL where the cells live on the GPU */
    int32_t *seq_len;         /* [n_seq] cells in use per sequence */
    int32_t *n_held;          /* [n_seq] blocks each holds: its table row's first n_held entries */
    int32_t *table;           /* [n_seq][max_blocks] blocks of each sequence in order; -1 past n_held */
    int32_t *refs;            /* [n_blocks] sequences holding each block (0: free) */
    int32_t *free_blocks;     /* a stack of the n_free free blocks */
    int32_t n_free;
    uint64_t table_version;   /* changes whenever any table row does (the GPU's copy follows it) */
};

/* Copies cells [0, n_cells) of block src into block dst where the cache lives besides the host
 * (the GPU's layers); the host's copy is made by the cache itself. */
struct kv_copier {
    pshard_status (*copy)(void *arg, int32_t dst, int32_t src, int32_t n_cells);
    void *arg;
};

/* n_cells: the pool's cells, rounded up to whole blocks; 0: room for every sequence at n_ctx.
 * host_storage false: the bookkeeping only (the cells live on the GPU). */
pshard_status kv_cache_init(struct kv_cache *kv, int32_t n_layers, int32_t n_seq, int32_t n_ctx, int32_t n_cells,
                            int64_t k_width, int64_t v_width, bool host_storage);
void kv_cache_free(struct kv_cache *kv);
/* Host storage for a pool made without it (the cells lived on the GPU alone), so a change of
 * budget can move them there; nothing when it has some. Failing changes nothing. */
pshard_status kv_cache_add_host_storage(struct kv_cache *kv);

/* Bytes the pool holds (every layer). */
uint64_t kv_cache_bytes(const struct kv_cache *kv);
/* Cells of one layer's pool. */
static inline int64_t kv_cache_cells(const struct kv_cache *kv) { return (int64_t)kv->n_blocks * KV_BLOCK_CELLS; }
/* The pool cells n_cells asks for (as kv_cache_init counts them). */
int64_t kv_cache_pool_cells(int32_t n_seq, int32_t n_ctx, int32_t n_cells);

/* New blocks sequence `seq` needs to hold len cells and write those past its length: the blocks
 * it lacks, and a copy of each block it shares with another sequence that the write reaches. */
int32_t kv_cache_blocks_needed(const struct kv_cache *kv, int32_t seq, int32_t len);
/* Make it so (the caller checked kv_cache_blocks_needed against n_free). Cells of the sequence
 * below its length are kept; its length does not change. */
pshard_status kv_cache_reserve(struct kv_cache *kv, int32_t seq, int32_t len, const struct kv_copier *copier);

/* Keep the first len cells of a sequence and release its blocks past them; 0 releases all (its
 * slot can take a new one). A block it still shares stays shared: the next write copies it. */
void kv_cache_truncate(struct kv_cache *kv, int32_t seq, int32_t len);

/* dst (empty) takes the first n_cells of src: src's whole blocks shared, the rest of the last
 * one copied into a fresh block. Fails with PSHARD_ERR_RANGE, changing nothing, when the pool
 * has no block for that copy. */
pshard_status kv_cache_share(struct kv_cache *kv, int32_t dst, int32_t src, int32_t n_cells,
                             const struct kv_copier *copier);

/* The pool row (block * KV_BLOCK_CELLS + cell) holding position pos of a sequence. */
static inline int64_t kv_cache_row(const struct kv_cache *kv, int32_t seq, int32_t pos) {
    return (int64_t)kv->table[(int64_t)seq * kv->max_blocks + pos / KV_BLOCK_CELLS] * KV_BLOCK_CELLS + pos % KV_BLOCK_CELLS;
}
/* Cells from position pos up to `end` of a sequence whose rows follow one another from *row (one
 * copy moves them). */
int32_t kv_cache_run(const struct kv_cache *kv, int32_t seq, int32_t pos, int32_t end, int64_t *row);
/* A sequence's row of the block table. */
static inline const int32_t *kv_cache_blocks(const struct kv_cache *kv, int32_t seq) {
    return kv->table + (int64_t)seq * kv->max_blocks;
}

/* Row `row` of a layer's pool (host storage). */
static inline uint16_t *kv_cache_k(const struct kv_cache *kv, int32_t layer, int64_t row) {
    return kv->k + ((int64_t)layer * kv_cache_cells(kv) + row) * kv->k_width;
}
static inline uint16_t *kv_cache_v(const struct kv_cache *kv, int32_t layer, int64_t row) {
    return kv->v + ((int64_t)layer * kv_cache_cells(kv) + row) * kv->v_width;
}

#endif
