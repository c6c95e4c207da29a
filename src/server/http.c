/* The HTTP side: a libmicrohttpd daemon with a thread per connection (a connection's thread may
 * block waiting for its request's tokens), the routes, the API key check, request bodies read
 * up to a cap, and server_run, which binds, starts the engine thread, waits for SIGINT or
 * SIGTERM and then stops both in order. */
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "server/http_internal.h"

static const struct {
    const char *method, *path;
} routes[ROUTE_COUNT] = {
    [ROUTE_PAGE] = {"GET", "/"},
    [ROUTE_HEALTH] = {"GET", "/health"},
    [ROUTE_METRICS] = {"GET", "/metrics"},
    [ROUTE_PROPS] = {"GET", "/props"},
    [ROUTE_MODELS] = {"GET", "/v1/models"},
    [ROUTE_CHAT] = {"POST", "/v1/chat/completions"},
    [ROUTE_COMPLETIONS] = {"POST", "/v1/completions"},
    [ROUTE_BUDGET] = {"POST", "/v1/pshard/budget"},
    [ROUTE_OTHER] = {"", "other"},
};

const char *route_name(int route) { return routes[route].path; }

/* Per request: its route and its body as it arrives. */
struct conn_state {
    int route;
    bool answered;
    char *body;
    size_t len, cap;
};

void http_count(struct server *s, int route, int status) {
    const int c = status / 100 - 1;
    if (c >= 0 && c < 5) atomic_fetch_add(&s->http_requests[route][c], 1);
}

enum MHD_Result http_send(struct server *s, struct MHD_Connection *conn, int route, struct reply *r) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(r->body), r->body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(r->body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->retry_after_s > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (r->status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    const enum MHD_Result rc = MHD_queue_response(conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    http_count(s, route, r->status);
    return rc;
}

enum MHD_Result http_send_error(struct server *s, struct MHD_Connection *conn, int route, const struct api_error *err) {
    struct reply r = {err->status, "application/json", api_dump(api_error_json(err)), err->status == 503 ? 1 : 0};
    if (!r.body) return MHD_NO;
    return http_send(s, conn, route, &r);
}

/* "Bearer KEY" against the key, in time that does not depend on where they differ. */
static bool authorized(const struct server *s, struct MHD_Connection *conn) {
    const char *key = s->cfg->api_key;
    if (!key || !*key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    const size_t n = strlen(h), m = strlen(key);
    unsigned diff = n != m;
    for (size_t i = 0; i < m; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < n ? h[i] : 0);
    return diff == 0;
}

static enum MHD_Result send_page(struct server *s, struct MHD_Connection *conn) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(server_chat_html_len, (void *)server_chat_html,
                                                                MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    const enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    http_count(s, ROUTE_PAGE, 200);
    return rc;
}

static enum MHD_Result fail(struct server *s, struct MHD_Connection *conn, int route, int status, const char *type,
                            const char *code, const char *message) {
    struct api_error err;
    api_fail(&err, status, type, code, NULL, "%s", message);
    return http_send_error(s, conn, route, &err);
}

static int find_route(const char *method, const char *url, bool *wrong_method) {
    *wrong_method = false;
    for (int r = 0; r < ROUTE_OTHER; r++) {
        const size_t n = strlen(routes[r].path);
        /* /v1/models/ID names one model */
        const bool match = !strcmp(url, routes[r].path) || (r == ROUTE_MODELS && !strncmp(url, routes[r].path, n) &&
                                                             url[n] == '/' && url[n + 1]);
        if (!match) continue;
        if (strcmp(method, routes[r].method) && !(r < ROUTE_CHAT && !strcmp(method, "HEAD"))) *wrong_method = true;
        return r;
    }
    return ROUTE_OTHER;
}

/* The first call for a request: route, method, key and declared size; a reply now, or NULL. */
static enum MHD_Result begin(struct server *s, struct MHD_Connection *conn, struct conn_state *c, const char *method,
                             const char *url, bool *answered) {
    bool wrong_method;
    c->route = find_route(method, url, &wrong_method);
    *answered = true;
    if (c->route == ROUTE_OTHER) return fail(s, conn, c->route, 404, "invalid_request_error", "not_found", "no such endpoint");
    if (wrong_method) return fail(s, conn, c->route, 405, "invalid_request_error", "method_not_allowed", "method not allowed here");
    const bool needs_key = c->route == ROUTE_MODELS || c->route == ROUTE_CHAT || c->route == ROUTE_COMPLETIONS ||
                           c->route == ROUTE_PROPS || c->route == ROUTE_METRICS || c->route == ROUTE_BUDGET;
    if (needs_key && !authorized(s, conn))
        return fail(s, conn, c->route, 401, "authentication_error", "invalid_api_key",
                    "a valid API key is required: send the header 'Authorization: Bearer KEY'");
    const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length && strtoull(length, NULL, 10) > s->cfg->max_body_bytes) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->cfg->max_body_bytes);
        return fail(s, conn, c->route, 413, "invalid_request_error", "request_too_large", msg);
    }
    struct reply r = {0};
    int rc = 1;
    switch (c->route) {
    case ROUTE_PAGE: return send_page(s, conn);
    case ROUTE_HEALTH: rc = info_health(s, &r); break;
    case ROUTE_METRICS: rc = info_metrics(s, &r); break;
    case ROUTE_PROPS: rc = info_props(s, &r); break;
    case ROUTE_MODELS: rc = info_models(s, url[strlen("/v1/models")] ? url + strlen("/v1/models/") : NULL, &r); break;
    default: *answered = false; return MHD_YES; /* a body to read first */
    }
    if (rc) return fail(s, conn, c->route, 500, "server_error", NULL, "out of memory");
    return http_send(s, conn, c->route, &r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    struct server *s = cls;
    struct conn_state *c = *con_cls;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        *con_cls = c;
        bool answered;
        const enum MHD_Result rc = begin(s, conn, c, method, url, &answered);
        c->answered = answered;
        return rc;
    }
    if (c->answered) { /* an early reply went out: the rest of the body is dropped */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        const size_t n = *upload_size;
        *upload_size = 0;
        if (c->len + n > s->cfg->max_body_bytes) {
            c->answered = true;
            char msg[96];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->cfg->max_body_bytes);
            return fail(s, conn, c->route, 413, "invalid_request_error", "request_too_large", msg);
        }
        if (c->len + n > c->cap) {
            size_t cap = c->cap ? c->cap : 4096;
            while (cap < c->len + n) cap *= 2;
            char *p = realloc(c->body, cap);
            if (!p) return MHD_NO;
            c->body = p, c->cap = cap;
        }
        memcpy(c->body + c->len, upload, n);
        c->len += n;
        return MHD_YES;
    }
    c->answered = true;
    if (c->route == ROUTE_BUDGET) return budget_handle(s, conn, c->body ? c->body : "", c->len);
    return completion_handle(s, conn, c->route == ROUTE_CHAT ? API_CHAT : API_COMPLETION, c->body ? c->body : "", c->len);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct conn_state *c = *con_cls;
    if (!c) return;
    free(c->body);
    free(c);
    *con_cls = NULL;
}

/* ---- Running. */

static int bind_address(const struct server_config *cfg, struct sockaddr_storage *addr, socklen_t *len) {
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    const int rc = getaddrinfo(cfg->host, port, &hints, &res);
    if (rc) {
        fprintf(stderr, "pshard serve: cannot resolve --host %s: %s\n", cfg->host, gai_strerror(rc));
        return -1;
    }
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int server_run(const struct server_config *cfg) {
    struct server s = {.cfg = cfg, .started = time(NULL)};
    struct sockaddr_storage addr;
    socklen_t addr_len;
    if (bind_address(cfg, &addr, &addr_len)) return 1;
    /* Signals go to this thread alone (sigtimedwait below): every thread started from here on
     * inherits the mask. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s.daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                                (unsigned)120, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s, MHD_OPTION_END);
    if (!s.daemon) {
        fprintf(stderr, "pshard serve: cannot listen on %s:%d (in use, or not an address of this machine?)\n", cfg->host,
                cfg->port);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s.daemon, MHD_DAEMON_INFO_BIND_PORT);
    const int port = di ? di->port : cfg->port;
    fprintf(stderr, "pshard serve: listening on http://%s%s%s:%d (loading the model; /health says when it is ready)\n",
            addr.ss_family == AF_INET6 ? "[" : "", cfg->host, addr.ss_family == AF_INET6 ? "]" : "", port);
    if (worker_start(&cfg->worker, &s.worker)) {
        MHD_stop_daemon(s.daemon);
        return 1;
    }
    int status = 0, signals = 0;
    bool announced = false;
    for (;;) {
        const struct timespec tick = {0, 200 * 1000000L};
        const int sig = sigtimedwait(&stop_signals, NULL, &tick);
        const enum worker_state st = worker_state(s.worker);
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, signals++ ? "\npshard serve: stopping now\n"
                                      : "\npshard serve: stopping (requests running get %.0f s to finish; again to stop now)\n",
                    cfg->worker.drain_s);
            worker_stop(s.worker);
        }
        if (st == WORKER_READY && !announced) {
            fprintf(stderr, "pshard serve: ready: model %s, %d sequences at once; chat page at http://%s%s%s:%d/\n",
                    cfg->model_id, cfg->worker.n_parallel, addr.ss_family == AF_INET6 ? "[" : "", cfg->host,
                    addr.ss_family == AF_INET6 ? "]" : "", port);
            announced = true;
        }
        if (st == WORKER_FAILED) status = 1;
        if (st == WORKER_FAILED || st == WORKER_STOPPED) break;
    }
    /* The engine thread closed the model before it said STOPPED: the GPU's memory is free. Every
     * job ended with it (done or cancelled), so the connections' threads end too; the daemon
     * joins them before the worker they read is freed. */
    MHD_stop_daemon(s.daemon);
    worker_free(s.worker);
    s.worker = NULL;
    if (!status) fprintf(stderr, "pshard serve: stopped\n");
    return status;
}
