/* The OpenAI-shaped API of the server: a request body parsed and checked into plain C values
 * (api_parse.c, no engine involved, so it can be fuzzed alone), and the JSON of responses,
 * stream chunks and error objects (api_json.c). */
#ifndef SERVER_API_H
#define SERVER_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

enum api_kind { API_CHAT, API_COMPLETION };

/* What bodies may hold, beyond the body's own size cap (checked by the HTTP side). */
enum {
    API_MAX_DEPTH = 32,        /* nesting of arrays and objects */
    API_MAX_MESSAGES = 1024,
    API_MAX_STOP = 16,
    API_MAX_STOP_BYTES = 256,
    API_MAX_PROMPT_TOKENS = 1 << 20,
    API_MAX_TOP_LOGPROBS = 20,
    API_MAX_IMAGES = 32,       /* image_url parts of one request */
};

struct api_message {
    char *role; /* "system", "user" or "assistant" ("developer" is read as "system") */
    char *content; /* text parts joined; each image_url part as PSHARD_IMAGE_MARKER in its place */
};

/* An image of a data: URL, decoded from base64 (the bytes of a JPEG or PNG file, unchecked). */
struct api_image {
    uint8_t *data;
    size_t size;
    char param[96]; /* the part it came from, "messages[0].content[1]", for errors */
};

/* A request, checked. Fields not given keep the "given" flags false and the server's defaults
 * apply. Strings are owned (api_request_free). */
struct api_request {
    enum api_kind kind;
    char *model;
    struct api_message *messages; /* chat */
    size_t n_messages;
    struct api_image *images;     /* chat: the image_url parts, in order over the messages */
    size_t n_images;
    char *prompt;                 /* completions: text, or */
    int32_t *prompt_tokens;       /* token ids */
    int32_t n_prompt_tokens;
    bool stream, include_usage;
    int32_t max_tokens;           /* -1: not given */
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_seed, has_presence, has_frequency, has_repeat;
    float temperature, top_p, min_p, presence_penalty, frequency_penalty, repeat_penalty;
    int32_t top_k;
    uint64_t seed;
    char **stop;
    size_t n_stop;
    int32_t top_logprobs;         /* -1: no log-probabilities; 0..20 */
    bool echo;                    /* completions: refused unless false */
    bool ignore_eos;              /* llama.cpp's extension: generate past end-of-generation tokens */
};

/* An error as the API reports it: HTTP status and OpenAI's error object. */
struct api_error {
    int status;
    const char *type;   /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code;   /* NULL or a short code ("context_length_exceeded", ...) */
    char param[64];     /* the field at fault ("" for none) */
    char message[384];
};

/* Fills err (status, type, code, param) with a formatted message; returns -1. */
int api_fail(struct api_error *err, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Parse a body of len bytes (need not end in NUL). 0: *out filled (free it with
 * api_request_free); -1: *err says why (status 400), *out holds nothing. */
int api_parse_request(enum api_kind kind, const char *body, size_t len, struct api_request *out,
                      struct api_error *err);
void api_request_free(struct api_request *req);

/* ---- Responses (api_json.c). Every builder returns a new reference (NULL: out of memory). */

/* A string value from bytes that need not be valid UTF-8 (invalid bytes become U+FFFD). */
json_t *api_string(const char *text, size_t len);
/* {"error": {"message", "type", "param", "code"}} */
json_t *api_error_json(const struct api_error *err);
/* Serialized compactly into a malloc'd string (NULL: out of memory); the reference is released. */
char *api_dump(json_t *value);

/* One generated token's log-probability and those of the most likely tokens, as given out. */
struct api_logprob {
    const char *piece;   /* the token's bytes */
    size_t piece_len;
    float logprob;
    int32_t n_top;
    const char *const *top_pieces;
    const size_t *top_lens;
    const float *top_logprobs;
};

/* The fields common to every response of one request. */
struct api_reply_head {
    enum api_kind kind;
    const char *id;     /* "chatcmpl-..." or "cmpl-..." */
    const char *model;
    int64_t created;
};

/* Log-probabilities of n tokens in the chat shape ({"content": [...]}) or the completions shape
 * ({"tokens", "token_logprobs", "top_logprobs", "text_offset"}, offsets from text_offset0). */
json_t *api_logprobs_json(enum api_kind kind, const struct api_logprob *lp, size_t n, size_t text_offset0);
json_t *api_usage_json(const pshard_request_stats *stats);
/* The whole reply (stream off). finish: "stop" or "length"; logprobs may be NULL. */
json_t *api_reply_json(const struct api_reply_head *h, const char *text, size_t len, const char *finish,
                       json_t *logprobs, const pshard_request_stats *stats);
/* A stream chunk: text (the chat's first chunk has role set), finish (NULL while generating) and
 * logprobs (may be NULL); usage_null adds "usage": null (stream_options.include_usage). */
json_t *api_chunk_json(const struct api_reply_head *h, bool role, const char *text, size_t len, const char *finish,
                       json_t *logprobs, bool usage_null);
/* The last chunk with include_usage: no choices, the usage. */
json_t *api_usage_chunk_json(const struct api_reply_head *h, const pshard_request_stats *stats);

#endif
