/* The comparison switches on their way to the engine: the one place a command that runs a model
 * (run, eval) opens it with some of the planner's and the executor's ideas turned off. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

struct cli_switches {
    struct plan_options options;
};

struct cli_switches *cli_switches_read(const char *cmd) {
    struct cli_switches *s = malloc(sizeof *s);
    if (!s) {
        fprintf(stderr, "pshard %s: out of memory\n", cmd);
        return NULL;
    }
    if (cli_plan_options(&s->options) != PSHARD_OK) {
        fprintf(stderr, "pshard %s: %s\n", cmd, pshard_last_error());
        free(s);
        return NULL;
    }
    return s;
}

pshard_status cli_open(const pshard_params *params, const struct cli_switches *switches, pshard_ctx **out) {
    return switches ? engine_open(params, &switches->options, out) : pshard_open(params, out);
}
