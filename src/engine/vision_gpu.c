/* Images encoded on the GPU between steps, in the executor's lent scratch (engine/vision_gpu.h). */
#include "engine/vision_gpu.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/engine_internal.h"
#include "exec/exec_lend.h"

/* The GPU's encoding, or a status saying why it could not start (nothing was computed then). */
static pshard_status on_gpu(pshard_ctx *ctx, const struct mmproj *m, struct vision_gpu **gpu, const struct vision_patches *p,
                            const struct vision_progress *progress, struct vision_embeddings *out, bool *started) {
    *started = false;
    struct exec_gpu_loan loan;
    CORE_TRY(exec_gpu_lend(ctx->exec, &loan));
    if (!*gpu) CORE_TRY(vision_gpu_create(m, gpu));
    struct vision_windows win;
    CORE_TRY(vision_windows_make(&m->hp, p->grid_h, p->grid_w, &win));
    struct vision_gpu_layout layout;
    pshard_status st = vision_gpu_plan(m, &win, loan.regions, loan.n_regions, &layout);
    vision_windows_free(&win);
    CORE_TRY(st);
    *started = true;
    st = vision_encode_gpu(*gpu, p, &layout, loan.cuda, loan.regions, progress, out);
    exec_gpu_lend_end(ctx->exec);
    return st;
}

pshard_status engine_vision_encode(pshard_ctx *ctx, const struct mmproj *m, struct threadpool *pool, struct vision_gpu **gpu,
                                   const struct vision_patches *p, const struct vision_progress *progress,
                                   struct vision_embeddings *out) {
    if (exec_gpu_memory(ctx->exec) && vision_gpu_wanted()) {
        bool started;
        const pshard_status st = on_gpu(ctx, m, gpu, p, progress, out, &started);
        if (st == PSHARD_OK || started) return st;
        LOG_W("the image (%ux%u) is encoded on the CPU: %s", p->width, p->height, pshard_last_error());
    }
    return vision_encode(m, p, pool, progress, out);
}
