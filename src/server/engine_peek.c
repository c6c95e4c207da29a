/* What the server needs from the context that the public API does not give yet: a token's bytes
 * (OpenAI's log-probabilities name each token) and a prompt's tokens (to size a request's default
 * token limit from its prompt). Both read the context's tokenizer; like every other use of the
 * context, they run on the engine thread only. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "server/engine_peek.h"
#include "tok/tok.h"

int server_token_piece(pshard_ctx *ctx, int32_t token, const char **piece, size_t *len) {
    *piece = "", *len = 0;
    if (token < 0 || (uint32_t)token >= tok_n_tokens(ctx->tok)) return -1;
    return tok_token_to_piece(ctx->tok, token, TOK_DECODE_SPECIAL, piece, len) == PSHARD_OK ? 0 : -1;
}

pshard_status server_tokenize(pshard_ctx *ctx, const char *text, int32_t **tokens, int32_t *n_tokens) {
    struct tok_ids ids = {0};
    *tokens = NULL, *n_tokens = 0;
    /* as pshard_request_add tokenizes a prompt: BOS as the model wants it, special-token text read */
    const pshard_status st = tok_encode(ctx->tok, text, strlen(text), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &ids);
    if (st != PSHARD_OK || ids.n > INT32_MAX) {
        tok_ids_free(&ids);
        return st != PSHARD_OK ? st : PSHARD_ERR_RANGE;
    }
    *tokens = ids.ids, *n_tokens = (int32_t)ids.n; /* the caller frees them */
    return PSHARD_OK;
}
