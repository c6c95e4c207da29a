/* `pshard plan --mmproj VISION.gguf --image-size WxH`: after the plan, what an image of that size
 * costs: its encoding on the GPU and on the CPU, where the engine would run it under the plan, the
 * memory it takes there, and the first token of a request with it (plan/cost_vision.h prices it). */
#include "plan_image.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "cli.h"
#include "engine/tools_api.h"

int plan_image_parse_size(const char *text, struct plan_image *image) {
    const char *x = strchr(text, 'x');
    char width[32];
    if (!x || (size_t)(x - text) >= sizeof width) {
        fprintf(stderr, "pshard plan: --image-size takes WxH, an image's width and height in pixels such as 1920x1080, "
                        "got '%s'\n", text);
        return -1;
    }
    memcpy(width, text, (size_t)(x - text));
    width[x - text] = '\0';
    if (cli_int("plan", "--image-size's width", width, 1, VISION_IMAGE_MAX_SIDE, &image->width) ||
        cli_int("plan", "--image-size's height", x + 1, 1, VISION_IMAGE_MAX_SIDE, &image->height))
        return -1;
    const int64_t pixels = image->width * image->height;
    if (pixels > VISION_IMAGE_MAX_PIXELS) {
        fprintf(stderr, "pshard plan: --image-size %s is %" PRId64 " pixels, over the %d an image may have\n", text, pixels,
                (int)VISION_IMAGE_MAX_PIXELS);
        return -1;
    }
    return 0;
}

/* The encoder of lm in the file at path, checked as pshard_vision_load checks it. */
static pshard_status open_encoder(const struct model *lm, const char *path, struct gguf_file **file, struct mmproj *m) {
    if (lm->hp.arch != ARCH_QWEN2VL)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: the model (%s) takes no images; an mmproj file goes with a qwen2vl "
                         "model (Qwen2-VL, Qwen2.5-VL)", path, lm->hp.arch_name);
    CORE_TRY(gguf_open(path, file));
    pshard_status st = mmproj_is_mmproj(*file) ? mmproj_load(*file, m)
                                               : core_fail(PSHARD_ERR_FORMAT, "%s: not an mmproj file (general.architecture "
                                                                              "is not 'clip')", path);
    if (st == PSHARD_OK && m->hp.projection_dim != lm->hp.n_embd) {
        st = core_fail(PSHARD_ERR_INVALID_ARG, "%s: its encoder gives embeddings %u wide and the model's are %u: the mmproj "
                       "file is not this model's", path, m->hp.projection_dim, lm->hp.n_embd);
        mmproj_free(m);
    }
    if (st != PSHARD_OK) gguf_close(*file);
    return st;
}

static double mb(uint64_t bytes) { return bytes / 1048576.0; }

static void print_cost(const struct model *lm, const struct plan *plan, const struct profile *prof,
                       const struct plan_image *image, const struct cost_vision *v, FILE *out) {
    const struct vision_gpu_layout *l = &v->layout;
    fprintf(out, "image %" PRId64 "x%" PRId64 ": resized to %ux%u, %u x %u patches (%u), %u image tokens\n", image->width,
            image->height, v->width, v->height, v->grid_w, v->grid_h, v->n_patches, v->n_tokens);
    if (isfinite(v->gpu_s))
        fprintf(out, "  encoder on the GPU: %.4g s (%.1f MB of weights copied up block by block in %.4g s, beside %.4g s "
                     "of compute)\n", v->gpu_s, mb(v->streamed_bytes), v->gpu_copy_s, v->gpu_compute_s);
    else
        fprintf(out, "  encoder on the GPU: inf (%s)\n", l->peak_bytes ? "the profile has no GPU figures" : v->why_cpu);
    fprintf(out, "  encoder on the CPU: %.4g s\n", v->cpu_s);
    if (l->peak_bytes)
        fprintf(out, "  encoder's peak VRAM: %s%.1f MB (chunks of %u patches, %u staging slot%s); the plan lends %.1f MB "
                     "between steps, its whole budget %.1f MB\n", v->on_gpu ? "" : "at least ", mb(l->peak_bytes),
                l->chunk_rows, l->n_slots, l->n_slots == 1 ? "" : "s", mb(v->lent_bytes), mb(v->whole_bytes));
    const char *judged = v->kernels_checked ? "" : " (judged by memory: this build has no GPU kernels to ask about the "
                                                   "matrices' types)";
    if (v->memory == VISION_GPU_IN_SCRATCH)
        fprintf(out, "  runs on: the GPU, in %s%s\n", vision_gpu_memory_name(v->memory), judged);
    else if (v->memory == VISION_GPU_IN_BUDGET)
        fprintf(out, "  runs on: the GPU, in %s: the language model's resident weights go up again after, %.1f MB in "
                     "%.4g s%s\n", vision_gpu_memory_name(v->memory), mb(v->reupload_bytes), v->reupload_s, judged);
    else
        fprintf(out, "  runs on: the CPU (%s)\n", v->why_cpu);
    const int32_t n_prompt = cost_vision_prompt_tokens(v, COST_VISION_QUESTION_TOKENS);
    if (n_prompt > plan->n_ctx) {
        fprintf(out, "  first token: none; the image's %u tokens and a %d-token question do not fit the context (-c %d)\n",
                  v->n_tokens, COST_VISION_QUESTION_TOKENS, plan->n_ctx);
        return;
    }
    double prompt_s;
    const double first = cost_vision_first_token(prof, lm, plan, v, COST_VISION_QUESTION_TOKENS, &prompt_s);
    fprintf(out, "  first token: %.4g s for a request with this image and a %d-token question (encoding %.4g s + a "
                 "%d-token prompt %.4g s)\n", first, COST_VISION_QUESTION_TOKENS, cost_vision_encode_s(v), n_prompt, prompt_s);
}

pshard_status plan_image_print(const struct model *lm, const struct plan *plan, const struct profile *prof,
                               const struct plan_image *image, FILE *out) {
    struct profile defaults;
    prof = plan_profile(prof, &defaults);
    struct gguf_file *file;
    struct mmproj m;
    CORE_TRY(open_encoder(lm, image->mmproj, &file, &m));
    struct cuda_region regions[COST_VISION_REGIONS];
    const uint32_t n_regions = cost_vision_lendable(plan, regions);
    struct cost_vision v;
    const pshard_status st = cost_vision_encode(prof, &m, (uint32_t)image->width, (uint32_t)image->height, regions,
                                                n_regions, cost_vision_whole(plan), plan->budget.weights, !image->no_offload, &v);
    if (st == PSHARD_OK) print_cost(lm, plan, prof, image, &v, out);
    mmproj_free(&m);
    gguf_close(file);
    if (st != PSHARD_OK) return core_fail_context(st, "--image-size %" PRId64 "x%" PRId64, image->width, image->height);
    return PSHARD_OK;
}
