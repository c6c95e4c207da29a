/* Tokenizer construction from plain arrays, and the encode driver: repair the input's UTF-8,
 * cut out special tokens, hand the text between them to the model (BPE or SPM), add BOS/EOS. */
#include "tok/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

static pshard_status copy_vocab(struct tok *tok, const struct tok_vocab_desc *desc) {
    size_t total = 0;
    for (uint32_t id = 0; id < desc->n_tokens; id++) {
        const char *text = desc->tokens[id];
        if (!text && (!desc->token_lens || desc->token_lens[id] != 0))
            return core_fail(PSHARD_ERR_INVALID_ARG, "token %u has no text", id);
        total += desc->token_lens ? desc->token_lens[id] : strlen(text);
    }
    /* Texts, then their decoded pieces, which are never longer than the text. */
    if (total > UINT32_MAX / 2 - 1)
        return core_fail(PSHARD_ERR_RANGE, "vocabulary texts of %zu bytes are too large", total);
    size_t arena_cap = 2 * total + 1;
    tok->entries = calloc(desc->n_tokens, sizeof *tok->entries);
    tok->arena = malloc(arena_cap);
    if (!tok->entries || !tok->arena)
        return core_fail(PSHARD_ERR_NOMEM, "no memory for %u tokens", desc->n_tokens);
    size_t used = 0;
    for (uint32_t id = 0; id < desc->n_tokens; id++) {
        struct tok_entry *e = &tok->entries[id];
        size_t n = desc->token_lens ? desc->token_lens[id] : strlen(desc->tokens[id]);
        if (n) memcpy(tok->arena + used, desc->tokens[id], n);
        e->text_off = (uint32_t)used;
        e->text_len = (uint32_t)n;
        used += n;
        if (n > tok->max_text_len) tok->max_text_len = (uint32_t)n;
        e->score = desc->scores ? desc->scores[id] : 0.0f;
        int32_t type = desc->token_types ? desc->token_types[id] : TOK_TYPE_NORMAL;
        /* Types GGUF does not define are treated as llama.cpp does: undefined. */
        e->type = type >= TOK_TYPE_UNDEFINED && type <= TOK_TYPE_BYTE ? type : TOK_TYPE_UNDEFINED;
    }
    return tok_build_pieces(tok, &used, arena_cap);
}

/* SentencePiece byte fallback tokens are spelled "<0xAB>". */
static void find_spm_byte_tokens(struct tok *tok) {
    for (int b = 0; b < 256; b++) {
        char text[8];
        snprintf(text, sizeof text, "<0x%02X>", b);
        tok->byte_token[b] = tok_text_map_find(tok, text, 6);
        if (tok->byte_token[b] >= 0) tok->has_byte_tokens = true;
    }
}

static int32_t checked_id(const struct tok *tok, int32_t id, const char *what) {
    if (id < 0) return -1;
    if ((uint32_t)id >= tok->n_tokens) {
        LOG_W("tokenizer: %s token id %d is outside the vocabulary of %u; ignored", what, id,
              tok->n_tokens);
        return -1;
    }
    return id;
}

pshard_status tok_create(const struct tok_vocab_desc *desc, struct tok **out) {
    if (!desc || !out) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_create: null argument");
    *out = NULL;
    if (desc->n_tokens == 0 || !desc->tokens)
        return core_fail(PSHARD_ERR_FORMAT, "the vocabulary is empty");
    if (desc->n_tokens > INT32_MAX)
        return core_fail(PSHARD_ERR_RANGE, "vocabulary of %u tokens is too large", desc->n_tokens);
    if (desc->kind != TOK_MODEL_BPE && desc->kind != TOK_MODEL_SPM)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "tokenizer model kind %d", (int)desc->kind);

    struct tok *tok = calloc(1, sizeof *tok);
    if (!tok) return core_fail(PSHARD_ERR_NOMEM, "no memory for a tokenizer");
    tok->kind = desc->kind;
    tok->n_tokens = desc->n_tokens;
    if (tok->kind == TOK_MODEL_BPE) {
        int16_t byte_of_cp[BYTELEVEL_N_CPS];
        bytelevel_tables(tok->bytelevel_cp, byte_of_cp);
    }
    pshard_status status = copy_vocab(tok, desc);
    if (status == PSHARD_OK) status = tok_text_map_build(tok);
    if (status == PSHARD_OK && tok->kind == TOK_MODEL_BPE) {
        status = pretok_init(&tok->pretok, desc->pre);
        if (status == PSHARD_OK) status = bpe_load_merges(tok, desc);
    }
    if (status == PSHARD_OK && tok->kind == TOK_MODEL_SPM) find_spm_byte_tokens(tok);
    if (status == PSHARD_OK) status = tok_specials_build(tok);
    if (status != PSHARD_OK) {
        tok_free(tok);
        return status;
    }
    tok->bos_id = checked_id(tok, desc->bos_id, "BOS");
    tok->eos_id = checked_id(tok, desc->eos_id, "EOS");
    tok->eot_id = checked_id(tok, desc->eot_id, "EOT");
    tok->eom_id = checked_id(tok, desc->eom_id, "EOM");
    tok->unk_id = checked_id(tok, desc->unk_id, "UNK");
    tok->pad_id = checked_id(tok, desc->pad_id, "PAD");
    tok->add_bos = desc->add_bos;
    tok->add_eos = desc->add_eos;
    /* Only SentencePiece vocabularies write spaces as "▁"; byte-level BPE ignores the flag. */
    tok->add_space_prefix = desc->add_space_prefix && tok->kind == TOK_MODEL_SPM;
    if ((tok->add_bos && tok->bos_id < 0) || (tok->add_eos && tok->eos_id < 0)) {
        bool bos = tok->add_bos && tok->bos_id < 0;
        tok_free(tok);
        return core_fail(PSHARD_ERR_FORMAT, "add_%s is set but the vocabulary has no valid %s token",
                         bos ? "bos" : "eos", bos ? "BOS" : "EOS");
    }
    *out = tok;
    return PSHARD_OK;
}

void tok_free(struct tok *tok) {
    if (!tok) return;
    tok_specials_free(&tok->specials);
    tok_pair_map_free(&tok->merges);
    pretok_free(&tok->pretok);
    tok_text_map_free(&tok->map);
    free(tok->arena);
    free(tok->entries);
    free(tok);
}

static pshard_status encode_text(const struct tok *tok, struct tok_scratch *scratch, const char *text,
                                 size_t len, int flags, struct tok_ids *ids) {
    bool add_special = flags & TOK_ADD_SPECIAL;
    if (add_special && tok->add_bos) CORE_TRY(tok_ids_push(ids, tok->bos_id));
    bool after_special = true; /* SPM: the text at the start, as after a special, gets "▁" */
    size_t pos = 0;
    while (pos < len) {
        size_t at = 0;
        int32_t special = tok_specials_find(tok, text + pos, len - pos, flags & TOK_PARSE_SPECIAL, &at);
        size_t fragment = special >= 0 ? at : len - pos;
        if (fragment > 0) {
            if (tok->kind == TOK_MODEL_BPE)
                CORE_TRY(bpe_encode_fragment(tok, scratch, text + pos, fragment, ids));
            else
                CORE_TRY(spm_encode_fragment(tok, scratch, text + pos, fragment,
                                             tok->add_space_prefix && after_special, ids));
            after_special = false;
        }
        if (special < 0) break;
        CORE_TRY(tok_ids_push(ids, special));
        after_special = true;
        pos += at + tok->entries[special].text_len;
    }
    if (add_special && tok->add_eos) CORE_TRY(tok_ids_push(ids, tok->eos_id));
    return PSHARD_OK;
}

pshard_status tok_encode(const struct tok *tok, const char *text, size_t len, int flags,
                         struct tok_ids *ids) {
    if (!tok || !ids || (!text && len))
        return core_fail(PSHARD_ERR_INVALID_ARG, "tok_encode: null argument");
    const char *clean = text;
    size_t clean_len = len;
    char *owned = NULL;
    if (len) CORE_TRY(utf8_sanitize(text, len, &clean, &clean_len, &owned));
    size_t n_before = ids->n;
    struct tok_scratch scratch = {0};
    pshard_status status = encode_text(tok, &scratch, clean, clean_len, flags, ids);
    tok_scratch_free(&scratch);
    free(owned);
    if (status != PSHARD_OK) ids->n = n_before; /* no half results */
    return status;
}

pshard_status tok_encode_into(const struct tok *tok, const char *text, size_t len, int flags,
                              int32_t *out, size_t cap, size_t *n_out) {
    if (!n_out || (!out && cap)) return core_fail(PSHARD_ERR_INVALID_ARG, "tok_encode_into: null argument");
    *n_out = 0;
    struct tok_ids ids = {0};
    CORE_TRY(tok_encode(tok, text, len, flags, &ids));
    *n_out = ids.n;
    size_t n_copy = ids.n < cap ? ids.n : cap;
    if (n_copy) memcpy(out, ids.ids, n_copy * sizeof *out);
    tok_ids_free(&ids);
    if (*n_out > cap)
        return core_fail(PSHARD_ERR_RANGE, "%zu tokens do not fit in %zu", *n_out, cap);
    return PSHARD_OK;
}

uint32_t tok_n_tokens(const struct tok *tok) { return tok->n_tokens; }
enum tok_model_kind tok_kind(const struct tok *tok) { return tok->kind; }
const char *tok_pre_name(const struct tok *tok) { return tok->kind == TOK_MODEL_BPE ? tok->pretok.name : "none"; }
int32_t tok_bos(const struct tok *tok) { return tok->bos_id; }
int32_t tok_eos(const struct tok *tok) { return tok->eos_id; }
int32_t tok_eot(const struct tok *tok) { return tok->eot_id; }
int32_t tok_eom(const struct tok *tok) { return tok->eom_id; }
int32_t tok_unk(const struct tok *tok) { return tok->unk_id; }
int32_t tok_pad(const struct tok *tok) { return tok->pad_id; }
bool tok_add_bos(const struct tok *tok) { return tok->add_bos; }
bool tok_add_eos(const struct tok *tok) { return tok->add_eos; }

bool tok_is_eog(const struct tok *tok, int32_t id) {
    return id >= 0 && (id == tok->eos_id || id == tok->eot_id || id == tok->eom_id);
}

int tok_token_type(const struct tok *tok, int32_t id) {
    if (id < 0 || (uint32_t)id >= tok->n_tokens) return -1;
    return tok->entries[id].type;
}

const char *tok_token_text(const struct tok *tok, int32_t id, size_t *len) {
    if (id < 0 || (uint32_t)id >= tok->n_tokens) return NULL;
    if (len) *len = tok->entries[id].text_len;
    return tok_text(tok, id);
}

int32_t tok_find(const struct tok *tok, const char *text, size_t len) {
    return text ? tok_text_map_find(tok, text, len) : -1;
}
