/* Lending the GPU placement's scratch between steps (exec_lend.h). */
#include "exec/exec_lend.h"

#include <string.h>

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

pshard_status exec_gpu_lend(struct exec_ctx *ctx, struct exec_gpu_loan *out) {
    memset(out, 0, sizeof *out);
    struct exec_gpu *g = ctx->gpu;
    if (!g) return core_fail(PSHARD_ERR_UNSUPPORTED, "no GPU placement to lend memory from");
    if (g->broken || g->cells_down || !g->arena.base)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "the GPU's memory is not carved for a plan now");
    CORE_TRY(cuda_stream_sync(g->stream));
    if (g->copy) CORE_TRY(cuda_stream_sync(g->copy));
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
