/* The GPU's scratch lent between two steps to other work on the device (the vision encoder), so
 * that work runs inside the budget without a byte of its own: the executor's work buffer, its
 * activations, its staging slots and the part of the arena the plan left uncarved. Nothing a
 * later step reads before writing lives there; the slots' lent units are copied again before a
 * step that reads them. Resident weights, the KV cache, its block table, the expert masks and
 * cuBLAS's workspace are never lent. */
#ifndef EXEC_EXEC_LEND_H
#define EXEC_EXEC_LEND_H

#include "cuda/cuda_backend.h"

struct exec_ctx;

enum { EXEC_LOAN_REGIONS = 4 + 8 };

struct exec_gpu_loan {
    struct cuda_ctx *cuda; /* the executor's: its streams and cuBLAS handle (workspace in the arena) */
    uint32_t n_regions;
    struct cuda_region regions[EXEC_LOAN_REGIONS]; /* disjoint, by address, adjacent ones merged */
    size_t bytes;                                  /* their sum */
};

/* Lend the scratch, once the device is idle (both streams drained). Fails without the GPU
 * placement, or while its arena is not carved (a change of budget that did not fit). */
pshard_status exec_gpu_lend(struct exec_ctx *ctx, struct exec_gpu_loan *out);
/* The borrower is done (its work finished on the device): the next step refills what it needs. */
void exec_gpu_lend_end(struct exec_ctx *ctx);

/* The whole budget lent, for work that the scratch cannot hold (VLMOpt: the encoder's phase and the
 * language model's take the budget in turn, so the peak is the larger of the two, not their sum).
 * Between steps, once the device is idle: the KV cells of the layers in VRAM are copied to the
 * host's cache (made and pinned on first use, as a change of budget does), the plan's arena is
 * emptied, and all of it but cuBLAS's workspace (kept at its place at the arena's start) is lent as
 * one region. The arena's allocation is kept, not freed and allocated again: it is the budget's
 * own bytes, so the budget is never exceeded, and no other program can take them in between. Steps
 * are refused until exec_gpu_lend_all_end. Fails, changing nothing, where exec_gpu_lend would. */
pshard_status exec_gpu_lend_all(struct exec_ctx *ctx, struct exec_gpu_loan *out);
/* The borrower is done with the whole budget (its work finished): the same plan carved again, its
 * resident weights and then its cells copied up. Where that fails, steps stay refused. Nothing
 * without a loan of the whole budget. */
pshard_status exec_gpu_lend_all_end(struct exec_ctx *ctx);
/* What exec_gpu_lend_all would lend now, in bytes (0 where it cannot lend), and in *reupload_bytes
 * the resident weights its end copies up again (the cells of the layers in VRAM besides). */
uint64_t exec_gpu_lend_all_bytes(const struct exec_ctx *ctx, uint64_t *reupload_bytes);

#endif
