/* Inside the CUDA backend: the error-checking macros, the context struct, and small device
 * helpers (loads of packed halves, dp4a, warp sums) that every kernel file shares. */
#ifndef CUDA_CUDA_INTERNAL_CUH
#define CUDA_CUDA_INTERNAL_CUH

extern "C" {
#include "cuda/cuda_backend.h"
}

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* Turn a failed CUDA call into a pshard_status whose message names the call, file and line. */
pshard_status cuda_fail(cudaError_t err, const char *expr, const char *file, int line);
pshard_status cuda_fail_blas(cublasStatus_t err, const char *expr, const char *file, int line);

#define CUDA_TRY(expr)                                                                           \
    do {                                                                                         \
        cudaError_t cuda_try_err_ = (expr);                                                      \
        if (cuda_try_err_ != cudaSuccess) return cuda_fail(cuda_try_err_, #expr, __FILE__, __LINE__); \
    } while (0)

#define BLAS_TRY(expr)                                                                           \
    do {                                                                                         \
        cublasStatus_t blas_try_err_ = (expr);                                                   \
        if (blas_try_err_ != CUBLAS_STATUS_SUCCESS)                                              \
            return cuda_fail_blas(blas_try_err_, #expr, __FILE__, __LINE__);                     \
    } while (0)

/* After a kernel launch: launch errors (bad configuration) show up here, not at the launch. */
#define CUDA_TRY_LAUNCH(what) CUDA_TRY(cudaGetLastError())

#define CUDA_ARG(cond, ...)                                                                      \
    do {                                                                                         \
        if (!(cond)) return core_fail(PSHARD_ERR_INVALID_ARG, __VA_ARGS__);                      \
    } while (0)

static inline cudaStream_t raw_stream(cuda_stream s) { return (cudaStream_t)s; }

struct cuda_ctx {
    int device;
    struct cuda_ctx_info info;
    cudaStream_t compute, copy;
    cublasHandle_t blas;
    enum cuda_gemm_path gemm_path;
};

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- block geometry of the weight types, on the host side */

/* Elements and bytes per block; the float types count as blocks of 32 elements, the unit the
 * matrix kernels step in. 0 for unsupported types. */
int cuda_block_elems(enum quant_type type);
int cuda_block_bytes(enum quant_type type);

/* Merges the slices of attention over a split cache ([token][head][slice] unnormalized outputs,
 * then their running max and sum) into out [n_tokens][n_head * head_v]: both attention kernels. */
pshard_status cuda_attention_merge(const float *part_o, const float *part_ml, int n_splits, int n_head, int head_v,
                                   int64_t n_tokens, float *out, cuda_stream s);

/* ---- dependent launches (compute capability 9.0 on)
 *
 * A kernel launched by launch_dep may start while the kernel before it in the stream still runs:
 * once each block of that kernel has called dep_release() (or exited). Each of its blocks calls
 * dep_wait() before it reads anything an earlier launch wrote and before it writes anything;
 * dep_wait returns when every earlier kernel has finished and its writes are visible. What a
 * kernel does before (the matrix-vector kernels load their first weights, which no step writes)
 * overlaps the tail of the kernel before it, and its own launch does. A plain launch (<<<>>>)
 * waits for everything before it, as ever, and a kernel that never calls dep_release lets its
 * dependents start only as it ends. Taken where the kernels run as their sm_90 code
 * (cuda_dep_launch, set when the context is made), which has the two instructions, and only
 * outside graph capture: a captured decode step launched this way ran 10% slower (qwen30b on an
 * H100, bench/cuda_kernels.md), while the host's launches of steps of many tokens gain.
 * Elsewhere the two instructions are empty or never wait, and launch_dep launches plainly. */
extern bool cuda_dep_launch;

__device__ __forceinline__ void dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void dep_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The usual start of a kernel launched by launch_dep: its dependents may launch, and it waits. */
__device__ __forceinline__ void dep_enter() {
    dep_release();
    dep_wait();
}

template <typename... P, typename... A>
static inline cudaError_t launch_dep(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                     A &&...args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    bool dep = false;
    if (cuda_dep_launch) {
        if (cudaStreamIsCapturing(st, &capture) == cudaSuccess) dep = capture == cudaStreamCaptureStatusNone;
        else cudaGetLastError(); /* (not left for the next launch's check) */
    }
    cfg.attrs = dep ? &attr : NULL;
    cfg.numAttrs = dep ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

/* ---- device helpers */

/* A half stored at a 2-byte aligned address, as f32. */
__device__ __forceinline__ float ld_half(const uint8_t *p) { return __half2float(*(const __half *)p); }

/* A 32-bit word at an address aligned to ALIGN bytes (2 or >= 4): packed blocks put their
 * quants at 2-byte offsets, where a 32-bit load would fault. */
template <int ALIGN> __device__ __forceinline__ int ld_word(const uint8_t *p) {
    if constexpr (ALIGN >= 4) {
        return *(const int *)p;
    } else {
        const uint16_t *h = (const uint16_t *)p;
        return (int)((uint32_t)h[0] | ((uint32_t)h[1] << 16));
    }
}

/* Per-byte q - c for bytes q in [0, 128 + c) without borrows between bytes: set bit 7, subtract,
 * flip bit 7 back. The result bytes are the signed values q - c. */
template <int C> __device__ __forceinline__ int sub_bytes(int q) {
    return (int)((((uint32_t)q | 0x80808080u) - (uint32_t)(C * 0x01010101u)) ^ 0x80808080u);
}

/* 4 bits (b0..b3) to bit 0 of 4 bytes: the shifted copies land in disjoint bit ranges. */
__device__ __forceinline__ int spread_bits(uint32_t b) { return (int)((b * 0x00204081u) & 0x01010101u); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* RMSNorm's scale for one row, computed by a block of NORM_THREADS threads as src/cpu/elementwise.c
 * does: squares summed in double (in this thread and warp order), an IEEE sqrt and division. */
enum { NORM_THREADS = 256 };
__device__ inline float rms_scale(const float *xr, int64_t n, float eps) {
    __shared__ double partial[NORM_THREADS / 32];
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) sum += (double)xr[i] * xr[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int i = 0; i < NORM_THREADS / 32; i++) total += partial[i];
    return 1.0f / sqrtf((float)(total / (double)n) + eps);
}

/* Element i of a row normed by rms_scale's scale, then by the weights w (none: NULL), unfused. */
__device__ __forceinline__ float rms_value(const float *xr, const float *w, float scale, int64_t i) {
    return w ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : __fmul_rn(xr[i], scale);
}

/* SwiGLU of one element, silu(g) * u, as src/cpu computes it (IEEE division, expf, unfused): every
 * kernel that applies it (the element-wise one, the one that also converts, the fused experts')
 * calls this, so they agree to the bit. */
__device__ __forceinline__ float swiglu_value(float g, float u) { return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u); }

#endif
