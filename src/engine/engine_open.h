/* Opening a context with some of the planner's and the executor's ideas turned off
 * (struct plan_options), for the tools that compare placements; pshard_open is this with none. */
#ifndef ENGINE_OPEN_H
#define ENGINE_OPEN_H

#include "plan/plan.h"
#include "pshard.h"

/* As pshard_open, its plans and steps following options (zeroed: pshard_open's). */
pshard_status engine_open(const pshard_params *params, const struct plan_options *options, pshard_ctx **out);

#endif
