/* The Qwen2.5-VL vision encoder on the GPU, the same function as vision_encode (encoder.h) under
 * VLMOpt's three rules: the weights stay in host memory and go up one block at a time through a
 * small staging area (two slots: the next block's copy runs while this block computes);
 * attention runs over tiles of query rows with an online softmax, each tile's keys its window's
 * (the patches reordered window by window, as the model does) or all, so no N x N matrix ever
 * exists; and every byte of device memory it takes is lent for the one encoding (the executor's
 * scratch between steps, src/exec/exec_lend.h) and free again before the prompt's first step.
 *
 * Memory, for N patches of an image, width E, MLP width F, head size hd, projection d, chunks of
 * at most R patches (each buffer rounded up to CUDA_ARENA_ALIGN):
 *   4 N E f32          the residual stream x, q (which attention overwrites with its output), k, v
 *   N hd f32           the rotary table (cos, sin of hd/2 pairs a patch)
 *   16 (Tw + Tf)       attention tiles: each window cut into tiles of 64 queries, then N/64 tiles
 *   R E + R max(F, E, 6P^2) + R max(F, d/4)  f32   a chunk's norm output, gate (or patches, or the
 *                      merger's hidden row), up (or the merger's output)
 *   work               the largest cuda_matmul_work_bytes of a block's matrices at R rows and the
 *                      merger's at R/4
 *   staging            max(slots x S, M): S the largest block's upload (its matrices as the file
 *                      has them and its norms and biases in f32; the patch kernel, 6P^2 E f32, too),
 *                      M the merger's (both matrices at once)
 * The plan tries chunks of 1024, 256 and 64 patches with two slots, then with one, and takes the
 * first that fits the regions lent (largest buffer first, first region with room). */
#ifndef VISION_ENCODER_GPU_H
#define VISION_ENCODER_GPU_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda_backend.h"
#include "vision/encoder.h"

/* ---- host bookkeeping: window order, tiles, buffers (no GPU needed) */

/* The patches sorted by window, stably: order[i] is the input index of the i-th patch in window
 * order; window w holds positions [first[w], first[w + 1]). A 2x2 group stays whole and in order
 * (a window is a whole number of groups), so the merger reads window order too. */
struct vision_windows {
    uint32_t n, n_windows;
    uint32_t *order; /* [n] */
    uint32_t *first; /* [n_windows + 1] */
};
pshard_status vision_windows_make(const struct vision_hparams *hp, uint32_t grid_h, uint32_t grid_w,
                                  struct vision_windows *out);
void vision_windows_free(struct vision_windows *w);

/* Tiles of the window blocks (each window cut into tiles of at most CUDA_VISION_TILE_QUERIES
 * queries over that window's keys) or of the full ones (tiles over all N keys): the count, and
 * the tiles written to out (room for the count). */
uint32_t vision_tiles_count(const struct vision_windows *w, bool full);
void vision_tiles_fill(const struct vision_windows *w, bool full, struct cuda_vision_tile *out);

enum vision_gpu_buffer {
    VISION_GPU_X, VISION_GPU_Q, VISION_GPU_K, VISION_GPU_V, VISION_GPU_ROPE, VISION_GPU_TILES,
    VISION_GPU_H, VISION_GPU_A, VISION_GPU_B, VISION_GPU_WORK, VISION_GPU_STAGING, VISION_GPU_BUFFERS
};

struct vision_gpu_layout {
    uint32_t n_patches, n_slots;
    uint32_t n_chunks, chunk_rows, min_rows; /* chunks of whole 2x2 groups, min_rows to chunk_rows patches */
    uint32_t n_window_tiles, n_full_tiles;
    size_t slot_bytes, merger_bytes; /* S and M above */
    size_t bytes[VISION_GPU_BUFFERS];
    size_t peak_bytes; /* their sum: all the device memory the encoding takes */
    /* where each buffer lies: a region of those lent and the offset in it */
    uint32_t region[VISION_GPU_BUFFERS];
    size_t offset[VISION_GPU_BUFFERS];
};

/* The sizes above for chunks of at most chunk_rows patches (a multiple of 4) and n_slots (1, 2). */
void vision_gpu_sizes(const struct mmproj *m, const struct vision_windows *w, uint32_t chunk_rows, uint32_t n_slots,
                      struct vision_gpu_layout *out);
/* Chunk c's patches: [first, first + rows). */
void vision_gpu_chunk(const struct vision_gpu_layout *l, uint32_t c, uint32_t *first, uint32_t *rows);
/* Place the buffers in the regions, largest first, each in the first region with room; false
 * when one finds none. */
bool vision_gpu_place(struct vision_gpu_layout *l, const struct cuda_region *regions, uint32_t n_regions);
/* The layout the encoder runs with (the first that fits, in the order above). Fails, saying what
 * the image needs at the least and what was lent, when none fits, or when a matrix's type or
 * shape has no GPU kernel at the rows it would get (PSHARD_ERR_UNSUPPORTED). */
pshard_status vision_gpu_plan(const struct mmproj *m, const struct vision_windows *w, const struct cuda_region *regions,
                              uint32_t n_regions, struct vision_gpu_layout *out);

/* The same choice by memory alone, not asking whether the matrices' types have GPU kernels at the
 * rows they would get: the planner's, in a build without the CUDA backend (which has no kernels to
 * ask about), planning for a machine with one. */
pshard_status vision_gpu_plan_room(const struct mmproj *m, const struct vision_windows *w, const struct cuda_region *regions,
                                   uint32_t n_regions, struct vision_gpu_layout *out);
/* Where an image's encoding takes its device memory (VLMOpt: the encoder's phase and the language
 * model's take the budget in turn): the scratch the executor lends between steps where the buffers
 * fit there, the language model keeping everything; else the whole budget (exec_gpu_lend_all), the
 * language model's cells going to the host and its plan carved again after; else none (the CPU). */
enum vision_gpu_memory { VISION_GPU_IN_SCRATCH, VISION_GPU_IN_BUDGET, VISION_GPU_NONE };

/* The choice above for the patches of w: vision_gpu_plan (kernels; else vision_gpu_plan_room) over
 * the regions lent, then over one region of whole_bytes (what a loan of the whole budget gives; 0:
 * none). *where and out: the memory and the layout taken there; where neither holds the encoder,
 * VISION_GPU_NONE, the least layout the image needs, and a failure naming it, the room lent and the
 * whole budget; a shape or type without GPU kernels fails as vision_gpu_plan does. */
pshard_status vision_gpu_choose(const struct mmproj *m, const struct vision_windows *w, bool kernels,
                                const struct cuda_region *lent, uint32_t n_lent, uint64_t whole_bytes,
                                struct vision_gpu_layout *out, enum vision_gpu_memory *where);
/* Its name in messages: "the scratch lent between steps", "the whole budget", "none". */
const char *vision_gpu_memory_name(enum vision_gpu_memory where);

/* Bytes one unit of the staging sequence copies up: unit 0 the patch kernel, 1..n_layer the
 * blocks, n_layer + 1 the merger. */
size_t vision_gpu_unit_bytes(const struct mmproj *m, uint32_t unit);

/* ---- the encoder */

/* What the encoder keeps of an mmproj between images: its file mapped for copies (pinned where
 * the driver allows) and the norms, biases and patch kernel in f32 in pinned memory. */
struct vision_gpu;
pshard_status vision_gpu_create(const struct mmproj *m, struct vision_gpu **out);
void vision_gpu_free(struct vision_gpu *g);

/* Encode on the GPU with `cuda`'s streams and cuBLAS, every buffer in the regions lent as
 * `layout` (vision_gpu_plan over the same patches and regions) places them; returns when the
 * embeddings are in host memory and nothing of the encoding is left running on the device. */
pshard_status vision_encode_gpu(struct vision_gpu *g, const struct vision_patches *p, const struct vision_gpu_layout *layout,
                                struct cuda_ctx *cuda, const struct cuda_region *regions,
                                const struct vision_progress *progress, struct vision_embeddings *out);

#endif
