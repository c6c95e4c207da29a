/* Matrix-vector dots of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with Q8_1
 * activations. Each format unpacks a block into 8 words of signed bytes (elements 4k..4k+3 in
 * word k) -- the same integers src/quant/ref_legacy.c forms -- and one loop dots them with the
 * activations by dp4a: sum = dw * da * sum(qw * qa) (+ mw * sa for the offset formats). The
 * quants of Q8_1 are those of Q8_0, so Q4_0/Q5_0/Q8_0 compute exactly the CPU's integers. */
#include "cuda/moe_fused.cuh"

template <class U> struct mv_legacy {
    static constexpr int BYTES = U::BYTES, IPB = 1, ACT_BYTES = 36;

    template <int NT>
    static __device__ __forceinline__ void dot(const uint8_t *w, int, const uint8_t *const *arow, int64_t aoff,
                                               float *acc) {
        int q[8];
        float d, m;
        U::unpack(w, q, d, m);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint8_t *ab = arow[t] + aoff;
            const int *aq = (const int *)(ab + 4);
            int s = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) s = __dp4a(q[k], aq[k], s);
            if (U::HAS_MIN) acc[t] += d * ld_half(ab) * (float)s + m * ld_half(ab + 2);
            else acc[t] += d * ld_half(ab) * (float)s;
        }
    }
};

/* d, 16 bytes of nibbles: element j low nibble of byte j, element j + 16 the high one. */
struct q4_0_unpack {
    static constexpr int BYTES = 18;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int *q, float &d, float &m) {
        d = ld_half(w);
        m = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int v = ld_word<2>(w + 2 + 4 * k);
            q[k] = sub_bytes<8>(v & 0x0f0f0f0f);
            q[k + 4] = sub_bytes<8>((v >> 4) & 0x0f0f0f0f);
        }
    }
};

struct q4_1_unpack {
    static constexpr int BYTES = 20;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int *q, float &d, float &m) {
        d = ld_half(w);
        m = ld_half(w + 2);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int v = ld_word<4>(w + 4 + 4 * k);
            q[k] = v & 0x0f0f0f0f;
            q[k + 4] = (v >> 4) & 0x0f0f0f0f;
        }
    }
};

/* The fifth bit of element j is bit j of qh: spread 4 bits at a time onto bit 4 of 4 bytes. */
template <int QH, int QS>
__device__ __forceinline__ void unpack_q5(const uint8_t *w, int *q) {
    const uint32_t qh = (uint32_t)ld_word<2>(w + QH);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int v = ld_word<(QS % 4 == 0) ? 4 : 2>(w + QS + 4 * k);
        q[k] = (v & 0x0f0f0f0f) | (spread_bits((qh >> (4 * k)) & 0xf) << 4);
        q[k + 4] = ((v >> 4) & 0x0f0f0f0f) | (spread_bits((qh >> (16 + 4 * k)) & 0xf) << 4);
    }
}

struct q5_0_unpack {
    static constexpr int BYTES = 22;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int *q, float &d, float &m) {
        d = ld_half(w);
        m = 0.0f;
        unpack_q5<2, 6>(w, q);
#pragma unroll
        for (int k = 0; k < 8; k++) q[k] = sub_bytes<16>(q[k]);
    }
};

struct q5_1_unpack {
    static constexpr int BYTES = 24;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int *q, float &d, float &m) {
        d = ld_half(w);
        m = ld_half(w + 2);
        unpack_q5<4, 8>(w, q);
    }
};

struct q8_0_unpack {
    static constexpr int BYTES = 34;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void unpack(const uint8_t *w, int *q, float &d, float &m) {
        d = ld_half(w);
        m = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) q[k] = ld_word<2>(w + 2 + 4 * k);
    }
};

/* f(policy) with the policy class of a 32-element format. */
template <class F> static pshard_status with_legacy(enum quant_type type, F f) {
    switch (type) {
    case QUANT_Q4_0: return f(mv_legacy<q4_0_unpack>());
    case QUANT_Q4_1: return f(mv_legacy<q4_1_unpack>());
    case QUANT_Q5_0: return f(mv_legacy<q5_0_unpack>());
    case QUANT_Q5_1: return f(mv_legacy<q5_1_unpack>());
    case QUANT_Q8_0: return f(mv_legacy<q8_0_unpack>());
    default: return core_fail(PSHARD_ERR_INTERNAL, "matvec: %s is not a legacy format", quant_type_name(type));
    }
}

pshard_status mv_launch_legacy(enum quant_type type, int nt, const mv_args &a, dim3 grid, cudaStream_t st) {
    return with_legacy(type, [&](auto p) { return mv_launch<decltype(p)>(nt, a, grid, st); });
}

pshard_status moe_gate_up_legacy(enum quant_type type, int nt, const moe_fused_args &a, cudaStream_t st) {
    return with_legacy(type, [&](auto p) { return moe_gate_up_launch<decltype(p)>(nt, a, st); });
}

pshard_status moe_down_legacy(enum quant_type type, const moe_fused_args &a, cudaStream_t st) {
    return with_legacy(type, [&](auto p) { return moe_down_launch<decltype(p)>(a, st); });
}
