/* Images in prompts: the encoder attached to a context, images kept by content while a prompt or a
 * sequence's cells hold them, and prompts whose markers become <|vision_start|>, the image's
 * tokens and <|vision_end|>, as llama.cpp's multimodal library lays out a Qwen2-VL prompt. The
 * one-sequence calls and each request of the batched engine read their prompts through the same
 * functions, each prompt with its own image runs and rope positions. */
#include "engine/vision.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/grow.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "engine/engine_internal.h"
#include "engine/vision_gpu.h"
#include "engine/vision_prepare.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vision/mrope.h"
#include "vision/preprocess.h"

/* An encoded image, kept while a prompt holds it (refs) or a sequence's cells hold its tokens. */
struct kept_image {
    struct engine_image_id id;
    int32_t key; /* what its tokens are cached as: negative, never reused */
    uint32_t tokens_h, tokens_w;
    struct vision_embeddings embd;
    int32_t refs; /* runs of live prompts (the one-sequence call's, requests') */
    bool held;    /* sweep's scratch: some sequence's cells hold its tokens */
};

/* The tokens [first, first + count) of a prompt are `image`'s (one reference held). */
struct image_run {
    int32_t first, count;
    struct kept_image *image;
};

struct engine_vision {
    struct gguf_file *file;
    struct mmproj mmproj;
    struct threadpool *pool;
    struct vision_gpu *gpu; /* what the GPU encoder keeps of mmproj, once it ran */
    int32_t id_start, id_end, id_pad; /* <|vision_start|>, <|vision_end|>, <|image_pad|>; -1: not in the vocabulary */
    struct kept_image **kept;
    int32_t n_kept, next_key;
    size_t cap_kept;
    struct engine_images prompt;      /* the one-sequence calls' prompt */
    int32_t *step_tokens, *step_rope; /* one step's [n_batch] ids and [3][n_batch] positions */
    struct exec_media media;          /* what that step carries */
};

static void kept_free(struct kept_image *k) {
    vision_embeddings_free(&k->embd);
    free(k);
}

void engine_vision_free(struct engine_vision *v) {
    if (!v) return;
    engine_images_release(&v->prompt);
    for (int32_t i = 0; i < v->n_kept; i++) kept_free(v->kept[i]);
    free(v->kept);
    free(v->step_tokens);
    free(v->step_rope);
    threadpool_free(v->pool);
    vision_gpu_free(v->gpu);
    if (v->file) mmproj_free(&v->mmproj);
    gguf_close(v->file);
    free(v);
}

static int32_t find_token(const struct tok *tok, const char *text) { return tok_find(tok, text, strlen(text)); }

static pshard_status load(pshard_ctx *ctx, const char *path, struct engine_vision *v) {
    const struct model_hparams *hp = &ctx->model.hp;
    if (hp->arch != ARCH_QWEN2VL)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: the model (%s) takes no images; an mmproj file goes with a qwen2vl "
                         "model (Qwen2-VL, Qwen2.5-VL)", path, hp->arch_name);
    struct gguf_file *file;
    CORE_TRY(gguf_open(path, &file));
    if (!mmproj_is_mmproj(file)) {
        gguf_close(file);
        return core_fail(PSHARD_ERR_FORMAT, "%s: not an mmproj file (general.architecture is not 'clip')", path);
    }
    pshard_status st = mmproj_load(file, &v->mmproj);
    if (st != PSHARD_OK) {
        gguf_close(file);
        return st;
    }
    v->file = file;
    if (v->mmproj.hp.projection_dim != hp->n_embd)
        return core_fail(PSHARD_ERR_INVALID_ARG, "%s: its encoder gives embeddings %u wide and the model's are %u: the "
                         "mmproj file is not this model's", path, v->mmproj.hp.projection_dim, hp->n_embd);
    CORE_TRY(threadpool_create(ctx->params.n_threads, &v->pool));
    v->id_start = find_token(ctx->tok, "<|vision_start|>");
    v->id_end = find_token(ctx->tok, "<|vision_end|>");
    v->id_pad = find_token(ctx->tok, "<|image_pad|>");
    const size_t n_batch = (size_t)ctx->params.n_batch;
    v->step_tokens = malloc(sizeof(int32_t) * n_batch);
    v->step_rope = malloc(sizeof(int32_t) * 3 * n_batch);
    if (!v->step_tokens || !v->step_rope) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    return PSHARD_OK;
}

pshard_status pshard_vision_load(pshard_ctx *ctx, const char *mmproj_path) {
    if (!ctx || !mmproj_path) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_vision_load: a NULL argument");
    if (engine_batch_pending(ctx))
        return core_fail(PSHARD_ERR_INVALID_ARG, "requests are running (pshard_request_add); step them to the end or "
                                                 "cancel them before loading a vision encoder");
    struct engine_vision *v = calloc(1, sizeof *v);
    if (!v) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    /* Keys go on from the encoder this one replaces: cells cached under its keys never match. */
    v->next_key = ctx->vision ? ctx->vision->next_key : 0;
    const double t0 = core_now_ms();
    pshard_status st = load(ctx, mmproj_path, v);
    if (st != PSHARD_OK) {
        engine_vision_free(v);
        return st;
    }
    engine_vision_free(ctx->vision);
    ctx->vision = v;
    ctx->load_vision_ms = core_now_ms() - t0;
    return PSHARD_OK;
}

/* ---- images by content */

struct encode_progress {
    const pshard_gen_opts *opts;
    int32_t image, n_images;
};

static int on_blocks(void *user, uint32_t done, uint32_t total) {
    const struct encode_progress *p = user;
    return p->opts->on_image(p->opts->image_user, p->image, p->n_images, (float)done / (float)total);
}

/* Encode an image's patches into kept entry `k` (one whose tokens cannot fit the context is refused
 * first); *where: the GPU memory it was encoded in (VISION_GPU_NONE: the CPU). */
static pshard_status encode(pshard_ctx *ctx, struct engine_vision *v, const struct vision_patches *patches,
                            const struct encode_progress *progress, struct kept_image *k, enum vision_gpu_memory *where) {
    const uint32_t merge = v->mmproj.hp.spatial_merge;
    k->tokens_h = patches->grid_h / merge, k->tokens_w = patches->grid_w / merge;
    const uint64_t tokens = (uint64_t)k->tokens_h * k->tokens_w;
    if (tokens + 2 >= (uint64_t)ctx->params.n_ctx) /* its tokens alone fill the context: not worth encoding */
        return core_fail(PSHARD_ERR_RANGE, "the prompt's image %d takes %llu tokens and the context holds %d (raise -c)",
                         progress->image + 1, (unsigned long long)tokens, ctx->params.n_ctx);
    const struct vision_progress vp = {on_blocks, (void *)progress};
    return engine_vision_encode(ctx, &v->mmproj, v->pool, &v->gpu, patches, progress->opts->on_image ? &vp : NULL, &k->embd,
                                where);
}

/* Drop the kept images no prompt holds and no sequence's cells hold (a finished request's or the
 * one-sequence calls' cells keep theirs, so a conversation that sends its image again finds it
 * encoded and its cells reusable). */
static void sweep(pshard_ctx *ctx, struct engine_vision *v) {
    bool any = false;
    for (int32_t k = 0; k < v->n_kept; k++) v->kept[k]->held = false, any |= v->kept[k]->refs == 0;
    for (int32_t s = 0; any && s < ctx->params.n_parallel; s++) {
        int32_t n;
        const int32_t *held = engine_batch_held(ctx, s, &n);
        for (int32_t i = 0; i < n; i++)
            if (held[i] < 0 && (i == 0 || held[i] != held[i - 1]))
                for (int32_t k = 0; k < v->n_kept; k++)
                    if (v->kept[k]->key == held[i]) v->kept[k]->held = true;
    }
    int32_t live = 0;
    for (int32_t k = 0; k < v->n_kept; k++) {
        if (v->kept[k]->refs > 0 || v->kept[k]->held) v->kept[live++] = v->kept[k];
        else kept_free(v->kept[k]);
    }
    v->n_kept = live;
}

static struct kept_image *find_kept(const struct engine_vision *v, const struct engine_image_id *id) {
    for (int32_t k = 0; k < v->n_kept; k++)
        if (v->kept[k]->id.size == id->size && !memcmp(v->kept[k]->id.hash, id->hash, sizeof id->hash)) return v->kept[k];
    return NULL;
}

/* Image i's identity, and its bytes where it was not prepared (*owned: what was read, to free). */
static pshard_status image_identity(const struct engine_vision *v, const pshard_image *im, int32_t i, uint8_t **owned,
                                    const uint8_t **bytes, struct engine_image_id *id, char *label, size_t label_size) {
    if (!im->prepared) return engine_image_bytes(im, i, owned, bytes, id, label, label_size);
    *owned = NULL, *bytes = NULL;
    snprintf(label, label_size, "image %d", i + 1);
    if (!engine_prepared_fits(im->prepared, &v->mmproj.hp))
        return core_fail(PSHARD_ERR_INVALID_ARG, "%s: prepared for another vision encoder (its preparer came before the "
                         "context's pshard_vision_load)", label);
    *id = im->prepared->id;
    return PSHARD_OK;
}

/* The kept image of each of the call's images (which[i]; no reference taken), encoding those not
 * kept: decoded and cut into patches here unless prepared beforehand (pshard_image_prepare). */
static pshard_status gather_images(pshard_ctx *ctx, struct engine_vision *v, const pshard_gen_opts *opts,
                                   struct kept_image **which, pshard_gen_stats *stats) {
    sweep(ctx, v);
    char label[512];
    for (int32_t i = 0; i < opts->n_images; i++) {
        const pshard_image *im = &opts->images[i];
        uint8_t *owned;
        const uint8_t *bytes;
        struct engine_image_id id;
        CORE_TRY(image_identity(v, im, i, &owned, &bytes, &id, label, sizeof label));
        if ((which[i] = find_kept(v, &id))) {
            free(owned);
            continue;
        }
        struct kept_image *k = calloc(1, sizeof *k);
        pshard_status st = k ? core_grow((void **)&v->kept, &v->cap_kept, (size_t)v->n_kept + 1, sizeof *v->kept)
                             : core_fail(PSHARD_ERR_NOMEM, "out of memory");
        const struct encode_progress progress = {opts, i, opts->n_images};
        const double t0 = core_now_ms();
        enum vision_gpu_memory where = VISION_GPU_NONE;
        struct vision_patches decoded = {0};
        if (st == PSHARD_OK && !im->prepared) st = engine_image_patches(&v->mmproj.hp, bytes, id.size, label, &decoded);
        free(owned);
        if (st == PSHARD_OK) st = encode(ctx, v, im->prepared ? &im->prepared->patches : &decoded, &progress, k, &where);
        vision_patches_free(&decoded);
        if (st != PSHARD_OK) {
            if (k) kept_free(k);
            return st;
        }
        if (stats) {
            stats->image_encode_ms += core_now_ms() - t0, stats->n_images_encoded++;
            stats->n_images_whole_budget += where == VISION_GPU_IN_BUDGET;
            stats->n_images_cpu += where == VISION_GPU_NONE;
        }
        k->id = id;
        k->key = -(++v->next_key);
        v->kept[v->n_kept++] = k;
        which[i] = k;
    }
    return PSHARD_OK;
}

/* ---- the prompt */

static int32_t count_markers(const char *s) {
    int32_t n = 0;
    for (const char *at = strstr(s, PSHARD_IMAGE_MARKER); at; at = strstr(at + strlen(PSHARD_IMAGE_MARKER), PSHARD_IMAGE_MARKER)) n++;
    return n;
}

/* Append the tokens of text[0, len) to ctx->prompt at *n. */
static pshard_status append_text(pshard_ctx *ctx, const char *text, size_t len, int flags, int32_t *n) {
    size_t got = 0;
    pshard_status st = tok_encode_into(ctx->tok, text, len, flags, ctx->prompt + *n, (size_t)(ctx->params.n_ctx - *n), &got);
    if (st == PSHARD_ERR_RANGE || (st == PSHARD_OK && *n + (int64_t)got >= ctx->params.n_ctx))
        return core_fail(PSHARD_ERR_RANGE, "the prompt has %s%lld tokens and the context holds %d (raise -c)",
                         *n ? "at least " : "", (long long)*n + (long long)got, ctx->params.n_ctx);
    CORE_TRY(st);
    *n += (int32_t)got;
    return PSHARD_OK;
}

/* A vision control token: its id, or its text where the vocabulary lacks it (as llama.cpp reads it). */
static pshard_status append_control(pshard_ctx *ctx, int32_t id, const char *text, int32_t *n) {
    if (id < 0) return append_text(ctx, text, strlen(text), 0, n);
    if (*n + 1 >= ctx->params.n_ctx)
        return core_fail(PSHARD_ERR_RANGE, "the prompt has more tokens than the context holds (%d; raise -c)", ctx->params.n_ctx);
    ctx->prompt[(*n)++] = id;
    return PSHARD_OK;
}

/* Every prompt token's (time, row, column): text counts on by one, an image's tokens take their
 * grid's positions from where it starts and the text after it goes on past the grid's longer side. */
static void rope_positions(struct engine_images *im) {
    const int32_t n_prompt = im->n_prompt;
    int32_t *t = im->rope, *row = im->rope + n_prompt, *col = im->rope + 2 * n_prompt;
    int32_t next = 0, r = 0;
    for (int32_t i = 0; i < n_prompt;) {
        if (r < im->n_runs && im->runs[r].first == i) {
            const struct kept_image *k = im->runs[r].image;
            next = (int32_t)vision_mrope_image_positions(k->tokens_h, k->tokens_w, (uint32_t)next, (uint32_t *)t + i,
                                                         (uint32_t *)row + i, (uint32_t *)col + i);
            i += im->runs[r++].count;
            continue;
        }
        t[i] = row[i] = col[i] = next++;
        i++;
    }
    im->rope_shift = n_prompt - next;
}

static pshard_status build(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts, struct kept_image *const *which,
                           struct engine_images *im, int32_t *n_prompt) {
    struct engine_vision *v = ctx->vision;
    const int flags = opts->parse_special ? TOK_PARSE_SPECIAL : 0;
    const size_t marker_len = strlen(PSHARD_IMAGE_MARKER);
    int32_t n = 0;
    const char *text = prompt;
    for (int32_t i = 0; i <= opts->n_images; i++) {
        const char *end = i < opts->n_images ? strstr(text, PSHARD_IMAGE_MARKER) : text + strlen(text);
        CORE_TRY(append_text(ctx, text, (size_t)(end - text), flags | (i == 0 ? TOK_ADD_SPECIAL : 0), &n));
        if (i == opts->n_images) break;
        struct kept_image *k = which[i];
        CORE_TRY(append_control(ctx, v->id_start, "<|vision_start|>", &n));
        const int32_t count = (int32_t)(k->tokens_h * k->tokens_w);
        if ((int64_t)n + count + 1 >= ctx->params.n_ctx)
            return core_fail(PSHARD_ERR_RANGE, "the prompt's image %d takes %d tokens and the context (%d) is full (raise -c)",
                             i + 1, count, ctx->params.n_ctx);
        CORE_TRY(core_grow((void **)&im->runs, &im->cap_runs, (size_t)im->n_runs + 1, sizeof *im->runs));
        im->runs[im->n_runs++] = (struct image_run){n, count, k};
        k->refs++;
        for (int32_t t = 0; t < count; t++) ctx->prompt[n++] = k->key;
        CORE_TRY(append_control(ctx, v->id_end, "<|vision_end|>", &n));
        text = end + marker_len;
    }
    if (n == 0) return core_fail(PSHARD_ERR_INVALID_ARG, "the prompt is empty");
    im->n_prompt = n;
    if (im->n_runs > 0) {
        if (!(im->rope = malloc(sizeof(int32_t) * 3 * (size_t)n))) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
        rope_positions(im);
    }
    *n_prompt = n;
    return PSHARD_OK;
}

void engine_images_release(struct engine_images *im) {
    for (int32_t r = 0; r < im->n_runs; r++) im->runs[r].image->refs--;
    free(im->runs);
    free(im->rope);
    memset(im, 0, sizeof *im);
}

pshard_status engine_vision_tokenize(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts,
                                     struct engine_images *images, int32_t *n_prompt, pshard_gen_stats *stats) {
    struct engine_vision *v = ctx->vision;
    memset(images, 0, sizeof *images);
    if (opts->n_images < 0 || (opts->n_images > 0 && !opts->images))
        return core_fail(PSHARD_ERR_INVALID_ARG, "%d images and %s list of them", opts->n_images, opts->images ? "a" : "no");
    if (opts->n_images > 0 && !v)
        return core_fail(PSHARD_ERR_INVALID_ARG, "images need the model's vision encoder: load its mmproj file (--mmproj)");
    if (!v) { /* no encoder: the prompt's plain tokens (a marker there is text) */
        int32_t n = 0;
        CORE_TRY(append_text(ctx, prompt, strlen(prompt), TOK_ADD_SPECIAL | (opts->parse_special ? TOK_PARSE_SPECIAL : 0), &n));
        if (n == 0) return core_fail(PSHARD_ERR_INVALID_ARG, "the prompt is empty");
        images->n_prompt = *n_prompt = n;
        return PSHARD_OK;
    }
    const int32_t markers = count_markers(prompt);
    if (markers != opts->n_images)
        return core_fail(PSHARD_ERR_INVALID_ARG, "the prompt has %d image marker%s (%s) and %d image%s came with it", markers,
                         markers == 1 ? "" : "s", PSHARD_IMAGE_MARKER, opts->n_images, opts->n_images == 1 ? "" : "s");
    struct kept_image **which = malloc(sizeof *which * (size_t)(opts->n_images ? opts->n_images : 1));
    if (!which) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    pshard_status st = gather_images(ctx, v, opts, which, stats);
    if (st == PSHARD_OK) st = build(ctx, prompt, opts, which, images, n_prompt);
    free(which);
    if (st != PSHARD_OK) engine_images_release(images);
    return st;
}

int32_t engine_images_piece(const pshard_ctx *ctx, const struct engine_images *im, int32_t start, int32_t n,
                            bool allow_image, struct exec_media *media) {
    media->embd = NULL, media->embd_first = media->embd_count = 0;
    const struct image_run *run = NULL;
    for (int32_t r = 0; r < im->n_runs; r++) {
        const struct image_run *x = &im->runs[r];
        if (x->first + x->count <= start || x->first >= start + n) continue;
        if (run || !allow_image) { /* an image it may not take: the piece ends where that one starts */
            n = x->first > start ? x->first - start : 0;
            break;
        }
        run = x;
    }
    if (run) {
        const int32_t first = run->first > start ? run->first : start;
        const int32_t end = run->first + run->count < start + n ? run->first + run->count : start + n;
        media->embd = run->image->embd.data + (size_t)(first - run->first) * ctx->vision->mmproj.hp.projection_dim;
        media->embd_first = first - start;
        media->embd_count = end - first;
    }
    return n;
}

void engine_images_rope(const struct engine_images *im, int32_t pos, int32_t out[3]) {
    if (im->rope && pos < im->n_prompt) {
        for (int a = 0; a < 3; a++) out[a] = im->rope[a * im->n_prompt + pos];
        return;
    }
    out[0] = out[1] = out[2] = pos - im->rope_shift;
}

const struct vision_hparams *engine_vision_hparams(const pshard_ctx *ctx) {
    return ctx->vision ? &ctx->vision->mmproj.hp : NULL;
}

int32_t engine_vision_token(const pshard_ctx *ctx, int32_t id) {
    if (id >= 0) return id;
    return ctx->vision && ctx->vision->id_pad >= 0 ? ctx->vision->id_pad : 0;
}

/* ---- the one-sequence calls */

pshard_status engine_vision_prompt(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts, int32_t *n_prompt,
                                   pshard_gen_stats *stats) {
    struct engine_images images;
    pshard_status st = engine_vision_tokenize(ctx, prompt, opts, &images, n_prompt, stats);
    if (!ctx->vision) return st;
    engine_images_release(&ctx->vision->prompt); /* the previous call's; its cells still hold its images */
    if (st == PSHARD_OK) ctx->vision->prompt = images;
    return st;
}

const struct exec_media *engine_vision_prompt_step(pshard_ctx *ctx, int32_t start, struct exec_batch *b) {
    struct engine_vision *v = ctx->vision;
    if (!v || v->prompt.n_runs == 0) return NULL;
    const int32_t m = engine_images_piece(ctx, &v->prompt, start, b->n_tokens, true, &v->media);
    for (int32_t i = 0; i < m; i++) {
        v->step_tokens[i] = engine_vision_token(ctx, ctx->prompt[start + i]);
        int32_t rope[3];
        engine_images_rope(&v->prompt, start + i, rope);
        for (int a = 0; a < 3; a++) v->step_rope[a * m + i] = rope[a];
    }
    b->n_tokens = m;
    b->tokens = v->step_tokens;
    v->media.rope_pos = v->step_rope;
    return &v->media;
}

const int32_t *engine_vision_decode_rope(const pshard_ctx *ctx, int32_t pos, int32_t out[3]) {
    const struct engine_vision *v = ctx->vision;
    if (!v || v->prompt.rope_shift == 0) return NULL;
    engine_images_rope(&v->prompt, pos, out);
    return out;
}
