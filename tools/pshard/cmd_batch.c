/* `pshard batch`: many prompts at once through the continuous-batching scheduler. Prompts come
 * from -p (repeatable) and -f FILE (one per line); up to --parallel of them run together, the rest
 * wait and join as sequences free up. Each reply is printed when it ends (or, with --jsonl, as
 * one JSON object a line), in the order they end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "pshard.h"

enum { MAX_PROMPTS = 4096 };

struct batch_cli {
    const char *prompts[MAX_PROMPTS];
    char *file_text; /* -f's contents, which prompts point into */
    int n_prompts;
    int32_t n_parallel, stagger;
    int jsonl;
};

struct reply {
    int index;
    char *text;
    size_t len, cap;
    int32_t *ids;
    int32_t n_ids;
    size_t ids_bytes; /* room at ids */
};

/* Room for at least `bytes` at *p, doubling what there is; nonzero when memory ran out. */
static int reserve(void *p, size_t *room, size_t bytes) {
    if (bytes <= *room) return 0;
    size_t n = *room ? *room : 256;
    while (n < bytes) n *= 2;
    void *grown = realloc(*(void **)p, n);
    if (!grown) return -1;
    *(void **)p = grown, *room = n;
    return 0;
}

struct batch_run {
    struct reply *replies;
    const struct run_opts *o;
    int jsonl, failed;
};

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard batch [-m MODEL] (-p PROMPT ... | -f FILE) [--parallel N] [--jsonl] [run's options]\n"
                 "  Runs every prompt (each -p, and each line of FILE, -f or --file; at most 4096 in all)\n"
                 "  through one model, up to N at once\n"
                 "  (default 4): a step carries one token of each sequence that is generating and chunks of\n"
                 "  the prompts still being read; a prompt waits for a free sequence and joins between steps.\n"
                 "  Each reply is printed when it ends, headed by its prompt's number (from 1), why it ended\n"
                 "  and its time to first token; --jsonl prints one JSON object a line instead\n"
                 "  ({\"index\", \"text\", \"finish\", \"n_prompt\", \"n_generated\", \"ttft_ms\", \"ids\"}).\n"
                 "  -c is the KV cells all sequences share (default 4096 per sequence). --stagger K adds one\n"
                 "  prompt every K steps instead of all at once. Other options as `pshard run --help`.\n");
}

static void json_string(FILE *out, const char *s, size_t n) {
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c < 0x20) fprintf(out, "\\u%04x", c);
        else fputc(c, out);
    }
    fputc('"', out);
}

/* A whole number in [lo, hi] for option opt, read as every subcommand reads one (cli_int). */
static int whole(const char *opt, const char *v, long lo, long hi, int32_t *out) {
    int64_t n;
    if (!v) return cli_needs_value("batch", opt);
    if (cli_int("batch", opt, v, lo, hi, &n)) return -1;
    *out = (int32_t)n;
    return 0;
}

static int on_event(void *user, const pshard_token_event *ev) {
    struct batch_run *b = user;
    struct reply *r = &b->replies[ev->request];
    if (reserve(&r->text, &r->cap, r->len + ev->len + 1) ||
        (ev->token >= 0 && reserve(&r->ids, &r->ids_bytes, sizeof(int32_t) * ((size_t)r->n_ids + 1))))
        return 1;
    memcpy(r->text + r->len, ev->text, ev->len);
    r->len += ev->len;
    r->text[r->len] = 0;
    if (ev->token >= 0) r->ids[r->n_ids++] = ev->token;
    if (ev->finish == PSHARD_FINISH_NONE) return 0;
    const pshard_request_stats *s = ev->stats;
    if (ev->finish == PSHARD_FINISH_ERROR) {
        fprintf(stderr, "pshard batch: prompt %d: %s\n", r->index + 1, ev->error);
        b->failed++;
    }
    if (b->jsonl) {
        printf("{\"index\": %d, \"text\": ", r->index + 1);
        json_string(stdout, r->text, r->len);
        printf(", \"finish\": \"%s\", \"n_prompt\": %d, \"n_generated\": %d, \"ttft_ms\": %.1f, \"ids\": [",
               pshard_finish_name(ev->finish), s->n_prompt, s->n_generated, s->ttft_ms);
        for (int32_t i = 0; i < r->n_ids; i++) printf("%s%d", i ? ", " : "", r->ids[i]);
        printf("]}\n");
    } else {
        printf("--- %d (%s, %d tokens, TTFT %.0f ms)\n%s\n", r->index + 1, pshard_finish_name(ev->finish), s->n_generated,
               s->ttft_ms, r->text);
        if (b->o->print_ids) {
            printf("ids:");
            for (int32_t i = 0; i < r->n_ids; i++) printf(" %d", r->ids[i]);
            printf("\n");
        }
    }
    fflush(stdout);
    return 0;
}

/* Take batch's own options out of argv (the rest are run's); 0, 1 (help) or -1. */
static int take_own_args(int *argc, char **argv, struct batch_cli *c) {
    int kept = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_usage(stdout);
            return 1;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && v) {
            if (c->n_prompts == MAX_PROMPTS) {
                fprintf(stderr, "pshard batch: at most %d prompts\n", MAX_PROMPTS);
                return -1;
            }
            c->prompts[c->n_prompts++] = argv[++i];
        } else if (!v && (!strcmp(a, "-p") || !strcmp(a, "--prompt") || !strcmp(a, "-f") || !strcmp(a, "--file"))) {
            return cli_needs_value("batch", a);
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && v) {
            if (c->file_text) {
                fprintf(stderr, "pshard batch: one -f FILE at most (put every prompt in it, a line each)\n");
                return -1;
            }
            FILE *f = fopen(argv[++i], "rb");
            if (!f) {
                perror(argv[i]);
                return -1;
            }
            size_t len = 0, cap = 0;
            int failed = 0;
            for (int ch; !failed && (ch = fgetc(f)) != EOF;) {
                failed = reserve(&c->file_text, &cap, len + 2);
                if (!failed) c->file_text[len++] = (char)ch;
            }
            failed = failed || ferror(f);
            fclose(f);
            if (failed) {
                fprintf(stderr, "pshard batch: cannot read %s\n", argv[i]);
                return -1;
            }
            if (!c->file_text) continue; /* an empty file: no prompts */
            c->file_text[len] = 0;
            for (char *line = strtok(c->file_text, "\n"); line; line = strtok(NULL, "\n")) {
                if (!*line) continue;
                if (c->n_prompts == MAX_PROMPTS) {
                    fprintf(stderr, "pshard batch: at most %d prompts (%s has more)\n", MAX_PROMPTS, argv[i]);
                    return -1;
                }
                c->prompts[c->n_prompts++] = line;
            }
        } else if (!strcmp(a, "--parallel")) {
            if (whole(a, v, 1, 4096, &c->n_parallel)) return -1;
            i++;
        } else if (!strcmp(a, "--stagger")) {
            if (whole(a, v, 1, 1 << 20, &c->stagger)) return -1;
            i++;
        } else if (!strcmp(a, "--jsonl")) {
            c->jsonl = 1;
        } else {
            argv[kept++] = argv[i];
        }
    }
    *argc = kept;
    return 0;
}

static int add(pshard_ctx *ctx, const struct run_opts *o, const char *prompt, struct batch_run *b) {
    char *formatted = NULL;
    if (!o->raw) {
        const pshard_message msgs[2] = {{"system", o->system}, {"user", prompt}};
        if (pshard_format_chat(ctx, o->system ? msgs : msgs + 1, o->system ? 2 : 1, o->gen.default_system, &formatted) !=
            PSHARD_OK)
            return -1;
    }
    pshard_request req;
    pshard_request_default(&req);
    req.prompt = formatted ? formatted : prompt;
    req.n_predict = o->gen.n_predict, req.sampling = o->gen.sampling, req.ignore_eos = o->gen.ignore_eos;
    req.on_event = on_event, req.user = b;
    int32_t id;
    const pshard_status st = pshard_request_add(ctx, &req, &id);
    free(formatted);
    return st == PSHARD_OK ? 0 : -1;
}

int cmd_batch(int argc, char **argv) {
    struct batch_cli c = {.n_parallel = 4};
    int rc = take_own_args(&argc, argv, &c);
    if (rc) {
        free(c.file_text);
        return rc > 0 ? 0 : 2;
    }
    struct run_opts o;
    rc = run_parse_args(argc, argv, "batch", &o);
    if (rc || !c.n_prompts) {
        if (!rc) fprintf(stderr, "pshard batch: give prompts with -p PROMPT or -f FILE\n");
        free(c.file_text);
        return rc > 0 ? 0 : 2;
    }
    o.params.n_parallel = c.n_parallel;
    if (o.params.n_ctx <= 0) o.params.n_ctx = 4096 * c.n_parallel;
    o.params.max_queue = c.n_prompts;
    struct batch_run b = {calloc((size_t)c.n_prompts, sizeof *b.replies), &o, c.jsonl, 0};
    pshard_ctx *ctx = b.replies ? run_open_model(&o) : NULL;
    int status = ctx ? 0 : 1;
    int added = 0;
    for (int32_t steps = 0, pending = 1; ctx && !status && (pending || added < c.n_prompts); steps++) {
        while (added < c.n_prompts && (!c.stagger || steps >= added * c.stagger)) {
            b.replies[added].index = added; /* ids count from 0 in the order added */
            if (add(ctx, &o, c.prompts[added], &b)) {
                fprintf(stderr, "pshard batch: prompt %d: %s\n", added + 1, pshard_last_error());
                status = 1;
                break;
            }
            added++;
            if (c.stagger) break;
        }
        if (!status && pshard_step(ctx, &pending) != PSHARD_OK) {
            fprintf(stderr, "pshard batch: %s\n", pshard_last_error());
            status = 1;
        }
    }
    if (!status && b.failed) status = 1;
    for (int i = 0; b.replies && i < c.n_prompts; i++) free(b.replies[i].text), free(b.replies[i].ids);
    free(b.replies);
    free(c.file_text);
    pshard_close(ctx);
    return status;
}
