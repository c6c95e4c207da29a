/* Host memory read bandwidth: T threads each sum a private slice of a large buffer with wide
 * loads, best of several passes. The denominator of "fraction of bandwidth" in RESULTS.md. */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

struct slice {
    const __m256i *p;
    size_t n;
    uint64_t sum;
};

static void *read_slice(void *arg) {
    struct slice *s = arg;
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 4 <= s->n; i += 4) {
        a = _mm256_xor_si256(a, _mm256_load_si256(s->p + i));
        b = _mm256_xor_si256(b, _mm256_load_si256(s->p + i + 1));
        c = _mm256_xor_si256(c, _mm256_load_si256(s->p + i + 2));
        d = _mm256_xor_si256(d, _mm256_load_si256(s->p + i + 3));
    }
    s->sum = (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)), 0);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 16;
    size_t bytes = (argc > 2 ? strtoull(argv[2], NULL, 10) : 4096) << 20; /* MiB */
    if (threads < 1 || threads > 512 || bytes < (64u << 20)) {
        fprintf(stderr, "usage: membw [THREADS] [MiB >= 64]\n");
        return 2;
    }
    uint8_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 1;
    memset(buf, 1, bytes); /* fault every page in before timing */
    pthread_t tid[512];
    struct slice slices[512];
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = core_now_ms();
        for (int i = 0; i < threads; i++) {
            size_t n = bytes / 32 / (size_t)threads;
            slices[i] = (struct slice){(const __m256i *)buf + n * (size_t)i, n, 0};
            pthread_create(&tid[i], NULL, read_slice, &slices[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
        double gbps = (double)bytes / ((core_now_ms() - t0) * 1e6);
        best = gbps > best ? gbps : best;
    }
    printf("host read bandwidth: %.1f GB/s (%d threads, %zu MiB, best of 5)\n", best, threads, bytes >> 20);
    free(buf);
    return 0;
}
