/* The executor: runs one step (a batch of new tokens of one or more sequences) through the
 * shard list and leaves logits for the tokens that asked for them. This is the CPU reference
 * every later placement is checked against. */
#ifndef EXEC_EXEC_H
#define EXEC_EXEC_H

#include <stdint.h>

#include "model/model.h"
#include "plan/plan.h"

struct exec_params {
    int32_t n_ctx;     /* cells per sequence */
    int32_t n_batch;   /* most tokens one step may carry */
    int32_t n_seq;     /* sequence slots */
    int32_t n_threads; /* 0: all cores */
    enum plan_family plan;
    int64_t vram_budget; /* bytes; 0: CPU only; < 0: what the plan needs (gpu) */
    float stream_share;  /* dynamic plans: share of the non-resident experts streamed (0: balanced) */
    int32_t staging;     /* gpu, static, dynamic: the resident set (enum plan_set); -1 as the family wants */
    const struct profile *profile; /* auto plans: the machine's profile (NULL: conservative defaults) */
    int32_t decode_set;  /* auto: PLAN_DECODE_WEIGHED, decode steps over a set of their own where the planner
                            finds it pays; PLAN_DECODE_SAME, one set for every step; else decode steps
                            over this set (enum plan_set) */
    int32_t n_decode;    /* auto: tokens a request generates, which the planner weighs by (0: 128) */
    bool dynamic_in_place; /* dynamic: every tier splits with the CPU, reading in place, as auto's
                              candidates do (else tiers of PLAN_RING_ALL_MIN_TOKENS on stream all
                              through the ring) */
    int32_t n_cells;     /* cells of the KV pool all sequences share, in blocks of exec_block_cells
                            (n_ctx stays the most one sequence may hold; a pool smaller than that is
                            allowed); 0: n_ctx * n_seq, room for every sequence at n_ctx */
    struct plan_options options; /* ideas turned off for comparison (zeroed: none; plan_options) */
};

struct exec_batch {
    int32_t n_tokens;
    const int32_t *tokens;
    const int32_t *pos;    /* position of each token within its sequence */
    const int32_t *seq;    /* sequence slot of each token */
    const int8_t *logits;  /* per token: nonzero = compute its logits; NULL = the last token only */
};

/* What a step's tokens may carry beyond their ids: a prompt with images (exec_step_media). */
struct exec_media {
    /* Models with multimodal rope (rope sections): each token's time, row and column positions,
     * [3][n_tokens]; NULL: all three are pos. After an image they run behind pos (an image of
     * h x w tokens takes h * w cells but max(h, w) positions). */
    const int32_t *rope_pos;
    /* Input embeddings (an image's tokens): tokens [embd_first, embd_first + embd_count) take
     * their rows of embd ([embd_count][n_embd]) in place of the token embedding's; their token
     * ids are still checked but not looked up. embd NULL: none. */
    const float *embd;
    int32_t embd_first, embd_count;
};

/* What the last step did. */
struct exec_stats {
    uint64_t weight_bytes_read; /* weight bytes the step touched (chosen experts only) */
    uint64_t streamed_bytes;    /* of those, bytes that crossed PCIe (copied to a slot or read in place) */
    int32_t n_outputs;
    /* Where a step with a GPU spent the host's time: computing the CPU's shards and experts, and
     * waiting for the GPU (hand-offs, the end of the step). */
    double host_compute_ms, host_wait_ms;
    /* A replayed decode step's hand-offs, timed on the GPU (plan_options.trace_handoffs; else 0): the
     * GPU's work between them (from a layer's go to the next layer's ready) and the hand-offs
     * themselves (from ready until the GPU goes on: its own part of the layer, then waiting for
     * the host's), over handoffs layers. */
    double gpu_between_ms, gpu_handoff_ms;
    int32_t handoffs;
};

struct exec_ctx;

/* How many CUDA devices this process sees (0 without the CUDA backend or a GPU). */
int exec_device_count(void);

/* Many sequences (n_seq > 1) share one pool: n_ctx, as given, becomes the pool's cells (n_cells),
 * and a sequence's positions are capped at the context the model was trained for (n_ctx_train;
 * 0: unknown). One sequence keeps n_ctx as it is. The engine and `pshard plan` both size so. */
void exec_params_share_pool(struct exec_params *params, uint32_t n_ctx_train);

pshard_status exec_create(const struct model *model, const struct exec_params *params, struct exec_ctx **out);
void exec_free(struct exec_ctx *ctx);

/* Run one step. Tokens of a sequence must continue it: positions len, len+1, ... in order.
 * Fails without changing any state on bad input (token id, slot, position, context full). */
pshard_status exec_step(struct exec_ctx *ctx, const struct exec_batch *batch);
/* The same with rope positions and input embeddings for the batch's tokens (media NULL: none). */
pshard_status exec_step_media(struct exec_ctx *ctx, const struct exec_batch *batch, const struct exec_media *media);

/* Logits of the i-th output of the last step (outputs in batch order), n_vocab floats, valid
 * until the next step. */
const float *exec_logits(const struct exec_ctx *ctx, int32_t i);
int32_t exec_n_vocab(const struct exec_ctx *ctx);
/* The executor's CPU threads, free between steps for the caller's data-parallel work. */
struct threadpool *exec_threads(struct exec_ctx *ctx);
const struct exec_stats *exec_last_stats(const struct exec_ctx *ctx);

int32_t exec_seq_len(const struct exec_ctx *ctx, int32_t seq);
/* Keep only the first len cells of a sequence (0 forgets it; the slot can be reused). */
void exec_truncate_seq(struct exec_ctx *ctx, int32_t seq, int32_t len);
/* Benchmarks: make sequence `seq` `len` cells long without computing them (K and V zero), so a
 * step can be timed at any context length. */
pshard_status exec_fill_seq(struct exec_ctx *ctx, int32_t seq, int32_t len);
/* The KV pool: cells held by no sequence (whole free blocks), so a scheduler admits sequences
 * only when they fit; and the cells of a block, the unit sequences take the pool in. A step
 * takes the blocks its new cells need and fails with PSHARD_ERR_RANGE, changing nothing, when
 * the pool lacks them; truncating a sequence gives back its blocks past the new length. */
int32_t exec_free_cells(const struct exec_ctx *ctx);
int32_t exec_block_cells(const struct exec_ctx *ctx);
/* Sequence dst (empty) starts with the first n_cells of src (at most its length), without
 * computing them: src's whole blocks are shared (held by both, never written while shared), the
 * rest copied into a block of dst's own. Errors change nothing. */
pshard_status exec_share_prefix(struct exec_ctx *ctx, int32_t dst_seq, int32_t src_seq, int32_t n_cells);
const struct exec_params *exec_get_params(const struct exec_ctx *ctx);
uint64_t exec_kv_bytes(const struct exec_ctx *ctx);

/* The plan the executor follows. */
const struct plan *exec_get_plan(const struct exec_ctx *ctx);

/* Build the plan a context with these parameters follows, without loading anything onto the GPU
 * or needing one (exec_create follows it; `pshard plan` prints it). Free with plan_free. */
pshard_status exec_make_plan(const struct model *model, const struct exec_params *params, struct plan *out);

/* The micro-batch where none was asked for, under a budget the model does not fit whole: each
 * prompt chunk reads the weights that are not resident once more, so larger chunks read a long
 * prompt's weights fewer times, while their activations and work buffers take VRAM from resident
 * weights. Of EXEC_BATCH_SIZES sizes, 512 and 1024 (up to the context, at least one token of every
 * sequence; not more: the typical request's prompt fills one step of 1024, so a larger size could
 * only lose there, while a longer prompt gains from one: -b 2048 or 4096 by hand), each priced by
 * its plan's typical request (plan.predicted_ttft and n_decode steps of predicted_decode), the
 * largest within EXEC_BATCH_MARGIN of the soonest: the typical 1K-token prompt does not show what
 * a longer one gains. A larger size whose plan fails (its buffers do not fit) is passed over; where the smallest fails, its error is returned (the least budget it names
 * holds for every size). n_batch unchanged where the plan at the smallest size weighs nothing (the
 * model fits whole). */
enum { EXEC_BATCH_SIZES = 2 };
#define EXEC_BATCH_MARGIN 0.02
struct exec_batch_choice {
    int n;                               /* sizes weighed (0: nothing to choose, n_batch as it was) */
    int32_t n_batch[EXEC_BATCH_SIZES];
    double request_s[EXEC_BATCH_SIZES];  /* the typical request's predicted seconds; INFINITY: no plan */
    int chosen;
};
pshard_status exec_choose_batch(const struct model *model, struct exec_params *params, struct exec_batch_choice *out);

/* The parameters that build candidate `cand` of an automatic plan alone: its family, stream share
 * and resident set, the rest as in `params` (the oracle runs each; `pshard plan --tokens` prices
 * each). */
struct exec_params exec_params_for_candidate(const struct exec_params *params, const struct plan_candidate *cand);

/* The GPU placement's device memory, or NULL when the step runs on the CPU. */
struct gpu_memory_report;
const struct gpu_memory_report *exec_gpu_memory(const struct exec_ctx *ctx);

#endif
