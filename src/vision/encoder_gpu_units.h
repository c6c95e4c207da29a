/* Inside the GPU encoder (encoder_gpu.c and its plan): what one unit of the staging sequence
 * copies up, part by part, and the device view of a matrix that arrived. */
#ifndef VISION_ENCODER_GPU_UNITS_H
#define VISION_ENCODER_GPU_UNITS_H

#include "vision/encoder_gpu.h"

/* A part goes up as the file has it (a matrix), as f32 (a norm's gains, a bias), or as the patch
 * kernel: both frames' kernels in f32, [n_embd][3][2][P][P], laid out as a patch is. */
enum vision_part_kind { VISION_PART_RAW, VISION_PART_F32, VISION_PART_PATCH };

struct vision_gpu_part {
    const struct gguf_tensor *t;
    enum vision_part_kind kind;
};

/* A block's parts: q, k, v, out, gate, up, down, then ln1, ln2 and the biases of q, k, v, out,
 * gate, up, down. The merger's: mm.0, mm.2, then post_ln and the biases of mm.0 and mm.2. */
enum { VISION_BLOCK_MATRICES = 7, VISION_BLOCK_VECTORS = 9, VISION_UNIT_PARTS = 16 };

static inline uint32_t vision_gpu_patch_dim(const struct vision_hparams *hp) {
    return 3u * VISION_TEMPORAL_PATCH * hp->patch_size * hp->patch_size;
}

/* The parts of unit `unit` (0: the patch kernel, 1..n_layer: the blocks, n_layer + 1: the merger). */
uint32_t vision_gpu_unit_parts(const struct mmproj *m, uint32_t unit, struct vision_gpu_part *out);
size_t vision_gpu_part_bytes(const struct mmproj *m, const struct vision_gpu_part *p);
/* The matrix of tensor t whose copy is at dev. */
struct cuda_matrix vision_gpu_matrix(const struct gguf_tensor *t, const void *dev);

#endif
