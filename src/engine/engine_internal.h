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
    struct gguf_file *file;
    struct model model;
    struct tok *tok;
    struct exec_ctx *exec;
    struct chat_template chat;
    pshard_params params;
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
};

/* Whether a token ends a turn: the tokenizer's end-of-generation tokens and the control tokens
 * that end one in the chat families we support. */
bool engine_is_end_of_turn(const struct tok *tok, int32_t id);

/* The scheduler of many sequences (batch.c): created with the context, freed with it. */
pshard_status engine_batch_create(pshard_ctx *ctx);
void engine_batch_free(pshard_ctx *ctx);
/* Requests queued or running. */
int32_t engine_batch_pending(const pshard_ctx *ctx);

#endif
