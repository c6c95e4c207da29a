/* Tokens of a text and a token's bytes: of an open context's model, or of a model's tokenizer read
 * alone (pshard_vocab, for `pshard tokenize`: no weights, no executor). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine_internal.h"

struct pshard_vocab {
    struct tok *tok;
};

static pshard_status tokenize(const struct tok *tok, const char *text, int parse_special, int32_t **tokens, int32_t *n_tokens) {
    *tokens = NULL, *n_tokens = 0;
    struct tok_ids ids = {0};
    pshard_status st = tok_encode(tok, text, strlen(text), TOK_ADD_SPECIAL | (parse_special ? TOK_PARSE_SPECIAL : 0), &ids);
    if (st == PSHARD_OK && ids.n > INT32_MAX) st = core_fail(PSHARD_ERR_RANGE, "the text has more than %d tokens", INT32_MAX);
    if (st != PSHARD_OK) {
        tok_ids_free(&ids);
        return st;
    }
    *tokens = ids.ids, *n_tokens = (int32_t)ids.n;
    return PSHARD_OK;
}

static pshard_status token_piece(const struct tok *tok, int32_t token, const char **piece, size_t *len) {
    *piece = "", *len = 0;
    if (token < 0 || (uint32_t)token >= tok_n_tokens(tok))
        return core_fail(PSHARD_ERR_INVALID_ARG, "token %d is outside the vocabulary (%u)", token, tok_n_tokens(tok));
    return tok_token_to_piece(tok, token, TOK_DECODE_SPECIAL, piece, len);
}

pshard_status pshard_tokenize(pshard_ctx *ctx, const char *text, int parse_special, int32_t **tokens, int32_t *n_tokens) {
    if (!ctx || !text || !tokens || !n_tokens) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_tokenize: a NULL argument");
    return tokenize(ctx->tok, text, parse_special, tokens, n_tokens);
}

pshard_status pshard_token_piece(const pshard_ctx *ctx, int32_t token, const char **piece, size_t *len) {
    return token_piece(ctx->tok, token, piece, len);
}

pshard_status pshard_vocab_load(const char *model_path, pshard_vocab **out) {
    if (!model_path || !out) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_vocab_load: a NULL argument");
    *out = NULL;
    struct tok *tok;
    CORE_TRY(tok_load_gguf_path(model_path, &tok));
    if (!(*out = malloc(sizeof **out))) {
        tok_free(tok);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    }
    (*out)->tok = tok;
    return PSHARD_OK;
}

void pshard_vocab_free(pshard_vocab *vocab) {
    if (!vocab) return;
    tok_free(vocab->tok);
    free(vocab);
}

pshard_status pshard_vocab_tokenize(const pshard_vocab *vocab, const char *text, int parse_special, int32_t **tokens,
                                    int32_t *n_tokens) {
    if (!vocab || !text || !tokens || !n_tokens) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_vocab_tokenize: a NULL argument");
    return tokenize(vocab->tok, text, parse_special, tokens, n_tokens);
}

pshard_status pshard_vocab_piece(const pshard_vocab *vocab, int32_t token, const char **piece, size_t *len) {
    return token_piece(vocab->tok, token, piece, len);
}
