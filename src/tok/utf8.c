/* UTF-8 classification and repair, shared by encoding (input repair) and the streaming
 * decoder (holding back split characters), plus GPT-2's byte <-> code point table. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

size_t utf8_len_from_lead(uint8_t b) {
    if (b < 0xC0) return 1;
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    return b < 0xF8 ? 4 : 1;
}

/* Valid second-byte ranges follow the Unicode table of well-formed sequences (no overlongs,
 * no surrogates, nothing above U+10FFFF); the invalid subpart is then the longest prefix of a
 * well-formed sequence, so one U+FFFD replaces it exactly as Python and HF do. */
enum utf8_result utf8_next(const uint8_t *s, size_t n, size_t *len) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *len = 1;
        return UTF8_OK;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *len = 1;
        return UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = n;
            return UTF8_INCOMPLETE;
        }
        uint8_t c = s[i];
        bool ok = i == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
        if (!ok) {
            *len = i;
            return UTF8_INVALID;
        }
    }
    *len = need;
    return UTF8_OK;
}

size_t utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static const char replacement_utf8[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

pshard_status utf8_sanitize(const char *text, size_t len, const char **clean, size_t *clean_len,
                            char **owned) {
    const uint8_t *s = (const uint8_t *)text;
    *owned = NULL;
    size_t i = 0, step = 0;
    while (i < len && utf8_next(s + i, len - i, &step) == UTF8_OK) i += step;
    if (i == len) {
        *clean = text;
        *clean_len = len;
        return PSHARD_OK;
    }
    /* Each replaced subpart is at least one byte and becomes three: 3 * len bounds the copy. */
    if (len > SIZE_MAX / 3) return core_fail(PSHARD_ERR_RANGE, "text of %zu bytes is too long", len);
    char *copy = malloc(3 * len);
    if (!copy) return core_fail(PSHARD_ERR_NOMEM, "no memory to repair %zu bytes of UTF-8", len);
    memcpy(copy, text, i);
    size_t o = i;
    while (i < len) {
        enum utf8_result r = utf8_next(s + i, len - i, &step);
        if (r == UTF8_OK) {
            memcpy(copy + o, text + i, step);
            o += step;
        } else {
            memcpy(copy + o, replacement_utf8, 3);
            o += 3;
        }
        i += step;
    }
    *clean = copy;
    *clean_len = o;
    *owned = copy;
    return PSHARD_OK;
}

/* GPT-2 maps the 188 printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') to themselves and the
 * other 68 bytes, in order, to U+0100.. so that every token is printable text. */
static bool bytelevel_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

void bytelevel_tables(uint16_t cp_of_byte[256], int16_t byte_of_cp[BYTELEVEL_N_CPS]) {
    for (int cp = 0; cp < BYTELEVEL_N_CPS; cp++) byte_of_cp[cp] = -1;
    uint16_t next_extra = 256;
    for (unsigned b = 0; b < 256; b++) {
        uint16_t cp = bytelevel_is_printable(b) ? (uint16_t)b : next_extra++;
        cp_of_byte[b] = cp;
        byte_of_cp[cp] = (int16_t)b;
    }
}
