/* Many sequences at once: a queue of requests, sequences (the executor's slots) that take them,
 * and the step that carries every active request's new tokens together — one decode token of
 * each request that is generating, then prompt chunks of those still reading their prompt, up to
 * the step's token limit. Requests join and leave between any two steps (continuous batching).
 * A sequence that finishes keeps the tokens of its cells, so a later request that starts with
 * them (a system prompt) reuses them instead of computing them again. A request with images
 * carries its own image runs and rope positions (vision.c); a step holds at most one image's run,
 * as the executor takes one run of input embeddings a step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/grow.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "engine/engine_internal.h"
#include "engine/vision.h"

enum { TOP_LOGPROBS_MAX = 20 };

struct engine_request {
    int32_t id;
    int32_t *tokens;           /* the prompt (image tokens as their image's key), then what was generated */
    struct engine_images images; /* the prompt's images and rope positions */
    int32_t n_prompt, n_tokens, cap;
    int32_t n_computed;        /* tokens whose K/V are in the sequence's cells */
    int32_t max_cells;         /* the cells it may hold (the pool promised them when it was admitted) */
    int32_t n_predict, n_generated;
    int32_t slot;              /* the sequence it runs in; -1 while queued */
    struct sampler_params sampling;
    struct sampler *sampler;
    struct tok_decoder *decoder;
    char **stop;
    size_t n_stop;
    char *held;                /* text not yet given out: it may be the start of a stop string */
    size_t n_held, held_cap;
    bool ignore_eos;
    int32_t top_logprobs;      /* < 0: no log-probabilities */
    pshard_event_cb on_event;
    void *user;
    double t_add, t_admit, t_first;
    int32_t n_cached;
    struct engine_request *next; /* the queue */
};

struct engine_batch {
    int32_t n_parallel, max_queue, n_queued, next_id;
    struct engine_request **active;   /* per sequence: the request it runs, or NULL */
    int32_t **history;                /* per sequence: the tokens its cells hold (sequence 0: ctx->cached) */
    int32_t *history_len;
    struct engine_request *queue_head, *queue_tail;
    /* the step's scratch, n_batch long */
    int32_t *tokens, *pos, *seq;
    int8_t *logits;
    struct engine_request **out_req;
    struct engine_request **sample_req; /* per output of the step: its request, and the token drawn */
    int32_t *sampled;
    int32_t *rope;            /* [3][n_batch]: the step's rope positions, where a request has images */
    struct exec_media media;  /* what the step carries beyond its ids */
    int32_t last_tokens;
    enum plan_family last_family;
    int32_t top_tokens[TOP_LOGPROBS_MAX];
    float top_logprobs[TOP_LOGPROBS_MAX];
};

const char *pshard_finish_name(pshard_finish_reason finish) {
    switch (finish) {
    case PSHARD_FINISH_STOP: return "stop";
    case PSHARD_FINISH_LENGTH: return "length";
    case PSHARD_FINISH_CANCELLED: return "cancelled";
    case PSHARD_FINISH_ERROR: return "error";
    case PSHARD_FINISH_NONE: break;
    }
    return "";
}

void pshard_request_default(pshard_request *req) {
    memset(req, 0, sizeof *req);
    req->n_predict = 256;
    req->parse_special = 1;
    req->top_logprobs = -1;
    pshard_sampling_default(&req->sampling);
}

pshard_status engine_batch_create(pshard_ctx *ctx) {
    struct engine_batch *b = calloc(1, sizeof *b);
    if (!b) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    ctx->batch = b;
    b->n_parallel = ctx->params.n_parallel;
    b->max_queue = ctx->params.max_queue;
    const size_t n_batch = (size_t)ctx->params.n_batch, n_seq = (size_t)b->n_parallel;
    b->active = calloc(n_seq, sizeof *b->active);
    b->history = calloc(n_seq, sizeof *b->history);
    b->history_len = calloc(n_seq, sizeof *b->history_len);
    b->tokens = malloc(sizeof(int32_t) * n_batch);
    b->pos = malloc(sizeof(int32_t) * n_batch);
    b->seq = malloc(sizeof(int32_t) * n_batch);
    b->logits = malloc(n_batch);
    b->out_req = malloc(sizeof *b->out_req * n_batch);
    b->rope = malloc(sizeof(int32_t) * 3 * n_batch);
    b->sample_req = malloc(sizeof *b->sample_req * n_batch);
    b->sampled = malloc(sizeof(int32_t) * n_batch);
    if (!b->active || !b->history || !b->history_len || !b->tokens || !b->pos || !b->seq || !b->logits || !b->out_req ||
        !b->rope || !b->sample_req || !b->sampled)
        return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    b->history[0] = ctx->cached; /* the one-sequence calls' cache is sequence 0's */
    for (size_t s = 1; s < n_seq; s++)
        if (!(b->history[s] = malloc(sizeof(int32_t) * (size_t)ctx->params.n_ctx)))
            return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    return PSHARD_OK;
}

static void request_free(struct engine_request *r) {
    if (!r) return;
    free(r->tokens);
    engine_images_release(&r->images);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->held);
    sampler_free(r->sampler);
    tok_decoder_free(r->decoder);
    free(r);
}

void engine_batch_free(pshard_ctx *ctx) {
    struct engine_batch *b = ctx->batch;
    if (!b) return;
    for (int32_t s = 0; b->active && s < b->n_parallel; s++) request_free(b->active[s]);
    for (struct engine_request *r = b->queue_head, *next; r; r = next) next = r->next, request_free(r);
    for (int32_t s = 1; b->history && s < b->n_parallel; s++) free(b->history[s]);
    free(b->history);
    free(b->history_len);
    free(b->active);
    free(b->tokens);
    free(b->pos);
    free(b->seq);
    free(b->logits);
    free(b->out_req);
    free(b->rope);
    free(b->sample_req);
    free(b->sampled);
    free(b);
    ctx->batch = NULL;
}

int32_t engine_batch_pending(const pshard_ctx *ctx) {
    const struct engine_batch *b = ctx->batch;
    int32_t n = b->n_queued;
    for (int32_t s = 0; s < b->n_parallel; s++) n += b->active[s] != NULL;
    return n;
}

/* The one-sequence calls keep their history in ctx->cached/n_cached: sequence 0's. */
static int32_t *history_len(pshard_ctx *ctx, int32_t s) { return s == 0 ? &ctx->n_cached : &ctx->batch->history_len[s]; }

const int32_t *engine_batch_held(const pshard_ctx *ctx, int32_t s, int32_t *n) {
    const struct engine_request *a = ctx->batch->active[s];
    *n = a ? a->n_computed : s == 0 ? ctx->n_cached : ctx->batch->history_len[s];
    return a ? a->tokens : ctx->batch->history[s];
}

/* ---- Adding requests. */

static pshard_status copy_stops(struct engine_request *r, const pshard_request *req) {
    if (!req->n_stop) return PSHARD_OK;
    if (!req->stop) return core_fail(PSHARD_ERR_INVALID_ARG, "n_stop is %zu but stop is NULL", req->n_stop);
    r->stop = calloc(req->n_stop, sizeof *r->stop);
    if (!r->stop) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < req->n_stop; i++) {
        if (!req->stop[i] || !*req->stop[i]) return core_fail(PSHARD_ERR_INVALID_ARG, "stop string %zu is empty", i);
        if (!(r->stop[r->n_stop++] = strdup(req->stop[i]))) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    }
    return PSHARD_OK;
}

/* The request's prompt tokens (and images, encoded now where the context does not keep them). */
static pshard_status request_tokens(pshard_ctx *ctx, const pshard_request *req, struct engine_request *r) {
    const int32_t n_ctx = ctx->params.n_ctx;
    int32_t n = 0;
    if (req->prompt) {
        pshard_gen_opts opts;
        pshard_gen_opts_default(&opts);
        opts.parse_special = req->parse_special;
        opts.images = req->images, opts.n_images = req->n_images;
        CORE_TRY(engine_vision_tokenize(ctx, req->prompt, &opts, &r->images, &n, NULL));
    } else if (req->n_images) {
        return core_fail(PSHARD_ERR_INVALID_ARG, "images go with a text prompt that places them (%s)", PSHARD_IMAGE_MARKER);
    } else {
        if (req->n_prompt_tokens < 0 || (req->n_prompt_tokens && !req->prompt_tokens))
            return core_fail(PSHARD_ERR_INVALID_ARG, "no prompt given");
        if (req->n_prompt_tokens >= n_ctx)
            return core_fail(PSHARD_ERR_RANGE, "the prompt has %d tokens but a sequence's context holds %d",
                             req->n_prompt_tokens, n_ctx);
        n = req->n_prompt_tokens;
        for (int32_t i = 0; i < n; i++)
            if (req->prompt_tokens[i] < 0 || req->prompt_tokens[i] >= exec_n_vocab(ctx->exec))
                return core_fail(PSHARD_ERR_INVALID_ARG, "prompt token %d is %d, outside the vocabulary (%d)", i,
                                 req->prompt_tokens[i], exec_n_vocab(ctx->exec));
    }
    if (n == 0) return core_fail(PSHARD_ERR_INVALID_ARG, "the prompt is empty");
    if (req->n_predict_for) r->n_predict = req->n_predict_for(req->user, n);
    const struct exec_params *ep = exec_get_params(ctx->exec);
    const int32_t pool = ep->n_cells > 0 ? ep->n_cells : ep->n_ctx * ep->n_seq;
    if (n >= pool)
        return core_fail(PSHARD_ERR_RANGE, "the prompt has %d tokens but the KV cache holds %d (raise -c)", n, pool);
    /* Room for the prompt and what it may generate, the last token sampled but never computed. */
    int64_t cap = r->n_predict < 0 ? (int64_t)n_ctx + 1 : (int64_t)n + r->n_predict + 1;
    if (cap > (int64_t)n_ctx + 1) cap = (int64_t)n_ctx + 1;
    r->tokens = malloc(sizeof(int32_t) * (size_t)cap);
    if (!r->tokens) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    memcpy(r->tokens, req->prompt ? ctx->prompt : req->prompt_tokens, sizeof(int32_t) * (size_t)n);
    r->cap = (int32_t)cap;
    r->n_prompt = r->n_tokens = n;
    return PSHARD_OK;
}

pshard_status pshard_request_add(pshard_ctx *ctx, const pshard_request *req, int32_t *id) {
    struct engine_batch *b = ctx->batch;
    if (!req || !id) return core_fail(PSHARD_ERR_INVALID_ARG, "no request given");
    if (!req->prompt && !req->prompt_tokens) return core_fail(PSHARD_ERR_INVALID_ARG, "no prompt given");
    if (b->n_queued >= b->max_queue)
        return core_fail(PSHARD_ERR_BUSY, "the queue is full (%d requests wait for a sequence)", b->n_queued);
    if (req->top_logprobs > TOP_LOGPROBS_MAX)
        return core_fail(PSHARD_ERR_RANGE, "top_logprobs is %d; at most %d", req->top_logprobs, TOP_LOGPROBS_MAX);
    const pshard_sampling *sp = &req->sampling;
    struct engine_request *r = calloc(1, sizeof *r);
    if (!r) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    r->sampling = (struct sampler_params){sp->temperature, sp->top_k, sp->top_p, sp->min_p, sp->repeat_penalty,
                                          sp->presence_penalty, sp->frequency_penalty, sp->penalty_last_n, sp->seed};
    r->n_predict = req->n_predict;
    r->ignore_eos = req->ignore_eos != 0;
    r->top_logprobs = req->top_logprobs;
    r->on_event = req->on_event, r->user = req->user;
    r->slot = -1;
    pshard_status st = copy_stops(r, req);
    if (st == PSHARD_OK) st = request_tokens(ctx, req, r); /* (images are encoded last) */
    if (st != PSHARD_OK) {
        request_free(r);
        return st;
    }
    r->id = b->next_id++;
    if (b->next_id < 0) b->next_id = 0;
    r->t_add = core_now_ms();
    if (b->queue_tail) b->queue_tail->next = r;
    else b->queue_head = r;
    b->queue_tail = r;
    b->n_queued++;
    *id = r->id;
    return PSHARD_OK;
}

/* ---- Events. */

/* Give out held text that cannot be the start of a stop string; with a stop string in it, what
 * precedes it, and say so. */
static bool release_text(struct engine_request *r, size_t *out_len) {
    size_t keep = 0;
    for (size_t i = 0; i < r->n_stop; i++) {
        const char *hit = NULL;
        const size_t n = strlen(r->stop[i]);
        for (size_t at = 0; !hit && at + n <= r->n_held; at++)
            if (!memcmp(r->held + at, r->stop[i], n)) hit = r->held + at;
        if (hit) {
            *out_len = (size_t)(hit - r->held);
            for (size_t j = i + 1; j < r->n_stop; j++) { /* an earlier match of another wins */
                const size_t m = strlen(r->stop[j]);
                for (size_t at = 0; at + m <= *out_len; at++)
                    if (!memcmp(r->held + at, r->stop[j], m)) *out_len = at;
            }
            return true;
        }
        /* The longest tail of the held text that begins this stop string. */
        for (size_t tail = n - 1 < r->n_held ? n - 1 : r->n_held; tail > keep; tail--)
            if (!memcmp(r->held + r->n_held - tail, r->stop[i], tail)) {
                keep = tail;
                break;
            }
    }
    *out_len = r->n_held - keep;
    return false;
}

static pshard_status hold(struct engine_request *r, const char *text, size_t len) {
    CORE_TRY(core_grow((void **)&r->held, &r->held_cap, r->n_held + len, 1));
    memcpy(r->held + r->n_held, text, len);
    r->n_held += len;
    return PSHARD_OK;
}

static int emit(struct engine_request *r, int32_t token, size_t len, float logprob, pshard_finish_reason finish,
                const pshard_request_stats *stats, const char *error, struct engine_batch *b) {
    if (!r->on_event) return 0;
    pshard_token_event ev = {r->id, token, r->held, len, logprob, finish, stats, error, 0, NULL, NULL};
    if (token >= 0 && r->top_logprobs > 0) ev.n_top = r->top_logprobs, ev.top_tokens = b->top_tokens, ev.top_logprobs = b->top_logprobs;
    const int stop = r->on_event(r->user, &ev);
    if (len < r->n_held) memmove(r->held, r->held + len, r->n_held - len);
    r->n_held -= len;
    return stop;
}

/* The request's sequence keeps the tokens of its cells for later requests; its last event. */
static void finish(pshard_ctx *ctx, struct engine_request *r, pshard_finish_reason why, const char *error, bool stopped) {
    struct engine_batch *b = ctx->batch;
    const double now = core_now_ms();
    pshard_request_stats stats = {r->n_prompt, r->n_cached, r->n_generated, r->slot >= 0 ? r->t_admit - r->t_add : now - r->t_add,
                                  r->t_first > 0 ? r->t_first - r->t_add : 0, now - r->t_add};
    /* What the decoder still holds where the model ended its reply (end of text): bytes of a
     * character it left unfinished. A limit or a cancel leaves a cut character out, never half of it. */
    if (!stopped && why == PSHARD_FINISH_STOP) {
        const char *text;
        size_t len;
        if (tok_decoder_flush(r->decoder, &text, &len) == PSHARD_OK && len) hold(r, text, len);
    }
    size_t len = r->n_held;
    if (r->n_stop && release_text(r, &len)) why = PSHARD_FINISH_STOP;
    if (why == PSHARD_FINISH_ERROR) len = 0;
    emit(r, -1, len, NAN, why, &stats, error, b);
    if (r->slot >= 0) {
        const int32_t s = r->slot;
        memcpy(b->history[s], r->tokens, sizeof(int32_t) * (size_t)r->n_computed);
        *history_len(ctx, s) = r->n_computed;
        exec_truncate_seq(ctx->exec, s, r->n_computed);
        b->active[s] = NULL;
    }
    request_free(r);
}

pshard_status pshard_request_cancel(pshard_ctx *ctx, int32_t id) {
    struct engine_batch *b = ctx->batch;
    for (int32_t s = 0; s < b->n_parallel; s++)
        if (b->active[s] && b->active[s]->id == id) {
            finish(ctx, b->active[s], PSHARD_FINISH_CANCELLED, NULL, false);
            return PSHARD_OK;
        }
    for (struct engine_request **p = &b->queue_head; *p; p = &(*p)->next)
        if ((*p)->id == id) {
            struct engine_request *r = *p;
            *p = r->next;
            if (b->queue_tail == r) {
                b->queue_tail = NULL;
                for (struct engine_request *q = b->queue_head; q; q = q->next) b->queue_tail = q;
            }
            b->n_queued--;
            finish(ctx, r, PSHARD_FINISH_CANCELLED, NULL, false);
            return PSHARD_OK;
        }
    return core_fail(PSHARD_ERR_NOT_FOUND, "request %d is not queued or running", id);
}

/* ---- The step. */

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

static int32_t round_up(int32_t cells, int32_t block) { return (cells + block - 1) / block * block; }

/* The cells a request holds at its longest: its prompt and every token it may generate. */
static int32_t final_cells(const pshard_ctx *ctx, const struct engine_request *r) {
    const int32_t n_ctx = ctx->params.n_ctx;
    const struct exec_params *ep = exec_get_params(ctx->exec);
    const int32_t pool = ep->n_cells > 0 ? ep->n_cells : n_ctx * ep->n_seq;
    int64_t n = r->n_predict < 0 ? n_ctx : (int64_t)r->n_prompt + r->n_predict;
    n = n < n_ctx ? n : n_ctx;
    return n < pool ? (int32_t)n : pool; /* a request longer than the pool ends where it is full */
}

/* Cells of the pool neither held nor promised: the active requests will grow to their longest. */
static int32_t unpromised_cells(const pshard_ctx *ctx) {
    const struct engine_batch *b = ctx->batch;
    const int32_t block = exec_block_cells(ctx->exec);
    int64_t free_cells = exec_free_cells(ctx->exec);
    for (int32_t s = 0; s < b->n_parallel; s++)
        if (b->active[s])
            free_cells -= round_up(final_cells(ctx, b->active[s]), block) - round_up(exec_seq_len(ctx->exec, s), block);
    return free_cells > 0 ? (int32_t)free_cells : 0;
}

/* Give the oldest queued request a free sequence, if the pool can hold it to its end: the free
 * sequence whose cells share the longest prefix with its prompt, or, where another sequence's
 * cells share a longer one, a prefix shared with that sequence's blocks. At least its last
 * prompt token runs, for logits. Finished requests' cells are given back, least reusable first,
 * when the pool lacks room. Returns false when nothing more can be admitted now. */
static bool admit_one(pshard_ctx *ctx) {
    struct engine_batch *b = ctx->batch;
    struct engine_request *r = b->queue_head;
    if (!r) return false;
    int32_t slot = -1, keep = -1, source = -1, shared = 0;
    for (int32_t s = 0; s < b->n_parallel; s++) {
        int32_t n;
        const int32_t *held = engine_batch_held(ctx, s, &n);
        const int32_t common = common_prefix(held, n, r->tokens, r->n_prompt - 1);
        if (!b->active[s] && common > keep) slot = s, keep = common;
        if (common > shared) source = s, shared = common;
    }
    if (slot < 0) return false;
    const int32_t block = exec_block_cells(ctx->exec);
    if (shared < keep + block || source == slot) source = -1, shared = keep; /* not worth a share */
    /* Room to its end, beyond the cells it starts with: give back finished requests' cells, those
     * that share least with this prompt first. */
    const int32_t need = round_up(final_cells(ctx, r), block) - (source >= 0 ? shared / block * block : round_up(keep, block));
    while (unpromised_cells(ctx) < need) {
        int32_t victim = -1, victim_keep = INT32_MAX;
        for (int32_t s = 0; s < b->n_parallel; s++) {
            if (b->active[s] || s == source || !*history_len(ctx, s)) continue;
            const int32_t k = s == slot ? keep : 0;
            if (k < victim_keep) victim = s, victim_keep = k;
        }
        if (victim < 0) return false; /* wait for running requests to end */
        exec_truncate_seq(ctx->exec, victim, 0);
        *history_len(ctx, victim) = 0;
        if (victim == slot) keep = 0;
    }
    b->queue_head = r->next;
    if (!b->queue_head) b->queue_tail = NULL;
    b->n_queued--;
    r->next = NULL;
    r->slot = slot;
    b->active[slot] = r;
    r->t_admit = core_now_ms();
    pshard_status st = PSHARD_OK;
    if (source >= 0) {
        exec_truncate_seq(ctx->exec, slot, 0);
        st = exec_share_prefix(ctx->exec, slot, source, shared);
        keep = st == PSHARD_OK ? shared : 0;
    } else {
        exec_truncate_seq(ctx->exec, slot, keep);
    }
    *history_len(ctx, slot) = 0;
    r->n_computed = r->n_cached = keep;
    r->max_cells = final_cells(ctx, r);
    if (st == PSHARD_OK) st = sampler_create(&r->sampling, exec_n_vocab(ctx->exec), &r->sampler);
    if (st == PSHARD_OK) st = tok_decoder_create(ctx->tok, 0, &r->decoder);
    if (st != PSHARD_OK) {
        finish(ctx, r, PSHARD_FINISH_ERROR, pshard_last_error(), false);
        return true;
    }
    for (int32_t i = 0; i < r->n_prompt; i++) sampler_accept(r->sampler, r->tokens[i]);
    return true;
}

static void admit(pshard_ctx *ctx) {
    while (admit_one(ctx)) {}
}

/* The step's outputs sampled on the executor's threads, a share of them each: a request has at
 * most one output a step and its own sampler, so the draws touch nothing in common. */
struct sample_job {
    struct engine_batch *b;
    struct exec_ctx *exec;
    int32_t n;
};

static void sample_part(void *arg, int thread, int n_threads) {
    const struct sample_job *job = arg;
    int64_t begin, end;
    threadpool_range(job->n, 1, thread, n_threads, &begin, &end);
    for (int64_t j = begin; j < end; j++) {
        const struct engine_request *r = job->b->sample_req[j];
        job->b->sampled[j] = r->n_predict == 0 ? -1 : sampler_sample(r->sampler, exec_logits(job->exec, (int32_t)j));
    }
}

/* A token sampled for a request: give it out, and end the request where it should end. */
static void take_token(pshard_ctx *ctx, struct engine_request *r, const float *logits, int32_t token) {
    struct engine_batch *b = ctx->batch;
    if (r->n_predict == 0) { /* the prompt only: nothing is sampled */
        finish(ctx, r, PSHARD_FINISH_LENGTH, NULL, false);
        return;
    }
    if (r->n_generated == 0) r->t_first = core_now_ms();
    if (!r->ignore_eos && engine_is_end_of_turn(ctx->tok, token)) {
        finish(ctx, r, PSHARD_FINISH_STOP, NULL, false);
        return;
    }
    const float logprob = r->top_logprobs >= 0
                              ? sampler_logprobs(r->sampler, logits, token, r->top_logprobs, b->top_tokens, b->top_logprobs)
                              : NAN;
    sampler_accept(r->sampler, token);
    r->tokens[r->n_tokens++] = token;
    r->n_generated++;
    const char *text;
    size_t len;
    pshard_status st = tok_decoder_push(r->decoder, token, &text, &len);
    if (st == PSHARD_OK && len) st = hold(r, text, len);
    if (st != PSHARD_OK) {
        finish(ctx, r, PSHARD_FINISH_ERROR, pshard_last_error(), false);
        return;
    }
    size_t out = r->n_held;
    const bool stopped = r->n_stop && release_text(r, &out);
    if (emit(r, token, out, logprob, PSHARD_FINISH_NONE, NULL, NULL, b)) finish(ctx, r, PSHARD_FINISH_CANCELLED, NULL, false);
    else if (stopped) {
        r->n_held = 0; /* the stop string and what follows it are not given out */
        finish(ctx, r, PSHARD_FINISH_STOP, NULL, true);
    } else if ((r->n_predict >= 0 && r->n_generated >= r->n_predict) || r->n_tokens - 1 >= r->max_cells ||
               r->n_tokens >= r->cap)
        finish(ctx, r, PSHARD_FINISH_LENGTH, NULL, false);
}

/* Token n of the step: its id (an image token's as <|image_pad|>), place, and rope positions. */
static void put_token(pshard_ctx *ctx, struct engine_request *r, int32_t p, int32_t n, bool logits) {
    struct engine_batch *b = ctx->batch;
    const int32_t limit = ctx->params.n_batch;
    b->tokens[n] = engine_vision_token(ctx, r->tokens[p]), b->pos[n] = p, b->seq[n] = r->slot, b->logits[n] = logits;
    b->out_req[n] = r;
    int32_t rope[3];
    engine_images_rope(&r->images, p, rope);
    for (int a = 0; a < 3; a++) b->rope[a * limit + n] = rope[a];
}

/* One decode token of each generating request, then prompt chunks in the order they came; the
 * first image a chunk reaches ends the step's prompt chunks after it (one image's run a step). */
static int32_t gather(pshard_ctx *ctx) {
    struct engine_batch *b = ctx->batch;
    const int32_t limit = ctx->params.n_batch;
    int32_t n = 0;
    bool images = false; /* some token's rope positions are not its cell's */
    b->media = (struct exec_media){NULL, NULL, 0, 0};
    for (int32_t s = 0; s < b->n_parallel && n < limit; s++) {
        struct engine_request *r = b->active[s];
        if (!r || r->n_computed < r->n_prompt) continue;
        put_token(ctx, r, r->n_computed, n++, true);
        images |= r->images.n_runs > 0;
    }
    /* Prompts in admission order: the one admitted first (the lowest t_admit) first. */
    for (;;) {
        struct engine_request *next = NULL;
        for (int32_t s = 0; s < b->n_parallel; s++) {
            struct engine_request *r = b->active[s];
            if (r && r->n_computed < r->n_prompt && (!next || r->t_admit < next->t_admit)) next = r;
        }
        if (!next || n >= limit) break;
        int32_t take = next->n_prompt - next->n_computed < limit - n ? next->n_prompt - next->n_computed : limit - n;
        struct exec_media piece;
        take = engine_images_piece(ctx, &next->images, next->n_computed, take, !b->media.embd, &piece);
        if (piece.embd) b->media.embd = piece.embd, b->media.embd_first = n + piece.embd_first, b->media.embd_count = piece.embd_count;
        for (int32_t i = 0; i < take; i++) {
            const int32_t p = next->n_computed + i;
            put_token(ctx, next, p, n++, p == next->n_prompt - 1);
        }
        images |= next->images.n_runs > 0;
        next->n_computed += take; /* taken back below if the step fails */
        if (next->n_computed < next->n_prompt) break;
    }
    if (images) { /* [3][n]: the rows side by side */
        memmove(b->rope + n, b->rope + limit, sizeof(int32_t) * (size_t)n);
        memmove(b->rope + 2 * n, b->rope + 2 * limit, sizeof(int32_t) * (size_t)n);
        b->media.rope_pos = b->rope;
    }
    return n;
}

pshard_status pshard_step(pshard_ctx *ctx, int32_t *n_pending) {
    struct engine_batch *b = ctx->batch;
    if (n_pending) *n_pending = 0;
    admit(ctx);
    const int32_t n = gather(ctx);
    b->last_tokens = n;
    if (n == 0) {
        if (n_pending) *n_pending = engine_batch_pending(ctx);
        return PSHARD_OK;
    }
    const struct exec_batch batch = {n, b->tokens, b->pos, b->seq, b->logits};
    engine_budget_step(ctx);
    const bool media = b->media.rope_pos || b->media.embd;
    const pshard_status st = exec_step_media(ctx->exec, &batch, media ? &b->media : NULL);
    int32_t max_pos = 0;
    for (int32_t i = 0; i < n; i++) max_pos = b->pos[i] + 1 > max_pos ? b->pos[i] + 1 : max_pos;
    b->last_family = plan_step_tier(exec_get_plan(ctx->exec), n, max_pos)->family;
    if (st != PSHARD_OK) { /* the step changed nothing: end its requests, say why */
        char why[512];
        snprintf(why, sizeof why, "%s", pshard_last_error());
        for (int32_t i = 0; i < n; i++) {
            struct engine_request *r = b->out_req[i];
            if (r && b->active[r->slot] == r) {
                for (int32_t j = i + 1; j < n; j++) if (b->out_req[j] == r) b->out_req[j] = NULL;
                r->n_computed = b->pos[i];
                finish(ctx, r, PSHARD_FINISH_ERROR, why, false);
            }
        }
        return core_fail(st, "%s", why);
    }
    struct sample_job job = {b, ctx->exec, 0};
    for (int32_t i = 0; i < n; i++)
        if (b->logits[i]) b->sample_req[job.n++] = b->out_req[i];
    if (job.n > 1) threadpool_run(exec_threads(ctx->exec), sample_part, &job);
    else sample_part(&job, 0, 1);
    int32_t out = 0;
    for (int32_t i = 0; i < n; i++) {
        struct engine_request *r = b->out_req[i];
        if (b->pos[i] >= r->n_prompt) r->n_computed = b->pos[i] + 1; /* a decode token */
        if (!b->logits[i]) continue;
        take_token(ctx, r, exec_logits(ctx->exec, out), b->sampled[out]); /* may end r: it is not read after */
        out++;
    }
    if (n_pending) *n_pending = engine_batch_pending(ctx);
    return PSHARD_OK;
}

void pshard_get_batch_info(const pshard_ctx *ctx, pshard_batch_info *info) {
    const struct engine_batch *b = ctx->batch;
    memset(info, 0, sizeof *info);
    info->n_parallel = b->n_parallel;
    info->n_queued = b->n_queued;
    for (int32_t s = 0; s < b->n_parallel; s++) info->n_active += b->active[s] != NULL;
    const struct exec_params *p = exec_get_params(ctx->exec);
    info->n_cells = p->n_cells > 0 ? p->n_cells : p->n_ctx * p->n_seq;
    info->n_cells_free = exec_free_cells(ctx->exec);
    for (int32_t s = 0; s < b->n_parallel; s++)
        if (!b->active[s]) info->n_cells_free += round_up(*history_len((pshard_ctx *)ctx, s), exec_block_cells(ctx->exec));
    info->last_step_tokens = b->last_tokens;
    snprintf(info->last_step_plan, sizeof info->last_step_plan, "%s", b->last_tokens ? plan_family_name(b->last_family) : "");
}
