/* The state behind a pshard_ctx. */
#ifndef ENGINE_INTERNAL_H
#define ENGINE_INTERNAL_H

#include "engine/sampler.h"
#include "exec/exec.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "plan/profile.h"
#include "pshard.h"
#include "tok/chat.h"
#include "tok/tok.h"

struct pshard_ctx {
    bool batch_chosen; /* params.n_batch chosen by the planner (exec_choose_batch) */
    struct gguf_file *file;
    struct model model;
    struct tok *tok;
    struct exec_ctx *exec;
    struct chat_template chat;
    pshard_params params;
    struct plan_options options; /* ideas turned off for comparison (engine_open; pshard_open: none) */
    struct profile profile; /* what automatic plans were chosen with */
    bool learn;             /* the plan is automatic and the profile measured: running refines it */
    /* Tokens whose K/V sit in sequence 0, for prefix reuse across calls. */
    int32_t *cached;
    int32_t n_cached;
    uint64_t prefill_streamed; /* weight bytes the last prompt moved over PCIe */
    int32_t *prompt; /* scratch for the prompt's tokens, n_ctx long */
    int32_t *batch_pos, *batch_seq;
    int8_t *batch_logits;
    struct engine_batch *batch; /* requests and the sequences running them (batch.c) */
    struct engine_vision *vision; /* the mmproj's encoder and the conversation's images (vision.c), or NULL */
    /* The budget following the device's free memory (budget.c): keep bytes left to other
     * programs; when it was last checked, since when free memory has stayed high enough to grow. */
    bool follow, floor_warned;
    int64_t keep;
    double polled_ms, grow_since_ms;
    /* How long opening took (ms): reading the file's header, model and tokenizer; planning (the
     * profile measured or read, the micro-batch chosen); touching the weights' pages; making the
     * executor (on a GPU: the context, the arena, the pinned mapping, the resident weights up);
     * and the last vision encoder loaded (pshard_vision_load). */
    double load_file_ms, load_plan_ms, load_pages_ms, load_exec_ms, load_vision_ms;
};

/* Whether a token ends a turn: the tokenizer's end-of-generation tokens and the control tokens
 * that end one in the chat families we support. */
bool engine_is_end_of_turn(const struct tok *tok, int32_t id);

/* The scheduler of many sequences (batch.c): created with the context, freed with it. */
pshard_status engine_batch_create(pshard_ctx *ctx);
void engine_batch_free(pshard_ctx *ctx);
/* Requests queued or running. */
int32_t engine_batch_pending(const pshard_ctx *ctx);
/* The tokens sequence s's cells hold: its request's computed ones, or what a finished one left
 * (sequence 0's are the one-sequence calls' ctx->cached). */
const int32_t *engine_batch_held(const pshard_ctx *ctx, int32_t s, int32_t *n);

/* The executor's parameters of a context opened with p and options (engine.c): what a fresh
 * context at a budget plans with, and what a running one re-plans with. */
void engine_exec_params(const pshard_params *p, const struct plan_options *options, const struct model *model,
                        struct exec_params *ep);

/* Following free memory (budget.c): check it, at most every poll interval unless `now`, and change
 * the budget where it says so. Called at every step boundary. */
pshard_status engine_budget_poll(pshard_ctx *ctx, bool now);
/* Before each step: following free memory, the check (a failed change is logged; the step then
 * says what it needs). */
void engine_budget_step(pshard_ctx *ctx);
/* The budget's fields of pshard_info. */
void engine_budget_info(const pshard_ctx *ctx, pshard_info *info);

#endif
