/* The expert groups' product on int8 tensor cores: Q4_0 weights against Q8_1 activations, the
 * integers the matrix-vector kernel dots by dp4a, multiplied 32 at a time by mma.sync m16n8k32
 * (s8 x s8 -> s32). A block computes 128 weight rows for one tile of up to 64 pairs (the tiles
 * of the fused GEMM: one expert's pairs, gemm.cuh's tile_rows), through two stages of shared
 * memory, each 8 blocks of 32 elements of the block's rows (raw bytes) and of its pairs'
 * activation rows (Q8_1 blocks), copied by cp.async while the other stage is multiplied. Each
 * warp owns 16 rows and the tile's pairs (up to 8 mma tiles of 8): per block of 32 elements, one mma a tile
 * gives each (row, pair) its integer dot, which the thread scales as the matrix-vector kernel
 * does, (d_w * d_a) * dot, and adds to its f32 sums in the order of the blocks.
 *
 * Fragments of mma.m16n8k32 with s8 operands (PTX ISA): lane L, g = L / 4, c = L % 4. A (16 x 32,
 * rows x k): word 0 row g, k 4c..4c+3; word 1 row g + 8, the same k; words 2 and 3 the same rows
 * at k 16 + 4c.. B (32 x 8, k x pairs): word 0 pair g, k 4c..; word 1 pair g, k 16 + 4c.. C: c0,
 * c1 row g, pairs 2c and 2c + 1; c2, c3 row g + 8. A Q4_0 block's byte j holds element j (low
 * nibble) and element j + 16 (high nibble), so one 4-byte load of bytes 4c.. gives both of a
 * row's words. */
#include "cuda/async_copy.cuh"
#include "cuda/gemm.cuh"

enum {
    MQ_ROWS = GEMM_TILE_N,  /* weight rows a block */
    MQ_PAIRS = GEMM_TILE_M, /* pairs a tile */
    MQ_BLOCKS = 8,          /* blocks of 32 elements a stage */
    MQ_THREADS = 256,
    MQ_W_BYTES = 18,        /* a Q4_0 block */
    MQ_A_BYTES = 36,        /* a Q8_1 block: d, s (f16), 32 quants */
    MQ_A_PITCH = MQ_BLOCKS * MQ_A_BYTES + 16, /* 76 words: the 8 pairs of an mma tile in 8 bank groups */
    MQ_W_STAGE = MQ_ROWS * MQ_BLOCKS * MQ_W_BYTES,
    MQ_A_STAGE = MQ_PAIRS * MQ_A_PITCH,
};
constexpr size_t MQ_SMEM = 2 * (size_t)(MQ_W_STAGE + MQ_A_STAGE);

__device__ __forceinline__ void mma_s8(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
#else
    (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
    c[0] = c[1] = c[2] = c[3] = 0; /* (never launched from code compiled below sm_80: cuda_int8_products) */
#endif
}

/* A row's 4c.. bytes of nibbles as the signed words q - 8: low nibbles (k 4c..) and high (16 + 4c..). */
__device__ __forceinline__ void q4_0_words(const uint8_t *block, int c, int &lo, int &hi) {
    const int v = ld_word<2>(block + 2 + 4 * c);
    lo = sub_bytes<8>(v & 0x0f0f0f0f);
    hi = sub_bytes<8>((v >> 4) & 0x0f0f0f0f);
}

__global__ void __launch_bounds__(MQ_THREADS, 2) mmq_q4_0_kernel(const gemm_args a) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int a_rows[MQ_PAIRS], o_rows[MQ_PAIRS];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int n0 = blockIdx.x * MQ_ROWS;
    __shared__ int n_valid; /* the tile's pairs: rows [0, n_valid) (tile_rows fills them in order) */
    const uint8_t *w = tile_rows(a, a_rows, o_rows);
    if (!w) return;
    __syncthreads();
    if (tid == 0) {
        int n = 0;
        while (n < MQ_PAIRS && a_rows[n] >= 0) n++;
        n_valid = n;
    }
    __syncthreads();
    /* Only the mma tiles of 8 pairs that hold a pair are multiplied: a decode step's expert has a
     * few pairs, and its block reads the weights for them once. Columns past n_valid are left as
     * they were in shared memory; a column of the product depends on its own pair alone, and
     * those are not stored. */
    const int tiles_used = (n_valid + 7) / 8;

    auto Ws = [&](int stage) { return smem + stage * (MQ_W_STAGE + MQ_A_STAGE); };
    auto As = [&](int stage) { return smem + stage * (MQ_W_STAGE + MQ_A_STAGE) + MQ_W_STAGE; };
    /* Stage s: blocks [8 s, +8) of every row (rows past n_rows copy the last row, not stored) and
     * of each of the tile's pairs' activation rows. */
    constexpr int W_RUN = MQ_BLOCKS * MQ_W_BYTES, A_RUN = MQ_BLOCKS * MQ_A_BYTES; /* 144 and 288 bytes */
    auto load = [&](int stage, int s) {
        uint8_t *ws = Ws(stage), *as = As(stage);
        for (int i = tid; i < MQ_ROWS * (W_RUN / a.mq_unit); i += MQ_THREADS) {
            const int r = i / (W_RUN / a.mq_unit), o = (i % (W_RUN / a.mq_unit)) * a.mq_unit;
            const int row = n0 + r < a.n_rows ? n0 + r : a.n_rows - 1;
            copy_unit(ws + r * W_RUN + o, w + (size_t)row * a.row_bytes + (size_t)s * W_RUN + o, a.mq_unit);
        }
        for (int i = tid; i < n_valid * (A_RUN / 16); i += MQ_THREADS) {
            const int p = i / (A_RUN / 16), o = (i % (A_RUN / 16)) * 16;
            copy_unit(as + p * MQ_A_PITCH + o, a.act + (size_t)a_rows[p] * a.act_row_bytes + (size_t)s * A_RUN + o, 16);
        }
        copy_commit();
    };

    float acc[MQ_PAIRS / 8][4];
#pragma unroll
    for (int j = 0; j < MQ_PAIRS / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int stages = a.n_cols / (32 * MQ_BLOCKS);
    const int r_lo = warp * 16 + g, r_hi = r_lo + 8; /* this thread's rows in the tile */
    load(0, 0);
    for (int s = 0; s < stages; s++) {
        if (s + 1 < stages) load((s + 1) & 1, s + 1);
        copy_wait(s + 1 < stages);
        __syncthreads(); /* stage s is complete */
        const uint8_t *ws = Ws(s & 1), *as = As(s & 1);
#pragma unroll 2
        for (int b = 0; b < MQ_BLOCKS; b++) {
            const uint8_t *wl = ws + r_lo * W_RUN + b * MQ_W_BYTES, *wh = ws + r_hi * W_RUN + b * MQ_W_BYTES;
            int a0, a1, a2, a3;
            q4_0_words(wl, c, a0, a2);
            q4_0_words(wh, c, a1, a3);
            const float d_lo = ld_half(wl), d_hi = ld_half(wh);
#pragma unroll
            for (int j = 0; j < MQ_PAIRS / 8; j++) {
                if (j >= tiles_used) break; /* (the same for the whole block) */
                const uint8_t *ab = as + (j * 8 + g) * MQ_A_PITCH + b * MQ_A_BYTES;
                const int b0 = *(const int *)(ab + 4 + 4 * c), b1 = *(const int *)(ab + 20 + 4 * c);
                int dot[4];
                mma_s8(dot, a0, a1, a2, a3, b0, b1);
                const float da0 = ld_half(as + (j * 8 + 2 * c) * MQ_A_PITCH + b * MQ_A_BYTES);
                const float da1 = ld_half(as + (j * 8 + 2 * c + 1) * MQ_A_PITCH + b * MQ_A_BYTES);
                acc[j][0] += d_lo * da0 * (float)dot[0];
                acc[j][1] += d_lo * da1 * (float)dot[1];
                acc[j][2] += d_hi * da0 * (float)dot[2];
                acc[j][3] += d_hi * da1 * (float)dot[3];
            }
        }
        __syncthreads(); /* every warp is done with stage s before it is loaded again */
    }
#pragma unroll
    for (int j = 0; j < MQ_PAIRS / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int p = j * 8 + 2 * c + (i & 1), row = n0 + (i < 2 ? r_lo : r_hi);
            if (o_rows[p] >= 0 && row < a.n_rows) a.y[(int64_t)o_rows[p] * a.y_stride + row] = acc[j][i];
        }
}

bool cuda_int8_products(enum quant_type type, int64_t n_cols) {
    /* The kernel as it will run was compiled for sm_80 or later (its PTX version): a device below
     * that, or one that JIT-compiles the build's compute_75 PTX, has no int8 mma in it. */
    static int compiled_for = -1; /* (one device a process) */
    if (compiled_for < 0) {
        cudaFuncAttributes fa;
        compiled_for = cudaFuncGetAttributes(&fa, mmq_q4_0_kernel) == cudaSuccess ? fa.ptxVersion : 0;
        cudaGetLastError();
    }
    return type == QUANT_Q4_0 && n_cols % (32 * MQ_BLOCKS) == 0 && compiled_for >= 80;
}

pshard_status mmq_run(const gemm_args &args, unsigned grid_y, cudaStream_t st) {
    CUDA_ARG(args.n_cols % (32 * MQ_BLOCKS) == 0 && args.act && args.act_row_bytes % 16 == 0 &&
                 (uintptr_t)args.act % 16 == 0,
             "int8 expert product: rows of %d elements (a multiple of 256) and 16-byte aligned Q8_1 rows needed",
             args.n_cols);
    if (grid_y == 0) return PSHARD_OK;
    gemm_args a = args;
    /* The widest copy every stage of every row starts on (rows of 8 blocks: 144 bytes). */
    a.mq_unit = 4;
    for (int u = 16; u > 4; u /= 2)
        if (a.row_bytes % u == 0 && (a.expert_ptrs || ((uintptr_t)a.w % u == 0 && a.expert_stride % u == 0))) {
            a.mq_unit = u;
            break;
        }
    CUDA_ARG(a.row_bytes % 4 == 0, "int8 expert product: rows of %zu bytes (a multiple of 4 needed)", a.row_bytes);
    CUDA_TRY(cudaFuncSetAttribute(mmq_q4_0_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MQ_SMEM));
    const dim3 grid((unsigned)ceil_div(a.n_rows, MQ_ROWS), grid_y);
    mmq_q4_0_kernel<<<grid, MQ_THREADS, MQ_SMEM, st>>>(a);
    CUDA_TRY_LAUNCH("int8 expert product");
    return PSHARD_OK;
}
