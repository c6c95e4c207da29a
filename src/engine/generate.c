/* The generation loop: tokenize, reuse the cached prefix, prefill the rest in micro-batches,
 * then sample and decode one token per step until an end-of-generation token, the token limit
 * or a full context; text is streamed in whole UTF-8 characters. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "engine/engine_internal.h"
#include "engine/vision.h"
#include "plan/cost.h"

void pshard_sampling_default(pshard_sampling *s) {
    struct sampler_params p;
    sampler_default_params(&p);
    *s = (pshard_sampling){p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.presence_penalty,
                           p.frequency_penalty, p.penalty_last_n, p.seed};
}

void pshard_gen_opts_default(pshard_gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 256;
    o->parse_special = 1;
    pshard_sampling_default(&o->sampling);
}

/* Tokens that end a turn in the families we support, beyond the tokenizer's EOS/EOT/EOM. */
bool engine_is_end_of_turn(const struct tok *tok, int32_t id) {
    if (tok_is_eog(tok, id)) return true;
    if (tok_token_type(tok, id) != 3 /* CONTROL */) return false;
    static const char *const names[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>"};
    size_t len;
    const char *text = tok_token_text(tok, id, &len);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (text && len == strlen(names[i]) && !memcmp(text, names[i], len)) return true;
    return false;
}

/* Run tokens [from, to) of ctx->prompt through the model; logits for the last one. After each
 * step, the caller's on_prompt hears how far it got, and may stop it. */
static pshard_status prefill(pshard_ctx *ctx, const pshard_gen_opts *opts, int32_t from, int32_t to) {
    const int32_t n_batch = ctx->params.n_batch;
    for (int32_t start = from, n; start < to; start += n) {
        n = to - start < n_batch ? to - start : n_batch;
        struct exec_batch b = {n, ctx->prompt + start, ctx->batch_pos, ctx->batch_seq, ctx->batch_logits};
        const struct exec_media *media = engine_vision_prompt_step(ctx, start, &b); /* images: one's run a step at most */
        n = b.n_tokens;
        for (int32_t i = 0; i < n; i++) {
            ctx->batch_pos[i] = start + i;
            ctx->batch_logits[i] = start + i == to - 1;
        }
        engine_budget_step(ctx);
        CORE_TRY(exec_step_media(ctx->exec, &b, media));
        ctx->prefill_streamed += exec_last_stats(ctx->exec)->streamed_bytes;
        memcpy(ctx->cached + start, ctx->prompt + start, sizeof(int32_t) * (size_t)n);
        ctx->n_cached = start + n;
        if (opts->on_prompt && opts->on_prompt(opts->prompt_user, start + n - from, to - from))
            return core_fail(PSHARD_ERR_INVALID_ARG, "prompt cancelled after %d of its %d tokens", start + n - from, to - from);
    }
    return PSHARD_OK;
}

struct generation {
    pshard_ctx *ctx;
    const pshard_gen_opts *opts;
    struct sampler *sampler;
    struct tok_decoder *decoder;
    pshard_text_cb on_text;
    void *user;
    pshard_gen_stats *stats;
};

/* Sample, stream and step until done. Ownership of sampler/decoder stays with the caller. */
static pshard_status decode_loop(struct generation *g, double t_start) {
    pshard_ctx *ctx = g->ctx;
    const int32_t n_ctx = ctx->params.n_ctx;
    double t_first = 0, t_last = 0;
    int32_t n_steps = 0; /* decode steps run: one per token after the first, and one more that gave an end */
    uint64_t bytes = 0, streamed = 0;
    double host_compute = 0, host_wait = 0, between = 0, handoff = 0;
    int64_t handoffs = 0;
    for (;;) {
        if (g->opts->n_predict == 0) break; /* the prompt only: nothing is sampled */
        const int32_t token = sampler_sample(g->sampler, exec_logits(ctx->exec, 0));
        if (g->stats->n_generated == 0) {
            t_first = core_now_ms();
            g->stats->ttft_ms = t_first - t_start;
        }
        if (!g->opts->ignore_eos && engine_is_end_of_turn(ctx->tok, token)) {
            g->stats->stopped_by_eog = 1;
            break;
        }
        t_last = core_now_ms();
        sampler_accept(g->sampler, token);
        if (g->opts->out_tokens && g->stats->n_generated < g->opts->out_tokens_cap)
            g->opts->out_tokens[g->stats->n_generated] = token;
        g->stats->n_generated++;
        const char *text;
        size_t len;
        CORE_TRY(tok_decoder_push(g->decoder, token, &text, &len));
        if (len && g->on_text && g->on_text(g->user, text, len)) break;
        if ((g->opts->n_predict >= 0 && g->stats->n_generated >= g->opts->n_predict) || ctx->n_cached >= n_ctx) break;
        const int32_t pos = ctx->n_cached;
        struct exec_batch b = {1, &token, &pos, ctx->batch_seq, NULL};
        int32_t rope[3];
        const struct exec_media media = {engine_vision_decode_rope(ctx, pos, rope), NULL, 0, 0};
        engine_budget_step(ctx);
        CORE_TRY(exec_step_media(ctx->exec, &b, &media));
        bytes += exec_last_stats(ctx->exec)->weight_bytes_read;
        streamed += exec_last_stats(ctx->exec)->streamed_bytes;
        host_compute += exec_last_stats(ctx->exec)->host_compute_ms;
        host_wait += exec_last_stats(ctx->exec)->host_wait_ms;
        between += exec_last_stats(ctx->exec)->gpu_between_ms;
        handoff += exec_last_stats(ctx->exec)->gpu_handoff_ms;
        handoffs += exec_last_stats(ctx->exec)->handoffs;
        ctx->cached[ctx->n_cached++] = token;
        n_steps++;
    }
    /* A character the model left unfinished before its end is one U+FFFD; one cut by the token
     * limit, the context or the caller is dropped: its rest was never generated. */
    const char *text;
    size_t len;
    if (g->stats->stopped_by_eog && tok_decoder_flush(g->decoder, &text, &len) == PSHARD_OK && len && g->on_text)
        g->on_text(g->user, text, len);
    /* Means per step, over every step run (a reply that ends at an end token ran one step more
     * than it shows tokens); decode_ms is the time of the tokens after the first. */
    if (g->stats->n_generated > 1) g->stats->decode_ms = t_last - t_first;
    if (n_steps > 0) {
        g->stats->decode_weight_bytes = bytes / (uint64_t)n_steps;
        g->stats->decode_streamed_bytes = streamed / (uint64_t)n_steps;
        g->stats->decode_host_compute_ms = host_compute / n_steps;
        g->stats->decode_host_wait_ms = host_wait / n_steps;
        g->stats->decode_gpu_between_ms = between / n_steps;
        g->stats->decode_gpu_handoff_ms = handoff / n_steps;
        g->stats->decode_handoffs = (int32_t)(handoffs / n_steps);
    }
    return PSHARD_OK;
}

/* What the cost model predicts for this call's steps (scaled and raw), and what running taught it:
 * measured over predicted folds into the profile, saved for the next plan (a decode that changed
 * plan teaches nothing: its mean mixes two plans' steps). */
static void predict_and_learn(pshard_ctx *ctx, int32_t from, int32_t n_prompt, pshard_gen_stats *s) {
    const struct plan *plan = exec_get_plan(ctx->exec);
    if (!ctx->learn || !plan->any_gpu) return;
    const int32_t n_batch = ctx->params.n_batch;
    struct cost_step c;
    double prefill = 0, prefill_raw = 0;
    for (int32_t done = from; done < n_prompt; done += n_batch) {
        const int32_t n = n_prompt - done < n_batch ? n_prompt - done : n_batch;
        cost_plan_step(&ctx->profile, &ctx->model, plan, n, done, &c);
        prefill += c.seconds, prefill_raw += c.raw_seconds;
    }
    bool one_plan;
    cost_decode_mean(&ctx->profile, &ctx->model, plan, n_prompt, s->n_generated - 1, &c, &one_plan);
    s->predicted_prefill_ms = prefill * 1e3;
    s->predicted_decode_step_ms = c.seconds * 1e3;
    bool learned = false;
    if (s->n_prompt >= PLAN_RING_MIN_TOKENS) {
        const int32_t first = n_prompt - from < n_batch ? n_prompt - from : n_batch;
        cost_learn(&ctx->profile, &ctx->model, plan_step_tier(plan, first, from + first)->family, first, prefill_raw,
                   s->prefill_ms / 1e3);
        learned = true;
    }
    if (s->n_generated > 8 && s->decode_ms > 0 && one_plan) {
        cost_learn(&ctx->profile, &ctx->model, plan_step_tier(plan, 1, n_prompt + 1)->family, 1, c.raw_seconds,
                   s->decode_ms / 1e3 / (s->n_generated - 1));
        learned = true;
    }
    char path[4096];
    if (learned && profile_path(&ctx->profile.fp, path, sizeof path) == PSHARD_OK) profile_save(path, &ctx->profile);
}

pshard_status pshard_generate(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts, pshard_text_cb on_text,
                              void *user, pshard_gen_stats *stats) {
    pshard_gen_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    pshard_gen_opts defaults;
    if (!opts) pshard_gen_opts_default(&defaults), opts = &defaults;
    if (!prompt) return core_fail(PSHARD_ERR_INVALID_ARG, "no prompt given");
    if (engine_batch_pending(ctx))
        return core_fail(PSHARD_ERR_INVALID_ARG, "requests are running (pshard_request_add); step them to the end or cancel them first");
    const double t_start = core_now_ms();
    int32_t n_prompt = 0;
    CORE_TRY(engine_vision_prompt(ctx, prompt, opts, &n_prompt, stats));

    /* Reuse the longest common prefix of the cache; at least one token must run for logits. */
    int32_t keep = 0;
    while (keep < ctx->n_cached && keep < n_prompt && ctx->cached[keep] == ctx->prompt[keep]) keep++;
    if (keep == n_prompt) keep--;
    exec_truncate_seq(ctx->exec, 0, keep);
    ctx->n_cached = keep;
    stats->n_prompt_cached = keep;
    stats->n_prompt = n_prompt - keep;

    const pshard_sampling *sp = &opts->sampling;
    struct sampler_params params = {sp->temperature, sp->top_k, sp->top_p, sp->min_p, sp->repeat_penalty,
                                    sp->presence_penalty, sp->frequency_penalty, sp->penalty_last_n, sp->seed};
    struct generation g = {ctx, opts, NULL, NULL, on_text, user, stats};
    pshard_status st = sampler_create(&params, exec_n_vocab(ctx->exec), &g.sampler);
    if (st == PSHARD_OK) st = tok_decoder_create(ctx->tok, 0, &g.decoder);
    if (st == PSHARD_OK) {
        for (int32_t i = 0; i < n_prompt; i++) sampler_accept(g.sampler, ctx->prompt[i]);
        ctx->prefill_streamed = 0;
        st = prefill(ctx, opts, keep, n_prompt);
        stats->prefill_ms = core_now_ms() - t_start;
        stats->prefill_streamed_bytes = ctx->prefill_streamed;
    }
    if (st != PSHARD_OK) exec_truncate_seq(ctx->exec, 0, ctx->n_cached = 0); /* a failed step leaves no stale cells */
    else st = decode_loop(&g, t_start);
    if (st == PSHARD_OK) predict_and_learn(ctx, keep, n_prompt, stats);
    tok_decoder_free(g.decoder);
    sampler_free(g.sampler);
    return st;
}

pshard_status pshard_eval(pshard_ctx *ctx, const int32_t *tokens, int32_t n_tokens, const int32_t *steps, int32_t n_steps,
                          pshard_logits_cb on_logits, void *user) {
    const int32_t n_batch = ctx->params.n_batch, n_vocab = exec_n_vocab(ctx->exec);
    if (!tokens || n_tokens <= 0 || !on_logits) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_eval: no tokens or no callback");
    if (n_tokens > ctx->params.n_ctx)
        return core_fail(PSHARD_ERR_RANGE, "%d tokens but the context holds %d (raise -c)", n_tokens, ctx->params.n_ctx);
    for (int32_t k = 0; steps && k < n_steps; k++)
        if (steps[k] < 1 || steps[k] > n_batch)
            return core_fail(PSHARD_ERR_INVALID_ARG, "a step of %d tokens: steps take 1 to the batch size (%d)", steps[k], n_batch);
    if (steps && n_steps <= 0) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_eval: steps given but n_steps is %d", n_steps);
    if (engine_batch_pending(ctx))
        return core_fail(PSHARD_ERR_INVALID_ARG, "requests are running (pshard_request_add); step them to the end or cancel them first");
    exec_truncate_seq(ctx->exec, 0, ctx->n_cached = 0);
    pshard_status st = PSHARD_OK;
    for (int32_t start = 0, m, k = 0; st == PSHARD_OK && start < n_tokens; start += m, k++) {
        const int32_t want = steps ? steps[k % n_steps] : n_batch;
        m = n_tokens - start < want ? n_tokens - start : want;
        for (int32_t i = 0; i < m; i++) ctx->batch_pos[i] = start + i, ctx->batch_logits[i] = 1;
        const struct exec_batch b = {m, tokens + start, ctx->batch_pos, ctx->batch_seq, ctx->batch_logits};
        st = exec_step(ctx->exec, &b);
        for (int32_t i = 0; st == PSHARD_OK && i < m; i++)
            if (on_logits(user, start + i, exec_logits(ctx->exec, i), n_vocab))
                st = core_fail(PSHARD_ERR_INVALID_ARG, "evaluation stopped at position %d", start + i);
    }
    exec_truncate_seq(ctx->exec, 0, 0);
    return st;
}

pshard_status pshard_format_chat(pshard_ctx *ctx, const pshard_message *messages, size_t n_messages, int default_system,
                                 char **out) {
    *out = NULL;
    if (!messages && n_messages) return core_fail(PSHARD_ERR_INVALID_ARG, "no messages given");
    for (size_t i = 0; i < n_messages; i++)
        if (!messages[i].role || !messages[i].content)
            return core_fail(PSHARD_ERR_INVALID_ARG, "message %zu has no %s", i, messages[i].role ? "content" : "role");
    size_t needed = 0;
    ctx->chat.use_default_system = default_system;
    struct chat_message *msgs = malloc(sizeof *msgs * (n_messages ? n_messages : 1));
    if (!msgs) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n_messages; i++) msgs[i] = (struct chat_message){messages[i].role, messages[i].content};
    chat_format_messages(&ctx->chat, msgs, n_messages, 1, NULL, 0, &needed);
    char *text = malloc(needed + 1);
    pshard_status st = text ? chat_format_messages(&ctx->chat, msgs, n_messages, 1, text, needed + 1, &needed)
                            : core_fail(PSHARD_ERR_NOMEM, "out of memory");
    free(msgs);
    if (st != PSHARD_OK) free(text);
    else *out = text;
    return st;
}

pshard_status pshard_chat(pshard_ctx *ctx, const pshard_message *messages, size_t n_messages, const pshard_gen_opts *opts,
                          pshard_text_cb on_text, void *user, pshard_gen_stats *stats) {
    pshard_gen_opts defaults;
    if (!opts) pshard_gen_opts_default(&defaults), opts = &defaults;
    char *text;
    pshard_status st = pshard_format_chat(ctx, messages, n_messages, opts->default_system, &text);
    if (st == PSHARD_OK) st = pshard_generate(ctx, text, opts, on_text, user, stats);
    free(text);
    return st;
}
