/* libFuzzer target for the server's request parser (src/server/api_parse.c): any byte string, as a
 * chat and as a text completion body, must parse into values within the documented bounds or be
 * refused with a 400 error object, never read out of bounds or leak; what parses is turned into
 * reply JSON, which must serialize (the model's text need not be valid UTF-8, so neither is it here).
 * Image parts' data: URLs are decoded from base64: each image that parses has bytes and its marker. */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static void check(const struct api_request *r) {
    if (r->n_stop > API_MAX_STOP || r->top_logprobs > API_MAX_TOP_LOGPROBS || r->top_logprobs < -1) abort();
    if (r->max_tokens == 0 || r->max_tokens < -1) abort();
    for (size_t i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0] || strlen(r->stop[i]) > API_MAX_STOP_BYTES) abort();
    if (r->kind == API_CHAT && (r->n_messages == 0 || r->n_messages > API_MAX_MESSAGES)) abort();
    for (size_t i = 0; i < r->n_messages; i++)
        if (!r->messages[i].content || (strcmp(r->messages[i].role, "system") && strcmp(r->messages[i].role, "user") &&
                                        strcmp(r->messages[i].role, "assistant")))
            abort();
    if (r->kind == API_COMPLETION && !r->prompt && r->n_prompt_tokens <= 0) abort();
    if (r->has_temperature && !(r->temperature >= 0 && r->temperature <= 2)) abort();
    /* Images: within the bound, none empty, each with a marker in the messages' text. */
    if (r->n_images > API_MAX_IMAGES || (r->kind != API_CHAT && r->n_images)) abort();
    size_t markers = 0;
    for (size_t i = 0; i < r->n_messages; i++)
        for (const char *at = strstr(r->messages[i].content, PSHARD_IMAGE_MARKER); at; at = strstr(at + 1, PSHARD_IMAGE_MARKER))
            markers++;
    if (markers < r->n_images) abort();
    for (size_t i = 0; i < r->n_images; i++)
        if (!r->images[i].data || !r->images[i].size || !r->images[i].param[0]) abort();
}

static void reply(const struct api_request *r, const char *text, size_t len) {
    const struct api_reply_head head = {r->kind, "id", "model", 0};
    const pshard_request_stats stats = {1, 0, 1, 0, 0, 0};
    char *s = api_dump(api_reply_json(&head, text, len, "stop", NULL, &stats));
    char *c = api_dump(api_chunk_json(&head, true, text, len, NULL, NULL, r->include_usage));
    if (!s || !c) abort();
    free(s);
    free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    for (int kind = API_CHAT; kind <= API_COMPLETION; kind++) {
        struct api_request r;
        struct api_error err;
        if (api_parse_request((enum api_kind)kind, body, size, &r, &err)) {
            if (err.status != 400 && err.status != 500) abort();
            char *e = api_dump(api_error_json(&err));
            if (!e) abort();
            free(e);
            continue;
        }
        check(&r);
        if (r.kind == API_CHAT) reply(&r, r.messages[0].content, strlen(r.messages[0].content));
        else if (r.prompt) reply(&r, r.prompt, strlen(r.prompt));
        api_request_free(&r);
    }
    reply(&(struct api_request){.kind = API_CHAT}, body, size); /* raw bytes as model text */
    return 0;
}
