/* Tokens back to text: each token's bytes are decoded once at load ("piece"), and a streaming
 * decoder joins pieces, holding back the bytes of a character split across tokens so a caller
 * printing as it generates only ever sees whole UTF-8 characters. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xAB>" -> 0xAB, or -1. */
static int byte_token_value(const char *text, size_t n) {
    if (n != 6 || memcmp(text, "<0x", 3) != 0 || text[5] != '>') return -1;
    int hi = hex_value(text[3]), lo = hex_value(text[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Byte-level text back to bytes; false if a character is outside GPT-2's table (then the
 * token is not byte-level text, e.g. an added token, and its text is its piece). Every code
 * point of the table is below U+0800, so only one- and two-byte sequences can match. */
static bool bytelevel_decode(const char *text, size_t n, const int16_t *byte_of_cp, char *out,
                             size_t *out_len) {
    const uint8_t *c = (const uint8_t *)text;
    size_t o = 0;
    for (size_t i = 0; i < n; o++) {
        uint32_t cp;
        if (c[i] < 0x80) {
            cp = c[i++];
        } else if (c[i] >= 0xC2 && c[i] <= 0xDF && i + 1 < n && (c[i + 1] & 0xC0) == 0x80) {
            cp = ((c[i] & 0x1Fu) << 6) | (c[i + 1] & 0x3Fu);
            i += 2;
        } else {
            return false;
        }
        if (cp >= BYTELEVEL_N_CPS || byte_of_cp[cp] < 0) return false;
        out[o] = (char)byte_of_cp[cp];
    }
    *out_len = o;
    return true;
}

pshard_status tok_build_pieces(struct tok *tok, size_t *arena_used, size_t arena_cap) {
    uint16_t cp_of_byte[256];
    int16_t byte_of_cp[BYTELEVEL_N_CPS];
    bytelevel_tables(cp_of_byte, byte_of_cp);
    size_t used = *arena_used;
    for (uint32_t id = 0; id < tok->n_tokens; id++) {
        struct tok_entry *e = &tok->entries[id];
        const char *text = tok_text(tok, (int32_t)id);
        size_t n = e->text_len;
        if (used + n > arena_cap) return core_fail(PSHARD_ERR_INTERNAL, "token piece arena overflow");
        char *piece = tok->arena + used;
        size_t piece_len = n;
        bool literal = e->type == TOK_TYPE_CONTROL || e->type == TOK_TYPE_USER_DEFINED ||
                       e->type == TOK_TYPE_UNKNOWN;
        int byte = e->type == TOK_TYPE_BYTE ? byte_token_value(text, n) : -1;
        if (byte >= 0) {
            piece[0] = (char)byte;
            piece_len = 1;
        } else if (literal) {
            memcpy(piece, text, n);
        } else if (tok->kind == TOK_MODEL_BPE) {
            if (!bytelevel_decode(text, n, byte_of_cp, piece, &piece_len)) memcpy(piece, text, n);
        } else {
            /* SentencePiece writes spaces as U+2581 (E2 96 81). */
            piece_len = 0;
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(text + i, "\xE2\x96\x81", 3) == 0) {
                    piece[piece_len++] = ' ';
                    i += 3;
                } else {
                    piece[piece_len++] = text[i++];
                }
            }
        }
        e->piece_off = (uint32_t)used;
        e->piece_len = (uint32_t)piece_len;
        used += piece_len;
        if (piece_len > tok->max_piece_len) tok->max_piece_len = (uint32_t)piece_len;
    }
    *arena_used = used;
    return PSHARD_OK;
}

pshard_status tok_token_to_piece(const struct tok *tok, int32_t id, int flags, const char **piece,
                                 size_t *len) {
    if (!tok || !piece || !len) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_token_to_piece: null argument");
    if (id < 0 || (uint32_t)id >= tok->n_tokens)
        return core_fail(PSHARD_ERR_RANGE, "token id %d is outside the vocabulary of %u", id, tok->n_tokens);
    const struct tok_entry *e = &tok->entries[id];
    *piece = tok->arena + e->piece_off;
    *len = e->type == TOK_TYPE_CONTROL && !(flags & TOK_DECODE_SPECIAL) ? 0 : e->piece_len;
    return PSHARD_OK;
}

struct tok_decoder {
    const struct tok *tok;
    int flags;
    bool strip_pending; /* the next text piece loses a leading space */
    uint8_t held[4];    /* start of a character still waiting for its other bytes */
    size_t n_held;
    char *in;  /* held bytes + the new piece */
    char *out; /* complete characters; 3 bytes per input byte at worst (all U+FFFD) */
};

pshard_status tok_decoder_create(const struct tok *tok, int flags, struct tok_decoder **out) {
    if (!tok || !out) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_decoder_create: null argument");
    *out = NULL;
    struct tok_decoder *dec = calloc(1, sizeof *dec);
    size_t in_cap = (size_t)tok->max_piece_len + sizeof dec->held;
    if (dec) {
        dec->in = malloc(in_cap);
        dec->out = malloc(3 * in_cap);
    }
    if (!dec || !dec->in || !dec->out) {
        tok_decoder_free(dec);
        return core_fail(PSHARD_ERR_NOMEM, "no memory for a decoder");
    }
    dec->tok = tok;
    dec->flags = flags;
    tok_decoder_reset(dec);
    *out = dec;
    return PSHARD_OK;
}

void tok_decoder_free(struct tok_decoder *dec) {
    if (!dec) return;
    free(dec->in);
    free(dec->out);
    free(dec);
}

void tok_decoder_reset(struct tok_decoder *dec) {
    dec->n_held = 0;
    dec->strip_pending = (dec->flags & TOK_DECODE_STRIP_SPACE) && dec->tok->add_space_prefix;
}

static const char replacement_utf8[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

pshard_status tok_decoder_push(struct tok_decoder *dec, int32_t id, const char **text, size_t *len) {
    if (!dec || !text || !len) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_decoder_push: null argument");
    *text = dec->out;
    *len = 0;
    const char *piece;
    size_t piece_len;
    CORE_TRY(tok_token_to_piece(dec->tok, id, dec->flags, &piece, &piece_len));
    if (dec->strip_pending && dec->tok->entries[id].type != TOK_TYPE_CONTROL && piece_len > 0) {
        if (piece[0] == ' ') {
            piece++;
            piece_len--;
        }
        dec->strip_pending = false;
    }
    memcpy(dec->in, dec->held, dec->n_held);
    if (piece_len) memcpy(dec->in + dec->n_held, piece, piece_len);
    size_t n = dec->n_held + piece_len, o = 0, i = 0;
    dec->n_held = 0;
    while (i < n) {
        size_t step;
        enum utf8_result r = utf8_next((const uint8_t *)dec->in + i, n - i, &step);
        if (r == UTF8_INCOMPLETE) {
            memcpy(dec->held, dec->in + i, step); /* step < 4: an unfinished character */
            dec->n_held = step;
            break;
        }
        if (r == UTF8_OK) {
            memcpy(dec->out + o, dec->in + i, step);
            o += step;
        } else {
            memcpy(dec->out + o, replacement_utf8, 3);
            o += 3;
        }
        i += step;
    }
    *len = o;
    return PSHARD_OK;
}

pshard_status tok_decoder_flush(struct tok_decoder *dec, const char **text, size_t *len) {
    if (!dec || !text || !len) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_decoder_flush: null argument");
    *text = dec->out;
    *len = 0;
    if (dec->n_held) {
        memcpy(dec->out, replacement_utf8, 3); /* an unfinished character is one U+FFFD */
        *len = 3;
    }
    tok_decoder_reset(dec);
    return PSHARD_OK;
}

pshard_status tok_decode_into(const struct tok *tok, const int32_t *ids, size_t n_ids, int flags,
                              char *out, size_t cap, size_t *n_out) {
    if (!n_out || (!ids && n_ids) || (!out && cap))
        return core_fail(PSHARD_ERR_INVALID_ARG, "tok_decode_into: null argument");
    *n_out = 0;
    struct tok_decoder *dec;
    CORE_TRY(tok_decoder_create(tok, flags, &dec));
    size_t total = 0;
    pshard_status status = PSHARD_OK;
    for (size_t k = 0; k <= n_ids && status == PSHARD_OK; k++) {
        const char *text;
        size_t len;
        status = k < n_ids ? tok_decoder_push(dec, ids[k], &text, &len) : tok_decoder_flush(dec, &text, &len);
        if (status != PSHARD_OK) break;
        if (total < cap) memcpy(out + total, text, len < cap - total ? len : cap - total);
        total += len;
    }
    tok_decoder_free(dec);
    CORE_TRY(status);
    *n_out = total;
    if (total > cap) return core_fail(PSHARD_ERR_RANGE, "%zu bytes of text do not fit in %zu", total, cap);
    return PSHARD_OK;
}
