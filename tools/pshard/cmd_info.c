/* `pshard info MODEL`: what a model file holds and the shard list the planner works with. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard info [-m] [MODEL.gguf] [--no-shards] [--metadata] [--tensors]\n"
                 "  Prints architecture, hyperparameters, tensor types and sizes, and the shard list;\n"
                 "  for a vision encoder (mmproj) file, its image, patch, layer and projector settings.\n"
                 "  --metadata  also every metadata key with its type and value (arrays: length and first items)\n"
                 "  --tensors   also every tensor: name, type, shape, byte offset in its file, bytes\n"
                 "  Without MODEL, the default model is used.\n");
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    unsigned flags = PSHARD_DESCRIBE_SHARDS;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--no-shards")) {
            flags &= ~(unsigned)PSHARD_DESCRIBE_SHARDS;
        } else if (!strcmp(argv[i], "--metadata")) {
            flags |= PSHARD_DESCRIBE_METADATA;
        } else if (!strcmp(argv[i], "--tensors")) {
            flags |= PSHARD_DESCRIBE_TENSORS;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            path = argv[++i];
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else if (argv[i][0] == '-') {
            cli_refuse("info", argv[i], "-m");
            print_usage(stderr);
            return 2;
        } else {
            fprintf(stderr, "pshard info: unexpected argument '%s' (one model at a time)\n", argv[i]);
            print_usage(stderr);
            return 2;
        }
    }
    char default_path[4096];
    if (!path) {
        if (cli_default_model(default_path, sizeof default_path) != 0) return 1;
        path = default_path;
    }
    if (pshard_describe(path, flags, stdout) != PSHARD_OK) {
        fflush(stdout); /* what could be written comes before why the rest could not */
        fprintf(stderr, "pshard info: %s\n", pshard_last_error());
        return 1;
    }
    return 0;
}
