/* Request bodies of /v1/chat/completions and /v1/completions, read into struct api_request.
 * The body is untrusted: its nesting is bounded before jansson sees it, every field is checked
 * for type and range (a wrong one is refused naming it, with OpenAI's error shape), fields we
 * do not know are ignored, and null counts as not given, as the OpenAI API treats it. Images come
 * as image_url parts holding data: URLs (base64), decoded here; the engine decodes the image. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/api.h"
#include "server/base64.h"

int api_fail(struct api_error *err, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) {
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad(struct api_error *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(struct api_error *err, const char *param, const char *fmt, ...) {
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api_fail(err, 400, "invalid_request_error", NULL, param, "%s", msg);
}

/* Deeper nesting than API_MAX_DEPTH is refused before parsing (jansson recurses). */
static int check_depth(const char *s, size_t len, struct api_error *err) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        const char c = s[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > API_MAX_DEPTH) return bad(err, NULL, "the body nests arrays and objects deeper than %d", API_MAX_DEPTH);
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return 0;
}

/* A field: NULL when absent or null. */
static json_t *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(json_t *obj, const char *key, bool *out, struct api_error *err) {
    json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(err, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* A number in [lo, hi]; *given set when present. */
static int get_real(json_t *obj, const char *key, double lo, double hi, float *out, bool *given, struct api_error *err) {
    json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(err, key, "'%s' must be a number", key);
    const double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return bad(err, key, "'%s' is %g; it must be from %g to %g", key, x, lo, hi);
    *out = (float)x;
    *given = true;
    return 0;
}

/* A whole number in [lo, hi] (a number such as 2.0 counts). */
static int get_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, bool *given,
                   struct api_error *err) {
    json_t *v = field(obj, key);
    if (!v) return 0;
    int64_t n;
    if (json_is_integer(v)) n = (int64_t)json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e18)
        n = (int64_t)json_real_value(v);
    else return bad(err, key, "'%s' must be an integer", key);
    if (n < lo || n > hi) return bad(err, key, "'%s' is %lld; it must be from %lld to %lld", key, (long long)n, (long long)lo, (long long)hi);
    *out = n;
    if (given) *given = true;
    return 0;
}

static int copy_string(const char *s, size_t len, char **out, struct api_error *err) {
    *out = malloc(len + 1);
    if (!*out) return api_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(*out, s, len);
    (*out)[len] = 0;
    return 0;
}

static bool starts_with(const char *s, size_t len, const char *prefix) {
    const size_t n = strlen(prefix);
    return len >= n && !strncasecmp(s, prefix, n);
}

/* An image_url part: its URL must be a data: URL of a JPEG or PNG in base64, decoded into
 * r->images. Remote URLs are refused: the server fetches nothing. */
static int get_image(json_t *part, const char *param, struct api_request *r, struct api_error *err) {
    char where[128];
    snprintf(where, sizeof where, "%s.image_url", param);
    json_t *image_url = json_object_get(part, "image_url");
    json_t *url = json_is_object(image_url) ? json_object_get(image_url, "url") : image_url; /* also a bare string */
    if (!json_is_string(url)) return bad(err, where, "'%s' must be an object with a 'url' string", where);
    if (r->n_images >= API_MAX_IMAGES) return bad(err, param, "the request has more than %d images", API_MAX_IMAGES);
    const char *u = json_string_value(url);
    const size_t len = json_string_length(url);
    if (starts_with(u, len, "http://") || starts_with(u, len, "https://"))
        return bad(err, where, "'%s' is a remote URL: this server fetches nothing; send the image inline as a data: URL "
                   "(data:image/png;base64,...)", where);
    if (!starts_with(u, len, "data:"))
        return bad(err, where, "'%s' must be a data: URL of a JPEG or PNG image in base64 (data:image/jpeg;base64,...)", where);
    const char *comma = memchr(u, ',', len);
    if (!comma) return bad(err, where, "'%s' is a data: URL without a ',' before its data", where);
    const char *type = u + 5;
    const size_t type_len = (size_t)(comma - type);
    if (type_len < 7 || strncasecmp(comma - 7, ";base64", 7))
        return bad(err, where, "'%s' is a data: URL whose data is not base64 (it must say ';base64,')", where);
    const size_t media_len = strcspn(type, ";");
    if (!starts_with(type, media_len, "image/png") && !starts_with(type, media_len, "image/jpeg") &&
        !starts_with(type, media_len, "image/jpg"))
        return bad(err, where, "'%s' holds '%.*s'; this server reads JPEG and PNG images (image/jpeg, image/png)", where,
                   (int)(media_len < 40 ? media_len : 40), type);
    const char *data = comma + 1;
    const size_t data_len = len - (size_t)(data - u);
    struct api_image *im = &r->images[r->n_images];
    if (!(im->data = malloc(base64_decoded_max(data_len) + 1))) return api_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    r->n_images++; /* owned from here on */
    size_t bad_at;
    if (base64_decode(data, data_len, im->data, &im->size, &bad_at))
        return bad_at < data_len ? bad(err, where, "'%s' holds bad base64: character %zu of its data ('%c') cannot stand there",
                                       where, bad_at, data[bad_at] >= 32 && data[bad_at] < 127 ? data[bad_at] : '?')
                                 : bad(err, where, "'%s' holds bad base64: its data ends in the middle of a byte", where);
    if (im->size == 0) return bad(err, where, "'%s' holds no image: its data is empty", where);
    snprintf(im->param, sizeof im->param, "%s", param);
    return 0;
}

/* Content: a string, or an array of text and image_url parts: the text joined, each image as
 * PSHARD_IMAGE_MARKER in its place (the image itself appended to r->images). */
static int get_content(json_t *v, const char *param, struct api_request *r, char **out, struct api_error *err) {
    if (!v) return copy_string("", 0, out, err);
    if (json_is_string(v)) return copy_string(json_string_value(v), json_string_length(v), out, err);
    if (!json_is_array(v)) return bad(err, param, "'%s' must be a string or an array of content parts", param);
    const size_t marker_len = strlen(PSHARD_IMAGE_MARKER);
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(v, i, part) {
        char where[96];
        snprintf(where, sizeof where, "%s[%zu]", param, i);
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return bad(err, where, "'%s' must be an object with a 'type'", where);
        if (!strcmp(json_string_value(type), "image_url")) {
            if (get_image(part, where, r, err)) return -1;
            total += marker_len;
            continue;
        }
        if (strcmp(json_string_value(type), "text"))
            return bad(err, where, "'%s' is a part of type '%.32s'; this server takes 'text' and 'image_url' parts", where,
                       json_string_value(type));
        if (!json_is_string(text)) return bad(err, where, "'%s' is a text part whose 'text' is not a string", where);
        total += json_string_length(text);
    }
    if (!(*out = malloc(total + 1))) return api_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(v, i, part) {
        json_t *text = json_object_get(part, "text");
        const bool image = !strcmp(json_string_value(json_object_get(part, "type")), "image_url");
        const char *piece = image ? PSHARD_IMAGE_MARKER : json_string_value(text);
        const size_t n = image ? marker_len : json_string_length(text);
        memcpy(*out + at, piece, n);
        at += n;
    }
    (*out)[at] = 0;
    return 0;
}

static int get_messages(json_t *root, struct api_request *r, struct api_error *err) {
    json_t *msgs = field(root, "messages");
    if (!msgs) return bad(err, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return bad(err, "messages", "'messages' must be a non-empty array");
    if (json_array_size(msgs) > API_MAX_MESSAGES)
        return bad(err, "messages", "'messages' has %zu messages; at most %d", json_array_size(msgs), API_MAX_MESSAGES);
    r->messages = calloc(json_array_size(msgs), sizeof *r->messages);
    r->images = calloc(API_MAX_IMAGES, sizeof *r->images);
    if (!r->messages || !r->images) return api_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return bad(err, param, "'%s' must be an object", param);
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role)) return bad(err, param, "'%s' must be a string", param);
        const char *name = json_string_value(role);
        if (!strcmp(name, "developer")) name = "system";
        if (strcmp(name, "system") && strcmp(name, "user") && strcmp(name, "assistant"))
            return bad(err, param, "'%s' is '%.32s'; it must be system, developer, user or assistant", param, name);
        struct api_message *out = &r->messages[r->n_messages++];
        if (copy_string(name, strlen(name), &out->role, err)) return -1;
        snprintf(param, sizeof param, "messages[%zu].content", i);
        json_t *content = field(m, "content");
        if (!content && strcmp(name, "assistant")) return bad(err, param, "'%s' is required", param);
        if (get_content(content, param, r, &out->content, err)) return -1;
    }
    return 0;
}

static int get_prompt(json_t *root, struct api_request *r, struct api_error *err) {
    json_t *p = field(root, "prompt");
    if (!p) return bad(err, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return bad(err, "prompt", "'prompt' is empty");
        return copy_string(json_string_value(p), json_string_length(p), &r->prompt, err);
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return bad(err, "prompt", "'prompt' must be a string, or an array of one string or of token ids");
    const size_t n = json_array_size(p);
    if (n > API_MAX_PROMPT_TOKENS) return bad(err, "prompt", "'prompt' has %zu tokens; at most %d", n, API_MAX_PROMPT_TOKENS);
    r->prompt_tokens = malloc(sizeof(int32_t) * n);
    if (!r->prompt_tokens) return api_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(p, i, t) {
        if (json_is_string(t)) return bad(err, "prompt", "'prompt' holds more than one prompt; send one a request");
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return bad(err, "prompt", "'prompt' must be a string, or an array of one string or of token ids");
        r->prompt_tokens[i] = (int32_t)json_integer_value(t);
    }
    r->n_prompt_tokens = (int32_t)n;
    return 0;
}

static int get_stop(json_t *root, struct api_request *r, struct api_error *err) {
    json_t *s = field(root, "stop");
    if (!s) return 0;
    const size_t n = json_is_array(s) ? json_array_size(s) : 1;
    if (!json_is_string(s) && !json_is_array(s)) return bad(err, "stop", "'stop' must be a string or an array of strings");
    if (n > API_MAX_STOP) return bad(err, "stop", "'stop' has %zu strings; at most %d", n, API_MAX_STOP);
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop) return api_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(s) ? json_array_get(s, i) : s;
        if (!json_is_string(v)) return bad(err, "stop", "'stop' must be a string or an array of strings");
        if (json_string_length(v) > API_MAX_STOP_BYTES)
            return bad(err, "stop", "a stop string has %zu bytes; at most %d", json_string_length(v), API_MAX_STOP_BYTES);
        if (json_string_length(v) == 0) continue; /* matches nothing */
        if (copy_string(json_string_value(v), json_string_length(v), &r->stop[r->n_stop], err)) return -1;
        r->n_stop++;
    }
    return 0;
}

/* Sampling, limits and the stream's options: the fields both endpoints share. */
static int get_options(json_t *root, struct api_request *r, struct api_error *err) {
    int64_t k = 1;
    bool given = false;
    if (get_int(root, "n", 1, INT32_MAX, &k, NULL, err)) return -1;
    if (field(root, "n") && k != 1) return bad(err, "n", "'n' is %lld; this server gives one choice a request (n = 1)", (long long)k);
    if (get_int(root, "max_tokens", 1, 1 << 30, &k, &given, err)) return -1;
    if (given) r->max_tokens = (int32_t)k;
    given = false;
    if (get_int(root, "max_completion_tokens", 1, 1 << 30, &k, &given, err)) return -1;
    if (given) r->max_tokens = (int32_t)k;
    if (get_real(root, "temperature", 0, 2, &r->temperature, &r->has_temperature, err) ||
        get_real(root, "top_p", 0, 1, &r->top_p, &r->has_top_p, err) ||
        get_real(root, "min_p", 0, 1, &r->min_p, &r->has_min_p, err) ||
        get_real(root, "presence_penalty", -2, 2, &r->presence_penalty, &r->has_presence, err) ||
        get_real(root, "frequency_penalty", -2, 2, &r->frequency_penalty, &r->has_frequency, err) ||
        get_real(root, "repeat_penalty", 0.01, 10, &r->repeat_penalty, &r->has_repeat, err))
        return -1;
    if (get_int(root, "top_k", 0, 1 << 30, &k, &r->has_top_k, err)) return -1;
    if (r->has_top_k) r->top_k = (int32_t)k;
    if (get_int(root, "seed", INT64_MIN, INT64_MAX, &k, &r->has_seed, err)) return -1;
    if (r->has_seed) r->seed = (uint64_t)k;
    if (get_bool(root, "stream", &r->stream, err) || get_bool(root, "ignore_eos", &r->ignore_eos, err)) return -1;
    json_t *so = field(root, "stream_options");
    if (so && !json_is_object(so)) return bad(err, "stream_options", "'stream_options' must be an object");
    if (so && get_bool(so, "include_usage", &r->include_usage, err)) {
        snprintf(err->param, sizeof err->param, "stream_options.include_usage");
        return -1;
    }
    return get_stop(root, r, err);
}

/* Chat: logprobs (boolean) and top_logprobs; completions: logprobs (how many of the most likely
 * tokens, 0..5). */
static int get_logprobs(json_t *root, struct api_request *r, struct api_error *err) {
    int64_t k = 0;
    bool given = false;
    if (r->kind == API_COMPLETION) {
        if (get_int(root, "logprobs", 0, 5, &k, &given, err)) return -1;
        if (given) r->top_logprobs = (int32_t)k;
        if (get_bool(root, "echo", &r->echo, err)) return -1;
        if (r->echo) return bad(err, "echo", "'echo' is not supported by this server");
        return 0;
    }
    bool on = false;
    if (get_bool(root, "logprobs", &on, err)) return -1;
    if (get_int(root, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, &k, &given, err)) return -1;
    if (given && !on) return bad(err, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (on) r->top_logprobs = (int32_t)k;
    return 0;
}

void api_request_free(struct api_request *r) {
    for (size_t i = 0; i < r->n_messages; i++) free(r->messages[i].role), free(r->messages[i].content);
    free(r->messages);
    for (size_t i = 0; i < r->n_images; i++) free(r->images[i].data);
    free(r->images);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->model);
    free(r->prompt);
    free(r->prompt_tokens);
    memset(r, 0, sizeof *r);
}

int api_parse_request(enum api_kind kind, const char *body, size_t len, struct api_request *out, struct api_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->max_tokens = -1;
    out->top_logprobs = -1;
    if (check_depth(body, len, err)) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) return bad(err, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    int rc = 0;
    if (!json_is_object(root)) rc = bad(err, NULL, "the body must be a JSON object");
    json_t *model = rc ? NULL : field(root, "model");
    if (!rc && model && !json_is_string(model)) rc = bad(err, "model", "'model' must be a string");
    if (!rc && model) rc = copy_string(json_string_value(model), json_string_length(model), &out->model, err);
    if (!rc) rc = kind == API_CHAT ? get_messages(root, out, err) : get_prompt(root, out, err);
    if (!rc) rc = get_options(root, out, err);
    if (!rc) rc = get_logprobs(root, out, err);
    json_decref(root);
    if (rc) api_request_free(out);
    return rc;
}
