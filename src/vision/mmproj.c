/* Reading an mmproj GGUF: the clip.* hyperparameters with their ranges checked, then every
 * tensor bound by role and shape. Key and tensor names are llama.cpp's (tools/mtmd/clip-impl.h
 * and the converter's Qwen2.5-VL vision class), so its files load as they are. Any tensor the
 * projector does not use is refused by name rather than silently ignored. */
#include "vision/mmproj.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/types.h"

/* Projector names llama.cpp knows; only the first kind runs here, the others are named as
 * known but unsupported so a user learns which file they have. */
static const char *const known_projectors[] = {
    "qwen2.5vl_merger", "qwen2vl_merger", "qwen3vl_merger", "mlp", "mlp_norm", "ldp", "ldpv2",
    "resampler", "adapter", "gemma3", "idefics3", "pixtral", "internvl", "llama4", "kimivl", "lfm2",
};

bool mmproj_is_mmproj(const struct gguf_file *file) {
    struct gguf_str arch;
    return gguf_get_str(file, "general.architecture", &arch) == PSHARD_OK && gguf_str_eq(arch, "clip");
}

static pshard_status get_u32(const struct gguf_file *f, const char *key, bool required, uint32_t *out) {
    if (!gguf_find(f, key)) {
        if (!required) return PSHARD_OK;
        return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj key '%s' is missing", gguf_path(f), key);
    }
    pshard_status st = gguf_get_u32(f, key, out);
    return st == PSHARD_OK ? st : core_fail_context(st, "%s: ", gguf_path(f));
}

static pshard_status get_f32(const struct gguf_file *f, const char *key, bool required, float *out) {
    if (!gguf_find(f, key)) {
        if (!required) return PSHARD_OK;
        return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj key '%s' is missing", gguf_path(f), key);
    }
    pshard_status st = gguf_get_f32(f, key, out);
    return st == PSHARD_OK ? st : core_fail_context(st, "%s: ", gguf_path(f));
}

/* A numeric array key of exactly three values, each finite (image_mean, image_std). */
static pshard_status get_rgb(const struct gguf_file *f, const char *key, float out[3]) {
    struct gguf_array a;
    if (!gguf_find(f, key)) return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj key '%s' is missing", gguf_path(f), key);
    pshard_status st = gguf_get_array(f, key, &a);
    if (st != PSHARD_OK) return core_fail_context(st, "%s: ", gguf_path(f));
    if (a.n != 3 || a.type == GGUF_TYPE_STRING || a.type == GGUF_TYPE_ARRAY || a.type == GGUF_TYPE_BOOL)
        return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj key '%s' must hold 3 numbers (one per RGB channel)", gguf_path(f), key);
    for (int c = 0; c < 3; c++) {
        out[c] = (float)gguf_array_float(&a, (uint64_t)c);
        if (!isfinite(out[c])) return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj key '%s' holds a non-finite value", gguf_path(f), key);
    }
    return PSHARD_OK;
}

static pshard_status read_projector(const struct gguf_file *f, struct vision_hparams *hp) {
    struct gguf_str name;
    const char *key = gguf_find(f, "clip.projector_type") ? "clip.projector_type" : "clip.vision.projector_type";
    if (!gguf_find(f, key))
        return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj key 'clip.projector_type' is missing", gguf_path(f));
    pshard_status st = gguf_get_str(f, key, &name);
    if (st != PSHARD_OK) return core_fail_context(st, "%s: ", gguf_path(f));
    const int shown = (int)(name.len > 40 ? 40 : name.len);
    snprintf(hp->projector_name, sizeof hp->projector_name, "%.*s", shown, name.data);
    if (gguf_str_eq(name, "qwen2.5vl_merger")) {
        hp->projector = VISION_PROJECTOR_QWEN25VL;
        return PSHARD_OK;
    }
    for (size_t i = 0; i < sizeof known_projectors / sizeof known_projectors[0]; i++)
        if (gguf_str_eq(name, known_projectors[i]))
            return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: projector type '%s' is not supported (supported: qwen2.5vl_merger)",
                             gguf_path(f), hp->projector_name);
    return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: unknown projector type '%.*s%s' in %s (supported: qwen2.5vl_merger)",
                     gguf_path(f), shown, name.data, name.len > 40 ? "..." : "", key);
}

/* Which layers attend over the whole image: an explicit list (clip.vision.wa_layer_indexes),
 * else every n_wa_pattern-th layer counting from 1 (Qwen2.5-VL-7B: 8, so layers 7, 15, 23, 31). */
static pshard_status read_window_layers(const struct gguf_file *f, struct vision_hparams *hp) {
    const char *path = gguf_path(f);
    if (gguf_find(f, "clip.vision.wa_layer_indexes")) {
        struct gguf_array a;
        pshard_status st = gguf_get_array(f, "clip.vision.wa_layer_indexes", &a);
        if (st != PSHARD_OK) return core_fail_context(st, "%s: ", path);
        if (a.type == GGUF_TYPE_STRING || a.type == GGUF_TYPE_ARRAY || a.type == GGUF_TYPE_BOOL ||
            a.type == GGUF_TYPE_FLOAT32 || a.type == GGUF_TYPE_FLOAT64)
            return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj key 'clip.vision.wa_layer_indexes' must hold integers", path);
        for (uint64_t i = 0; i < a.n; i++) {
            int64_t layer = gguf_array_int(&a, i);
            if (layer < 0 || layer >= (int64_t)hp->n_layer)
                return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.wa_layer_indexes names layer %" PRId64
                                 ", outside the %u layers", path, layer, hp->n_layer);
            hp->full_attention[layer] = true;
        }
    } else {
        CORE_TRY(get_u32(f, "clip.vision.n_wa_pattern", true, &hp->n_wa_pattern));
        if (hp->n_wa_pattern == 0 || hp->n_wa_pattern > hp->n_layer)
            return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.n_wa_pattern %u is outside 1..%u (block_count)", path,
                             hp->n_wa_pattern, hp->n_layer);
        for (uint32_t il = 0; il < hp->n_layer; il++) hp->full_attention[il] = (il + 1) % hp->n_wa_pattern == 0;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) hp->n_full_attention += hp->full_attention[il];
    hp->window_size = 112; /* Qwen2.5-VL's window_size; llama.cpp's converter does not write it */
    CORE_TRY(get_u32(f, "clip.vision.window_size", false, &hp->window_size));
    const uint32_t unit = hp->patch_size * hp->spatial_merge;
    if (hp->window_size == 0 || hp->window_size % unit != 0 || hp->window_size > 4096)
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.window_size %u is not a multiple of patch_size x "
                         "spatial_merge_size (%u) up to 4096", path, hp->window_size, unit);
    return PSHARD_OK;
}

static pshard_status read_hparams(const struct gguf_file *f, struct vision_hparams *hp) {
    const char *path = gguf_path(f);
    if (!mmproj_is_mmproj(f))
        return core_fail(PSHARD_ERR_FORMAT, "%s: not an mmproj file (general.architecture is not 'clip')", path);
    if (gguf_find(f, "clip.has_vision_encoder")) {
        bool has_vision = false;
        pshard_status st = gguf_get_bool(f, "clip.has_vision_encoder", &has_vision);
        if (st != PSHARD_OK) return core_fail_context(st, "%s: ", path);
        if (!has_vision) return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: the mmproj file has no vision encoder", path);
    }
    CORE_TRY(read_projector(f, hp));
    CORE_TRY(get_u32(f, "clip.vision.image_size", true, &hp->image_size));
    CORE_TRY(get_u32(f, "clip.vision.patch_size", true, &hp->patch_size));
    CORE_TRY(get_u32(f, "clip.vision.embedding_length", true, &hp->n_embd));
    CORE_TRY(get_u32(f, "clip.vision.feed_forward_length", true, &hp->n_ff));
    CORE_TRY(get_u32(f, "clip.vision.block_count", true, &hp->n_layer));
    CORE_TRY(get_u32(f, "clip.vision.attention.head_count", true, &hp->n_head));
    CORE_TRY(get_u32(f, "clip.vision.projection_dim", true, &hp->projection_dim));
    CORE_TRY(get_f32(f, "clip.vision.attention.layer_norm_epsilon", true, &hp->eps));
    hp->spatial_merge = 2;
    CORE_TRY(get_u32(f, "clip.vision.spatial_merge_size", false, &hp->spatial_merge));
    CORE_TRY(get_rgb(f, "clip.vision.image_mean", hp->image_mean));
    CORE_TRY(get_rgb(f, "clip.vision.image_std", hp->image_std));

    if (hp->patch_size < 2 || hp->patch_size > 64)
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.patch_size %u is outside 2..64", path, hp->patch_size);
    if (hp->spatial_merge == 0 || hp->spatial_merge > 8)
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.spatial_merge_size %u is outside 1..8", path, hp->spatial_merge);
    if (hp->image_size < hp->patch_size * hp->spatial_merge || hp->image_size > 65536)
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.image_size %u is outside %u..65536", path, hp->image_size,
                         hp->patch_size * hp->spatial_merge);
    if (hp->n_layer == 0 || hp->n_layer > VISION_MAX_LAYERS)
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.block_count %u is outside 1..%d", path, hp->n_layer, VISION_MAX_LAYERS);
    if (hp->n_embd == 0 || hp->n_embd > 65536 || hp->n_ff == 0 || hp->n_ff > 262144 || hp->projection_dim == 0 ||
        hp->projection_dim > 262144)
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision embedding_length %u, feed_forward_length %u or projection_dim %u "
                         "is out of range", path, hp->n_embd, hp->n_ff, hp->projection_dim);
    /* The 2D rotary embedding turns pairs in each half of a head (rows, then columns). */
    if (hp->n_head == 0 || hp->n_embd % hp->n_head != 0 || (hp->n_embd / hp->n_head) % 4 != 0)
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.attention.head_count %u does not split embedding_length %u "
                         "into heads of a multiple of 4", path, hp->n_head, hp->n_embd);
    hp->head_dim = hp->n_embd / hp->n_head;
    if (!(hp->eps > 0.0f && hp->eps < 1.0f))
        return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.attention.layer_norm_epsilon %g is outside (0, 1)", path, hp->eps);
    for (int c = 0; c < 3; c++)
        if (!(hp->image_std[c] > 0.0f))
            return core_fail(PSHARD_ERR_FORMAT, "%s: clip.vision.image_std[%d] = %g is not positive", path, c, hp->image_std[c]);

    uint32_t min_pixels = 3136, max_pixels = 12845056; /* Qwen2.5-VL's preprocessor_config.json */
    CORE_TRY(get_u32(f, "clip.vision.image_min_pixels", false, &min_pixels));
    CORE_TRY(get_u32(f, "clip.vision.image_max_pixels", false, &max_pixels));
    const uint32_t unit = hp->patch_size * hp->spatial_merge;
    if (min_pixels < unit * unit || max_pixels < min_pixels)
        return core_fail(PSHARD_ERR_FORMAT, "%s: image_min_pixels %u / image_max_pixels %u: need %u <= min <= max", path,
                         min_pixels, max_pixels, unit * unit);
    hp->min_pixels = min_pixels;
    hp->max_pixels = max_pixels;
    return read_window_layers(f, hp);
}

pshard_status mmproj_read_hparams(const struct gguf_file *file, struct vision_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    return read_hparams(file, hp);
}

/* ---- tensors */

struct binder {
    const struct gguf_file *file;
    bool *claimed; /* by tensor index (the file's tensors are one array) */
    uint64_t n_bound;
    uint64_t bytes;
};

/* Find a tensor and check its shape (all of ne0..ne3; a 1-D tensor passes 1 for the rest).
 * Norms and biases must be F32 or F16; matrices any type whose rows the shape allows. */
static pshard_status bind(struct binder *b, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                          const struct gguf_tensor **out) {
    const struct gguf_tensor *t = gguf_find_tensor(b->file, name);
    if (!t) return core_fail(PSHARD_ERR_FORMAT, "%s: mmproj lacks tensor '%s'", gguf_path(b->file), name);
    const int64_t want[4] = {ne0, ne1, ne2, ne3};
    for (int d = 0; d < 4; d++)
        if (t->ne[d] != want[d])
            return core_fail(PSHARD_ERR_FORMAT, "%s: tensor '%s' has shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                             "], expected [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]", gguf_path(b->file), name,
                             t->ne[0], t->ne[1], t->ne[2], t->ne[3], ne0, ne1, ne2, ne3);
    const struct quant_type_info *info = quant_type_info(t->type);
    const bool vector = ne1 == 1 && ne2 == 1 && ne3 == 1;
    if (!info || !info->supported || (vector && t->type != QUANT_F32 && t->type != QUANT_F16))
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, not supported here%s", gguf_path(b->file), name,
                         info ? info->name : "?", vector ? " (norms and biases must be F32 or F16)" : "");
    *out = t;
    b->claimed[t - gguf_tensor_at(b->file, 0)] = true;
    b->n_bound++;
    b->bytes += t->n_bytes;
    return PSHARD_OK;
}

static pshard_status bind_layer(struct binder *b, const struct vision_hparams *hp, uint32_t il, struct vision_layer *l) {
    const int64_t e = hp->n_embd, ff = hp->n_ff;
    char name[96];
#define LAYER(suffix, ne0, ne1, dest)                                                                \
    do {                                                                                             \
        snprintf(name, sizeof name, "v.blk.%u." suffix, il);                                         \
        CORE_TRY(bind(b, name, ne0, ne1, 1, 1, dest));                                               \
    } while (0)
    LAYER("ln1.weight", e, 1, &l->ln1);
    LAYER("attn_q.weight", e, e, &l->q_w);
    LAYER("attn_q.bias", e, 1, &l->q_b);
    LAYER("attn_k.weight", e, e, &l->k_w);
    LAYER("attn_k.bias", e, 1, &l->k_b);
    LAYER("attn_v.weight", e, e, &l->v_w);
    LAYER("attn_v.bias", e, 1, &l->v_b);
    LAYER("attn_out.weight", e, e, &l->o_w);
    LAYER("attn_out.bias", e, 1, &l->o_b);
    LAYER("ln2.weight", e, 1, &l->ln2);
    LAYER("ffn_gate.weight", e, ff, &l->gate_w);
    LAYER("ffn_gate.bias", ff, 1, &l->gate_b);
    LAYER("ffn_up.weight", e, ff, &l->up_w);
    LAYER("ffn_up.bias", ff, 1, &l->up_b);
    LAYER("ffn_down.weight", ff, e, &l->down_w);
    LAYER("ffn_down.bias", e, 1, &l->down_b);
#undef LAYER
    return PSHARD_OK;
}

static pshard_status bind_all(struct binder *b, struct mmproj *m) {
    const struct vision_hparams *hp = &m->hp;
    const int64_t p = hp->patch_size, e = hp->n_embd, merged = (int64_t)e * hp->spatial_merge * hp->spatial_merge;
    if (gguf_find_tensor(b->file, "v.patch_embd.bias"))
        return core_fail(PSHARD_ERR_FORMAT, "%s: tensor 'v.patch_embd.bias' is not expected for %s (its patch "
                         "embedding has no bias)", gguf_path(b->file), hp->projector_name);
    CORE_TRY(bind(b, "v.patch_embd.weight", p, p, 3, e, &m->patch_embd[0]));
    CORE_TRY(bind(b, "v.patch_embd.weight.1", p, p, 3, e, &m->patch_embd[1]));
    for (int k = 0; k < 2; k++)
        if (m->patch_embd[k]->type != QUANT_F32 && m->patch_embd[k]->type != QUANT_F16)
            return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: the patch embedding must be F32 or F16, not %s", gguf_path(b->file),
                             quant_type_info(m->patch_embd[k]->type)->name);
    for (uint32_t il = 0; il < hp->n_layer; il++) CORE_TRY(bind_layer(b, hp, il, &m->layers[il]));
    CORE_TRY(bind(b, "v.post_ln.weight", e, 1, 1, 1, &m->post_ln));
    CORE_TRY(bind(b, "mm.0.weight", merged, merged, 1, 1, &m->mm0_w));
    CORE_TRY(bind(b, "mm.0.bias", merged, 1, 1, 1, &m->mm0_b));
    CORE_TRY(bind(b, "mm.2.weight", merged, hp->projection_dim, 1, 1, &m->mm2_w));
    CORE_TRY(bind(b, "mm.2.bias", hp->projection_dim, 1, 1, 1, &m->mm2_b));
    if (b->n_bound == gguf_tensor_count(b->file)) return PSHARD_OK;
    /* Something else is in the file: name the first tensor no role claimed. */
    for (uint64_t i = 0; i < gguf_tensor_count(b->file); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(b->file, i);
        if (!b->claimed[i])
            return core_fail(PSHARD_ERR_FORMAT, "%s: unexpected tensor '%.*s' in a %s mmproj with %u layers", gguf_path(b->file),
                             (int)(t->name.len > 80 ? 80 : t->name.len), t->name.data, hp->projector_name, hp->n_layer);
    }
    return core_fail(PSHARD_ERR_INTERNAL, "%s: tensor count mismatch", gguf_path(b->file));
}

pshard_status mmproj_load(struct gguf_file *file, struct mmproj *out) {
    memset(out, 0, sizeof *out);
    out->file = file;
    CORE_TRY(mmproj_read_hparams(file, &out->hp));
    out->layers = calloc(out->hp.n_layer, sizeof *out->layers);
    if (!out->layers) return core_fail(PSHARD_ERR_NOMEM, "out of memory for %u vision layers", out->hp.n_layer);
    struct binder b = {.file = file, .claimed = calloc(gguf_tensor_count(file) + 1, sizeof(bool))};
    pshard_status st = b.claimed ? bind_all(&b, out) : core_fail(PSHARD_ERR_NOMEM, "out of memory binding the mmproj");
    free(b.claimed);
    if (st != PSHARD_OK) {
        mmproj_free(out);
        return st;
    }
    out->weight_bytes = b.bytes;
    return PSHARD_OK;
}

void mmproj_free(struct mmproj *m) {
    free(m->layers);
    m->layers = NULL;
}
