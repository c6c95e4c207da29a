/* A token's bytes and a prompt's tokens, read from the context's tokenizer (see engine_peek.c). */
#ifndef SERVER_ENGINE_PEEK_H
#define SERVER_ENGINE_PEEK_H

#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

/* *piece points into the tokenizer; 0, or -1 for a token outside the vocabulary ("" given). */
int server_token_piece(pshard_ctx *ctx, int32_t token, const char **piece, size_t *len);
/* The tokens of a prompt as pshard_request_add would make them; *tokens is malloc'd. */
pshard_status server_tokenize(pshard_ctx *ctx, const char *text, int32_t **tokens, int32_t *n_tokens);

#endif
