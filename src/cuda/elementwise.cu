/* Element-wise operators and row reductions: RMSNorm (also per head, for q/k norms), residual
 * and bias adds, SwiGLU. They follow src/cpu/elementwise.c operation for operation: RMSNorm
 * sums squares in double, scales with an IEEE sqrt and division, so rows agree to the last
 * bit unless the double sums round differently. */
#include "cuda/cuda_internal.cuh"

/* Block b takes part b % parts of row b / parts (parts of `span` values), each block of a row
 * summing the whole row's squares: a few rows run on more blocks than one (out apart from x). */
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(const float *x, const float *w, float *out, int64_t n,
                                                               float eps, float *mirror, int parts, int64_t span) {
    dep_enter();
    const int64_t row = blockIdx.x / parts, from = (int64_t)(blockIdx.x % parts) * span, to = min(n, from + span);
    const float *xr = x + row * n;
    float *o = out + row * n;
    const float scale = rms_scale(xr, n, eps);
    float *m = mirror ? mirror + row * n : nullptr;
    for (int64_t i = from + threadIdx.x; i < to; i += NORM_THREADS) {
        const float v = rms_value(xr, w, scale, i);
        o[i] = v;
        if (m) m[i] = v;
    }
    if (m) __threadfence_system(); /* in host memory before anything this stream signals later */
}

__global__ void add_kernel(float *acc, const float *x, int64_t n) {
    dep_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += x[i];
}

__global__ void add_bias_kernel(float *x, const float *bias, int64_t total, int64_t n) {
    dep_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += bias[i % n];
}

__global__ void swiglu_kernel(const float *gate, const float *up, float *out, int64_t n) {
    dep_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = swiglu_value(gate[i], up[i]);
}

static unsigned blocks_for(int64_t n) { return (unsigned)ceil_div(n, 256); }

extern "C" pshard_status cuda_rmsnorm_mirror(const float *x, const float *w, float *out, float *mirror, int64_t n_rows,
                                             int64_t n, float eps, cuda_stream s) {
    CUDA_ARG(n > 0 && n_rows >= 0 && n_rows < (1ll << 31), "rmsnorm: %lld rows of %lld", (long long)n_rows, (long long)n);
    if (n_rows == 0) return PSHARD_OK;
    /* A decode step's few rows: a block per NORM_THREADS values of each (not in place: the other
     * blocks of the row read it whole). */
    const int parts = out != x && n_rows <= 8 && n >= 4 * NORM_THREADS ? (int)ceil_div(n, NORM_THREADS) : 1;
    CUDA_TRY(launch_dep(rmsnorm_kernel, (unsigned)(n_rows * parts), NORM_THREADS, 0, raw_stream(s), x, w, out, n, eps,
                        mirror, parts, parts > 1 ? NORM_THREADS : n));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_rmsnorm(const float *x, const float *w, float *out, int64_t n_rows, int64_t n, float eps,
                                      cuda_stream s) {
    return cuda_rmsnorm_mirror(x, w, out, NULL, n_rows, n, eps, s);
}

extern "C" pshard_status cuda_add(float *acc, const float *x, int64_t n, cuda_stream s) {
    if (n == 0) return PSHARD_OK;
    CUDA_TRY(launch_dep(add_kernel, blocks_for(n), 256, 0, raw_stream(s), acc, x, n));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_add_bias(float *x, const float *bias, int64_t n_rows, int64_t n, cuda_stream s) {
    if (n_rows * n == 0) return PSHARD_OK;
    CUDA_TRY(launch_dep(add_bias_kernel, blocks_for(n_rows * n), 256, 0, raw_stream(s), x, bias, n_rows * n, n));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_swiglu(const float *gate, const float *up, float *out, int64_t n, cuda_stream s) {
    if (n == 0) return PSHARD_OK;
    CUDA_TRY(launch_dep(swiglu_kernel, blocks_for(n), 256, 0, raw_stream(s), gate, up, out, n));
    return PSHARD_OK;
}
