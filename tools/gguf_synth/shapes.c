/* The named shapes and the tensor list each one implies: names, dimensions (ggml order, row
 * length first, as llama.cpp's GGUF files store them), types, and offsets in the file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"

static const struct synth_shape shapes[] = {
    {"tiny-llama", "llama, 4 layers, d 256, 8/4 heads x 32, ff 512; for CPU tests",
     SYNTH_ARCH_LLAMA, 4, 256, 512, 8, 4, 32, 0, 0, 0, 1536, 2048, 10000.0f, 1e-5f,
     QUANT_Q8_0, QUANT_Q8_0, false, "gpt-2", {0}, 0, 0, 0, 0},
    {"tiny-moe", "qwen3moe, 4 layers, d 256, 8/4 heads x 64, 8 experts (2 used) x ff 128",
     SYNTH_ARCH_QWEN3MOE, 4, 256, 512, 8, 4, 64, 8, 2, 128, 1536, 2048, 1000000.0f, 1e-6f,
     QUANT_Q8_0, QUANT_Q8_0, false, "qwen2", {0}, 0, 0, 0, 0},
    {"qwen30b", "Qwen3-30B-A3B: 48 layers, d 2048, 32/4 heads x 128, 128 experts (8) x ff 768",
     SYNTH_ARCH_QWEN3MOE, 48, 2048, 6144, 32, 4, 128, 128, 8, 768, 151936, 40960, 1000000.0f,
     1e-6f, QUANT_Q4_0, QUANT_Q4_0, false, "qwen2", {0}, 0, 0, 0, 0},
    {"llama8b", "Llama-3.1-8B: 32 layers, d 4096, 32/8 heads x 128, ff 14336", SYNTH_ARCH_LLAMA,
     32, 4096, 14336, 32, 8, 128, 0, 0, 0, 128256, 131072, 500000.0f, 1e-5f, QUANT_F16,
     QUANT_F16, false, "gpt-2", {0}, 0, 0, 0, 0},
    {"qwen235b", "Qwen3-235B-A22B: 94 layers, d 4096, 64/4 heads x 128, 128 experts (8) x ff 1536",
     SYNTH_ARCH_QWEN3MOE, 94, 4096, 12288, 64, 4, 128, 128, 8, 1536, 151936, 40960, 1000000.0f,
     1e-6f, QUANT_Q4_K, QUANT_Q2_K, false, "qwen2", {0}, 0, 0, 0, 0},
    {"minitron8b", "Mistral-NeMo-Minitron-8B: 40 layers, d 4096, 32/8 heads x 128, ff 11520",
     SYNTH_ARCH_LLAMA, 40, 4096, 11520, 32, 8, 128, 0, 0, 0, 131072, 8192, 1000000.0f, 1e-5f,
     QUANT_F16, QUANT_F16, false, "gpt-2", {0}, 0, 0, 0, 0},
    {"minitron4b", "Llama-3.1-Minitron-4B-Width: 32 layers, d 3072, 32/8 heads x 128, ff 9216",
     SYNTH_ARCH_LLAMA, 32, 3072, 9216, 32, 8, 128, 0, 0, 0, 128256, 131072, 500000.0f, 1e-5f,
     QUANT_F16, QUANT_F16, false, "gpt-2", {0}, 0, 0, 0, 0},
    /* Qwen2.5-VL (and Cosmos-Reason1, which is Qwen2.5-VL-7B fine-tuned): a language model file
     * and its separate mmproj file, the vision encoder and projector. */
    {.name = "tiny-qwen25vl", .description = "qwen2vl, 4 layers, d 256, 4/2 heads x 64, ff 512; for CPU tests",
     .arch = SYNTH_ARCH_QWEN2VL, .n_layer = 4, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
     .n_vocab = 1536, .n_ctx = 4096, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .matrix_type = QUANT_Q8_0,
     .expert_type = QUANT_Q8_0, .pre = "qwen2", .rope_sections = {8, 12, 12, 0}},
    {.name = "tiny-qwen25vl-mmproj", .description = "clip qwen2.5vl_merger, 4 layers, width 128, 4 heads, ff 256, "
     "patch 14, full attention every 2nd layer, into d 256; tiny-qwen25vl's vision encoder",
     .arch = SYNTH_ARCH_CLIP, .n_layer = 4, .n_embd = 128, .n_ff = 256, .n_head = 4, .n_head_kv = 4, .head_dim = 32, .rms_eps = 1e-6f,
     .matrix_type = QUANT_F16, .expert_type = QUANT_F16, .image_size = 560, .patch_size = 14, .n_wa_pattern = 2,
     .projection_dim = 256},
    {.name = "qwen25vl7b", .description = "Qwen2.5-VL-7B / Cosmos-Reason1-7B language model: 28 layers, d 3584, "
     "28/4 heads x 128, ff 18944",
     .arch = SYNTH_ARCH_QWEN2VL, .n_layer = 28, .n_embd = 3584, .n_ff = 18944, .n_head = 28, .n_head_kv = 4,
     .head_dim = 128, .n_vocab = 152064, .n_ctx = 128000, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f,
     .matrix_type = QUANT_F16, .expert_type = QUANT_F16, .pre = "qwen2", .rope_sections = {16, 24, 24, 0}},
    {.name = "qwen25vl7b-mmproj", .description = "Qwen2.5-VL-7B / Cosmos-Reason1-7B vision encoder: 32 layers, "
     "width 1280, 16 heads, ff 3420, patch 14, full attention in layers 7/15/23/31, into d 3584",
     .arch = SYNTH_ARCH_CLIP, .n_layer = 32, .n_embd = 1280, .n_ff = 3420, .n_head = 16, .n_head_kv = 16, .head_dim = 80,
     .rms_eps = 1e-6f, .matrix_type = QUANT_F16, .expert_type = QUANT_F16, .image_size = 560, .patch_size = 14,
     .n_wa_pattern = 8, .projection_dim = 3584},
};

size_t synth_shape_count(void) { return sizeof shapes / sizeof shapes[0]; }

const struct synth_shape *synth_shape_at(size_t index) {
    return index < synth_shape_count() ? &shapes[index] : NULL;
}

const struct synth_shape *synth_shape_find(const char *name) {
    for (size_t i = 0; i < synth_shape_count(); i++)
        if (!strcmp(shapes[i].name, name)) return &shapes[i];
    return NULL;
}

const char *synth_arch_name(enum synth_arch arch) {
    switch (arch) {
    case SYNTH_ARCH_QWEN3MOE: return "qwen3moe";
    case SYNTH_ARCH_QWEN2VL: return "qwen2vl";
    case SYNTH_ARCH_CLIP: return "clip";
    default: return "llama";
    }
}

/* A type whose blocks fit rows of `row_len` elements: the wanted one, else what llama.cpp's
 * quantizer falls back to for K-quants on short rows, else F16. */
static enum quant_type fit_type(enum quant_type want, int64_t row_len, bool *fell_back) {
    *fell_back = false;
    if (quant_row_bytes(want, row_len) != 0) return want;
    *fell_back = true;
    enum quant_type next = QUANT_F16;
    switch (want) {
    case QUANT_Q2_K:
    case QUANT_Q3_K: next = QUANT_Q4_0; break;
    case QUANT_Q4_K: next = QUANT_Q5_0; break;
    case QUANT_Q5_K: next = QUANT_Q5_1; break;
    case QUANT_Q6_K: next = QUANT_Q8_0; break;
    default: break;
    }
    return quant_row_bytes(next, row_len) != 0 ? next : QUANT_F16;
}

/* FNV-1a: the tensor's seed key, so its bytes depend on its name, not its position. */
static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

struct tensor_list {
    struct synth_model *model;
    size_t cap;
    uint64_t offset;
    bool failed;
};

static void add_tensor4(struct tensor_list *list, const char *name, enum quant_type type,
                        enum synth_init init, uint32_t n_dims, int64_t ne0, int64_t ne1,
                        int64_t ne2, int64_t ne3) {
    struct synth_model *m = list->model;
    if (list->failed) return;
    if (m->n_tensors == list->cap) {
        size_t cap = list->cap ? list->cap * 2 : 64;
        struct synth_tensor *grown = realloc(m->tensors, cap * sizeof *grown);
        if (!grown) {
            list->failed = true;
            return;
        }
        m->tensors = grown;
        list->cap = cap;
    }
    struct synth_tensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
    t->ne[3] = n_dims > 3 ? ne3 : 1;
    bool fell_back;
    t->type = fit_type(type, ne0, &fell_back);
    if (fell_back) m->n_fallback++;
    t->init = init;
    /* Weights: variance 1/fan-in keeps activations near unit scale through each matmul.
     * Norm gains: near 1 with a little spread, so a wrong index still shows. Token embeddings
     * at unit scale, and the matrices that add a residual branch's output scaled by
     * 1/sqrt(2 * layers), so the 2 * layers branches together add about as much as the
     * embedding holds: each token stays distinct through the depth, and an MoE router spreads
     * a step's tokens over the experts as a trained one does. At 1/sqrt(fan-in) everywhere the
     * branches, which attention makes alike across tokens, drown the embedding: in qwen30b's
     * first 8 layers a 256-token step touched 36-48 of the 128 experts in layers 2-7, up to 249
     * of its tokens on one. */
    switch (init) {
    case SYNTH_INIT_NORM: t->stddev = 0.05f; break;
    case SYNTH_INIT_BIAS: t->stddev = 0.02f; break;
    case SYNTH_INIT_EMBED: t->stddev = 1.0f; break;
    case SYNTH_INIT_OUTPUT: t->stddev = 1.0f / sqrtf((float)ne0 * 2.0f * (float)m->shape.n_layer); break;
    default: t->stddev = 1.0f / sqrtf((float)ne0); break;
    }
    t->seed_key = name_hash(name);
    t->offset = list->offset;
    t->bytes = quant_row_bytes(t->type, ne0) * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
    list->offset += (t->bytes + SYNTH_ALIGNMENT - 1) / SYNTH_ALIGNMENT * SYNTH_ALIGNMENT;
}

static void add_tensor(struct tensor_list *list, const char *name, enum quant_type type,
                       enum synth_init init, uint32_t n_dims, int64_t ne0, int64_t ne1,
                       int64_t ne2) {
    add_tensor4(list, name, type, init, n_dims, ne0, ne1, ne2, 1);
}

static void add_layer(struct tensor_list *list, const struct synth_shape *s, uint32_t il) {
    char name[64];
    const int64_t d = s->n_embd, q_dim = (int64_t)s->n_head * s->head_dim,
                  kv_dim = (int64_t)s->n_head_kv * s->head_dim;
    const enum quant_type mt = s->matrix_type;
#define LAYER_TENSOR(suffix, ...)                                                                \
    do {                                                                                         \
        snprintf(name, sizeof name, "blk.%u." suffix ".weight", il);                             \
        add_tensor(list, name, __VA_ARGS__);                                                     \
    } while (0)
    LAYER_TENSOR("attn_norm", QUANT_F32, SYNTH_INIT_NORM, 1, d, 0, 0);
    LAYER_TENSOR("attn_q", mt, SYNTH_INIT_WEIGHT, 2, d, q_dim, 0);
    if (s->arch == SYNTH_ARCH_QWEN2VL) { /* qwen2's Q, K and V projections have biases */
        snprintf(name, sizeof name, "blk.%u.attn_q.bias", il);
        add_tensor(list, name, QUANT_F32, SYNTH_INIT_BIAS, 1, q_dim, 0, 0);
        snprintf(name, sizeof name, "blk.%u.attn_k.bias", il);
        add_tensor(list, name, QUANT_F32, SYNTH_INIT_BIAS, 1, kv_dim, 0, 0);
        snprintf(name, sizeof name, "blk.%u.attn_v.bias", il);
        add_tensor(list, name, QUANT_F32, SYNTH_INIT_BIAS, 1, kv_dim, 0, 0);
    }
    if (s->arch == SYNTH_ARCH_QWEN3MOE)
        LAYER_TENSOR("attn_q_norm", QUANT_F32, SYNTH_INIT_NORM, 1, s->head_dim, 0, 0);
    LAYER_TENSOR("attn_k", mt, SYNTH_INIT_WEIGHT, 2, d, kv_dim, 0);
    if (s->arch == SYNTH_ARCH_QWEN3MOE)
        LAYER_TENSOR("attn_k_norm", QUANT_F32, SYNTH_INIT_NORM, 1, s->head_dim, 0, 0);
    LAYER_TENSOR("attn_v", mt, SYNTH_INIT_WEIGHT, 2, d, kv_dim, 0);
    LAYER_TENSOR("attn_output", mt, SYNTH_INIT_OUTPUT, 2, q_dim, d, 0);
    LAYER_TENSOR("ffn_norm", QUANT_F32, SYNTH_INIT_NORM, 1, d, 0, 0);
    if (s->n_expert > 0) {
        const enum quant_type et = s->expert_type;
        LAYER_TENSOR("ffn_gate_inp", QUANT_F32, SYNTH_INIT_WEIGHT, 2, d, s->n_expert, 0);
        LAYER_TENSOR("ffn_gate_exps", et, SYNTH_INIT_WEIGHT, 3, d, s->n_ff_exp, s->n_expert);
        LAYER_TENSOR("ffn_up_exps", et, SYNTH_INIT_WEIGHT, 3, d, s->n_ff_exp, s->n_expert);
        LAYER_TENSOR("ffn_down_exps", et, SYNTH_INIT_OUTPUT, 3, s->n_ff_exp, d, s->n_expert);
    } else {
        LAYER_TENSOR("ffn_gate", mt, SYNTH_INIT_WEIGHT, 2, d, s->n_ff, 0);
        LAYER_TENSOR("ffn_up", mt, SYNTH_INIT_WEIGHT, 2, d, s->n_ff, 0);
        LAYER_TENSOR("ffn_down", mt, SYNTH_INIT_OUTPUT, 2, s->n_ff, d, 0);
    }
#undef LAYER_TENSOR
}

/* An mmproj file's tensors as llama.cpp's converter writes Qwen2.5-VL's vision tower: the
 * Conv3d patch embedding split into its two temporal slices, per block RMS-norm gains,
 * separate Q/K/V (with biases), output projection and a gated FFN, all with biases, then the
 * merger's norm and its two linear layers over 2x2 merged patches ("mm.0", "mm.2"). */
static void add_clip(struct tensor_list *list, const struct synth_shape *s) {
    const int64_t e = s->n_embd, ff = s->n_ff, p = s->patch_size, merged = 4 * (int64_t)s->n_embd;
    const enum quant_type mt = s->matrix_type;
    char name[64];
    /* The patch embedding stays F16 (or F32): llama.cpp's convolution wants one of those. */
    const enum quant_type pt = mt == QUANT_F32 ? QUANT_F32 : QUANT_F16;
    add_tensor4(list, "v.patch_embd.weight", pt, SYNTH_INIT_WEIGHT, 4, p, p, 3, e);
    add_tensor4(list, "v.patch_embd.weight.1", pt, SYNTH_INIT_WEIGHT, 4, p, p, 3, e);
    for (uint32_t il = 0; il < s->n_layer; il++) {
#define VIT_TENSOR(suffix, ...)                                                                  \
    do {                                                                                         \
        snprintf(name, sizeof name, "v.blk.%u." suffix, il);                                     \
        add_tensor(list, name, __VA_ARGS__);                                                     \
    } while (0)
        VIT_TENSOR("ln1.weight", QUANT_F32, SYNTH_INIT_NORM, 1, e, 0, 0);
        VIT_TENSOR("attn_q.weight", mt, SYNTH_INIT_WEIGHT, 2, e, e, 0);
        VIT_TENSOR("attn_q.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, e, 0, 0);
        VIT_TENSOR("attn_k.weight", mt, SYNTH_INIT_WEIGHT, 2, e, e, 0);
        VIT_TENSOR("attn_k.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, e, 0, 0);
        VIT_TENSOR("attn_v.weight", mt, SYNTH_INIT_WEIGHT, 2, e, e, 0);
        VIT_TENSOR("attn_v.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, e, 0, 0);
        VIT_TENSOR("attn_out.weight", mt, SYNTH_INIT_OUTPUT, 2, e, e, 0);
        VIT_TENSOR("attn_out.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, e, 0, 0);
        VIT_TENSOR("ln2.weight", QUANT_F32, SYNTH_INIT_NORM, 1, e, 0, 0);
        VIT_TENSOR("ffn_gate.weight", mt, SYNTH_INIT_WEIGHT, 2, e, ff, 0);
        VIT_TENSOR("ffn_gate.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, ff, 0, 0);
        VIT_TENSOR("ffn_up.weight", mt, SYNTH_INIT_WEIGHT, 2, e, ff, 0);
        VIT_TENSOR("ffn_up.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, ff, 0, 0);
        VIT_TENSOR("ffn_down.weight", mt, SYNTH_INIT_OUTPUT, 2, ff, e, 0);
        VIT_TENSOR("ffn_down.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, e, 0, 0);
#undef VIT_TENSOR
    }
    add_tensor(list, "v.post_ln.weight", QUANT_F32, SYNTH_INIT_NORM, 1, e, 0, 0);
    add_tensor(list, "mm.0.weight", mt, SYNTH_INIT_WEIGHT, 2, merged, merged, 0);
    add_tensor(list, "mm.0.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, merged, 0, 0);
    add_tensor(list, "mm.2.weight", mt, SYNTH_INIT_WEIGHT, 2, merged, s->projection_dim, 0);
    add_tensor(list, "mm.2.bias", QUANT_F32, SYNTH_INIT_BIAS, 1, s->projection_dim, 0, 0);
}

pshard_status synth_model_build(struct synth_model *model, const struct synth_shape *shape) {
    memset(model, 0, sizeof *model);
    model->shape = *shape;
    struct tensor_list list = {.model = model};
    const struct synth_shape *s = &model->shape;
    if (s->arch == SYNTH_ARCH_CLIP) {
        add_clip(&list, s);
        if (list.failed) {
            synth_model_free(model);
            return core_fail(PSHARD_ERR_NOMEM, "out of memory listing tensors");
        }
        model->data_bytes = list.offset;
        return PSHARD_OK;
    }
    /* Tied, the embedding is also the head: at unit scale its logits would be sqrt(d) wide. */
    add_tensor(&list, "token_embd.weight", s->matrix_type, s->tied ? SYNTH_INIT_WEIGHT : SYNTH_INIT_EMBED, 2, s->n_embd,
               s->n_vocab, 0);
    for (uint32_t il = 0; il < s->n_layer; il++) add_layer(&list, s, il);
    add_tensor(&list, "output_norm.weight", QUANT_F32, SYNTH_INIT_NORM, 1, s->n_embd, 0, 0);
    if (!s->tied)
        add_tensor(&list, "output.weight", s->matrix_type, SYNTH_INIT_WEIGHT, 2, s->n_embd,
                   s->n_vocab, 0);
    if (list.failed) {
        synth_model_free(model);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory listing tensors");
    }
    model->data_bytes = list.offset;
    return PSHARD_OK;
}

void synth_model_free(struct synth_model *model) {
    free(model->tensors);
    model->tensors = NULL;
    model->n_tensors = 0;
}

uint32_t synth_model_file_type(const struct synth_model *model) {
    uint64_t bytes_by_type[QUANT_TYPE_LIMIT] = {0};
    for (size_t i = 0; i < model->n_tensors; i++)
        if (model->tensors[i].n_dims > 1) bytes_by_type[model->tensors[i].type] += model->tensors[i].bytes;
    size_t best = QUANT_F32;
    for (size_t t = 0; t < QUANT_TYPE_LIMIT; t++)
        if (bytes_by_type[t] > bytes_by_type[best]) best = t;
    /* llama_ftype numbers; a K-quant maps to its "_M" mix, as llama-quantize names them. */
    switch ((enum quant_type)best) {
    case QUANT_F32: return 0;
    case QUANT_F16: return 1;
    case QUANT_Q4_0: return 2;
    case QUANT_Q4_1: return 3;
    case QUANT_Q8_0: return 7;
    case QUANT_Q5_0: return 8;
    case QUANT_Q5_1: return 9;
    case QUANT_Q2_K: return 10;
    case QUANT_Q3_K: return 12;
    case QUANT_Q4_K: return 15;
    case QUANT_Q5_K: return 17;
    case QUANT_Q6_K: return 18;
    case QUANT_BF16: return 32;
    default: return 1024; /* LLAMA_FTYPE_GUESSED */
    }
}
