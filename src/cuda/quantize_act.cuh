/* The activation quantizers as device functions, byte-identical to the CPU reference quantizers
 * (src/quant/act_ref.c): the cuda_quantize kernels and the fused MoE kernels, which quantize the
 * experts' hidden rows in shared memory, both call these. Division and rounding are IEEE (no
 * fast-math), which is what makes the bytes equal: d = amax / 127, id = 127 / amax,
 * q = round-half-even(x * id). */
#ifndef CUDA_QUANTIZE_ACT_CUH
#define CUDA_QUANTIZE_ACT_CUH

#include "cuda/cuda_internal.cuh"

/* One warp, one block of 32: lane j quantizes element j of x (v, its value) into Q8_0 (34 bytes) or, WITH_SUM,
 * Q8_1 (36 bytes: s = d * sum(q) from the unrounded d, as the reference). */
template <bool WITH_SUM> __device__ __forceinline__ void qa_q8_value(float v, uint8_t *o, int lane) {
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = __float2int_rn(v * id);
    const int qs_offset = WITH_SUM ? 4 : 2;
    o[qs_offset + lane] = (uint8_t)(int8_t)q;
    const int sum = WITH_SUM ? warp_sum_int(q) : 0;
    if (lane == 0) {
        *(__half *)o = __float2half_rn(d);
        if (WITH_SUM) *(__half *)(o + 2) = __float2half_rn(d * (float)sum);
    }
}

template <bool WITH_SUM> __device__ __forceinline__ void qa_q8_block(const float *x, uint8_t *o, int lane) {
    qa_q8_value<WITH_SUM>(x[lane], o, lane);
}

/* One warp, one Q8_K super-block of 256 (292 bytes), lane l holding elements 8l..8l+7 (x 16-byte
 * aligned; x0, x1 their values). The element of largest magnitude (the first on ties) maps to -127, so the scale
 * carries its sign. */
__device__ __forceinline__ void qa_q8_K_values(float4 x0, float4 x1, uint8_t *o, int lane) {
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
    for (int off = 16; off > 0; off >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, off), m2 = __shfl_xor_sync(0xffffffffu, max, off);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, off);
        if (a2 > amax || (a2 == amax && i2 < idx)) {
            amax = a2;
            max = m2;
            idx = i2;
        }
    }
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

__device__ __forceinline__ void qa_q8_K_block(const float *x, uint8_t *o, int lane) {
    const float4 *xv = (const float4 *)(x + lane * 8);
    qa_q8_K_values(xv[0], xv[1], o, lane);
}

/* Round to nearest even on the top 16 bits, NaNs kept quiet, as bf16_from_f32 does. */
__device__ __forceinline__ uint16_t qa_bf16(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 64) : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* The formats a warp writes 32 values of at once (qa_value32): the activations of the
 * matrix-vector kernel's formats but Q8_K. */
enum qa_out { QA_NONE = -1, QA_Q8_0, QA_Q8_1, QA_F16, QA_BF16 };

static inline int qa_out_of(enum quant_type t) {
    switch (t) {
    case QUANT_Q8_0: return QA_Q8_0;
    case QUANT_Q8_1: return QA_Q8_1;
    case QUANT_F16: return QA_F16;
    case QUANT_BF16: return QA_BF16;
    default: return QA_NONE;
    }
}

/* One warp: lane j's v is element j of block b (of 32 values) of the output, written as
 * cuda_quantize writes it in `out` format (a qa_out). */
__device__ __forceinline__ void qa_value32(int out, float v, uint8_t *q, int64_t b, int lane) {
    switch (out) {
    case QA_Q8_0: qa_q8_value<false>(v, q + b * 34, lane); break;
    case QA_Q8_1: qa_q8_value<true>(v, q + b * 36, lane); break;
    case QA_F16: ((__half *)q)[b * 32 + lane] = __float2half_rn(v); break;
    default: ((uint16_t *)q)[b * 32 + lane] = qa_bf16(v); break;
    }
}

#endif
