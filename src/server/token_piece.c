/* A token's bytes, for log-probabilities (OpenAI gives each token's text and bytes). The public
 * API has no call for it yet, so this one reads the context's tokenizer; it runs on the engine
 * thread only, like every other use of the context. */
#include "engine/engine_internal.h"
#include "server/token_piece.h"
#include "tok/tok.h"

int server_token_piece(pshard_ctx *ctx, int32_t token, const char **piece, size_t *len) {
    *piece = "", *len = 0;
    if (token < 0 || (uint32_t)token >= tok_n_tokens(ctx->tok)) return -1;
    return tok_token_to_piece(ctx->tok, token, TOK_DECODE_SPECIAL, piece, len) == PSHARD_OK ? 0 : -1;
}
