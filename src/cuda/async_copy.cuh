/* Copies from global to shared memory that a thread issues and waits for later: cp.async from
 * sm_80, plain loads and stores (complete at once) before. A thread's copies are grouped by
 * copy_commit; copy_wait_n<N> returns once at most its N latest groups are still in flight.
 * Copies made by other threads are visible after the wait and a barrier (__syncwarp among a
 * warp's lanes, __syncthreads in a block). */
#ifndef CUDA_ASYNC_COPY_CUH
#define CUDA_ASYNC_COPY_CUH

#include <stdint.h>

/* One copy of `unit` bytes (16, 8 or 4; src and dst aligned to it). 16-byte copies skip L1. */
__device__ __forceinline__ void copy_unit(uint8_t *dst, const uint8_t *src, int unit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (unit == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
    else if (unit == 8) asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
#else
    if (unit == 16) *(uint4 *)dst = *(const uint4 *)src;
    else if (unit == 8) *(uint2 *)dst = *(const uint2 *)src;
    else *(uint32_t *)dst = *(const uint32_t *)src;
#endif
}

__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> __device__ __forceinline__ void copy_wait_n() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (N == 0) asm volatile("cp.async.wait_all;\n" ::: "memory");
    else asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Waits for every copy but, where one_pending, the last group committed. */
__device__ __forceinline__ void copy_wait(bool one_pending = false) {
    if (one_pending) copy_wait_n<1>();
    else copy_wait_n<0>();
}

#endif
