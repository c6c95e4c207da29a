/* A token's bytes (log-probabilities need them; see token_piece.c). */
#ifndef SERVER_TOKEN_PIECE_H
#define SERVER_TOKEN_PIECE_H

#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

/* *piece points into the tokenizer; 0, or -1 for a token outside the vocabulary ("" given). */
int server_token_piece(pshard_ctx *ctx, int32_t token, const char **piece, size_t *len);

#endif
