/* /v1/chat/completions and /v1/completions: the body becomes a job for the engine thread; the
 * connection's thread (one per connection) waits for it, checking all the while that the client
 * is still there, and answers with the whole reply or streams it as server-sent events. A
 * client that goes away has its request cancelled before the engine's next step. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/grow.h"
#include "server/http_internal.h"

enum { WAIT_MS = 100 };

static const char *finish_text(pshard_finish_reason f) { return f == PSHARD_FINISH_LENGTH ? "length" : "stop"; }

/* Log-probabilities of the job's tokens [from, to) (under the lock, or once the job is done). */
static json_t *job_logprobs(const struct job *j, size_t from, size_t to, size_t text_offset0) {
    if (j->req.top_logprobs < 0 || from >= to) return NULL;
    struct api_logprob *lp = calloc(to - from, sizeof *lp);
    const char **pieces = calloc(j->n_tops + 1, sizeof *pieces);
    size_t *lens = calloc(j->n_tops + 1, sizeof *lens);
    float *lps = calloc(j->n_tops + 1, sizeof *lps);
    json_t *out = NULL;
    if (lp && pieces && lens && lps) {
        for (size_t k = 0; k < j->n_tops; k++)
            pieces[k] = j->pieces + j->tops[k].piece_off, lens[k] = j->tops[k].piece_len, lps[k] = j->tops[k].logprob;
        for (size_t i = from; i < to; i++) {
            const struct job_token *t = &j->tokens[i];
            lp[i - from] = (struct api_logprob){j->pieces + t->piece_off, t->piece_len, t->logprob, t->n_top,
                                                pieces + t->top_off, lens + t->top_off, lps + t->top_off};
        }
        out = api_logprobs_json(j->req.kind, lp, to - from, text_offset0);
    }
    free(lp), free(pieces), free(lens), free(lps);
    return out;
}

/* ---- Streaming. */

enum stream_phase { PHASE_START, PHASE_TEXT, PHASE_USAGE, PHASE_DONE, PHASE_END };

struct stream {
    struct server *server;
    struct job *job;
    struct MHD_Connection *conn;
    struct api_reply_head head;
    char id[48];
    enum stream_phase phase;
    size_t sent_text, sent_tokens;
    char *out;
    size_t out_len, out_off, out_cap;
    bool failed;
};

static void put(struct stream *st, const char *data, size_t len) {
    if (core_grow((void **)&st->out, &st->out_cap, st->out_len + len, 1) != PSHARD_OK) {
        st->failed = true;
        return;
    }
    memcpy(st->out + st->out_len, data, len);
    st->out_len += len;
}

/* One event: "data: JSON\n\n" (the reference is released). */
static void put_event(struct stream *st, json_t *value) {
    char *s = api_dump(value);
    if (!s) {
        st->failed = true;
        return;
    }
    put(st, "data: ", 6);
    put(st, s, strlen(s));
    put(st, "\n\n", 2);
    free(s);
}

/* Under the lock: events for what the job produced since the last call. */
static void put_progress(struct stream *st) {
    struct job *j = st->job;
    const bool usage_null = j->req.include_usage;
    if (j->req.top_logprobs >= 0) /* a chunk a token, each with its log-probabilities */
        for (; st->sent_tokens < j->n_tokens; st->sent_tokens++) {
            const struct job_token *t = &j->tokens[st->sent_tokens];
            put_event(st, api_chunk_json(&st->head, false, j->text + st->sent_text, t->text_end - st->sent_text, NULL,
                                         job_logprobs(j, st->sent_tokens, st->sent_tokens + 1, st->sent_text), usage_null));
            st->sent_text = t->text_end;
        }
    if (st->sent_text < j->text_len) {
        put_event(st, api_chunk_json(&st->head, false, j->text + st->sent_text, j->text_len - st->sent_text, NULL, NULL,
                                     usage_null));
        st->sent_text = j->text_len;
    }
}

/* Under the lock: the next events, waiting for the engine when there are none yet; false when the
 * stream must end at once (the client left, or nothing could be written). */
static bool fill(struct stream *st) {
    struct job *j = st->job;
    while (st->out_off == st->out_len && st->phase != PHASE_END) {
        st->out_len = st->out_off = 0;
        if (st->phase == PHASE_START) {
            if (j->req.kind == API_CHAT) put_event(st, api_chunk_json(&st->head, true, "", 0, NULL, NULL, j->req.include_usage));
            st->phase = PHASE_TEXT;
        } else if (st->phase == PHASE_TEXT) {
            put_progress(st);
            if (j->state == JOB_DONE) {
                if (j->finish == PSHARD_FINISH_STOP || j->finish == PSHARD_FINISH_LENGTH) {
                    put_event(st, api_chunk_json(&st->head, false, "", 0, finish_text(j->finish), NULL, j->req.include_usage));
                } else {
                    struct api_error err = j->error;
                    if (j->finish == PSHARD_FINISH_CANCELLED)
                        api_fail(&err, 503, "server_error", "unavailable", NULL, "the request was cancelled: the server is stopping");
                    put_event(st, api_error_json(&err));
                }
                st->phase = j->req.include_usage && j->finish != PSHARD_FINISH_CANCELLED ? PHASE_USAGE : PHASE_DONE;
            } else if (st->out_len == 0) {
                if (http_peer_gone(st->conn)) return false;
                worker_wait(st->server->worker, WAIT_MS);
            }
        } else if (st->phase == PHASE_USAGE) {
            put_event(st, api_usage_chunk_json(&st->head, &j->stats));
            st->phase = PHASE_DONE;
        } else if (st->phase == PHASE_DONE) {
            put(st, "data: [DONE]\n\n", 14);
            st->phase = PHASE_END;
        }
        if (st->failed) return false;
    }
    return true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct stream *st = cls;
    struct worker *w = st->server->worker;
    worker_lock(w);
    const bool ok = fill(st);
    worker_unlock(w);
    if (!ok) {
        worker_cancel(w, st->job);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (st->out_off == st->out_len) return MHD_CONTENT_READER_END_OF_STREAM;
    const size_t n = st->out_len - st->out_off < max ? st->out_len - st->out_off : max;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    struct stream *st = cls;
    worker_cancel(st->server->worker, st->job); /* nothing when it ended */
    job_release(st->server->worker, st->job);
    free(st->out);
    free(st);
}

static enum MHD_Result start_stream(struct server *s, struct MHD_Connection *conn, struct job *j,
                                    const struct api_reply_head *head) {
    struct stream *st = calloc(1, sizeof *st);
    if (!st) return MHD_NO;
    st->server = s, st->job = j, st->conn = conn, st->head = *head;
    snprintf(st->id, sizeof st->id, "%s", head->id);
    st->head.id = st->id;
    worker_lock(s->worker);
    j->refs++;
    worker_unlock(s->worker);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    const enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    http_count(s, head->kind == API_CHAT ? ROUTE_CHAT : ROUTE_COMPLETIONS, 200);
    return rc;
}

/* ---- The handler. */

/* Waits (the lock held) until the job leaves `state`, or the client leaves: false then. */
static bool wait_past(struct server *s, struct MHD_Connection *conn, struct job *j, enum job_state state) {
    while (j->state == state) {
        worker_wait(s->worker, WAIT_MS);
        if (j->state == state && http_peer_gone(conn)) return false;
    }
    return true;
}

static enum MHD_Result whole_reply(struct server *s, struct MHD_Connection *conn, int route, struct job *j,
                                   const struct api_reply_head *head) {
    struct api_error err;
    if (j->finish == PSHARD_FINISH_ERROR) return http_send_error(s, conn, route, &j->error);
    if (j->finish == PSHARD_FINISH_CANCELLED) {
        api_fail(&err, 503, "server_error", "unavailable", NULL, "the request was cancelled: the server is stopping");
        return http_send_error(s, conn, route, &err);
    }
    struct reply r = {200, "application/json", NULL, 0};
    r.body = api_dump(api_reply_json(head, j->text ? j->text : "", j->text_len, finish_text(j->finish),
                                     job_logprobs(j, 0, j->n_tokens, 0), &j->stats));
    if (!r.body) {
        api_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
        return http_send_error(s, conn, route, &err);
    }
    return http_send(s, conn, route, &r);
}

enum MHD_Result completion_handle(struct server *s, struct MHD_Connection *conn, enum api_kind kind, const char *body,
                                  size_t len) {
    const int route = kind == API_CHAT ? ROUTE_CHAT : ROUTE_COMPLETIONS;
    struct api_error err;
    struct job *j = job_new();
    if (!j) {
        api_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
        return http_send_error(s, conn, route, &err);
    }
    /* The body's images are decoded here, on this connection's thread: the engine thread only encodes them. */
    if (api_parse_request(kind, body, len, &j->req, &err) || worker_prepare_images(s->worker, j, &err) ||
        worker_submit(s->worker, j, &err)) {
        job_release(s->worker, j);
        return http_send_error(s, conn, route, &err);
    }
    char id[48];
    snprintf(id, sizeof id, "%s-%016llx%08llx", kind == API_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    const struct api_reply_head head = {kind, id, s->cfg->model_id, (int64_t)time(NULL)};
    enum MHD_Result rc;
    worker_lock(s->worker);
    if (!wait_past(s, conn, j, JOB_QUEUED)) {
        worker_unlock(s->worker);
        rc = MHD_NO;
    } else if (j->state == JOB_FAILED) {
        err = j->error;
        worker_unlock(s->worker);
        rc = http_send_error(s, conn, route, &err);
    } else if (j->req.stream) {
        worker_unlock(s->worker);
        rc = start_stream(s, conn, j, &head);
    } else {
        const bool here = wait_past(s, conn, j, JOB_RUNNING);
        worker_unlock(s->worker);
        rc = here ? whole_reply(s, conn, route, j, &head) : MHD_NO; /* done: the engine no longer writes to it */
    }
    if (rc == MHD_NO) worker_cancel(s->worker, j);
    job_release(s->worker, j);
    return rc;
}

bool http_peer_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {ci->connect_fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}
