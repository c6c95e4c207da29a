/* The device arena: the budget taken in one cudaMalloc at start and carved by a bump allocator,
 * so the per-token path never allocates and peak use can never pass the budget. */
#include "cuda/cuda_internal.cuh"

#include <stdio.h>
#include <string.h>

extern "C" pshard_status cuda_arena_create(struct cuda_arena *a, size_t bytes) {
    memset(a, 0, sizeof *a);
    CUDA_ARG(bytes > 0, "CUDA arena: size 0");
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        return core_fail(PSHARD_ERR_NOMEM, "CUDA arena: cannot allocate %.1f MiB of device memory (%.1f MiB free): %s",
                         bytes / 1048576.0, f / 1048576.0, cudaGetErrorString(err));
    }
    a->base = (uint8_t *)p;
    a->size = bytes;
    return PSHARD_OK;
}

extern "C" void cuda_arena_destroy(struct cuda_arena *a) {
    if (a->base) cudaFree(a->base);
    memset(a, 0, sizeof *a);
}

extern "C" pshard_status cuda_arena_alloc(struct cuda_arena *a, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (!a->base) return core_fail(PSHARD_ERR_INVALID_ARG, "CUDA arena: not created");
    const size_t rounded = (bytes + CUDA_ARENA_ALIGN - 1) & ~(size_t)(CUDA_ARENA_ALIGN - 1);
    if (rounded < bytes || rounded > a->size - a->used)
        return core_fail(PSHARD_ERR_NOMEM, "CUDA arena: %s needs %.2f MiB, %.2f MiB of %.2f MiB left",
                         what ? what : "allocation", bytes / 1048576.0, (a->size - a->used) / 1048576.0,
                         a->size / 1048576.0);
    *out = a->base + a->used;
    if (a->n_log < CUDA_ARENA_LOG) a->log[a->n_log++] = (struct cuda_arena_entry){a->used, rounded, what};
    a->used += rounded;
    a->n_allocs++;
    if (a->used > a->peak) a->peak = a->used;
    return PSHARD_OK;
}

extern "C" size_t cuda_arena_mark(const struct cuda_arena *a) { return a->used; }

extern "C" void cuda_arena_reset(struct cuda_arena *a, size_t mark) {
    if (mark > a->used) return;
    a->used = mark;
    while (a->n_log > 0 && a->log[a->n_log - 1].offset >= mark) a->n_log--;
}

extern "C" int cuda_arena_report(const struct cuda_arena *a, char *buf, size_t len) {
    const double mib = 1048576.0;
    int n = snprintf(buf, len, "device arena: %.1f MiB, used %.1f MiB, peak %.1f MiB, %zu allocations",
                     a->size / mib, a->used / mib, a->peak / mib, a->n_allocs);
    /* Sum the live allocations by name, in order of first appearance. */
    for (size_t i = 0; i < a->n_log; i++) {
        const char *what = a->log[i].what ? a->log[i].what : "unnamed";
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++) {
            const char *other = a->log[j].what ? a->log[j].what : "unnamed";
            seen = strcmp(other, what) == 0;
        }
        if (seen) continue;
        size_t total = 0;
        for (size_t j = i; j < a->n_log; j++) {
            const char *other = a->log[j].what ? a->log[j].what : "unnamed";
            if (strcmp(other, what) == 0) total += a->log[j].bytes;
        }
        const size_t at = (size_t)n;
        n += snprintf(at < len ? buf + at : NULL, at < len ? len - at : 0, "\n  %-16s %10.2f MiB", what,
                      total / mib);
    }
    return n;
}
