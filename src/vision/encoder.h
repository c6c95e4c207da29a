/* The Qwen2.5-VL vision encoder on the CPU, a plain reference: patch embedding, blocks with 2D
 * rotary attention (within 112-pixel windows, or over the whole image in the full-attention
 * layers) and a SiLU-gated MLP, then the merger that turns each 2x2 group of patches into one
 * token of the language model's width. Allocation per call, float32 activations: correctness
 * first; the GPU version is to be checked against it. */
#ifndef VISION_ENCODER_H
#define VISION_ENCODER_H

#include <stdint.h>

#include "vision/mmproj.h"
#include "vision/preprocess.h"

/* One image's embeddings: n_tokens rows of n_embd floats, in raster order of the 2x2 groups. */
struct vision_embeddings {
    uint32_t n_tokens, n_embd;
    float *data;
};

struct threadpool;

/* Hears how far an encode got: blocks done of all (the merger counts as one more); return
 * nonzero to stop it (the encode then fails, saying so). */
struct vision_progress {
    int (*fn)(void *user, uint32_t done, uint32_t total);
    void *user;
};

/* Tell progress (may be NULL) that `done` of `total` steps are done; its refusal becomes an error
 * saying where the encoding stopped. */
pshard_status vision_progress_report(const struct vision_progress *progress, uint32_t done, uint32_t total);

/* Encode preprocessed patches (vision_preprocess with the same file's hyperparameters), on
 * `pool`'s threads, or on the caller's alone when it is NULL; progress may be NULL. */
pshard_status vision_encode(const struct mmproj *m, const struct vision_patches *patches, struct threadpool *pool,
                            const struct vision_progress *progress, struct vision_embeddings *out);
void vision_embeddings_free(struct vision_embeddings *e);

/* The window (0-based, row-major over windows) a patch at (row, col) belongs to, for a grid
 * grid_w patches wide: windows are window_size / patch_size / merge merged units a side. */
uint32_t vision_window_of(const struct vision_hparams *hp, uint32_t grid_w, uint32_t row, uint32_t col);

#endif
