/* `pshard chat`: an interactive conversation. The history is re-formatted each turn; the KV
 * cache keeps the common prefix, so only the new turn is processed. Ctrl-C stops an answer and
 * keeps the conversation; /commands are the chat's own. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
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

/* Set by Ctrl-C (SIGINT), read between tokens and at the prompt. A signal handler can reach
 * nothing else, so this one flag is global. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

struct reply {
    char *text;
    size_t len, cap;
    bool silent; /* -n 0: nothing is generated, so the first text stops it, unshown */
    struct cli_budget_watch *watch;
};

static int on_text(void *user, const char *text, size_t len) {
    struct reply *r = user;
    if (interrupted || r->silent) return 1; /* the reply stops here; what came before is kept */
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    cli_budget_watch_check(r->watch, r->watch->ctx);
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

/* The prompt's steps: Ctrl-C stops them too; the progress line, where there is one, goes on. */
struct prompt_watch {
    int (*progress)(void *user, int32_t done, int32_t total);
    void *user;
};

static int on_prompt(void *user, int32_t done, int32_t total) {
    const struct prompt_watch *w = user;
    if (interrupted) {
        if (w->progress) w->progress(w->user, total, total); /* clears the progress line */
        return 1;
    }
    return w->progress ? w->progress(w->user, done, total) : 0;
}

static const struct chat_command {
    const char *name, *help;
} chat_commands[] = {
    {"/help", "list these commands"},
    {"/reset", "start the conversation again (the system message stays)"},
    {"/image", "PATH: an image (JPEG, PNG) for your next message (needs --mmproj)"},
    {"/quit", "end the chat (also /exit, Ctrl-D, or Ctrl-C at the prompt)"},
};

static void print_commands(void) {
    for (size_t i = 0; i < sizeof chat_commands / sizeof chat_commands[0]; i++)
        fprintf(stderr, "  %-8s %s\n", chat_commands[i].name, chat_commands[i].help);
    fprintf(stderr, "  Ctrl-C while the model answers stops the answer and keeps the conversation.\n"
                    "  A line starting with // is sent with one / (for text that starts with a slash).\n");
}

/* The conversation's images: [0, attached) belong to messages sent (whose text holds a marker for
 * each, in order), the rest wait for the next message. */
struct images {
    pshard_image list[64];
    char *paths[64];
    int32_t n, attached;
};

static void images_drop(struct images *im, int32_t keep) {
    while (im->n > keep) free(im->paths[--im->n]);
    if (im->attached > keep) im->attached = keep;
}

/* /image PATH: queued for the next message. */
static void image_command(struct images *im, const char *arg, bool have_encoder) {
    arg += strspn(arg, " \t");
    if (!have_encoder) {
        fprintf(stderr, "images need the model's vision encoder: start the chat with --mmproj PATH\n");
    } else if (!*arg) {
        fprintf(stderr, "/image needs a path\n");
    } else if (access(arg, R_OK) != 0) {
        fprintf(stderr, "%s: cannot read: %s\n", arg, strerror(errno));
    } else if (im->n == (int32_t)(sizeof im->list / sizeof im->list[0])) {
        fprintf(stderr, "a conversation holds at most %zu images (/reset starts again)\n", sizeof im->list / sizeof im->list[0]);
    } else if (!(im->paths[im->n] = strdup(arg))) {
        fprintf(stderr, "pshard: out of memory\n");
    } else {
        im->list[im->n] = (pshard_image){.path = im->paths[im->n]};
        im->n++;
        fprintf(stderr, "(%d image%s for your next message)\n", im->n - im->attached, im->n - im->attached == 1 ? "" : "s");
    }
}

int cmd_chat(int argc, char **argv) {
    struct run_opts o;
    int rc = run_parse_args(argc, argv, "chat", &o);
    if (rc) return rc > 0 ? 0 : 2;
    pshard_ctx *ctx = run_open_model(&o);
    if (!ctx) return 1;
    struct history h = {0};
    static struct images im; /* (large: off the stack) */
    size_t base = 0;
    if (o.system) {
        if (history_add(&h, "system", o.system)) goto oom;
        base = 1;
    }
    struct cli_budget_watch budget;
    cli_budget_watch_init(&budget, "chat", o.budget_file, o.quiet);
    cli_budget_watch_prompts(&budget, ctx, &o.gen);
    struct prompt_watch watch = {o.gen.on_prompt, o.gen.prompt_user};
    o.gen.on_prompt = on_prompt, o.gen.prompt_user = &watch;
    /* Without SA_RESTART, so that Ctrl-C at the prompt ends the read. */
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    const int interactive = isatty(0);
    if (interactive)
        fprintf(stderr, "chat with the model; /help lists the commands, Ctrl-C stops an answer, /quit or Ctrl-D quits\n");
    char line[16384];
    for (;;) {
        if (interactive) fprintf(stderr, "> ");
        interrupted = 0;
        /* (the budget may change while the line is typed) */
        for (struct pollfd in = {.fd = 0, .events = POLLIN}; !interrupted;) {
            const int ready = poll(&in, 1, 250);
            if (ready > 0 || (ready < 0 && errno != EINTR)) break;
            cli_budget_watch_check(&budget, ctx); /* (SIGUSR1 ends the wait too) */
        }
        if (interrupted || !fgets(line, sizeof line, stdin)) {
            if (interrupted || interactive) fputc('\n', stderr); /* the shell's prompt starts a line */
            break;
        }
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0]) continue;
        const char *text = line;
        if (line[0] == '/' && line[1] == '/') {
            text = line + 1;
        } else if (line[0] == '/') {
            const size_t word = strcspn(line, " \t");
            if (word == 5 && !strncmp(line, "/exit", 5)) break;
            if (word == 5 && !strncmp(line, "/quit", 5)) break;
            if (word == 5 && !strncmp(line, "/help", 5)) {
                print_commands();
            } else if (word == 6 && !strncmp(line, "/reset", 6)) {
                history_clear(&h, base);
                images_drop(&im, 0);
                fprintf(stderr, "(conversation cleared)\n");
            } else if (word == 6 && !strncmp(line, "/image", 6)) {
                image_command(&im, line + 6, o.mmproj != NULL);
            } else {
                fprintf(stderr, "unknown command '%.*s'; /help lists the commands\n", (int)word, line);
            }
            continue;
        }
        char *marked = cli_with_image_markers(text, im.n - im.attached);
        if (!marked || history_add(&h, "user", marked)) {
            free(marked);
            goto oom;
        }
        free(marked);
        const int32_t attached_before = im.attached;
        im.attached = im.n;
        o.gen.images = im.list, o.gen.n_images = im.n;
        struct reply r = {.silent = o.gen.n_predict == 0, .watch = &budget};
        pshard_gen_stats stats;
        if (pshard_chat(ctx, h.msgs, h.n, &o.gen, on_text, &r, &stats) != PSHARD_OK) {
            if (interrupted) fprintf(stderr, "(stopped)\n");
            else fprintf(stderr, "\npshard: %s\n", pshard_last_error());
            if (im.n > attached_before) fprintf(stderr, "(the message's images are dropped too)\n");
            images_drop(&im, attached_before);
            history_clear(&h, h.n - 1);
            free(r.text);
            continue;
        }
        printf("\n");
        if (interrupted) fprintf(stderr, "(stopped)\n");
        int failed = history_add(&h, "assistant", r.text ? r.text : "");
        free(r.text);
        if (failed) goto oom;
        if (!o.quiet && !r.silent) run_print_stats(ctx, &stats, o.gen.n_predict, interrupted);
    }
    history_clear(&h, 0);
    images_drop(&im, 0);
    free(h.msgs);
    free(h.owned);
    pshard_close(ctx);
    return 0;
oom:
    fprintf(stderr, "pshard: out of memory\n");
    images_drop(&im, 0);
    history_clear(&h, 0);
    free(h.msgs);
    free(h.owned);
    pshard_close(ctx);
    return 1;
}
