/* Special tokens in text: CONTROL, USER_DEFINED and UNKNOWN tokens whose exact text appears in
 * the input are cut out before the model's own algorithm runs, leftmost first and the longest
 * at a position (the leftmost-longest rule of HF's added-token matcher). */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static bool is_special_type(int32_t type) {
    return type == TOK_TYPE_CONTROL || type == TOK_TYPE_USER_DEFINED || type == TOK_TYPE_UNKNOWN;
}

struct special_key {
    uint32_t len;
    int32_t id;
};

static int longer_first(const void *a, const void *b) {
    const struct special_key *ka = a, *kb = b;
    if (ka->len != kb->len) return ka->len > kb->len ? -1 : 1;
    return (ka->id > kb->id) - (ka->id < kb->id);
}

pshard_status tok_specials_build(struct tok *tok) {
    struct tok_specials *sp = &tok->specials;
    uint32_t count[256] = {0};
    uint32_t n = 0;
    for (uint32_t id = 0; id < tok->n_tokens; id++) {
        const struct tok_entry *e = &tok->entries[id];
        if (!is_special_type(e->type) || e->text_len == 0) continue;
        count[(uint8_t)tok_text(tok, (int32_t)id)[0]]++;
        n++;
        sp->n_user_defined += e->type == TOK_TYPE_USER_DEFINED;
    }
    sp->first[0] = 0;
    for (int b = 0; b < 256; b++) sp->first[b + 1] = sp->first[b] + count[b];
    sp->ids = malloc((n ? n : 1) * sizeof *sp->ids);
    struct special_key *keys = malloc((n ? n : 1) * sizeof *keys);
    if (!sp->ids || !keys) {
        free(keys);
        return core_fail(PSHARD_ERR_NOMEM, "no memory for %u special tokens", n);
    }
    uint32_t fill[256];
    memcpy(fill, sp->first, sizeof fill);
    for (uint32_t id = 0; id < tok->n_tokens; id++) {
        const struct tok_entry *e = &tok->entries[id];
        if (!is_special_type(e->type) || e->text_len == 0) continue;
        keys[fill[(uint8_t)tok_text(tok, (int32_t)id)[0]]++] = (struct special_key){e->text_len, (int32_t)id};
    }
    for (int b = 0; b < 256; b++)
        if (count[b] > 1) qsort(keys + sp->first[b], count[b], sizeof *keys, longer_first);
    for (uint32_t k = 0; k < n; k++) sp->ids[k] = keys[k].id;
    free(keys);
    return PSHARD_OK;
}

void tok_specials_free(struct tok_specials *sp) {
    free(sp->ids);
    sp->ids = NULL;
}

int32_t tok_specials_find(const struct tok *tok, const char *text, size_t len, bool parse_special,
                          size_t *at) {
    const struct tok_specials *sp = &tok->specials;
    if (sp->first[256] == 0 || (!parse_special && sp->n_user_defined == 0)) return -1;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)text[i];
        for (uint32_t k = sp->first[b]; k < sp->first[b + 1]; k++) {
            int32_t id = sp->ids[k];
            const struct tok_entry *e = &tok->entries[id];
            if (!parse_special && e->type != TOK_TYPE_USER_DEFINED) continue;
            if (e->text_len <= len - i && memcmp(tok_text(tok, id), text + i, e->text_len) == 0) {
                *at = i;
                return id;
            }
        }
    }
    return -1;
}
