/* pshard command-line tool: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "pshard.h"

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: pshard <command> [options]\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("pshard %s\n", PSHARD_VERSION);
        return 0;
    }
    fprintf(stderr, "pshard: unknown command '%s'\n", argv[1]);
    return 2;
}
