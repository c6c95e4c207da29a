/* JSON of the server's replies in OpenAI's shapes: whole chat and text completions, their stream
 * chunks, usage, log-probabilities and error objects. Text from the model is made valid UTF-8
 * before it becomes a JSON string (jansson refuses anything else). */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

/* Length of the valid UTF-8 character at s (at most n bytes), or 0 when it is not one. */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    const unsigned char c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    else if (c >= 0xc2 && c < 0xe0) len = 2, min = 0x80;
    else if (c >= 0xe0 && c < 0xf0) len = 3, min = 0x800;
    else if (c >= 0xf0 && c < 0xf5) len = 4, min = 0x10000;
    else return 0;
    if (len > n) return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return 0;
    return len;
}

json_t *api_string(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    char *clean = malloc(len * 3 + 1); /* each bad byte becomes three */
    if (!clean) return NULL;
    size_t out = 0;
    for (size_t i = 0; i < len;) {
        const size_t n = s[i] ? utf8_char_len(s + i, len - i) : 0;
        if (n) {
            memcpy(clean + out, s + i, n);
            out += n, i += n;
        } else {
            memcpy(clean + out, "\xef\xbf\xbd", 3);
            out += 3, i++;
        }
    }
    json_t *v = json_stringn(clean, out);
    free(clean);
    return v;
}

char *api_dump(json_t *value) {
    if (!value) return NULL;
    char *s = json_dumps(value, JSON_COMPACT);
    json_decref(value);
    return s;
}

json_t *api_error_json(const struct api_error *err) {
    return json_pack("{s:{s:o,s:s,s:o,s:o}}", "error", "message", api_string(err->message, strlen(err->message)),
                     "type", err->type ? err->type : "server_error", "param",
                     err->param[0] ? json_string(err->param) : json_null(), "code",
                     err->code ? json_string(err->code) : json_null());
}

static json_t *bytes_json(const char *s, size_t len) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < len; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

static json_t *chat_token_json(const char *piece, size_t len, float logprob) {
    return json_pack("{s:o,s:f,s:o}", "token", api_string(piece, len), "logprob", (double)logprob, "bytes",
                     bytes_json(piece, len));
}

json_t *api_logprobs_json(enum api_kind kind, const struct api_logprob *lp, size_t n, size_t text_offset0) {
    if (kind == API_CHAT) {
        json_t *content = json_array();
        for (size_t i = 0; content && i < n; i++) {
            json_t *t = chat_token_json(lp[i].piece, lp[i].piece_len, lp[i].logprob), *top = json_array();
            for (int32_t k = 0; top && k < lp[i].n_top; k++)
                json_array_append_new(top, chat_token_json(lp[i].top_pieces[k], lp[i].top_lens[k], lp[i].top_logprobs[k]));
            json_object_set_new(t, "top_logprobs", top);
            json_array_append_new(content, t);
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *token_lps = json_array(), *tops = json_array(), *offsets = json_array();
    size_t at = text_offset0;
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(tokens, api_string(lp[i].piece, lp[i].piece_len));
        json_array_append_new(token_lps, json_real(lp[i].logprob));
        json_array_append_new(offsets, json_integer((json_int_t)at));
        at += lp[i].piece_len;
        json_t *top = json_object();
        for (int32_t k = 0; top && k < lp[i].n_top; k++) {
            json_t *key = api_string(lp[i].top_pieces[k], lp[i].top_lens[k]);
            if (key) json_object_set_new(top, json_string_value(key), json_real(lp[i].top_logprobs[k]));
            json_decref(key);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", token_lps, "top_logprobs", tops,
                     "text_offset", offsets);
}

json_t *api_usage_json(const pshard_request_stats *s) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", s->n_prompt, "completion_tokens", s->n_generated,
                     "total_tokens", s->n_prompt + s->n_generated, "prompt_tokens_details", "cached_tokens",
                     s->n_prompt_cached);
}

/* The fields every reply of the request begins with. */
static json_t *head_json(const struct api_reply_head *h, const char *object) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", h->id, "object", object, "created", (json_int_t)h->created, "model",
                     h->model, "system_fingerprint", "pshard-" PSHARD_VERSION);
}

static json_t *or_null(json_t *v) { return v ? v : json_null(); }

json_t *api_reply_json(const struct api_reply_head *h, const char *text, size_t len, const char *finish,
                       json_t *logprobs, const pshard_request_stats *stats) {
    json_t *r = head_json(h, h->kind == API_CHAT ? "chat.completion" : "text_completion"), *choice;
    if (h->kind == API_CHAT)
        choice = json_pack("{s:i,s:{s:s,s:o,s:n},s:o,s:s}", "index", 0, "message", "role", "assistant", "content",
                           api_string(text, len), "refusal", "logprobs", or_null(logprobs), "finish_reason", finish);
    else
        choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "text", api_string(text, len), "logprobs",
                           or_null(logprobs), "finish_reason", finish);
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    json_object_set_new(r, "usage", api_usage_json(stats));
    return r;
}

json_t *api_chunk_json(const struct api_reply_head *h, bool role, const char *text, size_t len, const char *finish,
                       json_t *logprobs, bool usage_null) {
    json_t *r = head_json(h, h->kind == API_CHAT ? "chat.completion.chunk" : "text_completion"), *choice;
    json_t *reason = finish ? json_string(finish) : json_null();
    if (h->kind == API_CHAT) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (role || len || !finish) json_object_set_new(delta, "content", api_string(text, len));
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs", or_null(logprobs),
                           "finish_reason", reason);
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "text", api_string(text, len), "logprobs", or_null(logprobs),
                           "finish_reason", reason);
    }
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    if (usage_null) json_object_set_new(r, "usage", json_null());
    return r;
}

json_t *api_usage_chunk_json(const struct api_reply_head *h, const pshard_request_stats *stats) {
    json_t *r = head_json(h, h->kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(r, "choices", json_array());
    json_object_set_new(r, "usage", api_usage_json(stats));
    return r;
}
