/* How fast one thread reads a decode unit's cells of the KV cache in the order the CPU's attention
 * takes them: a run of 512 cells, each a row of `row` bytes (the K or V values of every KV head of
 * one cell), read in `passes` passes, each taking its 1/passes of every row (one KV head's values,
 * or a few heads'), or in one pass from the first cell to the last. Only loads and adds: the
 * arithmetic of the attention is left out, so this is the rate its memory reads allow.
 *
 * Build: cc -O2 -mavx2 bench/kv_read_probe.c -o build/kv_read_probe
 * Run:   build/kv_read_probe ROW_BYTES PASSES [PREFETCH_CELLS]   (e.g. 1024 4: qwen30b's 4 KV heads
 *        of 128 f16 values, a pass a KV head; PREFETCH_CELLS > 0 asks for each pass's part of the
 *        row that many cells ahead, as the attention's tile does) */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { CELLS = 512, GIB = 1 << 30 };

static volatile int sink;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const int row = argc > 1 ? atoi(argv[1]) : 1024, passes = argc > 2 ? atoi(argv[2]) : 1;
    const int ahead = argc > 3 ? atoi(argv[3]) : 0;
    if (row < 64 || row % 64 || passes < 1 || row / passes % 64) {
        fprintf(stderr, "kv_read_probe: ROW_BYTES a multiple of 64 whose 1/PASSES is a multiple of 64\n");
        return 1;
    }
    const int part = row / passes;
    const size_t units = GIB / ((size_t)CELLS * row); /* a GiB of runs: each read once, from memory */
    uint8_t *mem = aligned_alloc(4096, units * CELLS * row);
    if (!mem) return fprintf(stderr, "kv_read_probe: out of memory\n"), 1;
    for (size_t i = 0; i < units * CELLS * row; i += 64) mem[i] = (uint8_t)i;
    __m256i acc = _mm256_setzero_si256();
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = now_s();
        for (size_t u = 0; u < units; u++) {
            const uint8_t *run = mem + u * CELLS * row;
            for (int p = 0; p < passes; p++)
                for (int c = 0; c < CELLS; c++) {
                    if (ahead > 0 && c + ahead < CELLS)
                        for (int l = 0; l < part; l += 64) __builtin_prefetch(run + (size_t)(c + ahead) * row + p * part + l);
                    const __m256i *v = (const __m256i *)(run + (size_t)c * row + p * part);
                    for (int l = 0; l < part / 32; l++) acc = _mm256_add_epi8(acc, _mm256_load_si256(v + l));
                }
        }
        const double t = now_s() - t0;
        best = t < best ? t : best;
    }
    sink = _mm256_extract_epi32(acc, 0); /* (so the loads stay) */
    printf("rows of %d bytes, %d pass%s%s: %.1f GB/s (one thread, best of 3 reads of %zu MiB)\n", row, passes,
           passes > 1 ? "es" : "", ahead > 0 ? ", prefetched" : "", (double)(units * CELLS * row) / best / 1e9,
           units * CELLS * row >> 20);
    free(mem);
    return 0;
}
