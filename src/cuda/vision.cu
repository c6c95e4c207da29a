/* The vision encoder's own kernels (Qwen2.5-VL): the patch embedding as a plain f32 product, the
 * 2D rotary turn from a table the host made, attention over tiles of query rows with an online
 * softmax (window or full, by the tiles' key ranges), and the merger's exact GELU. Everything
 * else the encoder runs (norms, products with its weights, SwiGLU, adds) is the language model's
 * kernels. All in f32, as src/vision/encoder.c computes; products are written unfused where the
 * CPU's are, so only the order of sums differs. */
#include "cuda/attention_tile.cuh"
#include "cuda/cuda_internal.cuh"

#include <math.h>

/* ---- patch embedding: x[t][o] = sum_j patches[t][j] * kernel[o][j] */

enum { PE_TILE = 16 };

__global__ void patch_embed_kernel(const float *patches, const float *kernel, int64_t n, int64_t n_embd,
                                   int64_t patch_dim, float *x) {
    __shared__ float ps[PE_TILE][PE_TILE + 1], ks[PE_TILE][PE_TILE + 1];
    /* blocks: x over patches (up to 2^20 of them), y over outputs */
    const int64_t t = (int64_t)blockIdx.x * PE_TILE + threadIdx.y, o = (int64_t)blockIdx.y * PE_TILE + threadIdx.x;
    const int64_t o_load = (int64_t)blockIdx.y * PE_TILE + threadIdx.y; /* the kernel row this thread loads */
    float acc = 0.0f;
    for (int64_t j0 = 0; j0 < patch_dim; j0 += PE_TILE) {
        const int64_t j = j0 + threadIdx.x;
        ps[threadIdx.y][threadIdx.x] = t < n && j < patch_dim ? patches[t * patch_dim + j] : 0.0f;
        ks[threadIdx.y][threadIdx.x] = o_load < n_embd && j < patch_dim ? kernel[o_load * patch_dim + j] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int jj = 0; jj < PE_TILE; jj++) acc = __fadd_rn(acc, __fmul_rn(ps[threadIdx.y][jj], ks[threadIdx.x][jj]));
        __syncthreads();
    }
    if (t < n && o < n_embd) x[t * n_embd + o] = acc;
}

extern "C" pshard_status cuda_vision_patch_embed(const float *patches, const float *kernel, int64_t n, int64_t n_embd,
                                                 int64_t patch_dim, float *x, cuda_stream s) {
    CUDA_ARG(n >= 0 && n_embd > 0 && patch_dim > 0 && n < (1ll << 30) && n_embd <= 65535ll * PE_TILE,
             "vision patch embedding: %lld patches of %lld into %lld", (long long)n, (long long)patch_dim,
             (long long)n_embd);
    if (n == 0) return PSHARD_OK;
    const dim3 grid((unsigned)ceil_div(n, PE_TILE), (unsigned)ceil_div(n_embd, PE_TILE)), block(PE_TILE, PE_TILE);
    patch_embed_kernel<<<grid, block, 0, raw_stream(s)>>>(patches, kernel, n, n_embd, patch_dim, x);
    CUDA_TRY_LAUNCH("vision patch embedding");
    return PSHARD_OK;
}

/* ---- 2D rotary: one thread per rotated pair of one head of one patch */

__global__ void vision_rope_kernel(float *x, const float *cs, int64_t n, int n_head, int head_dim) {
    const int half = head_dim / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * n_head * half) return;
    const int64_t t = i / ((int64_t)n_head * half);
    const int h = (int)(i / half % n_head), p = (int)(i % half);
    float *v = x + (t * n_head + h) * head_dim;
    const float c = cs[(t * half + p) * 2], sn = cs[(t * half + p) * 2 + 1];
    const float a = v[p], b = v[p + half];
    v[p] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn));
    v[p + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn));
}

extern "C" pshard_status cuda_vision_rope(float *x, const float *cs, int64_t n, int n_head, int head_dim, cuda_stream s) {
    CUDA_ARG(n >= 0 && n_head > 0 && head_dim > 0 && head_dim % 2 == 0, "vision rope: %d heads of %d", n_head, head_dim);
    const int64_t total = n * n_head * (head_dim / 2);
    if (total == 0) return PSHARD_OK;
    vision_rope_kernel<<<(unsigned)ceil_div(total, 256), 256, 0, raw_stream(s)>>>(x, cs, n, n_head, head_dim);
    CUDA_TRY_LAUNCH("vision rope");
    return PSHARD_OK;
}

/* ---- attention over tiles of query rows
 *
 * A block takes one tile's queries (up to 64) for one head: four threads a query, each holding
 * every fourth dimension of it (DPT at most), so a query's dot with a key is four partial sums
 * and two shuffles. Keys and values come through shared memory 32 rows at a time; each chunk's
 * scores stay in registers, the running max and sum are corrected once a chunk. */

enum { VA_SUBS = 4, VA_THREADS = CUDA_VISION_TILE_QUERIES * VA_SUBS, VA_KEYS = 32 };

template <int DPT>
__global__ void __launch_bounds__(VA_THREADS) vision_attention_kernel(float *q, const float *k, const float *v,
                                                                      const cuda_vision_tile *tiles, int n_head,
                                                                      int head_dim, float scale) {
    extern __shared__ float kv_chunk[];
    float *ks = kv_chunk, *vs = kv_chunk + VA_KEYS * head_dim;
    const cuda_vision_tile tile = tiles[blockIdx.x];
    const int h = blockIdx.y;
    const int64_t width = (int64_t)n_head * head_dim;
    const int row = threadIdx.x / VA_SUBS, sub = threadIdx.x % VA_SUBS;
    const bool live = row < tile.q_count; /* the others load and shuffle, but write nothing */
    float *qr = q + (int64_t)(tile.q_first + (live ? row : 0)) * width + (int64_t)h * head_dim;
    float qv[DPT], acc[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        const int d = sub + VA_SUBS * i;
        qv[i] = d < head_dim ? qr[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int c0 = 0; c0 < tile.k_count; c0 += VA_KEYS) {
        const int nk = min(VA_KEYS, tile.k_count - c0);
        __syncthreads(); /* the last chunk's reads are done */
        for (int e = threadIdx.x; e < nk * head_dim; e += VA_THREADS) {
            const int j = e / head_dim, d = e % head_dim;
            const int64_t at = (int64_t)(tile.k_first + c0 + j) * width + (int64_t)h * head_dim + d;
            ks[e] = k[at];
            vs[e] = v[at];
        }
        __syncthreads();
        float s[VA_KEYS];
        float chunk_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < VA_KEYS; j++) {
            float dot = 0.0f;
            if (j < nk) {
#pragma unroll
                for (int i = 0; i < DPT; i++) {
                    const int d = sub + VA_SUBS * i;
                    if (d < head_dim) dot = __fadd_rn(dot, __fmul_rn(qv[i], ks[j * head_dim + d]));
                }
            }
            dot += __shfl_xor_sync(0xffffffffu, dot, 1);
            dot += __shfl_xor_sync(0xffffffffu, dot, 2);
            s[j] = j < nk ? __fmul_rn(dot, scale) : -INFINITY;
            chunk_max = fmaxf(chunk_max, s[j]);
        }
        const float m_new = fmaxf(m, chunk_max); /* finite: every chunk has a key */
        const float correction = expf(m - m_new);
        l *= correction;
#pragma unroll
        for (int i = 0; i < DPT; i++) acc[i] *= correction;
#pragma unroll
        for (int j = 0; j < VA_KEYS; j++) {
            if (j >= nk) continue;
            const float p = expf(s[j] - m_new);
            l += p;
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                const int d = sub + VA_SUBS * i;
                if (d < head_dim) acc[i] = __fadd_rn(acc[i], __fmul_rn(p, vs[j * head_dim + d]));
            }
        }
        m = m_new;
    }
    if (!live) return;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        const int d = sub + VA_SUBS * i;
        if (d < head_dim) qr[d] = acc[i] / l;
    }
}

/* The same attention on tensor cores, for encoders whose weights are 16-bit already (their
 * products are rounded as coarsely): a block takes a tile's queries (up to 64) for one head, its
 * keys and values through shared memory 64 rows at a time, rounded to f16. Each of its 4 warps
 * owns 16 queries: S = Q K^T with WMMA (f16 in, f32 accumulate), the online softmax in f32 (two
 * lanes a row), P rounded to f16 and summed as rounded, O = O * rescale + P V with WMMA: the
 * language model's prefill kernel's step (attention_tile.cuh), each row seeing the tile's keys.
 * head_dim a multiple of 16. */
enum { VT_Q = CUDA_VISION_TILE_QUERIES, VT_KV = 64, VT_THREADS = 128, VT_SP = attn_tile<VT_KV>::SP, VT_PP = attn_tile<VT_KV>::PP };

static __host__ __device__ attn_smem vt_smem(int hd) { return attn_smem_layout<VT_Q, VT_KV>(hd, hd, 2); }

__global__ void __launch_bounds__(VT_THREADS) vision_attention_tc_kernel(float *q, const float *k, const float *v,
                                                                         const cuda_vision_tile *tiles, int n_head,
                                                                         int hd, float scale) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int HP = hd + 8, OP = hd + 4;
    const attn_smem L = vt_smem(hd);
    __half *Qs = (__half *)(smem + L.q), *Ks = (__half *)(smem + L.k), *Vs = (__half *)(smem + L.v);
    float *row_m = (float *)(smem + L.ml), *row_l = row_m + VT_Q;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float *S = (float *)(smem + L.s) + warp * 16 * VT_SP;
    __half *P = (__half *)(smem + L.p) + warp * 16 * VT_PP;
    float *O = (float *)(smem + L.o) + warp * 16 * OP;
    const cuda_vision_tile tile = tiles[blockIdx.x];
    const int h = blockIdx.y;
    const int64_t width = (int64_t)n_head * hd;
    if (tid < VT_Q) row_m[tid] = -INFINITY, row_l[tid] = 0.0f;
    for (int i = tid; i < VT_Q * hd; i += VT_THREADS) {
        const int r = i / hd, d = i % hd;
        Qs[r * HP + d] = __float2half_rn(r < tile.q_count ? q[(int64_t)(tile.q_first + r) * width + (int64_t)h * hd + d] : 0.0f);
    }
    for (int i = lane; i < 16 * OP; i += 32) O[i] = 0.0f;
    __syncthreads();
    for (int c0 = 0; c0 < tile.k_count; c0 += VT_KV) {
        /* This chunk's keys and values; rows past the tile's keys are zeros. */
        for (int i = tid; i < VT_KV * hd; i += VT_THREADS) {
            const int r = i / hd, d = i % hd;
            const bool in = c0 + r < tile.k_count;
            const int64_t at = (int64_t)(tile.k_first + c0 + r) * width + (int64_t)h * hd + d;
            Ks[r * HP + d] = __float2half_rn(in ? k[at] : 0.0f);
            Vs[r * HP + d] = __float2half_rn(in ? v[at] : 0.0f);
        }
        __syncthreads();
        attn_tile_scores<VT_KV>(Qs, HP, Ks, HP, hd, warp, S);
        attn_tile_softmax_pv<VT_KV>(S, P, row_m, row_l, O, OP, Vs, HP, hd, scale, warp, lane,
                                    [&](int, int c) { return c0 + c < tile.k_count; }); /* (column 0 is a key) */
        __syncthreads(); /* the K/V chunk is replaced next */
    }
    __syncwarp();
    for (int i = lane; i < 16 * hd; i += 32) {
        const int r = i / hd, d = i % hd, R = warp * 16 + r;
        if (R < tile.q_count)
            q[(int64_t)(tile.q_first + R) * width + (int64_t)h * hd + d] = row_l[R] > 0.0f ? O[r * OP + d] / row_l[R] : 0.0f;
    }
}

template <int DPT>
static void launch_attention(float *q, const float *k, const float *v, const cuda_vision_tile *tiles, int64_t n_tiles,
                             int n_head, int head_dim, float scale, cudaStream_t st) {
    const size_t shared = sizeof(float) * 2 * VA_KEYS * (size_t)head_dim;
    vision_attention_kernel<DPT><<<dim3((unsigned)n_tiles, (unsigned)n_head), VA_THREADS, shared, st>>>(
        q, k, v, tiles, n_head, head_dim, scale);
}

extern "C" pshard_status cuda_vision_attention(float *q_out, const float *k, const float *v,
                                               const struct cuda_vision_tile *tiles, int64_t n_tiles, int n_head,
                                               int head_dim, float scale, bool tensor_cores, cuda_stream s) {
    CUDA_ARG(head_dim > 0 && head_dim <= CUDA_VISION_MAX_HEAD_DIM && n_head > 0 && n_head < 65536,
             "vision attention: %d heads of %d (at most %d)", n_head, head_dim, (int)CUDA_VISION_MAX_HEAD_DIM);
    CUDA_ARG(n_tiles >= 0 && n_tiles < (1ll << 31), "vision attention: %lld tiles", (long long)n_tiles);
    if (n_tiles == 0) return PSHARD_OK;
    cudaStream_t st = raw_stream(s);
    if (tensor_cores && head_dim % 16 == 0) {
        const size_t smem = vt_smem(head_dim).bytes;
        CUDA_TRY(cudaFuncSetAttribute(vision_attention_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        vision_attention_tc_kernel<<<dim3((unsigned)n_tiles, (unsigned)n_head), VT_THREADS, smem, st>>>(q_out, k, v, tiles,
                                                                                                         n_head, head_dim, scale);
        CUDA_TRY_LAUNCH("vision attention");
        return PSHARD_OK;
    }
    const int per_thread = (head_dim + VA_SUBS - 1) / VA_SUBS;
    if (per_thread <= 8) launch_attention<8>(q_out, k, v, tiles, n_tiles, n_head, head_dim, scale, st);
    else if (per_thread <= 16) launch_attention<16>(q_out, k, v, tiles, n_tiles, n_head, head_dim, scale, st);
    else if (per_thread <= 24) launch_attention<24>(q_out, k, v, tiles, n_tiles, n_head, head_dim, scale, st);
    else launch_attention<32>(q_out, k, v, tiles, n_tiles, n_head, head_dim, scale, st);
    CUDA_TRY_LAUNCH("vision attention");
    return PSHARD_OK;
}

/* ---- the merger's GELU */

__global__ void gelu_erf_kernel(float *x, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = x[i];
    x[i] = __fmul_rn(__fmul_rn(0.5f, a), __fadd_rn(1.0f, erff(__fmul_rn(a, 0.70710678f))));
}

extern "C" pshard_status cuda_gelu_erf(float *x, int64_t n, cuda_stream s) {
    if (n <= 0) return PSHARD_OK;
    gelu_erf_kernel<<<(unsigned)ceil_div(n, 256), 256, 0, raw_stream(s)>>>(x, n);
    CUDA_TRY_LAUNCH("gelu");
    return PSHARD_OK;
}
