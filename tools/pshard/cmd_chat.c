/* `pshard chat`: an interactive conversation. The history is re-formatted each turn; the KV
 * cache keeps the common prefix, so only the new turn is processed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "pshard.h"

struct history {
    pshard_message *msgs;
    char **owned; /* the strings, owned */
    size_t n, cap;
};

static int history_add(struct history *h, const char *role, const char *text) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        pshard_message *m = realloc(h->msgs, cap * sizeof *m);
        if (!m) return -1;
        h->msgs = m;
        char **o = realloc(h->owned, cap * sizeof *o);
        if (!o) return -1;
        h->owned = o;
        h->cap = cap;
    }
    h->owned[h->n] = strdup(text);
    if (!h->owned[h->n]) return -1;
    h->msgs[h->n] = (pshard_message){role, h->owned[h->n]};
    h->n++;
    return 0;
}

static void history_clear(struct history *h, size_t keep) {
    while (h->n > keep) free(h->owned[--h->n]);
}

struct reply {
    char *text;
    size_t len, cap;
};

static int on_text(void *user, const char *text, size_t len) {
    struct reply *r = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t) return 1;
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = '\0';
    return 0;
}

int cmd_chat(int argc, char **argv) {
    struct run_opts o;
    int rc = run_parse_args(argc, argv, "chat", &o);
    if (rc) return rc > 0 ? 0 : 2;
    pshard_ctx *ctx = run_open_model(&o);
    if (!ctx) return 1;
    struct history h = {0};
    size_t base = 0;
    if (o.system) {
        if (history_add(&h, "system", o.system)) goto oom;
        base = 1;
    }
    const int interactive = isatty(0);
    if (interactive) fprintf(stderr, "chat with the model; /reset clears the conversation, /exit or Ctrl-D quits\n");
    char line[16384];
    for (;;) {
        if (interactive) fprintf(stderr, "> ");
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0]) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            history_clear(&h, base);
            fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (history_add(&h, "user", line)) goto oom;
        struct reply r = {0};
        pshard_gen_stats stats;
        if (pshard_chat(ctx, h.msgs, h.n, &o.gen, on_text, &r, &stats) != PSHARD_OK) {
            fprintf(stderr, "\npshard: %s\n", pshard_last_error());
            history_clear(&h, h.n - 1);
            free(r.text);
            continue;
        }
        printf("\n");
        int failed = history_add(&h, "assistant", r.text ? r.text : "");
        free(r.text);
        if (failed) goto oom;
        if (!o.quiet) run_print_stats(ctx, &stats);
    }
    history_clear(&h, 0);
    free(h.msgs);
    free(h.owned);
    pshard_close(ctx);
    return 0;
oom:
    fprintf(stderr, "pshard: out of memory\n");
    history_clear(&h, 0);
    free(h.msgs);
    free(h.owned);
    pshard_close(ctx);
    return 1;
}
