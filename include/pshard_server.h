/* `pshard serve`'s server (libpshard_server, src/server, linked into the pshard tool; not installed):
 * an OpenAI-compatible HTTP API and a chat page over the batched engine. server_run binds, starts
 * the engine thread (which loads the model), serves until SIGINT or SIGTERM, then drains and frees
 * everything. The tool sees the server through this header alone, as it sees the engine through
 * pshard.h. */
#ifndef PSHARD_SERVER_H
#define PSHARD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

/* The engine thread's settings (src/server/worker.c). */
struct worker_config {
    /* Opens the model (called on the engine thread; NULL: failed, the reason already printed). */
    pshard_ctx *(*open)(void *user);
    void *open_user;
    int32_t n_parallel, max_queue; /* more than both together in flight are refused (503) */
    int32_t default_max_tokens;    /* when a request gives none; < 0: to the context's end */
    pshard_sampling sampling;      /* defaults for what a request does not give (its seed: drawn) */
    double drain_s;                /* on stop: how long running requests may take to finish */
    bool vision;                   /* open() attaches a vision encoder: requests may carry images */
};

struct server_config {
    const char *host;       /* an address or name to bind (default 127.0.0.1) */
    int port;               /* 0: any free port (the one taken is printed) */
    const char *api_key;    /* NULL: none asked for */
    const char *model_id;   /* the name /v1/models gives */
    const char *model_path;
    int64_t vram_budget;    /* as given (bytes; 0: CPU only), reported against use */
    size_t max_body_bytes;  /* larger request bodies: 413 */
    unsigned max_connections;
    struct worker_config worker;
};

/* Serves until a signal; the process exit code (0 after a clean stop). */
int server_run(const struct server_config *cfg);

#endif
