/* The server's request parsing of images (src/server/api_parse.c, base64.c): base64 decoded as
 * RFC 4648 says against an encoder written here, bad characters and endings named by offset;
 * image_url parts with data: URLs become markers in the message's text and bytes in the request;
 * remote URLs, other media types, bad base64 and too many images refused naming the part. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/api.h"
#include "server/base64.h"

static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Plain base64 of n bytes, with or without padding, a newline every `wrap` characters (0: none). */
static char *encode(const uint8_t *p, size_t n, int pad, size_t wrap) {
    char *out = malloc(n * 2 + 8), *o = out;
    size_t column = 0;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t g = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        const size_t chars = n - i >= 3 ? 4 : n - i + 1;
        for (size_t k = 0; k < 4; k++) {
            if (k < chars) *o++ = ALPHABET[(g >> (18 - 6 * k)) & 63];
            else if (pad) *o++ = '=';
            else continue;
            if (wrap && ++column % wrap == 0) *o++ = '\n';
        }
    }
    *o = 0;
    return out;
}

static void round_trips(void **state) {
    uint8_t bytes[200], out[300];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(i * 151 + 7);
    for (size_t n = 0; n <= sizeof bytes; n++)
        for (int pad = 0; pad <= 1; pad++)
            for (size_t wrap = 0; wrap <= 76; wrap += 76) {
                char *text = encode(bytes, n, pad, wrap);
                size_t got = 99, bad = 0;
                assert_true(base64_decoded_max(strlen(text)) <= sizeof out);
                assert_int_equal(base64_decode(text, strlen(text), out, &got, &bad), 0);
                assert_int_equal(got, n);
                assert_memory_equal(out, bytes, n);
                free(text);
            }
    size_t got, bad;
    assert_int_equal(base64_decode("TWFu", 4, out, &got, &bad), 0);
    assert_int_equal(got, 3);
    assert_memory_equal(out, "Man", 3);
}

static void bad_input_named(void **state) {
    static const struct {
        const char *text;
        size_t bad_at;
    } cases[] = {
        {"TW!u", 2},     /* not of the alphabet */
        {"T", 0},        /* a lone character is no byte */
        {"TWFuT", 4},    /* the same after a whole group */
        {"T===", 1},     /* padding after one character */
        {"TQ=x", 3},     /* something after padding */
        {"TQ===", 4},    /* too much padding */
        {"=", 0},        /* padding alone */
        {"TQ=", 3},      /* padding that does not complete the group */
        {"TWFu-_", 4},   /* the URL-safe alphabet is not this one */
        {"TW\x80u", 2},  /* a byte over 127 */
    };
    uint8_t out[16];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t got = 0, bad = 99;
        const int rc = base64_decode(cases[i].text, strlen(cases[i].text), out, &got, &bad);
        if (rc == 0 || bad != cases[i].bad_at) fail_msg("case %zu '%s': rc %d, bad at %zu", i, cases[i].text, rc, bad);
    }
}

/* A chat body with one user message of the given content (JSON). */
static int parse_chat(const char *content, struct api_request *r, struct api_error *err) {
    char body[4096];
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"system\", \"content\": \"hi\"}, {\"role\": \"user\", \"content\": %s}]}",
             content);
    return api_parse_request(API_CHAT, body, strlen(body), r, err);
}

static void image_parts(void **state) {
    struct api_request r;
    struct api_error err;
    /* "PNG!" and "\xff\xd8\xff": the parser decodes; the engine judges the image */
    assert_int_equal(parse_chat("[{\"type\": \"text\", \"text\": \"Look: \"},"
                                " {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,UE5HIQ==\", \"detail\": \"high\"}},"
                                " {\"type\": \"text\", \"text\": \" and \"},"
                                " {\"type\": \"image_url\", \"image_url\": \"data:image/jpeg;base64,/9j/\"}]",
                                &r, &err),
                     0);
    assert_int_equal(r.n_images, 2);
    assert_string_equal(r.messages[1].content, "Look: " PSHARD_IMAGE_MARKER " and " PSHARD_IMAGE_MARKER);
    assert_int_equal(r.images[0].size, 4);
    assert_memory_equal(r.images[0].data, "PNG!", 4);
    assert_string_equal(r.images[0].param, "messages[1].content[1]");
    assert_int_equal(r.images[1].size, 3);
    assert_memory_equal(r.images[1].data, "\xff\xd8\xff", 3);
    api_request_free(&r);
    /* a string content, and a case-insensitive scheme and type */
    assert_int_equal(parse_chat("[{\"type\": \"image_url\", \"image_url\": {\"url\": \"DATA:Image/JPG;BASE64,/9j/\"}}]", &r, &err), 0);
    assert_int_equal(r.n_images, 1);
    assert_string_equal(r.messages[1].content, PSHARD_IMAGE_MARKER);
    api_request_free(&r);
}

static void image_errors_named(void **state) {
    static const struct {
        const char *content, *param, *says;
    } cases[] = {
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"https://example.com/cat.png\"}}]", "messages[1].content[0].image_url",
         "fetches nothing"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"http://example.com/cat.png\"}}]", "messages[1].content[0].image_url",
         "remote URL"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"file:///etc/passwd\"}}]", "messages[1].content[0].image_url",
         "data: URL"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png,abc\"}}]", "messages[1].content[0].image_url",
         "not base64"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:text/plain;base64,UE5HIQ==\"}}]",
         "messages[1].content[0].image_url", "JPEG and PNG"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/gif;base64,UE5HIQ==\"}}]",
         "messages[1].content[0].image_url", "image/gif"},
        {"[{\"type\": \"text\", \"text\": \"x\"}, {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,UE5H!Q==\"}}]",
         "messages[1].content[1].image_url", "character 4"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,U\"}}]", "messages[1].content[0].image_url",
         "bad base64"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,\"}}]", "messages[1].content[0].image_url",
         "empty"},
        {"[{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64\"}}]", "messages[1].content[0].image_url",
         "without a ','"},
        {"[{\"type\": \"image_url\", \"image_url\": {}}]", "messages[1].content[0].image_url", "'url'"},
        {"[{\"type\": \"image_url\"}]", "messages[1].content[0].image_url", "'url'"},
        {"[{\"type\": \"input_audio\"}]", "messages[1].content[0]", "'input_audio'"},
        {"[3]", "messages[1].content[0]", "'type'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct api_request r;
        struct api_error err;
        if (parse_chat(cases[i].content, &r, &err) == 0) fail_msg("case %zu parsed", i);
        assert_int_equal(err.status, 400);
        if (strcmp(err.param, cases[i].param) || !strstr(err.message, cases[i].says))
            fail_msg("case %zu: param '%s', message '%s'", i, err.param, err.message);
    }
    /* more images than a request may carry */
    char content[4096] = "[";
    for (int i = 0; i <= API_MAX_IMAGES; i++)
        strcat(content, "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,UE5HIQ==\"}},");
    content[strlen(content) - 1] = ']';
    struct api_request r;
    struct api_error err;
    assert_int_equal(parse_chat(content, &r, &err), -1);
    assert_non_null(strstr(err.message, "more than 32 images"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trips),
        cmocka_unit_test(bad_input_named),
        cmocka_unit_test(image_parts),
        cmocka_unit_test(image_errors_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
