/* Activation quantization on the GPU: f32 rows to Q8_0, Q8_1, Q8_K, F16, BF16, byte-identical to
 * the CPU reference quantizers (src/quant/act_ref.c), so the integer dot products that follow
 * are the CPU's (the quantizers themselves: quantize_act.cuh). */
#include "cuda/quantize_act.cuh"

enum { QA_THREADS = 256, QA_WARPS = QA_THREADS / 32 };

/* One warp per block of 32 (Q8_0, Q8_1) or super-block of 256 (Q8_K). */
template <bool WITH_SUM>
__global__ void __launch_bounds__(QA_THREADS) quantize_q8_kernel(const float *x, uint8_t *out, int64_t n_blocks) {
    const int64_t b = (int64_t)blockIdx.x * QA_WARPS + threadIdx.x / 32;
    if (b >= n_blocks) return;
    qa_q8_block<WITH_SUM>(x + b * 32, out + b * (WITH_SUM ? 36 : 34), threadIdx.x % 32);
}

__global__ void __launch_bounds__(QA_THREADS) quantize_q8_K_kernel(const float *x, uint8_t *out, int64_t n_blocks) {
    const int64_t b = (int64_t)blockIdx.x * QA_WARPS + threadIdx.x / 32;
    if (b >= n_blocks) return;
    qa_q8_K_block(x + b * 256, out + b * 292, threadIdx.x % 32);
}

/* RMSNorm and quantization to Q8_0/Q8_1 in one: block (x, row) sums the row's squares as
 * rmsnorm_kernel does (so the same scale, to the bit), then each warp normalizes one block of 32
 * values as it does (into out, and mirror where there is one) and quantizes them. */
template <bool WITH_SUM>
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_q8_kernel(const float *x, const float *w, float *out, float *mirror,
                                                                 uint8_t *q, int64_t n, float eps) {
    const float *xr = x + (int64_t)blockIdx.y * n;
    const float scale = rms_scale(xr, n, eps);
    const int64_t b = (int64_t)blockIdx.x * (NORM_THREADS / 32) + threadIdx.x / 32, i = b * 32 + threadIdx.x % 32;
    if (b >= n / 32) return; /* (after rms_scale's barrier) */
    const float v = rms_value(xr, w, scale, i);
    out[(int64_t)blockIdx.y * n + i] = v;
    if (mirror) mirror[(int64_t)blockIdx.y * n + i] = v;
    qa_q8_value<WITH_SUM>(v, q + ((int64_t)blockIdx.y * (n / 32) + b) * (WITH_SUM ? 36 : 34), threadIdx.x % 32);
}

__global__ void to_f16_kernel(const float *x, __half *out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

__global__ void to_bf16_kernel(const float *x, uint16_t *out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = qa_bf16(x[i]);
}

extern "C" pshard_status cuda_rmsnorm_quantize(enum quant_type act_type, const float *x, const float *w, float *out,
                                               float *mirror, void *q, int64_t n_rows, int64_t n, float eps,
                                               cuda_stream s) {
    CUDA_ARG(n > 0 && n_rows >= 0 && n_rows < 65536 && x != out, "rmsnorm and quantize: %lld rows of %lld (out apart from x)",
             (long long)n_rows, (long long)n);
    if (n_rows == 0) return PSHARD_OK;
    if ((act_type != QUANT_Q8_0 && act_type != QUANT_Q8_1) || n % 32 != 0) {
        CORE_TRY(cuda_rmsnorm_mirror(x, w, out, mirror, n_rows, n, eps, s));
        return cuda_quantize(act_type, out, n, n_rows, q, s);
    }
    const dim3 grid((unsigned)ceil_div(n / 32, NORM_THREADS / 32), (unsigned)n_rows);
    if (act_type == QUANT_Q8_0)
        rmsnorm_q8_kernel<false><<<grid, NORM_THREADS, 0, raw_stream(s)>>>(x, w, out, mirror, (uint8_t *)q, n, eps);
    else
        rmsnorm_q8_kernel<true><<<grid, NORM_THREADS, 0, raw_stream(s)>>>(x, w, out, mirror, (uint8_t *)q, n, eps);
    CUDA_TRY_LAUNCH("rmsnorm and quantize");
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
        to_f16_kernel<<<(unsigned)ceil_div(n, 256), 256, 0, st>>>(x, (__half *)out, n);
        break;
    case QUANT_BF16:
        to_bf16_kernel<<<(unsigned)ceil_div(n, 256), 256, 0, st>>>(x, (uint16_t *)out, n);
        break;
    case QUANT_Q8_0:
    case QUANT_Q8_1:
        CUDA_ARG(n_cols % 32 == 0, "quantize to Q8_0/Q8_1: row of %lld is not a multiple of 32", (long long)n_cols);
        if (act_type == QUANT_Q8_0)
            quantize_q8_kernel<false><<<(unsigned)ceil_div(n / 32, QA_WARPS), QA_THREADS, 0, st>>>(x, (uint8_t *)out, n / 32);
        else
            quantize_q8_kernel<true><<<(unsigned)ceil_div(n / 32, QA_WARPS), QA_THREADS, 0, st>>>(x, (uint8_t *)out, n / 32);
        break;
    case QUANT_Q8_K:
        CUDA_ARG(n_cols % 256 == 0, "quantize to Q8_K: row of %lld is not a multiple of 256", (long long)n_cols);
        quantize_q8_K_kernel<<<(unsigned)ceil_div(n / 256, QA_WARPS), QA_THREADS, 0, st>>>(x, (uint8_t *)out, n / 256);
        break;
    default:
        return core_fail(PSHARD_ERR_UNSUPPORTED, "no GPU activation quantizer for %s", quant_type_name(act_type));
    }
    CUDA_TRY_LAUNCH("quantize");
    return PSHARD_OK;
}
