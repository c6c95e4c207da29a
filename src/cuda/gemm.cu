/* Prefill GEMM on tensor cores with the weights dequantized on the fly: y = x . W^T for many
 * tokens, W in any format. A block computes 64 tokens x 128 weight rows in steps of 64
 * elements, through two stages of shared memory: while 8 warps multiply one stage with WMMA
 * (f16 in, f32 accumulate, each warp a 32 x 32 piece), the next stage's activation tile arrives
 * by asynchronous copies (cp.async) and its weight tile, dequantized in registers the step
 * before (dq8, exact values rounded once to f16), is stored, and the weights of the step after
 * are read; one barrier a step. The products are summed in the order of the elements, 16 at a
 * time, whatever the step. No scratch memory: the same kernel serves the MoE expert groups, its
 * token rows gathered through the pair list.
 *
 * Block formats whose rows allow copies of 4 bytes or more take a second kernel (gemm_raw_kernel)
 * that never reads weights from global memory one thread a row: each 256 elements of the block's
 * 128 rows arrive as raw bytes, copied by the whole block in contiguous runs (cp.async, two
 * stages), and the weight tiles are dequantized from shared memory. Same tiles, same order, same
 * bits. */
#include "cuda/async_copy.cuh"
#include "cuda/dequant.cuh"
#include "cuda/gemm.cuh"

#include <mma.h>

using namespace nvcuda;

enum { GK = 64, GLD = GK + 8, CLD = GEMM_TILE_N + 4, G_THREADS = 256 };
/* A stage: the 64 x 64 activation tile, then the 128 x 64 weight tile (f16, rows padded to GLD);
 * after the loop the 64 x 128 f32 result tile reuses the same memory. */
constexpr int STAGE_HALVES = (GEMM_TILE_M + GEMM_TILE_N) * GLD;
constexpr size_t GEMM_SMEM = 2 * STAGE_HALVES * sizeof(__half) > GEMM_TILE_M * CLD * sizeof(float)
                                 ? 2 * STAGE_HALVES * sizeof(__half)
                                 : GEMM_TILE_M * CLD * sizeof(float);

/* A warp's 32 x 32 piece of the result. */
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_tile[2][2];

/* One step: the warp's piece += its rows of the activation tile . its rows of the weight tile,
 * 16 elements at a time in order. */
__device__ __forceinline__ void mma_step(acc_tile &acc, const __half *as, const __half *bs, int wm, int wn) {
#pragma unroll
    for (int kk = 0; kk < GK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], as + (wm * 32 + 16 * i) * GLD + kk, GLD);
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], bs + (wn * 32 + 16 * j) * GLD + kk, GLD);
#pragma unroll
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
}

/* The result tile through shared memory Cs (free: every warp is past its last step) into y. */
__device__ __forceinline__ void store_tile(const gemm_args &a, acc_tile &acc, float *Cs, const int *o_rows, int wm,
                                           int wn) {
    constexpr int GN = GEMM_TILE_N;
    const int n0 = blockIdx.x * GN;
#pragma unroll
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm * 32 + 16 * i) * CLD + wn * 32 + 16 * j, acc[i][j], CLD, wmma::mem_row_major);
    __syncthreads();
    for (int idx = threadIdx.x; idx < GEMM_TILE_M * GN; idx += G_THREADS) {
        const int r = idx / GN, c = idx % GN;
        if (o_rows[r] >= 0 && n0 + c < a.n_rows) a.y[(int64_t)o_rows[r] * a.y_stride + n0 + c] = Cs[r * CLD + c];
    }
}

/* Sixteen zero bytes in global memory: the source of a tile row that has no activations. */
__device__ const uint4 zero16 = {0, 0, 0, 0};

/* 16 bytes from global to shared memory (zeros where src is NULL); asynchronous from sm_80
 * (cp.async, committed by copy_commit, waited for by copy_wait), at once before. From sm_80 a row
 * without activations reads nothing: the copy's source size is 0, so it writes sixteen zeros (every
 * block reading zero16 through L2 at once took qwen30b's 2,626-token prompt from 332 ms to 627 on an
 * H100). */
__device__ __forceinline__ void copy16(__half *dst, const __half *src) {
    const void *from = src ? (const void *)src : (const void *)&zero16;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(from), "r"(src ? 16 : 0));
#else
    *(uint4 *)dst = *(const uint4 *)from;
#endif
}

/* Commits copies of the activation tile of elements [k0, +64) into As (64 rows x 8 vectors of 8
 * halves, two vectors a thread; zeros for rows without a pair and past n_cols). */
__device__ __forceinline__ void stage_activations(const gemm_args &a, const int *a_rows, __half *As, int k0) {
#pragma unroll
    for (int v = threadIdx.x; v < GEMM_TILE_M * GK / 8; v += G_THREADS) {
        const int r = v / (GK / 8), c = (v % (GK / 8)) * 8;
        copy16(As + r * GLD + c,
               a_rows[r] >= 0 && k0 + c < a.n_cols ? a.x + (int64_t)a_rows[r] * a.x_stride + k0 + c : nullptr);
    }
    copy_commit();
}

template <int TYPE> __global__ void __launch_bounds__(G_THREADS, 3) gemm_kernel(const gemm_args a) {
    constexpr int GM = GEMM_TILE_M, GN = GEMM_TILE_N;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int a_rows[GM], o_rows[GM];
    const int tid = threadIdx.x, warp = tid / 32;
    const int n0 = blockIdx.x * GN;
    const uint8_t *w = tile_rows(a, a_rows, o_rows);
    if (!w) return;
    __syncthreads();

    auto As = [&](int stage) { return (__half *)smem + stage * STAGE_HALVES; };
    auto Bs = [&](int stage) { return (__half *)smem + stage * STAGE_HALVES + GM * GLD; };
    /* Weights: 128 rows x 2 runs of 32 elements (n_cols is a multiple of 32, so a run is all in
     * or all past the end); a row past n_rows reads the last row, whose results are not stored. */
    const int br = tid / 2, bc = (tid % 2) * 32;
    const uint8_t *b_src = w + (size_t)(n0 + br < a.n_rows ? n0 + br : a.n_rows - 1) * a.row_bytes;
    uint4 b_reg[4];
    auto fetch_b = [&](int k0) {
        const bool in = k0 + bc < a.n_cols;
        const int k = in ? k0 + bc : a.n_cols - 32;
#pragma unroll
        for (int h = 0; h < 4; h++) {
            float f[8];
            dq8<TYPE>(b_src, k + 8 * h, f);
            __half2 *o = (__half2 *)&b_reg[h];
#pragma unroll
            for (int i = 0; i < 4; i++) o[i] = in ? __floats2half2_rn(f[2 * i], f[2 * i + 1]) : __float2half2_rn(0.0f);
        }
    };
    auto store_b = [&](int stage) {
#pragma unroll
        for (int h = 0; h < 4; h++) *(uint4 *)(Bs(stage) + br * GLD + bc + 8 * h) = b_reg[h];
    };

    acc_tile acc;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const int wm = warp / 4, wn = warp % 4;
    const int steps = (a.n_cols + GK - 1) / GK;
    stage_activations(a, a_rows, As(0), 0);
    fetch_b(0);
    store_b(0);
    fetch_b(GK);
    for (int s = 0; s < steps; s++) {
        const int cur = s & 1, nxt = cur ^ 1;
        copy_wait();
        __syncthreads(); /* stage cur is complete; every warp is done with stage nxt */
        if (s + 1 < steps) {
            stage_activations(a, a_rows, As(nxt), (s + 1) * GK);
            store_b(nxt);
            fetch_b((s + 2) * GK); /* past the end: zeros, never stored */
        }
        const __half *as = As(cur), *bs = Bs(cur);
        mma_step(acc, as, bs, wm, wn);
    }
    __syncthreads();
    store_tile(a, acc, (float *)smem, o_rows, wm, wn);
}

/* ---- block formats from raw bytes in shared memory */

template <int TYPE> __host__ __device__ constexpr int raw_block_elems() {
    return TYPE == QUANT_Q2_K || TYPE == QUANT_Q3_K || TYPE == QUANT_Q4_K || TYPE == QUANT_Q5_K || TYPE == QUANT_Q6_K ? 256 : 32;
}
template <int TYPE> __host__ __device__ constexpr int raw_block_bytes() {
    return TYPE == QUANT_Q4_0 ? 18 : TYPE == QUANT_Q4_1 ? 20 : TYPE == QUANT_Q5_0 ? 22 : TYPE == QUANT_Q5_1 ? 24
         : TYPE == QUANT_Q2_K ? 84 : TYPE == QUANT_Q4_K ? 144 : TYPE == QUANT_Q5_K ? 176 : 0;
}
/* Elements a raw stage holds, its bytes a row and their pitch in shared memory. */
enum { RAW_K = 256, RAW_SUB = RAW_K / GK };
template <int TYPE> __host__ __device__ constexpr int raw_bytes() { return RAW_K / raw_block_elems<TYPE>() * raw_block_bytes<TYPE>(); }
template <int TYPE> __host__ __device__ constexpr int raw_pitch() { return (raw_bytes<TYPE>() + 15) / 16 * 16; }
template <int TYPE> constexpr size_t raw_smem() {
    return (size_t)2 * GEMM_TILE_N * raw_pitch<TYPE>() + 2 * STAGE_HALVES * sizeof(__half);
}

static bool raw_type(enum quant_type t) {
    switch (t) {
    case QUANT_Q4_0: case QUANT_Q4_1: case QUANT_Q5_0: case QUANT_Q5_1: case QUANT_Q2_K: case QUANT_Q4_K: case QUANT_Q5_K:
        return true;
    default: return false; /* float rows load 16 bytes at once already; Q8_0's stages would not fit two blocks an SM; Q3_K, Q6_K rows are 2-byte aligned */
    }
}

/* n_cols a multiple of RAW_K; every row start and RAW_K's bytes a multiple of `unit`.
 * Step s multiplies the 64 elements [64 s, +64): its activation tile was copied and its weight
 * tile dequantized in step s - 1; raw stage c holds elements [256 c, +256), copied in the last
 * step of stage c - 1's use (4 c - 1), waited for one step later. */
template <int TYPE> __global__ void __launch_bounds__(G_THREADS, 2) gemm_raw_kernel(const gemm_args a, int unit) {
    constexpr int GM = GEMM_TILE_M, GN = GEMM_TILE_N, RB = raw_bytes<TYPE>(), RP = raw_pitch<TYPE>();
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int a_rows[GM], o_rows[GM];
    const int tid = threadIdx.x, warp = tid / 32;
    const int n0 = blockIdx.x * GN;
    const uint8_t *w = tile_rows(a, a_rows, o_rows);
    if (!w) return;
    __syncthreads();

    uint8_t *raw = smem;                                          /* 2 stages of GN rows x RP bytes */
    __half *tiles = (__half *)(smem + (size_t)2 * GN * RP);       /* 2 stages of A then B tiles */
    auto As = [&](int stage) { return tiles + stage * STAGE_HALVES; };
    auto Bs = [&](int stage) { return tiles + stage * STAGE_HALVES + GM * GLD; };
    const int per_row = RB / unit;
    /* Rows past n_rows copy the last row; their results are not stored. */
    auto stage_raw = [&](int stage, int c) {
        for (int i = tid; i < GN * per_row; i += G_THREADS) {
            const int r = i / per_row, o = (i - r * per_row) * unit;
            const int row = n0 + r < a.n_rows ? n0 + r : a.n_rows - 1;
            copy_unit(raw + stage * GN * RP + r * RP + o, w + (size_t)row * a.row_bytes + (size_t)c * RB + o, unit);
        }
        copy_commit();
    };
    /* Weight tile of step s into B stage s & 1: a thread dequantizes 32 elements of one row. */
    const int br = tid / 2, bc = (tid % 2) * 32;
    auto dequant_b = [&](int s) {
        const uint8_t *src = raw + ((s / RAW_SUB) & 1) * GN * RP + br * RP;
        __half *dst = Bs(s & 1) + br * GLD + bc;
#pragma unroll
        for (int h = 0; h < 4; h++) {
            float f[8];
            dq8<TYPE>(src, (s % RAW_SUB) * GK + bc + 8 * h, f);
            uint4 v;
            __half2 *o = (__half2 *)&v;
#pragma unroll
            for (int i = 0; i < 4; i++) o[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
            *(uint4 *)(dst + 8 * h) = v;
        }
    };

    acc_tile acc;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const int wm = warp / 4, wn = warp % 4;
    const int steps = a.n_cols / GK, n_raw = a.n_cols / RAW_K;
    stage_raw(0, 0);
    stage_activations(a, a_rows, As(0), 0);
    copy_wait();
    __syncthreads();
    dequant_b(0);
    if (n_raw > 1) stage_raw(1, 1);
    for (int s = 0; s < steps; s++) {
        const int c = s / RAW_SUB;
        /* At a stage's first step the next raw stage, committed last, may still be in flight. */
        copy_wait(s % RAW_SUB == 0 && c + 1 < n_raw);
        __syncthreads(); /* step s's tiles are complete; every warp is done with step s - 1's */
        if (s + 1 < steps) stage_activations(a, a_rows, As((s + 1) & 1), (s + 1) * GK);
        if (s % RAW_SUB == RAW_SUB - 1 && c + 2 < n_raw) stage_raw(c & 1, c + 2); /* stage c was last read in step s - 1 */
        if (s + 1 < steps) dequant_b(s + 1);
        const __half *as = As(s & 1), *bs = Bs(s & 1);
        mma_step(acc, as, bs, wm, wn);
    }
    __syncthreads();
    store_tile(a, acc, (float *)smem, o_rows, wm, wn);
}

bool gemm_reads_raw(enum quant_type type, int64_t n_cols) { return raw_type(type) && n_cols % RAW_K == 0; }

/* The widest copy (16, 8 or 4 bytes) every raw stage of every row starts on; 0: none (the
 * register kernel runs). Expert tables (staging slots) start their matrices on 16 bytes. */
static int raw_unit(enum quant_type type, const gemm_args &a) {
    if (!raw_type(type) || a.n_cols % RAW_K != 0) return 0;
    const int stage_bytes = RAW_K / cuda_block_elems(type) * cuda_block_bytes(type);
    for (int u = 16; u >= 4; u /= 2)
        if (a.row_bytes % u == 0 && stage_bytes % u == 0 &&
            (a.expert_ptrs || ((uintptr_t)a.w % u == 0 && a.expert_stride % u == 0)))
            return u;
    return 0;
}


pshard_status gemm_fused_run(enum quant_type type, const gemm_args &a, unsigned grid_y, cudaStream_t st) {
    CUDA_ARG(a.n_cols % 32 == 0 && a.n_cols > 0, "GEMM: rows of %d elements (a multiple of 32 is needed)", a.n_cols);
    CUDA_ARG(a.x_stride % 8 == 0 && (uintptr_t)a.x % 16 == 0, "GEMM: f16 activations must be 16-byte aligned");
    if (grid_y == 0) return PSHARD_OK;
    const dim3 grid((unsigned)ceil_div(a.n_rows, GEMM_TILE_N), grid_y);
    if (const int unit = raw_unit(type, a)) {
#define RAW(T)                                                                                                \
    CUDA_TRY(cudaFuncSetAttribute(gemm_raw_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)raw_smem<T>())); \
    gemm_raw_kernel<T><<<grid, G_THREADS, raw_smem<T>(), st>>>(a, unit)
        switch (type) {
        case QUANT_Q4_0: RAW(QUANT_Q4_0); break;
        case QUANT_Q4_1: RAW(QUANT_Q4_1); break;
        case QUANT_Q5_0: RAW(QUANT_Q5_0); break;
        case QUANT_Q5_1: RAW(QUANT_Q5_1); break;
        case QUANT_Q2_K: RAW(QUANT_Q2_K); break;
        case QUANT_Q4_K: RAW(QUANT_Q4_K); break;
        case QUANT_Q5_K: RAW(QUANT_Q5_K); break;
        default: break;
        }
#undef RAW
        CUDA_TRY_LAUNCH("gemm");
        return PSHARD_OK;
    }
#define LAUNCH(T)                                                                                             \
    CUDA_TRY(cudaFuncSetAttribute(gemm_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMM_SMEM)); \
    gemm_kernel<T><<<grid, G_THREADS, GEMM_SMEM, st>>>(a)
    switch (type) {
        CUDA_TYPE_CASES(LAUNCH)
    default: return core_fail(PSHARD_ERR_UNSUPPORTED, "GEMM: no GPU kernel for %s", quant_type_name(type));
    }
#undef LAUNCH
    CUDA_TRY_LAUNCH("gemm");
    return PSHARD_OK;
}
