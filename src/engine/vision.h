/* Images in prompts: the mmproj's encoder attached to a context, the images it keeps by content,
 * and prompts whose markers become image tokens, read in steps that carry the images'
 * embeddings and every token's multimodal rope positions. The one-sequence calls (pshard_generate,
 * pshard_chat) keep one prompt's images; each request of the batched engine keeps its own. */
#ifndef ENGINE_VISION_H
#define ENGINE_VISION_H

#include <stdbool.h>

#include "exec/exec.h"
#include "pshard.h"

struct engine_vision;
struct image_run;
struct vision_hparams;

/* Where a prompt's images are (runs of tokens, each holding its image while the prompt lives)
 * and, where it has any, each prompt token's rope positions. Zeroed: a prompt without images. */
struct engine_images {
    struct image_run *runs;
    int32_t n_runs;
    size_t cap_runs;
    int32_t *rope;      /* [3][n_prompt]: time, row, column of each prompt token; NULL without images */
    int32_t n_prompt;
    int32_t rope_shift; /* after the prompt: a cell's position minus its rope position */
};

void engine_vision_free(struct engine_vision *v);

/* Tokenize `prompt` into ctx->prompt with its images (opts->images, one per marker; its
 * parse_special and on_image too), encoding those not kept (counted and timed in stats, which may
 * be NULL); *images holds them (engine_images_release). An image token is stored as a key that
 * names its image (negative: never a vocabulary id), so cached cells are reused only where the
 * same images sit at the same places. Without markers and images this is the plain tokenization;
 * without an encoder, markers are text. */
pshard_status engine_vision_tokenize(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts,
                                     struct engine_images *images, int32_t *n_prompt, pshard_gen_stats *stats);
void engine_images_release(struct engine_images *images);

/* Of prompt tokens [start, start + n): how many one step may carry so that it holds at most one
 * image's run, or none where !allow_image (then it ends before the first image token, maybe at 0
 * tokens). The run's rows go to media->embd (NULL: none), its tokens' place relative to start to
 * embd_first and embd_count; rope_pos is left alone. */
int32_t engine_images_piece(const pshard_ctx *ctx, const struct engine_images *images, int32_t start, int32_t n,
                            bool allow_image, struct exec_media *media);

/* The rope positions of the token at cell `pos`: from the table for a prompt token, the cell's
 * position less the lag after the prompt. */
void engine_images_rope(const struct engine_images *images, int32_t pos, int32_t out[3]);

/* The attached encoder's settings (NULL: none attached). */
const struct vision_hparams *engine_vision_hparams(const pshard_ctx *ctx);

/* The vocabulary id a prompt token is read as: image keys as <|image_pad|> (their rows come from
 * the embeddings). */
int32_t engine_vision_token(const pshard_ctx *ctx, int32_t id);

/* The one-sequence calls: the prompt's tokens and images (engine_vision_tokenize), kept for its
 * steps until the next call. */
pshard_status engine_vision_prompt(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts, int32_t *n_prompt,
                                   pshard_gen_stats *stats);

/* A prompt step of the one-sequence calls over tokens [start, start + b->n_tokens): shortened so
 * it holds at most one image's run, with vocabulary ids for b->tokens; returns its rope positions
 * (where images moved them) and the image's embedding rows, or NULL where the prompt has no image. */
const struct exec_media *engine_vision_prompt_step(pshard_ctx *ctx, int32_t start, struct exec_batch *b);

/* The rope positions of a generated token at cell `pos` (after the prompt): NULL where they are
 * the cell's; else three positions written to out. */
const int32_t *engine_vision_decode_rope(const pshard_ctx *ctx, int32_t pos, int32_t out[3]);

#endif
