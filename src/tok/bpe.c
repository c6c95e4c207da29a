/* Byte-level BPE: each pre-tokenizer piece starts as one token per byte and the adjacent pair
 * whose merge has the lowest rank is merged until no merge applies. Pairs are token ids, so a
 * merge is one hash lookup; candidates sit in a min-heap and stale ones are skipped when
 * popped, which keeps long pieces (a run of a thousand spaces) at n log n. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Merges are resolved in batches: hashing a batch's texts and prefetching their map slots
 * before looking any of them up overlaps the cache misses that otherwise dominate loading a
 * large vocabulary (three lookups per merge, 280k merges for Llama 3). */
enum { MERGE_BATCH = 32 };

struct merge_job {
    const char *left, *right;
    size_t left_len, right_len;
    uint64_t left_hash, right_hash, joined_hash;
    int32_t left_id, right_id;
    char *joined;
};

static pshard_status merge_split(const struct tok_vocab_desc *desc, uint32_t i, struct merge_job *job) {
    const char *m = desc->merges[i];
    size_t n = m ? (desc->merge_lens ? desc->merge_lens[i] : strlen(m)) : 0;
    /* The separator is the first space after the first byte: byte-level tokens never
     * contain a space, but a merge's left side may start with one in other vocabularies. */
    const char *space = n > 1 ? memchr(m + 1, ' ', n - 1) : NULL;
    if (!space)
        return core_fail(PSHARD_ERR_FORMAT, "merge %u ('%.*s') is not 'left right'", i,
                         (int)(n > 64 ? 64 : n), m ? m : "");
    job->left = m;
    job->left_len = (size_t)(space - m);
    job->right = space + 1;
    job->right_len = n - job->left_len - 1;
    return PSHARD_OK;
}

pshard_status bpe_load_merges(struct tok *tok, const struct tok_vocab_desc *desc) {
    for (int b = 0; b < 256; b++) {
        char text[4];
        size_t n = utf8_put(tok->bytelevel_cp[b], text);
        tok->byte_token[b] = tok_text_map_find(tok, text, n);
    }
    if (desc->n_merges > 0 && !desc->merges)
        return core_fail(PSHARD_ERR_INVALID_ARG, "%u merges but no merge array", desc->n_merges);
    CORE_TRY(tok_pair_map_init(&tok->merges, desc->n_merges));
    size_t joined_cap = 2 * (size_t)tok->max_text_len + 1;
    char *joined = malloc(MERGE_BATCH * joined_cap);
    if (!joined) return core_fail(PSHARD_ERR_NOMEM, "no memory to read merges");
    struct merge_job jobs[MERGE_BATCH];
    pshard_status status = PSHARD_OK;
    for (uint32_t base = 0; base < desc->n_merges && status == PSHARD_OK; base += MERGE_BATCH) {
        uint32_t n = desc->n_merges - base < MERGE_BATCH ? desc->n_merges - base : MERGE_BATCH;
        for (uint32_t k = 0; k < n && status == PSHARD_OK; k++) {
            struct merge_job *j = &jobs[k];
            status = merge_split(desc, base + k, j);
            if (status != PSHARD_OK) break;
            j->left_hash = tok_hash_bytes(j->left, j->left_len);
            j->right_hash = tok_hash_bytes(j->right, j->right_len);
            tok_text_map_prefetch(tok, j->left_hash);
            tok_text_map_prefetch(tok, j->right_hash);
        }
        for (uint32_t k = 0; k < n && status == PSHARD_OK; k++) {
            tok_text_map_prefetch_text(tok, jobs[k].left_hash);
            tok_text_map_prefetch_text(tok, jobs[k].right_hash);
        }
        for (uint32_t k = 0; k < n && status == PSHARD_OK; k++) {
            struct merge_job *j = &jobs[k];
            j->left_id = tok_text_map_find_hashed(tok, j->left, j->left_len, j->left_hash);
            j->right_id = tok_text_map_find_hashed(tok, j->right, j->right_len, j->right_hash);
            if (j->left_id < 0 || j->right_id < 0) continue;
            tok_pair_map_prefetch(&tok->merges, j->left_id, j->right_id);
            /* Found tokens are at most max_text_len long, so the pair fits joined_cap. */
            j->joined = joined + k * joined_cap;
            memcpy(j->joined, j->left, j->left_len);
            memcpy(j->joined + j->left_len, j->right, j->right_len);
            j->joined_hash = tok_hash_bytes(j->joined, j->left_len + j->right_len);
            tok_text_map_prefetch(tok, j->joined_hash);
        }
        for (uint32_t k = 0; k < n && status == PSHARD_OK; k++) {
            struct merge_job *j = &jobs[k];
            int32_t result = -1;
            if (j->left_id >= 0 && j->right_id >= 0)
                result = tok_text_map_find_hashed(tok, j->joined, j->left_len + j->right_len, j->joined_hash);
            if (result < 0) {
                size_t len = j->left_len + 1 + j->right_len;
                status = core_fail(PSHARD_ERR_FORMAT,
                                   "merge %u ('%.*s') refers to a token not in the vocabulary (%s)",
                                   base + k, (int)(len > 64 ? 64 : len), j->left,
                                   j->left_id < 0    ? "left side"
                                   : j->right_id < 0 ? "right side"
                                                     : "merged token");
                break;
            }
            tok_pair_map_put(&tok->merges, j->left_id, j->right_id, base + k, result);
        }
    }
    free(joined);
    return status;
}

static void try_pair(const struct tok *tok, struct tok_scratch *s, int32_t left) {
    if (left < 0) return;
    int32_t right = s->next[left];
    if (right < 0) return;
    int32_t a = s->sym_id[left], b = s->sym_id[right];
    uint32_t rank;
    int32_t result;
    if (!tok_pair_map_get(&tok->merges, a, b, &rank, &result)) return;
    /* a, b: the ids when queued (a changed id means the entry is stale); c: the merged id */
    tok_heap_push(s, (struct tok_merge_cand){(double)rank, left, a, b, result});
}

struct bpe_ctx {
    const struct tok *tok;
    struct tok_scratch *scratch;
    struct tok_ids *ids;
};

static pshard_status bpe_word(void *vctx, const char *piece, size_t len) {
    struct bpe_ctx *ctx = vctx;
    const struct tok *tok = ctx->tok;
    struct tok_scratch *s = ctx->scratch;
    if (len > INT32_MAX / 4) return core_fail(PSHARD_ERR_RANGE, "piece of %zu bytes is too long", len);
    if (len == 1) {
        int32_t id = tok->byte_token[(uint8_t)piece[0]];
        return id >= 0 ? tok_ids_push(ctx->ids, id) : PSHARD_OK;
    }

    if (tok->pretok.ignore_merges) {
        /* The whole piece, written in byte-level form, may be a token itself (Llama 3). */
        CORE_TRY(tok_scratch_buf(s, 2 * len));
        size_t n = 0;
        for (size_t i = 0; i < len; i++) n += utf8_put(tok->bytelevel_cp[(uint8_t)piece[i]], s->buf + n);
        int32_t id = tok_text_map_find(tok, s->buf, n);
        if (id >= 0) return tok_ids_push(ctx->ids, id);
    }

    CORE_TRY(tok_scratch_reserve(s, len, sizeof(struct tok_merge_cand)));
    /* A byte with no token of its own is left out before merging, as HF's BPE does (its
     * neighbours may then merge): vocabularies such as SmolLM2's have no tokens for bytes
     * that never occur in UTF-8 (C0, F5..FF) and for some control characters. */
    int32_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = tok->byte_token[(uint8_t)piece[i]];
        if (id < 0) continue;
        s->sym_id[n] = id;
        s->prev[n] = n - 1;
        s->next[n] = -1;
        if (n > 0) s->next[n - 1] = n;
        n++;
    }
    if (n == 0) return PSHARD_OK;
    s->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(tok, s, i);

    while (s->heap_n > 0) {
        struct tok_merge_cand c = tok_heap_pop(s);
        int32_t left = c.left, right = s->next[left];
        if (s->sym_id[left] != c.a || right < 0 || s->sym_id[right] != c.b) continue;
        s->sym_id[left] = c.c;
        s->sym_id[right] = -1; /* merged away */
        s->next[left] = s->next[right];
        if (s->next[right] >= 0) s->prev[s->next[right]] = left;
        try_pair(tok, s, s->prev[left]);
        try_pair(tok, s, left);
    }
    /* Merges fold the right symbol into the left, so symbol 0 heads the list to the end. */
    for (int32_t i = 0; i >= 0; i = s->next[i]) CORE_TRY(tok_ids_push(ctx->ids, s->sym_id[i]));
    return PSHARD_OK;
}

pshard_status bpe_encode_fragment(const struct tok *tok, struct tok_scratch *scratch, const char *text,
                                  size_t len, struct tok_ids *ids) {
    struct bpe_ctx ctx = {tok, scratch, ids};
    return pretok_split(&tok->pretok, scratch, text, len, bpe_word, &ctx);
}
