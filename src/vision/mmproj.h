/* The vision side of a vision-language model: an "mmproj" GGUF as llama.cpp writes it
 * (general.architecture "clip"), holding the vision encoder (a ViT) and the projector that maps
 * its output into the language model's embedding space. Loading reads the hyperparameters from
 * the clip.* keys, checks them, and binds every tensor by role with its expected shape, so a
 * bad file fails here with a message naming the key or tensor, never later in a kernel.
 *
 * Supported projector: "qwen2.5vl_merger" (Qwen2.5-VL, Cosmos-Reason1): RMS-normed blocks with
 * separate Q/K/V (with biases), a SiLU-gated FFN, window attention in every layer but each
 * n_wa_pattern-th, a final RMS norm, and a merger MLP over 2x2 neighbouring patches (GELU). */
#ifndef VISION_MMPROJ_H
#define VISION_MMPROJ_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"

enum vision_projector { VISION_PROJECTOR_UNKNOWN, VISION_PROJECTOR_QWEN25VL };

enum { VISION_MAX_LAYERS = 256, VISION_TEMPORAL_PATCH = 2 };

struct vision_hparams {
    enum vision_projector projector;
    char projector_name[48];     /* as the file spells it */
    uint32_t image_size;         /* the largest side the model was made for (informative) */
    uint32_t patch_size;         /* pixels per patch side (14) */
    uint32_t spatial_merge;      /* patches merged per side by the projector (2) */
    uint32_t n_embd, n_ff, n_layer, n_head, head_dim;
    uint32_t projection_dim;     /* the language model's embedding width */
    float eps;                   /* RMS norm epsilon */
    float image_mean[3], image_std[3];
    /* Window attention: window side in pixels (112 when the file does not say), and which
     * layers attend over the whole image instead of within their window. */
    uint32_t window_size;
    uint32_t n_wa_pattern;       /* every n-th layer is a full-attention one; 0 when given as a list */
    uint32_t n_full_attention;
    bool full_attention[VISION_MAX_LAYERS];
    /* Total pixels an image is resized into (smart resize): the file's clip.vision.image_min/
     * max_pixels when present, else Qwen2.5-VL's processor defaults (3136 and 12845056). */
    uint64_t min_pixels, max_pixels;
};

struct vision_layer {
    const struct gguf_tensor *ln1, *ln2;                    /* RMS norm gains */
    const struct gguf_tensor *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b;
    const struct gguf_tensor *gate_w, *gate_b, *up_w, *up_b, *down_w, *down_b;
};

struct mmproj {
    struct gguf_file *file; /* borrowed: the caller opens and closes it */
    struct vision_hparams hp;
    /* The Conv3d patch embedding as llama.cpp splits it: one [P, P, 3, n_embd] kernel per
     * temporal slice (a still image is the same picture in both). */
    const struct gguf_tensor *patch_embd[VISION_TEMPORAL_PATCH];
    struct vision_layer *layers;
    const struct gguf_tensor *post_ln;                      /* the merger's RMS norm (ln_q) */
    const struct gguf_tensor *mm0_w, *mm0_b, *mm2_w, *mm2_b; /* merger MLP: 4E -> 4E -> projection */
    uint64_t weight_bytes;
};

/* True when the file says general.architecture = "clip". */
bool mmproj_is_mmproj(const struct gguf_file *file);

/* Read, check and bind an mmproj file. On failure nothing needs freeing. */
pshard_status mmproj_load(struct gguf_file *file, struct mmproj *out);
void mmproj_free(struct mmproj *m);

/* Only the hyperparameters (no tensors bound). */
pshard_status mmproj_read_hparams(const struct gguf_file *file, struct vision_hparams *hp);

/* The number of merged image tokens an image of grid_h x grid_w patches becomes. */
static inline uint64_t vision_tokens_for_grid(const struct vision_hparams *hp, uint32_t grid_h, uint32_t grid_w) {
    return (uint64_t)(grid_h / hp->spatial_merge) * (grid_w / hp->spatial_merge);
}

#endif
