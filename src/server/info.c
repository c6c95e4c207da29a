/* The server's read-only endpoints: /health, /v1/models, /props (what the chat page shows: the
 * model, the budget and the plan, and whether it may attach images) and /metrics (Prometheus
 * text). Each builds its body from a snapshot the engine thread keeps, so none of them touches
 * the pshard context. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/http_internal.h"

int info_health(struct server *s, struct reply *out) {
    const enum worker_state st = worker_state(s->worker);
    const char *status = st == WORKER_READY ? "ok" : st == WORKER_LOADING ? "loading" : st == WORKER_FAILED ? "error" : "stopping";
    out->status = st == WORKER_READY ? 200 : 503;
    out->content_type = "application/json";
    out->body = api_dump(json_pack("{s:s}", "status", status));
    return out->body ? 0 : -1;
}

/* /v1/models (id NULL): the list of the one model; /v1/models/ID: that model, or 404. */
int info_models(struct server *s, const char *id, struct reply *out) {
    json_t *model = json_pack("{s:s,s:s,s:I,s:s}", "id", s->cfg->model_id, "object", "model", "created",
                              (json_int_t)s->started, "owned_by", "pshard");
    out->status = 200;
    out->content_type = "application/json";
    if (!id) {
        out->body = api_dump(json_pack("{s:s,s:[o]}", "object", "list", "data", model));
    } else if (!strcmp(id, s->cfg->model_id)) {
        out->body = api_dump(model);
    } else {
        json_decref(model);
        struct api_error err;
        api_fail(&err, 404, "invalid_request_error", "model_not_found", "model", "no model '%.200s' here; this server has '%.100s'",
                 id, s->cfg->model_id);
        out->status = 404;
        out->body = api_dump(api_error_json(&err));
    }
    return out->body ? 0 : -1;
}

int info_props(struct server *s, struct reply *out) {
    struct worker_snapshot w;
    worker_snapshot(s->worker, &w);
    const pshard_info *i = &w.info;
    json_t *vram = json_pack("{s:I,s:o,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "budget_bytes", (json_int_t)i->vram_budget,
                             "budget", budget_json(i),
                             "arena_bytes", (json_int_t)i->vram_arena_bytes, "weight_bytes", (json_int_t)i->vram_weight_bytes,
                             "kv_bytes", (json_int_t)i->vram_kv_bytes, "activation_bytes",
                             (json_int_t)i->vram_activation_bytes, "staging_bytes", (json_int_t)i->vram_staging_bytes,
                             "work_bytes", (json_int_t)i->vram_work_bytes, "context_bytes",
                             (json_int_t)i->vram_context_bytes);
    out->status = 200;
    out->content_type = "application/json";
    out->body = api_dump(json_pack(
        "{s:s,s:s,s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:b,s:o,s:s,s:f,s:f,s:b,s:I,s:s,s:{s:b},s:I}", "model", s->cfg->model_id,
        "model_path", s->cfg->model_path, "status", w.state == WORKER_READY ? "ok" : w.state == WORKER_LOADING ? "loading" : "stopping",
        "arch", w.arch, "chat_format", w.chat_format, "n_ctx", i->n_ctx, "n_parallel", w.batch.n_parallel, "n_threads",
        i->n_threads, "n_layers", i->n_layers, "on_gpu", i->on_gpu, "vram", vram, "plan", i->plan,
        "predicted_ttft_s", i->predicted_ttft_s, "predicted_decode_tokens_per_s",
        i->predicted_decode_s > 0 ? i->predicted_requests / i->predicted_decode_s : 0.0, "profile_measured", i->profile_measured,
        "weight_bytes", (json_int_t)i->weight_bytes, "version", PSHARD_VERSION,
        /* what the chat page needs to offer images: whether requests may carry them, and the
         * largest body, so it refuses an image the server would answer with 413 */
        "modalities", "vision", s->cfg->worker.vision, "max_body_bytes", (json_int_t)s->cfg->max_body_bytes));
    return out->body ? 0 : -1;
}

/* ---- /metrics */

struct text {
    char *s;
    size_t len, cap;
    int failed;
};

static void add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int n = t->failed ? -1 : vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        char *p = realloc(t->s, t->cap * 2 + (size_t)n);
        if (!p) {
            t->failed = 1;
            return;
        }
        t->s = p, t->cap = t->cap * 2 + (size_t)n;
    }
}

static void metric(struct text *t, const char *name, const char *type, const char *help, double value) {
    add(t, "# HELP pshard_%s %s\n# TYPE pshard_%s %s\npshard_%s %.17g\n", name, help, name, type, name, value);
}

int info_metrics(struct server *s, struct reply *out) {
    struct worker_snapshot w;
    worker_snapshot(s->worker, &w);
    const pshard_info *i = &w.info;
    struct text t = {malloc(4096), 0, 4096, 0};
    if (!t.s) return -1;
    add(&t, "# HELP pshard_http_requests_total HTTP requests answered, by endpoint and status class.\n"
            "# TYPE pshard_http_requests_total counter\n");
    for (int r = 0; r < ROUTE_COUNT; r++)
        for (int c = 0; c < 5; c++)
            if (s->http_requests[r][c])
                add(&t, "pshard_http_requests_total{endpoint=\"%s\",status=\"%dxx\"} %llu\n", route_name(r), c + 1,
                    (unsigned long long)s->http_requests[r][c]);
    add(&t, "# HELP pshard_requests_total Generation requests that ended, by how.\n# TYPE pshard_requests_total counter\n"
            "pshard_requests_total{result=\"done\"} %llu\npshard_requests_total{result=\"cancelled\"} %llu\n"
            "pshard_requests_total{result=\"failed\"} %llu\n",
        (unsigned long long)w.requests_done, (unsigned long long)w.requests_cancelled, (unsigned long long)w.requests_failed);
    metric(&t, "prompt_tokens_total", "counter", "Prompt tokens of ended requests.", (double)w.prompt_tokens);
    metric(&t, "prompt_tokens_cached_total", "counter", "Of those, reused from cells already computed (a shared prefix).",
           (double)w.prompt_tokens_cached);
    metric(&t, "tokens_generated_total", "counter", "Tokens generated.", (double)w.generated_tokens);
    metric(&t, "tokens_per_second", "gauge", "Tokens generated per second over the last ten seconds.", w.tokens_per_s);
    metric(&t, "steps_total", "counter", "Engine steps run.", (double)w.steps);
    metric(&t, "requests_in_flight", "gauge", "Requests running or waiting.", w.n_jobs);
    metric(&t, "queue_length", "gauge", "Requests waiting for a sequence.", w.batch.n_queued);
    metric(&t, "images_prepared_bytes", "gauge", "Host memory of images decoded and waiting to be encoded (at most 1 GiB "
           "plus a few images: past it, requests with images wait before reading theirs).", (double)w.prepared_bytes);
    metric(&t, "active_sequences", "gauge", "Sequences generating or reading a prompt.", w.batch.n_active);
    metric(&t, "parallel_sequences", "gauge", "Sequences the context holds (--parallel).", w.batch.n_parallel);
    metric(&t, "kv_cells", "gauge", "KV cells of all sequences.", w.batch.n_cells);
    metric(&t, "kv_cells_free", "gauge", "KV cells no sequence holds.", w.batch.n_cells_free);
    metric(&t, "last_step_tokens", "gauge", "New tokens the last step carried.", w.batch.last_step_tokens);
    metric(&t, "vram_budget_bytes", "gauge", "Device memory pshard may use now (--vram-budget, or as changed; 0: CPU only).",
           (double)i->vram_budget);
    metric(&t, "vram_budget_follow", "gauge", "1 while the budget follows the GPU's free memory (auto).", i->vram_follow);
    metric(&t, "vram_budget_keep_bytes", "gauge", "Following free memory: what it leaves to other programs.",
           (double)i->vram_keep);
    metric(&t, "vram_budget_changes_total", "counter", "Changes of budget carved (POST /v1/pshard/budget, auto).",
           i->budget_changes);
    metric(&t, "vram_budget_last_free_seconds", "gauge", "The last change: from its start until the memory given up was free.",
           i->budget_free_ms / 1e3);
    metric(&t, "vram_budget_last_change_seconds", "gauge", "The last change, whole (the new resident weights copied up too).",
           i->budget_change_ms / 1e3);
    metric(&t, "vram_arena_bytes", "gauge", "Device memory in use: the arena carved from the budget.",
           (double)i->vram_arena_bytes);
    add(&t, "# HELP pshard_vram_part_bytes The arena's parts, and the CUDA context outside the budget.\n"
            "# TYPE pshard_vram_part_bytes gauge\n");
    const struct { const char *name; uint64_t bytes; } parts[] = {
        {"weights", i->vram_weight_bytes}, {"kv", i->vram_kv_bytes}, {"activations", i->vram_activation_bytes},
        {"work", i->vram_work_bytes}, {"staging", i->vram_staging_bytes}, {"mapping", i->vram_mapping_bytes},
        {"cuda_context", i->vram_context_bytes}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        add(&t, "pshard_vram_part_bytes{part=\"%s\"} %llu\n", parts[k].name, (unsigned long long)parts[k].bytes);
    add(&t, "# HELP pshard_plan_info The plan the engine runs (its families) and the last step's.\n"
            "# TYPE pshard_plan_info gauge\npshard_plan_info{plan=\"%s\",last_step=\"%s\",on_gpu=\"%d\"} 1\n",
        i->plan, w.batch.last_step_plan, i->on_gpu);
    metric(&t, "predicted_decode_tokens_per_second", "gauge",
           "The planner's predicted decode speed, every sequence's tokens together (as many as --parallel).",
           i->predicted_decode_s > 0 ? i->predicted_requests / i->predicted_decode_s : 0);
    metric(&t, "plan_phase_changes_total", "counter", "Changes of resident set between prompt and decode steps.",
           i->phase_changes);
    if (t.failed) {
        free(t.s);
        return -1;
    }
    out->status = 200;
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
    out->body = t.s;
    return 0;
}
