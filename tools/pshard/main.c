/* pshard command-line tool: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "pshard.h"

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"run", cmd_run, "generate a reply to one prompt"},
    {"chat", cmd_chat, "talk with a model interactively"},
    {"batch", cmd_batch, "run many prompts at once (continuous batching)"},
    {"serve", cmd_serve, "serve the model over HTTP: OpenAI's API and a chat page"},
    {"plan", cmd_plan, "show where each shard would run under a VRAM budget, and why"},
    {"profile", cmd_profile, "measure this machine for the planner (under a minute; cached)"},
    {"bench", cmd_bench, "many sequences at once (--batch); the planner's choices against measured times (--oracle)"},
    {"info", cmd_info, "show a model's architecture, tensors and shard list"},
    {"tokenize", cmd_tokenize, "show the token ids of a text"},
    {"eval", cmd_eval, "write the logits of every position of a token sequence (for testing)"},
};

static void print_usage(FILE *out) {
    fprintf(out, "pshard %s - run large language models within a VRAM budget\n\nusage: pshard <command> [options]\n\ncommands:\n",
            PSHARD_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n'pshard <command> --help' shows a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("pshard %s\n", PSHARD_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "pshard: unknown command '%s'\n", argv[1]);
    print_usage(stderr);
    return 2;
}
