/* `pshard serve`: an OpenAI-compatible HTTP server (and a chat page) over the continuous-batching
 * engine. Its own options (address, port, sequences at once, API key, queue and body limits) are
 * taken here; the model and planning options are run's. The server itself is src/server, seen
 * through include/pshard_server.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "pshard_server.h"

struct serve_cli {
    const char *host, *api_key, *alias;
    int64_t port, n_parallel, max_queue, max_body, drain_s;
    bool n_predict_given;
};

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard serve [-m MODEL] [--vram-budget SIZE] [--host ADDR] [--port N] [--parallel N]\n"
                 "                    [--api-key KEY] [-c CTX] [--mmproj VISION.gguf] [run's options]\n"
                 "  Serves the model over HTTP with OpenAI's API: POST /v1/chat/completions, POST /v1/completions,\n"
                 "  GET /v1/models; GET /health, GET /metrics (Prometheus), GET /props, and a chat page at /.\n"
                 "  POST /v1/pshard/budget {\"vram_budget\": \"4G\"} changes the VRAM budget while it serves (a size,\n"
                 "  bytes, or \"auto[:keep=SIZE]\"); --vram-budget auto[:keep=SIZE] follows the GPU's free memory.\n"
                 "  --host ADDR        address to listen on (default 127.0.0.1, this machine only)\n"
                 "  --port N           port (default 8080; 0: any free one, printed)\n"
                 "  --parallel N       requests generating at once (default 4); more wait in a queue\n"
                 "  --max-queue N      requests that may wait beyond those (default 64); more get 503\n"
                 "  --api-key KEY      require 'Authorization: Bearer KEY' on /v1, /props and /metrics\n"
                 "                     (default: $PSHARD_API_KEY if set, else none)\n"
                 "  --alias NAME       the model's name in the API (default: the file's name)\n"
                 "  --max-body BYTES   largest request body (default 4M, with --mmproj 32M: images come inline in\n"
                 "                     base64); larger ones get 413\n"
                 "  --mmproj PATH      the model's vision encoder: chat messages may hold image_url parts with\n"
                 "                     data: URLs (base64 JPEG or PNG); remote URLs are refused\n"
                 "  --no-mmproj-offload\n"
                 "                     encode images on the CPU even with the GPU (by default the GPU encodes\n"
                 "                     them where the encoding fits the VRAM budget)\n"
                 "  --drain SECONDS    on SIGINT/SIGTERM, time requests running get to finish (default 10)\n"
                 "  -c is the KV cells all sequences share (default 4096 per sequence; one sequence reaches at\n"
                 "  most the model's trained context); -n the default max_tokens (default: what a sequence's\n"
                 "  share of the cells, -c / --parallel, leaves after the prompt, at least a quarter of it);\n"
                 "  --temp, --top-k, --top-p, --min-p, ... the defaults of what a request does not give.\n"
                 "  Other options as `pshard run --help`.\n");
}

/* Take serve's own options out of argv (the rest are run's); 0, 1 (help) or -1. */
static int take_own_args(int *argc, char **argv, struct serve_cli *c) {
    int kept = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_usage(stdout);
            return 1;
        }
        if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) c->n_predict_given = true;
        if (!strcmp(a, "--host") && v) c->host = argv[++i];
        else if (!strcmp(a, "--api-key") && v) c->api_key = argv[++i];
        else if (!strcmp(a, "--alias") && v) c->alias = argv[++i];
        else if (!strcmp(a, "--port") && v) rc = cli_int("serve", a, argv[++i], 0, 65535, &c->port);
        else if (!strcmp(a, "--parallel") && v) rc = cli_int("serve", a, argv[++i], 1, 256, &c->n_parallel);
        else if (!strcmp(a, "--max-queue") && v) rc = cli_int("serve", a, argv[++i], 0, 4096, &c->max_queue);
        else if (!strcmp(a, "--drain") && v) rc = cli_int("serve", a, argv[++i], 0, 3600, &c->drain_s);
        else if (!strcmp(a, "--max-body") && v) {
            rc = cli_size("serve", a, argv[++i], &c->max_body);
            if (!rc && (c->max_body < 1024 || c->max_body > (1 << 30))) {
                fprintf(stderr, "pshard serve: --max-body takes a size from 1K to 1G\n");
                rc = -1;
            }
        } else if (!strcmp(a, "--host") || !strcmp(a, "--api-key") || !strcmp(a, "--alias") || !strcmp(a, "--port") ||
                   !strcmp(a, "--parallel") || !strcmp(a, "--max-queue") || !strcmp(a, "--drain") ||
                   !strcmp(a, "--max-body")) {
            rc = cli_needs_value("serve", a);
        } else {
            argv[kept++] = argv[i];
        }
        if (rc) return -1;
    }
    *argc = kept;
    return 0;
}

static pshard_ctx *open_model(void *user) { return run_open_model(user); }

/* The model's name in the API: the file's name without its directory and ".gguf". */
static void model_name(const char *path, char *out, size_t size) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(base) < size - 1 ? strlen(base) : size - 1;
    memcpy(out, base, n);
    out[n] = 0;
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) out[n - 5] = 0;
}

int cmd_serve(int argc, char **argv) {
    struct serve_cli c = {"127.0.0.1", getenv("PSHARD_API_KEY"), NULL, 8080, 4, 64, 0, 10, false};
    int rc = take_own_args(&argc, argv, &c);
    if (rc) return rc > 0 ? 0 : 2;
    struct run_opts o;
    rc = run_parse_args(argc, argv, "serve", &o);
    if (rc) return rc > 0 ? 0 : 2;
    if (o.budget_file) {
        fprintf(stderr, "pshard serve: --budget-file is run's and chat's; the server's budget changes with POST "
                        "/v1/pshard/budget\n");
        return 2;
    }
    if (!o.model) {
        if (cli_default_model(o.default_path, sizeof o.default_path) != 0) return 1;
        o.model = o.default_path;
    }
    o.params.n_parallel = (int32_t)c.n_parallel;
    /* The server bounds the requests in flight at both together; any of them may wait in the
     * engine's queue until a step admits it, so the engine's bound is never the one reached. */
    o.params.max_queue = (int32_t)(c.n_parallel + c.max_queue);
    if (o.params.n_ctx <= 0) o.params.n_ctx = 4096 * (int32_t)c.n_parallel;
    if (c.max_body == 0) c.max_body = o.mmproj ? 32 << 20 : 4 << 20; /* an image in base64 is a third larger than its file */
    char name[256];
    model_name(o.model, name, sizeof name);
    struct server_config cfg = {
        .host = c.host,
        .port = (int)c.port,
        .api_key = c.api_key && *c.api_key ? c.api_key : NULL,
        .model_id = c.alias ? c.alias : name,
        .model_path = o.model,
        .vram_budget = o.params.vram_budget,
        .max_body_bytes = (size_t)c.max_body,
        .max_connections = (unsigned)(4 * (c.n_parallel + c.max_queue) + 16),
        .worker = {.open = open_model,
                   .open_user = &o,
                   .n_parallel = (int32_t)c.n_parallel,
                   .max_queue = (int32_t)c.max_queue,
                   .default_max_tokens = c.n_predict_given ? o.gen.n_predict : -1, /* -1: the share's */
                   .sampling = o.gen.sampling,
                   .drain_s = (double)c.drain_s,
                   .vision = o.mmproj != NULL},
    };
    return server_run(&cfg);
}
