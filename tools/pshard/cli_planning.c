/* The planning options that run (and chat, batch, serve), eval, plan and bench --batch share, parsed in one
 * place so each command takes the same spellings and says the same things about a bad value. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_planning_option(const char *cmd, int argc, char **argv, int *i, bool budget_auto, pshard_params *p) {
    const char *a = argv[*i];
    const bool known = !strcmp(a, "--vram-budget") || !strcmp(a, "--plan") || !strcmp(a, "--stream-share") ||
                       !strcmp(a, "--set") || !strcmp(a, "--decode-set");
    if (!known) return 0;
    if (*i + 1 >= argc) return cli_needs_value(cmd, a);
    const char *v = argv[++*i];
    if (!strcmp(a, "--vram-budget")) {
        if (!budget_auto) return cli_size(cmd, a, v, &p->vram_budget) ? -1 : 1;
        int64_t keep = 0;
        int follow = 0;
        if (!cli_vram_budget(v, &p->vram_budget, &follow, &keep)) {
            fprintf(stderr, "pshard %s: %s takes a size such as 2G, 1536M or 0, or auto[:keep=SIZE], got '%s'\n", cmd, a, v);
            return -1;
        }
        p->vram_follow = follow, p->vram_keep = keep;
        return 1;
    }
    if (!strcmp(a, "--stream-share")) {
        double x;
        if (cli_real(cmd, a, v, 0, 1, false, &x)) return -1;
        p->stream_share = (float)x;
        return 1;
    }
    pshard_status st = !strcmp(a, "--plan") ? pshard_parse_plan_family(v, &p->plan)
                       : !strcmp(a, "--set") ? pshard_parse_resident_set(v, &p->resident_set)
                                             : pshard_parse_decode_set(v, &p->decode_set);
    if (st != PSHARD_OK) {
        fprintf(stderr, "pshard %s: %s: %s\n", cmd, a, pshard_last_error());
        return -1;
    }
    return 1;
}
