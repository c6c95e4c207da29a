/* Base64 (RFC 4648's standard alphabet) decoded, for the images of data: URLs in request bodies.
 * The input is untrusted: every byte is checked, and a bad one is named by its offset. */
#ifndef SERVER_BASE64_H
#define SERVER_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* The most bytes `len` characters of base64 decode to. */
size_t base64_decoded_max(size_t len);

/* Decode in[0, len) into out (room for base64_decoded_max(len) bytes): 0 with *n_out, or -1 with
 * *bad_at the offset of the first character that cannot stand where it does (len where the text
 * ends in the middle of a byte). ASCII whitespace is skipped (line-wrapped base64); the '='
 * padding may be left out, but where it is given it must complete the last group and end the text. */
int base64_decode(const char *in, size_t len, uint8_t *out, size_t *n_out, size_t *bad_at);

#endif
