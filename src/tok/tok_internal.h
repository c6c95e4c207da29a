/* Shared inside src/tok: the tokenizer's layout and the helpers its files call each other by. */
#ifndef TOK_TOK_INTERNAL_H
#define TOK_TOK_INTERNAL_H

#include "tok/tok.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- UTF-8 (utf8.c) */

enum utf8_result { UTF8_OK, UTF8_INCOMPLETE, UTF8_INVALID };

/* Classifies the character starting at s[0] (n > 0 bytes available). UTF8_OK: *len is its
 * length. UTF8_INCOMPLETE: a valid start cut off by the end of the buffer (*len = n).
 * UTF8_INVALID: *len is the maximal invalid subpart, to be replaced by one U+FFFD. */
enum utf8_result utf8_next(const uint8_t *s, size_t n, size_t *len);

/* Length of the character starting with byte b, trusting valid input (1 for stray bytes). */
size_t utf8_len_from_lead(uint8_t b);

/* Writes code point cp (< 0x110000) as UTF-8 into out (4 bytes room); returns its length. */
size_t utf8_put(uint32_t cp, char *out);

/* If text is valid UTF-8, *clean = text. Otherwise a malloc'ed copy with every maximal
 * invalid subpart replaced by U+FFFD goes to *clean and *owned (free it). */
pshard_status utf8_sanitize(const char *text, size_t len, const char **clean, size_t *clean_len,
                            char **owned);

/* GPT-2's reversible byte <-> printable code point table; code points of bytes are all below
 * BYTELEVEL_N_CPS, and byte_of_cp is -1 where no byte maps. */
enum { BYTELEVEL_N_CPS = 256 + 68 };
void bytelevel_tables(uint16_t cp_of_byte[256], int16_t byte_of_cp[BYTELEVEL_N_CPS]);

/* ---- vocabulary */

struct tok_entry {
    uint32_t text_off, text_len;   /* stored text in tok->arena */
    uint32_t piece_off, piece_len; /* decoded bytes in tok->arena */
    float score;
    int32_t type;
};

/* Open-addressing map from stored token text to id (first id wins on duplicates). A slot
 * carries the hash and the text's place, so a probe touches the slot and, on a likely hit,
 * the text: loading a large vocabulary is bound by these cache misses. */
struct tok_text_slot {
    uint32_t hash;
    int32_t id; /* -1: free */
    uint32_t text_off, text_len;
};
struct tok_text_map {
    uint32_t mask;
    struct tok_text_slot *slots;
};

/* Open-addressing map from a (left id, right id) pair to its merge rank and result; one slot
 * holds all three so a lookup while encoding costs one cache miss. */
struct tok_pair_slot {
    uint64_t key; /* TOK_PAIR_EMPTY when free */
    uint32_t rank;
    int32_t result;
};
struct tok_pair_map {
    uint32_t mask;
    struct tok_pair_slot *slots;
};
#define TOK_PAIR_EMPTY UINT64_MAX

enum { TOK_MAX_PATTERNS = 8 };

struct pretok {
    const char *name;
    int n_patterns;
    void *code[TOK_MAX_PATTERNS]; /* pcre2_code_8 * */
    bool ignore_merges;           /* a piece that is itself a token skips merging (Llama 3) */
};

/* Special tokens grouped by first byte, longest first, for leftmost-longest matching. */
struct tok_specials {
    uint32_t first[257]; /* ids[first[b] .. first[b+1]) start with byte b */
    int32_t *ids;
    uint32_t n_user_defined; /* 0: without parse_special there is nothing to look for */
};

struct tok {
    enum tok_model_kind kind;
    uint32_t n_tokens;
    struct tok_entry *entries;
    char *arena;
    struct tok_text_map map;
    struct tok_pair_map merges; /* BPE */
    int32_t byte_token[256];    /* the token of each single byte, -1 if none */
    bool has_byte_tokens;       /* SPM: some <0xXX> token exists (byte fallback) */
    uint16_t bytelevel_cp[256]; /* BPE: the code point each byte is written as in tokens */
    struct tok_specials specials;
    struct pretok pretok;       /* BPE */
    int32_t bos_id, eos_id, eot_id, eom_id, unk_id, pad_id;
    bool add_bos, add_eos, add_space_prefix;
    uint32_t max_text_len;  /* longest stored token text */
    uint32_t max_piece_len; /* longest decoded piece */
};

static inline const char *tok_text(const struct tok *tok, int32_t id) {
    return tok->arena + tok->entries[id].text_off;
}

/* ---- maps (map.c) */
uint64_t tok_hash_bytes(const char *s, size_t n);
pshard_status tok_text_map_build(struct tok *tok);
int32_t tok_text_map_find(const struct tok *tok, const char *s, size_t n);
/* The same with the hash given, so a batch of lookups can prefetch its slots first. */
int32_t tok_text_map_find_hashed(const struct tok *tok, const char *s, size_t n, uint64_t hash);
void tok_text_map_prefetch(const struct tok *tok, uint64_t hash);
/* Second stage, once the slot is cached: prefetch the text a likely hit will compare. */
void tok_text_map_prefetch_text(const struct tok *tok, uint64_t hash);
void tok_text_map_free(struct tok_text_map *map);
pshard_status tok_pair_map_init(struct tok_pair_map *map, uint32_t n_pairs);
void tok_pair_map_prefetch(const struct tok_pair_map *map, int32_t left, int32_t right);
/* Returns false if the pair was already present (the first rank is kept). */
bool tok_pair_map_put(struct tok_pair_map *map, int32_t left, int32_t right, uint32_t rank,
                      int32_t result);
bool tok_pair_map_get(const struct tok_pair_map *map, int32_t left, int32_t right, uint32_t *rank,
                      int32_t *result);
void tok_pair_map_free(struct tok_pair_map *map);

/* ---- growable id output */
pshard_status tok_ids_push(struct tok_ids *ids, int32_t id);

/* ---- per-call scratch, grown as needed; tok_scratch_free (pretok.c, which owns the regex
 * match data) releases it at the end of the call */
struct tok_scratch {
    void *match_data; /* pcre2_match_data_8 * */
    int32_t *sym_id;  /* BPE symbol ids / SPM symbol starts */
    int32_t *sym_len;
    int32_t *prev, *next;
    void *heap;
    size_t sym_cap, heap_cap, heap_n;
    char *buf; /* SPM escaped text, BPE byte-level word */
    size_t buf_cap;
};
pshard_status tok_scratch_reserve(struct tok_scratch *s, size_t n_symbols, size_t heap_entry_bytes);

/* A queued merge of the symbol at `left` with its right neighbour, in the scratch's heap:
 * lower key first (BPE: the merge rank; SentencePiece: minus the piece's score), then lower
 * left. a, b, c are the model's to recognize stale entries and to carry the result. */
struct tok_merge_cand {
    double key;
    int32_t left, a, b, c;
};
void tok_heap_push(struct tok_scratch *s, struct tok_merge_cand c);
struct tok_merge_cand tok_heap_pop(struct tok_scratch *s);
pshard_status tok_scratch_buf(struct tok_scratch *s, size_t bytes);
void tok_scratch_free(struct tok_scratch *s);

/* ---- pre-tokenizer (pretok.c) */
pshard_status pretok_init(struct pretok *pre, const char *name);
void pretok_free(struct pretok *pre);
/* Whether models with this pre-tokenizer add BOS when their GGUF does not say (Llama 3). */
bool pretok_adds_bos(const char *name);
typedef pshard_status (*pretok_visit_fn)(void *ctx, const char *piece, size_t len);
/* Calls visit on each piece of text, in order; the pieces tile the text exactly. */
pshard_status pretok_split(const struct pretok *pre, struct tok_scratch *scratch, const char *text,
                           size_t len, pretok_visit_fn visit, void *ctx);

/* ---- models */
pshard_status bpe_load_merges(struct tok *tok, const struct tok_vocab_desc *desc);
pshard_status bpe_encode_fragment(const struct tok *tok, struct tok_scratch *scratch, const char *text,
                                  size_t len, struct tok_ids *ids);
pshard_status spm_encode_fragment(const struct tok *tok, struct tok_scratch *scratch, const char *text,
                                  size_t len, bool space_prefix, struct tok_ids *ids);

/* ---- special tokens (special.c) */
pshard_status tok_specials_build(struct tok *tok);
void tok_specials_free(struct tok_specials *sp);
/* Finds the leftmost, then longest, special token in text[0..len); returns its id and sets
 * *at, or returns -1. parse_special admits CONTROL and UNKNOWN tokens. */
int32_t tok_specials_find(const struct tok *tok, const char *text, size_t len, bool parse_special,
                          size_t *at);

/* ---- pieces (decode.c) */
pshard_status tok_build_pieces(struct tok *tok, size_t *arena_used, size_t arena_cap);

#endif
