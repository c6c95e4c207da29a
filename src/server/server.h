/* `pshard serve`'s server: an OpenAI-compatible HTTP API and a chat page over the batched
 * engine. server_run binds, starts the engine thread (which loads the model), serves until
 * SIGINT or SIGTERM, then drains and frees everything. */
#ifndef SERVER_SERVER_H
#define SERVER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "server/worker.h"

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
