/* Matrix-vector dots of the K formats (Q2_K..Q6_K) with Q8_K activations. A lane takes one
 * 32-element part of a super-block: the format unpacks it into 8 words of signed bytes (two
 * 16-element halves of 4 words), the halves' integer scales and minimums, and the block's d
 * and dmin; one loop then computes, as src/quant/ref_kquants.c does per super-block,
 *   d * da * (sc0 * dot0 + sc1 * dot1) - dmin * da * (m0 * bsum0 + m1 * bsum1)
 * with the activations' per-16 sums (bsums) standing in for the minimums' dots. */
#include "cuda/moe_fused.cuh"

struct kpart {
    int q[8];
    int sc0, sc1, m0, m1;
    float d, dmin;
};

template <class U> struct mv_kquant {
    static constexpr int BYTES = U::BYTES, IPB = 8, ACT_BYTES = 292;

    template <int NT>
    static __device__ __forceinline__ void dot(const uint8_t *w, int part, const uint8_t *const *arow, int64_t aoff,
                                               float *acc) {
        kpart k;
        U::unpack(w, part, k);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint8_t *ab = arow[t] + aoff;
            const float da = *(const float *)ab;
            const int *aq = (const int *)(ab + 4 + 32 * part);
            int s0 = 0, s1 = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s0 = __dp4a(k.q[j], aq[j], s0);
                s1 = __dp4a(k.q[j + 4], aq[j + 4], s1);
            }
            const int sumi = k.sc0 * s0 + k.sc1 * s1;
            if (U::HAS_MIN) {
                const int16_t *bs = (const int16_t *)(ab + 260) + 2 * part;
                const int summ = k.m0 * bs[0] + k.m1 * bs[1];
                acc[t] += k.d * da * (float)sumi - k.dmin * da * (float)summ;
            } else {
                acc[t] += k.d * da * (float)sumi;
            }
        }
    }
};

/* scales[16] (low nibble scale, high nibble min), qs[64], d, dmin. Element 128h + 32j + l is
 * bits 2j..2j+1 of qs[32h + l]; part p = 4h + j. */
struct q2_K_unpack {
    static constexpr int BYTES = 84;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int p, kpart &k) {
        const int h = p >> 2, j = p & 3;
#pragma unroll
        for (int i = 0; i < 8; i++) k.q[i] = (ld_word<4>(w + 16 + 32 * h + 4 * i) >> (2 * j)) & 0x03030303;
        const int s0 = w[2 * p], s1 = w[2 * p + 1];
        k.sc0 = s0 & 15, k.m0 = s0 >> 4;
        k.sc1 = s1 & 15, k.m1 = s1 >> 4;
        k.d = ld_half(w + 80);
        k.dmin = ld_half(w + 82);
    }
};

/* hmask[32], qs[64], scales[12], d: quants as Q2_K, minus 4 where the hmask bit (bit 4h + j
 * of hmask[l]) is clear; 6-bit signed scales (low nibbles in bytes 0..7, top bits in 8..11). */
__device__ __forceinline__ int q3_K_scale(const uint8_t *s, int i) {
    const int low = (s[i & 7] >> (4 * (i >> 3))) & 0xf;
    const int high = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (low | (high << 4)) - 32;
}

struct q3_K_unpack {
    static constexpr int BYTES = 110;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int p, kpart &k) {
        const int h = p >> 2, j = p & 3;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int low = (ld_word<2>(w + 32 + 32 * h + 4 * i) >> (2 * j)) & 0x03030303;
            const int high = (ld_word<2>(w + 4 * i) >> (4 * h + j)) & 0x01010101;
            k.q[i] = sub_bytes<4>(low | (high << 2));
        }
        k.sc0 = q3_K_scale(w + 96, 2 * p);
        k.sc1 = q3_K_scale(w + 96, 2 * p + 1);
        k.m0 = k.m1 = 0;
        k.d = ld_half(w + 108);
        k.dmin = 0.0f;
    }
};

/* The 6-bit scale and min of sub-block p of a Q4_K/Q5_K block from its 12 packed bytes. */
__device__ __forceinline__ void k4_scale_min(const uint8_t *s, int p, int &sc, int &m) {
    if (p < 4) {
        sc = s[p] & 63;
        m = s[p + 4] & 63;
    } else {
        sc = (s[p + 4] & 0xf) | ((s[p - 4] >> 6) << 4);
        m = (s[p + 4] >> 4) | ((s[p] >> 6) << 4);
    }
}

/* d, dmin, scales[12], qs[128]: each 64 elements share 32 bytes, low nibbles then high. */
struct q4_K_unpack {
    static constexpr int BYTES = 144;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int p, kpart &k) {
        const int c = p >> 1, shift = 4 * (p & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) k.q[i] = (ld_word<4>(w + 16 + 32 * c + 4 * i) >> shift) & 0x0f0f0f0f;
        k4_scale_min(w + 4, p, k.sc0, k.m0);
        k.sc1 = k.sc0, k.m1 = k.m0;
        k.d = ld_half(w);
        k.dmin = ld_half(w + 2);
    }
};

/* As Q4_K with qh[32] before qs: bit p of qh[l] is bit 4 of element 32p + l. */
struct q5_K_unpack {
    static constexpr int BYTES = 176;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int p, kpart &k) {
        const int c = p >> 1, shift = 4 * (p & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int low = (ld_word<4>(w + 48 + 32 * c + 4 * i) >> shift) & 0x0f0f0f0f;
            const int high = (ld_word<4>(w + 16 + 4 * i) >> p) & 0x01010101;
            k.q[i] = low | (high << 4);
        }
        k4_scale_min(w + 4, p, k.sc0, k.m0);
        k.sc1 = k.sc0, k.m1 = k.m0;
        k.d = ld_half(w);
        k.dmin = ld_half(w + 2);
    }
};

/* ql[128], qh[64], scales[16] (int8), d. In half h, quarter j: low bits from the low (j < 2) or
 * high nibbles of ql[64h + 32(j & 1) + l], top 2 bits from bits 2j of qh[32h + l]; minus 32. */
struct q6_K_unpack {
    static constexpr int BYTES = 210;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int p, kpart &k) {
        const int h = p >> 2, j = p & 3;
        const uint8_t *ql = w + 64 * h + 32 * (j & 1), *qh = w + 128 + 32 * h;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int low = (ld_word<2>(ql + 4 * i) >> (4 * (j >> 1))) & 0x0f0f0f0f;
            const int high = (ld_word<2>(qh + 4 * i) >> (2 * j)) & 0x03030303;
            k.q[i] = sub_bytes<32>(low | (high << 4));
        }
        k.sc0 = (int8_t)w[192 + 2 * p];
        k.sc1 = (int8_t)w[193 + 2 * p];
        k.m0 = k.m1 = 0;
        k.d = ld_half(w + 208);
        k.dmin = 0.0f;
    }
};

/* f(policy) with the policy class of a K format. */
template <class F> static pshard_status with_kquant(enum quant_type type, F f) {
    switch (type) {
    case QUANT_Q2_K: return f(mv_kquant<q2_K_unpack>());
    case QUANT_Q3_K: return f(mv_kquant<q3_K_unpack>());
    case QUANT_Q4_K: return f(mv_kquant<q4_K_unpack>());
    case QUANT_Q5_K: return f(mv_kquant<q5_K_unpack>());
    case QUANT_Q6_K: return f(mv_kquant<q6_K_unpack>());
    default: return core_fail(PSHARD_ERR_INTERNAL, "matvec: %s is not a K format", quant_type_name(type));
    }
}

pshard_status mv_launch_kquants(enum quant_type type, int nt, const mv_args &a, dim3 grid, cudaStream_t st) {
    return with_kquant(type, [&](auto p) { return mv_launch<decltype(p)>(nt, a, grid, st); });
}

pshard_status moe_gate_up_kquants(enum quant_type type, int nt, const moe_fused_args &a, cudaStream_t st) {
    return with_kquant(type, [&](auto p) { return moe_gate_up_launch<decltype(p)>(nt, a, st); });
}

pshard_status moe_down_kquants(enum quant_type type, const moe_fused_args &a, cudaStream_t st) {
    return with_kquant(type, [&](auto p) { return moe_down_launch<decltype(p)>(a, st); });
}
