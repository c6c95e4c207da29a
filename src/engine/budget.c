/* The VRAM budget while a context runs: set by the caller, or following the device's free memory
 * (another program, a game, takes and gives back memory), checked at step boundaries at most every
 * poll interval. The executor re-plans and carves (exec_set_budget). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/budget.h"
#include "engine/engine_internal.h"
#include "exec/exec_budget.h"
#include "exec/exec_gpu.h"
#include "measure/measure.h"

static const int64_t FOLLOW_KEEP_DEFAULT = 1ll << 30;

pshard_status pshard_parse_vram_budget(const char *text, int64_t *bytes, int *follow, int64_t *keep_bytes) {
    if (!text || !bytes || !follow || !keep_bytes) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_parse_vram_budget: a NULL argument");
    *bytes = 0, *follow = 0, *keep_bytes = FOLLOW_KEEP_DEFAULT;
    if (strncmp(text, "auto", 4) != 0) return plan_parse_size(text, bytes);
    const char *rest = text + 4;
    if (!*rest) {
        *follow = 1;
        return PSHARD_OK;
    }
    if (strncmp(rest, ":keep=", 6) != 0 || !rest[6])
        return core_fail(PSHARD_ERR_INVALID_ARG, "VRAM budget '%.64s': want a size (4G, 4096M, 0) or auto[:keep=SIZE]", text);
    int64_t keep;
    pshard_status st = plan_parse_size(rest + 6, &keep);
    if (st != PSHARD_OK) return core_fail_context(st, "VRAM budget '%.64s', the memory auto leaves to other programs", text);
    if (keep == 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "VRAM budget '%.64s': keep must be more than 0 (without keep=, 1G is kept)", text);
    *follow = 1, *keep_bytes = keep;
    return PSHARD_OK;
}

/* The profile a change plans with: the context's, or the cached one where the context planned
 * without any (it fit its budget whole); never measured here. */
static const struct profile *planning_profile(pshard_ctx *ctx) {
    if (exec_get_params(ctx->exec)->profile || ctx->params.no_profile || ctx->params.plan != PSHARD_PLAN_AUTO) return NULL;
    bool measured_now;
    if (measure_machine_profile(&ctx->model, ctx->params.n_threads, 0, PROFILE_CACHED, NULL, NULL, &ctx->profile,
                             &measured_now) != PSHARD_OK)
        return NULL;
    return &ctx->profile;
}

static pshard_status change(pshard_ctx *ctx, int64_t bytes, bool trim) {
    const pshard_status st = exec_set_budget(ctx->exec, bytes, planning_profile(ctx), trim);
    if (st == PSHARD_OK) ctx->params.vram_budget = exec_budget(ctx->exec);
    return st;
}

pshard_status pshard_set_vram_budget(pshard_ctx *ctx, int64_t bytes) {
    if (!ctx) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_set_vram_budget: no context");
    CORE_TRY(change(ctx, bytes, false));
    ctx->follow = false;
    return PSHARD_OK;
}

pshard_status pshard_follow_free_vram(pshard_ctx *ctx, int64_t keep_bytes) {
    if (!ctx) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_follow_free_vram: no context");
    if (keep_bytes < 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "the memory left to other programs, %lld bytes, must not be negative",
                         (long long)keep_bytes);
    if (!exec_gpu_memory(ctx->exec))
        return core_fail(PSHARD_ERR_UNSUPPORTED, "the context runs on the CPU alone: there is no VRAM budget to follow");
    ctx->follow = true;
    ctx->keep = keep_bytes ? keep_bytes : FOLLOW_KEEP_DEFAULT;
    ctx->polled_ms = ctx->grow_since_ms = 0;
    return engine_budget_poll(ctx, true);
}

int64_t engine_follow_target(int64_t held, uint64_t free_bytes, int64_t keep, bool fits_whole, double now_ms,
                             double *grow_since_ms) {
    const int64_t want = (held + (int64_t)free_bytes - keep) / FOLLOW_MIB * FOLLOW_MIB;
    if (want < held - FOLLOW_SHRINK_SLACK) {
        *grow_since_ms = 0;
        return want > 0 ? want : FOLLOW_MIB;
    }
    if (want <= held + FOLLOW_GROW_STEP || fits_whole) {
        *grow_since_ms = 0;
        return held;
    }
    if (!*grow_since_ms) *grow_since_ms = now_ms;
    return now_ms - *grow_since_ms >= FOLLOW_GROW_HOLD_MS ? want : held;
}

static int64_t follow_target(pshard_ctx *ctx, double now_ms) {
    const int64_t held = exec_budget(ctx->exec);
    uint64_t free_bytes = 0, total = 0;
    if (exec_device_memory(&free_bytes, &total) != PSHARD_OK) return held;
    const struct plan *plan = exec_get_plan(ctx->exec);
    return engine_follow_target(held, free_bytes, ctx->keep, plan->n_candidates == 0 && plan->any_gpu, now_ms,
                                &ctx->grow_since_ms);
}

pshard_status engine_budget_poll(pshard_ctx *ctx, bool now) {
    if (!ctx->follow) return PSHARD_OK;
    const double t = core_now_ms();
    const int32_t every = ctx->params.vram_poll_ms > 0 ? ctx->params.vram_poll_ms : FOLLOW_POLL_MS;
    if (!now && t - ctx->polled_ms < every) return PSHARD_OK;
    ctx->polled_ms = t;
    int64_t held = exec_budget(ctx->exec), target = follow_target(ctx, t);
    if (target == held) return PSHARD_OK;
    pshard_status st = change(ctx, target, true);
    /* The memory went elsewhere before the new arena was had (the cells wait on the host): take
     * what is free now instead. */
    for (int retry = 0; st != PSHARD_OK && st != PSHARD_ERR_RANGE && retry < 2 && exec_gpu_memory(ctx->exec); retry++) {
        held = exec_budget(ctx->exec), target = follow_target(ctx, t);
        if (target >= held) target = held - FOLLOW_SHRINK_SLACK;
        st = change(ctx, target, true);
    }
    if (st == PSHARD_ERR_RANGE && target < held) { /* below the model's least: hold there, say so once */
        if (!ctx->floor_warned) LOG_W("following free VRAM: %s; staying at %.0f MB", pshard_last_error(), held / 1048576.0);
        ctx->floor_warned = true;
        return PSHARD_OK;
    }
    if (st == PSHARD_OK) ctx->floor_warned = false, ctx->grow_since_ms = 0;
    return st;
}

void engine_budget_step(pshard_ctx *ctx) {
    if (ctx->follow && engine_budget_poll(ctx, false) != PSHARD_OK) LOG_W("following free VRAM: %s", pshard_last_error());
}

pshard_status pshard_budget_poll(pshard_ctx *ctx) {
    if (!ctx) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_budget_poll: no context");
    return engine_budget_poll(ctx, false);
}

void engine_budget_info(const pshard_ctx *ctx, pshard_info *info) {
    info->vram_budget = exec_budget(ctx->exec);
    info->vram_follow = ctx->follow;
    info->vram_keep = ctx->follow ? ctx->keep : 0;
    const struct gpu_memory_report *vram = exec_gpu_memory(ctx->exec);
    if (!vram) return;
    info->budget_changes = (int32_t)vram->budget_changes;
    info->budget_free_ms = vram->budget_free_ms;
    info->budget_change_ms = vram->budget_change_ms;
    info->budget_weights_ms = vram->budget_weights_ms;
    info->budget_plan_ms = vram->budget_plan_ms;
    info->budget_pin_ms = vram->budget_pin_ms;
    info->budget_arena_ms = vram->budget_arena_ms;
    info->budget_fill_ms = vram->budget_fill_ms;
}
