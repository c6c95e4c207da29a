/* GPU test of the executor's KV pool: the all-GPU plan, run through sequences whose blocks
 * interleave in the pool, a shared prefix, truncation into a shared block and going on (a copy on
 * write), single-token steps replayed from a graph while the block table changes, and a filled
 * sequence, gives the CPU plan's logits at every output within tolerance; and within each plan, a
 * sequence's logits do not change when another that shares its prefix writes. Built with the
 * library (not in the standalone device build); exits 0 with a "skipped" line without a GPU.
 * Usage: exec_kv_pool BUILD_DIR (where gguf-synth is), or exec_kv_pool MODEL.gguf (gguf-synth's
 * tiny-llama, F32, made elsewhere: the standalone device build has no gguf-synth) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cuda_backend.h"
#include "exec/exec.h"

enum { MAX_OUT = 32 };

struct run {
    float *out[MAX_OUT];
    int n_out;
    bool unchanged; /* the sequence sharing a prefix kept its logits while the other wrote */
};

static int failures, cases;

static void check(bool ok, const char *what) {
    cases++;
    failures += !ok;
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
}

static bool ok_status(pshard_status st, const char *what) {
    if (st != PSHARD_OK) fprintf(stderr, "%s: %s\n", what, pshard_last_error());
    return st == PSHARD_OK;
}

static int32_t token_of(int which, int32_t i) { return 1 + (int32_t)((i * 37 + which * 101 + (i * i) % 13) % 900); }

static void keep(struct exec_ctx *ctx, struct run *r, int32_t i) {
    const size_t bytes = sizeof(float) * (size_t)exec_n_vocab(ctx);
    r->out[r->n_out] = malloc(bytes);
    memcpy(r->out[r->n_out++], exec_logits(ctx, i), bytes);
}

/* Tokens [from, to) of text `which` into sequence seq, n a step; the last one's logits kept. */
static bool extend(struct exec_ctx *ctx, struct run *r, int32_t seq, int which, int32_t from, int32_t to, int32_t n) {
    int32_t tokens[64], pos[64], seqs[64];
    for (int32_t at = from; at < to; at += n) {
        const int32_t count = to - at < n ? to - at : n;
        for (int32_t i = 0; i < count; i++) tokens[i] = token_of(which, at + i), pos[i] = at + i, seqs[i] = seq;
        struct exec_batch b = {count, tokens, pos, seqs, NULL};
        if (!ok_status(exec_step(ctx, &b), "step")) return false;
    }
    if (r) keep(ctx, r, 0);
    return true;
}

static bool scenario(struct exec_ctx *ctx, struct run *r) {
    /* Two sequences, 20 tokens of each a step: their blocks alternate in the pool. */
    int32_t tokens[64], pos[64], seq[64];
    int8_t want[64];
    for (int32_t at = 0; at < 200; at += 20) {
        for (int32_t i = 0; i < 40; i++)
            tokens[i] = token_of(i % 2, at + i / 2), pos[i] = at + i / 2, seq[i] = i % 2, want[i] = at + i / 2 == 199;
        struct exec_batch b = {40, tokens, pos, seq, want};
        if (!ok_status(exec_step(ctx, &b), "interleaved step")) return false;
    }
    keep(ctx, r, 0), keep(ctx, r, 1);
    /* A prompt of one sequence (the prompt kernel) over its interleaved blocks. */
    if (!extend(ctx, r, 0, 0, 200, 264, 64)) return false;
    /* Sequence 2 starts with sequence 0's first 150 cells: two blocks shared, 22 cells copied. */
    if (!ok_status(exec_share_prefix(ctx, 2, 0, 150), "share")) return false;
    if (!extend(ctx, r, 2, 2, 150, 190, 40)) return false;
    /* Single tokens (a captured graph, replayed) of both. */
    if (!extend(ctx, r, 0, 3, 264, 269, 1)) return false;
    if (!extend(ctx, r, 2, 3, 190, 191, 1)) return false;
    float *before = r->out[r->n_out - 1];
    exec_truncate_seq(ctx, 2, 190);
    /* Sequence 0 truncated into its second block, which sequence 2 holds too: its next write
     * copies the block; the replayed graph reads the new table. */
    exec_truncate_seq(ctx, 0, 100);
    if (!extend(ctx, r, 0, 4, 100, 103, 1)) return false;
    if (!extend(ctx, r, 0, 4, 103, 120, 17)) return false;
    if (!extend(ctx, r, 2, 3, 190, 191, 1)) return false;
    r->unchanged = memcmp(before, r->out[r->n_out - 1], sizeof(float) * (size_t)exec_n_vocab(ctx)) == 0;
    /* A sequence filled without computing (zeros), then a token over it. */
    if (!ok_status(exec_fill_seq(ctx, 3, 300), "fill")) return false;
    return extend(ctx, r, 3, 5, 300, 301, 1);
}

static bool run_plan(const struct model *model, bool gpu, struct run *r) {
    struct exec_params p = {.n_ctx = 512, .n_batch = 64, .n_seq = 4, .n_threads = 2, .plan = gpu ? PLAN_GPU : PLAN_CPU,
                            .vram_budget = gpu ? -1 : 0, .staging = -1, .decode_set = PLAN_DECODE_WEIGHED, .n_cells = 1024};
    struct exec_ctx *ctx;
    if (!ok_status(exec_create(model, &p, &ctx), gpu ? "GPU plan" : "CPU plan")) return false;
    const bool ok = scenario(ctx, r);
    exec_free(ctx);
    return ok;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cuda_device_count() == 0) {
        printf("exec_kv_pool: no CUDA device: skipped\n");
        return 0;
    }
    char path[256], cmd[1024];
    const char *arg = argc > 1 ? argv[1] : ".";
    const bool given = strlen(arg) > 5 && !strcmp(arg + strlen(arg) - 5, ".gguf");
    if (given) snprintf(path, sizeof path, "%s", arg);
    else snprintf(path, sizeof path, "/tmp/pshard-kv-pool-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape tiny-llama --type F32 --seed 3 --quiet -o '%s'", arg, path);
    struct gguf_file *file;
    struct model model;
    if ((!given && system(cmd) != 0) || gguf_open(path, &file) != PSHARD_OK || model_load(file, &model) != PSHARD_OK) {
        fprintf(stderr, "cannot make the tiny model with gguf-synth (%s)\n", cmd);
        return 2;
    }
    struct run cpu = {0}, gpu = {0};
    const bool ran = run_plan(&model, false, &cpu) && run_plan(&model, true, &gpu);
    check(ran && cpu.n_out == gpu.n_out && cpu.n_out == 10, "both plans ran the scenario");
    const int32_t V = (int32_t)model.hp.n_vocab;
    int agree = 0;
    for (int i = 0; ran && i < cpu.n_out && i < gpu.n_out; i++) {
        double mean = 0, var = 0, worst = 0;
        int best_c = 0, best_g = 0;
        for (int32_t j = 0; j < V; j++) mean += cpu.out[i][j] / V;
        for (int32_t j = 0; j < V; j++) {
            var += (cpu.out[i][j] - mean) * (cpu.out[i][j] - mean) / V;
            const double d = fabs((double)gpu.out[i][j] - cpu.out[i][j]);
            worst = d > worst || d != d ? d : worst;
            best_c = cpu.out[i][j] > cpu.out[i][best_c] ? j : best_c;
            best_g = gpu.out[i][j] > gpu.out[i][best_g] ? j : best_g;
        }
        agree += best_c == best_g;
        char what[160];
        snprintf(what, sizeof what, "output %2d: GPU logits within %.3f of the CPU's spread (max %.3g), top-1 %s", i,
                 worst / sqrt(var), 0.1, best_c == best_g ? "same" : "differs");
        check(worst / sqrt(var) < 0.1, what);
    }
    check(ran && agree >= cpu.n_out - 1, "top-1 agrees at all outputs but at most one");
    check(ran && cpu.unchanged, "CPU: a sequence's logits unchanged while the one sharing its prefix wrote");
    check(ran && gpu.unchanged, "GPU: a sequence's logits unchanged while the one sharing its prefix wrote");
    for (int i = 0; i < MAX_OUT; i++) free(cpu.out[i]), free(gpu.out[i]);
    model_free(&model);
    gguf_close(file);
    if (!given) unlink(path);
    printf("exec_kv_pool: %d cases, %d failed: %s\n", cases, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
