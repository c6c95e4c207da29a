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

#endif
