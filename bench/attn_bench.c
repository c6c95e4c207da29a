/* The CPU's attention for one token over one layer's cache, for llama8b's and qwen30b's shapes.
 * Each rep reads another copy of the cache, so it comes from memory, as a decode step's layers
 * read theirs.
 *   threads = 1: single-thread CPU time, each query head alone (as the executor ran it before
 *                heads that share a KV head went together) against the heads of each KV head
 *                in one call;
 *   threads > 1: wall time of the step as the executor runs it (its units over a thread pool,
 *                runs of a long cache merged), and the KV bytes read per second.
 *
 * Build (no CMake target needed):
 *   cc -O2 -Isrc -Iinclude bench/attn_bench.c -Lbuild -lpshard -Wl,-rpath,$PWD/build -lm -o build/attn_bench
 * Run: build/attn_bench [cells=4096] [copies=16] [threads=1] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/threadpool.h"
#include "cpu/attention.h"
#include "quant/half.h"

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

int main(int argc, char **argv) {
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
