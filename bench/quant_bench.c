/* Single-thread throughput of the quant vec_dot kernels: GB/s of weights streamed through
 * one dot product per row, for a matrix that fits in L2 and one far larger than the caches
 * (the decode GEMV case), next to a plain read of the same bytes (the speed of light); and,
 * where the format has one, the four-token kernel (vec_dot4, a prompt's) on the L2-sized matrix.
 *
 * Build (no CMake target needed):
 *   cc -O2 -march=native -Isrc -Iinclude bench/quant_bench.c -Lbuild -lpshard \
 *      -Wl,-rpath,$PWD/build -lm -o build/quant_bench
 * Run: build/quant_bench [dram_mib=256] [n=4096] [TYPE...]   (TYPE: e.g. Q4_0 Q4_K, the formats
 *      to measure, all by default; PSHARD_CPU_DISABLE=avx512 etc. work too) */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"

/* CPU time of this thread: on a shared machine, time spent descheduled must not count. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Every figure is the best of several short trials, dropping those disturbed by other work
 * (caches, memory traffic) on a shared machine. */
#define TRIALS 9

/* Plain sequential read of `bytes`, the bound any kernel streaming them meets. */
static uint64_t read_once(const uint8_t *p, size_t bytes) {
    uint64_t s[8] = {0}, total = 0;
    for (size_t i = 0; i + 64 <= bytes; i += 64) {
        uint64_t v[8];
        memcpy(v, p + i, 64);
        for (int k = 0; k < 8; k++) s[k] += v[k];
    }
    for (int k = 0; k < 8; k++) total += s[k];
    return total;
}

static double read_gbps(const uint8_t *p, size_t bytes, double trial_s) {
    uint64_t sink = 0;
    double best = 0;
    int batch = (int)(4e6 / (double)bytes) + 1; /* read the clock every ~4 MB */
    for (int t = 0; t < TRIALS; t++) {
        double start = now_s(), elapsed;
        int reps = 0;
        do {
            for (int rep = 0; rep < batch; rep++, reps++) sink += read_once(p, bytes);
            elapsed = now_s() - start;
        } while (elapsed < trial_s);
        double gbps = (double)bytes * reps / elapsed / 1e9;
        if (gbps > best) best = gbps;
    }
    if (sink == 42) puts("");
    return best;
}

/* Dot every row of a rows x n matrix with one activation row (act_stride 0: vec_dot) or with four
 * activation rows act_stride bytes apart at once (vec_dot4, a prompt's kernel): GB/s of weights,
 * each row read once per call. */
static double dot_gbps(const struct quant_kernels *k, const uint8_t *w, size_t row_bytes, int64_t rows, int64_t n,
                       const void *act, size_t act_stride, double trial_s) {
    volatile float sink = 0;
    double best = 0;
    for (int t = 0; t < TRIALS; t++) {
        double start = now_s(), elapsed;
        int reps = 0, batch = (int)(4e6 / ((double)row_bytes * (double)rows)) + 1;
        do {
            for (int rep = 0; rep < batch; rep++) {
                float s = 0, out[4];
                for (int64_t r = 0; r < rows; r++) {
                    if (!act_stride) {
                        s += k->vec_dot(n, w + r * row_bytes, act);
                    } else {
                        k->vec_dot4(n, w + r * row_bytes, act, act_stride, out);
                        s += out[0] + out[3];
                    }
                }
                sink += s;
                reps++;
            }
            elapsed = now_s() - start;
        } while (elapsed < trial_s);
        double gbps = (double)row_bytes * (double)rows * reps / elapsed / 1e9;
        if (gbps > best) best = gbps;
    }
    (void)sink;
    return best;
}

int main(int argc, char **argv) {
    size_t dram_bytes = (size_t)(argc > 1 ? atol(argv[1]) : 256) << 20;
    int64_t n = argc > 2 ? atol(argv[2]) : 4096;
    const size_t l1_bytes = 24 << 10, l2_bytes = 512 << 10;
    static const enum quant_type types[] = {QUANT_F32,  QUANT_F16,  QUANT_BF16, QUANT_Q4_0, QUANT_Q4_1,
                                            QUANT_Q5_0, QUANT_Q5_1, QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K,
                                            QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K};

    uint8_t *w = malloc(dram_bytes + 4096);
    float *x = malloc((size_t)n * sizeof *x), *row = malloc((size_t)n * sizeof *row);
    void *act = malloc(4 * ((size_t)n * 4 + 4096));
    if (!w || !x || !row || !act) return 1;
    for (int64_t i = 0; i < n; i++) x[i] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;

    memset(w, 1, dram_bytes);
    printf("n = %lld, single thread, best of %d trials\n", (long long)n, TRIALS);
    printf("%-5s %-6s %9s %9s %9s %9s  (GB/s of weights; L2x4: four tokens a row, vec_dot4)\n", "type", "impl", "L1",
           "L2", "DRAM", "L2x4");
    printf("%-5s %-6s %9.1f %9.1f %9.1f\n", "read", "plain", read_gbps(w, l1_bytes, 0.05), read_gbps(w, l2_bytes, 0.05),
           read_gbps(w, dram_bytes, 0.2));
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        bool wanted = argc <= 3;
        for (int i = 3; i < argc; i++) wanted |= strcmp(argv[i], quant_type_name(types[t])) == 0;
        if (!wanted) continue;
        size_t row_bytes = quant_row_bytes(types[t], n);
        int64_t rows_dram = (int64_t)(dram_bytes / row_bytes), rows_l2 = (int64_t)(l2_bytes / row_bytes);
        int64_t rows_l1 = (int64_t)(l1_bytes / row_bytes);
        if (rows_l1 < 1) rows_l1 = 1;
        /* realistic values: quantize one random row and repeat it, so scales are sane */
        for (int64_t i = 0; i < n; i++) row[i] = (float)((int64_t)(next() % 2001) - 1000) / 997.0f;
        if (quant_can_quantize(types[t])) {
            quant_quantize_row(types[t], row, w, n);
        } else {
            for (size_t i = 0; i < row_bytes; i++) w[i] = (uint8_t)next();
            quant_quantize_row(QUANT_F16, row, w, 1); /* keep it defined; scales vary anyway */
        }
        for (int64_t r = 1; r < rows_dram; r++) memcpy(w + r * row_bytes, w, row_bytes);
        for (int impl = 0; impl < QUANT_IMPL_COUNT; impl++) {
            const struct quant_kernels *k = quant_kernels_variant(types[t], (enum quant_impl)impl);
            if (!k) continue;
            const size_t act_stride = quant_act_row_bytes(k, n);
            for (int j = 0; j < 4; j++) k->quantize_act(x, (uint8_t *)act + j * act_stride, n);
            double l1 = dot_gbps(k, w, row_bytes, rows_l1, n, act, 0, 0.05);
            double l2 = dot_gbps(k, w, row_bytes, rows_l2, n, act, 0, 0.05);
            double dram = dot_gbps(k, w, row_bytes, rows_dram, n, act, 0, 0.2);
            printf("%-5s %-6s %9.1f %9.1f %9.1f", quant_type_name(types[t]), quant_impl_name(k->impl), l1, l2, dram);
            if (k->vec_dot4) printf(" %9.1f", dot_gbps(k, w, row_bytes, rows_l2, n, act, act_stride, 0.05));
            printf("\n");
        }
    }
    free(act);
    free(row);
    free(x);
    free(w);
    return 0;
}
