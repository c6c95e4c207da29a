/* mmproj reading: a well-formed Qwen2.5-VL file (built here, in llama.cpp's names and shapes)
 * loads with the expected hyperparameters and window layers, and each kind of defect fails
 * with a message naming the key, tensor or projector at fault. Also the language-model side:
 * a qwen2vl file's rope sections. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "gguf_builder.h"
#include "test_helpers.h"
#include "model/model.h"
#include "vision/mmproj.h"
#include "vision/mrope.h"

/* What to get wrong in the file built below (all zero: a valid tiny mmproj). */
struct defect {
    const char *architecture;  /* instead of "clip" */
    const char *projector;     /* instead of "qwen2.5vl_merger" */
    const char *drop_key;      /* leave this key out */
    const char *drop_tensor;   /* leave this tensor out */
    const char *bad_tensor;    /* give this tensor a wrong first dimension */
    const char *extra_tensor;  /* add this tensor */
    uint32_t n_head;           /* instead of 4 */
    float std0;                /* instead of OpenAI CLIP's std[0] (when nonzero... or negative) */
    const int32_t *wa_layers;  /* write clip.vision.wa_layer_indexes instead of n_wa_pattern */
    uint32_t n_wa_layers;
    uint32_t window_size;      /* write clip.vision.window_size */
};

enum { E = 64, FF = 96, LAYERS = 4, PROJ = 48, P = 14 };

static void key_u32(struct tb_file *f, const struct defect *d, const char *key, uint32_t v) {
    if (!d->drop_key || strcmp(d->drop_key, key)) tb_kv_u32(f, key, v);
}

static void tensor(struct tb_file *f, const struct defect *d, const char *name, uint32_t type, uint32_t n_dims,
                   uint64_t ne0, uint64_t ne1, uint64_t ne2, uint64_t ne3) {
    if (d->drop_tensor && !strcmp(d->drop_tensor, name)) return;
    if (d->bad_tensor && !strcmp(d->bad_tensor, name)) ne0 += 1;
    tb_tensor(f, name, type, n_dims, ne0, ne1, ne2, ne3);
}

static uint8_t *build(const struct defect *d, size_t *size) {
    static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    if (d->std0 != 0.0f) std[0] = d->std0 < 0.0f ? 0.0f : d->std0;
    struct tb_file f = {0};
    tb_kv_str(&f, "general.architecture", d->architecture ? d->architecture : "clip");
    tb_kv_str(&f, "general.type", "mmproj");
    tb_kv_bool(&f, "clip.has_vision_encoder", true);
    if (!d->drop_key || strcmp(d->drop_key, "clip.projector_type"))
        tb_kv_str(&f, "clip.projector_type", d->projector ? d->projector : "qwen2.5vl_merger");
    key_u32(&f, d, "clip.vision.projection_dim", PROJ);
    key_u32(&f, d, "clip.vision.image_size", 560);
    key_u32(&f, d, "clip.vision.patch_size", P);
    key_u32(&f, d, "clip.vision.embedding_length", E);
    key_u32(&f, d, "clip.vision.feed_forward_length", FF);
    key_u32(&f, d, "clip.vision.block_count", LAYERS);
    key_u32(&f, d, "clip.vision.attention.head_count", d->n_head ? d->n_head : 4);
    tb_kv_f32s(&f, "clip.vision.image_mean", mean, 3);
    tb_kv_f32s(&f, "clip.vision.image_std", std, 3);
    tb_kv_f32(&f, "clip.vision.attention.layer_norm_epsilon", 1e-6f);
    tb_kv_bool(&f, "clip.use_silu", true);
    if (d->wa_layers) tb_kv_i32s(&f, "clip.vision.wa_layer_indexes", d->wa_layers, d->n_wa_layers);
    else key_u32(&f, d, "clip.vision.n_wa_pattern", 2);
    if (d->window_size) tb_kv_u32(&f, "clip.vision.window_size", d->window_size);

    tensor(&f, d, "v.patch_embd.weight", 1, 4, P, P, 3, E);
    tensor(&f, d, "v.patch_embd.weight.1", 1, 4, P, P, 3, E);
    char name[96];
    for (int il = 0; il < LAYERS; il++) {
#define T(suffix, type, n_dims, ne0, ne1)                                                        \
    snprintf(name, sizeof name, "v.blk.%d." suffix, il);                                         \
    tensor(&f, d, name, type, n_dims, ne0, ne1, 1, 1)
        T("ln1.weight", 0, 1, E, 1);
        T("attn_q.weight", 1, 2, E, E);
        T("attn_q.bias", 0, 1, E, 1);
        T("attn_k.weight", 1, 2, E, E);
        T("attn_k.bias", 0, 1, E, 1);
        T("attn_v.weight", 1, 2, E, E);
        T("attn_v.bias", 0, 1, E, 1);
        T("attn_out.weight", 1, 2, E, E);
        T("attn_out.bias", 0, 1, E, 1);
        T("ln2.weight", 0, 1, E, 1);
        T("ffn_gate.weight", 1, 2, E, FF);
        T("ffn_gate.bias", 0, 1, FF, 1);
        T("ffn_up.weight", 1, 2, E, FF);
        T("ffn_up.bias", 0, 1, FF, 1);
        T("ffn_down.weight", 1, 2, FF, E);
        T("ffn_down.bias", 0, 1, E, 1);
#undef T
    }
    tensor(&f, d, "v.post_ln.weight", 0, 1, E, 1, 1, 1);
    tensor(&f, d, "mm.0.weight", 1, 2, 4 * E, 4 * E, 1, 1);
    tensor(&f, d, "mm.0.bias", 0, 1, 4 * E, 1, 1, 1);
    tensor(&f, d, "mm.2.weight", 1, 2, 4 * E, PROJ, 1, 1);
    tensor(&f, d, "mm.2.bias", 0, 1, PROJ, 1, 1, 1);
    if (d->extra_tensor) tb_tensor(&f, d->extra_tensor, 0, 1, E, 1, 1, 1);
    return tb_finish(&f, size);
}

/* Load a built file; return the status and leave the message in `message`. */
static pshard_status load(const struct defect *d, struct mmproj *m, char *message, size_t n) {
    size_t size;
    uint8_t *bytes = build(d, &size);
    struct gguf_file *f = NULL;
    pshard_status st = gguf_open_memory(bytes, size, "test.mmproj", &f);
    assert_int_equal(st, PSHARD_OK);
    st = mmproj_load(f, m);
    snprintf(message, n, "%s", st == PSHARD_OK ? "" : pshard_last_error());
    if (st == PSHARD_OK) mmproj_free(m);
    gguf_close(f);
    free(bytes);
    return st;
}

static void expect_error(const struct defect *d, pshard_status want, const char *needle) {
    struct mmproj m;
    char message[512];
    pshard_status st = load(d, &m, message, sizeof message);
    if (st != want || !strstr(message, needle))
        fail_msg("expected status %d with '%s', got %d: '%s'", want, needle, st, message);
}

static void test_valid_file(void **state) {
    (void)state;
    struct defect d = {0};
    size_t size;
    uint8_t *bytes = build(&d, &size);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_memory(bytes, size, "valid", &f), PSHARD_OK);
    assert_true(mmproj_is_mmproj(f));
    struct mmproj m;
    assert_int_equal(mmproj_load(f, &m), PSHARD_OK);
    const struct vision_hparams *hp = &m.hp;
    assert_int_equal(hp->projector, VISION_PROJECTOR_QWEN25VL);
    assert_string_equal(hp->projector_name, "qwen2.5vl_merger");
    assert_int_equal(hp->patch_size, 14);
    assert_int_equal(hp->spatial_merge, 2);
    assert_int_equal(hp->n_embd, E);
    assert_int_equal(hp->head_dim, E / 4);
    assert_int_equal(hp->projection_dim, PROJ);
    assert_int_equal(hp->window_size, 112); /* the default: llama.cpp's files do not carry it */
    assert_int_equal(hp->min_pixels, 3136);
    assert_int_equal(hp->max_pixels, 12845056);
    /* n_wa_pattern 2: layers 1 and 3 attend over the whole image. */
    assert_false(hp->full_attention[0]);
    assert_true(hp->full_attention[1]);
    assert_false(hp->full_attention[2]);
    assert_true(hp->full_attention[3]);
    assert_int_equal(hp->n_full_attention, 2);
    assert_float_equal(hp->image_std[2], 0.27577711f, 1e-7);
    assert_non_null(m.patch_embd[1]);
    assert_int_equal(m.patch_embd[1]->ne[3], E);
    assert_non_null(m.layers[3].down_b);
    assert_int_equal(m.mm2_w->ne[1], PROJ);
    assert_int_equal(vision_tokens_for_grid(hp, 20, 30), 150);
    mmproj_free(&m);
    gguf_close(f);
    free(bytes);
}

static void test_window_layer_list(void **state) {
    (void)state;
    static const int32_t layers[] = {0, 2};
    struct defect d = {.wa_layers = layers, .n_wa_layers = 2, .window_size = 56};
    size_t size;
    uint8_t *bytes = build(&d, &size);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_memory(bytes, size, "list", &f), PSHARD_OK);
    struct vision_hparams hp;
    assert_int_equal(mmproj_read_hparams(f, &hp), PSHARD_OK);
    assert_true(hp.full_attention[0] && !hp.full_attention[1] && hp.full_attention[2] && !hp.full_attention[3]);
    assert_int_equal(hp.n_wa_pattern, 0);
    assert_int_equal(hp.window_size, 56);
    gguf_close(f);
    free(bytes);
    static const int32_t outside[] = {1, 4};
    expect_error(&(struct defect){.wa_layers = outside, .n_wa_layers = 2}, PSHARD_ERR_FORMAT, "wa_layer_indexes names layer 4");
    expect_error(&(struct defect){.window_size = 100}, PSHARD_ERR_FORMAT, "clip.vision.window_size 100");
}

static void test_bad_keys(void **state) {
    (void)state;
    expect_error(&(struct defect){.architecture = "llama"}, PSHARD_ERR_FORMAT, "not an mmproj file");
    expect_error(&(struct defect){.drop_key = "clip.vision.patch_size"}, PSHARD_ERR_FORMAT, "'clip.vision.patch_size' is missing");
    expect_error(&(struct defect){.drop_key = "clip.vision.n_wa_pattern"}, PSHARD_ERR_FORMAT, "clip.vision.n_wa_pattern");
    expect_error(&(struct defect){.drop_key = "clip.projector_type"}, PSHARD_ERR_FORMAT, "clip.projector_type");
    expect_error(&(struct defect){.n_head = 3}, PSHARD_ERR_FORMAT, "head_count 3");
    expect_error(&(struct defect){.n_head = 32}, PSHARD_ERR_FORMAT, "head_count 32"); /* heads of 2: not a multiple of 4 */
    expect_error(&(struct defect){.std0 = -1.0f}, PSHARD_ERR_FORMAT, "image_std[0]");
}

static void test_projector_types(void **state) {
    (void)state;
    expect_error(&(struct defect){.projector = "fancy_resampler_v9"}, PSHARD_ERR_UNSUPPORTED,
                 "unknown projector type 'fancy_resampler_v9'");
    expect_error(&(struct defect){.projector = "qwen2vl_merger"}, PSHARD_ERR_UNSUPPORTED,
                 "projector type 'qwen2vl_merger' is not supported");
}

static void test_bad_tensors(void **state) {
    (void)state;
    expect_error(&(struct defect){.drop_tensor = "v.blk.2.attn_k.bias"}, PSHARD_ERR_FORMAT, "lacks tensor 'v.blk.2.attn_k.bias'");
    expect_error(&(struct defect){.drop_tensor = "v.patch_embd.weight.1"}, PSHARD_ERR_FORMAT, "'v.patch_embd.weight.1'");
    expect_error(&(struct defect){.bad_tensor = "mm.2.weight"}, PSHARD_ERR_FORMAT, "tensor 'mm.2.weight' has shape");
    expect_error(&(struct defect){.bad_tensor = "v.blk.0.ffn_down.weight"}, PSHARD_ERR_FORMAT, "'v.blk.0.ffn_down.weight'");
    expect_error(&(struct defect){.extra_tensor = "v.blk.9.attn_q.bias"}, PSHARD_ERR_FORMAT, "unexpected tensor 'v.blk.9.attn_q.bias'");
    expect_error(&(struct defect){.extra_tensor = "v.patch_embd.bias"}, PSHARD_ERR_FORMAT, "v.patch_embd.bias");
}

/* A file written by the gguf package's GGUFWriter (tests/data/mmproj/make_mmproj.py). */
static void test_file_from_gguf_py(void **state) {
    (void)state;
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(test_data_path("mmproj/tiny_patch2.gguf"), &f), PSHARD_OK);
    struct mmproj m;
    if (mmproj_load(f, &m) != PSHARD_OK) fail_msg("%s", pshard_last_error());
    assert_int_equal(m.hp.patch_size, 2);
    assert_int_equal(m.hp.n_layer, 2);
    assert_true(m.hp.full_attention[1] && !m.hp.full_attention[0]);
    assert_int_equal(m.weight_bytes, 10240);
    mmproj_free(&m);
    gguf_close(f);
}

/* A qwen2vl language model's hyperparameters: the rope sections are read and must cover the
 * rotated dimensions. */
static pshard_status lm_hparams(const int32_t *sections, uint32_t n_sections, struct model_hparams *hp) {
    struct tb_file f = {0};
    tb_kv_str(&f, "general.architecture", "qwen2vl");
    tb_kv_u32(&f, "qwen2vl.block_count", 2);
    tb_kv_u32(&f, "qwen2vl.embedding_length", 256);
    tb_kv_u32(&f, "qwen2vl.attention.head_count", 4);
    tb_kv_u32(&f, "qwen2vl.attention.head_count_kv", 2);
    if (sections) tb_kv_i32s(&f, "qwen2vl.rope.dimension_sections", sections, n_sections);
    size_t size;
    uint8_t *bytes = tb_finish(&f, &size);
    struct gguf_file *file = NULL;
    assert_int_equal(gguf_open_memory(bytes, size, "lm", &file), PSHARD_OK);
    pshard_status st = model_read_hparams(file, hp);
    gguf_close(file);
    free(bytes);
    return st;
}

static void test_qwen2vl_hparams(void **state) {
    (void)state;
    struct model_hparams hp;
    static const int32_t good[4] = {8, 12, 12, 0}, short_[3] = {8, 12, 4};
    assert_int_equal(lm_hparams(good, 4, &hp), PSHARD_OK);
    assert_int_equal(hp.arch, ARCH_QWEN2VL);
    assert_string_equal(model_arch_name(hp.arch), "qwen2vl");
    assert_int_equal(hp.rope_dim, 64);
    assert_int_equal(hp.rope_sections[1], 12);
    assert_int_equal(lm_hparams(short_, 3, &hp), PSHARD_ERR_FORMAT);
    assert_non_null(strstr(pshard_last_error(), "covers 24 rotated pairs"));
    assert_int_equal(lm_hparams(NULL, 0, &hp), PSHARD_ERR_FORMAT);
    assert_non_null(strstr(pshard_last_error(), "qwen2vl.rope.dimension_sections"));
}

/* M-RoPE for a prompt with an image: three text tokens (0, 1, 2), a 2x2-token image from 3,
 * then text again from 3 + max(2, 2) = 5, as the processor's get_rope_index counts. */
static void test_mrope_positions(void **state) {
    (void)state;
    uint32_t t[6], r[6], c[6];
    assert_int_equal(vision_mrope_image_positions(2, 2, 3, t, r, c), 5);
    static const uint32_t want_t[4] = {3, 3, 3, 3}, want_r[4] = {3, 3, 4, 4}, want_c[4] = {3, 4, 3, 4};
    assert_memory_equal(t, want_t, sizeof want_t);
    assert_memory_equal(r, want_r, sizeof want_r);
    assert_memory_equal(c, want_c, sizeof want_c);
    /* A wide image: 2 rows of 3 tokens from 10; the text after it from 13. */
    assert_int_equal(vision_mrope_image_positions(2, 3, 10, t, r, c), 13);
    assert_int_equal(r[5], 11);
    assert_int_equal(c[5], 12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file),      cmocka_unit_test(test_window_layer_list),
        cmocka_unit_test(test_bad_keys),        cmocka_unit_test(test_projector_types),
        cmocka_unit_test(test_bad_tensors),     cmocka_unit_test(test_qwen2vl_hparams),
        cmocka_unit_test(test_mrope_positions), cmocka_unit_test(test_file_from_gguf_py),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
