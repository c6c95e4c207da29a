/* Matrix-vector dots of the float formats: F16 and BF16 weights with activations rounded to the
 * same format (as the CPU does), F32 with F32; products and sums in f32. An item is 32
 * elements, read as 16-byte vectors from the staged row and from the activations. */
#include "cuda/moe_fused.cuh"

template <class U> struct mv_float {
    static constexpr int BYTES = U::BYTES, IPB = 1, ACT_BYTES = U::BYTES;
    static constexpr int VECS = BYTES / 16;

    template <int NT>
    static __device__ __forceinline__ void dot(const uint8_t *w, int, const uint8_t *const *arow, int64_t aoff,
                                               float *acc) {
        uint4 wv[VECS];
#pragma unroll
        for (int i = 0; i < VECS; i++) wv[i] = ((const uint4 *)w)[i];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint4 *av = (const uint4 *)(arow[t] + aoff);
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < VECS; i++) s += U::dot16(wv[i], av[i]); /* (shared memory in the fused MoE) */
            acc[t] += s;
        }
    }
};

struct f16_dot {
    static constexpr int BYTES = 64;
    static __device__ __forceinline__ float dot16(uint4 w, uint4 a) {
        const __half2 *wh = (const __half2 *)&w, *ah = (const __half2 *)&a;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 wf = __half22float2(wh[i]), af = __half22float2(ah[i]);
            s += wf.x * af.x + wf.y * af.y;
        }
        return s;
    }
};

struct bf16_dot {
    static constexpr int BYTES = 64;
    static __device__ __forceinline__ float dot16(uint4 w, uint4 a) {
        const uint32_t *wu = (const uint32_t *)&w, *au = (const uint32_t *)&a;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s += __uint_as_float(wu[i] << 16) * __uint_as_float(au[i] << 16);
            s += __uint_as_float(wu[i] & 0xffff0000u) * __uint_as_float(au[i] & 0xffff0000u);
        }
        return s;
    }
};

struct f32_dot {
    static constexpr int BYTES = 128;
    static __device__ __forceinline__ float dot16(uint4 w, uint4 a) {
        return __uint_as_float(w.x) * __uint_as_float(a.x) + __uint_as_float(w.y) * __uint_as_float(a.y) +
               __uint_as_float(w.z) * __uint_as_float(a.z) + __uint_as_float(w.w) * __uint_as_float(a.w);
    }
};

/* f(policy) with the policy class of a float type. */
template <class F> static pshard_status with_float(enum quant_type type, F f) {
    switch (type) {
    case QUANT_F16: return f(mv_float<f16_dot>());
    case QUANT_BF16: return f(mv_float<bf16_dot>());
    case QUANT_F32: return f(mv_float<f32_dot>());
    default: return core_fail(PSHARD_ERR_INTERNAL, "matvec: %s is not a float format", quant_type_name(type));
    }
}

pshard_status mv_launch_float(enum quant_type type, int nt, const mv_args &a, dim3 grid, cudaStream_t st) {
    return with_float(type, [&](auto p) { return mv_launch<decltype(p)>(nt, a, grid, st); });
}

pshard_status moe_gate_up_float(enum quant_type type, int nt, const moe_fused_args &a, cudaStream_t st) {
    return with_float(type, [&](auto p) { return moe_gate_up_launch<decltype(p)>(nt, a, st); });
}

pshard_status moe_down_float(enum quant_type type, const moe_fused_args &a, cudaStream_t st) {
    return with_float(type, [&](auto p) { return moe_down_launch<decltype(p)>(a, st); });
}
