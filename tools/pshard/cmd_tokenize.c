/* `pshard tokenize`: the token ids of a text, as `run --raw` feeds them to the model. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

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
            fprintf(stderr, "pshard tokenize: unknown or incomplete option '%s'\n", a);
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
    struct tok *tok;
    if (tok_load_gguf_path(model, &tok) != PSHARD_OK) {
        fprintf(stderr, "pshard tokenize: %s\n", pshard_last_error());
        return 1;
    }
    struct tok_ids ids = {0};
    int rc = 0;
    if (tok_encode(tok, text, strlen(text), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &ids) != PSHARD_OK) {
        fprintf(stderr, "pshard tokenize: %s\n", pshard_last_error());
        rc = 1;
    }
    for (size_t i = 0; i < ids.n && !rc; i++) {
        if (!pieces) {
            printf(i ? " %d" : "%d", ids.ids[i]);
            continue;
        }
        const char *piece;
        size_t len;
        tok_token_to_piece(tok, ids.ids[i], TOK_DECODE_SPECIAL, &piece, &len);
        printf("%6d  '%.*s'\n", ids.ids[i], (int)len, piece);
    }
    if (!pieces && !rc) printf("\n");
    tok_ids_free(&ids);
    tok_free(tok);
    return rc;
}
