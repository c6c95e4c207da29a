/* The tokenizer's lookup tables (token text -> id, merge pair -> rank) and the growable
 * buffers an encode call uses. Open addressing with linear probing: tables are built once and
 * only read afterwards, so no deletion is needed. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/grow.h"

/* FNV-1a over 8-byte words with a final mix: token texts are short, and this keeps a 150k
 * vocabulary's build well under a millisecond per 10k tokens. */
uint64_t tok_hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static uint32_t table_size_for(uint32_t n) {
    uint32_t size = 16;
    while (size < 2u * n + 1) size *= 2;
    return size;
}

pshard_status tok_text_map_build(struct tok *tok) {
    uint32_t size = table_size_for(tok->n_tokens);
    struct tok_text_map *map = &tok->map;
    map->slots = malloc((size_t)size * sizeof *map->slots);
    if (!map->slots) return core_fail(PSHARD_ERR_NOMEM, "no memory for the token map");
    for (uint32_t i = 0; i < size; i++) map->slots[i].id = -1;
    map->mask = size - 1;
    /* Hash a batch and prefetch its slots before inserting: the inserts are random writes
     * into a table larger than the cache. */
    enum { BATCH = 32 };
    uint64_t hashes[BATCH];
    for (uint32_t base = 0; base < tok->n_tokens; base += BATCH) {
        uint32_t n = tok->n_tokens - base < BATCH ? tok->n_tokens - base : BATCH;
        for (uint32_t k = 0; k < n; k++) {
            const struct tok_entry *e = &tok->entries[base + k];
            hashes[k] = tok_hash_bytes(tok->arena + e->text_off, e->text_len);
            __builtin_prefetch(&map->slots[(uint32_t)hashes[k] & map->mask], 1);
        }
        for (uint32_t k = 0; k < n; k++) {
            uint32_t id = base + k;
            const struct tok_entry *e = &tok->entries[id];
            if (e->text_len == 0) continue; /* an empty token can never be matched */
            const char *text = tok->arena + e->text_off;
            uint32_t slot = (uint32_t)hashes[k] & map->mask, tag = (uint32_t)(hashes[k] >> 32);
            for (;;) {
                struct tok_text_slot *sl = &map->slots[slot];
                if (sl->id < 0) {
                    *sl = (struct tok_text_slot){tag, (int32_t)id, e->text_off, e->text_len};
                    break;
                }
                if (sl->hash == tag && sl->text_len == e->text_len &&
                    memcmp(tok->arena + sl->text_off, text, e->text_len) == 0)
                    break; /* duplicate text: the lower id keeps it */
                slot = (slot + 1) & map->mask;
            }
        }
    }
    return PSHARD_OK;
}

void tok_text_map_prefetch(const struct tok *tok, uint64_t hash) {
    if (tok->map.slots) __builtin_prefetch(&tok->map.slots[(uint32_t)hash & tok->map.mask]);
}

void tok_text_map_prefetch_text(const struct tok *tok, uint64_t hash) {
    if (!tok->map.slots) return;
    const struct tok_text_slot *sl = &tok->map.slots[(uint32_t)hash & tok->map.mask];
    if (sl->id >= 0 && sl->hash == (uint32_t)(hash >> 32)) __builtin_prefetch(tok->arena + sl->text_off);
}

int32_t tok_text_map_find(const struct tok *tok, const char *s, size_t n) {
    return tok_text_map_find_hashed(tok, s, n, tok_hash_bytes(s, n));
}

int32_t tok_text_map_find_hashed(const struct tok *tok, const char *s, size_t n, uint64_t h) {
    const struct tok_text_map *map = &tok->map;
    if (!map->slots || n == 0) return -1;
    uint32_t slot = (uint32_t)h & map->mask, tag = (uint32_t)(h >> 32);
    for (;;) {
        const struct tok_text_slot *sl = &map->slots[slot];
        if (sl->id < 0) return -1;
        if (sl->hash == tag && sl->text_len == n && memcmp(tok->arena + sl->text_off, s, n) == 0)
            return sl->id;
        slot = (slot + 1) & map->mask;
    }
}

void tok_text_map_free(struct tok_text_map *map) {
    free(map->slots);
    map->slots = NULL;
}

pshard_status tok_pair_map_init(struct tok_pair_map *map, uint32_t n_pairs) {
    uint32_t size = table_size_for(n_pairs);
    map->mask = size - 1;
    map->slots = malloc((size_t)size * sizeof *map->slots);
    if (!map->slots) return core_fail(PSHARD_ERR_NOMEM, "no memory for %u merges", n_pairs);
    for (uint32_t i = 0; i < size; i++) map->slots[i].key = TOK_PAIR_EMPTY;
    return PSHARD_OK;
}

static uint64_t pair_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

static uint32_t pair_slot(const struct tok_pair_map *map, uint64_t key) {
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & map->mask;
}

void tok_pair_map_prefetch(const struct tok_pair_map *map, int32_t left, int32_t right) {
    __builtin_prefetch(&map->slots[pair_slot(map, pair_key(left, right))], 1);
}

bool tok_pair_map_put(struct tok_pair_map *map, int32_t left, int32_t right, uint32_t rank,
                      int32_t result) {
    uint64_t key = pair_key(left, right);
    uint32_t slot = pair_slot(map, key);
    while (map->slots[slot].key != TOK_PAIR_EMPTY) {
        if (map->slots[slot].key == key) return false;
        slot = (slot + 1) & map->mask;
    }
    map->slots[slot] = (struct tok_pair_slot){key, rank, result};
    return true;
}

bool tok_pair_map_get(const struct tok_pair_map *map, int32_t left, int32_t right, uint32_t *rank,
                      int32_t *result) {
    if (!map->slots) return false;
    uint64_t key = pair_key(left, right);
    uint32_t slot = pair_slot(map, key);
    for (;;) {
        const struct tok_pair_slot *sl = &map->slots[slot];
        if (sl->key == TOK_PAIR_EMPTY) return false;
        if (sl->key == key) {
            *rank = sl->rank;
            *result = sl->result;
            return true;
        }
        slot = (slot + 1) & map->mask;
    }
}

void tok_pair_map_free(struct tok_pair_map *map) {
    free(map->slots);
    map->slots = NULL;
}

pshard_status tok_ids_push(struct tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? 2 * ids->cap : 64;
        int32_t *grown = realloc(ids->ids, cap * sizeof *grown);
        if (!grown) return core_fail(PSHARD_ERR_NOMEM, "no memory for %zu token ids", cap);
        ids->ids = grown;
        ids->cap = cap;
    }
    ids->ids[ids->n++] = id;
    return PSHARD_OK;
}

void tok_ids_free(struct tok_ids *ids) {
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}

pshard_status tok_scratch_reserve(struct tok_scratch *s, size_t n_symbols, size_t heap_entry_bytes) {
    if (n_symbols > s->sym_cap) {
        size_t cap = s->sym_cap;
        size_t want = n_symbols;
        int32_t **arrays[4] = {&s->sym_id, &s->sym_len, &s->prev, &s->next};
        for (int i = 0; i < 4; i++) {
            cap = s->sym_cap;
            CORE_TRY(core_grow((void **)arrays[i], &cap, want, sizeof(int32_t)));
        }
        s->sym_cap = cap;
    }
    /* Each merge adds at most two candidate pairs, so 3n bounds the heap (capacity in bytes). */
    return core_grow(&s->heap, &s->heap_cap, (3 * n_symbols + 1) * heap_entry_bytes, 1);
}

pshard_status tok_scratch_buf(struct tok_scratch *s, size_t bytes) {
    return core_grow((void **)&s->buf, &s->buf_cap, bytes, 1);
}

/* ---- the merge queue both model kinds use: a binary min-heap in the scratch */

static bool cand_before(const struct tok_merge_cand *x, const struct tok_merge_cand *y) {
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}

void tok_heap_push(struct tok_scratch *s, struct tok_merge_cand c) {
    struct tok_merge_cand *h = s->heap;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

struct tok_merge_cand tok_heap_pop(struct tok_scratch *s) {
    struct tok_merge_cand *h = s->heap;
    struct tok_merge_cand top = h[0];
    struct tok_merge_cand last = h[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cand_before(&h[child + 1], &h[child])) child++;
        if (!cand_before(&h[child], &last)) break;
        h[i] = h[child];
        i = child;
    }
    if (n > 0) h[i] = last;
    return top;
}
