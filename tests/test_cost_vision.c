/* The vision encoder's phase as the planner prices it (plan/cost_vision.h), on gguf-synth's tiny
 * Qwen2.5-VL pair and a made-up profile: the image's size, patches and tokens as preprocessing
 * makes them; times that grow with the image; the GPU's walk between its copies and its compute;
 * the peak and the placement as the GPU encoder's own plan gives them, flipping to the CPU when
 * the room lent is below that peak; the room a plan lends; the first token of a request. */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "plan/cost.h"
#include "plan/cost_vision.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "vision/preprocess.h"
#include "test_helpers.h"

static char lm_path[256], mmproj_path[256];
static struct gguf_file *lm_file, *mm_file;
static struct model lm;
static struct mmproj mm;
/* The GPU's buffers of a plan, small beside the encoder's (which they leave to the budget's rest). */
static const struct plan_gpu_costs costs = {.activations = 64 << 10, .logits = 64 << 10, .blas = 1 << 20, .host_mapping = 1 << 20,
                                            .buffers = 32 << 10, .margin = 16 << 10};

static int setup(void **state) {
    (void)state;
    if (test_synth_vision_pair("cost-vision", lm_path, sizeof lm_path, mmproj_path, sizeof mmproj_path) != 0)
        return -1;
    if (gguf_open(lm_path, &lm_file) != PSHARD_OK || model_load(lm_file, &lm) != PSHARD_OK ||
        gguf_open(mmproj_path, &mm_file) != PSHARD_OK || mmproj_load(mm_file, &mm) != PSHARD_OK) {
        fprintf(stderr, "cannot read the tiny pair: %s\n", pshard_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    mmproj_free(&mm);
    gguf_close(mm_file);
    model_free(&lm);
    gguf_close(lm_file);
    unlink(lm_path);
    unlink(mmproj_path);
    return 0;
}

/* The defaults with a GPU, every rate made distinct from the others' so a mix-up shows. */
static void made_up_profile(struct profile *prof) {
    plan_profile(NULL, prof);
    for (int i = 0; i < PROFILE_TOKENS; i++) {
        prof->cpu_attn[i] = 2e-10;
        prof->gpu_attn[i] = prof->gpu_attn_long[i] = 3e-12;
    }
}

/* The room lent as one region of `bytes`. */
static struct cuda_region room(size_t bytes) { return (struct cuda_region){NULL, bytes}; }

/* The image's size, patches and tokens are preprocessing's. */
static void test_size(void **state) {
    (void)state;
    struct profile prof;
    made_up_profile(&prof);
    struct cost_vision v;
    assert_int_equal(cost_vision_encode(&prof, &mm, 640, 480, NULL, 0, 0, 0, true, &v), PSHARD_OK);
    struct vision_patches p;
    assert_int_equal(vision_patches_size(&mm.hp, 640, 480, &p), PSHARD_OK);
    assert_null(p.data);
    assert_int_equal(v.width, 644);
    assert_int_equal(v.height, 476);
    assert_int_equal(v.width, p.width);
    assert_int_equal(v.height, p.height);
    assert_int_equal(v.grid_w, 46);
    assert_int_equal(v.grid_h, 34);
    assert_int_equal(v.n_patches, 46 * 34);
    assert_int_equal(v.n_tokens, 23 * 17);
    assert_int_equal(cost_vision_prompt_tokens(&v, 10), 23 * 17 + 12);
    /* an aspect ratio the processor refuses */
    assert_int_equal(cost_vision_encode(&prof, &mm, 16000, 50, NULL, 0, 0, 0, true, &v), PSHARD_ERR_RANGE);
}

/* Larger images take longer on both sides; the GPU's encoding is at least its copies and its
 * compute each (they run side by side) and at most both; the weights go up once an image. */
static void test_times_grow(void **state) {
    (void)state;
    struct profile prof;
    made_up_profile(&prof);
    static const uint32_t sides[][2] = {{56, 56}, {224, 224}, {448, 448}, {1288, 966}, {1920, 1080}};
    double gpu = 0, cpu = 0;
    uint64_t streamed = 0;
    for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
        struct cost_vision v;
        const struct cuda_region r = room((size_t)1 << 34);
        assert_int_equal(cost_vision_encode(&prof, &mm, sides[i][0], sides[i][1], &r, 1, 0, 0, true, &v), PSHARD_OK);
        assert_true(isfinite(v.gpu_s) && v.gpu_s > gpu);
        assert_true(isfinite(v.cpu_s) && v.cpu_s > cpu);
        assert_true(v.gpu_s >= v.gpu_copy_s && v.gpu_s >= v.gpu_compute_s);
        assert_true(v.gpu_s <= v.gpu_copy_s + v.gpu_compute_s + 1e-6);
        if (i) assert_int_equal(v.streamed_bytes, streamed);
        streamed = v.streamed_bytes;
        gpu = v.gpu_s, cpu = v.cpu_s;
    }
    assert_true(streamed > mm.weight_bytes / 2);
    /* A slow link: the copies take the time, and some compute (the patches' own way up among it)
     * hides behind them. */
    struct profile slow = prof;
    for (int i = 0; i < PROFILE_SIZES; i++) slow.h2d_gbps[i] = 0.001;
    struct cost_vision v, w;
    const struct cuda_region r = room((size_t)1 << 34);
    assert_int_equal(cost_vision_encode(&prof, &mm, 224, 224, &r, 1, 0, 0, true, &v), PSHARD_OK);
    assert_int_equal(cost_vision_encode(&slow, &mm, 224, 224, &r, 1, 0, 0, true, &w), PSHARD_OK);
    assert_true(w.gpu_copy_s > 100 * v.gpu_compute_s);
    assert_true(w.gpu_s >= w.gpu_copy_s && w.gpu_s < w.gpu_copy_s + w.gpu_compute_s);
    assert_true(w.cpu_s == v.cpu_s);
    /* A profile without GPU figures prices no GPU step. */
    slow = prof;
    slow.has_gpu = false;
    assert_int_equal(cost_vision_encode(&slow, &mm, 224, 224, &r, 1, 0, 0, true, &w), PSHARD_OK);
    assert_true(isinf(w.gpu_s));
}

/* An image's windows (the caller frees them) and its largest and least layouts. */
static void layouts(uint32_t width, uint32_t height, struct vision_windows *w, struct vision_gpu_layout *big,
                    struct vision_gpu_layout *least) {
    struct vision_patches p;
    assert_int_equal(vision_patches_size(&mm.hp, width, height, &p), PSHARD_OK);
    assert_int_equal(vision_windows_make(&mm.hp, p.grid_h, p.grid_w, w), PSHARD_OK);
    vision_gpu_sizes(&mm, w, 1024, 2, big);
    vision_gpu_sizes(&mm, w, 64, 1, least);
}

/* Where it runs and its peak: the GPU encoder's own plan over the room lent. Room for its
 * largest layout takes it; room one byte short of its least sends the image to the CPU, saying
 * why; no room at all, or the GPU not wanted (--no-mmproj-offload), too. */
static void test_placement(void **state) {
    (void)state;
    struct profile prof;
    made_up_profile(&prof);
    struct vision_windows w;
    struct vision_gpu_layout big, least, planned;
    layouts(1920, 1080, &w, &big, &least);
    assert_true(least.peak_bytes < big.peak_bytes);
    struct cost_vision v;

    struct cuda_region r = room(big.peak_bytes);
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, 0, 0, true, &v), PSHARD_OK);
    const bool kernels = cuda_type_supported(QUANT_F32);
    assert_int_equal(v.kernels_checked, kernels);
    const pshard_status st = kernels ? vision_gpu_plan(&mm, &w, &r, 1, &planned) : vision_gpu_plan_room(&mm, &w, &r, 1, &planned);
    assert_int_equal(v.on_gpu, st == PSHARD_OK);
    if (v.on_gpu) {
        assert_int_equal(v.layout.peak_bytes, big.peak_bytes);
        assert_int_equal(v.layout.peak_bytes, planned.peak_bytes);
        assert_int_equal(v.layout.n_slots, 2);
        assert_int_equal(v.layout.chunk_rows, planned.chunk_rows);
    }
    assert_int_equal(v.lent_bytes, big.peak_bytes);
    const double roomy_s = v.gpu_s;

    r = room(least.peak_bytes);
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, 0, 0, true, &v), PSHARD_OK);
    if (!kernels) {
        assert_true(v.on_gpu);
        assert_int_equal(v.layout.peak_bytes, least.peak_bytes);
        assert_int_equal(v.layout.n_slots, 1);
        assert_true(v.gpu_s >= roomy_s); /* smaller chunks, one slot: no faster */
    }

    r = room(least.peak_bytes - 1);
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, 0, 0, true, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    if (!kernels) {
        assert_non_null(strstr(v.why_cpu, "needs"));
        assert_int_equal(v.layout.peak_bytes, least.peak_bytes); /* the least it needs */
        assert_true(fabs(v.gpu_s - roomy_s) < 1e-12);             /* priced as it runs with room */
    }
    assert_true(isfinite(v.cpu_s));

    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, NULL, 0, 0, 0, true, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    assert_non_null(strstr(v.why_cpu, "no GPU memory"));

    r = room(big.peak_bytes);
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, 0, 0, false, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    assert_non_null(strstr(v.why_cpu, "--no-mmproj-offload"));
    vision_windows_free(&w);
}

/* The whole budget where the room lent is short of the least: the GPU in the whole budget, the
 * layout the largest the whole budget holds (priced over it), the resident weights' re-upload at
 * the pinned rate; a whole budget short of the least too: the CPU, naming it; none asked without a
 * GPU placement or with the GPU not wanted (--no-mmproj-offload). */
static void test_whole_budget(void **state) {
    (void)state;
    struct profile prof;
    made_up_profile(&prof);
    struct vision_windows w;
    struct vision_gpu_layout big, least;
    layouts(1920, 1080, &w, &big, &least);
    vision_windows_free(&w);
    const uint64_t resident = 300u << 20;
    struct cost_vision v, roomy;
    struct cuda_region r = room(least.peak_bytes - 1);
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, 0, resident, true, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    assert_int_equal(v.memory, VISION_GPU_NONE);
    assert_int_equal(v.reupload_bytes, 0);

    r = room(big.peak_bytes);
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, 0, resident, true, &roomy), PSHARD_OK);
    r = room(least.peak_bytes - 1);
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, big.peak_bytes, resident, true, &v), PSHARD_OK);
    assert_int_equal(v.whole_bytes, big.peak_bytes);
    assert_int_equal(v.lent_bytes, least.peak_bytes - 1);
    if (!v.kernels_checked) {
        assert_true(v.on_gpu);
        assert_true(roomy.on_gpu);
        assert_int_equal(roomy.memory, VISION_GPU_IN_SCRATCH);
        assert_int_equal(roomy.reupload_bytes, 0);
        assert_true(roomy.reupload_s == 0);
    }
    if (v.on_gpu) {
        assert_int_equal(v.memory, VISION_GPU_IN_BUDGET);
        assert_int_equal(v.layout.peak_bytes, big.peak_bytes);
        assert_int_equal(v.layout.n_slots, 2);
        assert_true(fabs(v.gpu_s - roomy.gpu_s) < 1e-12); /* the same layout as with room lent */
        assert_int_equal(v.reupload_bytes, resident);
        assert_true(fabs(v.reupload_s - cost_copy_s(&prof, (double)resident, true)) < 1e-15);
        assert_true(fabs(cost_vision_encode_s(&v) - (v.gpu_s + v.reupload_s)) < 1e-15);
    }

    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, least.peak_bytes - 1, resident, true, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    assert_int_equal(v.memory, VISION_GPU_NONE);
    assert_true(v.reupload_s == 0);
    if (!v.kernels_checked) assert_non_null(strstr(v.why_cpu, "the whole budget"));
    assert_true(fabs(cost_vision_encode_s(&v) - v.cpu_s) < 1e-15);

    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, NULL, 0, big.peak_bytes, resident, true, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    assert_int_equal(v.whole_bytes, 0);
    assert_non_null(strstr(v.why_cpu, "no GPU memory"));
    assert_int_equal(cost_vision_encode(&prof, &mm, 1920, 1080, &r, 1, big.peak_bytes, resident, false, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    assert_int_equal(v.memory, VISION_GPU_NONE);
    assert_true(v.reupload_s == 0);
}

static struct plan_request request(const struct profile *prof, int64_t budget) {
    return (struct plan_request){.family = PLAN_AUTO, .vram_budget = budget, .n_ctx = 4096, .n_batch = 512, .n_seq = 1,
                                 .staging = -1, .profile = prof, .decode_set = -1};
}

/* A plan lends its work buffer, activations, slots and unused budget; none on the CPU alone. The
 * image goes to the GPU under a budget whose rest holds the encoder's least, to the CPU under
 * one a MB short of it; the first token is the encoding where it runs plus the prompt's steps. */
static void test_plan_lends(void **state) {
    (void)state;
    struct profile prof;
    made_up_profile(&prof);
    struct plan p;
    struct plan_request req = request(&prof, 0);
    assert_int_equal(plan_build(&lm, &req, &costs, &p), PSHARD_OK);
    struct cuda_region regions[COST_VISION_REGIONS];
    assert_int_equal(cost_vision_lendable(&p, regions), 0);
    assert_int_equal(cost_vision_whole(&p), 0);
    struct cost_vision v;
    assert_int_equal(cost_vision_encode(&prof, &mm, 448, 448, regions, 0, 0, 0, true, &v), PSHARD_OK);
    assert_false(v.on_gpu);
    double prompt_s, ttft, decode_s;
    double first = cost_vision_first_token(&prof, &lm, &p, &v, COST_VISION_QUESTION_TOKENS, &prompt_s);
    cost_request(&prof, &lm, &p, cost_vision_prompt_tokens(&v, COST_VISION_QUESTION_TOKENS), p.n_batch, 1, 1, &ttft,
                 &decode_s);
    assert_true(fabs(prompt_s - ttft) < 1e-12);
    assert_true(fabs(first - (v.cpu_s + ttft)) < 1e-12);
    plan_free(&p);

    req = request(&prof, -1); /* what everything resident takes */
    assert_int_equal(plan_build(&lm, &req, &costs, &p), PSHARD_OK);
    const uint64_t all = p.budget.total;
    plan_free(&p);
    struct vision_patches size;
    assert_int_equal(vision_patches_size(&mm.hp, 448, 448, &size), PSHARD_OK);
    struct vision_windows w;
    assert_int_equal(vision_windows_make(&mm.hp, size.grid_h, size.grid_w, &w), PSHARD_OK);
    struct vision_gpu_layout least;
    vision_gpu_sizes(&mm, &w, 64, 1, &least);
    vision_windows_free(&w);
    const int64_t extra[] = {(int64_t)least.peak_bytes, (int64_t)least.peak_bytes - (1 << 20)};
    for (int k = 0; k < 2; k++) {
        req = request(&prof, (int64_t)all + extra[k]);
        assert_int_equal(plan_build(&lm, &req, &costs, &p), PSHARD_OK);
        const uint32_t n = cost_vision_lendable(&p, regions);
        uint64_t lent = 0;
        for (uint32_t i = 0; i < n; i++) lent += regions[i].bytes;
        const struct plan_budget *b = &p.budget;
        /* as the executor lends: the step's buffers, and the activations' margin with the free end */
        assert_int_equal(b->buffers, costs.buffers + costs.logits);
        assert_true(b->buffers + b->margin < b->activations);
        assert_int_equal(lent, b->work + b->buffers + b->staging + b->free + b->margin);
        assert_true(lent >= (uint64_t)extra[k]);
        assert_int_equal(cost_vision_encode(&prof, &mm, 448, 448, regions, n, 0, 0, true, &v), PSHARD_OK);
        if (!v.kernels_checked) assert_int_equal(v.on_gpu, k == 0);
        if (k == 1) assert_false(v.on_gpu);
        first = cost_vision_first_token(&prof, &lm, &p, &v, COST_VISION_QUESTION_TOKENS, &prompt_s);
        assert_true(fabs(first - ((v.on_gpu ? v.gpu_s : v.cpu_s) + prompt_s)) < 1e-12);
        /* The whole budget holds the least (the language model's memory given up for the
         * encoding): the GPU either way, the short one in the whole budget, its resident weights
         * going up again after and counted in the first token. */
        const uint64_t whole = cost_vision_whole(&p);
        assert_int_equal(whole, b->total - b->mapping - cuda_align(b->blas));
        assert_true(whole > lent && whole >= least.peak_bytes);
        assert_int_equal(cost_vision_encode(&prof, &mm, 448, 448, regions, n, whole, b->weights, true, &v), PSHARD_OK);
        assert_int_equal(v.whole_bytes, whole);
        if (!v.kernels_checked) {
            assert_true(v.on_gpu);
            assert_int_equal(v.memory, k == 0 ? VISION_GPU_IN_SCRATCH : VISION_GPU_IN_BUDGET);
        }
        if (k == 1 && v.on_gpu) {
            assert_int_equal(v.memory, VISION_GPU_IN_BUDGET);
            assert_int_equal(v.reupload_bytes, b->weights);
            assert_true(b->weights > 0 && v.reupload_s > 0);
            assert_true(fabs(v.reupload_s - cost_copy_s(&prof, (double)b->weights, true)) < 1e-15);
        }
        first = cost_vision_first_token(&prof, &lm, &p, &v, COST_VISION_QUESTION_TOKENS, &prompt_s);
        assert_true(fabs(first - (cost_vision_encode_s(&v) + prompt_s)) < 1e-12);
        if (v.on_gpu) assert_true(fabs(cost_vision_encode_s(&v) - (v.gpu_s + v.reupload_s)) < 1e-15);
        assert_true(prompt_s > 0 && isfinite(prompt_s));
        plan_free(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_times_grow),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_whole_budget),
        cmocka_unit_test(test_plan_lends),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
