/* The vision encoder's phase priced from the profile (cost_vision.h). The GPU's encoding is walked
 * as encoder_gpu.c runs it: its units (the patch kernel, each block, the merger) copied up on the
 * copy stream into two slots (or one), each computed once its copy is in, a slot refilled once
 * the unit before in it is computed, and the merger taking every slot after the last block. */
#include "plan/cost_vision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "plan/cost.h"
#include "quant/types.h"
#include "vision/preprocess.h"

/* What the GPU's encoder launches besides its products (encoder_gpu.c), for the cost of small
 * kernels and launches: per chunk of a block two RMS norms, seven bias adds, two residual adds and
 * SwiGLU; per block the two rotary turns and the attention; per chunk of the merger a norm, two
 * bias adds and GELU. A product (cuda_matmul) is two launches: the activations' conversion, then
 * the product. */
enum { BLOCK_CHUNK_SMALL = 12, BLOCK_SMALL = 2, BLOCK_MATRICES = 7, MERGER_CHUNK_SMALL = 4, PRODUCT_OPS = 2 };

uint32_t cost_vision_lendable(const struct plan *p, struct cuda_region out[COST_VISION_REGIONS]) {
    if (!p->any_gpu) return 0;
    const struct plan_budget *b = &p->budget;
    /* As the executor lends them (exec_gpu_lend): the step's buffers, not the budget's activations,
     * whose margin no carving takes stays at the arena's end with what the budget leaves free. */
    const bool split = b->buffers && b->buffers + b->margin <= b->activations;
    const uint64_t sizes[COST_VISION_REGIONS] = {b->work, split ? b->buffers : b->activations, b->staging,
                                                 b->free + (split ? b->margin : 0)};
    uint32_t n = 0;
    for (int i = 0; i < COST_VISION_REGIONS; i++)
        if (sizes[i]) out[n++] = (struct cuda_region){NULL, (size_t)sizes[i]};
    return n;
}

uint64_t cost_vision_whole(const struct plan *p) {
    if (!p->any_gpu) return 0;
    uint64_t mapping = p->budget.mapping;
    if (p->decode && p->decode->budget.mapping > mapping) mapping = p->decode->budget.mapping;
    const uint64_t blas = cuda_align(p->budget.blas); /* (kept at the arena's start) */
    return p->budget.total > mapping + blas ? p->budget.total - mapping - blas : 0;
}

/* A product of a weight matrix of `bytes` with n rows (patches, or merged tokens) at a rate
 * table's rate for its format (cost_rate: the slowest row where the format was not measured). The
 * rates are per weight byte of a step of n tokens, measured up to 1024; past that a product takes
 * time in proportion to its rows, at the rate per row of 1024. */
static double product_s(const struct profile_rate table[PROFILE_FORMATS], uint32_t type, double bytes, double n) {
    const double top = profile_tokens[PROFILE_TOKENS - 1];
    return n <= top ? bytes * cost_rate(table, type, n) : bytes * cost_rate(table, type, top) * n / top;
}

/* Keys each query attends in a window block, on average: the sum of the windows' squared sizes
 * over the patches. */
static double window_cells(const struct vision_windows *w) {
    double sum = 0;
    for (uint32_t k = 0; k < w->n_windows; k++) {
        const double size = w->first[k + 1] - w->first[k];
        sum += size * size;
    }
    return w->n ? sum / w->n : 0;
}

/* Attention of a block: n queries over `cells` keys each, K and V in f32 for every head (no query
 * heads share a KV head here): 8E bytes a key. Neither the GPU's vision kernel (f32 tiles of 64
 * queries) nor the CPU's loop was profiled; the closest figures are the language model's attention
 * rates per KV byte: the GPU's prompt kernel over a cache of that many cells, the CPU's per query
 * head. The CPU's loop also passes over the keys outside a window (without a product), which no
 * figure prices: its window blocks cost more than this at large images. */
static double attention_s(const struct profile *prof, const struct vision_hparams *hp, double n, double cells, bool gpu) {
    const double bytes = n * cells * 8.0 * hp->n_embd;
    return bytes * (gpu ? profile_gpu_attn(prof, n, cells, true) : profile_at_tokens(prof->cpu_attn, n));
}

static void block_matrices(const struct vision_layer *l, const struct gguf_tensor *out[BLOCK_MATRICES]) {
    const struct gguf_tensor *mats[BLOCK_MATRICES] = {l->q_w, l->k_w, l->v_w, l->o_w, l->gate_w, l->up_w, l->down_w};
    memcpy(out, mats, sizeof mats);
}

/* The GPU's compute of each unit (0: the patch embedding, 1..L: the blocks, L + 1: the merger),
 * busy time with its launches, over the chunks of layout l. */
static double gpu_unit_s(const struct profile *prof, const struct mmproj *m, const struct vision_gpu_layout *l,
                         double cells_window, uint32_t unit) {
    const struct vision_hparams *hp = &m->hp;
    const double n = l->n_patches;
    const uint32_t L = hp->n_layer, pd = 3u * VISION_TEMPORAL_PATCH * hp->patch_size * hp->patch_size;
    double compute = 0;
    int small = 0, ops = 0;
    for (uint32_t c = 0; c < l->n_chunks; c++) {
        uint32_t first, rows;
        vision_gpu_chunk(l, c, &first, &rows);
        if (unit == 0) { /* the chunk's patches go up (the profile has pinned copies only; they go
                            from pageable memory, slower), then the patch kernel's f32 product */
            compute += cost_copy_s(prof, 4.0 * rows * pd, true) +
                       product_s(prof->gpu_matmul, QUANT_F32, 4.0 * pd * hp->n_embd, rows);
            ops += 2;
        } else if (unit <= L) {
            const struct gguf_tensor *mats[BLOCK_MATRICES];
            block_matrices(&m->layers[unit - 1], mats);
            for (int i = 0; i < BLOCK_MATRICES; i++)
                compute += product_s(prof->gpu_matmul, mats[i]->type, (double)mats[i]->n_bytes, rows);
            small += BLOCK_CHUNK_SMALL;
            ops += BLOCK_CHUNK_SMALL + BLOCK_MATRICES * PRODUCT_OPS;
        } else { /* the merger: four patches a row, its tokens going down as they are done */
            const double tokens = rows / 4.0;
            compute += product_s(prof->gpu_matmul, m->mm0_w->type, (double)m->mm0_w->n_bytes, tokens) +
                       product_s(prof->gpu_matmul, m->mm2_w->type, (double)m->mm2_w->n_bytes, tokens) +
                       cost_copy_s(prof, 4.0 * tokens * hp->projection_dim, false);
            small += MERGER_CHUNK_SMALL;
            ops += MERGER_CHUNK_SMALL + 2 * PRODUCT_OPS;
        }
    }
    if (unit >= 1 && unit <= L) {
        compute += attention_s(prof, hp, n, hp->full_attention[unit - 1] ? n : cells_window, true);
        small += BLOCK_SMALL;
        ops += BLOCK_SMALL + 1;
    }
    return cost_gpu_busy_s(prof, compute, small, ops, false);
}

/* The GPU's encoding under layout l: the rotary table and the tiles go up first, then each unit
 * is copied as soon as the copy stream and its slot are free and computed once its copy is in. */
static void gpu_encoding(const struct profile *prof, const struct mmproj *m, const struct vision_windows *w,
                         const struct vision_gpu_layout *l, struct cost_vision *out) {
    const struct vision_hparams *hp = &m->hp;
    const uint32_t L = hp->n_layer;
    const double cells_window = window_cells(w);
    double copy_free = 0, slot_free[2] = {0, 0};
    double gpu = cost_copy_s(prof, 4.0 * l->n_patches * hp->head_dim, true) +
                 cost_copy_s(prof, (double)sizeof(struct cuda_vision_tile) * (l->n_window_tiles + l->n_full_tiles), true);
    out->gpu_copy_s = out->gpu_compute_s = 0;
    out->streamed_bytes = 0;
    for (uint32_t unit = 0; unit <= L + 1; unit++) {
        const uint32_t k = l->n_slots > 1 ? unit % 2 : 0;
        const size_t bytes = vision_gpu_unit_bytes(m, unit);
        const double copy = cost_copy_s(prof, (double)bytes, true);
        /* the merger takes every slot: after the last block is computed */
        const double start = fmax(copy_free, unit > L ? gpu : slot_free[k]);
        copy_free = start + copy;
        const double busy = gpu_unit_s(prof, m, l, cells_window, unit);
        gpu = fmax(gpu, copy_free) + busy;
        slot_free[k] = gpu;
        out->gpu_copy_s += copy;
        out->gpu_compute_s += busy;
        out->streamed_bytes += bytes;
    }
    out->gpu_s = prof->has_gpu ? gpu : INFINITY;
}

/* The CPU's encoding (encoder.c): every product over all the patches at once on the thread pool
 * at the profile's CPU rates for its format (the patch embedding as an f32 product: its kernels
 * are made floats first), attention per query head, a pool job per product and attention. Norms,
 * rotary turns and adds, single passes over the rows, are left out (a few percent). */
static double cpu_encoding(const struct profile *prof, const struct mmproj *m, const struct vision_windows *w) {
    const struct vision_hparams *hp = &m->hp;
    const double n = w->n, cells_window = window_cells(w);
    const double pd = 3.0 * VISION_TEMPORAL_PATCH * hp->patch_size * hp->patch_size;
    double s = product_s(prof->cpu_matmul, QUANT_F32, 4.0 * pd * hp->n_embd, n);
    int jobs = 1;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const struct gguf_tensor *mats[BLOCK_MATRICES];
        block_matrices(&m->layers[il], mats);
        for (int i = 0; i < BLOCK_MATRICES; i++) s += product_s(prof->cpu_matmul, mats[i]->type, (double)mats[i]->n_bytes, n);
        s += attention_s(prof, hp, n, hp->full_attention[il] ? n : cells_window, false);
        jobs += BLOCK_MATRICES + 1;
    }
    const double tokens = n / ((double)hp->spatial_merge * hp->spatial_merge);
    s += product_s(prof->cpu_matmul, m->mm0_w->type, (double)m->mm0_w->n_bytes, tokens) +
         product_s(prof->cpu_matmul, m->mm2_w->type, (double)m->mm2_w->n_bytes, tokens);
    jobs += 2;
    return s + jobs * prof->cpu_step_s;
}

pshard_status cost_vision_encode(const struct profile *prof, const struct mmproj *m, uint32_t width, uint32_t height,
                                 const struct cuda_region *regions, uint32_t n_regions, uint64_t whole_bytes,
                                 uint64_t resident_bytes, bool offload, struct cost_vision *out) {
    memset(out, 0, sizeof *out);
    const struct vision_hparams *hp = &m->hp;
    struct vision_patches size;
    CORE_TRY(vision_patches_size(hp, width, height, &size));
    out->width = size.width, out->height = size.height;
    out->grid_h = size.grid_h, out->grid_w = size.grid_w;
    out->n_patches = (uint32_t)size.n_patches;
    out->n_tokens = (uint32_t)vision_tokens_for_grid(hp, size.grid_h, size.grid_w);
    for (uint32_t r = 0; r < n_regions; r++) out->lent_bytes += regions[r].bytes;
    out->whole_bytes = n_regions ? whole_bytes : 0; /* (no GPU placement: nothing to lend) */
    struct vision_windows w;
    CORE_TRY(vision_windows_make(hp, size.grid_h, size.grid_w, &w));
    out->cpu_s = cpu_encoding(prof, m, &w);
    /* The engine's choice. Without the CUDA backend no type has a GPU kernel (cuda_type_supported),
     * so such a build, planning for a machine with one, judges by memory alone. */
    out->kernels_checked = cuda_type_supported(QUANT_F32);
    const pshard_status st = vision_gpu_choose(m, &w, out->kernels_checked, regions, n_regions, out->whole_bytes,
                                               &out->layout, &out->memory);
    out->on_gpu = n_regions > 0 && offload && st == PSHARD_OK;
    if (!out->on_gpu) { /* the first reason the engine meets */
        out->memory = VISION_GPU_NONE;
        snprintf(out->why_cpu, sizeof out->why_cpu, "%s",
                 !n_regions ? "the plan keeps every shard on the CPU, so no GPU memory is lent between steps"
                 : !offload ? "--no-mmproj-offload asks for the CPU's encoder"
                            : pshard_last_error());
    }
    if (out->memory == VISION_GPU_IN_BUDGET) { /* the language model's plan carved again after */
        out->reupload_bytes = resident_bytes;
        out->reupload_s = cost_copy_s(prof, (double)resident_bytes, true);
    }
    if (st == PSHARD_OK || st == PSHARD_ERR_NOMEM) {
        struct vision_gpu_layout priced = out->layout;
        if (st != PSHARD_OK) vision_gpu_sizes(m, &w, 1024, 2, &priced); /* as it runs with room */
        gpu_encoding(prof, m, &w, &priced, out);
    } else { /* the GPU's encoder does not take this model (its merge, heads or matrices' types) */
        memset(&out->layout, 0, sizeof out->layout);
        out->gpu_s = INFINITY;
    }
    vision_windows_free(&w);
    return PSHARD_OK;
}

double cost_vision_first_token(const struct profile *prof, const struct model *lm, const struct plan *p,
                               const struct cost_vision *v, int32_t n_question, double *prompt_s) {
    double decode_s;
    cost_request(prof, lm, p, cost_vision_prompt_tokens(v, n_question), p->n_batch > 0 ? p->n_batch : 1, 1, 1, prompt_s,
                 &decode_s);
    return cost_vision_encode_s(v) + *prompt_s;
}
