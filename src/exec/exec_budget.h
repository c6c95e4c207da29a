/* The VRAM budget while a context runs (exec_budget.c): re-planned for a new budget from the
 * parameters and profile the context plans with, and VRAM carved anew between two steps. */
#ifndef EXEC_EXEC_BUDGET_H
#define EXEC_EXEC_BUDGET_H

#include "exec/exec.h"

struct profile;

/* params at another budget, planning with prof (NULL: params' own profile): what a context
 * changing to that budget plans with, and what one opened at it would. */
struct exec_params exec_params_for_budget(const struct exec_params *params, int64_t bytes, const struct profile *prof);
/* exec_make_plan, and where the model fits the budget whole with a MB or more to spare, the plan
 * at what it needs (whole MB up) instead: a budget taken from free memory holds no more. */
pshard_status exec_make_trimmed_plan(const struct model *model, const struct exec_params *params, struct plan *out);
/* The plan a change of the context's budget to `bytes` carves (exec_set_budget's first half):
 * the context's parameters at that budget, planning with prof (NULL: the context's profile). */
pshard_status exec_replan(const struct exec_ctx *ctx, int64_t bytes, const struct profile *prof, bool trim, struct plan *out);
/* Change the budget between steps: planned from the context's parameters and prof (NULL: the
 * profile it plans with; nothing is measured), then VRAM carved anew (exec_gpu_rebudget). A budget
 * the planner refuses (below the model's least, which it names), 0 on the GPU, or one on a context
 * without a GPU fails and changes nothing. With trim, a budget above what the model needs whole
 * comes down to that. */
pshard_status exec_set_budget(struct exec_ctx *ctx, int64_t bytes, const struct profile *prof, bool trim);
/* Ready the context for changes ahead of them (a budget that follows free memory): the host's KV
 * cache made, and on the GPU pinned with the model file registered (exec_gpu_prepare_changes), so
 * a change pays for neither. Nothing without a GPU. */
pshard_status exec_prepare_budget_changes(struct exec_ctx *ctx);
/* The budget the context runs under now (bytes; 0: the CPU alone). */
int64_t exec_budget(const struct exec_ctx *ctx);
/* The device's free and total memory now (both 0 without a GPU). */
pshard_status exec_device_memory(uint64_t *free_bytes, uint64_t *total_bytes);

#endif
