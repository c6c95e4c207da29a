/* The GPU vision encoder against the CPU's (src/vision/encoder.c) on gguf-synth's tiny Qwen2.5-VL
 * mmproj, F16 and F32: images with several windows (some cut short) and full-attention blocks,
 * square and not, one chunk and several; in the least memory the plan takes (small chunks, one
 * staging slot) and in memory lent as three separate regions; nothing written outside the memory
 * lent; a budget too small refused with the need; progress heard per block, and stopping.
 * Tolerance: the largest |gpu - cpu| over the embeddings at most TOL times the largest |cpu|
 * (F32: summation order only; F16: both round activations to f16 before each product, and a
 * value near a rounding boundary may round the other way).
 * Usage: vision_encoder_gpu BUILD_DIR (where gguf-synth is). Exits 0 with a "skipped" line
 * without a GPU. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "device_test.h"
#include "cuda/cuda_backend.h"
#include "gguf/gguf.h"
#include "vision/encoder.h"
#include "vision/encoder_gpu.h"
#include "vision/preprocess.h"

static const double TOL_F32 = 2e-5, TOL_F16 = 2e-3;
enum { ARENA_BYTES = 512 << 20, GUARD_BYTES = 1 << 20, GUARD = 0xa5 };

static struct dt d = {.name = "vision_encoder_gpu"}; /* the cases and failures (dt_case) */

static void die(const char *what) {
    fprintf(stderr, "FATAL %s: %s\n", what, pshard_last_error());
    exit(2);
}

struct gpu {
    struct cuda_ctx *cuda;
    struct cuda_arena arena;
    uint8_t *lent; /* the memory after cuBLAS's workspace, GUARD_BYTES kept on each side */
    size_t lent_bytes;
};

/* A random RGB image, the same for a seed. */
static struct vision_image image(uint32_t height, uint32_t width, uint64_t seed) {
    struct vision_image img = {width, height, malloc((size_t)width * height * 3)};
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < (size_t)width * height * 3; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        img.rgb[i] = (uint8_t)(s >> 56);
    }
    return img;
}

/* Largest |a - b| over the largest |b|. */
static double rel_err(const struct vision_embeddings *a, const struct vision_embeddings *b) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < (size_t)b->n_tokens * b->n_embd; i++) {
        const double d = fabs((double)a->data[i] - b->data[i]);
        worst = d > worst || d != d ? d : worst;
        scale = fabs(b->data[i]) > scale ? fabs(b->data[i]) : scale;
    }
    return worst / (scale > 0 ? scale : 1);
}

static bool guards_intact(struct gpu *g) {
    uint8_t *host = malloc(GUARD_BYTES);
    bool ok = true;
    for (int side = 0; side < 2 && ok; side++) {
        const uint8_t *at = side ? g->lent + g->lent_bytes : g->lent - GUARD_BYTES;
        if (cuda_copy_d2h(host, at, GUARD_BYTES, cuda_ctx_compute_stream(g->cuda)) != PSHARD_OK ||
            cuda_stream_sync(cuda_ctx_compute_stream(g->cuda)) != PSHARD_OK)
            die("reading the guards");
        for (size_t i = 0; i < GUARD_BYTES && ok; i++) ok = host[i] == GUARD;
    }
    free(host);
    return ok;
}

/* Plan over `regions` and encode; the status of whichever failed. */
static pshard_status gpu_encode(struct vision_gpu *vg, const struct mmproj *m, const struct vision_patches *p, struct gpu *g,
                                const struct cuda_region *regions, uint32_t n_regions, const struct vision_progress *progress,
                                struct vision_gpu_layout *layout, struct vision_embeddings *out) {
    struct vision_windows w;
    if (vision_windows_make(&m->hp, p->grid_h, p->grid_w, &w) != PSHARD_OK) die("windows");
    pshard_status st = vision_gpu_plan(m, &w, regions, n_regions, layout);
    vision_windows_free(&w);
    if (st != PSHARD_OK) return st;
    return vision_encode_gpu(vg, p, layout, g->cuda, regions, progress, out);
}

static int stop_at;
static int progress_calls;
static int on_progress(void *user, uint32_t done, uint32_t total) {
    (void)user, (void)total;
    progress_calls++;
    return stop_at && (int)done == stop_at;
}

static void run_model(const char *path, const char *type, double tol, struct gpu *g, struct threadpool *pool) {
    struct gguf_file *file;
    struct mmproj m;
    if (gguf_open(path, &file) != PSHARD_OK || mmproj_load(file, &m) != PSHARD_OK) die(path);
    struct vision_gpu *vg;
    if (vision_gpu_create(&m, &vg) != PSHARD_OK) die("vision_gpu_create");
    const struct cuda_region whole = {g->lent, g->lent_bytes};
    /* height x width: windows cut short and two chunks of patches; not square; the least image */
    static const uint32_t sizes[][2] = {{196, 308}, {448, 644}, {300, 200}, {56, 56}};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        struct vision_image img = image(sizes[c][0], sizes[c][1], c + 1);
        struct vision_patches p;
        if (vision_preprocess(&m.hp, &img, &p) != PSHARD_OK) die("preprocess");
        struct vision_embeddings cpu, gpu;
        if (vision_encode(&m, &p, pool, NULL, &cpu) != PSHARD_OK) die("the CPU encoder");
        struct vision_gpu_layout l;
        pshard_status st = gpu_encode(vg, &m, &p, g, &whole, 1, NULL, &l, &gpu);
        const char *err = st == PSHARD_OK ? "" : pshard_last_error();
        dt_case(&d, st == PSHARD_OK && gpu.n_tokens == cpu.n_tokens && gpu.n_embd == cpu.n_embd && rel_err(&gpu, &cpu) <= tol,
              "%s %ux%u (%ux%u patches, chunks of %u, %u slots, %u window + %u full tiles, %.2f MB): max err %.2e of "
              "the scale (tolerance %.0e) %s",
              type, sizes[c][0], sizes[c][1], p.grid_h, p.grid_w, l.chunk_rows, l.n_slots, l.n_window_tiles, l.n_full_tiles,
              l.peak_bytes / 1048576.0, st == PSHARD_OK ? rel_err(&gpu, &cpu) : INFINITY, tol, err);
        if (st == PSHARD_OK) vision_embeddings_free(&gpu);
        dt_case(&d, guards_intact(g), "%s %ux%u: nothing written outside the memory lent", type, sizes[c][0], sizes[c][1]);
        if (c == 1) {
            /* The least memory the plan takes: 64-patch chunks, one slot. */
            struct vision_windows w;
            if (vision_windows_make(&m.hp, p.grid_h, p.grid_w, &w) != PSHARD_OK) die("windows");
            struct vision_gpu_layout least;
            vision_gpu_sizes(&m, &w, 64, 1, &least);
            vision_windows_free(&w);
            const struct cuda_region tight = {g->lent, least.peak_bytes};
            st = gpu_encode(vg, &m, &p, g, &tight, 1, NULL, &l, &gpu);
            /* (one slot, or two where the merger's upload is larger than both: the same peak) */
            dt_case(&d, st == PSHARD_OK && l.peak_bytes <= least.peak_bytes && l.chunk_rows <= 64 && rel_err(&gpu, &cpu) <= tol,
                  "%s in the least memory (%.2f MB: chunks of %u, %u slots): max err %.2e", type, least.peak_bytes / 1048576.0,
                  l.chunk_rows, l.n_slots, st == PSHARD_OK ? rel_err(&gpu, &cpu) : INFINITY);
            if (st == PSHARD_OK) vision_embeddings_free(&gpu);
            const struct cuda_region less = {g->lent, least.peak_bytes - CUDA_ARENA_ALIGN};
            st = gpu_encode(vg, &m, &p, g, &less, 1, NULL, &l, &gpu);
            dt_case(&d, st == PSHARD_ERR_NOMEM && strstr(pshard_last_error(), "MB of VRAM"), "%s in less: refused (%s)", type,
                  pshard_last_error());
            /* Three regions apart, each half of what the largest layout takes. */
            struct vision_gpu_layout big;
            if (vision_windows_make(&m.hp, p.grid_h, p.grid_w, &w) != PSHARD_OK) die("windows");
            vision_gpu_sizes(&m, &w, 1024, 2, &big);
            vision_windows_free(&w);
            const size_t half = cuda_align(big.peak_bytes / 2);
            const struct cuda_region split[3] = {{g->lent, half}, {g->lent + half + (4 << 20), half},
                                                 {g->lent + 2 * half + (8 << 20), half}};
            st = gpu_encode(vg, &m, &p, g, split, 3, NULL, &l, &gpu);
            dt_case(&d, st == PSHARD_OK && rel_err(&gpu, &cpu) <= tol, "%s in three regions (chunks of %u): max err %.2e %s", type,
                  l.chunk_rows, st == PSHARD_OK ? rel_err(&gpu, &cpu) : INFINITY, st == PSHARD_OK ? "" : pshard_last_error());
            if (st == PSHARD_OK) vision_embeddings_free(&gpu);
            /* Progress: each block and the merger; stopping fails the encoding, saying where. */
            const struct vision_progress progress = {on_progress, NULL};
            progress_calls = 0, stop_at = 0;
            st = gpu_encode(vg, &m, &p, g, &whole, 1, &progress, &l, &gpu);
            dt_case(&d, st == PSHARD_OK && progress_calls == (int)m.hp.n_layer + 1, "%s progress: %d reports", type, progress_calls);
            if (st == PSHARD_OK) vision_embeddings_free(&gpu);
            stop_at = 2;
            st = gpu_encode(vg, &m, &p, g, &whole, 1, &progress, &l, &gpu);
            dt_case(&d, st != PSHARD_OK && strstr(pshard_last_error(), "stopped after 2"), "%s stopped: %s", type, pshard_last_error());
            stop_at = 0;
        }
        vision_embeddings_free(&cpu);
        vision_patches_free(&p);
        free(img.rgb);
    }
    vision_gpu_free(vg);
    mmproj_free(&m);
    gguf_close(file);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cuda_device_count() == 0) {
        printf("vision_encoder_gpu: no CUDA device: skipped\n");
        return 0;
    }
    const char *build = argc > 1 ? argv[1] : ".";
    struct gpu g = {0};
    if (cuda_ctx_create(0, &g.cuda) != PSHARD_OK || cuda_arena_create(&g.arena, ARENA_BYTES) != PSHARD_OK) die("device");
    void *blas;
    if (cuda_arena_alloc(&g.arena, CUDA_BLAS_WORKSPACE_BYTES, "cublas", &blas) != PSHARD_OK ||
        cuda_ctx_set_blas_workspace(g.cuda, blas, CUDA_BLAS_WORKSPACE_BYTES) != PSHARD_OK)
        die("cuBLAS workspace");
    g.lent = g.arena.base + g.arena.used + GUARD_BYTES;
    g.lent_bytes = g.arena.size - g.arena.used - 2 * (size_t)GUARD_BYTES;
    if (cuda_memset(g.arena.base + g.arena.used, GUARD, g.arena.size - g.arena.used, cuda_ctx_compute_stream(g.cuda)) != PSHARD_OK ||
        cuda_stream_sync(cuda_ctx_compute_stream(g.cuda)) != PSHARD_OK)
        die("guards");
    struct threadpool *pool;
    if (threadpool_create(0, &pool) != PSHARD_OK) die("threads");
    static const char *const types[] = {"F16", "F32"};
    for (int t = 0; t < 2; t++) {
        char path[256], cmd[1024];
        snprintf(path, sizeof path, "/tmp/pshard-vision-gpu-%d-%s.gguf", (int)getpid(), types[t]);
        snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape tiny-qwen25vl-mmproj --type %s --seed 5 --quiet -o '%s'", build,
                 types[t], path);
        if (system(cmd) != 0) {
            fprintf(stderr, "cannot make the tiny mmproj with gguf-synth (%s)\n", cmd);
            return 2;
        }
        run_model(path, types[t], t == 0 ? TOL_F16 : TOL_F32, &g, pool);
        unlink(path);
    }
    threadpool_free(pool);
    cuda_arena_destroy(&g.arena);
    cuda_ctx_destroy(g.cuda);
    printf("vision_encoder_gpu: %d cases, %d failed: %s\n", d.cases, d.failures, d.failures ? "FAIL" : "PASS");
    return d.failures ? 1 : 0;
}
