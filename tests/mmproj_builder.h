/* A small Qwen2.5-VL mmproj file for the vision tests (F32 or F16 by tensor, data left zero for
 * the test to fill): the keys the reader requires, every second block attending over the whole
 * image (n_wa_pattern 2), and each tensor by name and shape as the model has them. */
#ifndef TESTS_MMPROJ_BUILDER_H
#define TESTS_MMPROJ_BUILDER_H

#include <stdio.h>

#include "gguf_builder.h"

struct tb_mmproj_shape {
    uint32_t patch, embd, ff, layers, heads, proj; /* patch side, width, MLP width, blocks, heads, output width */
    float mean[3], std[3];                         /* the preprocessor's normalization */
};

/* The whole file, malloc'ed (free it); *size gets its length. */
static inline uint8_t *tb_mmproj(const struct tb_mmproj_shape *s, size_t *size) {
    const uint32_t P = s->patch, E = s->embd, FF = s->ff, PROJ = s->proj;
    const int LAYERS = (int)s->layers;
    struct tb_file f = {0};
    tb_kv_str(&f, "general.architecture", "clip");
    tb_kv_str(&f, "clip.projector_type", "qwen2.5vl_merger");
    tb_kv_u32(&f, "clip.vision.projection_dim", PROJ);
    tb_kv_u32(&f, "clip.vision.image_size", 560);
    tb_kv_u32(&f, "clip.vision.patch_size", P);
    tb_kv_u32(&f, "clip.vision.embedding_length", E);
    tb_kv_u32(&f, "clip.vision.feed_forward_length", FF);
    tb_kv_u32(&f, "clip.vision.block_count", LAYERS);
    tb_kv_u32(&f, "clip.vision.attention.head_count", s->heads);
    tb_kv_f32s(&f, "clip.vision.image_mean", s->mean, 3);
    tb_kv_f32s(&f, "clip.vision.image_std", s->std, 3);
    tb_kv_f32(&f, "clip.vision.attention.layer_norm_epsilon", 1e-6f);
    tb_kv_u32(&f, "clip.vision.n_wa_pattern", 2);
    tb_tensor(&f, "v.patch_embd.weight", 0, 4, P, P, 3, E);
    tb_tensor(&f, "v.patch_embd.weight.1", 0, 4, P, P, 3, E);
    static const char *const mats[] = {"attn_q", "attn_k", "attn_v", "attn_out"};
    char name[96];
    for (int il = 0; il < LAYERS; il++) {
        snprintf(name, sizeof name, "v.blk.%d.ln1.weight", il), tb_tensor(&f, name, 0, 1, E, 1, 1, 1);
        snprintf(name, sizeof name, "v.blk.%d.ln2.weight", il), tb_tensor(&f, name, 0, 1, E, 1, 1, 1);
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "v.blk.%d.%s.weight", il, mats[k]), tb_tensor(&f, name, 0, 2, E, E, 1, 1);
            snprintf(name, sizeof name, "v.blk.%d.%s.bias", il, mats[k]), tb_tensor(&f, name, 0, 1, E, 1, 1, 1);
        }
        snprintf(name, sizeof name, "v.blk.%d.ffn_gate.weight", il), tb_tensor(&f, name, 0, 2, E, FF, 1, 1);
        snprintf(name, sizeof name, "v.blk.%d.ffn_gate.bias", il), tb_tensor(&f, name, 0, 1, FF, 1, 1, 1);
        snprintf(name, sizeof name, "v.blk.%d.ffn_up.weight", il), tb_tensor(&f, name, 0, 2, E, FF, 1, 1);
        snprintf(name, sizeof name, "v.blk.%d.ffn_up.bias", il), tb_tensor(&f, name, 0, 1, FF, 1, 1, 1);
        snprintf(name, sizeof name, "v.blk.%d.ffn_down.weight", il), tb_tensor(&f, name, 0, 2, FF, E, 1, 1);
        snprintf(name, sizeof name, "v.blk.%d.ffn_down.bias", il), tb_tensor(&f, name, 0, 1, E, 1, 1, 1);
    }
    tb_tensor(&f, "v.post_ln.weight", 0, 1, E, 1, 1, 1);
    tb_tensor(&f, "mm.0.weight", 0, 2, 4 * E, 4 * E, 1, 1);
    tb_tensor(&f, "mm.0.bias", 0, 1, 4 * E, 1, 1, 1);
    tb_tensor(&f, "mm.2.weight", 0, 2, 4 * E, PROJ, 1, 1);
    tb_tensor(&f, "mm.2.bias", 0, 1, PROJ, 1, 1, 1);
    return tb_finish(&f, size);
}

#endif
