/* The CPU's side of a split MoE decode step, alone: threads compute one token's Q4_0 expert rows
 * (qwen30b's shapes: gate, up and down of 768 x 2048 each, 4 random experts of 128 a layer),
 * claiming 32 rows at a time as cpu_moe does, from a /dev/shm file mapping (4 KiB pages) or from
 * anonymous memory with or without transparent huge pages, asking for the cache lines of the
 * row PF rows ahead before each row (PF = 0: never; -1: a unit's rows all at its start). Prints
 * the buffer's plain read rate and the rows' rate, the best of three passes of 480 layers.
 * Usage: expert_rows_probe file|huge|small THREADS MIB PF */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "core/timer.h"
#include "quant/quant.h"

enum { COLS = 2048, ROW_BYTES = 1152, EXPERT_ROWS = 768 * 3, UNIT = 32, PER_LAYER = 4, LAYERS = 480 };
static const char *const SHM_PATH = "/dev/shm/pshard_expert_rows_probe.bin";

struct probe {
    const uint8_t *base;
    size_t bytes;
    int64_t n_experts;
    int prefetch;
    const struct quant_kernels *kernels;
    uint8_t act[4096];
    int chosen[PER_LAYER];
    _Atomic int64_t next;
    float sums[256];
};

static void prefetch_row(const uint8_t *row) {
    for (int k = 0; k < ROW_BYTES; k += 64) __builtin_prefetch(row + k, 0, 3);
}

static void layer_job(void *arg, int thread, int n_threads) {
    struct probe *p = arg;
    (void)n_threads;
    const int64_t per = EXPERT_ROWS / UNIT, total = PER_LAYER * per;
    float s = 0;
    for (int64_t u = atomic_fetch_add(&p->next, 1); u < total; u = atomic_fetch_add(&p->next, 1)) {
        const uint8_t *rows = p->base + ((size_t)p->chosen[u / per] * EXPERT_ROWS + (size_t)(u % per) * UNIT) * ROW_BYTES;
        if (p->prefetch < 0)
            for (int r = 0; r < UNIT; r++) prefetch_row(rows + (size_t)r * ROW_BYTES);
        for (int r = 0; r < UNIT; r++) {
            if (p->prefetch > 0 && r + p->prefetch < UNIT) prefetch_row(rows + (size_t)(r + p->prefetch) * ROW_BYTES);
            s += p->kernels->vec_dot(COLS, rows + (size_t)r * ROW_BYTES, p->act);
        }
    }
    p->sums[thread & 255] += s;
}

static void read_job(void *arg, int thread, int n_threads) {
    struct probe *p = arg;
    int64_t begin, end;
    threadpool_range((int64_t)(p->bytes / 8), 8, thread, n_threads, &begin, &end);
    const uint64_t *w = (const uint64_t *)p->base;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (int64_t i = begin; i + 4 <= end; i += 4) a ^= w[i], b ^= w[i + 1], c ^= w[i + 2], d ^= w[i + 3];
    p->sums[thread & 255] += (float)((a ^ b ^ c ^ d) & 1);
}

static uint8_t *map_memory(const char *mode, size_t bytes) {
    if (!strcmp(mode, "file")) {
        const int fd = open(SHM_PATH, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) return NULL;
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        return m == MAP_FAILED ? NULL : m;
    }
    const size_t huge = (size_t)2 << 20;
    void *m = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(aligned, bytes, !strcmp(mode, "huge") ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return aligned;
}

int main(int argc, char **argv) {
    const int threads = argc == 5 ? atoi(argv[2]) : 0;
    const long mib = argc == 5 ? atol(argv[3]) : 0;
    if (argc != 5 || (strcmp(argv[1], "file") && strcmp(argv[1], "huge") && strcmp(argv[1], "small")) || threads < 1 ||
        threads > 256 || mib < 256) {
        fprintf(stderr, "usage: expert_rows_probe file|huge|small THREADS MIB(>= 256) PF\n");
        return 2;
    }
    static struct probe p;
    p.bytes = (size_t)mib << 20;
    p.prefetch = atoi(argv[4]);
    p.kernels = quant_kernels_get(QUANT_Q4_0);
    uint8_t *mem = map_memory(argv[1], p.bytes);
    if (!mem || !p.kernels) {
        fprintf(stderr, "expert_rows_probe: cannot map %ld MiB\n", mib);
        return 1;
    }
    /* Q4_0 blocks of 18 bytes: a half-precision scale of 1, then codes. */
    for (size_t i = 0; i + 8 <= p.bytes; i += 8) {
        const uint64_t v = i * 0x9E3779B97F4A7C15ull;
        memcpy(mem + i, &v, 8);
    }
    for (size_t i = 0; i + 2 <= p.bytes; i += 18) mem[i] = 0, mem[i + 1] = 0x3c;
    memset(p.act, 1, sizeof p.act);
    p.base = mem;
    p.n_experts = (int64_t)(p.bytes / ((size_t)EXPERT_ROWS * ROW_BYTES));
    struct threadpool *pool;
    if (threadpool_create(threads, &pool) != PSHARD_OK) return 1;
    double best_read = 1e30, best_rows = 1e30;
    srand(1);
    for (int pass = 0; pass < 3; pass++) {
        double t0 = core_now_ms();
        threadpool_run(pool, read_job, &p);
        const double read_ms = core_now_ms() - t0;
        best_read = read_ms < best_read ? read_ms : best_read;
        t0 = core_now_ms();
        for (int l = 0; l < LAYERS; l++) {
            for (int c = 0; c < PER_LAYER; c++) p.chosen[c] = rand() % (int)p.n_experts;
            p.next = 0;
            threadpool_run(pool, layer_job, &p);
        }
        const double rows_ms = core_now_ms() - t0;
        best_rows = rows_ms < best_rows ? rows_ms : best_rows;
    }
    const double row_bytes = (double)LAYERS * PER_LAYER * EXPERT_ROWS * ROW_BYTES;
    printf("%-5s %2d threads, prefetch %2d: read %.1f GB/s, expert rows %.1f GB/s (%.1f us a layer)\n", argv[1], threads,
           p.prefetch, (double)p.bytes / (best_read * 1e6), row_bytes / (best_rows * 1e6), best_rows * 1e3 / LAYERS);
    threadpool_free(pool);
    if (!strcmp(argv[1], "file")) unlink(SHM_PATH);
    return 0;
}
