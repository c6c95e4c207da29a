/* Activation quantization on the GPU: f32 rows to Q8_0, Q8_1, Q8_K, F16, BF16, byte-identical to
 * the CPU reference quantizers (src/quant/act_ref.c), so the integer dot products that follow
 * are the CPU's (the quantizers themselves: quantize_act.cuh); and RMSNorm and SwiGLU with the
 * conversion for the product after them in the same launch. */
#include "cuda/quantize_act.cuh"

enum { QA_THREADS = 256, QA_WARPS = QA_THREADS / 32 };

/* One warp per block of 32 (Q8_0, Q8_1) or super-block of 256 (Q8_K). */
template <bool WITH_SUM>
__global__ void __launch_bounds__(QA_THREADS) quantize_q8_kernel(const float *x, uint8_t *out, int64_t n_blocks) {
    dep_enter();
    const int64_t b = (int64_t)blockIdx.x * QA_WARPS + threadIdx.x / 32;
    if (b >= n_blocks) return;
    qa_q8_block<WITH_SUM>(x + b * 32, out + b * (WITH_SUM ? 36 : 34), threadIdx.x % 32);
}

__global__ void __launch_bounds__(QA_THREADS) quantize_q8_K_kernel(const float *x, uint8_t *out, int64_t n_blocks) {
    dep_enter();
    const int64_t b = (int64_t)blockIdx.x * QA_WARPS + threadIdx.x / 32;
    if (b >= n_blocks) return;
    qa_q8_K_block(x + b * 256, out + b * 292, threadIdx.x % 32);
}

/* RMSNorm and its conversion for the products after it (Q8_0, Q8_1, F16 or BF16: a qa_out) in
 * one: block (x, row) sums the row's squares as rmsnorm_kernel does (so the same scale, to the
 * bit), then each warp normalizes one block of 32 values as it does (into out, and mirror where
 * there is one) and writes them as cuda_quantize does. */
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_act_kernel(const float *x, const float *w, float *out, float *mirror,
                                                                  int q_out, uint8_t *q, int64_t n, float eps) {
    dep_enter();
    const float *xr = x + (int64_t)blockIdx.y * n;
    const float scale = rms_scale(xr, n, eps);
    const int64_t b = (int64_t)blockIdx.x * (NORM_THREADS / 32) + threadIdx.x / 32, i = b * 32 + threadIdx.x % 32;
    if (b >= n / 32) return; /* (after rms_scale's barrier) */
    const float v = rms_value(xr, w, scale, i);
    out[(int64_t)blockIdx.y * n + i] = v;
    if (mirror) mirror[(int64_t)blockIdx.y * n + i] = v;
    qa_value32(q_out, v, q, (int64_t)blockIdx.y * (n / 32) + b, threadIdx.x % 32);
}

/* SwiGLU (as swiglu_kernel) and the conversion for the product after it: a warp a block of 32. */
__global__ void __launch_bounds__(QA_THREADS) swiglu_act_kernel(const float *gate, const float *up, int q_out, uint8_t *q,
                                                                int64_t n_blocks) {
    dep_enter();
    const int64_t b = (int64_t)blockIdx.x * QA_WARPS + threadIdx.x / 32, i = b * 32 + threadIdx.x % 32;
    if (b >= n_blocks) return;
    qa_value32(q_out, swiglu_value(gate[i], up[i]), q, b, threadIdx.x % 32);
}

__global__ void to_f16_kernel(const float *x, __half *out, int64_t n) {
    dep_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

__global__ void to_bf16_kernel(const float *x, uint16_t *out, int64_t n) {
    dep_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = qa_bf16(x[i]);
}

extern "C" bool cuda_writes_act(enum quant_type act_type) { return qa_out_of(act_type) != QA_NONE; }

extern "C" pshard_status cuda_rmsnorm_quantize(enum quant_type act_type, const float *x, const float *w, float *out,
                                               float *mirror, void *q, int64_t n_rows, int64_t n, float eps,
                                               cuda_stream s) {
    CUDA_ARG(n > 0 && n_rows >= 0 && n_rows < 65536 && x != out, "rmsnorm and quantize: %lld rows of %lld (out apart from x)",
             (long long)n_rows, (long long)n);
    if (n_rows == 0) return PSHARD_OK;
    if (qa_out_of(act_type) == QA_NONE || n % 32 != 0) {
        CORE_TRY(cuda_rmsnorm_mirror(x, w, out, mirror, n_rows, n, eps, s));
        return cuda_quantize(act_type, out, n, n_rows, q, s);
    }
    const dim3 grid((unsigned)ceil_div(n / 32, NORM_THREADS / 32), (unsigned)n_rows);
    CUDA_TRY(launch_dep(rmsnorm_act_kernel, grid, NORM_THREADS, 0, raw_stream(s), x, w, out, mirror, qa_out_of(act_type),
                        (uint8_t *)q, n, eps));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_swiglu_quantize(enum quant_type act_type, const float *gate, const float *up, int64_t n_cols,
                                              int64_t n_rows, void *q, cuda_stream s) {
    CUDA_ARG(cuda_writes_act(act_type) && n_cols % 32 == 0 && n_rows >= 0,
             "swiglu and quantize: %lld rows of %lld to %s (Q8_0, Q8_1, F16 or BF16; a multiple of 32)",
             (long long)n_rows, (long long)n_cols, quant_type_name(act_type));
    const int64_t n_blocks = n_rows * n_cols / 32;
    if (n_blocks == 0) return PSHARD_OK;
    CUDA_TRY(launch_dep(swiglu_act_kernel, (unsigned)ceil_div(n_blocks, QA_WARPS), QA_THREADS, 0, raw_stream(s), gate, up,
                        qa_out_of(act_type), (uint8_t *)q, n_blocks));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_quantize(enum quant_type act_type, const float *x, int64_t n_cols, int64_t n_rows,
                                       void *out, cuda_stream s) {
    const int64_t n = n_cols * n_rows;
    if (n == 0) return PSHARD_OK;
    cudaStream_t st = raw_stream(s);
    switch (act_type) {
    case QUANT_F32:
        CUDA_TRY(cudaMemcpyAsync(out, x, (size_t)n * 4, cudaMemcpyDeviceToDevice, st));
        return PSHARD_OK;
    case QUANT_F16:
        CUDA_TRY(launch_dep(to_f16_kernel, (unsigned)ceil_div(n, 256), 256, 0, st, x, (__half *)out, n));
        break;
    case QUANT_BF16:
        CUDA_TRY(launch_dep(to_bf16_kernel, (unsigned)ceil_div(n, 256), 256, 0, st, x, (uint16_t *)out, n));
        break;
    case QUANT_Q8_0:
    case QUANT_Q8_1:
        CUDA_ARG(n_cols % 32 == 0, "quantize to Q8_0/Q8_1: row of %lld is not a multiple of 32", (long long)n_cols);
        if (act_type == QUANT_Q8_0)
            CUDA_TRY(launch_dep(quantize_q8_kernel<false>, (unsigned)ceil_div(n / 32, QA_WARPS), QA_THREADS, 0, st, x,
                                (uint8_t *)out, n / 32));
        else
            CUDA_TRY(launch_dep(quantize_q8_kernel<true>, (unsigned)ceil_div(n / 32, QA_WARPS), QA_THREADS, 0, st, x,
                                (uint8_t *)out, n / 32));
        break;
    case QUANT_Q8_K:
        CUDA_ARG(n_cols % 256 == 0, "quantize to Q8_K: row of %lld is not a multiple of 256", (long long)n_cols);
        CUDA_TRY(launch_dep(quantize_q8_K_kernel, (unsigned)ceil_div(n / 256, QA_WARPS), QA_THREADS, 0, st, x,
                            (uint8_t *)out, n / 256));
        break;
    default:
        return core_fail(PSHARD_ERR_UNSUPPORTED, "no GPU activation quantizer for %s", quant_type_name(act_type));
    }
    return PSHARD_OK;
}
