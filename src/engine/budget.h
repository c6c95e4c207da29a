/* Following the device's free memory (budget.c): the rule, apart from the device, so it can be
 * tested without one. */
#ifndef ENGINE_BUDGET_H
#define ENGINE_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

enum {
    FOLLOW_POLL_MS = 200,       /* between checks of the device's free memory (one driver call each) */
    FOLLOW_GROW_HOLD_MS = 1000, /* free memory must stay high this long before it is taken */
};
#define FOLLOW_MIB ((int64_t)1 << 20)
#define FOLLOW_SHRINK_SLACK (64 * FOLLOW_MIB) /* free memory this far below the keep: cut */
#define FOLLOW_GROW_STEP (512 * FOLLOW_MIB)   /* this far above it, for FOLLOW_GROW_HOLD_MS: grow */

/* The budget to take now, holding `held` with free_bytes free and keep_bytes to leave: held + free
 * - keep (whole MiB down, at least 1 MiB) at once when that is more than FOLLOW_SHRINK_SLACK below
 * held; that too when it has been more than FOLLOW_GROW_STEP above held for FOLLOW_GROW_HOLD_MS
 * (*grow_since_ms: since when, 0 when not; unless the model fits `held` whole); else held. */
int64_t engine_follow_target(int64_t held, uint64_t free_bytes, int64_t keep_bytes, bool fits_whole, double now_ms,
                             double *grow_since_ms);

#endif
