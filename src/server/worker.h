/* The engine thread: the one thread that owns the pshard context (the API is not thread-safe).
 * It opens the model, then loops: takes new jobs and cancellations from a mutex-protected inbox,
 * runs pshard_step while anything is pending, and appends each request's events to its job, which
 * the HTTP threads read under the same lock and wait on (worker_wait). */
#ifndef SERVER_WORKER_H
#define SERVER_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"
#include "pshard_server.h" /* struct worker_config */
#include "server/api.h"

struct worker;

enum worker_state { WORKER_LOADING, WORKER_READY, WORKER_FAILED, WORKER_STOPPING, WORKER_STOPPED };

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_FAILED };

/* One generated token as the job keeps it: the text given out up to and with it, and, with
 * log-probabilities asked for, its piece and the most likely pieces (offsets into job.pieces and
 * job.tops). */
struct job_token {
    size_t text_end;
    float logprob;
    uint32_t piece_off, piece_len;
    uint32_t top_off;
    int32_t n_top;
};
struct job_top {
    float logprob;
    uint32_t piece_off, piece_len;
};

/* A request in flight. Every field below prepared is read and written under the worker's lock. */
struct job {
    struct api_request req;  /* set before worker_submit, then the engine thread's to read */
    pshard_prepared_image **prepared; /* req's images as the encoder's patches (worker_prepare_images), or
                                         NULL; the engine thread frees them once it has encoded them */
    size_t prepared_bytes;            /* what they hold, counted in the worker's (under its lock) */
    enum job_state state;
    int refs;
    bool cancel, cancel_sent;
    struct api_error error;  /* JOB_FAILED, or JOB_DONE with finish ERROR */
    char *text;              /* all text given out so far */
    size_t text_len, text_cap;
    struct job_token *tokens; /* with log-probabilities */
    size_t n_tokens, tokens_cap;
    struct job_top *tops;
    size_t n_tops, tops_cap;
    char *pieces;
    size_t pieces_len, pieces_cap;
    int32_t n_generated;
    bool alloc_failed;
    pshard_finish_reason finish;
    pshard_request_stats stats;
    int32_t id;
    struct worker *worker;   /* set by worker_submit */
    struct job *next;        /* the inbox, then the engine's list of running jobs */
};

/* What /metrics and /props report, copied out under the lock. */
struct worker_snapshot {
    enum worker_state state;
    uint64_t requests_done, requests_failed, requests_cancelled;
    uint64_t prompt_tokens, prompt_tokens_cached, generated_tokens, steps;
    double tokens_per_s; /* generated over the last 10 seconds */
    int32_t n_jobs;
    size_t prepared_bytes; /* images' patches prepared and waiting to be encoded */
    pshard_batch_info batch;
    pshard_info info;    /* its strings point into arch/chat_format below */
    char arch[32], chat_format[32];
};

/* Starts the engine thread (which loads the model). 0, or -1 with a message on stderr. */
int worker_start(const struct worker_config *cfg, struct worker **out);
/* Asks the engine to stop: running jobs get drain_s to finish, then are cancelled; a second
 * call cancels them now. */
void worker_stop(struct worker *w);
/* Waits for the engine thread to end (the model closed) and frees the worker. */
void worker_free(struct worker *w);

enum worker_state worker_state(struct worker *w);
void worker_snapshot(struct worker *w, struct worker_snapshot *out);

/* A new job (refs 1: the caller's); NULL when out of memory. */
struct job *job_new(void);
/* On the request's thread, before worker_submit: the request's images decoded and cut into the
 * encoder's patches, so that the engine thread, which every request's steps wait for, only encodes
 * them. At most a few requests' images at once (the others wait here). 0, or -1 with err:
 * a 400 naming the image's part for an image that cannot be read (as the engine would say it), 500
 * out of memory. Nothing to do, 0, for a request without images, or a server that reads none or
 * has not loaded its model yet (worker_submit answers those). */
int worker_prepare_images(struct worker *w, struct job *job, struct api_error *err);
/* Hands the job to the engine (it takes a reference). -1: refused, err says why (loading,
 * stopping, the queue full: 503). */
int worker_submit(struct worker *w, struct job *job, struct api_error *err);
/* Asks for the job to be cancelled (a client went away); the engine does it before its next step. */
void worker_cancel(struct worker *w, struct job *job);
void job_release(struct worker *w, struct job *job);

/* Asks the engine thread to change the VRAM budget to `text` (as --vram-budget takes it) between
 * steps, and waits for it. 0, or -1 with err (400 a refused budget, 409 a server on the CPU alone,
 * 503 loading or stopping). */
int worker_set_budget(struct worker *w, const char *text, struct api_error *err);
/* budget.c, on the engine thread: the budget applied to ctx; 0, or -1 with err as above. */
int budget_apply(pshard_ctx *ctx, const char *text, struct api_error *err);

/* The lock over every job, and the wait for progress (any job's), at most timeout_ms. */
void worker_lock(struct worker *w);
void worker_unlock(struct worker *w);
void worker_wait(struct worker *w, int timeout_ms);

#endif
