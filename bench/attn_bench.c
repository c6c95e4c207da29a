/* The CPU's attention for one token over one layer's cache, for llama8b's and qwen30b's shapes.
 * Each rep reads another copy of the cache, so it comes from memory, as a decode step's layers
 * read theirs.
 *   threads = 1: single-thread CPU time, each query head alone (as the executor ran it before
 *                heads that share a KV head went together) against the heads of each KV head
 *                in one call;
 *   threads > 1: wall time of the step as the executor runs it (its units over a thread pool,
 *                runs of a long cache merged), and the KV bytes read per second.
 * `kernels`: the tile's inner loops in L1, one thread, for a decode token of qwen30b (the 8 query
 * heads of a KV head, 128 wide): ns a cell for each part, in each version this CPU runs.
 *
 * Build (no CMake target needed):
 *   cc -O2 -Isrc -Iinclude bench/attn_bench.c -Lbuild -lpshard -Wl,-rpath,$PWD/build -lm -o build/attn_bench
 * Run: build/attn_bench [cells=4096] [copies=16] [threads=1]   or   build/attn_bench kernels */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"
#include "cpu/attention.h"
#include "cpu/attention_kernels.h"
#include "quant/half.h"
#include "quant/quant.h"

/* CPU time of this thread: on a shared machine, time spent descheduled must not count. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -1 .. 1 in steps of 1/128 */
static float next_value(uint32_t *seed) {
    *seed = *seed * 1664525u + 1013904223u;
    return (float)(*seed >> 24) / 128 - 1;
}

struct step {
    const struct cpu_attn_shape *s;
    struct cpu_attn_units u;
    const float *q;
    struct cpu_kv_view kv;
    int64_t cells;
    float *partial, *out;
};

static void step_job(void *arg, int thread, int n_threads) {
    struct step *st = arg;
    int64_t begin, end;
    threadpool_range(st->u.count, 1, thread, n_threads, &begin, &end);
    for (int64_t i = begin; i < end; i++) {
        int64_t t0, t1;
        int h0, h1, split;
        cpu_attention_unit(st->s, &st->u, i, &t0, &t1, &h0, &h1, &split);
        cpu_attention_run_unit(st->s, &st->u, t0, t1, h0, h1, split, st->q, &st->kv, &st->cells, st->partial, st->out);
    }
}

/* ns a cell of a decode token's tile parts: 8 rows (query heads), runs of 16 keys, 128 wide */
static int kernels(void) {
    enum { ROWS = 8, KEYS = 64, RUN = 16, W = 128, PITCH = 256, REPS = 100000 };
    static float q[ROWS * PITCH], acc[ROWS * PITCH], block[RUN * W], scores[ROWS * KEYS];
    static uint16_t cells[RUN * 4 * W]; /* a run of cells, four KV heads' rows each */
    uint32_t seed = 3;
    for (int i = 0; i < RUN * 4 * W; i++) cells[i] = half_from_f32(next_value(&seed));
    for (int i = 0; i < ROWS * PITCH; i++) q[i] = next_value(&seed) / 8;
    void (*widen)(const void *, float *, int64_t) = quant_kernels_get(QUANT_F16)->dequant_row;
    double t = now_s();
    for (int rep = 0; rep < REPS; rep++) {
        for (int j = 0; j < RUN; j++) widen(cells + j * 4 * W, block + j * W, W);
        __asm__ volatile("" ::"r"(block) : "memory");
    }
    printf("widen a K or V row to f32: %.1f ns\n", (now_s() - t) / REPS / RUN * 1e9);
    const struct {
        const char *name;
        bool can;
        void (*score)(const float *, int64_t, int, const float *, int64_t, int, int, float, float *, int64_t);
        void (*accumulate)(float *, int64_t, const float *, int64_t, int, const float *, int64_t, int, int);
    } sets[] = {{"AVX2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), attn_scores_tile_avx2,
                 attn_accumulate_tile_avx2},
                {"AVX-512 (the outputs; the scores AVX2's)",
                 __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                     __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"),
                 attn_scores_tile_avx2, attn_accumulate_tile_avx512}};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        if (!sets[si].can) continue;
        t = now_s();
        for (int rep = 0; rep < REPS; rep++) {
            sets[si].score(q, PITCH, ROWS, block, W, RUN, W, 0.088f, scores, KEYS);
            __asm__ volatile("" ::"r"(scores) : "memory");
        }
        const double ts = (now_s() - t) / REPS / RUN;
        for (int i = 0; i < ROWS * KEYS; i++) scores[i] = (float)(i % 5) * -0.1f;
        t = now_s();
        for (int rep = 0; rep < REPS / 4; rep++) {
            for (int r = 0; r < ROWS; r++) attn_exp_sum_avx2(scores + r * KEYS, KEYS, attn_max_avx2(scores + r * KEYS, KEYS));
            __asm__ volatile("" ::"r"(scores) : "memory");
        }
        const double te = (now_s() - t) / (REPS / 4) / KEYS;
        t = now_s();
        for (int rep = 0; rep < REPS; rep++) {
            sets[si].accumulate(acc, PITCH, scores, KEYS, ROWS, block, W, RUN, W);
            __asm__ volatile("" ::"r"(acc) : "memory");
        }
        const double ta = (now_s() - t) / REPS / RUN;
        printf("%s: scores %.1f ns, max and weights %.1f ns, outputs %.1f ns a cell (8 rows)\n", sets[si].name, ts * 1e9,
               te * 1e9, ta * 1e9);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "kernels")) return kernels();
    const int64_t cells = argc > 1 ? atoll(argv[1]) : 4096;
    const int copies = argc > 2 ? atoi(argv[2]) : 16;
    const int threads = argc > 3 ? atoi(argv[3]) : 1;
    struct threadpool *pool = NULL;
    if (threads > 1 && threadpool_create(threads, &pool) != PSHARD_OK) return fprintf(stderr, "no thread pool\n"), 1;
    const struct {
        const char *name;
        struct cpu_attn_shape s;
    } shapes[] = {{"llama8b", {32, 8, 128, 128, 0.088f}}, {"qwen30b", {32, 4, 128, 128, 0.088f}}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct cpu_attn_shape *s = &shapes[si].s;
        const size_t k_elems = (size_t)cells * s->n_head_kv * s->head_k;
        const size_t v_elems = (size_t)cells * s->n_head_kv * s->head_v;
        uint16_t *k = malloc(sizeof *k * k_elems * copies), *v = malloc(sizeof *v * v_elems * copies);
        float *q = malloc(sizeof *q * s->n_head * s->head_k), *out = malloc(sizeof *out * s->n_head * s->head_v);
        float *partial = malloc(sizeof(float) * (size_t)cpu_attention_partial_floats_max(s));
        if (!k || !v || !q || !out || !partial) return fprintf(stderr, "out of memory\n"), 1;
        uint32_t seed = 1;
        for (size_t i = 0; i < k_elems * copies; i++) k[i] = half_from_f32(next_value(&seed));
        for (size_t i = 0; i < v_elems * copies; i++) v[i] = half_from_f32(next_value(&seed));
        for (int i = 0; i < s->n_head * s->head_k; i++) q[i] = (float)(i % 17) / 8 - 1;
        if (pool) {
            struct step st = {.s = s, .q = q, .cells = cells, .partial = partial, .out = out};
            cpu_attention_units(s, 1, cells, false, threads, &st.u);
            double best = 1e9;
            for (int rep = 0; rep < 5; rep++) {
                const double t0 = wall_s();
                for (int c = 0; c < copies; c++) {
                    st.kv = cpu_kv_contiguous(k + k_elems * c, v + v_elems * c);
                    threadpool_run(pool, step_job, &st);
                    if (st.u.splits > 1) cpu_attention_merge(s, &st.u, partial, out);
                }
                const double t = (wall_s() - t0) / copies;
                best = t < best ? t : best;
            }
            printf("%s (%d query heads, %d KV heads), %lld cells, %d threads (%lld units): %.3f ms, %.1f GB/s of KV\n",
                   shapes[si].name, s->n_head, s->n_head_kv, (long long)cells, threads, (long long)st.u.count, best * 1e3,
                   (double)(k_elems + v_elems) * 2 / best / 1e9);
        } else {
            double best[2] = {1e9, 1e9};
            for (int rep = 0; rep < 5; rep++)
                for (int together = 0; together < 2; together++) {
                    const double t0 = now_s();
                    for (int c = 0; c < copies; c++) {
                        const struct cpu_kv_view kv = cpu_kv_contiguous(k + k_elems * c, v + v_elems * c);
                        if (together)
                            cpu_attention_heads(s, q, &kv, cells, 0, s->n_head, out);
                        else
                            for (int h = 0; h < s->n_head; h++) cpu_attention_heads(s, q, &kv, cells, h, h + 1, out);
                    }
                    const double t = (now_s() - t0) / copies;
                    best[together] = t < best[together] ? t : best[together];
                }
            printf("%s (%d query heads, %d KV heads), %lld cells: head by head %.2f ms, "
                   "heads of a KV head together %.2f ms\n",
                   shapes[si].name, s->n_head, s->n_head_kv, (long long)cells, best[0] * 1e3, best[1] * 1e3);
        }
        free(k), free(v), free(q), free(out), free(partial);
    }
    if (pool) threadpool_free(pool);
    return 0;
}
