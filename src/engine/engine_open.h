/* Opening a context with some of the planner's and the executor's ideas turned off
 * (struct plan_options), for the tools that compare placements; pshard_open is this with none. */
#ifndef ENGINE_OPEN_H
#define ENGINE_OPEN_H

#include "plan/plan.h"
#include "pshard.h"

/* As pshard_open, its plans and steps following options (zeroed: pshard_open's). */
pshard_status engine_open(const pshard_params *params, const struct plan_options *options, pshard_ctx **out);

/* The planning options of params (--vram-budget, --plan, --stream-share, --set, --decode-set) as the
 * executor's parameters take them; the rest of ep is left as it is. pshard_open's and `pshard plan`'s
 * one reading of them. */
struct exec_params;
void engine_planning_params(const pshard_params *params, struct exec_params *ep);

#endif
