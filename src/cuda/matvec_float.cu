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

/* F32 weights for more than CUDA_MATVEC_MAX_TOKENS tokens (the MoE router of a prompt): a block
 * keeps FT_TOKENS tokens' activations in shared memory and walks up to 2 * FT_WARPS * FT_ROWS_PER_HALF rows against them, a
 * half-warp a row, so each row is read once per tile of tokens instead of once per pass of 8 and
 * the activations come from shared memory. Each half-warp's lane L sums exactly what lane L of the
 * matrix-vector kernel sums for F32 (its rows are staged in chunks of `chunk` items of 32
 * elements, at most 16, and lane L takes item L of each chunk), in the same order, and the half's
 * sum is warp_sum's with the idle upper half's zeros: so each token's sums are the decode step's,
 * bit for bit. An item of a token lies FT_PITCH floats from the next (four floats of padding), so
 * the 16 lanes' loads of one 16-byte piece fall in different banks. A half-warp takes 1 to
 * FT_ROWS_PER_HALF rows, fewer where the tiles of tokens alone leave SMs without a block (a
 * decode step of 64 sequences: 8 tiles). */
enum { FT_TOKENS = 8, FT_WARPS = 8, FT_ROWS_PER_HALF = 4, FT_PITCH = 36, FT_FILL_BLOCKS = 132 };

__global__ void __launch_bounds__(32 * FT_WARPS)
    mv_f32_tiled_kernel(const float *w, int64_t w_stride, int n_rows, int rows_per_half, int n_items, int chunk,
                        const float *x, int n_tokens, float *y, int64_t y_stride) {
    dep_enter();
    extern __shared__ float4 xs[]; /* [FT_TOKENS][n_items][FT_PITCH / 4] */
    const int t0 = blockIdx.y * FT_TOKENS, nt = min(FT_TOKENS, n_tokens - t0);
    const int pieces = n_items * 8; /* 16-byte pieces of a token's row */
    for (int i = threadIdx.x; i < FT_TOKENS * pieces; i += 32 * FT_WARPS) {
        const int t = i / pieces, p = i % pieces; /* tokens past the last repeat it, unstored */
        const float4 *xt = (const float4 *)(x + (int64_t)(t0 + min(t, nt - 1)) * n_items * 32);
        xs[(t * n_items + p / 8) * (FT_PITCH / 4) + p % 8] = xt[p];
    }
    __syncthreads();
    const int half = threadIdx.x / 16, hl = threadIdx.x % 16;
    const unsigned mask = 0xffffu << (threadIdx.x % 32 / 16 * 16);
    for (int rr = 0; rr < rows_per_half; rr++) {
        const int row = (blockIdx.x * rows_per_half + rr) * 2 * FT_WARPS + half;
        if (row >= n_rows) break; /* (the whole half) */
        const uint4 *wr = (const uint4 *)(w + row * w_stride);
        float acc[FT_TOKENS];
#pragma unroll
        for (int t = 0; t < FT_TOKENS; t++) acc[t] = 0.0f;
        for (int b0 = 0; b0 < n_items; b0 += chunk) {
            const int item = b0 + hl;
            if (hl >= min(chunk, n_items - b0)) continue;
            uint4 wv[8];
#pragma unroll
            for (int i = 0; i < 8; i++) wv[i] = __ldg(wr + item * 8 + i);
#pragma unroll
            for (int t = 0; t < FT_TOKENS; t++) {
                const float4 *xv = xs + (t * n_items + item) * (FT_PITCH / 4);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float4 a = xv[i];
                    s += f32_dot::dot16(wv[i], make_uint4(__float_as_uint(a.x), __float_as_uint(a.y), __float_as_uint(a.z),
                                                          __float_as_uint(a.w)));
                }
                acc[t] += s;
            }
        }
#pragma unroll
        for (int t = 0; t < FT_TOKENS; t++) {
            float v = acc[t] + 0.0f; /* (warp_sum's first step: the upper half's lanes hold 0) */
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
            if (hl == 0 && t < nt) y[(int64_t)(t0 + t) * y_stride + row] = v;
        }
    }
}

/* F32 weights for 1..8 tokens (the MoE router of a decode step): a block a row, warp c its chunk
 * c, so all of a row's loads are in flight at once where the matrix-vector kernel's warp walks its
 * chunks one after another. Lane L of each warp sums item L of its chunk as the matrix-vector
 * kernel's lane L does, and the first warp adds the chunks' sums in chunk order before warp_sum's
 * steps: the same bits. */
enum { FR_MAX_CHUNKS = 16 }; /* rows up to 8,192 columns */
__global__ void __launch_bounds__(32 * FR_MAX_CHUNKS)
    mv_f32_row_kernel(const float *w, int64_t w_stride, int n_items, int chunk, const float *x, int n_tokens, float *y,
                      int64_t y_stride) {
    dep_release();
    __shared__ float part[FR_MAX_CHUNKS][CUDA_MATVEC_MAX_TOKENS][16];
    const int c = threadIdx.x / 32, lane = threadIdx.x % 32, row = blockIdx.x, item = c * chunk + lane;
    const int n_chunks = blockDim.x / 32;
    if (lane < 16) {
        float s[CUDA_MATVEC_MAX_TOKENS];
        if (lane < min(chunk, n_items - c * chunk)) {
            const uint4 *wr = (const uint4 *)(w + row * w_stride + (int64_t)item * 32);
            uint4 wv[8];
#pragma unroll
            for (int i = 0; i < 8; i++) wv[i] = __ldg(wr + i);
            dep_wait(); /* the weights' loads in flight before the activations are ready */
#pragma unroll
            for (int t = 0; t < CUDA_MATVEC_MAX_TOKENS; t++) {
                s[t] = 0.0f;
                if (t < n_tokens) {
                    const uint4 *xv = (const uint4 *)(x + ((int64_t)t * n_items + item) * 32);
#pragma unroll
                    for (int i = 0; i < 8; i++) s[t] += f32_dot::dot16(wv[i], xv[i]);
                }
            }
        } else {
#pragma unroll
            for (int t = 0; t < CUDA_MATVEC_MAX_TOKENS; t++) s[t] = 0.0f;
        }
        if (c > 0)
#pragma unroll
            for (int t = 0; t < CUDA_MATVEC_MAX_TOKENS; t++) part[c][t][lane] = s[t];
        else
#pragma unroll
            for (int t = 0; t < CUDA_MATVEC_MAX_TOKENS; t++) part[0][t][lane] = 0.0f + s[t];
    }
    dep_wait(); /* (every thread, loads or not) */
    __syncthreads();
    if (c > 0) return;
    for (int t = 0; t < n_tokens; t++) {
        float acc = lane < 16 ? part[0][t][lane] : 0.0f;
        for (int k = 1; k < n_chunks; k++)
            if (lane < min(chunk, n_items - k * chunk)) acc += part[k][t][lane];
        const float v = warp_sum(acc);
        if (lane == 0) y[(int64_t)t * y_stride + row] = v;
    }
}

/* What both F32 kernels here take: one dense matrix, not added into, rows and activations read as
 * 16-byte vectors. */
static bool mv_f32_plain(const mv_args &a, int64_t n_cols) {
    return !a.pairs && !a.accumulate && a.n_parts <= 1 && a.aligned && (uintptr_t)a.act % 16 == 0 &&
           a.act_row_bytes == (size_t)n_cols * 4;
}

/* Whether the F32 kernel of a block a row takes a call: 1..8 tokens, at most FR_MAX_CHUNKS chunks. */
bool mv_f32_rows(const mv_args &a, int64_t n_cols) {
    return a.n_tokens <= CUDA_MATVEC_MAX_TOKENS && mv_f32_plain(a, n_cols) &&
           ceil_div(n_cols / 32, a.chunk_blocks) <= FR_MAX_CHUNKS;
}

pshard_status mv_f32_by_rows(const mv_args &a, int64_t n_cols, cudaStream_t st) {
    const int n_items = (int)(n_cols / 32), n_chunks = (int)ceil_div(n_items, a.chunk_blocks);
    CUDA_TRY(launch_dep(mv_f32_row_kernel, (unsigned)a.n_rows, 32 * n_chunks, 0, st, (const float *)a.w,
                        (int64_t)a.row_bytes / 4, n_items, a.chunk_blocks, (const float *)a.act, a.n_tokens, a.y,
                        a.y_stride));
    return PSHARD_OK;
}

/* Whether the tiled F32 kernel takes a call: more than 8 tokens, its tile within the shared memory
 * a block may have on this device (qwen30b's router: 72 KB; qwen235b's: 144 KB). */
bool mv_f32_tiles(const mv_args &a, int64_t n_cols) {
    if (a.n_tokens <= CUDA_MATVEC_MAX_TOKENS || !mv_f32_plain(a, n_cols)) return false;
    int device = 0, limit = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
        return false;
    return sizeof(float) * FT_TOKENS * (size_t)(n_cols / 32) * FT_PITCH <= (size_t)limit;
}

pshard_status mv_f32_tiled(const mv_args &a, int64_t n_cols, cudaStream_t st) {
    const int n_items = (int)(n_cols / 32);
    const size_t smem = sizeof(float) * FT_TOKENS * (size_t)n_items * FT_PITCH;
    CUDA_TRY(cudaFuncSetAttribute(mv_f32_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t tiles = ceil_div(a.n_tokens, FT_TOKENS), row_groups = ceil_div(a.n_rows, 2 * FT_WARPS);
    int64_t per_half = ceil_div(row_groups * tiles, FT_FILL_BLOCKS); /* rows a half-warp takes, FT_FILL_BLOCKS blocks at least */
    per_half = per_half < 1 ? 1 : per_half > FT_ROWS_PER_HALF ? FT_ROWS_PER_HALF : per_half;
    const dim3 grid((unsigned)ceil_div(row_groups, per_half), (unsigned)tiles);
    CUDA_TRY(launch_dep(mv_f32_tiled_kernel, grid, 32 * FT_WARPS, smem, st, (const float *)a.w,
                        (int64_t)a.row_bytes / 4, a.n_rows, (int)per_half, n_items, a.chunk_blocks,
                        (const float *)a.act, a.n_tokens, a.y, a.y_stride));
    return PSHARD_OK;
}
