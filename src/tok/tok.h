/* Tokenizer: text <-> token ids for GGUF models. Two model kinds: byte-level BPE
 * (tokenizer.ggml.model = "gpt2", GPT-2/Llama 3/Qwen/SmolLM style) and SentencePiece-style BPE
 * ("llama": score-driven merges with <0xXX> byte fallback).
 *
 * A `struct tok` is immutable once created, so one tokenizer may be used from many threads at
 * once; every encode call allocates its own scratch.
 *
 * Behaviours worth knowing (tests/test_tok.c pins each one):
 * - Input that is not valid UTF-8 is encoded as if every maximal invalid subsequence were
 *   U+FFFD (the replacement Python's bytes.decode(errors="replace") makes), so the result
 *   equals what HF tokenizers give for that decoded string. Never an error, never a read out
 *   of bounds.
 * - An unknown tokenizer.ggml.pre (or none) falls back to the GPT-2 split with a warning.
 * - Byte-level BPE leaves out a byte the vocabulary has no token for (as HF does); SPM spells
 *   a character that is no piece with its <0xXX> byte tokens, or UNK without them.
 * - USER_DEFINED tokens are always matched in text (as HF added tokens and SentencePiece
 *   user symbols are); CONTROL and UNKNOWN tokens only with TOK_PARSE_SPECIAL. Matching is
 *   leftmost, then longest.
 * - SentencePiece space prefix: with add_space_prefix a "▁" goes before the first text
 *   fragment and before text that follows a special token, as llama.cpp (the GGUF reference)
 *   and the legacy HF Llama tokenizer do. */
#ifndef TOK_TOK_H
#define TOK_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

struct gguf_file;

enum tok_model_kind {
    TOK_MODEL_BPE = 0, /* byte-level BPE, merges by rank ("gpt2") */
    TOK_MODEL_SPM = 1, /* SentencePiece BPE, merges by score, byte fallback ("llama") */
};

/* Token types as GGUF's tokenizer.ggml.token_type stores them. */
enum tok_token_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Encode flags. */
enum {
    TOK_ADD_SPECIAL = 1 << 0,   /* add BOS/EOS as the model's add_bos/add_eos say */
    TOK_PARSE_SPECIAL = 1 << 1, /* match CONTROL/UNKNOWN token texts in the input */
};

/* Decode flags. */
enum {
    TOK_DECODE_SPECIAL = 1 << 0,     /* render CONTROL tokens as their text (else as "") */
    TOK_DECODE_STRIP_SPACE = 1 << 1, /* drop the leading space of the first piece when the
                                        model adds a space prefix (SPM whole-text decode) */
};

/* A vocabulary from plain arrays. Strings are copied; the arrays need not outlive the call. */
struct tok_vocab_desc {
    enum tok_model_kind kind;
    uint32_t n_tokens;
    const char *const *tokens;   /* token texts as GGUF stores them (byte-level or "▁" form) */
    const uint32_t *token_lens;  /* byte lengths, or NULL when the texts are NUL-terminated */
    const float *scores;         /* NULL: all 0 (SPM merges need real scores) */
    const int32_t *token_types;  /* enum tok_token_type each; NULL: all NORMAL */
    uint32_t n_merges;           /* BPE only: "left right", earlier = higher priority */
    const char *const *merges;
    const uint32_t *merge_lens;  /* or NULL when NUL-terminated */
    const char *pre;             /* tokenizer.ggml.pre; NULL or unknown: GPT-2 with a warning */
    int32_t bos_id, eos_id, eot_id, eom_id, unk_id, pad_id; /* -1: none */
    bool add_bos, add_eos, add_space_prefix;
};

struct tok;

pshard_status tok_create(const struct tok_vocab_desc *desc, struct tok **out);

/* Reads the tokenizer.ggml.* keys. Missing flags default as llama.cpp does: add_bos is true
 * for "llama" and for the Llama 3 / Tekken pre-tokenizers, false for other "gpt2" models;
 * add_space_prefix is true for "llama". */
pshard_status tok_from_gguf(const struct gguf_file *file, struct tok **out);

/* Opens a GGUF file, reads its tokenizer, closes it (for tools and the Python tests). */
pshard_status tok_load_gguf_path(const char *path, struct tok **out);

void tok_free(struct tok *tok);

/* A growable array of token ids owned by the caller; start it zeroed, free with tok_ids_free. */
struct tok_ids {
    int32_t *ids;
    size_t n;
    size_t cap;
};
void tok_ids_free(struct tok_ids *ids);

/* Appends the tokens of `text` (len bytes, any bytes) to `ids`. flags: TOK_ADD_SPECIAL,
 * TOK_PARSE_SPECIAL. */
pshard_status tok_encode(const struct tok *tok, const char *text, size_t len, int flags,
                         struct tok_ids *ids);

/* Same into a caller buffer: *n_out is the token count; PSHARD_ERR_RANGE when it exceeds cap
 * (then *n_out says how many are needed and `out` holds the first cap). */
pshard_status tok_encode_into(const struct tok *tok, const char *text, size_t len, int flags,
                              int32_t *out, size_t cap, size_t *n_out);

/* The bytes a token stands for (byte-level and "▁" undone, <0xXX> as its byte). CONTROL
 * tokens give "" unless flags has TOK_DECODE_SPECIAL. Points into the tokenizer. */
pshard_status tok_token_to_piece(const struct tok *tok, int32_t id, int flags,
                                 const char **piece, size_t *len);

/* Streaming detokenizer: push tokens one at a time and get back only complete UTF-8
 * characters; bytes of a character split across tokens wait for the rest. Bytes that can
 * never form a character come out as U+FFFD, as does an unfinished character at flush. */
struct tok_decoder;
pshard_status tok_decoder_create(const struct tok *tok, int flags, struct tok_decoder **out);
void tok_decoder_free(struct tok_decoder *dec);
void tok_decoder_reset(struct tok_decoder *dec);
/* *text points into the decoder and stays valid until its next call. */
pshard_status tok_decoder_push(struct tok_decoder *dec, int32_t id, const char **text, size_t *len);
pshard_status tok_decoder_flush(struct tok_decoder *dec, const char **text, size_t *len);

/* Whole-sequence decode into a caller buffer (PSHARD_ERR_RANGE as tok_encode_into). */
pshard_status tok_decode_into(const struct tok *tok, const int32_t *ids, size_t n_ids, int flags,
                              char *out, size_t cap, size_t *n_out);

/* Vocabulary facts. */
uint32_t tok_n_tokens(const struct tok *tok);
enum tok_model_kind tok_kind(const struct tok *tok);
const char *tok_pre_name(const struct tok *tok); /* the pre-tokenizer actually used */
int32_t tok_bos(const struct tok *tok);
int32_t tok_eos(const struct tok *tok);
int32_t tok_eot(const struct tok *tok);
int32_t tok_eom(const struct tok *tok);
int32_t tok_unk(const struct tok *tok);
int32_t tok_pad(const struct tok *tok);
bool tok_add_bos(const struct tok *tok);
bool tok_add_eos(const struct tok *tok);
bool tok_is_eog(const struct tok *tok, int32_t id); /* EOS, EOT or EOM: generation ends */
int tok_token_type(const struct tok *tok, int32_t id); /* -1 when out of range */
/* The stored text of a token (as in the GGUF), or NULL when out of range. */
const char *tok_token_text(const struct tok *tok, int32_t id, size_t *len);
/* The id whose stored text is exactly `text`, or -1. */
int32_t tok_find(const struct tok *tok, const char *text, size_t len);

#endif
