/* GPU test of greedy steps chained on the GPU (exec_chain_*). On the all-GPU plan of a tiny dense
 * and a tiny MoE model: the tokens picked on the GPU, two steps in flight, across a KV block's
 * edge (the block table changing under a step in flight), are the first largest logits of plain
 * steps over the same tokens (the same kernels: the same bits); a step cancelled in flight leaves
 * its sequence at the last pick taken, and a plain step from there gives the plain path's logits
 * bit for bit; a plain step while a chained one is in flight, a chained launch that takes a pick
 * no step left, and any chained launch on the CPU plan are refused and change nothing. Built with
 * the library, as exec_kv_pool; exits 0 with a "skipped" line without a GPU.
 * Usage: exec_chain BUILD_DIR (where gguf-synth is) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cuda_backend.h"
#include "exec/exec.h"
#include "exec_test.h"

enum { PROMPT = 40, STEPS = 30 }; /* (KV blocks of 64 cells: the chain crosses one's edge) */

/* The sampler's greedy choice: the first of the largest (NaNs never chosen). */
static int32_t first_largest(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

static bool one_step(struct exec_ctx *ctx, int32_t token, int32_t pos) {
    const int32_t seq = 0;
    const struct exec_batch b = {1, &token, &pos, &seq, NULL};
    return ok_status(exec_step(ctx, &b), "plain step");
}

static void scenario(const char *label, const struct model *model) {
    struct exec_params p = {.n_ctx = 256, .n_batch = 64, .n_seq = 2, .n_threads = 2, .plan = PLAN_GPU, .vram_budget = -1,
                            .staging = -1, .decode_set = PLAN_DECODE_WEIGHED, .n_cells = 512};
    struct exec_ctx *ctx;
    char what[200];
    if (!ok_status(exec_create(model, &p, &ctx), "GPU plan")) {
        check(false, label);
        return;
    }
    const int32_t V = exec_n_vocab(ctx);
    int32_t tokens[PROMPT], pos[PROMPT], seqs[PROMPT];
    for (int32_t i = 0; i < PROMPT; i++) tokens[i] = 1 + (i * 37 + (i * i) % 13) % 900, pos[i] = i, seqs[i] = 0;
    const struct exec_batch prompt = {PROMPT, tokens, pos, seqs, NULL};
    /* The plain path: tokens t[0..STEPS], each step's logits kept. */
    int32_t t[STEPS + 2];
    float *plain = malloc(sizeof(float) * (size_t)V * (STEPS + 1));
    bool ran = ok_status(exec_step(ctx, &prompt), "prompt");
    if (ran) t[0] = first_largest(exec_logits(ctx, 0), V);
    for (int32_t k = 0; ran && k <= STEPS; k++) {
        ran = one_step(ctx, t[k], PROMPT + k);
        if (ran) memcpy(plain + (size_t)k * V, exec_logits(ctx, 0), sizeof(float) * (size_t)V);
        if (ran) t[k + 1] = first_largest(plain + (size_t)k * V, V);
    }
    snprintf(what, sizeof what, "%s: the plain steps ran", label);
    check(ran, what);
    if (!ran) goto done;

    /* The same tokens chained: the sequence cut back to its prompt first. */
    exec_truncate_seq(ctx, 0, PROMPT);
    snprintf(what, sizeof what, "%s: a picked step is refused with no step before it", label);
    check(exec_chain_launch(ctx, 0, PROMPT, -1) != PSHARD_OK && exec_seq_len(ctx, 0) == PROMPT, what);
    snprintf(what, sizeof what, "%s: the step after the prompt can be chained", label);
    check(exec_chain_ready(ctx, 0, PROMPT), what);
    ran = ok_status(exec_chain_launch(ctx, 0, PROMPT, t[0]), "chained launch");
    snprintf(what, sizeof what, "%s: a plain step while a chained one is in flight is refused", label);
    check(ran && !one_step(ctx, t[1], PROMPT + 1) && exec_seq_len(ctx, 0) == PROMPT + 1, what);
    int32_t same = 0;
    for (int32_t k = 0; ran && k < STEPS; k++) {
        ran = ok_status(exec_chain_launch(ctx, 0, PROMPT + k + 1, -1), "chained launch");
        int32_t pick = -1;
        if (ran) ran = ok_status(exec_chain_wait(ctx, &pick), "chained wait");
        same += ran && pick == t[k + 1];
        if (ran && pick != t[k + 1]) printf("     step %d: picked %d, the plain step's largest %d\n", k, pick, t[k + 1]);
    }
    snprintf(what, sizeof what, "%s: %d of %d picks are the plain steps' first largest logits", label, same, STEPS);
    check(ran && same == STEPS, what);
    /* One step is in flight (its token t[STEPS], at PROMPT + STEPS): cancelled, it leaves the
     * sequence at the picks taken. */
    snprintf(what, sizeof what, "%s: a cancelled step leaves its sequence at the last pick taken", label);
    check(ran && exec_chain_cancel(ctx) == PSHARD_OK && exec_seq_len(ctx, 0) == PROMPT + STEPS, what);
    ran = ran && one_step(ctx, t[STEPS], PROMPT + STEPS);
    snprintf(what, sizeof what, "%s: a plain step after the cancel gives the plain path's logits bit for bit", label);
    check(ran && !memcmp(exec_logits(ctx, 0), plain + (size_t)STEPS * V, sizeof(float) * (size_t)V), what);
done:
    free(plain);
    exec_free(ctx);
}

static void on_the_cpu(const struct model *model) {
    struct exec_params p = {.n_ctx = 256, .n_batch = 64, .n_seq = 1, .n_threads = 2, .plan = PLAN_CPU, .vram_budget = 0,
                            .staging = -1, .decode_set = PLAN_DECODE_WEIGHED, .n_cells = 256};
    struct exec_ctx *ctx;
    if (!ok_status(exec_create(model, &p, &ctx), "CPU plan")) {
        check(false, "the CPU plan opens");
        return;
    }
    check(!exec_chain_ready(ctx, 0, 0) && exec_chain_launch(ctx, 0, 0, 5) != PSHARD_OK && exec_seq_len(ctx, 0) == 0,
          "the CPU plan chains nothing and refuses a chained launch");
    exec_free(ctx);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cuda_device_count() == 0) {
        printf("exec_chain: no CUDA device: skipped\n");
        return 0;
    }
    const char *dir = argc > 1 ? argv[1] : ".";
    static const char *const shapes[][2] = {{"tiny-llama", "Q8_0"}, {"tiny-moe", "Q4_K"}};
    for (int s = 0; s < 2; s++) {
        char path[256], cmd[1024], label[64];
        snprintf(path, sizeof path, "/tmp/pshard-chain-%d-%d.gguf", (int)getpid(), s);
        snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape %s --type %s --seed 11 --quiet -o '%s'", dir, shapes[s][0],
                 shapes[s][1], path);
        snprintf(label, sizeof label, "%s %s", shapes[s][0], shapes[s][1]);
        struct gguf_file *file;
        struct model model;
        if (system(cmd) != 0 || gguf_open(path, &file) != PSHARD_OK || model_load(file, &model) != PSHARD_OK) {
            fprintf(stderr, "cannot make the tiny model with gguf-synth (%s)\n", cmd);
            return 2;
        }
        scenario(label, &model);
        if (s == 0) on_the_cpu(&model);
        model_free(&model);
        gguf_close(file);
        unlink(path);
    }
    printf("exec_chain: %d cases, %d failed: %s\n", cases, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
