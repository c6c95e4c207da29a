/* Prefill GEMM on tensor cores with the weights dequantized on the fly: y = x . W^T for many
 * tokens, W in any format. A block computes 64 tokens x 128 weight rows; per step of 32
 * elements it dequantizes its 128 x 32 weight tile to f16 in shared memory (dq8, exact values
 * rounded once to f16), loads the 64 x 32 f16 activation tile, and 8 warps multiply with WMMA
 * (f16 in, f32 accumulate), each warp a 32 x 32 piece. The next step's tiles are fetched into
 * registers while the current one is multiplied. No scratch memory: the same kernel serves
 * the MoE expert groups, its token rows gathered through the pair list. */
#include "cuda/dequant.cuh"
#include "cuda/gemm.cuh"

#include <mma.h>

using namespace nvcuda;

enum { GK = 32, GLD = GK + 8, CLD = GEMM_TILE_N + 4, G_THREADS = 256 };

template <int TYPE> __global__ void __launch_bounds__(G_THREADS) gemm_kernel(const gemm_args a) {
    constexpr int GM = GEMM_TILE_M, GN = GEMM_TILE_N;
    /* The A/B tiles and, after the loop, the C tile share one buffer. */
    __shared__ __align__(128) uint8_t smem[GM * CLD * 4];
    __shared__ int a_rows[GM], o_rows[GM];
    __half *As = (__half *)smem, *Bs = As + GM * GLD;
    float *Cs = (float *)smem;
    const int tid = threadIdx.x, warp = tid / 32;
    const int n0 = blockIdx.x * GN;
    const uint8_t *w = a.w;
    if (a.pairs) {
        const int tile = blockIdx.y;
        if (tile >= *a.n_tiles) return;
        const int e = a.tile_expert[tile], start = a.tile_start[tile], end = a.expert_start[e + 1];
        w = a.expert_ptrs ? (const uint8_t *)a.expert_ptrs[e] : a.w + (size_t)e * a.expert_stride;
        if (tid < GM) {
            const int p = start + tid < end ? a.pairs[start + tid] : -1;
            a_rows[tid] = p >= 0 ? p / a.act_div : -1;
            o_rows[tid] = p;
        }
    } else if (tid < GM) {
        const int t = blockIdx.y * GM + tid;
        a_rows[tid] = o_rows[tid] = t < a.n_tokens ? t : -1;
    }
    __syncthreads();

    /* Loader roles: A is 64 rows x 4 vectors of 8 halves, B 128 rows x 2 runs of 16. */
    const int ar = tid / 4, ac = (tid % 4) * 8;
    const int br = tid / 2, bc = (tid % 2) * 16;
    const __half *a_src = a_rows[ar] >= 0 ? a.x + (int64_t)a_rows[ar] * a.x_stride : nullptr;
    const uint8_t *b_src = n0 + br < a.n_rows ? w + (size_t)(n0 + br) * a.row_bytes : nullptr;
    uint4 a_reg, b_reg[2];
    auto fetch = [&](int k0) {
        a_reg = a_src ? *(const uint4 *)(a_src + k0 + ac) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float f[8];
            if (b_src) dq8<TYPE>(b_src, k0 + bc + 8 * h, f);
            else for (int i = 0; i < 8; i++) f[i] = 0.0f;
            __half2 *o = (__half2 *)&b_reg[h];
#pragma unroll
            for (int i = 0; i < 4; i++) o[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const int wm = warp / 4, wn = warp % 4;
    fetch(0);
    for (int k0 = 0; k0 < a.n_cols; k0 += GK) {
        __syncthreads(); /* the previous step's fragments are loaded */
        *(uint4 *)(As + ar * GLD + ac) = a_reg;
        *(uint4 *)(Bs + br * GLD + bc) = b_reg[0];
        *(uint4 *)(Bs + br * GLD + bc + 8) = b_reg[1];
        __syncthreads();
        if (k0 + GK < a.n_cols) fetch(k0 + GK);
#pragma unroll
        for (int kk = 0; kk < GK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], As + (wm * 32 + 16 * i) * GLD + kk, GLD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], Bs + (wn * 32 + 16 * j) * GLD + kk, GLD);
#pragma unroll
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm * 32 + 16 * i) * CLD + wn * 32 + 16 * j, acc[i][j], CLD, wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < GM * GN; idx += G_THREADS) {
        const int r = idx / GN, c = idx % GN;
        if (o_rows[r] >= 0 && n0 + c < a.n_rows) a.y[(int64_t)o_rows[r] * a.y_stride + n0 + c] = Cs[r * CLD + c];
    }
}

pshard_status gemm_fused_run(enum quant_type type, const gemm_args &a, unsigned grid_y, cudaStream_t st) {
    CUDA_ARG(a.n_cols % GK == 0, "GEMM: rows of %d elements (a multiple of %d is needed)", a.n_cols, (int)GK);
    CUDA_ARG(a.x_stride % 8 == 0 && (uintptr_t)a.x % 16 == 0, "GEMM: f16 activations must be 16-byte aligned");
    if (grid_y == 0) return PSHARD_OK;
    const dim3 grid((unsigned)ceil_div(a.n_rows, GEMM_TILE_N), grid_y);
#define LAUNCH(T) gemm_kernel<T><<<grid, G_THREADS, 0, st>>>(a)
    switch (type) {
        CUDA_TYPE_CASES(LAUNCH)
    default: return core_fail(PSHARD_ERR_UNSUPPORTED, "GEMM: no GPU kernel for %s", quant_type_name(type));
    }
#undef LAUNCH
    CUDA_TRY_LAUNCH("gemm");
    return PSHARD_OK;
}
