/* The expert groups' product on int8 tensor cores: quantized weights against the activations the
 * matrix-vector kernel dots (Q8_1 for Q4_0, Q8_K for the K formats), the same integers multiplied
 * 32 at a time by mma.sync m16n8k32 (s8 x s8 -> s32). A block computes 128 weight rows for one
 * tile of up to 64 pairs (the tiles of the fused GEMM: one expert's pairs, gemm.cuh's tile_rows),
 * through two stages of shared memory, each 256 elements of the block's rows (raw bytes: 8 Q4_0
 * blocks or one K super-block) and of its pairs' activation rows, copied by cp.async while the
 * other stage is multiplied. Each warp owns 16 rows and the tile's pairs (up to 8 mma tiles of 8):
 * per part of 32 elements, one mma a tile gives each (row, pair) its integer dot, which the thread
 * scales as the matrix-vector kernel does and adds to its f32 sums in the order of the parts:
 *   Q4_0:  d_w * d_a * dot
 *   K:     d * sc * d_a * dot - dmin * d_a * (m0 * bsum0 + m1 * bsum1)
 * (Q2_K's 16-element halves have scales of their own, at most 15 against quants of at most 3: the
 * weights' words carry them, and the mma sums sc * q * a). The activations' per-16 sums (Q8_K's
 * bsums) stand in for the minimums' dots, as on the CPU.
 *
 * Fragments of mma.m16n8k32 with s8 operands (PTX ISA): lane L, g = L / 4, c = L % 4. A (16 x 32,
 * rows x k): word 0 row g, k 4c..4c+3; word 1 row g + 8, the same k; words 2 and 3 the same rows
 * at k 16 + 4c.. B (32 x 8, k x pairs): word 0 pair g, k 4c..; word 1 pair g, k 16 + 4c.. C: c0,
 * c1 row g, pairs 2c and 2c + 1; c2, c3 row g + 8. */
#include "cuda/async_copy.cuh"
#include "cuda/dequant.cuh"
#include "cuda/gemm.cuh"

enum {
    MQ_ROWS = GEMM_TILE_N,  /* weight rows a block */
    MQ_PAIRS = GEMM_TILE_M, /* pairs a tile */
    MQ_PARTS = 8,           /* parts of 32 elements a stage */
    MQ_THREADS = 256,
    MQ_A_PITCH = 304,       /* bytes a pair's stage: 76 words, the 8 pairs of an mma tile in 8 bank groups */
    MQ_A_STAGE = MQ_PAIRS * MQ_A_PITCH,
};

/* A part's integers and scales for one weight row (F::row), and where a pair's part lies in its
 * activations (F::act). */
struct mq_row {
    int lo, hi;          /* the A words: k 4c..4c+3 and 16 + 4c.. */
    float scale, dmin;   /* d_w (times the part's scale) and the block's dmin (K formats) */
    int m0, m1;          /* the halves' minimums (K formats) */
};

/* Q4_0, 8 blocks a stage: block b's byte j holds element j (low nibble) and j + 16 (high), so one
 * 4-byte load of bytes 4c.. gives both of a row's words. Activations Q8_1: d, s (f16), 32 quants. */
struct mq_q4_0 {
    static constexpr int W_RUN = 8 * 18, A_RUN = 8 * 36;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void row(const uint8_t *w, int b, int c, mq_row &r) {
        const uint8_t *block = w + 18 * b;
        const int v = ld_word<2>(block + 2 + 4 * c);
        r.lo = sub_bytes<8>(v & 0x0f0f0f0f);
        r.hi = sub_bytes<8>((v >> 4) & 0x0f0f0f0f);
        r.scale = ld_half(block);
    }
    static __device__ __forceinline__ const uint8_t *quants(const uint8_t *a, int b) { return a + 36 * b + 4; }
    static __device__ __forceinline__ float da(const uint8_t *a, int b) { return ld_half(a + 36 * b); }
};

/* The K formats, one super-block a stage; activations Q8_K: d (f32), 256 quants, 16 bsums (int16). */
struct mq_k_act {
    static constexpr int A_RUN = 292;
    static constexpr bool HAS_MIN = true;
    static __device__ __forceinline__ const uint8_t *quants(const uint8_t *a, int b) { return a + 4 + 32 * b; }
    static __device__ __forceinline__ float da(const uint8_t *a, int b) { return *(const float *)a; }
};

/* scales[16] (low nibble scale, high nibble min), qs[64], d, dmin: element 128h + 32j + l is bits
 * 2j..2j+1 of qs[32h + l], part b = 4h + j; its halves scaled apart (the words times sc). */
struct mq_q2_K : mq_k_act {
    static constexpr int W_RUN = 84;
    static __device__ __forceinline__ void row(const uint8_t *w, int b, int c, mq_row &r) {
        const int h = b >> 2, j = b & 3, s0 = w[2 * b], s1 = w[2 * b + 1];
        r.lo = ((ld_word<4>(w + 16 + 32 * h + 4 * c) >> (2 * j)) & 0x03030303) * (s0 & 15);
        r.hi = ((ld_word<4>(w + 32 + 32 * h + 4 * c) >> (2 * j)) & 0x03030303) * (s1 & 15);
        r.scale = ld_half(w + 80);
        r.dmin = ld_half(w + 82);
        r.m0 = s0 >> 4, r.m1 = s1 >> 4;
    }
};

/* d, dmin, scales[12], qs[128]: each 64 elements share 32 bytes, low nibbles then high; one scale
 * and minimum a part. Q5_K: qh[32] before qs, bit b of qh[l] bit 4 of element 32b + l. */
template <bool FIVE> struct mq_q45_K : mq_k_act {
    static constexpr int W_RUN = FIVE ? 176 : 144;
    static __device__ __forceinline__ void row(const uint8_t *w, int b, int c, mq_row &r) {
        const int shift = 4 * (b & 1);
        const uint8_t *q = w + (FIVE ? 48 : 16) + 32 * (b >> 1) + 4 * c;
        r.lo = (ld_word<4>(q) >> shift) & 0x0f0f0f0f;
        r.hi = (ld_word<4>(q + 16) >> shift) & 0x0f0f0f0f;
        if (FIVE) {
            r.lo |= ((ld_word<4>(w + 16 + 4 * c) >> b) & 0x01010101) << 4;
            r.hi |= ((ld_word<4>(w + 32 + 4 * c) >> b) & 0x01010101) << 4;
        }
        int sc, m;
        dq_k4_scale_min(w + 4, b, sc, m);
        r.scale = ld_half(w) * (float)sc;
        r.dmin = ld_half(w + 2);
        r.m0 = r.m1 = m;
    }
};

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

template <class F> __global__ void __launch_bounds__(MQ_THREADS, 2) mmq_kernel(const gemm_args a) {
    constexpr int W_STAGE = MQ_ROWS * F::W_RUN;
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

    auto Ws = [&](int stage) { return smem + stage * (W_STAGE + MQ_A_STAGE); };
    auto As = [&](int stage) { return smem + stage * (W_STAGE + MQ_A_STAGE) + W_STAGE; };
    /* Stage s: elements [256 s, +256) of every row (rows past n_rows copy the last row, not
     * stored) and of each of the tile's pairs' activation rows. */
    auto load = [&](int stage, int s) {
        uint8_t *ws = Ws(stage), *as = As(stage);
        const int wu = a.mq_unit, au = a.mq_act_unit;
        for (int i = tid; i < MQ_ROWS * (F::W_RUN / wu); i += MQ_THREADS) {
            const int r = i / (F::W_RUN / wu), o = (i % (F::W_RUN / wu)) * wu;
            const int row = n0 + r < a.n_rows ? n0 + r : a.n_rows - 1;
            copy_unit(ws + r * F::W_RUN + o, w + (size_t)row * a.row_bytes + (size_t)s * F::W_RUN + o, wu);
        }
        for (int i = tid; i < n_valid * (F::A_RUN / au); i += MQ_THREADS) {
            const int p = i / (F::A_RUN / au), o = (i % (F::A_RUN / au)) * au;
            copy_unit(as + p * MQ_A_PITCH + o, a.act + (size_t)a_rows[p] * a.act_row_bytes + (size_t)s * F::A_RUN + o, au);
        }
        copy_commit();
    };

    float acc[MQ_PAIRS / 8][4];
#pragma unroll
    for (int j = 0; j < MQ_PAIRS / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int stages = a.n_cols / (32 * MQ_PARTS);
    const int r_lo = warp * 16 + g, r_hi = r_lo + 8; /* this thread's rows in the tile */
    load(0, 0);
    for (int s = 0; s < stages; s++) {
        if (s + 1 < stages) load((s + 1) & 1, s + 1);
        copy_wait(s + 1 < stages);
        __syncthreads(); /* stage s is complete */
        const uint8_t *ws = Ws(s & 1), *as = As(s & 1);
#pragma unroll 2
        for (int b = 0; b < MQ_PARTS; b++) {
            mq_row lo, hi;
            F::row(ws + r_lo * F::W_RUN, b, c, lo);
            F::row(ws + r_hi * F::W_RUN, b, c, hi);
#pragma unroll
            for (int j = 0; j < MQ_PAIRS / 8; j++) {
                if (j >= tiles_used) break; /* (the same for the whole block) */
                const uint8_t *ab = F::quants(as + (j * 8 + g) * MQ_A_PITCH, b);
                int dot[4];
                mma_s8(dot, lo.lo, hi.lo, lo.hi, hi.hi, *(const int *)(ab + 4 * c), *(const int *)(ab + 16 + 4 * c));
                const uint8_t *a0 = as + (j * 8 + 2 * c) * MQ_A_PITCH, *a1 = a0 + MQ_A_PITCH;
                const float da0 = F::da(a0, b), da1 = F::da(a1, b);
                acc[j][0] += lo.scale * da0 * (float)dot[0];
                acc[j][1] += lo.scale * da1 * (float)dot[1];
                acc[j][2] += hi.scale * da0 * (float)dot[2];
                acc[j][3] += hi.scale * da1 * (float)dot[3];
                if constexpr (F::HAS_MIN) {
                    /* (the pairs' sums of their part's halves: Q8_K's bsums 2b and 2b + 1) */
                    const int16_t *bs0 = (const int16_t *)(a0 + 260) + 2 * b, *bs1 = (const int16_t *)(a1 + 260) + 2 * b;
                    acc[j][0] -= lo.dmin * da0 * (float)(lo.m0 * bs0[0] + lo.m1 * bs0[1]);
                    acc[j][1] -= lo.dmin * da1 * (float)(lo.m0 * bs1[0] + lo.m1 * bs1[1]);
                    acc[j][2] -= hi.dmin * da0 * (float)(hi.m0 * bs0[0] + hi.m1 * bs0[1]);
                    acc[j][3] -= hi.dmin * da1 * (float)(hi.m0 * bs1[0] + hi.m1 * bs1[1]);
                }
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

/* The kernel of a weight format (NULL: none) and its shared memory. */
static const void *mmq_kernel_for(enum quant_type type, size_t *smem) {
#define MQ_KERNEL(T, F)                                                                                              \
    case T:                                                                                                          \
        *smem = 2 * ((size_t)MQ_ROWS * F::W_RUN + MQ_A_STAGE);                                                       \
        return (const void *)mmq_kernel<F>;
    switch (type) {
        MQ_KERNEL(QUANT_Q4_0, mq_q4_0)
        MQ_KERNEL(QUANT_Q2_K, mq_q2_K)
        MQ_KERNEL(QUANT_Q4_K, mq_q45_K<false>)
        MQ_KERNEL(QUANT_Q5_K, mq_q45_K<true>)
    default:
        *smem = 0;
        return NULL;
    }
#undef MQ_KERNEL
}

bool cuda_int8_products(enum quant_type type, int64_t n_cols) {
    /* The kernel as it will run was compiled for sm_80 or later (its PTX version): a device below
     * that, or one that JIT-compiles the build's compute_75 PTX, has no int8 mma in it. */
    static int compiled_for = -1; /* (one device a process) */
    if (compiled_for < 0) {
        cudaFuncAttributes fa;
        compiled_for = cudaFuncGetAttributes(&fa, mmq_kernel<mq_q4_0>) == cudaSuccess ? fa.ptxVersion : 0;
        cudaGetLastError();
    }
    size_t smem;
    return mmq_kernel_for(type, &smem) && n_cols % (32 * MQ_PARTS) == 0 && compiled_for >= 80;
}

/* The widest copy (16, 8 or 4 bytes) that every piece of `run` bytes at offsets of `stride` from
 * base starts on. */
static int copy_width(size_t run, size_t stride, uintptr_t base) {
    for (int u = 16; u > 4; u /= 2)
        if (run % u == 0 && stride % u == 0 && base % u == 0) return u;
    return 4;
}

pshard_status mmq_run(enum quant_type type, const gemm_args &args, unsigned grid_y, cudaStream_t st) {
    size_t smem;
    const void *kernel = mmq_kernel_for(type, &smem);
    CUDA_ARG(kernel && args.n_cols % (32 * MQ_PARTS) == 0 && args.act && args.act_row_bytes % 4 == 0 &&
                 (uintptr_t)args.act % 4 == 0 && args.row_bytes % 4 == 0,
             "int8 expert product: %s rows of %d elements (a multiple of 256, 4-byte aligned) and their activations needed",
             quant_type_name(type), args.n_cols);
    if (grid_y == 0) return PSHARD_OK;
    gemm_args a = args;
    const size_t w_run = (size_t)a.n_cols / (32 * MQ_PARTS) > 0 ? a.row_bytes / ((size_t)a.n_cols / (32 * MQ_PARTS)) : 0;
    /* (a table's experts each start 256-byte aligned in their slots) */
    a.mq_unit = copy_width(w_run, a.row_bytes, a.expert_ptrs ? 16 : (uintptr_t)a.w | a.expert_stride);
    a.mq_act_unit = copy_width(w_run ? a.act_row_bytes / ((size_t)a.n_cols / (32 * MQ_PARTS)) : 4, a.act_row_bytes,
                               (uintptr_t)a.act);
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)ceil_div(a.n_rows, MQ_ROWS), grid_y);
    void *params[] = {&a};
    CUDA_TRY(cudaLaunchKernel(kernel, grid, dim3(MQ_THREADS), params, smem, st));
    CUDA_TRY_LAUNCH("int8 expert product");
    return PSHARD_OK;
}
