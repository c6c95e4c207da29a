/* POST /v1/pshard/budget: the VRAM budget changed while the server runs (a game beside it needs
 * memory). The body is {"vram_budget": "4G"} (a size, a count of bytes, "auto" or
 * "auto:keep=SIZE"); the engine thread applies it between steps (worker_set_budget) and the reply
 * is the budget and plan then in force. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "server/http_internal.h"

enum { BUDGET_MAX_BODY = 4096 };

/* The body's budget as text (a number becomes its bytes in decimal): 0, or -1 with err (400). */
static int parse_body(const char *body, size_t len, char *text, size_t size, struct api_error *err) {
    const char *param = "vram_budget";
    if (len > BUDGET_MAX_BODY)
        return api_fail(err, 400, "invalid_request_error", NULL, NULL, "the body is larger than %d bytes", BUDGET_MAX_BODY);
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root)
        return api_fail(err, 400, "invalid_request_error", NULL, NULL, "the body is not valid JSON: %s (line %d, column %d)",
                        jerr.text, jerr.line, jerr.column);
    int rc = 0;
    json_t *v = json_is_object(root) ? json_object_get(root, param) : NULL;
    if (!json_is_object(root))
        rc = api_fail(err, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object: {\"vram_budget\": \"4G\"}");
    else if (!v)
        rc = api_fail(err, 400, "invalid_request_error", NULL, param, "'vram_budget' is required: a size (\"4G\", \"4096M\"), "
                      "a count of bytes, or \"auto\" / \"auto:keep=SIZE\"");
    else if (json_is_integer(v) && json_integer_value(v) >= 0)
        snprintf(text, size, "%" PRId64, (int64_t)json_integer_value(v));
    else if (json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < size &&
             strlen(json_string_value(v)) == json_string_length(v))
        snprintf(text, size, "%s", json_string_value(v));
    else
        rc = api_fail(err, 400, "invalid_request_error", NULL, param, "'vram_budget' must be a size as a string (\"4G\", "
                      "\"auto:keep=1G\") of fewer than %zu bytes, or a count of bytes (a whole number, not negative)", size);
    json_decref(root);
    return rc;
}

int budget_apply(pshard_ctx *ctx, const char *text, struct api_error *err) {
    int64_t bytes, keep;
    int follow;
    pshard_status st = pshard_parse_vram_budget(text, &bytes, &follow, &keep);
    if (st == PSHARD_OK) st = follow ? pshard_follow_free_vram(ctx, keep) : pshard_set_vram_budget(ctx, bytes);
    if (st == PSHARD_OK) return 0;
    const char *why = pshard_last_error();
    if (st == PSHARD_ERR_INVALID_ARG || st == PSHARD_ERR_RANGE)
        return api_fail(err, 400, "invalid_request_error", "invalid_budget", "vram_budget", "%s", why);
    if (st == PSHARD_ERR_UNSUPPORTED) return api_fail(err, 409, "invalid_request_error", "budget_unsupported", "vram_budget", "%s", why);
    return api_fail(err, 500, "server_error", NULL, NULL, "changing the VRAM budget: %s", why);
}

/* The budget and plan in force, as /props has them. */
json_t *budget_json(const pshard_info *i) {
    return json_pack("{s:I,s:b,s:I,s:s,s:i,s:f,s:f,s:f,s:{s:f,s:f,s:f,s:f},s:I}", "vram_budget_bytes",
                     (json_int_t)i->vram_budget, "follow", i->vram_follow, "keep_bytes", (json_int_t)i->vram_keep, "plan", i->plan,
                     "changes", i->budget_changes, "last_change_free_ms", i->budget_free_ms, "last_change_ms",
                     i->budget_change_ms, "last_change_weights_ms", i->budget_weights_ms, "last_change_parts_ms", "plan",
                     i->budget_plan_ms, "pin", i->budget_pin_ms, "arena", i->budget_arena_ms, "fill", i->budget_fill_ms,
                     "arena_bytes", (json_int_t)i->vram_arena_bytes);
}

enum MHD_Result budget_handle(struct server *s, struct MHD_Connection *conn, const char *body, size_t len) {
    char text[64];
    struct api_error err;
    if (parse_body(body, len, text, sizeof text, &err) || worker_set_budget(s->worker, text, &err))
        return http_send_error(s, conn, ROUTE_BUDGET, &err);
    struct worker_snapshot w;
    worker_snapshot(s->worker, &w); /* (taken by the engine thread right after the change) */
    struct reply r = {200, "application/json", api_dump(budget_json(&w.info)), 0};
    if (!r.body) return MHD_NO;
    return http_send(s, conn, ROUTE_BUDGET, &r);
}
