/* Opening a model for generation: the file, the shard list, the tokenizer, the chat template,
 * the executor; optionally reading the weights in with progress. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "engine/engine_internal.h"
#include "engine/engine_open.h"
#include "engine/vision.h"
#include "exec/exec_budget.h"
#include "exec/exec_gpu.h"
#include "measure/measure.h"

void pshard_params_default(pshard_params *p) {
    memset(p, 0, sizeof *p);
    p->prefault = 1;
}

/* One slice of the weights whose pages the pool's threads touch, each a share of its pages. */
struct touch_job {
    const uint8_t *base;
    uint64_t n_bytes, page;
};

static void touch_part(void *ctx, int thread, int n_threads) {
    const struct touch_job *job = ctx;
    const int64_t pages = (int64_t)((job->n_bytes + job->page - 1) / job->page);
    int64_t begin, end;
    threadpool_range(pages, 1, thread, n_threads, &begin, &end);
    volatile uint8_t sink = 0;
    for (int64_t i = begin; i < end; i++) sink ^= job->base[(uint64_t)i * job->page];
    (void)sink;
}

/* Touch every page of the weights so the first token does not pay for disk reads or page faults,
 * on all the threads (a page fault costs about a microsecond: one thread maps ~6 GB/s from the
 * page cache), a slice at a time, reporting progress after each slice. The weights lie between
 * the first tensor's bytes and the last's: the file's data section. */
static pshard_status prefault(pshard_ctx *ctx) {
    const uint8_t *lo = NULL, *hi = NULL;
    for (uint64_t i = 0; i < gguf_tensor_count(ctx->file); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(ctx->file, i);
        const uint8_t *b = t->data, *e = b + t->n_bytes;
        if (!lo || b < lo) lo = b;
        if (!hi || e > hi) hi = e;
    }
    if (!lo) return PSHARD_OK;
    const uint64_t total = (uint64_t)(hi - lo), slice = 1ull << 30;
    const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    struct threadpool *pool;
    CORE_TRY(threadpool_create(ctx->params.n_threads > 0 ? ctx->params.n_threads : threadpool_cpu_count(), &pool));
    pshard_status st = PSHARD_OK;
    for (uint64_t done = 0; done < total && st == PSHARD_OK;) {
        struct touch_job job = {lo + done, total - done < slice ? total - done : slice, (uint64_t)page};
        threadpool_run(pool, touch_part, &job);
        done += job.n_bytes;
        if (ctx->params.progress && ctx->params.progress(ctx->params.progress_user, done, total))
            st = core_fail(PSHARD_ERR_INVALID_ARG, "loading cancelled");
    }
    threadpool_free(pool);
    return st;
}

/* Whether the model and its buffers fit the budget whole (then there is nothing to choose). */
static pshard_status fits_whole_in(const struct model *model, const struct exec_params *ep, bool *fits) {
    struct plan probe;
    CORE_TRY(exec_make_plan(model, ep, &probe));
    *fits = probe.n_candidates == 0 && probe.any_gpu;
    plan_free(&probe);
    return PSHARD_OK;
}

/* The planner's family of the API's (pshard_open checked the value). */
static enum plan_family family_of(pshard_plan_family f) {
    switch (f) {
    case PSHARD_PLAN_CPU: return PLAN_CPU;
    case PSHARD_PLAN_GPU: return PLAN_GPU;
    case PSHARD_PLAN_STATIC: return PLAN_STATIC;
    case PSHARD_PLAN_DYNAMIC: return PLAN_DYNAMIC;
    case PSHARD_PLAN_AUTO: break;
    }
    return PLAN_AUTO;
}

pshard_status pshard_parse_plan_family(const char *text, pshard_plan_family *family) {
    if (!text || !family) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_parse_plan_family: null argument");
    enum plan_family f;
    CORE_TRY(plan_parse_family(text, &f));
    for (int i = PSHARD_PLAN_AUTO; i <= PSHARD_PLAN_DYNAMIC; i++)
        if (family_of((pshard_plan_family)i) == f) *family = (pshard_plan_family)i;
    return PSHARD_OK;
}

pshard_status pshard_parse_resident_set(const char *text, int *resident_set) {
    if (!text || !resident_set) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_parse_resident_set: null argument");
    enum plan_set set;
    CORE_TRY(plan_parse_set(text, &set));
    *resident_set = (int)set + 1;
    return PSHARD_OK;
}

pshard_status pshard_parse_decode_set(const char *text, int *decode_set) {
    if (!text || !decode_set) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_parse_decode_set: null argument");
    int32_t set;
    CORE_TRY(plan_parse_decode_set(text, &set));
    *decode_set = set == PLAN_DECODE_SAME ? -1 : set + 1;
    return PSHARD_OK;
}

pshard_status pshard_parse_size(const char *text, int64_t *bytes) {
    if (!text || !bytes) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_parse_size: null argument");
    return plan_parse_size(text, bytes);
}

void engine_planning_params(const pshard_params *p, struct exec_params *ep) {
    ep->plan = family_of(p->plan);
    ep->vram_budget = p->vram_budget;
    ep->stream_share = p->stream_share;
    ep->staging = p->resident_set > 0 ? p->resident_set - 1 : -1;
    ep->decode_set = p->decode_set > 0 ? p->decode_set - 1 : p->decode_set < 0 ? PLAN_DECODE_SAME : PLAN_DECODE_WEIGHED;
}

void engine_exec_params(const pshard_params *p, const struct plan_options *options, const struct model *model,
                        struct exec_params *ep) {
    *ep = (struct exec_params){
        .n_ctx = p->n_ctx,
        .n_batch = p->n_batch,
        .n_seq = p->n_parallel,
        .n_threads = p->n_threads,
        .n_decode = p->n_predict,
        .options = *options,
    };
    engine_planning_params(p, ep);
    if (p->gpu) ep->plan = PLAN_GPU, ep->vram_budget = -1;
    const uint32_t n_ctx_train = model->hp.n_ctx_train;
    if (ep->n_ctx <= 0) {
        ep->n_ctx = 4096;
        if (n_ctx_train && n_ctx_train < (uint32_t)ep->n_ctx) ep->n_ctx = (int32_t)n_ctx_train;
        ep->n_ctx *= ep->n_seq;
    }
    exec_params_share_pool(ep, n_ctx_train); /* many sequences: n_ctx is the pool they share */
    if (ep->n_batch <= 0) ep->n_batch = 512;
    if (ep->n_batch > ep->n_ctx) ep->n_batch = ep->n_ctx;
    if (ep->n_batch < ep->n_seq) ep->n_batch = ep->n_seq; /* a step carries one token of every sequence */
}

/* auto's first budget: the device's free memory less what it leaves to other programs, down to
 * what the model needs whole. */
static pshard_status free_less_keep(const struct model *model, struct exec_params *ep, int64_t keep) {
    uint64_t free_bytes = 0, total = 0;
    CORE_TRY(exec_device_memory(&free_bytes, &total));
    if (!total) return core_fail(PSHARD_ERR_UNSUPPORTED, "no CUDA device: a budget that follows free VRAM (auto) needs one");
    if ((int64_t)free_bytes <= keep)
        return core_fail(PSHARD_ERR_RANGE, "the GPU has %.0f MB free, no more than the %.0f MB auto leaves to other programs",
                         free_bytes / 1048576.0, keep / 1048576.0);
    ep->vram_budget = ((int64_t)free_bytes - keep) / (1 << 20) * (1 << 20);
    struct plan probe;
    CORE_TRY(exec_make_trimmed_plan(model, ep, &probe));
    if (probe.any_gpu) ep->vram_budget = (int64_t)probe.budget.total;
    plan_free(&probe);
    return PSHARD_OK;
}

/* The milliseconds since *t, which becomes now. */
static double lap_ms(double *t) {
    const double now = core_now_ms(), ms = now - *t;
    *t = now;
    return ms;
}

static pshard_status open_ctx(pshard_ctx *ctx) {
    const pshard_params *p = &ctx->params;
    double t = core_now_ms();
    CORE_TRY(gguf_open(p->model_path, &ctx->file));
    CORE_TRY(model_load(ctx->file, &ctx->model));
    CORE_TRY(tok_from_gguf(ctx->file, &ctx->tok));
    if (tok_n_tokens(ctx->tok) > ctx->model.hp.n_vocab) /* (fewer is fine: rows no text reaches) */
        return core_fail(PSHARD_ERR_FORMAT, "%s: the tokenizer has %u tokens but the model's embeddings only %u rows",
                         p->model_path, tok_n_tokens(ctx->tok), ctx->model.hp.n_vocab);
    struct gguf_str tpl = {NULL, 0};
    if (gguf_find(ctx->file, "tokenizer.chat_template")) CORE_TRY(gguf_get_str(ctx->file, "tokenizer.chat_template", &tpl));
    chat_template_detect(tpl.data, tpl.len, &ctx->chat);
    ctx->load_file_ms = lap_ms(&t);
    struct exec_params ep;
    engine_exec_params(p, &ctx->options, &ctx->model, &ep);
    ctx->keep = p->vram_keep > 0 ? p->vram_keep : 1ll << 30;
    if (p->vram_follow && ep.vram_budget == 0) CORE_TRY(free_less_keep(&ctx->model, &ep, ctx->keep));
    /* An automatic plan under a budget the model does not fit whole is chosen by the cost model
     * from this machine's profile (measured on first use). */
    bool resident = p->gpu && exec_device_count() > 0;
    if (ep.plan == PLAN_AUTO && ep.vram_budget > 0 && exec_device_count() > 0) {
        bool fits_whole;
        CORE_TRY(fits_whole_in(&ctx->model, &ep, &fits_whole)); /* also: a budget too small fails here */
        resident = fits_whole;
        if (!fits_whole) {
            bool measured_now;
            CORE_TRY(measure_machine_profile(&ctx->model, p->n_threads, ep.vram_budget, p->no_profile ? PROFILE_DEFAULTS : PROFILE_MEASURE,
                                          p->profile_progress, p->progress_user, &ctx->profile, &measured_now));
            ep.profile = &ctx->profile;
            ctx->learn = ctx->profile.measured;
        }
    }
    /* Where the cost model chooses nothing, the cached profile is read (never measured, never
     * taught: these runs say nothing of auto's choices) where there is one: all of it in VRAM (it
     * fits the budget whole, or --gpu) for the predicted speed; and a family the user named
     * (--plan gpu|static|dynamic) under a budget, so it is placed as `pshard plan --plan FAMILY`
     * shows it (a dynamic plan's balanced share and routed quotas come from it). */
    const bool named = ep.plan != PLAN_AUTO && ep.plan != PLAN_CPU && ep.vram_budget > 0 && exec_device_count() > 0;
    if ((resident || named) && !p->no_profile) {
        bool measured_now;
        if (measure_machine_profile(&ctx->model, p->n_threads, 0, PROFILE_CACHED, NULL, NULL, &ctx->profile, &measured_now) ==
            PSHARD_OK)
            ep.profile = &ctx->profile;
    }
    if (p->n_batch <= 0 && ep.plan == PLAN_AUTO && ep.vram_budget > 0 && !resident && exec_device_count() > 0) {
        struct exec_batch_choice choice;
        CORE_TRY(exec_choose_batch(&ctx->model, &ep, &choice));
        ctx->batch_chosen = choice.n > 0;
    }
    ctx->params.n_ctx = ep.n_ctx;
    ctx->params.n_batch = ep.n_batch;
    if (p->vram_follow) ctx->params.vram_budget = ep.vram_budget;
    ctx->follow = p->vram_follow && exec_device_count() > 0;
    ctx->load_plan_ms = lap_ms(&t);
    if (p->prefault) CORE_TRY(prefault(ctx));
    ctx->load_pages_ms = lap_ms(&t);
    CORE_TRY(exec_create(&ctx->model, &ep, &ctx->exec));
    if (ctx->follow) CORE_TRY(exec_prepare_budget_changes(ctx->exec)); /* (no change then waits for pinning) */
    ctx->load_exec_ms = lap_ms(&t);
    ctx->params.n_threads = exec_get_params(ctx->exec)->n_threads;
    ctx->cached = malloc(sizeof(int32_t) * (size_t)ep.n_ctx);
    ctx->prompt = malloc(sizeof(int32_t) * (size_t)ep.n_ctx);
    ctx->batch_pos = malloc(sizeof(int32_t) * (size_t)ep.n_batch);
    ctx->batch_seq = calloc((size_t)ep.n_batch, sizeof(int32_t));
    ctx->batch_logits = calloc((size_t)ep.n_batch, 1);
    if (!ctx->cached || !ctx->prompt || !ctx->batch_pos || !ctx->batch_seq || !ctx->batch_logits)
        return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    return engine_batch_create(ctx);
}

pshard_status pshard_open(const pshard_params *params, pshard_ctx **out) {
    return engine_open(params, &(struct plan_options){0}, out);
}

pshard_status engine_open(const pshard_params *params, const struct plan_options *options, pshard_ctx **out) {
    *out = NULL;
    if (!params || !params->model_path) return core_fail(PSHARD_ERR_INVALID_ARG, "no model path given");
    if (params->resident_set < 0 || params->resident_set > PLAN_SETS)
        return core_fail(PSHARD_ERR_INVALID_ARG, "resident set %d is not one of 0..%d", params->resident_set, PLAN_SETS);
    if ((int)params->plan < PSHARD_PLAN_AUTO || (int)params->plan > PSHARD_PLAN_DYNAMIC)
        return core_fail(PSHARD_ERR_INVALID_ARG, "plan family %d is not one of %d..%d (auto, cpu, gpu, static, dynamic)",
                         (int)params->plan, PSHARD_PLAN_AUTO, PSHARD_PLAN_DYNAMIC);
    if (params->resident_set && !params->gpu && !plan_takes_set(family_of(params->plan)))
        return core_fail(PSHARD_ERR_INVALID_ARG, "a resident set (--set) places a gpu, static or dynamic plan; "
                                                 "name one with --plan");
    if (params->decode_set < -1 || params->decode_set > PLAN_SETS)
        return core_fail(PSHARD_ERR_INVALID_ARG, "decode set %d is not one of -1..%d", params->decode_set, PLAN_SETS);
    if (params->decode_set && (params->gpu || params->plan != PSHARD_PLAN_AUTO))
        return core_fail(PSHARD_ERR_INVALID_ARG, "a decode set (--decode-set) is the automatic plan's choice; leave --plan "
                                                 "as auto");
    if (params->n_parallel < 0 || params->n_parallel > 4096)
        return core_fail(PSHARD_ERR_INVALID_ARG, "parallel sequences: %d is not one of 1..4096", params->n_parallel);
    if (params->max_queue < 0) return core_fail(PSHARD_ERR_INVALID_ARG, "the queue's length %d is negative", params->max_queue);
    if (params->vram_keep < 0 || params->vram_poll_ms < 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "following free VRAM: the memory kept (%lld bytes) and the interval (%d ms) "
                         "must not be negative", (long long)params->vram_keep, params->vram_poll_ms);
    if (params->vram_follow && (params->gpu || params->plan == PSHARD_PLAN_CPU))
        return core_fail(PSHARD_ERR_INVALID_ARG, "a budget that follows free VRAM (auto) is the planner's: leave --gpu and "
                         "--plan cpu out");
    pshard_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    ctx->params = *params;
    ctx->options = *options;
    if (ctx->params.n_parallel == 0) ctx->params.n_parallel = 1;
    if (ctx->params.max_queue == 0) ctx->params.max_queue = 4096;
    pshard_status st = open_ctx(ctx);
    if (st != PSHARD_OK) {
        pshard_close(ctx);
        return st;
    }
    *out = ctx;
    return PSHARD_OK;
}

void pshard_close(pshard_ctx *ctx) {
    if (!ctx) return;
    engine_batch_free(ctx);
    engine_vision_free(ctx->vision);
    free(ctx->cached);
    free(ctx->prompt);
    free(ctx->batch_pos);
    free(ctx->batch_seq);
    free(ctx->batch_logits);
    exec_free(ctx->exec);
    tok_free(ctx->tok);
    model_free(&ctx->model);
    gguf_close(ctx->file);
    free(ctx);
}

void pshard_get_info(const pshard_ctx *ctx, pshard_info *info) {
    memset(info, 0, sizeof *info);
    info->arch = ctx->model.hp.arch_name;
    info->chat_format = chat_format_name(ctx->chat.format);
    info->n_vocab = (int32_t)ctx->model.hp.n_vocab;
    info->n_ctx = ctx->params.n_ctx;
    info->n_batch = ctx->params.n_batch;
    info->n_batch_chosen = ctx->batch_chosen;
    info->n_threads = ctx->params.n_threads;
    info->n_layers = (int32_t)ctx->model.hp.n_layers;
    for (uint64_t i = 0; i < gguf_tensor_count(ctx->file); i++) info->weight_bytes += gguf_tensor_at(ctx->file, i)->n_bytes;
    info->kv_bytes = exec_kv_bytes(ctx->exec);
    const struct plan *plan = exec_get_plan(ctx->exec);
    const int32_t typical = plan_typical_prompt(plan->n_ctx) + 1; /* a typical request's first decode step */
    char sets[48] = "";
    if (plan->decode && plan->decode_from > 0) snprintf(sets, sizeof sets, " + decode set from %d cells", plan->decode_from);
    else if (plan->decode && plan->decode_until < INT32_MAX) snprintf(sets, sizeof sets, " + decode set below %d cells", plan->decode_until);
    else if (plan->decode) snprintf(sets, sizeof sets, " + decode set");
    snprintf(info->plan, sizeof info->plan, "%s/%s%s", plan_family_name(plan_for_step(plan, 1, typical)->tier[PLAN_TIER_DECODE].family),
             plan_family_name(plan->tier[plan_prompt_tier(plan)].family), sets);
    info->profile_measured = ctx->profile.measured;
    info->load_file_ms = ctx->load_file_ms, info->load_plan_ms = ctx->load_plan_ms;
    info->load_pages_ms = ctx->load_pages_ms, info->load_exec_ms = ctx->load_exec_ms;
    info->load_vision_ms = ctx->load_vision_ms; /* (0 until an encoder is loaded) */
    info->predicted_ttft_s = plan->predicted_ttft;
    info->predicted_prompt_tokens = plan_typical_prompt(plan->n_ctx);
    info->predicted_decode_s = plan->predicted_decode;
    info->predicted_requests = plan->n_seq > 1 ? plan->n_seq : 1;
    engine_budget_info(ctx, info);
    const struct gpu_memory_report *vram = exec_gpu_memory(ctx->exec);
    if (vram) {
        info->on_gpu = 1;
        info->vram_context_bytes = vram->context_bytes;
        info->vram_arena_bytes = vram->arena_bytes;
        info->vram_weight_bytes = vram->weight_bytes;
        info->vram_kv_bytes = vram->kv_bytes;
        info->vram_activation_bytes = vram->activation_bytes;
        info->vram_work_bytes = vram->work_bytes;
        info->vram_staging_bytes = vram->staging_bytes;
        info->vram_mapping_bytes = vram->mapping_bytes;
        info->phase_changes = (int32_t)vram->switches;
        info->phase_change_ms = vram->switch_ms;
    }
}
