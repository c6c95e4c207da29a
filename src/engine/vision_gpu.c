/* Images encoded on the GPU between steps: in the executor's lent scratch where the encoding fits
 * there, else in the whole budget, the language model's memory carved again after (VLMOpt's two
 * phases); else on the CPU (engine/vision_gpu.h). */
#include "engine/vision_gpu.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/engine_internal.h"
#include "exec/exec_lend.h"

/* Encode in the loan taken (its regions placing `layout`), then give it back. */
static pshard_status encode_in(pshard_ctx *ctx, struct vision_gpu *gpu, const struct vision_patches *p,
                               const struct vision_gpu_layout *layout, const struct exec_gpu_loan *loan,
                               enum vision_gpu_memory where, const struct vision_progress *progress,
                               struct vision_embeddings *out) {
    const pshard_status st = vision_encode_gpu(gpu, p, layout, loan->cuda, loan->regions, progress, out);
    if (where == VISION_GPU_IN_SCRATCH) {
        exec_gpu_lend_end(ctx->exec);
        return st;
    }
    const pshard_status back = exec_gpu_lend_all_end(ctx->exec);
    if (back != PSHARD_OK && st == PSHARD_OK)
        return core_fail_context(back, "carving the language model's memory again after encoding an image in the whole "
                                 "budget");
    return st;
}

/* The GPU's encoding, or a status saying why it could not start (nothing was computed then). */
static pshard_status on_gpu(pshard_ctx *ctx, const struct mmproj *m, struct vision_gpu **gpu, const struct vision_patches *p,
                            const struct vision_progress *progress, struct vision_embeddings *out, bool *started,
                            enum vision_gpu_memory *where) {
    *started = false;
    struct exec_gpu_loan loan;
    CORE_TRY(exec_gpu_lend(ctx->exec, &loan));
    if (!*gpu) CORE_TRY(vision_gpu_create(m, gpu));
    uint64_t reupload = 0;
    const uint64_t whole = exec_gpu_lend_all_bytes(ctx->exec, &reupload);
    struct vision_windows win;
    CORE_TRY(vision_windows_make(&m->hp, p->grid_h, p->grid_w, &win));
    struct vision_gpu_layout layout;
    pshard_status st = vision_gpu_choose(m, &win, true, loan.regions, loan.n_regions, whole, &layout, where);
    if (st == PSHARD_OK && *where == VISION_GPU_IN_BUDGET) {
        LOG_W("the image (%ux%u) needs %.1f MB of VRAM and %.1f MB is lent between steps: encoding in the whole budget "
              "(%.1f MB); the model's resident weights go up again after, ~%.0f MB", p->width, p->height,
              layout.peak_bytes / 1048576.0, loan.bytes / 1048576.0, whole / 1048576.0, reupload / 1048576.0);
        st = exec_gpu_lend_all(ctx->exec, &loan);
        /* (the same layout, placed in the region the loan really is) */
        if (st == PSHARD_OK) st = vision_gpu_plan(m, &win, loan.regions, loan.n_regions, &layout);
        if (st != PSHARD_OK) (void)exec_gpu_lend_all_end(ctx->exec);
    }
    vision_windows_free(&win);
    if (st != PSHARD_OK) *where = VISION_GPU_NONE;
    CORE_TRY(st);
    *started = true;
    return encode_in(ctx, *gpu, p, &layout, &loan, *where, progress, out);
}

pshard_status engine_vision_encode(pshard_ctx *ctx, const struct mmproj *m, struct threadpool *pool, struct vision_gpu **gpu,
                                   const struct vision_patches *p, const struct vision_progress *progress,
                                   struct vision_embeddings *out, enum vision_gpu_memory *where) {
    *where = VISION_GPU_NONE;
    if (exec_gpu_memory(ctx->exec) && !ctx->params.no_mmproj_offload) {
        bool started;
        const pshard_status st = on_gpu(ctx, m, gpu, p, progress, out, &started, where);
        if (st == PSHARD_OK || started) return st;
        LOG_W("the image (%ux%u) is encoded on the CPU: %s", p->width, p->height, pshard_last_error());
    }
    return vision_encode(m, p, pool, progress, out);
}
