/* libFuzzer target for tokenizer input: any bytes, with and without special-token parsing,
 * must encode without error or out-of-bounds access, and decoding the ids (whole and
 * streamed) must stay in bounds. The vocabulary comes from the GGUF named by
 * $PSHARD_FUZZ_MODEL (the default model in CI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

static struct tok *tokenizer;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("PSHARD_FUZZ_MODEL");
    if (!path || tok_load_gguf_path(path, &tokenizer) != PSHARD_OK) {
        fprintf(stderr, "fuzz_tok: set PSHARD_FUZZ_MODEL to a GGUF with a tokenizer (%s)\n", pshard_last_error());
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    for (int flags = 0; flags < 4; flags++) {
        struct tok_ids ids = {0};
        if (tok_encode(tokenizer, text, size, flags, &ids) != PSHARD_OK) abort(); /* any bytes must encode */
        char out[4096];
        size_t n;
        tok_decode_into(tokenizer, ids.ids, ids.n, flags & 1 ? TOK_DECODE_SPECIAL : 0, out, sizeof out, &n);
        struct tok_decoder *dec;
        if (tok_decoder_create(tokenizer, 0, &dec) == PSHARD_OK) {
            const char *piece;
            size_t len;
            for (size_t i = 0; i < ids.n; i++) tok_decoder_push(dec, ids.ids[i], &piece, &len);
            tok_decoder_flush(dec, &piece, &len);
            tok_decoder_free(dec);
        }
        tok_ids_free(&ids);
    }
    free(text);
    return 0;
}
