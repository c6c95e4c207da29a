/* --budget-file for run and chat: the VRAM budget changed while the model generates. The file
 * holds one budget as --vram-budget takes it (4G, 4096M, auto, auto:keep=2G); it is read again when
 * its modification time changes (checked at most every CLI_BUDGET_CHECK_MS, between tokens and
 * prompt steps, and while chat waits for a line) or at once on SIGUSR1. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

enum { CLI_BUDGET_CHECK_MS = 250 };

/* Set by SIGUSR1; a signal handler can reach nothing else, so this one flag is global. */
static volatile sig_atomic_t reread_asked;

static void on_sigusr1(int sig) {
    (void)sig;
    reread_asked = 1;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The file's modification time, or zero where it cannot be read (not there yet). */
static struct timespec mtime_of(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return (struct timespec){0, 0};
    return st.st_mtim;
}

void cli_budget_watch_init(struct cli_budget_watch *w, const char *cmd, const char *path, bool quiet) {
    memset(w, 0, sizeof *w);
    w->cmd = cmd, w->path = path, w->quiet = quiet;
    if (!path) return;
    w->mtime_s = (int64_t)mtime_of(path).tv_sec, w->mtime_ns = mtime_of(path).tv_nsec;
    struct sigaction sa = {.sa_handler = on_sigusr1, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

/* The file's budget, applied; what happened on stderr. */
static void apply(struct cli_budget_watch *w, pshard_ctx *ctx) {
    char text[128] = "";
    FILE *f = fopen(w->path, "r");
    if (!f) {
        fprintf(stderr, "\npshard %s: --budget-file %s: %s; the budget stays\n", w->cmd, w->path, strerror(errno));
        return;
    }
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *s = text + strspn(text, " \t\r\n");
    s[strcspn(s, " \t\r\n")] = 0;
    if (!*s) return; /* empty (being written): the next change of the file brings it */
    int64_t bytes, keep;
    int follow;
    pshard_info before, after;
    pshard_get_info(ctx, &before);
    if (!cli_vram_budget(s, &bytes, &follow, &keep)) {
        fprintf(stderr, "\npshard %s: --budget-file %s ('%s'): not a size such as 4G, 4096M or 0, nor auto[:keep=SIZE]; "
                        "the budget stays\n", w->cmd, w->path, s);
        return;
    }
    const pshard_status st = follow ? pshard_follow_free_vram(ctx, keep) : pshard_set_vram_budget(ctx, bytes);
    if (st != PSHARD_OK) {
        fprintf(stderr, "\npshard %s: --budget-file %s ('%s'): %s; the budget stays\n", w->cmd, w->path, s, pshard_last_error());
        return;
    }
    if (w->quiet) return;
    pshard_get_info(ctx, &after);
    char was[32], now[32];
    fprintf(stderr, "\npshard %s: VRAM budget %s%s (was %s), plan %s", w->cmd,
            pshard_format_bytes((uint64_t)after.vram_budget, now, sizeof now), after.vram_follow ? ", following free memory" : "",
            pshard_format_bytes((uint64_t)before.vram_budget, was, sizeof was), after.plan);
    if (after.budget_changes > before.budget_changes)
        fprintf(stderr, "; memory given back after %.0f ms, changed in %.0f ms (planning %.0f, freeing %.0f, pinning the "
                        "host's KV cache %.0f, the new arena %.0f, carving it and the KV cells up %.0f)%s",
                after.budget_free_ms, after.budget_change_ms, after.budget_plan_ms, after.budget_free_ms - after.budget_plan_ms,
                after.budget_pin_ms, after.budget_arena_ms, after.budget_fill_ms,
                after.budget_weights_ms > 0 ? "" : " (its resident weights go up while steps go on)");
    fputc('\n', stderr);
}

void cli_budget_watch_check(struct cli_budget_watch *w, pshard_ctx *ctx) {
    if (!w || !ctx) return;
    if (w->path) {
        const double t = now_ms();
        bool changed = false;
        if (reread_asked || t - w->checked_ms >= CLI_BUDGET_CHECK_MS) {
            w->checked_ms = t;
            const struct timespec m = mtime_of(w->path);
            changed = (int64_t)m.tv_sec != w->mtime_s || m.tv_nsec != w->mtime_ns;
            w->mtime_s = (int64_t)m.tv_sec, w->mtime_ns = m.tv_nsec;
        }
        if (changed || reread_asked) {
            reread_asked = 0;
            apply(w, ctx);
        }
    }
    if (pshard_budget_poll(ctx) != PSHARD_OK) fprintf(stderr, "\npshard %s: %s\n", w->cmd, pshard_last_error());
}

static int on_prompt(void *user, int32_t done, int32_t total) {
    struct cli_budget_watch *w = user;
    cli_budget_watch_check(w, w->ctx);
    return w->prompt_cb ? w->prompt_cb(w->prompt_user, done, total) : 0;
}

void cli_budget_watch_prompts(struct cli_budget_watch *w, pshard_ctx *ctx, pshard_gen_opts *gen) {
    w->ctx = ctx;
    w->prompt_cb = gen->on_prompt, w->prompt_user = gen->prompt_user;
    gen->on_prompt = on_prompt, gen->prompt_user = w;
}
