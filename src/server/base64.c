/* Base64 decoding, four characters (24 bits) at a time; see base64.h for what is accepted. */
#include "server/base64.h"

#include <stdbool.h>

/* A character's six bits; -1 for none of the alphabet's. */
static int sextet(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

size_t base64_decoded_max(size_t len) { return len / 4 * 3 + (len % 4 ? 3 : 0); }

int base64_decode(const char *in, size_t len, uint8_t *out, size_t *n_out, size_t *bad_at) {
    uint32_t group = 0;
    int in_group = 0, padding = 0;
    size_t n = 0, last = 0; /* last: where the group now filling began, for a bad ending */
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)in[i];
        if (is_space(c)) continue;
        if (c == '=') {
            /* Padding completes a group of 2 or 3 characters (with 2 or 1 '='), and nothing follows. */
            if (in_group + padding < 2 || in_group + padding >= 4) return *bad_at = i, -1;
            padding++;
            continue;
        }
        const int v = sextet(c);
        if (v < 0 || padding) return *bad_at = i, -1;
        if (in_group == 0) last = i;
        group = group << 6 | (uint32_t)v;
        if (++in_group == 4) {
            out[n++] = (uint8_t)(group >> 16), out[n++] = (uint8_t)(group >> 8), out[n++] = (uint8_t)group;
            group = 0, in_group = 0;
        }
    }
    if (in_group == 1 || (padding && in_group + padding != 4)) return *bad_at = in_group == 1 ? last : len, -1;
    if (in_group == 2) out[n++] = (uint8_t)(group >> 4);
    if (in_group == 3) out[n++] = (uint8_t)(group >> 10), out[n++] = (uint8_t)(group >> 2);
    *n_out = n;
    return 0;
}
