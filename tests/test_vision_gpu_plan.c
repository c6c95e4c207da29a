/* The GPU vision encoder's host bookkeeping, which needs no GPU: patches in window order, the
 * attention tiles, the buffers' sizes (encoder_gpu.h's formula) and their places in the memory
 * lent, and the plan's choice. The numbers the GPU computes are checked against the CPU encoder in
 * tests/device/vision_encoder_gpu.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "gguf_builder.h"
#include "mmproj_builder.h"
#include "vision/encoder_gpu.h"
#include "vision/preprocess.h"

enum { E = 64, FF = 96, LAYERS = 2, PROJ = 48, P = 14, HEADS = 4 };

static uint8_t *build(size_t *size) {
    const struct tb_mmproj_shape shape = {P, E, FF, LAYERS, HEADS, PROJ, {0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}};
    return tb_mmproj(&shape, size);
}

struct fixture {
    uint8_t *bytes;
    struct gguf_file *file;
    struct mmproj m;
};

static int setup(void **state) {
    struct fixture *fx = calloc(1, sizeof *fx);
    size_t size;
    fx->bytes = build(&size);
    if (gguf_open_memory(fx->bytes, size, "mmproj", &fx->file) != PSHARD_OK) return -1;
    if (mmproj_load(fx->file, &fx->m) != PSHARD_OK) return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    struct fixture *fx = *state;
    mmproj_free(&fx->m);
    gguf_close(fx->file);
    free(fx->bytes);
    free(fx);
    return 0;
}

/* Window order: a permutation, windows ascending and contiguous, each 2x2 group whole and in
 * order, inside a window the input order kept. 20 x 36 patches: windows of 8 x 8 patches, the
 * last row and column of windows cut short (4 and 4). */
static void test_windows(void **state) {
    const struct fixture *fx = *state;
    const struct vision_hparams *hp = &fx->m.hp;
    const uint32_t gh = 20, gw = 36;
    struct vision_windows w;
    assert_int_equal(vision_windows_make(hp, gh, gw, &w), PSHARD_OK);
    assert_int_equal(w.n, gh * gw);
    assert_int_equal(w.n_windows, 3 * 5);
    assert_int_equal(w.first[0], 0);
    assert_int_equal(w.first[w.n_windows], w.n);
    uint8_t *seen = calloc(w.n, 1);
    for (uint32_t k = 0; k < w.n_windows; k++) {
        const uint32_t rows = k / 5 == 2 ? 4 : 8, cols = k % 5 == 4 ? 4 : 8;
        assert_int_equal(w.first[k + 1] - w.first[k], rows * cols);
        for (uint32_t i = w.first[k]; i < w.first[k + 1]; i++) {
            uint32_t row, col;
            vision_patch_position(gw, hp->spatial_merge, w.order[i], &row, &col);
            assert_int_equal(vision_window_of(hp, gw, row, col), k);
            assert_false(seen[w.order[i]]);
            seen[w.order[i]] = 1;
            if (i > w.first[k]) assert_true(w.order[i] > w.order[i - 1]);
        }
    }
    for (uint32_t i = 0; i < w.n; i += 4) /* groups whole: 4 consecutive inputs from a multiple of 4 */
        for (uint32_t j = 0; j < 4; j++) assert_int_equal(w.order[i + j], w.order[i] + j);
    assert_int_equal(w.order[0] % 4, 0);
    free(seen);
    vision_windows_free(&w);
    /* A grid that is not whole groups is refused. */
    assert_int_equal(vision_windows_make(hp, 3, 4, &w), PSHARD_ERR_INVALID_ARG);
}

/* Tiles: queries cover [0, N) once, at most 64 a tile, keys the query's window (or all). */
static void check_tiles(const struct vision_windows *w, bool full) {
    const uint32_t n = vision_tiles_count(w, full);
    struct cuda_vision_tile *t = calloc(n, sizeof *t);
    vision_tiles_fill(w, full, t);
    uint32_t next = 0;
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(t[i].q_first, next);
        assert_true(t[i].q_count >= 1 && t[i].q_count <= CUDA_VISION_TILE_QUERIES);
        next += (uint32_t)t[i].q_count;
        if (full) {
            assert_int_equal(t[i].k_first, 0);
            assert_int_equal(t[i].k_count, w->n);
            continue;
        }
        uint32_t k = 0;
        while (w->first[k + 1] <= (uint32_t)t[i].q_first) k++;
        assert_int_equal(t[i].k_first, w->first[k]);
        assert_int_equal(t[i].k_count, w->first[k + 1] - w->first[k]);
        assert_true((uint32_t)(t[i].q_first + t[i].q_count) <= w->first[k + 1]);
    }
    assert_int_equal(next, w->n);
    free(t);
}

static void test_tiles(void **state) {
    const struct fixture *fx = *state;
    struct vision_windows w;
    assert_int_equal(vision_windows_make(&fx->m.hp, 20, 36, &w), PSHARD_OK);
    /* 8 windows of 8 x 8 patches, 6 cut to 4 x 8 or 8 x 4, 1 to 4 x 4: one tile each */
    assert_int_equal(vision_tiles_count(&w, false), 15);
    assert_int_equal(vision_tiles_count(&w, true), (720 + 63) / 64);
    check_tiles(&w, false);
    check_tiles(&w, true);
    vision_windows_free(&w);
    /* A window larger than a tile: 224-pixel windows hold 256 patches, four tiles each. */
    struct vision_hparams wide = fx->m.hp;
    wide.window_size = 224;
    assert_int_equal(vision_windows_make(&wide, 32, 32, &w), PSHARD_OK);
    assert_int_equal(w.n_windows, 4);
    assert_int_equal(vision_tiles_count(&w, false), 16);
    check_tiles(&w, false);
    vision_windows_free(&w);
}

static size_t align(size_t b) { return cuda_align(b); }

/* The formula of encoder_gpu.h, term by term, for this model (all F32). */
static void test_sizes(void **state) {
    const struct fixture *fx = *state;
    struct vision_windows w;
    assert_int_equal(vision_windows_make(&fx->m.hp, 20, 36, &w), PSHARD_OK);
    const size_t n = 720, f = 4, pd = 6 * P * P;
    struct vision_gpu_layout l;
    vision_gpu_sizes(&fx->m, &w, 256, 2, &l);
    /* 720 patches in chunks of at most 256: three of 240 */
    assert_int_equal(l.chunk_rows, 240);
    assert_int_equal(l.min_rows, 240);
    const size_t r = 240;
    assert_int_equal(l.bytes[VISION_GPU_X], align(f * n * E));
    assert_int_equal(l.bytes[VISION_GPU_V], align(f * n * E));
    assert_int_equal(l.bytes[VISION_GPU_ROPE], align(f * n * (E / HEADS)));
    assert_int_equal(l.bytes[VISION_GPU_TILES], align(16 * (15 + 12)));
    assert_int_equal(l.bytes[VISION_GPU_H], align(f * r * E));
    assert_int_equal(l.bytes[VISION_GPU_A], align(f * r * pd)); /* the patches are the widest */
    assert_int_equal(l.bytes[VISION_GPU_B], align(f * r * FF));
    /* a block: 4 E x E and 3 E x FF matrices, 2 gains and 7 biases, each rounded up */
    const size_t block = 4 * align(f * E * E) + 3 * align(f * E * FF) + 7 * align(f * E) + 2 * align(f * FF);
    const size_t patch = align(f * E * pd);
    const size_t merger = align(f * 16 * E * E) + align(f * 4 * E * PROJ) + align(f * E) + align(f * 4 * E) + align(f * PROJ);
    assert_int_equal(vision_gpu_unit_bytes(&fx->m, 1), block);
    assert_int_equal(vision_gpu_unit_bytes(&fx->m, 0), patch);
    assert_int_equal(vision_gpu_unit_bytes(&fx->m, LAYERS + 1), merger);
    assert_int_equal(l.slot_bytes, block > patch ? block : patch);
    assert_int_equal(l.merger_bytes, merger);
    assert_int_equal(l.bytes[VISION_GPU_STAGING], 2 * l.slot_bytes > merger ? 2 * l.slot_bytes : merger);
    size_t sum = 0;
    for (int i = 0; i < VISION_GPU_BUFFERS; i++) sum += l.bytes[i];
    assert_int_equal(l.peak_bytes, sum);
    /* one slot: the staging area is the larger of a slot and the merger */
    struct vision_gpu_layout one;
    vision_gpu_sizes(&fx->m, &w, 256, 1, &one);
    assert_int_equal(one.bytes[VISION_GPU_STAGING], l.slot_bytes > merger ? l.slot_bytes : merger);
    /* uneven chunks: 720 in chunks of at most 64 are 12 of 60 */
    vision_gpu_sizes(&fx->m, &w, 64, 2, &one);
    assert_int_equal(one.chunk_rows, 60);
    assert_int_equal(one.min_rows, 60);
    vision_windows_free(&w);
    /* 28 x 28 patches (784) in chunks of at most 256: four chunks of 196 */
    assert_int_equal(vision_windows_make(&fx->m.hp, 28, 28, &w), PSHARD_OK);
    vision_gpu_sizes(&fx->m, &w, 256, 2, &one);
    assert_int_equal(one.chunk_rows, 196);
    assert_int_equal(one.min_rows, 196);
    vision_gpu_sizes(&fx->m, &w, 1024, 2, &one);
    assert_int_equal(one.chunk_rows, 784);
    vision_windows_free(&w);
    /* 38 x 54 patches (513 groups) in chunks of at most 64: 33 chunks, 18 of 64 and 15 of 60, in order */
    assert_int_equal(vision_windows_make(&fx->m.hp, 38, 54, &w), PSHARD_OK);
    vision_gpu_sizes(&fx->m, &w, 64, 2, &one);
    assert_int_equal(one.n_chunks, 33);
    assert_int_equal(one.chunk_rows, 64);
    assert_int_equal(one.min_rows, 60);
    uint32_t next = 0;
    for (uint32_t c = 0; c < one.n_chunks; c++) {
        uint32_t first, rows;
        vision_gpu_chunk(&one, c, &first, &rows);
        assert_int_equal(first, next);
        assert_int_equal(rows, c < 18 ? 64 : 60);
        next += rows;
    }
    assert_int_equal(next, 2052);
    vision_windows_free(&w);
}

/* Largest first into the first region with room; every buffer inside its region, none overlapping. */
static void check_placed(const struct vision_gpu_layout *l, const struct cuda_region *regions) {
    for (int i = 0; i < VISION_GPU_BUFFERS; i++) {
        assert_true(l->offset[i] + l->bytes[i] <= regions[l->region[i]].bytes);
        assert_int_equal(l->offset[i] % CUDA_ARENA_ALIGN, 0);
        for (int j = 0; j < i; j++)
            if (l->region[i] == l->region[j])
                assert_true(l->offset[i] + l->bytes[i] <= l->offset[j] || l->offset[j] + l->bytes[j] <= l->offset[i]);
    }
}

static void test_place(void **state) {
    const struct fixture *fx = *state;
    struct vision_windows w;
    assert_int_equal(vision_windows_make(&fx->m.hp, 20, 36, &w), PSHARD_OK);
    struct vision_gpu_layout l;
    vision_gpu_sizes(&fx->m, &w, 1024, 2, &l);
    /* One region of exactly the peak holds it all. */
    struct cuda_region exact = {(uint8_t *)0x100000, l.peak_bytes};
    assert_true(vision_gpu_place(&l, &exact, 1));
    check_placed(&l, &exact);
    exact.bytes -= CUDA_ARENA_ALIGN;
    assert_false(vision_gpu_place(&l, &exact, 1));
    /* Split over regions: the staging area alone in a small first region, the rest after. */
    size_t rest = l.peak_bytes - l.bytes[VISION_GPU_STAGING];
    struct cuda_region split[3] = {{(uint8_t *)0x100000, 1024}, {(uint8_t *)0x200000, l.bytes[VISION_GPU_STAGING]},
                                   {(uint8_t *)0x400000, rest}};
    assert_true(vision_gpu_place(&l, split, 3));
    check_placed(&l, split);
    assert_int_equal(l.region[VISION_GPU_STAGING], 1); /* the largest here */
    split[2].bytes = rest / 2;
    assert_false(vision_gpu_place(&l, split, 3));
    vision_windows_free(&w);
}

/* The plan: the largest chunks with two slots where the memory is there, smaller chunks and one
 * slot as it shrinks, a message naming the least when nothing fits. Without the CUDA backend no
 * type has a GPU kernel, and the plan says so. */
static void test_plan(void **state) {
    const struct fixture *fx = *state;
    struct vision_windows w;
    assert_int_equal(vision_windows_make(&fx->m.hp, 40, 40, &w), PSHARD_OK);
    struct vision_gpu_layout big, small, least, l;
    vision_gpu_sizes(&fx->m, &w, 1024, 2, &big);
    vision_gpu_sizes(&fx->m, &w, 64, 2, &small);
    vision_gpu_sizes(&fx->m, &w, 64, 1, &least);
    struct cuda_region region = {(uint8_t *)0x100000, big.peak_bytes};
    if (!cuda_type_supported(QUANT_F32)) {
        assert_int_equal(vision_gpu_plan(&fx->m, &w, &region, 1, &l), PSHARD_ERR_UNSUPPORTED);
        vision_windows_free(&w);
        return;
    }
    assert_int_equal(vision_gpu_plan(&fx->m, &w, &region, 1, &l), PSHARD_OK);
    assert_int_equal(l.chunk_rows, 800);
    assert_int_equal(l.n_slots, 2);
    region.bytes = small.peak_bytes;
    assert_int_equal(vision_gpu_plan(&fx->m, &w, &region, 1, &l), PSHARD_OK);
    assert_int_equal(l.chunk_rows, 64);
    assert_int_equal(l.n_slots, 2);
    region.bytes = least.peak_bytes;
    assert_int_equal(vision_gpu_plan(&fx->m, &w, &region, 1, &l), PSHARD_OK);
    assert_int_equal(l.n_slots, 1);
    region.bytes = least.peak_bytes - 1;
    assert_int_equal(vision_gpu_plan(&fx->m, &w, &region, 1, &l), PSHARD_ERR_NOMEM);
    assert_non_null(strstr(pshard_last_error(), "1600 patches"));
    vision_windows_free(&w);
}

/* Where the encoding takes its memory, by memory alone (both builds): the scratch lent where the
 * image's buffers fit there (its layout as the plan's over those regions), else the whole budget
 * (the layout the plan takes in one region of it), else none, naming the least, the scratch and
 * the whole budget. */
static void test_choose(void **state) {
    const struct fixture *fx = *state;
    struct vision_windows w;
    assert_int_equal(vision_windows_make(&fx->m.hp, 40, 40, &w), PSHARD_OK);
    struct vision_gpu_layout big, least, l;
    vision_gpu_sizes(&fx->m, &w, 1024, 2, &big);
    vision_gpu_sizes(&fx->m, &w, 64, 1, &least);
    enum vision_gpu_memory where;
    /* the scratch in two regions: the staging area's and the rest's */
    const size_t stage = big.bytes[VISION_GPU_STAGING];
    struct cuda_region lent[2] = {{(uint8_t *)0x100000, stage}, {(uint8_t *)0x10000000, big.peak_bytes - stage}};
    assert_int_equal(vision_gpu_choose(&fx->m, &w, false, lent, 2, 8 * big.peak_bytes, &l, &where), PSHARD_OK);
    assert_int_equal(where, VISION_GPU_IN_SCRATCH);
    assert_int_equal(l.peak_bytes, big.peak_bytes);
    assert_int_equal(l.region[VISION_GPU_STAGING], 0);
    /* the scratch a byte short of the least: the whole budget, the largest layout it holds */
    lent[0].bytes = 1024, lent[1].bytes = least.peak_bytes - 1 - 1024;
    assert_int_equal(vision_gpu_choose(&fx->m, &w, false, lent, 2, big.peak_bytes, &l, &where), PSHARD_OK);
    assert_int_equal(where, VISION_GPU_IN_BUDGET);
    assert_int_equal(l.peak_bytes, big.peak_bytes);
    assert_int_equal(l.n_slots, 2);
    for (int b = 0; b < VISION_GPU_BUFFERS; b++) assert_int_equal(l.region[b], 0);
    assert_int_equal(vision_gpu_choose(&fx->m, &w, false, lent, 2, least.peak_bytes, &l, &where), PSHARD_OK);
    assert_int_equal(where, VISION_GPU_IN_BUDGET);
    assert_int_equal(l.peak_bytes, least.peak_bytes);
    assert_int_equal(l.n_slots, 1);
    /* neither: the CPU, the message naming the least and both rooms */
    assert_int_equal(vision_gpu_choose(&fx->m, &w, false, lent, 2, least.peak_bytes - 1, &l, &where), PSHARD_ERR_NOMEM);
    assert_int_equal(where, VISION_GPU_NONE);
    assert_int_equal(l.peak_bytes, least.peak_bytes);
    assert_non_null(strstr(pshard_last_error(), "1600 patches"));
    assert_non_null(strstr(pshard_last_error(), "the whole budget"));
    /* no loan of the whole budget: the scratch's refusal as vision_gpu_plan words it */
    assert_int_equal(vision_gpu_choose(&fx->m, &w, false, lent, 2, 0, &l, &where), PSHARD_ERR_NOMEM);
    assert_int_equal(where, VISION_GPU_NONE);
    assert_null(strstr(pshard_last_error(), "whole budget"));
    /* with the kernels asked: the same choice where the CUDA backend has them, else none */
    const pshard_status st = vision_gpu_choose(&fx->m, &w, true, lent, 2, big.peak_bytes, &l, &where);
    if (cuda_type_supported(QUANT_F32)) {
        assert_int_equal(st, PSHARD_OK);
        assert_int_equal(where, VISION_GPU_IN_BUDGET);
    } else {
        assert_int_equal(st, PSHARD_ERR_UNSUPPORTED);
        assert_int_equal(where, VISION_GPU_NONE);
    }
    assert_string_equal(vision_gpu_memory_name(VISION_GPU_IN_SCRATCH), "the scratch lent between steps");
    assert_string_equal(vision_gpu_memory_name(VISION_GPU_IN_BUDGET), "the whole budget");
    assert_string_equal(vision_gpu_memory_name(VISION_GPU_NONE), "none");
    vision_windows_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_windows), cmocka_unit_test(test_tiles), cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_place),   cmocka_unit_test(test_plan),  cmocka_unit_test(test_choose),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
