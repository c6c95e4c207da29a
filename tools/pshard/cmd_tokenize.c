/* `pshard tokenize`: the token ids of a text, as `run --raw` feeds them to the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard tokenize [-m MODEL] -p TEXT [--pieces]\n"
                 "  Prints the token ids (with --pieces, id and text per line), BOS included when the\n"
                 "  model adds one; special-token text such as <|im_start|> is recognized.\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    int pieces = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc) {
            text = argv[++i];
        } else if (!strcmp(a, "--pieces")) {
            pieces = 1;
        } else {
            cli_refuse("tokenize", a, "-m --model -p --prompt");
            print_usage(stderr);
            return 2;
        }
    }
    if (!text) {
        fprintf(stderr, "pshard tokenize: a text is required (-p TEXT)\n");
        return 2;
    }
    char default_path[4096];
    if (!model) {
        if (cli_default_model(default_path, sizeof default_path) != 0) return 1;
        model = default_path;
    }
    pshard_vocab *vocab;
    if (pshard_vocab_load(model, &vocab) != PSHARD_OK) {
        fprintf(stderr, "pshard tokenize: %s\n", pshard_last_error());
        return 1;
    }
    int32_t *ids = NULL, n = 0;
    int rc = 0;
    if (pshard_vocab_tokenize(vocab, text, 1, &ids, &n) != PSHARD_OK) {
        fprintf(stderr, "pshard tokenize: %s\n", pshard_last_error());
        rc = 1;
    }
    for (int32_t i = 0; i < n && !rc; i++) {
        if (!pieces) {
            printf(i ? " %d" : "%d", ids[i]);
            continue;
        }
        const char *piece;
        size_t len;
        pshard_vocab_piece(vocab, ids[i], &piece, &len);
        printf("%6d  '%.*s'\n", ids[i], (int)len, piece);
    }
    if (!pieces && !rc) printf("\n");
    free(ids);
    pshard_vocab_free(vocab);
    return rc;
}
