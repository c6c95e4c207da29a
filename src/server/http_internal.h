/* Shared between the server's files: the server's state, its routes, and a reply before it
 * becomes an MHD response. */
#ifndef SERVER_HTTP_INTERNAL_H
#define SERVER_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "server/api.h"
#include "pshard_server.h"
#include "server/worker.h"

enum route {
    ROUTE_PAGE, ROUTE_HEALTH, ROUTE_METRICS, ROUTE_PROPS, ROUTE_MODELS, ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_BUDGET, ROUTE_OTHER,
    ROUTE_COUNT
};
const char *route_name(int route);

struct server {
    const struct server_config *cfg;
    struct worker *worker;
    struct MHD_Daemon *daemon;
    time_t started;
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t http_requests[ROUTE_COUNT][5]; /* by status class 1xx..5xx */
};

/* A whole reply: status, type and a malloc'd body (NUL-terminated). */
struct reply {
    int status;
    const char *content_type;
    char *body;
    int retry_after_s; /* > 0: a Retry-After header */
};

int info_health(struct server *s, struct reply *out);
int info_models(struct server *s, const char *id, struct reply *out);
int info_props(struct server *s, struct reply *out);
int info_metrics(struct server *s, struct reply *out);

/* /v1/chat/completions and /v1/completions (completion.c): a parsed body run as a job. Returns
 * what the access handler returns. */
enum MHD_Result completion_handle(struct server *s, struct MHD_Connection *conn, enum api_kind kind,
                                  const char *body, size_t len);

/* POST /v1/pshard/budget (budget.c): the VRAM budget changed, {"vram_budget": "4G"}. */
enum MHD_Result budget_handle(struct server *s, struct MHD_Connection *conn, const char *body, size_t len);
/* The budget and plan in force (the reply above, and part of /props). */
json_t *budget_json(const pshard_info *info);

/* Queue a whole reply (the body is freed), counting it for /metrics under route. */
enum MHD_Result http_send(struct server *s, struct MHD_Connection *conn, int route, struct reply *r);
/* Queue an error object. */
enum MHD_Result http_send_error(struct server *s, struct MHD_Connection *conn, int route, const struct api_error *err);
/* Whether the client of conn has closed its side (a request can then be cancelled). */
bool http_peer_gone(struct MHD_Connection *conn);
void http_count(struct server *s, int route, int status);

/* The chat page, embedded at build time (chat_html.c, generated from chat.html). */
extern const unsigned char server_chat_html[];
extern const size_t server_chat_html_len;

#endif
