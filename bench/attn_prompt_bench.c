/* Wall time of the CPU's attention for one step over one layer's cache, as the executor runs it
 * on a thread pool: every token's unit alone over all its cells (each token reads the cache,
 * and the heads of a KV head split among threads each read it too), against the units the
 * executor makes: tiles of a prompt's tokens (a tile reads the cache once), or for one token
 * runs of its cells, merged after. For llama8b's, qwen30b's and the default model's shapes. The step's tokens are the last of the context: token t of n attends
 * cells - n + t + 1 cells. Tiles give the same outputs bit for bit
 * (test_attention_tiles_equal_tokens_alone), runs within rounding; this checks it again.
 *
 * Build (no CMake target needed):
 *   cc -O2 -Isrc -Iinclude bench/attn_prompt_bench.c build/libpshard.a -lm -lpthread -o build/attn_prompt_bench
 * Run: build/attn_prompt_bench [tokens=256] [cells=16384] [threads=all] */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"
#include "cpu/attention.h"
#include "quant/half.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -1 .. 1 in steps of 1/128 */
static float next_value(uint32_t *seed) {
    *seed = *seed * 1664525u + 1013904223u;
    return (float)(*seed >> 24) / 128 - 1;
}

struct job {
    const struct cpu_attn_shape *shape;
    struct cpu_attn_units units;
    const float *q;
    struct cpu_kv_view kv;
    const int64_t *n_cells;
    float *out, *partial;
    _Atomic int64_t next;
};

/* The executor's worker: units claimed one at a time from the last (the longest) down. */
static void worker(void *p, int thread, int n_threads) {
    struct job *j = p;
    (void)thread, (void)n_threads;
    for (int64_t c = atomic_fetch_add(&j->next, 1); c < j->units.count; c = atomic_fetch_add(&j->next, 1)) {
        int64_t t0, t1;
        int h0, h1, split;
        cpu_attention_unit(j->shape, &j->units, j->units.count - 1 - c, &t0, &t1, &h0, &h1, &split);
        cpu_attention_run_unit(j->shape, &j->units, t0, t1, h0, h1, split, j->q, &j->kv, j->n_cells + t0, j->partial,
                               j->out);
    }
}

int main(int argc, char **argv) {
    const int n_tokens = argc > 1 ? atoi(argv[1]) : 256;
    const int64_t cells = argc > 2 ? atoll(argv[2]) : 16384;
    struct threadpool *pool;
    if (n_tokens < 1 || cells < n_tokens ||
        threadpool_create(argc > 3 ? atoi(argv[3]) : threadpool_cpu_count(), &pool) != PSHARD_OK) {
        fprintf(stderr, "usage: attn_prompt_bench [tokens >= 1] [cells >= tokens] [threads]\n");
        return 2;
    }
    const struct {
        const char *name;
        struct cpu_attn_shape shape;
    } shapes[] = {{"llama8b", {32, 8, 128, 128, 0.088f}}, {"qwen30b", {32, 4, 128, 128, 0.088f}},
                  {"smollm2", {9, 3, 64, 64, 0.125f}}};
    int64_t *n_cells = malloc(sizeof(int64_t) * (size_t)n_tokens);
    for (int t = 0; t < n_tokens; t++) n_cells[t] = cells - n_tokens + t + 1;
    printf("%d tokens ending at %lld cells, %d threads; seconds per step and layer, best of 15\n", n_tokens,
           (long long)cells, threadpool_size(pool));
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct cpu_attn_shape *s = &shapes[si].shape;
        const int64_t kv = cells * s->n_head_kv * s->head_k, qn = (int64_t)n_tokens * s->n_head * s->head_k;
        uint16_t *k = malloc(sizeof(uint16_t) * (size_t)kv), *v = malloc(sizeof(uint16_t) * (size_t)kv);
        float *q = malloc(sizeof(float) * (size_t)qn), *out[2];
        uint32_t seed = 7;
        for (int64_t i = 0; i < kv; i++) k[i] = half_from_f32(2 * next_value(&seed)), v[i] = half_from_f32(next_value(&seed));
        for (int64_t i = 0; i < qn; i++) q[i] = next_value(&seed);
        double best[2] = {1e30, 1e30};
        float *partial = malloc(sizeof(float) * (size_t)cpu_attention_partial_floats_max(s));
        int splits = 1;
        for (int way = 0; way < 2; way++) {
            out[way] = calloc((size_t)qn, sizeof(float));
            struct job j = {s, {0}, q, cpu_kv_contiguous(k, v), n_cells, out[way], partial, 0};
            /* way 0: no tiles, no runs (a cache of 0 cells makes none) */
            cpu_attention_units(s, n_tokens, way == 1 ? cells : 0, way == 1, threadpool_size(pool), &j.units);
            if (way == 1) splits = j.units.splits;
            for (int rep = 0; rep < 15; rep++) {
                atomic_store(&j.next, 0);
                const double t0 = now_s();
                threadpool_run(pool, worker, &j);
                if (j.units.splits > 1) cpu_attention_merge(s, &j.units, partial, out[way]);
                const double dt = now_s() - t0;
                best[way] = dt < best[way] ? dt : best[way];
            }
        }
        bool same = true;
        for (int64_t i = 0; i < (int64_t)n_tokens * s->n_head * s->head_v; i++)
            same &= splits > 1 ? fabsf(out[0][i] - out[1][i]) <= 1e-5f + 1e-4f * fabsf(out[0][i]) : out[0][i] == out[1][i];
        printf("%-8s tokens alone %.4f s, %s %.4f s (%.2fx)%s\n", shapes[si].name, best[0],
               splits > 1 ? "in runs of cells" : "in tiles", best[1], best[0] / best[1], same ? "" : "  OUTPUTS DIFFER");
        free(k), free(v), free(q), free(out[0]), free(out[1]), free(partial);
        if (!same) return 1;
    }
    free(n_cells);
    threadpool_free(pool);
    return 0;
}
