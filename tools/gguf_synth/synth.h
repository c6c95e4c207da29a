/* gguf-synth: writes GGUF files with random weights in the shapes of real models.
 * This header holds what the tool's files share: shapes, the tensor list, the vocabulary,
 * the GGUF byte builder and the parallel file writer. */
#ifndef SYNTH_H
#define SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "quant/types.h"

/* QWEN2VL: the language model of Qwen2.5-VL (qwen2 with Q/K/V biases and multimodal rope
 * sections); CLIP: its vision encoder and projector, the separate "mmproj" file. */
enum synth_arch { SYNTH_ARCH_LLAMA, SYNTH_ARCH_QWEN3MOE, SYNTH_ARCH_QWEN2VL, SYNTH_ARCH_CLIP };

/* A model shape: what llama.cpp reads as hyper-parameters, plus the weight types. */
struct synth_shape {
    const char *name;
    const char *description;
    enum synth_arch arch;
    uint32_t n_layer, n_embd, n_ff;
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_ff_exp; /* 0 for dense models */
    uint32_t n_vocab, n_ctx;
    float rope_freq_base, rms_eps;
    enum quant_type matrix_type; /* attention, dense FFN, embeddings, output */
    enum quant_type expert_type; /* the 3-D expert tensors */
    bool tied;                   /* no output.weight: the head reuses token_embd */
    const char *pre;             /* tokenizer.ggml.pre */
    uint32_t rope_sections[4];   /* qwen2vl: rotated pairs per section (time, row, column, -) */
    /* clip: n_layer, n_embd, n_ff, n_head and rms_eps describe the vision encoder; these the
     * image side and the projector (its output width is the language model's n_embd). */
    uint32_t image_size, patch_size, n_wa_pattern, projection_dim;
};

const struct synth_shape *synth_shape_find(const char *name);
size_t synth_shape_count(void);
const struct synth_shape *synth_shape_at(size_t index);
const char *synth_arch_name(enum synth_arch arch);

/* How a tensor's values are drawn. */
enum synth_init {
    SYNTH_INIT_WEIGHT, /* mean 0, standard deviation `stddev` */
    SYNTH_INIT_EMBED,  /* the same, at unit scale (token embeddings) */
    SYNTH_INIT_OUTPUT, /* the same, scaled down by the layer count (a residual branch's output) */
    SYNTH_INIT_NORM,   /* mean 1, standard deviation `stddev` (RMS-norm gains) */
    SYNTH_INIT_BIAS,   /* mean 0, small (biases) */
};

struct synth_fill_params; /* fill.c: tables that turn random bits into values of a type */

struct synth_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[4];        /* ggml order: ne[0] is the row length */
    enum quant_type type; /* the type written (after any fallback) */
    enum synth_init init;
    float stddev;
    uint64_t offset; /* from the start of the data section; a multiple of the alignment */
    uint64_t bytes;
    uint64_t seed_key; /* hash of the name: the tensor's bytes depend on it and the seed only */
    const struct synth_fill_params *fill;
};

/* The tensors of a shape, laid out. */
struct synth_model {
    struct synth_shape shape;
    struct synth_tensor *tensors;
    size_t n_tensors;
    uint64_t data_bytes; /* size of the data section, padding included */
    uint32_t n_fallback; /* tensors whose rows did not fit the asked type's blocks */
};

/* Build the tensor list of `shape` (already overridden by options). */
pshard_status synth_model_build(struct synth_model *model, const struct synth_shape *shape);
void synth_model_free(struct synth_model *model);
/* llama.cpp's general.file_type for the model's dominant weight type. */
uint32_t synth_model_file_type(const struct synth_model *model);

/* ---- byte-level BPE vocabulary (vocab.c) */
enum synth_token_type { SYNTH_TOKEN_NORMAL = 1, SYNTH_TOKEN_CONTROL = 3, SYNTH_TOKEN_UNUSED = 5 };

struct synth_vocab {
    char **tokens; /* byte-level text of each token, NUL-terminated */
    int32_t *types;
    size_t n_tokens;
    char **merges; /* "left right" */
    size_t n_merges;
    uint32_t id_endoftext, id_im_start, id_im_end;
};

pshard_status synth_vocab_build(struct synth_vocab *vocab, uint32_t n_vocab);
/* Qwen2-VL's control tokens around and inside an image (<|vision_start|>, <|vision_end|>,
 * <|image_pad|>), in place of the first unused fillers. */
pshard_status synth_vocab_add_vision(struct synth_vocab *vocab);
void synth_vocab_free(struct synth_vocab *vocab);

/* ---- GGUF bytes (gguf_write.c): a growing buffer that remembers allocation failure */
struct synth_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed;
};

void synth_buf_free(struct synth_buf *buf);
void synth_buf_put(struct synth_buf *buf, const void *bytes, size_t n);
void synth_buf_u32(struct synth_buf *buf, uint32_t v);
void synth_buf_u64(struct synth_buf *buf, uint64_t v);
void synth_buf_str(struct synth_buf *buf, const char *s);

/* Metadata key/value pairs, counted as they are added. */
struct synth_kv {
    struct synth_buf buf;
    uint64_t count;
};

void synth_kv_str(struct synth_kv *kv, const char *key, const char *value);
void synth_kv_u32(struct synth_kv *kv, const char *key, uint32_t value);
void synth_kv_u64(struct synth_kv *kv, const char *key, uint64_t value);
void synth_kv_f32(struct synth_kv *kv, const char *key, float value);
void synth_kv_bool(struct synth_kv *kv, const char *key, bool value);
void synth_kv_str_array(struct synth_kv *kv, const char *key, char *const *values, size_t n);
void synth_kv_i32_array(struct synth_kv *kv, const char *key, const int32_t *values, size_t n);
void synth_kv_f32_array(struct synth_kv *kv, const char *key, const float *values, size_t n);

enum { SYNTH_ALIGNMENT = 32 };

/* The file header: magic, version, counts, metadata, tensor infos, padded to the alignment. */
pshard_status synth_gguf_header(struct synth_buf *out, const struct synth_kv *kv,
                                const struct synth_model *model);

/* Metadata of a model and its vocabulary, as llama.cpp reads them (metadata.c); a clip shape
 * has no vocabulary (`vocab` is not read). */
void synth_metadata(struct synth_kv *kv, const struct synth_model *model,
                    const struct synth_vocab *vocab, uint64_t seed);

/* ---- values (fill.c) */
/* Prepare each tensor's fill tables; the tables belong to `cache`. */
struct synth_fill_cache;
pshard_status synth_fill_prepare(struct synth_fill_cache **cache, struct synth_model *model,
                                 uint64_t seed);
void synth_fill_cache_free(struct synth_fill_cache *cache);

/* Write `n_units` units (blocks, or elements for plain types) of chunk `chunk_index` of tensor
 * `t` into `out`; the bytes depend on the seed, the tensor's name and the chunk index only. */
void synth_fill(const struct synth_tensor *t, uint64_t seed, uint64_t chunk_index,
                uint64_t n_units, uint8_t *out);

uint16_t synth_f32_to_f16(float f);

/* ---- the parallel writer (writer.c) */
struct synth_write_options {
    const char *path;
    uint64_t seed;
    int n_threads;
    bool progress; /* percent and GB/s on stderr */
    enum synth_io { SYNTH_IO_AUTO, SYNTH_IO_MMAP, SYNTH_IO_PWRITE } io;
    bool header_only; /* the tensor data a hole (zeros), written in no time and no space */
};

pshard_status synth_write_file(const struct synth_model *model, const struct synth_buf *header,
                               const struct synth_write_options *opts, double *seconds);

#endif
