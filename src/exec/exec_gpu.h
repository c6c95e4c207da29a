/* GPU placement of the executor: every shard resident in VRAM (the all-in-VRAM plan). One
 * device arena of a computed size holds the weights, the KV cache, activations, per-step work
 * buffers and cuBLAS's workspace; nothing else allocates device memory. Built on the CUDA
 * backend's C interface (src/cuda/cuda_backend.h); in a build without CUDA creation fails with
 * a clear message. */
#ifndef EXEC_GPU_H
#define EXEC_GPU_H

#include <stdint.h>

#include "cuda/cuda_backend.h"

struct exec_ctx;
struct exec_batch;
struct plan;

/* Device memory breakdown, for the load report. */
struct gpu_memory_report {
    uint64_t context_bytes; /* CUDA context + cuBLAS handle, outside the arena */
    uint64_t arena_bytes;
    uint64_t weight_bytes, kv_bytes, activation_bytes, work_bytes, staging_bytes;
    uint64_t mapping_bytes; /* measured: what registering the model file took, inside the budget */
    uint32_t switches;      /* changes of phase so far (plan.decode) */
    double switch_ms;       /* the time they took, all together */
    uint32_t budget_changes; /* changes of budget carved so far (exec_gpu_rebudget) */
    double budget_free_ms;   /* the last one: from the call (planning too) until the old arena was freed */
    double budget_change_ms; /* the last one, until steps went on: the new arena carved and filled too
                                (a rise: its resident matrices still being copied up) */
    double budget_weights_ms; /* the last rise: from the call until its resident matrices were in VRAM
                                 and steps read them there (0 while they are on their way) */
    /* The last change's parts: planning (from the call), the host's KV cache pinned where it was
     * not, the new arena allocated (the file mapped where it was not), and its plan carved with
     * the KV cells copied up; with the freeing (budget_free_ms less the planning), about the whole */
    double budget_plan_ms, budget_pin_ms, budget_arena_ms, budget_fill_ms;
    uint32_t whole_loans;    /* loans of the whole budget so far (exec_gpu_lend_all: the vision encoder) */
    double whole_loan_ms;    /* their cost to the language model, all together: its cells down, and
                                its plan carved again after (resident weights and cells copied up) */
};

struct exec_gpu;

struct model;
struct model_weights;
struct exec_params;
struct plan_gpu_costs;

/* What the GPU side needs besides weights and KV, for these shapes (the planner's input). */
pshard_status exec_gpu_costs(const struct model *model, const struct model_weights *w, const struct exec_params *p,
                             struct plan_gpu_costs *out);

/* Carve an arena of exactly the plan's budget and upload the resident shards' weights. */
pshard_status exec_gpu_create(struct exec_ctx *ctx, struct exec_gpu **out);
void exec_gpu_free(struct exec_gpu *gpu);
/* Carve the arena anew for plan `to` (a change of phase, plan.decode): the cached KV cells of the
 * layers in VRAM go to the host's cache, `to`'s resident weights are copied up, then the KV
 * cells of the layers `to` keeps in VRAM. Between steps; afterwards ctx->active is `to`. */
pshard_status exec_gpu_switch(struct exec_ctx *ctx, const struct plan *to);
/* Carve VRAM for another budget's plan `next` (taken over: ctx->plan becomes it, `next` is left
 * empty), between steps: the KV cells of the layers in VRAM go to the host's cache (which must
 * exist), the arena is freed (its memory back to the driver), the file's mapping follows whether
 * `next` streams, a new arena of `next`'s budget is carved, its resident weights copied up and its
 * layers' cells after them. The report times the free and the whole from t0 (core_now_ms when
 * the change was asked). Synchronous: steps wait for all of it. Where the new arena cannot be had
 * (another program took the memory), the cells stay on the host and steps are refused until a
 * change that fits. */
pshard_status exec_gpu_rebudget(struct exec_ctx *ctx, struct plan *next, double t0);
/* Ready for changes of budget ahead of them (a budget that follows free memory): the host's KV
 * cache (which must exist) pinned, and the model file registered whatever the plan, so a change
 * to a plan that streams does not wait for that (seconds for tens of GB). While no phase streams,
 * the driver's mapping of the file (about 2 MB a GB) is then outside the budget. */
pshard_status exec_gpu_prepare_changes(struct exec_ctx *ctx);
/* Zero a sequence's blocks in VRAM (benchmarks that time steps at a context they did not compute). */
pshard_status exec_gpu_clear_kv(struct exec_ctx *ctx, int32_t seq);
/* Cells [0, n_cells) of KV block src copied into block dst in VRAM, every layer whose cache is
 * there (a shared prefix's last block, a copy on write); in order with the steps after it. */
pshard_status exec_gpu_copy_cells(struct exec_ctx *ctx, int32_t dst, int32_t src, int32_t n_cells);
const struct gpu_memory_report *exec_gpu_report(const struct exec_gpu *gpu);

/* One step following the plan: GPU shards on the GPU, CPU shards on the thread pool, the
 * activations crossing PCIe where the placement changes; ctx->logits points at the logits (where
 * the GPU has the head, the pinned buffer they came down into). */
pshard_status exec_gpu_step(struct exec_ctx *ctx, const struct exec_batch *batch);

#endif
