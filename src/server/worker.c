/* The engine thread and the jobs it runs (see worker.h). HTTP threads decode a request's images
 * (worker_prepare_images), submit jobs to an inbox and flag cancellations; the engine thread, the
 * only one that calls into the context, formats and adds them between steps, steps while anything
 * is pending, and sleeps on a condition variable when idle. Events land in the jobs under one
 * lock; one broadcast a step wakes the HTTP threads. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/grow.h"
#include "server/worker.h"

/* PREPARE_AT_ONCE: requests whose images are prepared at once on request threads (an image may take
 * 150 MB decoded, and its patches 24 bytes a pixel after the resize; more requests wait their turn).
 * PREPARED_HELD_MAX: the prepared images' patches waiting in the queue to be encoded, in bytes (a
 * 1440p image's are about 90 MB): past it, requests with images wait before preparing theirs. */
enum { RATE_WINDOW_S = 10, BUDGET_IDLE_POLL_MS = 200, PREPARE_AT_ONCE = 4 };
static const size_t PREPARED_HELD_MAX = (size_t)1 << 30;

struct worker {
    struct worker_config cfg;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;     /* the engine thread: the inbox, a cancellation, a stop */
    pthread_cond_t progress; /* HTTP threads: some job moved */
    enum worker_state state;
    pshard_ctx *ctx;
    pshard_image_preparer *preparer; /* made with ctx where it reads images; request threads use it */
    int32_t n_preparing;             /* requests whose images request threads decode now */
    size_t prepared_bytes;           /* the patches prepared and not encoded yet (jobs' prepared_bytes) */
    pthread_cond_t prepare_turn;     /* request threads: one of them is done decoding, or patches freed */
    struct job *inbox, *running;
    int32_t n_jobs;          /* submitted and not finished */
    bool cancel_flagged, stop_now;
    double drain_deadline;
    uint64_t seed_counter;
    struct worker_snapshot snap;
    int64_t rate_second[RATE_WINDOW_S];
    uint64_t rate_tokens[RATE_WINDOW_S];
    /* A change of VRAM budget asked over HTTP (worker_set_budget), one at a time: the engine
     * thread applies it between steps (budget_apply) and answers in budget_rc and budget_err. */
    bool budget_busy, budget_asked, budget_done;
    char budget_text[64];
    int budget_rc;
    struct api_error budget_err;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void worker_lock(struct worker *w) { pthread_mutex_lock(&w->lock); }
void worker_unlock(struct worker *w) { pthread_mutex_unlock(&w->lock); }

void worker_wait(struct worker *w, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&w->progress, &w->lock, &ts);
}

struct job *job_new(void) {
    struct job *j = calloc(1, sizeof *j);
    if (j) j->refs = 1, j->id = -1;
    return j;
}

static void free_prepared(struct job *j) {
    for (size_t i = 0; j->prepared && i < j->req.n_images; i++) pshard_prepared_image_free(j->prepared[i]);
    free(j->prepared);
    j->prepared = NULL;
}

/* Under the lock: a job's prepared images no longer counted (freed, or about to be). */
static void uncount_prepared(struct worker *w, struct job *j) {
    if (!j->prepared_bytes) return;
    w->prepared_bytes -= j->prepared_bytes;
    j->prepared_bytes = 0;
    pthread_cond_broadcast(&w->prepare_turn);
}

/* Under the lock. */
static void job_unref(struct worker *w, struct job *j) {
    if (--j->refs > 0) return;
    uncount_prepared(w, j);
    free_prepared(j);
    api_request_free(&j->req);
    free(j->text);
    free(j->tokens);
    free(j->tops);
    free(j->pieces);
    free(j);
}

void job_release(struct worker *w, struct job *j) {
    if (!j) return;
    worker_lock(w);
    job_unref(w, j);
    worker_unlock(w);
}

/* Bytes of text the request's prompt holds. */
static size_t prompt_bytes(const struct api_request *q) {
    size_t n = q->prompt ? strlen(q->prompt) : 0;
    for (size_t i = 0; i < q->n_messages; i++) n += strlen(q->messages[i].content);
    return n;
}

int worker_submit(struct worker *w, struct job *j, struct api_error *err) {
    int rc = 0;
    /* Far more text than the context could hold is refused here, so that tokenizing it does not
     * hold up the engine thread: over 128 bytes a token on average, a prompt would have to be
     * made of nothing but a vocabulary's very longest tokens to fit. */
    const size_t bytes = prompt_bytes(&j->req);
    worker_lock(w);
    const int64_t n_ctx = w->snap.info.n_ctx;
    if (n_ctx > 0 && bytes > (size_t)n_ctx * 128)
        rc = api_fail(err, 400, "invalid_request_error", "context_length_exceeded",
                      j->req.kind == API_CHAT ? "messages" : "prompt",
                      "the prompt has %zu bytes, more than a sequence's context of %lld tokens can hold", bytes,
                      (long long)n_ctx);
    else if (j->req.n_images && !w->cfg.vision)
        rc = api_fail(err, 400, "invalid_request_error", NULL, j->req.images[0].param,
                      "this server reads no images: it was started without the model's vision encoder (--mmproj)");
    else if (w->state == WORKER_LOADING)
        rc = api_fail(err, 503, "server_error", "loading", NULL, "the model is still loading; try again shortly");
    else if (w->state != WORKER_READY)
        rc = api_fail(err, 503, "server_error", "unavailable", NULL, "the server is shutting down");
    else if (w->n_jobs >= w->cfg.n_parallel + w->cfg.max_queue)
        rc = api_fail(err, 503, "server_error", "queue_full", NULL,
                      "the server is busy: %d requests are running or waiting; try again shortly", w->n_jobs);
    if (rc == 0) {
        j->refs++;
        j->state = JOB_QUEUED;
        j->worker = w;
        struct job **tail = &w->inbox;
        while (*tail) tail = &(*tail)->next;
        *tail = j;
        w->n_jobs++;
        pthread_cond_signal(&w->wake);
    }
    worker_unlock(w);
    return rc;
}

void worker_cancel(struct worker *w, struct job *j) {
    worker_lock(w);
    if (j->state == JOB_QUEUED || j->state == JOB_RUNNING) {
        j->cancel = true;
        w->cancel_flagged = true;
        pthread_cond_signal(&w->wake);
    }
    worker_unlock(w);
}

/* ---- Events, on the engine thread (the lock not held by the caller). */

static int append_piece(struct job *j, pshard_ctx *ctx, int32_t token, uint32_t *off, uint32_t *len) {
    const char *piece;
    size_t n;
    pshard_token_piece(ctx, token, &piece, &n);
    if (n > 1024 || j->pieces_len + n > UINT32_MAX || core_grow((void **)&j->pieces, &j->pieces_cap, j->pieces_len + n, 1))
        return -1;
    memcpy(j->pieces + j->pieces_len, piece, n);
    *off = (uint32_t)j->pieces_len, *len = (uint32_t)n;
    j->pieces_len += n;
    return 0;
}

/* Under the lock: the request's token and the most likely ones, kept for the logprobs field. */
static int keep_logprobs(struct worker *w, struct job *j, const pshard_token_event *ev) {
    if (core_grow((void **)&j->tokens, &j->tokens_cap, j->n_tokens + 1, sizeof *j->tokens) ||
        core_grow((void **)&j->tops, &j->tops_cap, j->n_tops + (size_t)ev->n_top, sizeof *j->tops))
        return -1;
    struct job_token *t = &j->tokens[j->n_tokens];
    t->text_end = j->text_len, t->logprob = ev->logprob, t->top_off = (uint32_t)j->n_tops, t->n_top = ev->n_top;
    if (append_piece(j, w->ctx, ev->token, &t->piece_off, &t->piece_len)) return -1;
    for (int32_t k = 0; k < ev->n_top; k++) {
        struct job_top *top = &j->tops[j->n_tops + (size_t)k];
        top->logprob = ev->top_logprobs[k];
        if (append_piece(j, w->ctx, ev->top_tokens[k], &top->piece_off, &top->piece_len)) return -1;
    }
    j->n_tops += (size_t)ev->n_top;
    j->n_tokens++;
    return 0;
}

static void count_rate(struct worker *w, uint64_t n) {
    const int64_t sec = (int64_t)now_s();
    const int at = (int)(sec % RATE_WINDOW_S);
    if (w->rate_second[at] != sec) w->rate_second[at] = sec, w->rate_tokens[at] = 0;
    w->rate_tokens[at] += n;
}

/* A request's event: its text and tokens into the job; the last one ends the job. */
static int on_event(void *user, const pshard_token_event *ev) {
    struct job *j = user;
    struct worker *w = j->worker;
    worker_lock(w);
    if (ev->len && !core_grow((void **)&j->text, &j->text_cap, j->text_len + ev->len + 1, 1)) {
        memcpy(j->text + j->text_len, ev->text, ev->len);
        j->text_len += ev->len;
        j->text[j->text_len] = 0;
    } else if (ev->len) {
        j->alloc_failed = true;
    }
    if (ev->token >= 0) {
        j->n_generated++;
        w->snap.generated_tokens++;
        count_rate(w, 1);
        if (j->req.top_logprobs >= 0 && keep_logprobs(w, j, ev)) j->alloc_failed = true;
    }
    const int stop = j->cancel || j->alloc_failed;
    if (ev->finish != PSHARD_FINISH_NONE) {
        j->finish = ev->finish;
        j->stats = *ev->stats;
        j->state = JOB_DONE;
        if (ev->finish == PSHARD_FINISH_ERROR)
            api_fail(&j->error, 500, "server_error", NULL, NULL, "generation failed: %s", ev->error ? ev->error : "");
        if (j->alloc_failed) {
            j->finish = PSHARD_FINISH_ERROR;
            api_fail(&j->error, 500, "server_error", NULL, NULL, "out of memory");
        }
        if (j->finish == PSHARD_FINISH_CANCELLED) w->snap.requests_cancelled++;
        else if (j->finish == PSHARD_FINISH_ERROR) w->snap.requests_failed++;
        else w->snap.requests_done++;
        w->snap.prompt_tokens += (uint64_t)ev->stats->n_prompt;
        w->snap.prompt_tokens_cached += (uint64_t)ev->stats->n_prompt_cached;
        for (struct job **p = &w->running; *p; p = &(*p)->next)
            if (*p == j) {
                *p = j->next;
                break;
            }
        w->n_jobs--;
        job_unref(w, j); /* the engine's reference */
    }
    worker_unlock(w);
    return stop;
}

/* ---- The engine thread. */

/* A request without max_tokens: -n's, else what its sequence's share of the KV pool leaves after
 * its prompt (at least a quarter of the share). The engine admits a request only when the pool
 * can hold it to its limit, so a limit of the whole context would run such requests one at a time. */
static int32_t default_limit(const struct worker *w, int32_t n_prompt) {
    if (w->cfg.default_max_tokens >= 0) return w->cfg.default_max_tokens;
    const int32_t share = w->snap.info.n_ctx / (w->cfg.n_parallel > 0 ? w->cfg.n_parallel : 1);
    if (share <= 0) return -1;
    return share - n_prompt > share / 4 ? share - n_prompt : (share / 4 > 0 ? share / 4 : 1);
}

/* The default limit of a request without max_tokens, by its prompt's length (images counted). */
static int32_t predict_for(void *user, int32_t n_prompt) {
    const struct job *j = user;
    return default_limit(j->worker, n_prompt);
}

/* A failed request's error: its images' problems name the part they came from ("image N: ..."
 * names the request's N-th image); a context too small, the prompt. */
static void request_error(struct job *j, pshard_status st, const char *why) {
    const struct api_request *q = &j->req;
    const char *prompt = q->kind == API_CHAT ? "messages" : "prompt";
    int image = 0, end = 0;
    if (sscanf(why, "image %d:%n", &image, &end) == 1 && end > 0 && image >= 1 && (size_t)image <= q->n_images &&
        st != PSHARD_ERR_NOMEM && st != PSHARD_ERR_INTERNAL)
        api_fail(&j->error, 400, "invalid_request_error", NULL, q->images[image - 1].param, "%s", why);
    else if (st == PSHARD_ERR_BUSY)
        api_fail(&j->error, 503, "server_error", "queue_full", NULL, "%s", why);
    else if (st == PSHARD_ERR_RANGE)
        api_fail(&j->error, 400, "invalid_request_error", "context_length_exceeded", prompt, "%s", why);
    else if (st == PSHARD_ERR_INVALID_ARG)
        api_fail(&j->error, 400, "invalid_request_error", NULL, prompt, "%s", why);
    else
        api_fail(&j->error, 500, "server_error", NULL, NULL, "%s", why);
}

int worker_prepare_images(struct worker *w, struct job *j, struct api_error *err) {
    const struct api_request *q = &j->req;
    if (!q->n_images) return 0;
    worker_lock(w);
    const pshard_image_preparer *preparer = w->preparer; /* (set once, before the model is ready) */
    while (preparer && (w->n_preparing >= PREPARE_AT_ONCE || w->prepared_bytes >= PREPARED_HELD_MAX))
        pthread_cond_wait(&w->prepare_turn, &w->lock);
    if (preparer) w->n_preparing++;
    worker_unlock(w);
    if (!preparer) return 0;
    pshard_status st = (j->prepared = calloc(q->n_images, sizeof *j->prepared)) ? PSHARD_OK : PSHARD_ERR_NOMEM;
    size_t bytes = 0;
    for (size_t i = 0; st == PSHARD_OK && i < q->n_images; i++) {
        const pshard_image image = {.data = q->images[i].data, .size = q->images[i].size};
        st = pshard_image_prepare(preparer, &image, (int32_t)i, &j->prepared[i]);
        bytes += pshard_prepared_image_bytes(j->prepared[i]); /* (0 for one not made) */
    }
    if (st != PSHARD_OK) {
        request_error(j, st, st == PSHARD_ERR_NOMEM && !j->prepared ? "out of memory" : pshard_last_error());
        *err = j->error;
        free_prepared(j);
        bytes = 0;
    }
    worker_lock(w);
    w->n_preparing--;
    w->prepared_bytes += bytes;
    j->prepared_bytes = bytes;
    pthread_cond_signal(&w->prepare_turn);
    worker_unlock(w);
    return st == PSHARD_OK ? 0 : -1;
}

/* A job from the inbox becomes a pshard request: its prompt formatted, its options mapped. */
static void start_job(struct worker *w, struct job *j) {
    const struct api_request *q = &j->req;
    char *formatted = NULL;
    pshard_status st = PSHARD_OK;
    if (q->kind == API_CHAT) {
        pshard_message *msgs = calloc(q->n_messages, sizeof *msgs);
        for (size_t i = 0; msgs && i < q->n_messages; i++) msgs[i] = (pshard_message){q->messages[i].role, q->messages[i].content};
        st = msgs ? pshard_format_chat(w->ctx, msgs, q->n_messages, 0, &formatted) : PSHARD_ERR_NOMEM;
        free(msgs);
    }
    pshard_image *images = calloc(q->n_images ? q->n_images : 1, sizeof *images);
    if (!images && st == PSHARD_OK) st = PSHARD_ERR_NOMEM;
    for (size_t i = 0; images && i < q->n_images; i++) /* (decoded already where prepared: only encoded here) */
        images[i] = (pshard_image){.data = q->images[i].data, .size = q->images[i].size,
                                   .prepared = j->prepared ? j->prepared[i] : NULL};
    pshard_request r;
    pshard_request_default(&r);
    r.prompt = q->kind == API_CHAT ? formatted : q->prompt;
    r.prompt_tokens = q->prompt_tokens, r.n_prompt_tokens = q->n_prompt_tokens;
    r.images = images, r.n_images = (int32_t)q->n_images;
    r.n_predict = q->max_tokens;
    if (q->max_tokens < 0) r.n_predict_for = predict_for; /* sized by the prompt's tokens */
    r.sampling = w->cfg.sampling;
    pshard_sampling *s = &r.sampling;
    if (q->has_temperature) s->temperature = q->temperature;
    if (q->has_top_p) s->top_p = q->top_p > 0 ? q->top_p : 1, s->top_k = q->top_p > 0 ? s->top_k : 1;
    if (q->has_top_k) s->top_k = q->top_k;
    if (q->has_min_p) s->min_p = q->min_p;
    if (q->has_presence) s->presence_penalty = q->presence_penalty;
    if (q->has_frequency) s->frequency_penalty = q->frequency_penalty;
    if (q->has_repeat) s->repeat_penalty = q->repeat_penalty;
    /* No seed: one of its own, so replies vary as they do elsewhere. */
    s->seed = q->has_seed ? q->seed : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + ++w->seed_counter * 0xbf58476d1ce4e5b9ull;
    r.stop = (const char *const *)q->stop, r.n_stop = q->n_stop;
    r.top_logprobs = q->top_logprobs;
    r.ignore_eos = q->ignore_eos;
    r.on_event = on_event, r.user = j;
    int32_t id = -1;
    if (st == PSHARD_OK) st = pshard_request_add(w->ctx, &r, &id); /* (it encodes the images) */
    free(formatted);
    free(images);
    free_prepared(j); /* encoded, or refused: their pixels are needed no more */
    worker_lock(w);
    uncount_prepared(w, j);
    if (st == PSHARD_OK) {
        j->id = id;
        j->state = JOB_RUNNING;
        j->next = w->running;
        w->running = j;
    } else {
        request_error(j, st, pshard_last_error());
        j->state = JOB_FAILED;
        w->snap.requests_failed++;
        w->n_jobs--;
        job_unref(w, j);
    }
    worker_unlock(w);
}

/* What /metrics and /props read: the scheduler's state after every step, the model's and the
 * plan's facts (which walk the model's tensors) at most twice a second. */
static void take_snapshot(struct worker *w, bool full) {
    pshard_batch_info batch;
    pshard_info info;
    pshard_get_batch_info(w->ctx, &batch);
    if (full) pshard_get_info(w->ctx, &info);
    worker_lock(w);
    w->snap.batch = batch;
    if (full) {
        snprintf(w->snap.arch, sizeof w->snap.arch, "%s", info.arch ? info.arch : "");
        snprintf(w->snap.chat_format, sizeof w->snap.chat_format, "%s", info.chat_format ? info.chat_format : "");
        info.arch = w->snap.arch, info.chat_format = w->snap.chat_format;
        w->snap.info = info;
    }
    worker_unlock(w);
}

/* Under the lock: whether the engine should stop now, cancelling what still runs when the
 * drain's time is up. */
static bool drained(struct worker *w, int32_t pending) {
    if (w->state != WORKER_STOPPING) return false;
    if (w->stop_now || now_s() >= w->drain_deadline)
        for (struct job *j = w->running; j; j = j->next) j->cancel = true, w->cancel_flagged = true;
    return pending == 0 && !w->inbox;
}

int worker_set_budget(struct worker *w, const char *text, struct api_error *err) {
    worker_lock(w);
    while (w->budget_busy && w->state == WORKER_READY) worker_wait(w, 100);
    bool done = false;
    int rc = -1;
    if (w->state == WORKER_READY) {
        w->budget_busy = w->budget_asked = true, w->budget_done = false;
        snprintf(w->budget_text, sizeof w->budget_text, "%s", text);
        pthread_cond_signal(&w->wake);
        while (!w->budget_done && (w->state == WORKER_READY || w->state == WORKER_STOPPING)) worker_wait(w, 100);
        done = w->budget_done;
        if (done) rc = w->budget_rc, *err = w->budget_err;
        w->budget_busy = w->budget_asked = false;
        pthread_cond_broadcast(&w->progress);
    }
    worker_unlock(w);
    if (!done) api_fail(err, 503, "server_error", NULL, NULL, "the model is loading or the server is stopping");
    return rc;
}

/* On the engine thread, between steps: the budget asked over HTTP, then what /props and /metrics
 * read of it; and while idle, the check of a budget that follows free memory. */
static void budget_step(struct worker *w, bool asked, const char *text) {
    struct api_error err = {0};
    const int rc = asked ? budget_apply(w->ctx, text, &err) : 0;
    if (!asked && pshard_budget_poll(w->ctx) != PSHARD_OK)
        fprintf(stderr, "pshard serve: following free VRAM: %s\n", pshard_last_error());
    take_snapshot(w, true);
    if (!asked) return;
    worker_lock(w);
    w->budget_rc = rc, w->budget_err = err, w->budget_done = true;
    pthread_cond_broadcast(&w->progress);
    worker_unlock(w);
}

static void *engine_main(void *arg) {
    struct worker *w = arg;
    pshard_ctx *ctx = w->cfg.open(w->cfg.open_user);
    pshard_image_preparer *preparer = NULL;
    if (ctx && w->cfg.vision && pshard_image_preparer_create(ctx, &preparer) != PSHARD_OK) {
        fprintf(stderr, "pshard serve: %s\n", pshard_last_error());
        pshard_close(ctx);
        ctx = NULL;
    }
    worker_lock(w);
    w->ctx = ctx;
    w->preparer = preparer;
    w->state = ctx ? (w->state == WORKER_STOPPING ? WORKER_STOPPING : WORKER_READY) : WORKER_FAILED;
    worker_unlock(w);
    if (!ctx) return NULL;
    take_snapshot(w, true);
    double last_full = now_s();
    int32_t pending = 0, ids[256];
    for (;;) {
        worker_lock(w);
        while (pending == 0 && !w->inbox && !w->cancel_flagged && !w->budget_asked && w->state != WORKER_STOPPING) {
            pthread_cond_broadcast(&w->progress);
            struct timespec ts; /* (idle: a budget that follows free memory is checked now and then) */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += BUDGET_IDLE_POLL_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            if (pthread_cond_timedwait(&w->wake, &w->lock, &ts) == ETIMEDOUT) {
                worker_unlock(w);
                budget_step(w, false, NULL);
                worker_lock(w);
            }
        }
        if (drained(w, pending)) {
            worker_unlock(w);
            break;
        }
        char budget_text[sizeof w->budget_text];
        const bool budget_asked = w->budget_asked && !w->budget_done;
        if (budget_asked) memcpy(budget_text, w->budget_text, sizeof budget_text), w->budget_asked = false;
        struct job *inbox = w->inbox;
        w->inbox = NULL;
        int n_cancel = 0;
        w->cancel_flagged = false;
        for (struct job *j = w->running; j; j = j->next)
            if (j->cancel && !j->cancel_sent) {
                if (n_cancel == (int)(sizeof ids / sizeof ids[0])) {
                    w->cancel_flagged = true; /* the rest next time round */
                    break;
                }
                j->cancel_sent = true;
                ids[n_cancel++] = j->id;
            }
        worker_unlock(w);
        for (struct job *j = inbox, *next; j; j = next) {
            next = j->next;
            j->next = NULL;
            worker_lock(w);
            const bool cancelled = j->cancel || w->stop_now;
            if (cancelled) {
                j->state = JOB_DONE, j->finish = PSHARD_FINISH_CANCELLED;
                w->snap.requests_cancelled++;
                w->n_jobs--;
                job_unref(w, j);
            }
            worker_unlock(w);
            if (!cancelled) start_job(w, j);
        }
        for (int i = 0; i < n_cancel; i++) pshard_request_cancel(ctx, ids[i]); /* one that ended meanwhile: fails, harmless */
        if (budget_asked) budget_step(w, true, budget_text);
        if (pshard_step(ctx, &pending) != PSHARD_OK) fprintf(stderr, "pshard serve: a step failed: %s\n", pshard_last_error());
        const bool full = now_s() - last_full >= 0.5;
        take_snapshot(w, full);
        if (full) last_full = now_s();
        worker_lock(w);
        w->snap.steps++;
        pthread_cond_broadcast(&w->progress);
        if (pending > 0 && w->snap.batch.last_step_tokens == 0) { /* requests wait, none could run: no spinning */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 5000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&w->wake, &w->lock, &ts);
        }
        worker_unlock(w);
    }
    pshard_close(ctx);
    worker_lock(w);
    w->ctx = NULL;
    w->state = WORKER_STOPPED;
    pthread_cond_broadcast(&w->progress);
    worker_unlock(w);
    return NULL;
}

int worker_start(const struct worker_config *cfg, struct worker **out) {
    struct worker *w = calloc(1, sizeof *w);
    if (!w) return -1;
    w->cfg = *cfg;
    w->state = WORKER_LOADING;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    pthread_cond_init(&w->progress, NULL);
    pthread_cond_init(&w->prepare_turn, NULL);
    if (pthread_create(&w->thread, NULL, engine_main, w) != 0) {
        fprintf(stderr, "pshard serve: cannot start the engine thread\n");
        free(w);
        return -1;
    }
    *out = w;
    return 0;
}

void worker_stop(struct worker *w) {
    worker_lock(w);
    if (w->state == WORKER_STOPPING) w->stop_now = true;
    if (w->state == WORKER_READY || w->state == WORKER_LOADING) {
        w->state = WORKER_STOPPING;
        w->drain_deadline = now_s() + w->cfg.drain_s;
    }
    pthread_cond_signal(&w->wake);
    pthread_cond_broadcast(&w->progress);
    worker_unlock(w);
}

void worker_free(struct worker *w) {
    if (!w) return;
    pthread_join(w->thread, NULL);
    pshard_image_preparer_free(w->preparer);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->prepare_turn);
    pthread_cond_destroy(&w->wake);
    pthread_cond_destroy(&w->progress);
    free(w);
}

enum worker_state worker_state(struct worker *w) {
    worker_lock(w);
    const enum worker_state s = w->state;
    worker_unlock(w);
    return s;
}

void worker_snapshot(struct worker *w, struct worker_snapshot *out) {
    worker_lock(w);
    *out = w->snap;
    out->info.arch = out->arch, out->info.chat_format = out->chat_format;
    out->state = w->state;
    out->n_jobs = w->n_jobs;
    out->prepared_bytes = w->prepared_bytes;
    const int64_t sec = (int64_t)now_s();
    uint64_t n = 0;
    for (int i = 0; i < RATE_WINDOW_S; i++)
        if (w->rate_second[i] > sec - RATE_WINDOW_S && w->rate_second[i] < sec) n += w->rate_tokens[i];
    out->tokens_per_s = (double)n / (RATE_WINDOW_S - 1);
    worker_unlock(w);
}
