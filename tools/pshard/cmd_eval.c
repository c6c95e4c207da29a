/* `pshard eval`: run a given token sequence (or a tokenized text) through the model and write
 * the logits of every position, for comparing engines and placements. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard eval [-m MODEL] (--tokens 1,2,3 | -p TEXT) -o LOGITS.f32 [-c N] [-b N] [-t N]\n"
                 "       [--steps N,N,...] [--gpu | --vram-budget SIZE [--plan auto|cpu|gpu|static|dynamic]\n"
                 "       [--stream-share F] [--set ring|no-ring|all-kv] [--decode-set ring|no-ring|all-kv|same]]\n"
                 "  Writes float32 logits [n_tokens][n_vocab] of every position to the output file and prints\n"
                 "  the argmax of each position. -p tokenizes TEXT as `run --raw` does. Steps carry -b tokens\n"
                 "  each, or with --steps the counts given in turn (each at most -b), repeated to the end.\n");
}

/* Comma-separated whole numbers from 0 to 2^31-1 (digits only: no sign, space or fraction) into a
 * malloc'd array; -1 for anything else or an empty list. */
static int parse_ids(const char *text, int32_t **out, int32_t *n) {
    int32_t cap = 64, count = 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    for (const char *p = text; ids;) {
        const size_t digits = strspn(p, "0123456789");
        long long v = 0;
        for (size_t d = 0; d < digits && v <= 0x7fffffff; d++) v = v * 10 + (p[d] - '0');
        if (!digits || v > 0x7fffffff || (p[digits] && p[digits] != ',')) break;
        if (count == cap) {
            int32_t *grown = realloc(ids, sizeof *ids * (size_t)(cap *= 2));
            if (!grown) break;
            ids = grown;
        }
        ids[count++] = (int32_t)v;
        p += digits;
        if (!*p) {
            *out = ids;
            *n = count;
            return 0;
        }
        p++; /* the comma */
    }
    free(ids);
    return -1;
}

/* Each position's argmax to stdout, its logits to the file. */
static int write_logits(void *user, int32_t position, const float *logits, int32_t n_vocab) {
    (void)position;
    int32_t best = 0;
    for (int32_t j = 1; j < n_vocab; j++) best = logits[j] > logits[best] ? j : best;
    printf(" %d", best);
    return fwrite(logits, sizeof(float), (size_t)n_vocab, user) != (size_t)n_vocab;
}

int cmd_eval(int argc, char **argv) {
    const char *tokens_arg = NULL, *out_path = NULL, *prompt = NULL, *model = NULL, *steps_arg = NULL;
    pshard_params params;
    pshard_params_default(&params);
    params.prefault = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t k;
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { print_usage(stdout); return 0; }
        else if (!strcmp(a, "--tokens") && v) tokens_arg = argv[++i];
        else if (!strcmp(a, "-p") && v) prompt = argv[++i];
        else if (!strcmp(a, "--steps") && v) steps_arg = argv[++i];
        else if (!strcmp(a, "-o") && v) out_path = argv[++i];
        else if (!strcmp(a, "-m") && v) model = argv[++i];
        else if (!strcmp(a, "-c") && v) {
            if (cli_int("eval", a, argv[++i], 1, 1 << 24, &k)) return 2;
            params.n_ctx = (int32_t)k;
        } else if (!strcmp(a, "-b") && v) {
            if (cli_int("eval", a, argv[++i], 1, 65536, &k)) return 2;
            params.n_batch = (int32_t)k;
        } else if (!strcmp(a, "-t") && v) {
            if (cli_int("eval", a, argv[++i], 1, 1024, &k)) return 2;
            params.n_threads = (int32_t)k;
        }
        else if (!strcmp(a, "--gpu")) params.gpu = 1;
        else if (!strcmp(a, "--no-profile")) params.no_profile = 1;
        else if ((r = cli_planning_option("eval", argc, argv, &i, false, &params)) != 0) {
            if (r < 0) return 2;
        } else {
            cli_refuse("eval", a, "--tokens -p --steps -o -m -c -b -t");
            print_usage(stderr);
            return 2;
        }
    }
    if ((!tokens_arg && !prompt) || !out_path) { print_usage(stderr); return 2; }
    int32_t *ids = NULL, n = 0, *steps = NULL, n_steps = 0;
    if (tokens_arg && parse_ids(tokens_arg, &ids, &n) != 0) {
        fprintf(stderr, "pshard eval: --tokens takes comma-separated token ids such as 1,2,3, got '%s'\n", tokens_arg);
        return 2;
    }
    if (steps_arg && parse_ids(steps_arg, &steps, &n_steps) != 0) {
        fprintf(stderr, "pshard eval: --steps takes comma-separated token counts such as 16,1, got '%s'\n", steps_arg);
        free(ids);
        return 2;
    }
    char default_path[4096];
    if (!model && cli_default_model(default_path, sizeof default_path) != 0) {
        free(ids);
        free(steps);
        return 1;
    }
    if (!model) model = default_path;
    params.model_path = model;
    uint32_t n_ctx_train;
    if (params.n_ctx > 0 && pshard_model_context(model, &n_ctx_train) == PSHARD_OK)
        params.n_ctx = cli_cap_context("eval", n_ctx_train, params.n_ctx);
    pshard_ctx *ctx = NULL;
    int rc = 1;
    struct cli_switches *switches = cli_switches_read("eval");
    if (!switches) {
        free(ids);
        free(steps);
        return 2;
    }
    const pshard_status opened = cli_open(&params, switches, &ctx);
    free(switches);
    if (opened != PSHARD_OK) {
        fprintf(stderr, "pshard eval: %s\n", pshard_last_error());
        goto done;
    }
    pshard_info info;
    pshard_get_info(ctx, &info);
    for (int32_t k = 0; k < n_steps; k++)
        if (steps[k] < 1 || steps[k] > info.n_batch) {
            fprintf(stderr, "pshard eval: --steps takes token counts from 1 to the batch size (%d), got '%s'\n", info.n_batch,
                    steps_arg);
            rc = 2;
            goto done;
        }
    if (prompt) {
        free(ids); /* -p takes the place of --tokens */
        ids = NULL;
        if (pshard_tokenize(ctx, prompt, 1, &ids, &n) != PSHARD_OK) {
            fprintf(stderr, "pshard eval: %s\n", pshard_last_error());
            goto done;
        }
    }
    FILE *out = fopen(out_path, "wb");
    if (!out) {
        perror(out_path);
        goto done;
    }
    printf("argmax:");
    const pshard_status st = pshard_eval(ctx, ids, n, steps, n_steps, write_logits, out);
    printf("\n");
    if (st != PSHARD_OK) fprintf(stderr, "pshard eval: %s\n", pshard_last_error());
    rc = fclose(out) == 0 && st == PSHARD_OK ? 0 : 1;
done:
    free(ids);
    free(steps);
    pshard_close(ctx);
    return rc;
}
