/* Dequantization of 8 consecutive elements of a weight row (k0 a multiple of 8), for every
 * format: the unit of the embedding lookup, the f16 dequantizer in front of cuBLAS and the
 * weight tiles of the fused GEMM. Arithmetic is written out with __fmul_rn/__fadd_rn so no
 * multiply-add is fused: the values equal src/quant's reference dequantizers bit for bit. */
#ifndef CUDA_DEQUANT_CUH
#define CUDA_DEQUANT_CUH

#include "cuda/cuda_internal.cuh"

__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) { return (uint32_t)ld_word<2>(p); }

/* 6-bit scale and min of sub-block p of Q4_K/Q5_K (see matvec_kquants.cu). */
__device__ __forceinline__ void dq_k4_scale_min(const uint8_t *s, int p, int &sc, int &m) {
    if (p < 4) {
        sc = s[p] & 63;
        m = s[p + 4] & 63;
    } else {
        sc = (s[p + 4] & 0xf) | ((s[p - 4] >> 6) << 4);
        m = (s[p + 4] >> 4) | ((s[p] >> 6) << 4);
    }
}

template <int TYPE> __device__ __forceinline__ void dq8(const uint8_t *row, int k0, float *out) {
    if constexpr (TYPE == QUANT_F32) {
        const float4 *p = (const float4 *)(row + 4 * (size_t)k0);
        const float4 a = p[0], b = p[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else if constexpr (TYPE == QUANT_F16) {
        const uint4 v = *(const uint4 *)(row + 2 * (size_t)k0);
        const __half2 *h = (const __half2 *)&v;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(h[i]);
            out[2 * i] = f.x, out[2 * i + 1] = f.y;
        }
    } else if constexpr (TYPE == QUANT_BF16) {
        const uint4 v = *(const uint4 *)(row + 2 * (size_t)k0);
        const uint32_t *u = (const uint32_t *)&v;
#pragma unroll
        for (int i = 0; i < 4; i++) out[2 * i] = __uint_as_float(u[i] << 16), out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    } else if constexpr (TYPE == QUANT_Q4_0 || TYPE == QUANT_Q4_1) {
        constexpr bool off = TYPE == QUANT_Q4_1;
        const uint8_t *b = row + (k0 / 32) * (off ? 20 : 18);
        const int j0 = k0 % 32, shift = j0 >= 16 ? 4 : 0;
        const float d = ld_half(b), m = off ? ld_half(b + 2) : 0.0f;
        const uint8_t *qs = b + (off ? 4 : 2) + (j0 % 16);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = (qs[i] >> shift) & 0xf;
            out[i] = off ? __fadd_rn(__fmul_rn((float)q, d), m) : __fmul_rn((float)(q - 8), d);
        }
    } else if constexpr (TYPE == QUANT_Q5_0 || TYPE == QUANT_Q5_1) {
        constexpr bool off = TYPE == QUANT_Q5_1;
        const uint8_t *b = row + (k0 / 32) * (off ? 24 : 22);
        const int j0 = k0 % 32, shift = j0 >= 16 ? 4 : 0;
        const float d = ld_half(b), m = off ? ld_half(b + 2) : 0.0f;
        const uint32_t qh = ld_u32_a2(b + (off ? 4 : 2));
        const uint8_t *qs = b + (off ? 8 : 6) + (j0 % 16);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = ((qs[i] >> shift) & 0xf) | (((qh >> (j0 + i)) & 1) << 4);
            out[i] = off ? __fadd_rn(__fmul_rn((float)q, d), m) : __fmul_rn((float)(q - 16), d);
        }
    } else if constexpr (TYPE == QUANT_Q8_0) {
        const uint8_t *b = row + (k0 / 32) * 34;
        const float d = ld_half(b);
        const int8_t *qs = (const int8_t *)b + 2 + k0 % 32;
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = __fmul_rn((float)qs[i], d);
    } else {
        /* K formats: x = (d * sc) * q - (dmin * m) per sub-block, as kblock_dequant. */
        const int e0 = k0 % 256, h = e0 / 128, j = (e0 / 32) % 4, l0 = e0 % 32;
        int q[8];
        float dl, ml;
        if constexpr (TYPE == QUANT_Q2_K) {
            const uint8_t *b = row + (k0 / 256) * 84;
            const int sc = b[e0 / 16];
#pragma unroll
            for (int i = 0; i < 8; i++) q[i] = (b[16 + 32 * h + l0 + i] >> (2 * j)) & 3;
            dl = __fmul_rn(ld_half(b + 80), (float)(sc & 15));
            ml = __fmul_rn(ld_half(b + 82), (float)(sc >> 4));
        } else if constexpr (TYPE == QUANT_Q3_K) {
            const uint8_t *b = row + (k0 / 256) * 110;
            const uint8_t *s = b + 96;
            const int si = e0 / 16;
            const int sc = (((s[si & 7] >> (4 * (si >> 3))) & 0xf) | (((s[8 + (si & 3)] >> (2 * (si >> 2))) & 3) << 4)) - 32;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int low = (b[32 + 32 * h + l0 + i] >> (2 * j)) & 3;
                const int high = (b[l0 + i] >> (4 * h + j)) & 1;
                q[i] = low - (high ? 0 : 4);
            }
            dl = __fmul_rn(ld_half(b + 108), (float)sc);
            ml = 0.0f; /* dmin * m with both 0 */
        } else if constexpr (TYPE == QUANT_Q4_K || TYPE == QUANT_Q5_K) {
            constexpr bool five = TYPE == QUANT_Q5_K;
            const uint8_t *b = row + (k0 / 256) * (five ? 176 : 144);
            const int p = e0 / 32, c = p / 2, shift = 4 * (p % 2);
            int sc, m;
            dq_k4_scale_min(b + 4, p, sc, m);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                q[i] = (b[(five ? 48 : 16) + 32 * c + l0 + i] >> shift) & 0xf;
                if (five) q[i] |= ((b[16 + l0 + i] >> p) & 1) << 4;
            }
            dl = __fmul_rn(ld_half(b), (float)sc);
            ml = __fmul_rn(ld_half(b + 2), (float)m);
        } else {
            static_assert(TYPE == QUANT_Q6_K, "unsupported type");
            const uint8_t *b = row + (k0 / 256) * 210;
            const uint8_t *ql = b + 64 * h + 32 * (j & 1), *qh = b + 128 + 32 * h;
#pragma unroll
            for (int i = 0; i < 8; i++)
                q[i] = (((ql[l0 + i] >> (4 * (j >> 1))) & 0xf) | (((qh[l0 + i] >> (2 * j)) & 3) << 4)) - 32;
            dl = __fmul_rn(ld_half(b + 208), (float)(int8_t)b[192 + e0 / 16]);
            ml = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = __fsub_rn(__fmul_rn(dl, (float)q[i]), ml);
    }
}

/* `switch (type) { CUDA_TYPE_CASES(X) default: ... }` runs the macro X(TYPE) for a run-time
 * type, TYPE a compile-time constant: one template instance per supported format. */
#define CUDA_TYPE_CASES(X)                                                                       \
    case QUANT_F32: X(QUANT_F32); break;                                                         \
    case QUANT_F16: X(QUANT_F16); break;                                                         \
    case QUANT_BF16: X(QUANT_BF16); break;                                                       \
    case QUANT_Q4_0: X(QUANT_Q4_0); break;                                                       \
    case QUANT_Q4_1: X(QUANT_Q4_1); break;                                                       \
    case QUANT_Q5_0: X(QUANT_Q5_0); break;                                                       \
    case QUANT_Q5_1: X(QUANT_Q5_1); break;                                                       \
    case QUANT_Q8_0: X(QUANT_Q8_0); break;                                                       \
    case QUANT_Q2_K: X(QUANT_Q2_K); break;                                                       \
    case QUANT_Q3_K: X(QUANT_Q3_K); break;                                                       \
    case QUANT_Q4_K: X(QUANT_Q4_K); break;                                                       \
    case QUANT_Q5_K: X(QUANT_Q5_K); break;                                                       \
    case QUANT_Q6_K: X(QUANT_Q6_K); break;

#endif
