/* SentencePiece-style BPE ("llama" vocabularies): spaces become "▁", the text starts as one
 * symbol per character, and the adjacent pair whose concatenation is the highest-scoring
 * token is merged until none is. A character that is no token falls back to its bytes'
 * <0xXX> tokens (or UNK when the vocabulary has none). */
#include "tok/tok_internal.h"

#include <string.h>

#include "core/error.h"

static const char space_marker[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 "▁" */

/* Tokens merges may produce: control, unknown, byte and unused pieces never come out of
 * merging in SentencePiece. */
static int32_t find_piece(const struct tok *tok, const char *s, size_t n) {
    int32_t id = tok_text_map_find(tok, s, n);
    if (id < 0) return -1;
    int32_t type = tok->entries[id].type;
    bool usable = type == TOK_TYPE_NORMAL || type == TOK_TYPE_USER_DEFINED || type == TOK_TYPE_UNDEFINED;
    return usable ? id : -1;
}

static void try_pair(const struct tok *tok, struct tok_scratch *s, int32_t left) {
    if (left < 0) return;
    int32_t right = s->next[left];
    if (right < 0) return;
    int32_t size = s->sym_len[left] + s->sym_len[right];
    int32_t id = find_piece(tok, s->buf + s->sym_id[left], (size_t)size);
    if (id < 0) return;
    /* a: the right neighbour when queued; b: the pair's bytes (a different sum means stale) */
    tok_heap_push(s, (struct tok_merge_cand){-(double)tok->entries[id].score, left, right, size, 0});
}

static pshard_status emit_symbol(const struct tok *tok, const char *text, size_t n, struct tok_ids *ids) {
    int32_t id = find_piece(tok, text, n);
    if (id >= 0) return tok_ids_push(ids, id);
    if (!tok->has_byte_tokens) return tok->unk_id >= 0 ? tok_ids_push(ids, tok->unk_id) : PSHARD_OK;
    for (size_t i = 0; i < n; i++) {
        int32_t byte_id = tok->byte_token[(uint8_t)text[i]];
        if (byte_id < 0) byte_id = tok->unk_id;
        if (byte_id >= 0) CORE_TRY(tok_ids_push(ids, byte_id));
    }
    return PSHARD_OK;
}

pshard_status spm_encode_fragment(const struct tok *tok, struct tok_scratch *s, const char *text,
                                  size_t len, bool space_prefix, struct tok_ids *ids) {
    if (len > INT32_MAX / 8) return core_fail(PSHARD_ERR_RANGE, "text of %zu bytes is too long", len);
    /* Escaped text: an optional leading "▁", then every space as "▁". */
    CORE_TRY(tok_scratch_buf(s, 3 * len + 3));
    size_t n_bytes = 0;
    if (space_prefix) {
        memcpy(s->buf, space_marker, 3);
        n_bytes = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + n_bytes, space_marker, 3);
            n_bytes += 3;
        } else {
            s->buf[n_bytes++] = text[i];
        }
    }
    if (n_bytes == 0) return PSHARD_OK;

    /* One symbol per character; sym_id holds each symbol's start in buf. The text was made
     * valid UTF-8 before, but the length is still clamped to what is left. */
    CORE_TRY(tok_scratch_reserve(s, n_bytes, sizeof(struct tok_merge_cand)));
    int32_t n = 0;
    for (size_t at = 0; at < n_bytes;) {
        size_t char_len = utf8_len_from_lead((uint8_t)s->buf[at]);
        if (char_len > n_bytes - at) char_len = n_bytes - at;
        s->sym_id[n] = (int32_t)at;
        s->sym_len[n] = (int32_t)char_len;
        s->prev[n] = n - 1;
        s->next[n] = -1;
        if (n > 0) s->next[n - 1] = n;
        n++;
        at += char_len;
    }
    s->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(tok, s, i);

    while (s->heap_n > 0) {
        struct tok_merge_cand c = tok_heap_pop(s);
        int32_t left = c.left, right = c.a;
        if (s->sym_len[left] == 0 || s->sym_len[right] == 0 || s->next[left] != right ||
            s->sym_len[left] + s->sym_len[right] != c.b)
            continue;
        s->sym_len[left] += s->sym_len[right];
        s->sym_len[right] = 0;
        s->next[left] = s->next[right];
        if (s->next[right] >= 0) s->prev[s->next[right]] = left;
        try_pair(tok, s, s->prev[left]);
        try_pair(tok, s, left);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i])
        CORE_TRY(emit_symbol(tok, s->buf + s->sym_id[i], (size_t)s->sym_len[i], ids));
    return PSHARD_OK;
}
