/* Images in the one-sequence calls (pshard_generate, pshard_chat): the mmproj's encoder attached
 * to a context, the images of a conversation kept by content, and a prompt whose markers become
 * image tokens, read in steps that carry the images' embeddings and every token's multimodal
 * rope positions. */
#ifndef ENGINE_VISION_H
#define ENGINE_VISION_H

#include "exec/exec.h"
#include "pshard.h"

struct engine_vision;

void engine_vision_free(struct engine_vision *v);

/* Tokenize `prompt` into ctx->prompt with its images (opts->images, one per marker), encoding
 * those not kept from earlier calls (counted and timed in stats). An image token is stored as a key that names its image
 * (negative: never a vocabulary id), so the cached prefix is reused only where the same images
 * sit at the same places. Without markers and images this is the plain tokenization. */
pshard_status engine_vision_prompt(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts, int32_t *n_prompt,
                                   pshard_gen_stats *stats);

/* A prompt step over tokens [start, start + b->n_tokens): shortened so it holds at most one
 * image's run, with vocabulary ids for b->tokens; returns its rope positions (where images moved
 * them) and the image's embedding rows, or NULL where the prompt has no image. */
const struct exec_media *engine_vision_prompt_step(pshard_ctx *ctx, int32_t start, struct exec_batch *b);

/* The rope positions of a generated token at cell `pos` (after the prompt): NULL where they are
 * the cell's; else three positions written to out. */
const int32_t *engine_vision_decode_rope(const pshard_ctx *ctx, int32_t pos, int32_t out[3]);

#endif
