/* Tokenizer on small hand-made vocabularies: BPE merge order, pre-tokenizer splits, special
 * tokens, BOS/EOS, SentencePiece scores and byte fallback, streaming decode of split UTF-8,
 * invalid UTF-8 input, bad vocabularies. (test_tok_gguf.c: reading one from GGUF.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tok/tok.h"

/* ---- building vocabularies */

struct vocab {
    char *tokens[512];
    int32_t types[512];
    float scores[512];
    uint32_t n;
    const char *merges[64];
    uint32_t n_merges;
};

static int32_t add_token(struct vocab *v, const char *text, int32_t type, float score) {
    v->tokens[v->n] = strdup(text);
    v->types[v->n] = type;
    v->scores[v->n] = score;
    return (int32_t)v->n++;
}

static void vocab_free(struct vocab *v) {
    for (uint32_t i = 0; i < v->n; i++) free(v->tokens[i]);
}

/* GPT-2's byte -> printable character rule, written out independently of src/tok. */
static void bytelevel_char(int b, char out[4]) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unsigned cp = (unsigned)b;
    if (!printable) {
        cp = 256;
        for (int c = 0; c < b; c++) cp += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Byte-level vocabulary: ids 0..255 are the bytes, then `extra` tokens, then specials. */
static void bpe_vocab(struct vocab *v, const char *const *extra, const char *const *merges) {
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        char c[4];
        bytelevel_char(b, c);
        add_token(v, c, 1, 0);
    }
    for (int i = 0; extra && extra[i]; i++) add_token(v, extra[i], 1, 0);
    for (int i = 0; merges && merges[i]; i++) v->merges[v->n_merges++] = merges[i];
}

static struct tok *make_tok(const struct vocab *v, enum tok_model_kind kind, const char *pre) {
    struct tok_vocab_desc d = {
        .kind = kind,
        .n_tokens = v->n,
        .tokens = (const char *const *)v->tokens,
        .scores = v->scores,
        .token_types = v->types,
        .n_merges = v->n_merges,
        .merges = v->merges,
        .pre = pre,
        .bos_id = -1, .eos_id = -1, .eot_id = -1, .eom_id = -1, .unk_id = -1, .pad_id = -1,
    };
    struct tok *t = NULL;
    if (tok_create(&d, &t) != PSHARD_OK) fail_msg("tok_create: %s", pshard_last_error());
    return t;
}

static size_t encode(const struct tok *t, const char *text, size_t len, int flags, int32_t *out, size_t cap) {
    size_t n = 0;
    pshard_status s = tok_encode_into(t, text, len, flags, out, cap, &n);
    if (s != PSHARD_OK) fail_msg("encode: %s", pshard_last_error());
    return n;
}

#define ENC(t, text, flags, out) encode((t), (text), strlen(text), (flags), (out), sizeof(out) / sizeof((out)[0]))

static void assert_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want) {
    assert_int_equal(n_got, n_want);
    for (size_t i = 0; i < n_want; i++) assert_int_equal(got[i], want[i]);
}
#define ASSERT_IDS(got, n, ...)                                                                  \
    do {                                                                                         \
        const int32_t want_[] = {__VA_ARGS__};                                                   \
        assert_ids((got), (n), want_, sizeof want_ / sizeof want_[0]);                           \
    } while (0)

/* ---- byte-level BPE */

static void test_bpe_merge_rank_order(void **state) {
    (void)state;
    const char *extra[] = {"ab", "bc", "abc", NULL};
    int32_t ids[16];
    struct vocab v;

    /* "a b" ranks first: a+b, then "ab c" completes the word. */
    const char *merges1[] = {"a b", "b c", "ab c", NULL};
    bpe_vocab(&v, extra, merges1);
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    ASSERT_IDS(ids, ENC(t, "abc", 0, ids), 258);
    tok_free(t);
    vocab_free(&v);

    /* "b c" ranks first: a + bc, and no merge joins those. */
    const char *merges2[] = {"b c", "a b", "ab c", NULL};
    bpe_vocab(&v, extra, merges2);
    t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    ASSERT_IDS(ids, ENC(t, "abc", 0, ids), 'a', 257);
    tok_free(t);
    vocab_free(&v);
}

static void test_bpe_byte_without_token(void **state) {
    (void)state;
    struct vocab v;
    int32_t ids[16];
    /* A byte without a token is left out before merging, as HF's BPE does, so its neighbours
     * in the same piece may merge: "!\x01?" is one piece, and "!?" forms once 0x01 is gone. */
    const char *bang_extra[] = {"!?", NULL};
    const char *bang_merges[] = {"! ?", NULL};
    bpe_vocab(&v, bang_extra, bang_merges);
    strcpy(v.tokens[1], "ZZ"); /* byte 0x01's token "ā" renamed: 0x01 has no token now */
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    ASSERT_IDS(ids, ENC(t, "!\x01?", 0, ids), 256);
    assert_int_equal(ENC(t, "\x01", 0, ids), 0);
    tok_free(t);
    vocab_free(&v);
}

static void test_bpe_equal_pairs_merge_leftmost(void **state) {
    (void)state;
    const char *extra[] = {"aa", NULL};
    const char *merges[] = {"a a", NULL};
    struct vocab v;
    bpe_vocab(&v, extra, merges);
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    int32_t ids[16];
    ASSERT_IDS(ids, ENC(t, "aaa", 0, ids), 256, 'a');
    ASSERT_IDS(ids, ENC(t, "aaaa", 0, ids), 256, 256);
    tok_free(t);
    vocab_free(&v);
}

static void test_bpe_pretokenizer_splits(void **state) {
    (void)state;
    /* "Ġa" exists, but merges never cross a piece boundary: "a a" and "1 2" must not merge
     * across the space or across single digits (smollm splits every digit). */
    const char *extra[] = {"Ġa", "12", "a1", NULL};
    const char *merges[] = {"Ġ a", "1 2", "a 1", NULL};
    struct vocab v;
    bpe_vocab(&v, extra, merges);
    int32_t ids[16];

    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    assert_string_equal(tok_pre_name(t), "gpt2");
    ASSERT_IDS(ids, ENC(t, "a a", 0, ids), 'a', 256);
    ASSERT_IDS(ids, ENC(t, "12", 0, ids), 257);    /* gpt2 keeps digit runs */
    ASSERT_IDS(ids, ENC(t, "a1", 0, ids), 'a', '1'); /* letters and digits split */
    /* Two spaces before a word: the first stays alone ("\s+(?!\S)"), the second joins. */
    ASSERT_IDS(ids, ENC(t, "  a", 0, ids), ' ', 256);
    tok_free(t);

    t = make_tok(&v, TOK_MODEL_BPE, "smollm");
    assert_string_equal(tok_pre_name(t), "smollm");
    ASSERT_IDS(ids, ENC(t, "12", 0, ids), '1', '2');
    tok_free(t);
    vocab_free(&v);
}

static void test_bpe_every_pretokenizer_compiles(void **state) {
    (void)state;
    const char *names[] = {"default", "gpt2", "gpt-2", "llama-bpe", "llama3", "qwen2", "smollm",
                           "deepseek-llm", "deepseek-coder", "deepseek-v3", "starcoder", "falcon",
                           "command-r", "tekken", "dbrx", "stablelm2", "bloom", "viking", "refact",
                           "olmo", "mpt", "jais", "exaone", "chatglm-bpe", NULL};
    const char *extra[] = {"ab", NULL};
    const char *merges[] = {"a b", NULL};
    struct vocab v;
    bpe_vocab(&v, extra, merges);
    const char *text = "Hello wörld 12345 !!\n\n  x 中文 'll ABCdef";
    for (int i = 0; names[i]; i++) {
        struct tok *t = make_tok(&v, TOK_MODEL_BPE, names[i]);
        assert_string_not_equal(tok_pre_name(t), "");
        int32_t ids[128];
        size_t n = ENC(t, text, 0, ids);
        assert_true(n > 0);
        /* Whatever the split, the bytes come back unchanged. */
        char back[256];
        size_t n_back = 0;
        assert_int_equal(tok_decode_into(t, ids, n, 0, back, sizeof back, &n_back), PSHARD_OK);
        assert_int_equal(n_back, strlen(text));
        assert_memory_equal(back, text, n_back);
        tok_free(t);
    }
    /* An unknown name falls back to GPT-2's split rather than failing. */
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "no-such-pre");
    assert_string_equal(tok_pre_name(t), "gpt2");
    tok_free(t);
    t = make_tok(&v, TOK_MODEL_BPE, NULL);
    assert_string_equal(tok_pre_name(t), "gpt2");
    tok_free(t);
    vocab_free(&v);
}

static void test_bpe_ignore_merges(void **state) {
    (void)state;
    /* Llama 3 takes a piece that is a whole token as is, even when merges cannot build it. */
    const char *extra[] = {"abc", NULL};
    struct vocab v;
    bpe_vocab(&v, extra, NULL);
    int32_t ids[16];
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "llama-bpe");
    ASSERT_IDS(ids, ENC(t, "abc", 0, ids), 256);
    tok_free(t);
    t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    ASSERT_IDS(ids, ENC(t, "abc", 0, ids), 'a', 'b', 'c');
    tok_free(t);
    vocab_free(&v);
}

/* ---- special tokens, BOS/EOS */

static void test_special_tokens(void **state) {
    (void)state;
    struct vocab v;
    bpe_vocab(&v, NULL, NULL);
    int32_t start = add_token(&v, "<|im_start|>", 3, 0);
    int32_t prefix = add_token(&v, "<|im", 3, 0); /* a shorter control token at the same place */
    int32_t tool = add_token(&v, "<tool>", 4, 0); /* user-defined: matched even without parsing */
    int32_t ids[64];
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "gpt2");

    ASSERT_IDS(ids, ENC(t, "x<|im_start|>y", TOK_PARSE_SPECIAL, ids), 'x', start, 'y');
    ASSERT_IDS(ids, ENC(t, "<|im_end|>", TOK_PARSE_SPECIAL, ids), prefix, '_', 'e', 'n', 'd', '|', '>');
    ASSERT_IDS(ids, ENC(t, "<|im_start|><|im_start|>", TOK_PARSE_SPECIAL, ids), start, start);
    /* Without parse_special a control token's text is plain text... */
    size_t n = ENC(t, "x<|im_start|>y", 0, ids);
    assert_int_equal(n, strlen("x<|im_start|>y"));
    for (size_t i = 0; i < n; i++) assert_true(ids[i] < 256);
    /* ...but a user-defined token is still one token. */
    ASSERT_IDS(ids, ENC(t, "a<tool>b", 0, ids), 'a', tool, 'b');

    /* Control tokens decode to nothing unless asked for. */
    const char *piece;
    size_t len;
    assert_int_equal(tok_token_to_piece(t, start, 0, &piece, &len), PSHARD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(tok_token_to_piece(t, start, TOK_DECODE_SPECIAL, &piece, &len), PSHARD_OK);
    assert_int_equal(len, 12);
    assert_memory_equal(piece, "<|im_start|>", 12);
    assert_int_equal(tok_token_to_piece(t, -1, 0, &piece, &len), PSHARD_ERR_RANGE);
    assert_int_equal(tok_token_to_piece(t, (int32_t)v.n, 0, &piece, &len), PSHARD_ERR_RANGE);
    assert_int_equal(tok_find(t, "<tool>", 6), tool);
    assert_int_equal(tok_find(t, "<tool", 5), -1);
    tok_free(t);
    vocab_free(&v);
}

static void test_bos_eos_and_empty_input(void **state) {
    (void)state;
    struct vocab v;
    bpe_vocab(&v, NULL, NULL);
    int32_t bos = add_token(&v, "<s>", 3, 0), eos = add_token(&v, "</s>", 3, 0);
    struct tok_vocab_desc d = {
        .kind = TOK_MODEL_BPE, .n_tokens = v.n, .tokens = (const char *const *)v.tokens,
        .token_types = v.types, .pre = "gpt2", .bos_id = bos, .eos_id = eos, .eot_id = -1,
        .eom_id = -1, .unk_id = -1, .pad_id = 9999, /* out of range: ignored with a warning */
        .add_bos = true, .add_eos = true,
    };
    struct tok *t = NULL;
    assert_int_equal(tok_create(&d, &t), PSHARD_OK);
    assert_int_equal(tok_pad(t), -1);
    assert_true(tok_is_eog(t, eos));
    assert_false(tok_is_eog(t, bos));
    int32_t ids[16];
    ASSERT_IDS(ids, ENC(t, "a", TOK_ADD_SPECIAL, ids), bos, 'a', eos);
    ASSERT_IDS(ids, ENC(t, "a", 0, ids), 'a');
    ASSERT_IDS(ids, ENC(t, "", TOK_ADD_SPECIAL, ids), bos, eos);
    assert_int_equal(ENC(t, "", 0, ids), 0);
    size_t n = 1;
    assert_int_equal(tok_encode_into(t, NULL, 0, 0, ids, 16, &n), PSHARD_OK);
    assert_int_equal(n, 0);
    /* A buffer too small says how many are needed. */
    assert_int_equal(tok_encode_into(t, "abc", 3, TOK_ADD_SPECIAL, ids, 2, &n), PSHARD_ERR_RANGE);
    assert_int_equal(n, 5);
    tok_free(t);

    /* add_bos without a BOS token is a bad vocabulary. */
    d.bos_id = -1;
    assert_int_equal(tok_create(&d, &t), PSHARD_ERR_FORMAT);
    assert_null(t);
    vocab_free(&v);
}

/* ---- bad vocabularies */

static void test_bad_vocab(void **state) {
    (void)state;
    struct vocab v;
    const char *extra[] = {"ab", NULL};
    const char *missing[] = {"a b", "a z9", NULL}; /* "z9" is no token */
    bpe_vocab(&v, extra, missing);
    struct tok_vocab_desc d = {
        .kind = TOK_MODEL_BPE, .n_tokens = v.n, .tokens = (const char *const *)v.tokens,
        .token_types = v.types, .n_merges = v.n_merges, .merges = v.merges, .pre = "gpt2",
        .bos_id = -1, .eos_id = -1, .eot_id = -1, .eom_id = -1, .unk_id = -1, .pad_id = -1,
    };
    struct tok *t = NULL;
    assert_int_equal(tok_create(&d, &t), PSHARD_ERR_FORMAT);
    assert_null(t);
    assert_non_null(strstr(pshard_last_error(), "merge 1"));

    const char *no_result[] = {"b a", NULL}; /* both sides exist, "ba" does not */
    d.merges = no_result;
    d.n_merges = 1;
    assert_int_equal(tok_create(&d, &t), PSHARD_ERR_FORMAT);
    assert_non_null(strstr(pshard_last_error(), "merged token"));

    const char *no_space[] = {"ab", NULL};
    d.merges = no_space;
    assert_int_equal(tok_create(&d, &t), PSHARD_ERR_FORMAT);

    d.n_merges = 0;
    d.n_tokens = 0;
    assert_int_equal(tok_create(&d, &t), PSHARD_ERR_FORMAT);
    d.n_tokens = v.n;
    d.kind = (enum tok_model_kind)7;
    assert_int_equal(tok_create(&d, &t), PSHARD_ERR_UNSUPPORTED);
    vocab_free(&v);
}

/* ---- invalid UTF-8 input and round trips */

static void test_invalid_utf8_is_replaced(void **state) {
    (void)state;
    struct vocab v;
    bpe_vocab(&v, NULL, NULL);
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    int32_t got[64], want[64];
    struct {
        const char *bad, *fixed;
    } cases[] = {
        {"a\xff" "b", "a\xEF\xBF\xBD" "b"},
        {"\xe2\x82", "\xEF\xBF\xBD"},                            /* cut-off character: one U+FFFD */
        {"\xf0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},                /* bad second byte: two */
        {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate: three */
        {"\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD"},                /* overlong */
        {"x\x80", "x\xEF\xBF\xBD"},                             /* stray continuation at the end */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n_got = encode(t, cases[i].bad, strlen(cases[i].bad), 0, got, 64);
        size_t n_want = encode(t, cases[i].fixed, strlen(cases[i].fixed), 0, want, 64);
        assert_ids(got, n_got, want, n_want);
    }
    tok_free(t);
    vocab_free(&v);
}

static void test_roundtrip_random_and_long(void **state) {
    (void)state;
    const char *extra[] = {"ĠĠ", "ĠĠĠĠ", NULL};
    const char *merges[] = {"Ġ Ġ", "ĠĠ ĠĠ", NULL};
    struct vocab v;
    bpe_vocab(&v, extra, merges);
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "llama-bpe");
    struct tok_ids ids = {0};

    /* A megabyte of spaces is one pre-token: the merge loop must stay n log n. */
    size_t n = 1 << 20;
    char *spaces = malloc(n);
    memset(spaces, ' ', n);
    assert_int_equal(tok_encode(t, spaces, n, 0, &ids), PSHARD_OK);
    assert_int_equal(ids.n, n / 4);
    char *back = malloc(3 * n);
    size_t n_back;
    assert_int_equal(tok_decode_into(t, ids.ids, ids.n, 0, back, 3 * n, &n_back), PSHARD_OK);
    assert_int_equal(n_back, n);
    assert_memory_equal(back, spaces, n);

    /* Random bytes: valid UTF-8 comes back as it went in; anything decodes without error. */
    srand(1234);
    for (int round = 0; round < 200; round++) {
        size_t len = (size_t)(rand() % 64);
        char text[64];
        for (size_t i = 0; i < len; i++) text[i] = (char)(rand() % 4 == 0 ? 0x80 + rand() % 128 : rand() % 128);
        ids.n = 0;
        assert_int_equal(tok_encode(t, text, len, 0, &ids), PSHARD_OK);
        assert_int_equal(tok_decode_into(t, ids.ids, ids.n, 0, back, 3 * n, &n_back), PSHARD_OK);
        struct tok_ids again = {0};
        assert_int_equal(tok_encode(t, back, n_back, 0, &again), PSHARD_OK);
        assert_ids(again.ids, again.n, ids.ids, ids.n); /* repaired text encodes the same */
        tok_ids_free(&again);
    }
    const char *valid = "naïve café — 日本語 🙂 \t\n end";
    ids.n = 0;
    assert_int_equal(tok_encode(t, valid, strlen(valid), 0, &ids), PSHARD_OK);
    assert_int_equal(tok_decode_into(t, ids.ids, ids.n, 0, back, 3 * n, &n_back), PSHARD_OK);
    assert_int_equal(n_back, strlen(valid));
    assert_memory_equal(back, valid, n_back);
    tok_ids_free(&ids);
    free(back);
    free(spaces);
    tok_free(t);
    vocab_free(&v);
}

/* ---- streaming decode */

static void expect_push(struct tok_decoder *dec, int32_t id, const char *want) {
    const char *text;
    size_t len;
    assert_int_equal(tok_decoder_push(dec, id, &text, &len), PSHARD_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(text, want, len);
}

static void test_streaming_decode_split_utf8(void **state) {
    (void)state;
    struct vocab v;
    bpe_vocab(&v, NULL, NULL);
    struct tok *t = make_tok(&v, TOK_MODEL_BPE, "gpt2");
    struct tok_decoder *dec;
    assert_int_equal(tok_decoder_create(t, 0, &dec), PSHARD_OK);
    /* "é" = C3 A9 and "🙂" = F0 9F 99 82, one byte per token. */
    expect_push(dec, 'a', "a");
    expect_push(dec, 0xC3, "");
    expect_push(dec, 0xA9, "\xC3\xA9");
    expect_push(dec, 0xF0, "");
    expect_push(dec, 0x9F, "");
    expect_push(dec, 0x99, "");
    expect_push(dec, 0x82, "\xF0\x9F\x99\x82");
    /* A byte that can never start a character is replaced at once. */
    expect_push(dec, 0xFF, "\xEF\xBF\xBD");
    /* A started character interrupted by ASCII: the start becomes U+FFFD, the ASCII stays. */
    expect_push(dec, 0xE2, "");
    expect_push(dec, 'x', "\xEF\xBF\xBDx");
    /* An unfinished character at the end comes out at flush. */
    expect_push(dec, 0xE2, "");
    expect_push(dec, 0x82, "");
    const char *text;
    size_t len;
    assert_int_equal(tok_decoder_flush(dec, &text, &len), PSHARD_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(text, "\xEF\xBF\xBD", 3);
    assert_int_equal(tok_decoder_flush(dec, &text, &len), PSHARD_OK);
    assert_int_equal(len, 0);
    assert_int_equal(tok_decoder_push(dec, 100000, &text, &len), PSHARD_ERR_RANGE);
    tok_decoder_free(dec);
    tok_free(t);
    vocab_free(&v);
}

/* ---- SentencePiece */

static void spm_vocab(struct vocab *v) {
    memset(v, 0, sizeof *v);
    add_token(v, "<unk>", 2, 0);
    add_token(v, "<s>", 3, 0);
    add_token(v, "</s>", 3, 0);
    for (int b = 0; b < 256; b++) {
        char text[8];
        snprintf(text, sizeof text, "<0x%02X>", b);
        add_token(v, text, 6, 0);
    }
    /* ids from 259 */
    const char *pieces[] = {"▁", "h", "e", "l", "o", "▁h", "ll", "he", "hell", "hello", "▁hello", "▁he", NULL};
    const float scores[] = {-1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -0.5f};
    for (int i = 0; pieces[i]; i++) add_token(v, pieces[i], 1, scores[i]);
}

static void test_spm_scores_and_byte_fallback(void **state) {
    (void)state;
    struct vocab v;
    spm_vocab(&v);
    struct tok_vocab_desc d = {
        .kind = TOK_MODEL_SPM, .n_tokens = v.n, .tokens = (const char *const *)v.tokens,
        .scores = v.scores, .token_types = v.types, .bos_id = 1, .eos_id = 2, .eot_id = -1,
        .eom_id = -1, .unk_id = 0, .pad_id = -1, .add_bos = true, .add_space_prefix = true,
    };
    struct tok *t = NULL;
    assert_int_equal(tok_create(&d, &t), PSHARD_OK);
    int32_t ids[32];
    const int32_t sp = 259, h = 260, e = 261, l = 262, o = 263, sp_he = 270, ll = 265;
    (void)h;
    (void)e;
    /* "▁he" scores best of the first pairs, so the word is built from it, not from "▁hello". */
    ASSERT_IDS(ids, ENC(t, "hello", TOK_ADD_SPECIAL, ids), 1, sp_he, ll, o);
    /* "é" (C3 A9) is no piece: its bytes' tokens stand in. */
    ASSERT_IDS(ids, ENC(t, "é", 0, ids), sp, 3 + 0xC3, 3 + 0xA9);
    /* Spaces become "▁"; the prefix is added again after a special token. */
    ASSERT_IDS(ids, ENC(t, "l l", 0, ids), sp, l, sp, l);
    ASSERT_IDS(ids, ENC(t, "l</s>l", TOK_PARSE_SPECIAL, ids), sp, l, 2, sp, l);
    /* Decoding drops the space prefix when asked, and byte tokens become their byte. */
    char out[64];
    size_t n_out;
    size_t n = ENC(t, "hello é", TOK_ADD_SPECIAL, ids);
    assert_int_equal(tok_decode_into(t, ids, n, TOK_DECODE_STRIP_SPACE, out, sizeof out, &n_out), PSHARD_OK);
    assert_int_equal(n_out, strlen("hello é"));
    assert_memory_equal(out, "hello é", n_out);
    assert_int_equal(tok_decode_into(t, ids, n, 0, out, sizeof out, &n_out), PSHARD_OK);
    assert_memory_equal(out, " hello é", n_out);
    tok_free(t);

    /* Without byte tokens, an unknown character is UNK. */
    for (uint32_t i = 3; i < 259; i++) v.types[i] = 5, v.tokens[i][1] = 'y'; /* "<0x..>" -> "<yx..>" */
    assert_int_equal(tok_create(&d, &t), PSHARD_OK);
    ASSERT_IDS(ids, ENC(t, "é", 0, ids), sp, 0);
    tok_free(t);
    vocab_free(&v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_merge_rank_order),
        cmocka_unit_test(test_bpe_byte_without_token),
        cmocka_unit_test(test_bpe_equal_pairs_merge_leftmost),
        cmocka_unit_test(test_bpe_pretokenizer_splits),
        cmocka_unit_test(test_bpe_every_pretokenizer_compiles),
        cmocka_unit_test(test_bpe_ignore_merges),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_bos_eos_and_empty_input),
        cmocka_unit_test(test_bad_vocab),
        cmocka_unit_test(test_invalid_utf8_is_replaced),
        cmocka_unit_test(test_roundtrip_random_and_long),
        cmocka_unit_test(test_streaming_decode_split_utf8),
        cmocka_unit_test(test_spm_scores_and_byte_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
