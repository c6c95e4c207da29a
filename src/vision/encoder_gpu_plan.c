/* The GPU encoder's bookkeeping on the host: patches in window order, attention tiles, the
 * units the staging area carries, and the buffers' sizes and places in the memory lent
 * (encoder_gpu.h has the formula). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/quant.h"
#include "vision/encoder_gpu.h"
#include "vision/encoder_gpu_units.h"

pshard_status vision_windows_make(const struct vision_hparams *hp, uint32_t grid_h, uint32_t grid_w,
                                  struct vision_windows *out) {
    memset(out, 0, sizeof *out);
    const uint32_t m = hp->spatial_merge, units = hp->window_size / hp->patch_size / m;
    if (units == 0 || grid_h % m || grid_w % m || (uint64_t)grid_h * grid_w > (1u << 20))
        return core_fail(PSHARD_ERR_INVALID_ARG, "vision windows: a %ux%u grid of patches does not fit this model", grid_h,
                         grid_w);
    const uint32_t n = grid_h * grid_w;
    const uint32_t n_windows = ((grid_h / m + units - 1) / units) * ((grid_w / m + units - 1) / units);
    uint32_t *window = malloc(sizeof *window * (n ? n : 1));
    out->order = malloc(sizeof *out->order * (n ? n : 1));
    out->first = calloc((size_t)n_windows + 1, sizeof *out->first);
    if (!window || !out->order || !out->first) {
        free(window);
        vision_windows_free(out);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory for %u patches' windows", n);
    }
    /* A counting sort by window keeps the input order inside each window. */
    for (uint32_t t = 0; t < n; t++) {
        uint32_t row, col;
        vision_patch_position(grid_w, m, t, &row, &col);
        window[t] = vision_window_of(hp, grid_w, row, col);
        out->first[window[t] + 1]++;
    }
    for (uint32_t w = 0; w < n_windows; w++) out->first[w + 1] += out->first[w];
    uint32_t *next = malloc(sizeof *next * n_windows);
    if (!next) {
        free(window);
        vision_windows_free(out);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory for %u windows", n_windows);
    }
    memcpy(next, out->first, sizeof *next * n_windows);
    for (uint32_t t = 0; t < n; t++) out->order[next[window[t]]++] = t;
    free(next);
    free(window);
    out->n = n;
    out->n_windows = n_windows;
    return PSHARD_OK;
}

void vision_windows_free(struct vision_windows *w) {
    free(w->order);
    free(w->first);
    memset(w, 0, sizeof *w);
}

/* Tiles of up to CUDA_VISION_TILE_QUERIES queries over [first, end), keys the same range. */
static uint32_t range_tiles(uint32_t first, uint32_t end, struct cuda_vision_tile *out) {
    uint32_t count = 0;
    for (uint32_t q = first; q < end; q += CUDA_VISION_TILE_QUERIES, count++)
        if (out) {
            const uint32_t rows = end - q < CUDA_VISION_TILE_QUERIES ? end - q : CUDA_VISION_TILE_QUERIES;
            out[count] = (struct cuda_vision_tile){(int32_t)q, (int32_t)rows, (int32_t)first, (int32_t)(end - first)};
        }
    return count;
}

static uint32_t tiles(const struct vision_windows *w, bool full, struct cuda_vision_tile *out) {
    if (full) return range_tiles(0, w->n, out);
    uint32_t count = 0;
    for (uint32_t k = 0; k < w->n_windows; k++) count += range_tiles(w->first[k], w->first[k + 1], out ? out + count : NULL);
    return count;
}

uint32_t vision_tiles_count(const struct vision_windows *w, bool full) { return tiles(w, full, NULL); }
void vision_tiles_fill(const struct vision_windows *w, bool full, struct cuda_vision_tile *out) { tiles(w, full, out); }

/* ---- what the staging area carries */

uint32_t vision_gpu_unit_parts(const struct mmproj *m, uint32_t unit, struct vision_gpu_part *out) {
    if (unit == 0) {
        out[0] = (struct vision_gpu_part){m->patch_embd[0], VISION_PART_PATCH};
        return 1;
    }
    if (unit > m->hp.n_layer) {
        const struct gguf_tensor *raw[] = {m->mm0_w, m->mm2_w}, *f32[] = {m->post_ln, m->mm0_b, m->mm2_b};
        uint32_t n = 0;
        for (int i = 0; i < 2; i++) out[n++] = (struct vision_gpu_part){raw[i], VISION_PART_RAW};
        for (int i = 0; i < 3; i++) out[n++] = (struct vision_gpu_part){f32[i], VISION_PART_F32};
        return n;
    }
    const struct vision_layer *l = &m->layers[unit - 1];
    const struct gguf_tensor *raw[VISION_BLOCK_MATRICES] = {l->q_w, l->k_w, l->v_w, l->o_w, l->gate_w, l->up_w, l->down_w};
    const struct gguf_tensor *f32[VISION_BLOCK_VECTORS] = {l->ln1, l->ln2, l->q_b, l->k_b, l->v_b, l->o_b,
                                                           l->gate_b, l->up_b, l->down_b};
    uint32_t n = 0;
    for (int i = 0; i < VISION_BLOCK_MATRICES; i++) out[n++] = (struct vision_gpu_part){raw[i], VISION_PART_RAW};
    for (int i = 0; i < VISION_BLOCK_VECTORS; i++) out[n++] = (struct vision_gpu_part){f32[i], VISION_PART_F32};
    return n;
}

size_t vision_gpu_part_bytes(const struct mmproj *m, const struct vision_gpu_part *p) {
    switch (p->kind) {
    case VISION_PART_RAW: return p->t->n_bytes;
    case VISION_PART_F32: return sizeof(float) * (size_t)p->t->ne[0];
    case VISION_PART_PATCH: return sizeof(float) * (size_t)m->hp.n_embd * vision_gpu_patch_dim(&m->hp);
    }
    return 0;
}

size_t vision_gpu_unit_bytes(const struct mmproj *m, uint32_t unit) {
    struct vision_gpu_part parts[VISION_UNIT_PARTS];
    const uint32_t n = vision_gpu_unit_parts(m, unit, parts);
    size_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) bytes += cuda_align(vision_gpu_part_bytes(m, &parts[i]));
    return bytes;
}

/* ---- buffers */

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

struct cuda_matrix vision_gpu_matrix(const struct gguf_tensor *t, const void *dev) {
    const enum quant_type type = (enum quant_type)t->type;
    return (struct cuda_matrix){type, dev, t->ne[0], t->ne[1], 1, quant_row_bytes(type, t->ne[0]), false};
}

void vision_gpu_chunk(const struct vision_gpu_layout *l, uint32_t c, uint32_t *first, uint32_t *rows) {
    const uint32_t groups = l->n_patches / 4, each = groups / l->n_chunks, more = groups % l->n_chunks;
    *first = 4 * (c * each + (c < more ? c : more));
    *rows = 4 * (each + (c < more));
}

void vision_gpu_sizes(const struct mmproj *m, const struct vision_windows *w, uint32_t chunk_rows, uint32_t n_slots,
                      struct vision_gpu_layout *out) {
    memset(out, 0, sizeof *out);
    const struct vision_hparams *hp = &m->hp;
    const size_t n = w->n, e = hp->n_embd, ff = hp->n_ff, f = sizeof(float);
    /* as few chunks as chunk_rows allows, of whole groups, their sizes a group apart at most */
    const uint32_t n_chunks = (w->n + chunk_rows - 1) / chunk_rows, groups = w->n / 4;
    const size_t rows = 4 * ((groups + n_chunks - 1) / n_chunks);
    out->n_patches = w->n;
    out->n_chunks = n_chunks;
    out->chunk_rows = (uint32_t)rows;
    out->min_rows = 4 * (groups / n_chunks);
    out->n_slots = n_slots;
    out->n_window_tiles = vision_tiles_count(w, false);
    out->n_full_tiles = vision_tiles_count(w, true);
    size_t *b = out->bytes;
    b[VISION_GPU_X] = b[VISION_GPU_Q] = b[VISION_GPU_K] = b[VISION_GPU_V] = cuda_align(f * n * e);
    b[VISION_GPU_ROPE] = cuda_align(f * n * hp->head_dim);
    b[VISION_GPU_TILES] = cuda_align(sizeof(struct cuda_vision_tile) * (out->n_window_tiles + out->n_full_tiles));
    b[VISION_GPU_H] = cuda_align(f * rows * e);
    b[VISION_GPU_A] = cuda_align(f * rows * max3(ff, e, vision_gpu_patch_dim(hp)));
    const size_t merged_out = (size_t)rows / 4 * hp->projection_dim;
    b[VISION_GPU_B] = cuda_align(f * (rows * ff > merged_out ? rows * ff : merged_out));
    size_t work = 0;
    for (uint32_t unit = 1; unit <= hp->n_layer + 1; unit++) {
        struct vision_gpu_part parts[VISION_UNIT_PARTS];
        const uint32_t count = vision_gpu_unit_parts(m, unit, parts);
        const int64_t unit_rows = unit > hp->n_layer ? rows / 4 : rows;
        for (uint32_t i = 0; i < count; i++) {
            if (parts[i].kind != VISION_PART_RAW) continue;
            const struct cuda_matrix mat = vision_gpu_matrix(parts[i].t, NULL);
            const size_t need = cuda_matmul_work_bytes(&mat, unit_rows);
            if (need > work) work = need;
        }
    }
    b[VISION_GPU_WORK] = cuda_align(work);
    out->slot_bytes = vision_gpu_unit_bytes(m, 0);
    for (uint32_t unit = 1; unit <= hp->n_layer; unit++)
        if (vision_gpu_unit_bytes(m, unit) > out->slot_bytes) out->slot_bytes = vision_gpu_unit_bytes(m, unit);
    out->merger_bytes = vision_gpu_unit_bytes(m, hp->n_layer + 1);
    b[VISION_GPU_STAGING] = n_slots * out->slot_bytes > out->merger_bytes ? n_slots * out->slot_bytes : out->merger_bytes;
    for (int i = 0; i < VISION_GPU_BUFFERS; i++) out->peak_bytes += b[i];
}

bool vision_gpu_place(struct vision_gpu_layout *l, const struct cuda_region *regions, uint32_t n_regions) {
    enum { MAX_REGIONS = 16 };
    size_t used[MAX_REGIONS] = {0};
    bool placed[VISION_GPU_BUFFERS] = {false};
    if (n_regions > MAX_REGIONS) n_regions = MAX_REGIONS;
    for (int k = 0; k < VISION_GPU_BUFFERS; k++) {
        int big = -1; /* the largest not yet placed (the first of equals) */
        for (int i = 0; i < VISION_GPU_BUFFERS; i++)
            if (!placed[i] && (big < 0 || l->bytes[i] > l->bytes[big])) big = i;
        placed[big] = true;
        uint32_t r = 0;
        while (r < n_regions && regions[r].bytes - used[r] < l->bytes[big]) r++;
        if (r == n_regions) return false;
        l->region[big] = r;
        l->offset[big] = used[r];
        used[r] += l->bytes[big];
    }
    return true;
}

/* Whether the kernels multiply matrix t at `rows` rows a call: the matrix-vector kernel (up to 8
 * rows, and F32 weights at any count) wants whole blocks of 32, the f16 products do not. */
static bool computable(const struct gguf_tensor *t, uint32_t rows) {
    const enum quant_type type = (enum quant_type)t->type;
    if (!cuda_type_supported(type)) return false;
    if (t->ne[0] % 32 == 0) return true;
    return (type == QUANT_F16 || type == QUANT_BF16) && rows > CUDA_MATVEC_MAX_TOKENS;
}

/* vision_gpu_plan, asking whether each matrix has a GPU kernel at its rows or not (kernels). */
static pshard_status plan_layout(const struct mmproj *m, const struct vision_windows *w, const struct cuda_region *regions,
                                 uint32_t n_regions, bool kernels, struct vision_gpu_layout *out) {
    const struct vision_hparams *hp = &m->hp;
    if (hp->spatial_merge != 2)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "the GPU's vision encoder merges 2x2 patches, not %ux%u", hp->spatial_merge,
                         hp->spatial_merge);
    if (hp->head_dim > CUDA_VISION_MAX_HEAD_DIM || hp->head_dim % 2)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "the GPU's vision attention takes heads of up to %d, not %u",
                         (int)CUDA_VISION_MAX_HEAD_DIM, hp->head_dim);
    static const uint32_t chunks[] = {1024, 256, 64};
    size_t lent = 0;
    for (uint32_t r = 0; r < n_regions; r++) lent += regions[r].bytes;
    for (uint32_t slots = 2; slots >= 1; slots--)
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            vision_gpu_sizes(m, w, chunks[c], slots, out);
            for (uint32_t unit = 1; kernels && unit <= hp->n_layer + 1; unit++) {
                struct vision_gpu_part parts[VISION_UNIT_PARTS];
                const uint32_t count = vision_gpu_unit_parts(m, unit, parts);
                const uint32_t rows = unit > hp->n_layer ? out->min_rows / 4 : out->min_rows;
                for (uint32_t i = 0; i < count; i++)
                    if (parts[i].kind == VISION_PART_RAW && !computable(parts[i].t, rows))
                        return core_fail(PSHARD_ERR_UNSUPPORTED, "no GPU kernel multiplies %s rows of %lld (%.*s) %u at a time",
                                         quant_type_name((enum quant_type)parts[i].t->type), (long long)parts[i].t->ne[0],
                                         (int)parts[i].t->name.len, parts[i].t->name.data, rows);
            }
            if (vision_gpu_place(out, regions, n_regions)) return PSHARD_OK;
        }
    /* (out holds the smallest layout tried: 64-patch chunks, one slot) */
    return core_fail(PSHARD_ERR_NOMEM, "the vision encoder needs %.1f MB of VRAM for %u patches at the least and %.1f MB "
                     "was lent to it", out->peak_bytes / 1048576.0, w->n, lent / 1048576.0);
}

pshard_status vision_gpu_plan(const struct mmproj *m, const struct vision_windows *w, const struct cuda_region *regions,
                              uint32_t n_regions, struct vision_gpu_layout *out) {
    return plan_layout(m, w, regions, n_regions, true, out);
}

pshard_status vision_gpu_plan_room(const struct mmproj *m, const struct vision_windows *w, const struct cuda_region *regions,
                                   uint32_t n_regions, struct vision_gpu_layout *out) {
    return plan_layout(m, w, regions, n_regions, false, out);
}

pshard_status vision_gpu_choose(const struct mmproj *m, const struct vision_windows *w, bool kernels,
                                const struct cuda_region *lent, uint32_t n_lent, uint64_t whole_bytes,
                                struct vision_gpu_layout *out, enum vision_gpu_memory *where) {
    *where = VISION_GPU_NONE;
    pshard_status st = plan_layout(m, w, lent, n_lent, kernels, out);
    if (st == PSHARD_OK) *where = VISION_GPU_IN_SCRATCH;
    if (st != PSHARD_ERR_NOMEM || !whole_bytes) return st;
    size_t scratch = 0;
    for (uint32_t r = 0; r < n_lent; r++) scratch += lent[r].bytes;
    const struct cuda_region whole = {NULL, (size_t)whole_bytes};
    st = plan_layout(m, w, &whole, 1, kernels, out);
    if (st == PSHARD_OK) *where = VISION_GPU_IN_BUDGET;
    if (st != PSHARD_ERR_NOMEM) return st;
    return core_fail(PSHARD_ERR_NOMEM, "the vision encoder needs %.1f MB of VRAM for %u patches at the least and %.1f MB "
                     "was lent to it (the whole budget: %.1f MB)", out->peak_bytes / 1048576.0, w->n,
                     scratch / 1048576.0, whole_bytes / 1048576.0);
}

const char *vision_gpu_memory_name(enum vision_gpu_memory where) {
    switch (where) {
    case VISION_GPU_IN_SCRATCH: return "the scratch lent between steps";
    case VISION_GPU_IN_BUDGET: return "the whole budget";
    case VISION_GPU_NONE: break;
    }
    return "none";
}
