/* Reading a tokenizer from GGUF metadata: images holding only tokenizer.ggml.* keys are built
 * here, so each default (add_bos per model kind and pre-tokenizer) and failure is pinned. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "tok/tok.h"

static size_t encode(const struct tok *t, const char *text, int flags, int32_t *out, size_t cap) {
    size_t n = 0;
    if (tok_encode_into(t, text, strlen(text), flags, out, cap, &n) != PSHARD_OK)
        fail_msg("encode: %s", pshard_last_error());
    return n;
}

static void assert_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want) {
    assert_int_equal(n_got, n_want);
    for (size_t i = 0; i < n_want; i++) assert_int_equal(got[i], want[i]);
}
#define ENC(t, text, flags, out) encode((t), (text), (flags), (out), sizeof(out) / sizeof((out)[0]))
#define ASSERT_IDS(got, n, ...)                                                                  \
    do {                                                                                         \
        const int32_t want_[] = {__VA_ARGS__};                                                   \
        assert_ids((got), (n), want_, sizeof want_ / sizeof want_[0]);                           \
    } while (0)

struct image {
    uint8_t buf[8192];
    size_t n;
};

static void put(struct image *im, const void *p, size_t n) {
    assert_true(im->n + n <= sizeof im->buf);
    memcpy(im->buf + im->n, p, n);
    im->n += n;
}
static void put_u32(struct image *im, uint32_t v) { put(im, &v, 4); }
static void put_u64(struct image *im, uint64_t v) { put(im, &v, 8); }
static void put_str(struct image *im, const char *s) {
    put_u64(im, strlen(s));
    put(im, s, strlen(s));
}
static void put_key(struct image *im, const char *key, uint32_t type) {
    put_str(im, key);
    put_u32(im, type);
}

/* A tokenizer-only GGUF: six tokens, two merges, EOS = 0 and add_eos set; BOS = 0 as well
 * when with_bos. */
static void build_image(struct image *im, const char *model, const char *pre, bool with_bos) {
    static const char *const tokens[] = {"<|endoftext|>", "a", "b", "ab", "Ġ", "Ġab"};
    static const char *const merges[] = {"a b", "Ġ ab"};
    im->n = 0;
    put(im, "GGUF", 4);
    put_u32(im, 3);
    put_u64(im, 0);                /* tensors */
    put_u64(im, with_bos ? 8 : 7); /* metadata keys */
    put_key(im, "tokenizer.ggml.model", GGUF_TYPE_STRING);
    put_str(im, model);
    put_key(im, "tokenizer.ggml.pre", GGUF_TYPE_STRING);
    put_str(im, pre);
    put_key(im, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
    put_u32(im, GGUF_TYPE_STRING);
    put_u64(im, 6);
    for (int i = 0; i < 6; i++) put_str(im, tokens[i]);
    put_key(im, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
    put_u32(im, GGUF_TYPE_INT32);
    put_u64(im, 6);
    for (int i = 0; i < 6; i++) put_u32(im, i == 0 ? 3 : 1);
    put_key(im, "tokenizer.ggml.merges", GGUF_TYPE_ARRAY);
    put_u32(im, GGUF_TYPE_STRING);
    put_u64(im, 2);
    for (int i = 0; i < 2; i++) put_str(im, merges[i]);
    put_key(im, "tokenizer.ggml.eos_token_id", GGUF_TYPE_UINT32);
    put_u32(im, 0);
    if (with_bos) {
        put_key(im, "tokenizer.ggml.bos_token_id", GGUF_TYPE_UINT32);
        put_u32(im, 0);
    }
    put_key(im, "tokenizer.ggml.add_eos_token", GGUF_TYPE_BOOL);
    uint8_t yes = 1;
    put(im, &yes, 1);
}

static pshard_status tok_of_image(const struct image *im, struct tok **t) {
    struct gguf_file *f = NULL;
    if (gguf_open_memory(im->buf, im->n, "tok.gguf", &f) != PSHARD_OK) fail_msg("gguf: %s", pshard_last_error());
    pshard_status s = tok_from_gguf(f, t);
    gguf_close(f);
    return s;
}

static void test_from_gguf_image(void **state) {
    (void)state;
    static struct image im;
    struct tok *t = NULL;
    int32_t ids[8];

    build_image(&im, "gpt2", "smollm", false);
    if (tok_of_image(&im, &t) != PSHARD_OK) fail_msg("tok_from_gguf: %s", pshard_last_error());
    assert_int_equal(tok_n_tokens(t), 6);
    assert_int_equal(tok_kind(t), TOK_MODEL_BPE);
    assert_string_equal(tok_pre_name(t), "smollm");
    assert_false(tok_add_bos(t)); /* gpt2 default */
    assert_true(tok_add_eos(t));
    ASSERT_IDS(ids, ENC(t, "ab ab<|endoftext|>", TOK_PARSE_SPECIAL | TOK_ADD_SPECIAL, ids), 3, 5, 0, 0);
    tok_free(t);

    /* Llama 3 vocabularies add BOS unless told not to; without a BOS id that is an error. */
    build_image(&im, "gpt2", "llama-bpe", true);
    assert_int_equal(tok_of_image(&im, &t), PSHARD_OK);
    assert_true(tok_add_bos(t));
    ASSERT_IDS(ids, ENC(t, "ab", TOK_ADD_SPECIAL, ids), 0, 3, 0);
    tok_free(t);
    build_image(&im, "gpt2", "llama-bpe", false);
    assert_int_equal(tok_of_image(&im, &t), PSHARD_ERR_FORMAT);
    assert_non_null(strstr(pshard_last_error(), "tok.gguf"));

    /* "llama" is SentencePiece, adding BOS and a space prefix by default. */
    build_image(&im, "llama", "", true);
    assert_int_equal(tok_of_image(&im, &t), PSHARD_OK);
    assert_int_equal(tok_kind(t), TOK_MODEL_SPM);
    assert_true(tok_add_bos(t));
    tok_free(t);

    /* A model kind pshard does not know is refused by name. */
    build_image(&im, "bert", "", false);
    assert_int_equal(tok_of_image(&im, &t), PSHARD_ERR_UNSUPPORTED);
    assert_non_null(strstr(pshard_last_error(), "bert"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_gguf_image),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
