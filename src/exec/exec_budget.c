/* The VRAM budget changed while a context runs: the planner's choice for the new budget, from the
 * parameters and the profile the context plans with (nothing is measured), then VRAM carved anew
 * for it between two steps (exec_gpu_rebudget). */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "exec/exec_budget.h"
#include "exec/exec_gpu.h"
#include "exec/exec_internal.h"

struct exec_params exec_params_for_budget(const struct exec_params *params, int64_t bytes, const struct profile *prof) {
    struct exec_params p = *params;
    p.vram_budget = bytes;
    if (prof) p.profile = prof;
    return p;
}

pshard_status exec_make_trimmed_plan(const struct model *model, const struct exec_params *params, struct plan *out) {
    CORE_TRY(exec_make_plan(model, params, out));
    const uint64_t used = out->budget.total - out->budget.free, mb = 1 << 20;
    if (out->n_candidates || !out->any_gpu || out->budget.free < mb || params->vram_budget <= 0) return PSHARD_OK;
    plan_free(out);
    struct exec_params p = *params;
    p.vram_budget = (int64_t)((used + mb - 1) / mb * mb);
    return exec_make_plan(model, &p, out);
}

pshard_status exec_replan(const struct exec_ctx *ctx, int64_t bytes, const struct profile *prof, bool trim, struct plan *out) {
    if (bytes < 0) return core_fail(PSHARD_ERR_INVALID_ARG, "a VRAM budget of %lld bytes: it must not be negative", (long long)bytes);
    const struct exec_params p = exec_params_for_budget(&ctx->params, bytes, prof);
    return trim ? exec_make_trimmed_plan(ctx->model, &p, out) : exec_make_plan(ctx->model, &p, out);
}

pshard_status exec_set_budget(struct exec_ctx *ctx, int64_t bytes, const struct profile *prof, bool trim) {
    if (bytes == 0 && ctx->gpu)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "a budget of 0 (the CPU alone) cannot be set while the context runs on "
                         "the GPU: open it with budget 0 for that");
    const double t0 = core_now_ms(); /* (the change's times count its planning too) */
    struct plan next;
    CORE_TRY(exec_replan(ctx, bytes, prof, trim, &next));
    if (!ctx->gpu) {
        const bool gpu = next.any_gpu;
        plan_free(&next);
        if (!gpu) return PSHARD_OK; /* (a budget of 0 on the CPU: nothing changes) */
        return core_fail(PSHARD_ERR_UNSUPPORTED, "the context runs on the CPU alone (opened with budget 0, --plan cpu or "
                         "without a GPU): its VRAM budget cannot change");
    }
    if (!next.any_gpu) { /* (the executor on the GPU runs plans with some GPU shards only) */
        plan_free(&next);
        return core_fail(PSHARD_ERR_RANGE, "at a VRAM budget of %.0f MB the planner runs everything on the CPU (faster "
                         "there than any plan with the GPU); a context on the GPU changes only to budgets where some "
                         "shard runs there: give more", bytes / 1048576.0);
    }
    pshard_status st = kv_cache_add_host_storage(&ctx->kv);
    if (st == PSHARD_OK) st = exec_gpu_rebudget(ctx, &next, t0);
    if (next.n_shards == 0) { /* taken: the context follows the new plan, carved or not */
        ctx->params.vram_budget = (int64_t)ctx->plan.budget.total;
        if (prof) ctx->params.profile = prof;
    } else {
        plan_free(&next);
    }
    return st;
}

pshard_status exec_prepare_budget_changes(struct exec_ctx *ctx) {
    if (!ctx->gpu) return PSHARD_OK;
    CORE_TRY(kv_cache_add_host_storage(&ctx->kv));
    return exec_gpu_prepare_changes(ctx);
}

int64_t exec_budget(const struct exec_ctx *ctx) {
    if (ctx->params.vram_budget >= 0 || !ctx->plan.any_gpu) return ctx->params.vram_budget > 0 ? ctx->params.vram_budget : 0;
    return (int64_t)ctx->plan.budget.total; /* (--gpu: what the plan needs) */
}

pshard_status exec_device_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    return cuda_device_count() > 0 ? cuda_device_memory(free_bytes, total_bytes) : PSHARD_OK;
}
