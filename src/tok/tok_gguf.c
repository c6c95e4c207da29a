/* Reading a tokenizer from GGUF metadata (tokenizer.ggml.*) into a tok_vocab_desc. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "gguf/gguf.h"

/* An optional token id key: absent leaves *id alone; malformed is an error. */
static pshard_status read_id(const struct gguf_file *f, const char *key, int32_t *id) {
    uint32_t value;
    pshard_status s = gguf_get_u32(f, key, &value);
    if (s == PSHARD_ERR_NOT_FOUND) return PSHARD_OK;
    if (s != PSHARD_OK) return s;
    *id = value > INT32_MAX ? -1 : (int32_t)value;
    return PSHARD_OK;
}

static pshard_status read_flag(const struct gguf_file *f, const char *key, bool *flag) {
    pshard_status s = gguf_get_bool(f, key, flag);
    return s == PSHARD_ERR_NOT_FOUND ? PSHARD_OK : s;
}

/* A string array as the (pointer, length) pairs tok_vocab_desc takes. */
static pshard_status read_strings(const struct gguf_file *f, const char *key, uint32_t *n,
                                  const char ***texts, uint32_t **lens) {
    struct gguf_array array;
    CORE_TRY(gguf_get_array(f, key, &array));
    if (array.type != GGUF_TYPE_STRING)
        return core_fail(PSHARD_ERR_FORMAT, "%s holds %s, not strings", key, gguf_type_name(array.type));
    if (array.n > INT32_MAX) return core_fail(PSHARD_ERR_RANGE, "%s has %llu entries", key, (unsigned long long)array.n);
    struct gguf_str *strs;
    CORE_TRY(gguf_array_strings(&array, &strs));
    *n = (uint32_t)array.n;
    *texts = malloc((array.n ? array.n : 1) * sizeof **texts);
    *lens = malloc((array.n ? array.n : 1) * sizeof **lens);
    pshard_status status = PSHARD_OK;
    if (!*texts || !*lens) status = core_fail(PSHARD_ERR_NOMEM, "no memory for %s", key);
    for (uint64_t i = 0; i < array.n && status == PSHARD_OK; i++) {
        if (strs[i].len > UINT32_MAX) status = core_fail(PSHARD_ERR_RANGE, "%s[%llu] is too long", key, (unsigned long long)i);
        (*texts)[i] = strs[i].data;
        (*lens)[i] = (uint32_t)strs[i].len;
    }
    free(strs);
    return status;
}

/* A numeric per-token array (scores, types) of exactly n_tokens entries, or absent. */
static pshard_status read_numbers(const struct gguf_file *f, const char *key, uint32_t n_tokens,
                                  bool want_float, void **out) {
    *out = NULL;
    struct gguf_array array;
    pshard_status s = gguf_get_array(f, key, &array);
    if (s == PSHARD_ERR_NOT_FOUND) return PSHARD_OK;
    CORE_TRY(s);
    if (array.type == GGUF_TYPE_STRING || array.type == GGUF_TYPE_ARRAY || array.type == GGUF_TYPE_BOOL)
        return core_fail(PSHARD_ERR_FORMAT, "%s holds %s, not numbers", key, gguf_type_name(array.type));
    if (array.n != n_tokens)
        return core_fail(PSHARD_ERR_FORMAT, "%s has %llu entries for %u tokens", key,
                         (unsigned long long)array.n, n_tokens);
    void *values = malloc((n_tokens ? n_tokens : 1) * 4);
    if (!values) return core_fail(PSHARD_ERR_NOMEM, "no memory for %s", key);
    for (uint32_t i = 0; i < n_tokens; i++) {
        if (want_float) {
            ((float *)values)[i] = (float)gguf_array_float(&array, i);
        } else {
            int64_t v = gguf_array_int(&array, i);
            ((int32_t *)values)[i] = v < INT32_MIN || v > INT32_MAX ? TOK_TYPE_UNDEFINED : (int32_t)v;
        }
    }
    *out = values;
    return PSHARD_OK;
}

pshard_status tok_from_gguf(const struct gguf_file *f, struct tok **out) {
    if (!f || !out) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_from_gguf: null argument");
    *out = NULL;
    struct gguf_str model;
    pshard_status s = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (s == PSHARD_ERR_NOT_FOUND) return core_fail(s, "the model has no tokenizer (tokenizer.ggml.model)");
    CORE_TRY(s);
    struct tok_vocab_desc desc = {.bos_id = -1, .eos_id = -1, .eot_id = -1, .eom_id = -1, .unk_id = -1, .pad_id = -1};
    if (gguf_str_eq(model, "gpt2")) {
        desc.kind = TOK_MODEL_BPE;
    } else if (gguf_str_eq(model, "llama")) {
        desc.kind = TOK_MODEL_SPM;
        desc.add_bos = true;
        desc.add_space_prefix = true;
    } else {
        return core_fail(PSHARD_ERR_UNSUPPORTED, "tokenizer model '%.*s' (supported: gpt2, llama)",
                         (int)(model.len > 64 ? 64 : model.len), model.data);
    }

    char *pre = NULL;
    const char **tokens = NULL, **merges = NULL;
    uint32_t *token_lens = NULL, *merge_lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    struct gguf_str pre_str;
    s = gguf_get_str(f, "tokenizer.ggml.pre", &pre_str);
    if (s == PSHARD_OK) {
        pre = malloc(pre_str.len + 1);
        if (!pre) return core_fail(PSHARD_ERR_NOMEM, "no memory");
        memcpy(pre, pre_str.data, pre_str.len);
        pre[pre_str.len] = '\0';
        desc.pre = pre;
        /* Llama 3 and Tekken vocabularies add BOS unless the file says otherwise. */
        if (desc.kind == TOK_MODEL_BPE && pretok_adds_bos(pre)) desc.add_bos = true;
        s = PSHARD_OK;
    } else if (s == PSHARD_ERR_NOT_FOUND) {
        s = PSHARD_OK;
    }
    if (s == PSHARD_OK) s = read_strings(f, "tokenizer.ggml.tokens", &desc.n_tokens, &tokens, &token_lens);
    if (s == PSHARD_OK) s = read_numbers(f, "tokenizer.ggml.scores", desc.n_tokens, true, (void **)&scores);
    if (s == PSHARD_OK) s = read_numbers(f, "tokenizer.ggml.token_type", desc.n_tokens, false, (void **)&types);
    if (s == PSHARD_OK && desc.kind == TOK_MODEL_BPE) {
        s = read_strings(f, "tokenizer.ggml.merges", &desc.n_merges, &merges, &merge_lens);
        if (s == PSHARD_ERR_NOT_FOUND) s = core_fail(s, "a gpt2 tokenizer without tokenizer.ggml.merges");
    }
    if (s == PSHARD_OK) s = read_id(f, "tokenizer.ggml.bos_token_id", &desc.bos_id);
    if (s == PSHARD_OK) s = read_id(f, "tokenizer.ggml.eos_token_id", &desc.eos_id);
    if (s == PSHARD_OK) s = read_id(f, "tokenizer.ggml.eot_token_id", &desc.eot_id);
    if (s == PSHARD_OK) s = read_id(f, "tokenizer.ggml.eom_token_id", &desc.eom_id);
    if (s == PSHARD_OK) s = read_id(f, "tokenizer.ggml.unknown_token_id", &desc.unk_id);
    if (s == PSHARD_OK) s = read_id(f, "tokenizer.ggml.padding_token_id", &desc.pad_id);
    if (s == PSHARD_OK) s = read_flag(f, "tokenizer.ggml.add_bos_token", &desc.add_bos);
    if (s == PSHARD_OK) s = read_flag(f, "tokenizer.ggml.add_eos_token", &desc.add_eos);
    if (s == PSHARD_OK) s = read_flag(f, "tokenizer.ggml.add_space_prefix", &desc.add_space_prefix);
    if (s == PSHARD_OK) {
        desc.tokens = tokens;
        desc.token_lens = token_lens;
        desc.scores = scores;
        desc.token_types = types;
        desc.merges = merges;
        desc.merge_lens = merge_lens;
        s = tok_create(&desc, out);
    }
    free(pre);
    free(tokens);
    free(token_lens);
    free(merges);
    free(merge_lens);
    free(scores);
    free(types);
    return s == PSHARD_OK ? s : core_fail_context(s, "tokenizer of %s", gguf_path(f) ? gguf_path(f) : "GGUF");
}

pshard_status tok_load_gguf_path(const char *path, struct tok **out) {
    if (!path || !out) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_load_gguf_path: null argument");
    struct gguf_file *f;
    CORE_TRY(gguf_open(path, &f));
    pshard_status s = tok_from_gguf(f, out);
    gguf_close(f);
    return s;
}
