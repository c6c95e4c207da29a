/* Lending the GPU placement's scratch, or its whole budget, between steps (exec_lend.h). */
#include "exec/exec_lend.h"

#include <string.h>

#include "core/timer.h"
#include "exec/exec_gpu_internal.h"

static void add(struct exec_gpu_loan *l, void *base, size_t bytes) {
    if (!base || !bytes || l->n_regions == EXEC_LOAN_REGIONS) return;
    l->regions[l->n_regions++] = (struct cuda_region){base, bytes};
}

/* By address, then regions that touch made one (the slots follow each other, say). */
static void merge(struct exec_gpu_loan *l) {
    for (uint32_t i = 1; i < l->n_regions; i++) /* insertion sort: a handful */
        for (uint32_t j = i; j > 0 && l->regions[j].base < l->regions[j - 1].base; j--) {
            const struct cuda_region t = l->regions[j];
            l->regions[j] = l->regions[j - 1], l->regions[j - 1] = t;
        }
    uint32_t n = 0;
    for (uint32_t i = 0; i < l->n_regions; i++) {
        if (n && l->regions[n - 1].base + l->regions[n - 1].bytes == l->regions[i].base) l->regions[n - 1].bytes += l->regions[i].bytes;
        else l->regions[n++] = l->regions[i];
    }
    l->n_regions = n;
    l->bytes = 0;
    for (uint32_t i = 0; i < n; i++) l->bytes += l->regions[i].bytes;
}

/* Whether g's memory can be lent now (the GPU placement, its arena carved for a plan), the device
 * idle once it can. */
static pshard_status lendable(struct exec_gpu *g) {
    if (!g) return core_fail(PSHARD_ERR_UNSUPPORTED, "no GPU placement to lend memory from");
    if (g->broken || g->cells_down || !g->arena.base)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "the GPU's memory is not carved for a plan now");
    CORE_TRY(cuda_stream_sync(g->stream));
    return g->copy ? cuda_stream_sync(g->copy) : PSHARD_OK;
}

pshard_status exec_gpu_lend(struct exec_ctx *ctx, struct exec_gpu_loan *out) {
    memset(out, 0, sizeof *out);
    struct exec_gpu *g = ctx->gpu;
    CORE_TRY(lendable(g));
    out->cuda = g->cuda;
    add(out, g->work, g->work_bytes);
    /* carve_activations carves from x on, one buffer after another, and measures the span */
    add(out, g->x, g->report.activation_bytes);
    for (uint32_t s = 0; s < PLAN_STAGING_SLOTS && s < ctx->active->n_slots; s++) add(out, g->slot[s], ctx->active->slot_bytes);
    add(out, g->arena.base + g->arena.used, g->arena.size - g->arena.used);
    merge(out);
    return PSHARD_OK;
}

void exec_gpu_lend_end(struct exec_ctx *ctx) {
    struct exec_gpu *g = ctx->gpu;
    if (!g) return;
    g->lent_ready = false; /* the slots held lent units */
    g->rope_ready = false;
}

/* cuBLAS's workspace stays where every plan carves it first: at the arena's start. */
static size_t blas_bytes(void) { return cuda_align(CUDA_BLAS_WORKSPACE_BYTES); }

uint64_t exec_gpu_lend_all_bytes(const struct exec_ctx *ctx, uint64_t *reupload_bytes) {
    const struct exec_gpu *g = ctx->gpu;
    *reupload_bytes = 0;
    if (!g || g->broken || g->cells_down || g->arena.size <= blas_bytes()) return 0;
    *reupload_bytes = g->report.weight_bytes;
    return g->arena.size - blas_bytes();
}

pshard_status exec_gpu_lend_all(struct exec_ctx *ctx, struct exec_gpu_loan *out) {
    memset(out, 0, sizeof *out);
    struct exec_gpu *g = ctx->gpu;
    CORE_TRY(lendable(g));
    const double t0 = core_now_ms();
    CORE_TRY(kv_cache_add_host_storage(&ctx->kv));
    CORE_TRY(exec_gpu_empty(ctx));
    g->lent_all = true;
    void *blas;
    pshard_status st = cuda_arena_alloc(&g->arena, CUDA_BLAS_WORKSPACE_BYTES, "cublas", &blas);
    if (st == PSHARD_OK) st = cuda_ctx_set_blas_workspace(g->cuda, blas, CUDA_BLAS_WORKSPACE_BYTES);
    if (st != PSHARD_OK) {
        (void)exec_gpu_lend_all_end(ctx); /* (the plan back, as far as it goes) */
        return st;
    }
    out->cuda = g->cuda;
    add(out, g->arena.base + g->arena.used, g->arena.size - g->arena.used);
    merge(out);
    g->report.whole_loan_ms += core_now_ms() - t0;
    return PSHARD_OK;
}

pshard_status exec_gpu_lend_all_end(struct exec_ctx *ctx) {
    struct exec_gpu *g = ctx->gpu;
    if (!g || !g->lent_all) return PSHARD_OK;
    const double t0 = core_now_ms();
    CORE_TRY(cuda_stream_sync(g->stream)); /* (the borrower's work is over: nothing of it overlaps the copies) */
    if (g->copy) CORE_TRY(cuda_stream_sync(g->copy));
    g->lent_all = false;
    cuda_arena_reset(&g->arena, 0);
    CORE_TRY(exec_gpu_fill(ctx));
    g->report.whole_loans++;
    g->report.whole_loan_ms += core_now_ms() - t0;
    return PSHARD_OK;
}
