/* CPU operators against direct formulas: thread pool ranges, RoPE, online-softmax attention,
 * top-k, router, matmul against dequantize-then-dot. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/threadpool.h"
#include "cpu/attention.h"
#include "cpu/attention_kernels.h"
#include "cpu/cpu_ops.h"
#include "cpu/moe.h"
#include "cpu/rope.h"
#include "quant/half.h"

static float frand(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

struct count_job {
    int64_t n;
    int64_t *hits;
};

static void count_worker(void *p, int thread, int n_threads) {
    struct count_job *job = p;
    int64_t b, e;
    threadpool_range(job->n, 7, thread, n_threads, &b, &e);
    for (int64_t i = b; i < e; i++) __atomic_fetch_add(&job->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_threadpool_covers_every_index_once(void **state) {
    (void)state;
    for (int threads = 1; threads <= 5; threads++) {
        struct threadpool *pool;
        assert_int_equal(threadpool_create(threads, &pool), PSHARD_OK);
        assert_int_equal(threadpool_size(pool), threads);
        for (int64_t n = 0; n < 100; n += 13) {
            int64_t hits[100] = {0};
            struct count_job job = {n, hits};
            for (int rep = 0; rep < 50; rep++) threadpool_run(pool, count_worker, &job);
            for (int64_t i = 0; i < 100; i++) assert_int_equal(hits[i], i < n ? 50 : 0);
        }
        threadpool_free(pool);
    }
}

/* Threads stopped by a signal whose handler holds them until released (a thread the OS does
 * not schedule, as when another process takes the cores). */
static volatile sig_atomic_t held_count, hold;

static void hold_here(int sig) {
    (void)sig;
    __atomic_fetch_add(&held_count, 1, __ATOMIC_SEQ_CST);
    const struct timespec pause = {0, 100000};
    while (__atomic_load_n(&hold, __ATOMIC_SEQ_CST)) nanosleep(&pause, NULL); /* async-signal-safe */
}

/* This process's thread ids (at most `max`). */
static int thread_ids(pid_t *tids, int max) {
    DIR *dir = opendir("/proc/self/task");
    int n = 0;
    if (!dir) return 0;
    for (struct dirent *e; (e = readdir(dir)) && n < max;)
        if (e->d_name[0] != '.') tids[n++] = (pid_t)atoi(e->d_name);
    closedir(dir);
    return n;
}

/* A job is done once its parts are, whoever runs them: with every worker stopped between jobs,
 * the caller runs them all (a pool that waited for each worker to come by would hang here). */
static void test_threadpool_runs_without_its_workers(void **state) {
    (void)state;
    pid_t before[64], after[64], workers[64];
    const int n_before = thread_ids(before, 64);
    struct threadpool *pool;
    assert_int_equal(threadpool_create(4, &pool), PSHARD_OK);
    int64_t hits[100] = {0};
    struct count_job job = {100, hits};
    threadpool_run(pool, count_worker, &job); /* the workers are up and idle */
    const int n_after = thread_ids(after, 64);
    int n_workers = 0;
    for (int i = 0; i < n_after; i++) {
        int old = 0;
        for (int j = 0; j < n_before; j++) old |= after[i] == before[j];
        if (!old) workers[n_workers++] = after[i];
    }
    assert_int_equal(n_workers, 3);
    struct sigaction sa, was;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = hold_here;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, &was), 0);
    hold = 1, held_count = 0;
    for (int i = 0; i < n_workers; i++) assert_int_equal(syscall(SYS_tgkill, getpid(), workers[i], SIGUSR1), 0);
    while (__atomic_load_n(&held_count, __ATOMIC_SEQ_CST) < n_workers) usleep(100);
    for (int rep = 0; rep < 20; rep++) threadpool_run(pool, count_worker, &job);
    for (int64_t i = 0; i < 100; i++) assert_int_equal(hits[i], 21);
    hold = 0; /* the workers go on: later jobs may use them again */
    for (int rep = 0; rep < 20; rep++) threadpool_run(pool, count_worker, &job);
    for (int64_t i = 0; i < 100; i++) assert_int_equal(hits[i], 41);
    threadpool_free(pool);
    sigaction(SIGUSR1, &was, NULL);
}

static void test_rope_matches_formula(void **state) {
    (void)state;
    for (int neox = 0; neox < 2; neox++) {
        struct rope_params p = {.n_dims = 16, .neox = neox, .freq_base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f};
        float cs[16], x[2 * 24], ref[2 * 24];
        uint32_t seed = 7;
        for (int i = 0; i < 48; i++) x[i] = ref[i] = frand(&seed);
        const int pos = 37;
        cpu_rope_table(&p, pos, cs);
        cpu_rope_apply(&p, cs, x, 2, 24);
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 8; i++) {
                double theta = pos * pow(10000.0, -2.0 * i / 16);
                int a = neox ? i : 2 * i, b = neox ? i + 8 : 2 * i + 1;
                double x0 = ref[h * 24 + a], x1 = ref[h * 24 + b];
                assert_float_equal(x[h * 24 + a], x0 * cos(theta) - x1 * sin(theta), 1e-4);
                assert_float_equal(x[h * 24 + b], x0 * sin(theta) + x1 * cos(theta), 1e-4);
            }
        for (int h = 0; h < 2; h++) /* dimensions past n_dims pass through */
            for (int i = 16; i < 24; i++) assert_true(x[h * 24 + i] == ref[h * 24 + i]);
    }
}

/* M-RoPE: pair i turns by the time, row or column position as the sections say (Qwen2.5-VL-7B's
 * 16/24/24 over 64 pairs, counted cyclically); three equal positions are plain rope, bit for bit. */
static void test_mrope_sections(void **state) {
    (void)state;
    struct rope_params p = {.n_dims = 128, .neox = true, .freq_base = 1e6f, .freq_scale = 1.0f, .attn_factor = 1.0f,
                            .sections = {16, 24, 24}};
    assert_true(rope_is_multi(&p));
    assert_int_equal(cpu_rope_axis(&p, 0), 0);
    assert_int_equal(cpu_rope_axis(&p, 15), 0);
    assert_int_equal(cpu_rope_axis(&p, 16), 1);
    assert_int_equal(cpu_rope_axis(&p, 39), 1);
    assert_int_equal(cpu_rope_axis(&p, 40), 2);
    assert_int_equal(cpu_rope_axis(&p, 63), 2);
    struct rope_params cyclic = {.sections = {2, 2, 2}};
    assert_int_equal(cpu_rope_axis(&cyclic, 7), 0);
    float multi[128], plain[128];
    for (int32_t pos = 0; pos < 5000; pos += 997) {
        const int32_t same[3] = {pos, pos, pos};
        cpu_rope_table_multi(&p, same, multi);
        cpu_rope_table(&p, pos, plain);
        assert_memory_equal(multi, plain, sizeof plain);
    }
    const int32_t pos[3] = {7, 300, 41};
    cpu_rope_table_multi(&p, pos, multi);
    for (int i = 0; i < 64; i++) {
        const double theta = pos[cpu_rope_axis(&p, i)] * pow(1e6, -2.0 * i / 128);
        assert_float_equal(multi[2 * i], cos(theta), 2e-4);
        assert_float_equal(multi[2 * i + 1], sin(theta), 2e-4);
    }
}

/* The AVX2 weights of an attention block: e^(s - max) within 1 ulp of expf down to -87.29 (0
 * below -87.3, where floats end; NaN stays NaN), their sum the sum of what it stored, at every
 * tail length. Where the CPU has no AVX2 the kernel cannot run: nothing to check. */
static void test_attention_exp_sum(void **state) {
    (void)state;
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) return;
    int64_t worst = 0;
    for (double x = -87.29; x <= 0.0; x += 3.3e-4) {
        float s[8];
        for (int i = 0; i < 8; i++) s[i] = (float)x + 0.5f; /* max 0.5: s - max = x */
        attn_exp_sum_avx2(s, 8, 0.5f);
        const float want = expf((float)x + 0.5f - 0.5f);
        int32_t a, b;
        memcpy(&a, &s[3], 4), memcpy(&b, &want, 4);
        const int64_t ulps = a > b ? (int64_t)a - b : (int64_t)b - a;
        worst = ulps > worst ? ulps : worst;
    }
    assert_true(worst <= 1);
    float edge[8] = {NAN, -INFINITY, -100.0f, -87.5f, 0.0f, -1.0f, -2.0f, -3.0f};
    attn_exp_sum_avx2(edge, 8, 0.0f);
    assert_true(isnan(edge[0]));
    assert_true(edge[1] == 0.0f && edge[2] == 0.0f && edge[3] == 0.0f && edge[4] == 1.0f);
    for (int n = 1; n <= 19; n++) { /* tails: the lanes past n neither stored nor summed */
        float s[24], guard = 1234.5f;
        for (int i = 0; i < 24; i++) s[i] = i < n ? -0.25f * (float)i : guard;
        const float sum = attn_exp_sum_avx2(s, n, 0.0f);
        double stored = 0;
        for (int i = 0; i < n; i++) {
            assert_float_equal(s[i], expf(-0.25f * (float)i), 2e-7);
            stored += s[i];
        }
        for (int i = n; i < 24; i++) assert_true(s[i] == guard);
        assert_float_equal(sum, stored, 1e-5);
    }
}

/* The SIMD tile kernels this CPU can run (AVX2 scores and outputs, AVX-512 outputs), called
 * directly: every score is the (row, key) dot of its inputs times the scale within rounding, and
 * the same bit for bit as that (row, key) alone (a call of one row and one key); every output is
 * its FMAs over the keys in order, so the AVX-512 outputs are the AVX2 ones bit for bit. Rows 1-9
 * and keys 1-19 cover every remainder of the kernels' 2, 3 and 4 rows and 4 keys; widths cover
 * whole vectors and tails. */
static void test_attention_tile_kernels(void **state) {
    (void)state;
    typedef void (*score_fn)(const float *, int64_t, int, const float *, int64_t, int, int, float, float *, int64_t);
    typedef void (*acc_fn)(float *, int64_t, const float *, int64_t, int, const float *, int64_t, int, int);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
    const struct {
        bool can;
        score_fn score;
        acc_fn accumulate;
    } sets[] = {{avx2, attn_scores_tile_avx2, attn_accumulate_tile_avx2}, {avx512, NULL, attn_accumulate_tile_avx512}};
    enum { ROWS = 9, KEYS = 19, W = 136, ST = 160 }; /* strides past the widths, as a tile's are */
    static float q[ROWS * ST], k[KEYS * ST], v[KEYS * ST], p[ROWS * KEYS], out[ROWS * KEYS], one[1];
    static float acc0[ROWS * ST], acc[ROWS * ST], acc2[ROWS * ST];
    uint32_t seed = 41;
    for (int i = 0; i < ROWS * ST; i++) q[i] = frand(&seed);
    for (int i = 0; i < KEYS * ST; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    for (int i = 0; i < ROWS * KEYS; i++) p[i] = 0.5f + 0.5f * frand(&seed);
    for (int i = 0; i < ROWS * ST; i++) acc0[i] = frand(&seed);
    const int widths[] = {W, 128, 40, 24, 17, 3};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        if (!sets[si].can) continue;
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            const int n = widths[wi];
            for (int rows = 1; rows <= ROWS; rows++)
                for (int keys = 1; keys <= KEYS; keys += (keys < 6 ? 1 : 7)) {
                    if (sets[si].score) {
                        memset(out, 0, sizeof out);
                        sets[si].score(q, ST, rows, k, ST, keys, n, 0.3f, out, KEYS);
                        for (int r = 0; r < ROWS; r++)
                            for (int j = 0; j < KEYS; j++) {
                                if (r >= rows || j >= keys) { /* nothing past the tile written */
                                    assert_true(out[r * KEYS + j] == 0.0f);
                                    continue;
                                }
                                sets[si].score(q + r * ST, ST, 1, k + j * ST, ST, 1, n, 0.3f, one, 1);
                                assert_memory_equal(&out[r * KEYS + j], one, sizeof one);
                                double d = 0;
                                for (int i = 0; i < n; i++) d += (double)q[r * ST + i] * k[j * ST + i];
                                assert_float_equal(one[0], 0.3 * d, 1e-5 * (1 + n));
                            }
                    }
                    memcpy(acc, acc0, sizeof acc);
                    sets[si].accumulate(acc, ST, p, KEYS, rows, v, ST, keys, n);
                    for (int r = 0; r < ROWS; r++)
                        for (int i = 0; i < ST; i++) {
                            if (r >= rows || i >= n) { /* nothing past the tile written */
                                assert_true(acc[r * ST + i] == acc0[r * ST + i]);
                                continue;
                            }
                            float want = acc0[r * ST + i]; /* an output's FMAs over the keys in order */
                            for (int j = 0; j < keys; j++) want = fmaf(p[r * KEYS + j], v[j * ST + i], want);
                            assert_true(acc[r * ST + i] == want);
                        }
                    if (si > 0 && sets[0].can) { /* AVX-512's outputs: AVX2's */
                        memcpy(acc2, acc0, sizeof acc2);
                        sets[0].accumulate(acc2, ST, p, KEYS, rows, v, ST, keys, n);
                        assert_memory_equal(acc, acc2, sizeof acc);
                    }
                }
        }
    }
}

static void test_attention_matches_naive_softmax(void **state) {
    (void)state;
    const struct cpu_attn_shape s = {4, 2, 32, 16, 1.0f / sqrtf(32.0f)};
    const int64_t n_cells = 150; /* crosses several key blocks */
    uint16_t *k = malloc(sizeof(uint16_t) * n_cells * 2 * 32), *v = malloc(sizeof(uint16_t) * n_cells * 2 * 16);
    const struct cpu_kv_view kv = cpu_kv_contiguous(k, v);
    float q[4 * 32], out[4 * 16];
    uint32_t seed = 11;
    for (int64_t i = 0; i < n_cells * 64; i++) k[i] = half_from_f32(3 * frand(&seed));
    for (int64_t i = 0; i < n_cells * 32; i++) v[i] = half_from_f32(frand(&seed));
    for (int i = 0; i < 128; i++) q[i] = frand(&seed);
    cpu_attention_heads(&s, q, &kv, n_cells, 0, 4, out);
    for (int h = 0; h < 4; h++) {
        const int kvh = h / 2;
        double scores[150], max = -1e30, sum = 0;
        for (int64_t c = 0; c < n_cells; c++) {
            double d = 0;
            for (int i = 0; i < 32; i++)
                d += half_to_f32(half_from_f32(q[h * 32 + i])) * half_to_f32(k[c * 64 + kvh * 32 + i]);
            scores[c] = d * s.scale;
            max = scores[c] > max ? scores[c] : max;
        }
        for (int64_t c = 0; c < n_cells; c++) sum += scores[c] = exp(scores[c] - max);
        for (int i = 0; i < 16; i++) {
            double o = 0;
            for (int64_t c = 0; c < n_cells; c++) o += scores[c] / sum * half_to_f32(v[c * 32 + kvh * 16 + i]);
            assert_float_equal(out[h * 16 + i], o, 1e-5);
        }
    }
    free(k);
    free(v);
}

/* A unit's heads: a run of at most 8 that share a KV head, or the whole groups of several KV
 * heads. */
static bool unit_heads(const struct cpu_attn_shape *s, int h0, int h1) {
    const int group = s->n_head / s->n_head_kv;
    if (!(0 <= h0 && h0 < h1 && h1 <= s->n_head)) return false;
    return (h0 / group == (h1 - 1) / group && h1 - h0 <= 8) || (h0 % group == 0 && h1 % group == 0);
}

/* Heads that share a KV head read the cache together: every head's output is the same bit for
 * bit whatever range it came in (a group of 12 takes two chunks; ranges cross groups), and the
 * units a step is cut into cover every (token, head) once, within one KV head each. */
static void test_attention_heads_together_equal_alone(void **state) {
    (void)state;
    /* (qwen30b's and llama8b's shapes: a token's tile takes 4 and 8 KV heads, runs of 16 and 8 keys) */
    const struct cpu_attn_shape shapes[] = {{24, 2, 32, 16, 0.17f}, {8, 8, 16, 16, 0.25f}, {16, 2, 64, 32, 0.125f},
                                            {32, 4, 128, 128, 0.088f}, {32, 8, 128, 128, 0.088f}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct cpu_attn_shape s = shapes[si];
        const int64_t n_cells = 200;
        uint16_t *k = malloc(sizeof(uint16_t) * n_cells * s.n_head_kv * s.head_k);
        uint16_t *v = malloc(sizeof(uint16_t) * n_cells * s.n_head_kv * s.head_v);
        const struct cpu_kv_view kv = cpu_kv_contiguous(k, v);
        float *q = malloc(sizeof(float) * s.n_head * s.head_k);
        float *alone = malloc(sizeof(float) * s.n_head * s.head_v);
        float *together = malloc(sizeof(float) * s.n_head * s.head_v);
        uint32_t seed = 5 + (uint32_t)si;
        for (int64_t i = 0; i < n_cells * s.n_head_kv * s.head_k; i++) k[i] = half_from_f32(3 * frand(&seed));
        for (int64_t i = 0; i < n_cells * s.n_head_kv * s.head_v; i++) v[i] = half_from_f32(frand(&seed));
        for (int i = 0; i < s.n_head * s.head_k; i++) q[i] = frand(&seed);
        for (int h = 0; h < s.n_head; h++) cpu_attention_heads(&s, q, &kv, n_cells, h, h + 1, alone);
        const int ranges[][2] = {{0, s.n_head}, {1, s.n_head - 1}, {3, 5}, {s.n_head / 2 - 1, s.n_head / 2 + 2}};
        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
            memset(together, 0, sizeof(float) * s.n_head * s.head_v);
            cpu_attention_heads(&s, q, &kv, n_cells, ranges[r][0], ranges[r][1], together);
            for (int h = ranges[r][0]; h < ranges[r][1]; h++)
                assert_memory_equal(together + h * s.head_v, alone + h * s.head_v, sizeof(float) * s.head_v);
        }
        for (int64_t n_tokens = 1; n_tokens <= 3; n_tokens++)
            for (int n_threads = 1; n_threads <= 32; n_threads *= 4) {
                struct cpu_attn_units u;
                cpu_attention_units(&s, n_tokens, n_cells, false, n_threads, &u);
                int *seen = calloc((size_t)(n_tokens * s.n_head), sizeof(int));
                for (int64_t i = 0; i < u.count; i++) {
                    int64_t t0, t1;
                    int h0, h1, split;
                    cpu_attention_unit(&s, &u, i, &t0, &t1, &h0, &h1, &split);
                    assert_int_equal(split, 0);
                    assert_true(t0 >= 0 && t1 == t0 + 1 && t1 <= n_tokens && unit_heads(&s, h0, h1));
                    for (int h = h0; h < h1; h++) seen[t0 * s.n_head + h]++;
                }
                for (int64_t i = 0; i < n_tokens * s.n_head; i++) assert_int_equal(seen[i], 1);
                if (n_tokens * s.n_head >= n_threads) assert_true(u.count >= n_threads || u.per == 1);
                if (n_threads == 1) assert_int_equal(u.count, n_tokens); /* a token's unit takes every head */
                free(seen);
            }
        free(k), free(v), free(q), free(alone), free(together);
    }
}

/* A prompt's tokens of one sequence attend a tile at a time (cpu_attention_tokens): every token's
 * output is the one it gets alone, bit for bit (ctest runs this program with the SIMD kernels and
 * again without, test_cpu_ops_portable), for tokens
 * whose cells end in different key blocks (a causal prompt over a cache already holding some),
 * for groups of 2, 4 and 8 query heads per KV head and head ranges that cut groups; and the units
 * of a step of one sequence cover every (token, head) once, in tiles of consecutive tokens,
 * enough of them for the threads. */
static void test_attention_tiles_equal_tokens_alone(void **state) {
    (void)state;
    const struct cpu_attn_shape shapes[] = {{8, 4, 32, 32, 0.18f}, {16, 4, 64, 64, 0.125f}, {32, 4, 24, 40, 0.2f},
                                            {6, 3, 16, 16, 0.25f}};
    {
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const struct cpu_attn_shape s = shapes[si];
            const int n_tokens = 70, past = 37; /* cells 38..107: within, across and at block ends */
            const int64_t cells = past + n_tokens, q_width = (int64_t)s.n_head * s.head_k, o_width = (int64_t)s.n_head * s.head_v;
            uint16_t *k = malloc(sizeof(uint16_t) * cells * s.n_head_kv * s.head_k);
            uint16_t *v = malloc(sizeof(uint16_t) * cells * s.n_head_kv * s.head_v);
            const struct cpu_kv_view kv = cpu_kv_contiguous(k, v);
            float *q = malloc(sizeof(float) * n_tokens * q_width);
            float *alone = calloc((size_t)(n_tokens * o_width), sizeof(float));
            float *tiled = calloc((size_t)(n_tokens * o_width), sizeof(float));
            int64_t n_cells[70];
            uint32_t seed = 21 + (uint32_t)si;
            for (int64_t i = 0; i < cells * s.n_head_kv * s.head_k; i++) k[i] = half_from_f32(3 * frand(&seed));
            for (int64_t i = 0; i < cells * s.n_head_kv * s.head_v; i++) v[i] = half_from_f32(frand(&seed));
            for (int64_t i = 0; i < n_tokens * q_width; i++) q[i] = frand(&seed);
            for (int t = 0; t < n_tokens; t++) {
                n_cells[t] = past + t + 1;
                cpu_attention_heads(&s, q + t * q_width, &kv, n_cells[t], 0, s.n_head, alone + t * o_width);
            }
            const int ranges[][2] = {{0, s.n_head}, {1, s.n_head - 1}, {s.n_head / 2 - 1, s.n_head / 2 + 1}};
            for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
                const int h0 = ranges[r][0], h1 = ranges[r][1];
                memset(tiled, 0, sizeof(float) * n_tokens * o_width);
                cpu_attention_tokens(&s, q, &kv, n_cells, n_tokens, h0, h1, tiled);
                for (int t = 0; t < n_tokens; t++)
                    assert_memory_equal(tiled + t * o_width + h0 * s.head_v, alone + t * o_width + h0 * s.head_v,
                                        sizeof(float) * (size_t)(h1 - h0) * s.head_v);
            }
            /* The units, run in any order, give the same as each token alone. */
            for (int n_threads = 1; n_threads <= 64; n_threads *= 4) {
                struct cpu_attn_units u;
                cpu_attention_units(&s, n_tokens, cells, true, n_threads, &u);
                int *seen = calloc((size_t)(n_tokens * s.n_head), sizeof(int));
                const int group = s.n_head / s.n_head_kv;
                memset(tiled, 0, sizeof(float) * n_tokens * o_width);
                for (int64_t i = u.count - 1; i >= 0; i--) {
                    int64_t t0, t1;
                    int h0, h1, split;
                    cpu_attention_unit(&s, &u, i, &t0, &t1, &h0, &h1, &split);
                    assert_int_equal(split, 0);
                    assert_true(t0 >= 0 && t0 < t1 && t1 <= n_tokens && t1 - t0 <= CPU_ATTN_TILE_TOKENS);
                    /* (a tile of tokens within one KV head; one token may take several) */
                    assert_true(unit_heads(&s, h0, h1) && (t1 - t0 == 1 || (h1 - h0 <= 8 && h0 / group == (h1 - 1) / group)));
                    for (int64_t t = t0; t < t1; t++)
                        for (int h = h0; h < h1; h++) seen[t * s.n_head + h]++;
                    cpu_attention_tokens(&s, q + t0 * q_width, &kv, n_cells + t0, (int)(t1 - t0), h0, h1, tiled + t0 * o_width);
                }
                for (int64_t i = 0; i < n_tokens * s.n_head; i++) assert_int_equal(seen[i], 1);
                assert_true(u.count >= n_threads || (u.tokens == 1 && u.per == 1));
                if (n_threads == 1) assert_true(u.tokens > 1);
                assert_memory_equal(tiled, alone, sizeof(float) * n_tokens * o_width);
                free(seen);
            }
            free(k), free(v), free(q), free(alone), free(tiled);
        }
    }
}

/* One token's runs over `cells` cells of kv: every unit of u in turn, its partial sums into
 * partial. */
static void split_every_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *q,
                             const struct cpu_kv_view *kv, int64_t cells, float *partial) {
    for (int64_t i = 0; i < u->count; i++) {
        int64_t t0, t1;
        int h0, h1, split;
        cpu_attention_unit(s, u, i, &t0, &t1, &h0, &h1, &split);
        cpu_attention_split(s, u, q, kv, cells, t0, h0, h1, split, partial);
    }
}

/* A cache in blocks of a pool, in any order (the executor's KV pool): every path of the attention
 * (one token's heads, a prompt's tiles, a long cache's runs) gives, bit for bit, what it gives
 * over the same cells laid out in order. */
static void test_attention_paged_equals_contiguous(void **state) {
    (void)state;
    const struct cpu_attn_shape s = {8, 2, 64, 48, 0.125f};
    enum { BLOCK = 64, N_BLOCKS = 24, TOKENS = 40 };
    const int64_t cells = N_BLOCKS * BLOCK - 17, kw = (int64_t)s.n_head_kv * s.head_k, vw = (int64_t)s.n_head_kv * s.head_v;
    const int64_t q_width = (int64_t)s.n_head * s.head_k, o_width = (int64_t)s.n_head * s.head_v;
    const int64_t pool_blocks = N_BLOCKS + 9; /* with blocks no one reads, filled with garbage */
    uint16_t *k = malloc(sizeof(uint16_t) * N_BLOCKS * BLOCK * kw), *v = malloc(sizeof(uint16_t) * N_BLOCKS * BLOCK * vw);
    uint16_t *pk = malloc(sizeof(uint16_t) * pool_blocks * BLOCK * kw), *pv = malloc(sizeof(uint16_t) * pool_blocks * BLOCK * vw);
    float *q = malloc(sizeof(float) * TOKENS * q_width), *want = malloc(sizeof(float) * TOKENS * o_width);
    float *got = malloc(sizeof(float) * TOKENS * o_width);
    float *partial = malloc(sizeof(float) * (size_t)cpu_attention_partial_floats_max(&s));
    float *partial_want = malloc(sizeof(float) * (size_t)cpu_attention_partial_floats_max(&s));
    uint32_t seed = 77;
    for (int64_t i = 0; i < N_BLOCKS * BLOCK * kw; i++) k[i] = half_from_f32(3 * frand(&seed));
    for (int64_t i = 0; i < N_BLOCKS * BLOCK * vw; i++) v[i] = half_from_f32(frand(&seed));
    for (int64_t i = 0; i < pool_blocks * BLOCK * kw; i++) pk[i] = 0x7e00; /* NaN: a wrong row shows */
    for (int64_t i = 0; i < pool_blocks * BLOCK * vw; i++) pv[i] = 0x7e00;
    for (int64_t i = 0; i < TOKENS * q_width; i++) q[i] = frand(&seed);
    int32_t blocks[N_BLOCKS];
    for (int b = 0; b < N_BLOCKS; b++) blocks[b] = (int32_t)((b * 7 + 5) % pool_blocks); /* 7 and 33 coprime: distinct */
    for (int b = 0; b < N_BLOCKS; b++) {
        memcpy(pk + (int64_t)blocks[b] * BLOCK * kw, k + (int64_t)b * BLOCK * kw, sizeof(uint16_t) * BLOCK * kw);
        memcpy(pv + (int64_t)blocks[b] * BLOCK * vw, v + (int64_t)b * BLOCK * vw, sizeof(uint16_t) * BLOCK * vw);
    }
    const struct cpu_kv_view flat = cpu_kv_contiguous(k, v), paged = {pk, pv, blocks, BLOCK};
    /* One token, every cell; and a prompt's tokens ending across block boundaries, in tiles. */
    cpu_attention_heads(&s, q, &flat, cells, 0, s.n_head, want);
    cpu_attention_heads(&s, q, &paged, cells, 0, s.n_head, got);
    assert_memory_equal(got, want, sizeof(float) * o_width);
    int64_t n_cells[TOKENS];
    for (int t = 0; t < TOKENS; t++) n_cells[t] = cells - TOKENS + 1 + t;
    cpu_attention_tokens(&s, q, &flat, n_cells, TOKENS, 0, s.n_head, want);
    cpu_attention_tokens(&s, q, &paged, n_cells, TOKENS, 0, s.n_head, got);
    assert_memory_equal(got, want, sizeof(float) * TOKENS * o_width);
    /* Runs of a long cache, each starting inside the pool wherever its block is. */
    struct cpu_attn_units u;
    cpu_attention_units(&s, 1, cells, false, 4, &u);
    assert_true(u.splits > 1);
    split_every_unit(&s, &u, q, &flat, cells, partial_want);
    split_every_unit(&s, &u, q, &paged, cells, partial);
    assert_memory_equal(partial, partial_want, sizeof(float) * (size_t)cpu_attention_partial_floats(&s, &u));
    free(k), free(v), free(pk), free(pv), free(q), free(want), free(got), free(partial), free(partial_want);
}

/* A step of few tokens over a long cache cuts each token's cells into runs (cpu_attention_units
 * with splits): the units cover every (token, head, run) once, within one KV head each; merged,
 * each token's output is what it gets alone within rounding, whichever order the units ran in; the
 * runs do not depend on the thread count, so neither does the output (bit for bit); a token whose
 * cells end before a run leaves it empty; and a cache longer than CPU_ATTN_MAX_SPLITS runs of
 * CPU_ATTN_SPLIT_CELLS makes longer runs, never more of them. */
static void test_attention_split_equals_whole(void **state) {
    (void)state;
    const struct cpu_attn_shape shapes[] = {{32, 4, 64, 64, 0.125f}, {9, 3, 32, 48, 0.18f}, {8, 8, 16, 16, 0.25f}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct cpu_attn_shape s = shapes[si];
        const int n_tokens = 3;
        const int64_t cells[3] = {2500, 1700, 700}; /* the last ends in the second run of 512 */
        const int64_t q_width = (int64_t)s.n_head * s.head_k, o_width = (int64_t)s.n_head * s.head_v;
        const int64_t kw = (int64_t)s.n_head_kv * s.head_k, vw = (int64_t)s.n_head_kv * s.head_v;
        uint16_t *k = malloc(sizeof(uint16_t) * cells[0] * kw), *v = malloc(sizeof(uint16_t) * cells[0] * vw);
        const struct cpu_kv_view kv = cpu_kv_contiguous(k, v);
        float *q = malloc(sizeof(float) * n_tokens * q_width);
        float *alone = malloc(sizeof(float) * n_tokens * o_width), *first = malloc(sizeof(float) * n_tokens * o_width);
        float *merged = malloc(sizeof(float) * n_tokens * o_width);
        float *partial = malloc(sizeof(float) * (size_t)cpu_attention_partial_floats_max(&s));
        uint32_t seed = 41 + (uint32_t)si;
        for (int64_t i = 0; i < cells[0] * kw; i++) k[i] = half_from_f32(3 * frand(&seed));
        for (int64_t i = 0; i < cells[0] * vw; i++) v[i] = half_from_f32(frand(&seed));
        for (int64_t i = 0; i < n_tokens * q_width; i++) q[i] = frand(&seed);
        for (int t = 0; t < n_tokens; t++) cpu_attention_heads(&s, q + t * q_width, &kv, cells[t], 0, s.n_head, alone + t * o_width);
        for (int n_threads = 1; n_threads <= 64; n_threads *= 4) {
            struct cpu_attn_units u;
            cpu_attention_units(&s, n_tokens, cells[0], false, n_threads, &u);
            assert_int_equal(u.split_cells, CPU_ATTN_SPLIT_CELLS);
            assert_int_equal(u.splits, 5);
            assert_true(cpu_attention_partial_floats(&s, &u) <= cpu_attention_partial_floats_max(&s));
            int *seen = calloc((size_t)(n_tokens * s.n_head * u.splits), sizeof(int));
            for (int64_t i = u.count - 1; i >= 0; i--) {
                int64_t t0, t1;
                int h0, h1, split;
                cpu_attention_unit(&s, &u, i, &t0, &t1, &h0, &h1, &split);
                assert_true(t0 >= 0 && t1 == t0 + 1 && t1 <= n_tokens && split >= 0 && split < u.splits);
                assert_true(unit_heads(&s, h0, h1));
                for (int h = h0; h < h1; h++) seen[(t0 * s.n_head + h) * u.splits + split]++;
                cpu_attention_split(&s, &u, q + t0 * q_width, &kv, cells[t0], t0, h0, h1, split, partial);
            }
            for (int64_t i = 0; i < n_tokens * s.n_head * u.splits; i++) assert_int_equal(seen[i], 1);
            cpu_attention_merge(&s, &u, partial, merged);
            for (int64_t i = 0; i < n_tokens * o_width; i++)
                assert_true(fabsf(merged[i] - alone[i]) <= 1e-5f + 1e-4f * fabsf(alone[i]));
            if (n_threads == 1) memcpy(first, merged, sizeof(float) * n_tokens * o_width);
            else assert_memory_equal(merged, first, sizeof(float) * n_tokens * o_width);
            free(seen);
            /* Left as partial sums: the same output once divided by the sum, bit for bit. */
            float *sums = malloc(sizeof(float) * n_tokens * s.n_head * (s.head_v + 2));
            cpu_attention_merge_sums(&s, &u, partial, sums);
            for (int64_t th = 0; th < n_tokens * s.n_head; th++) {
                const float *r = sums + th * (s.head_v + 2), inv = 1.0f / r[1];
                for (int i = 0; i < s.head_v; i++) assert_true(r[2 + i] * inv == merged[th * s.head_v + i]);
            }
            free(sums);
        }
        /* A token's cells cut at c: the sums of [0, c), merged by their maxima with those of
         * [c, n) computed here (the maximum score, the sum of exponentials and the unnormalized
         * output from it, in double; q rounded to f16 as the kernels do), as the GPU merges the
         * CPU's with its own: what the token gets alone, within rounding. */
        for (int64_t c = 1024; c <= 2048; c += 1024) {
            struct cpu_attn_units u;
            cpu_attention_units(&s, 1, c, true, 4, &u);
            assert_true(u.splits > 1);
            split_every_unit(&s, &u, q, &kv, c, partial);
            float *sums = malloc(sizeof(float) * s.n_head * (s.head_v + 2)), *out = malloc(sizeof(float) * o_width);
            double *rest = malloc(sizeof(double) * (s.head_v + 2)), *score = malloc(sizeof(double) * cells[0]);
            cpu_attention_merge_sums(&s, &u, partial, sums);
            for (int h = 0; h < s.n_head; h++) {
                const int kvh = h / (s.n_head / s.n_head_kv);
                double m = -INFINITY;
                for (int64_t j = c; j < cells[0]; j++) {
                    double d = 0;
                    for (int i = 0; i < s.head_k; i++)
                        d += (double)half_to_f32(half_from_f32(q[h * s.head_k + i])) * half_to_f32(k[j * kw + kvh * s.head_k + i]);
                    score[j] = d * s.scale;
                    m = score[j] > m ? score[j] : m;
                }
                for (int i = 0; i < s.head_v + 2; i++) rest[i] = 0;
                rest[0] = m;
                for (int64_t j = c; j < cells[0]; j++) {
                    const double p = exp(score[j] - m);
                    rest[1] += p;
                    for (int i = 0; i < s.head_v; i++) rest[2 + i] += p * half_to_f32(v[j * vw + kvh * s.head_v + i]);
                }
                const float *a = sums + h * (s.head_v + 2);
                const double top = fmax(a[0], rest[0]), fa = exp(a[0] - top), fb = exp(rest[0] - top);
                for (int i = 0; i < s.head_v; i++)
                    out[h * s.head_v + i] = (float)((a[2 + i] * fa + rest[2 + i] * fb) / (a[1] * fa + rest[1] * fb));
            }
            for (int64_t i = 0; i < o_width; i++) assert_true(fabsf(out[i] - alone[i]) <= 1e-5f + 1e-4f * fabsf(alone[i]));
            free(sums), free(out), free(rest), free(score);
        }
        /* Below two runs' cells, or more tokens than CPU_ATTN_SPLIT_TOKENS: no runs. */
        struct cpu_attn_units u;
        cpu_attention_units(&s, 1, 2 * CPU_ATTN_SPLIT_CELLS - 1, false, 16, &u);
        assert_int_equal(u.splits, 1);
        cpu_attention_units(&s, CPU_ATTN_SPLIT_TOKENS + 1, cells[0], false, 16, &u);
        assert_int_equal(u.splits, 1);
        /* A long cache: at most CPU_ATTN_MAX_SPLITS runs of whole key blocks, covering it. */
        const int64_t longest = 100003;
        cpu_attention_units(&s, 1, longest, false, 16, &u);
        assert_true(u.splits <= CPU_ATTN_MAX_SPLITS && u.split_cells % 64 == 0 && u.splits * u.split_cells >= longest);
        free(k), free(v), free(q), free(alone), free(first), free(merged), free(partial);
    }
}

static void test_topk_and_router(void **state) {
    (void)state;
    const float x[8] = {0.1f, 0.9f, -1.0f, 0.9f, 0.5f, 2.0f, 0.0f, 0.3f};
    int32_t idx[3];
    cpu_topk(x, 8, 3, idx);
    assert_int_equal(idx[0], 5);
    assert_int_equal(idx[1], 1); /* ties: the lower index first */
    assert_int_equal(idx[2], 3);
    float logits[2 * 8];
    memcpy(logits, x, sizeof x);
    memcpy(logits + 8, x, sizeof x);
    int32_t ids[4];
    float w[4];
    cpu_moe_route(logits, 2, 8, 2, true, ids, w);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 1);
    assert_float_equal(w[0] + w[1], 1.0f, 1e-6);
    assert_float_equal(w[0] / w[1], expf(2.0f - 0.9f), 1e-4);
}

/* matmul of every supported type equals dequantize-then-dot on the same quantized
 * activations' dequantized values, within the activation rounding. */
static void test_matmul_against_dequantized(void **state) {
    (void)state;
    const enum quant_type types[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0,
                                     QUANT_Q5_1, QUANT_Q8_0, QUANT_Q4_K, QUANT_Q6_K};
    struct threadpool *pool;
    assert_int_equal(threadpool_create(3, &pool), PSHARD_OK);
    const int64_t cols = 512, rows = 70, n_tok = 5;
    float *wf = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n_tok * cols);
    float *deq = malloc(sizeof(float) * rows * cols), *y = malloc(sizeof(float) * n_tok * rows);
    uint8_t *wq = malloc(rows * cols * 4), *acts = malloc(n_tok * cols * 4 + 64);
    uint32_t seed = 3;
    for (int64_t i = 0; i < rows * cols; i++) wf[i] = frand(&seed) * 0.1f;
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = frand(&seed);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum quant_type type = types[ti];
        if (!quant_can_quantize(type)) continue;
        const size_t row_bytes = quant_row_bytes(type, cols);
        for (int64_t r = 0; r < rows; r++) {
            assert_int_equal(quant_quantize_row(type, wf + r * cols, wq + r * row_bytes, cols), PSHARD_OK);
            assert_int_equal(quant_dequantize_row(type, wq + r * row_bytes, deq + r * cols, cols), PSHARD_OK);
        }
        struct cpu_matrix m = {type, wq, cols, rows, 1, row_bytes, quant_kernels_get(type)};
        cpu_matmul(pool, &m, x, n_tok, y, acts);
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < rows; r++) {
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < cols; c++) {
                    ref += (double)deq[r * cols + c] * x[t * cols + c];
                    mag += fabs((double)deq[r * cols + c] * x[t * cols + c]);
                }
                /* activations are rounded to 8 bits (or f16/bf16) for the integer kernels */
                if (fabs(y[t * rows + r] - ref) > 0.02 * mag + 1e-5)
                    fail_msg("%s row %ld token %ld: %f vs %f", quant_type_name(type), (long)r, (long)t, y[t * rows + r], ref);
            }
    }
    threadpool_free(pool);
    free(wf), free(x), free(deq), free(y), free(wq), free(acts);
}

/* The expert FFN equals its products done one at a time (quantize, dot, gated unit, quantize,
 * dot, weighted sum in expert order), to the bit: for down formats whose activations quantize a
 * unit of rows at a time inside the gate/up pass (Q8_0, Q8_1) and for one that cannot (Q8_K);
 * for formats whose experts go four tokens at a time (Q4_0, Q4_K, Q6_K) or by tiles of rows
 * and tokens (F16, BF16); and for a part of the experts (a range, less pairs marked -1). */
static void test_moe_matches_its_products(void **state) {
    (void)state;
    static const struct { enum quant_type gate, down; int64_t n_embd, n_ff; } cases[] = {
        {QUANT_Q4_0, QUANT_Q8_0, 64, 96}, {QUANT_F16, QUANT_BF16, 64, 96},  {QUANT_Q4_K, QUANT_Q6_K, 256, 256},
        {QUANT_Q4_1, QUANT_Q5_1, 64, 128}, {QUANT_Q4_0, QUANT_Q4_K, 256, 256}};
    struct threadpool *pool;
    assert_int_equal(threadpool_create(3, &pool), PSHARD_OK);
    const int E = 6, k = 2;
    const int64_t n_tok = 5;
    uint32_t seed = 11;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t d = cases[c].n_embd, ff = cases[c].n_ff;
        struct cpu_matrix mats[3];
        const enum quant_type types[3] = {cases[c].gate, cases[c].gate, cases[c].down};
        const int64_t rows[3] = {ff, ff, d}, cols[3] = {d, d, ff};
        for (int m = 0; m < 3; m++) {
            const size_t row_bytes = quant_row_bytes(types[m], cols[m]);
            uint8_t *data = malloc(row_bytes * (size_t)(rows[m] * E));
            float *row = malloc(sizeof(float) * (size_t)cols[m]);
            for (int64_t r = 0; r < rows[m] * E; r++) {
                for (int64_t i = 0; i < cols[m]; i++) row[i] = frand(&seed) * 0.2f;
                assert_int_equal(quant_quantize_row(types[m], row, data + r * row_bytes, cols[m]), PSHARD_OK);
            }
            free(row);
            mats[m] = (struct cpu_matrix){types[m], data, cols[m], rows[m], E, row_bytes, quant_kernels_get(types[m])};
        }
        float *x = malloc(sizeof(float) * (size_t)(n_tok * d)), *logits = malloc(sizeof(float) * (size_t)(n_tok * E));
        for (int64_t i = 0; i < n_tok * d; i++) x[i] = frand(&seed);
        for (int64_t i = 0; i < n_tok * E; i++) logits[i] = frand(&seed);
        int32_t ids[5 * 2];
        float w[5 * 2];
        cpu_moe_route(logits, n_tok, E, k, true, ids, w);
        uint8_t *acts_buf = malloc(cpu_acts_bytes(types[0], d, n_tok) + 64);
        struct cpu_acts acts;
        cpu_quantize_acts(pool, &mats[0], x, n_tok, acts_buf, &acts);
        void *scratch_mem = malloc(cpu_moe_scratch_bytes(n_tok, k, E, d, ff, QUANT_F32));
        struct moe_scratch scratch;
        cpu_moe_scratch_init(&scratch, scratch_mem, n_tok, k, E, d, ff, QUANT_F32);
        float *got = malloc(sizeof(float) * (size_t)(n_tok * d)), *want = calloc((size_t)(n_tok * d), sizeof(float));
        /* The last case computes a part, as a split layer's CPU does: experts [2, E), and of
         * those not the pairs the GPU took (their ids marked -1). */
        const bool part = c == sizeof cases / sizeof cases[0] - 1;
        int32_t mine[5 * 2];
        for (int i = 0; i < n_tok * k; i++) mine[i] = part && i % 3 == 1 ? -1 : ids[i];
        struct moe_routing routing = {n_tok, k, mine, w, part ? 2 : 0, part ? E : 0};
        cpu_moe(pool, &mats[0], &mats[1], &mats[2], &acts, &routing, &scratch, got);

        float *g = malloc(sizeof(float) * (size_t)ff), *u = malloc(sizeof(float) * (size_t)ff), *y = malloc(sizeof(float) * (size_t)d);
        uint8_t *ax = malloc(cpu_acts_bytes(types[0], d, 1) + 64), *ah = malloc(cpu_acts_bytes(types[2], ff, 1) + 64);
        for (int64_t t = 0; t < n_tok; t++)
            for (int e = 0; e < E; e++) /* a token's experts add in expert order */
                for (int j = 0; j < k; j++) {
                    if (mine[t * k + j] != e || (part && e < 2)) continue;
                    const struct cpu_matrix ge = cpu_matrix_expert(&mats[0], e), ue = cpu_matrix_expert(&mats[1], e),
                                            de = cpu_matrix_expert(&mats[2], e);
                    struct cpu_acts a1, a2;
                    cpu_quantize_acts(NULL, &ge, x + t * d, 1, ax, &a1);
                    for (int64_t r = 0; r < ff; r++) {
                        g[r] = ge.kernels->vec_dot(d, (const uint8_t *)ge.data + r * ge.row_bytes, a1.data);
                        u[r] = ue.kernels->vec_dot(d, (const uint8_t *)ue.data + r * ue.row_bytes, a1.data);
                    }
                    cpu_swiglu(g, u, g, ff);
                    cpu_quantize_acts(NULL, &de, g, 1, ah, &a2);
                    for (int64_t r = 0; r < d; r++)
                        y[r] = de.kernels->vec_dot(ff, (const uint8_t *)de.data + r * de.row_bytes, a2.data);
                    for (int64_t r = 0; r < d; r++) want[t * d + r] += w[t * k + j] * y[r];
                }
        if (memcmp(got, want, sizeof(float) * (size_t)(n_tok * d)) != 0)
            fail_msg("%s/%s experts: not the products' result", quant_type_name(types[0]), quant_type_name(types[2]));
        for (int m = 0; m < 3; m++) free((void *)mats[m].data);
        free(x), free(logits), free(acts_buf), free(scratch_mem), free(got), free(want), free(g), free(u), free(y), free(ax), free(ah);
    }
    threadpool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threadpool_covers_every_index_once),
        cmocka_unit_test(test_threadpool_runs_without_its_workers), cmocka_unit_test(test_rope_matches_formula), cmocka_unit_test(test_mrope_sections),
        cmocka_unit_test(test_attention_exp_sum),
        cmocka_unit_test(test_attention_tile_kernels),
        cmocka_unit_test(test_attention_matches_naive_softmax),
        cmocka_unit_test(test_attention_heads_together_equal_alone),
        cmocka_unit_test(test_attention_tiles_equal_tokens_alone),
        cmocka_unit_test(test_attention_split_equals_whole), cmocka_unit_test(test_attention_paged_equals_contiguous),
        cmocka_unit_test(test_topk_and_router),
        cmocka_unit_test(test_matmul_against_dequantized), cmocka_unit_test(test_moe_matches_its_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
