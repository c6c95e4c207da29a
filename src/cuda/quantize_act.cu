/* Activation quantization on the GPU: f32 rows to Q8_0, Q8_1, Q8_K, F16, BF16, byte-identical to
 * the CPU reference quantizers (src/quant/act_ref.c), so the integer dot products that follow
 * are the CPU's. Division and rounding are IEEE here (no fast-math), which is what makes the
 * bytes equal: d = amax / 127, id = 127 / amax, q = round-half-even(x * id). */
#include "cuda/cuda_internal.cuh"

enum { QA_THREADS = 256, QA_WARPS = QA_THREADS / 32 };

/* One warp per block of 32: lane j quantizes element j. Q8_1 adds s = d * sum(q), from the
 * unrounded d, as the reference does. */
template <bool WITH_SUM>
__global__ void __launch_bounds__(QA_THREADS) quantize_q8_kernel(const float *x, uint8_t *out, int64_t n_blocks) {
    const int64_t b = (int64_t)blockIdx.x * QA_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (b >= n_blocks) return;
    const float v = x[b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = __float2int_rn(v * id);
    const int block_bytes = WITH_SUM ? 36 : 34, qs_offset = WITH_SUM ? 4 : 2;
    uint8_t *o = out + b * block_bytes;
    o[qs_offset + lane] = (uint8_t)(int8_t)q;
    const int sum = WITH_SUM ? warp_sum_int(q) : 0;
    if (lane == 0) {
        *(__half *)o = __float2half_rn(d);
        if (WITH_SUM) *(__half *)(o + 2) = __float2half_rn(d * (float)sum);
    }
}

/* Q8_K: one warp per super-block of 256, lane l holds elements 8l..8l+7. The element of largest
 * magnitude (the first on ties) maps to -127, so the scale carries its sign. */
__global__ void __launch_bounds__(QA_THREADS) quantize_q8_K_kernel(const float *x, uint8_t *out, int64_t n_blocks) {
    const int64_t b = (int64_t)blockIdx.x * QA_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (b >= n_blocks) return;
    const float4 *xv = (const float4 *)(x + b * 256 + lane * 8);
    const float4 x0 = xv[0], x1 = xv[1];
    const float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    float amax = 0.0f, max = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (fabsf(v[j]) > amax) {
            amax = fabsf(v[j]);
            max = v[j];
            idx = lane * 8 + j;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o), m2 = __shfl_xor_sync(0xffffffffu, max, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) {
            amax = a2;
            max = m2;
            idx = i2;
        }
    }
    uint8_t *o = out + b * 292;
    uint32_t packed[2] = {0, 0};
    int sum = 0;
    float d = 0.0f;
    if (amax != 0.0f) {
        const float iscale = -127.0f / max;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int q = min(__float2int_rn(iscale * v[j]), 127);
            sum += q;
            packed[j / 4] |= (uint32_t)(uint8_t)(int8_t)q << (8 * (j % 4));
        }
        d = 1.0f / iscale;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1); /* two lanes make one group of 16 */
    uint32_t *qs = (uint32_t *)(o + 4 + lane * 8);
    qs[0] = packed[0];
    qs[1] = packed[1];
    if (lane % 2 == 0) *(int16_t *)(o + 260 + lane) = (int16_t)sum;
    if (lane == 0) *(float *)o = d;
}

__global__ void to_f16_kernel(const float *x, __half *out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

/* Round to nearest even on the top 16 bits, NaNs kept quiet, as bf16_from_f32 does. */
__global__ void to_bf16_kernel(const float *x, uint16_t *out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint32_t u = __float_as_uint(x[i]);
    out[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 64) : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
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
