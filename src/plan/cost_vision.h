/* The vision encoder's phase priced from the machine profile: how long an image of W x H pixels
 * takes to encode on the GPU (VLMOpt's way: the weights streamed from host memory block by block,
 * each block's copy beside the previous block's compute) and on the CPU, how much device memory
 * the GPU's encoding takes, and where the engine would encode it under a plan. The engine encodes
 * on the GPU where its buffers fit the scratch the executor lends between steps (exec_lend.h), or
 * else the whole budget (the language model's memory given up and carved again after); this asks
 * the same function it does (vision_gpu_choose), with the regions the plan leaves lendable and its
 * whole budget, so `pshard plan --image-size` and a run choose alike. */
#ifndef PLAN_COST_VISION_H
#define PLAN_COST_VISION_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda_backend.h"
#include "model/model.h"
#include "plan/plan.h"
#include "plan/profile.h"
#include "vision/encoder_gpu.h"
#include "vision/mmproj.h"

/* A typical request with an image asks a short question about it: this many text tokens besides
 * the image's, the chat template's included. */
enum { COST_VISION_QUESTION_TOKENS = 32, COST_VISION_REGIONS = 4 };

/* What plan p lends between steps, as the executor carves and lends it (exec_gpu_lend): its work
 * buffer, its activations, its staging slots and the part of the budget it leaves unused, one
 * region each (their addresses unset: only their sizes place the encoder's buffers). The executor
 * merges regions that touch and carves a little less than the plan's figures for the activations
 * (the block table and the tensors' rounding are in them), so this is the plan's view, to within
 * a few MB. 0 regions where the plan keeps every shard on the CPU (no GPU placement, nothing to
 * lend). */
uint32_t cost_vision_lendable(const struct plan *p, struct cuda_region out[COST_VISION_REGIONS]);
/* What a loan of plan p's whole budget gives the encoder (exec_gpu_lend_all): its arena (the budget
 * less the file mapping's reserve, the most either phase keeps) less cuBLAS's workspace (the plan's
 * figure); 0 where
 * the plan keeps every shard on the CPU. */
uint64_t cost_vision_whole(const struct plan *p);

struct cost_vision {
    uint32_t width, height;          /* the image after the model's smart resize */
    uint32_t grid_h, grid_w;         /* its patches down and across */
    uint32_t n_patches, n_tokens;    /* patches, and image tokens after the 2x2 merge */
    double gpu_s, cpu_s;             /* the encoding on the GPU (inf where the GPU's encoder cannot take
                                        this model, or the profile has no GPU) and on the CPU */
    double gpu_copy_s, gpu_compute_s; /* the GPU's parts, which overlap: the weights' copies, the compute */
    uint64_t streamed_bytes;         /* weights copied up for one image */
    /* The layout the GPU's encoder takes in the room lent (on_gpu), or else the least it needs
     * (chunks of 64 patches, one slot): its peak_bytes is the device memory the encoding takes.
     * gpu_s is priced over the layout taken, or, where none fits, the one it takes with room. */
    struct vision_gpu_layout layout;
    uint64_t lent_bytes;             /* the room lent, all regions together */
    uint64_t whole_bytes;            /* what the whole budget gives (0: no loan of it weighed) */
    enum vision_gpu_memory memory;   /* the memory the engine would encode it in under the plan */
    bool on_gpu;                     /* where the engine would encode it under the plan: memory is
                                        the scratch or the whole budget */
    /* In the whole budget: the language model's resident weights copied up again after the
     * encoding, and their time at the profile's pinned copy rate (0 elsewhere). */
    uint64_t reupload_bytes;
    double reupload_s;
    bool kernels_checked;            /* false: a build without the CUDA backend, which cannot say
                                        whether the GPU has kernels for the matrices (memory alone) */
    char why_cpu[256];               /* why not on the GPU, where on_gpu is false */
};

/* Price an image of width x height pixels for encoder m, given the regions a plan lends
 * (cost_vision_lendable; none: no GPU placement), what its whole budget gives (cost_vision_whole;
 * 0: no such loan) and its resident weights (plan_budget.weights: what goes up again after a loan
 * of the whole budget). offload: the GPU may encode it (false: --no-mmproj-offload,
 * pshard_params.no_mmproj_offload, keeps the encoder on the CPU; both times are priced still).
 * Fails where the image cannot be encoded at all (an aspect ratio over 200, as vision_patches_size
 * says). */
pshard_status cost_vision_encode(const struct profile *prof, const struct mmproj *m, uint32_t width, uint32_t height,
                                 const struct cuda_region *regions, uint32_t n_regions, uint64_t whole_bytes,
                                 uint64_t resident_bytes, bool offload, struct cost_vision *out);
/* The encoding's seconds where the engine runs it: the GPU's (with the re-upload after a loan of the
 * whole budget) or the CPU's. */
static inline double cost_vision_encode_s(const struct cost_vision *v) {
    return v->on_gpu ? v->gpu_s + v->reupload_s : v->cpu_s;
}

/* The prompt of a request with the image: its tokens between <|vision_start|> and <|vision_end|>,
 * and n_question text tokens. */
static inline int32_t cost_vision_prompt_tokens(const struct cost_vision *v, int32_t n_question) {
    return (int32_t)v->n_tokens + 2 + n_question;
}

/* Seconds to the first token of one request with the image under plan p of language model lm:
 * the encoding where the engine runs it (cost_vision_encode_s), then the prompt's steps (cost_request: steps of the
 * plan's micro-batch over the cells before them); *prompt_s the steps alone. */
double cost_vision_first_token(const struct profile *prof, const struct model *lm, const struct plan *p,
                               const struct cost_vision *v, int32_t n_question, double *prompt_s);

#endif
