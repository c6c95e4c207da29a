/* One warp's step of flash attention on tensor cores, shared by the language model's prefill
 * (attention_prefill.cu) and the vision encoder (vision.cu): for the warp's 16 query rows and a
 * chunk of KV keys in shared memory, S = Q K^T with WMMA (f16 in, f32 accumulate); the keys each
 * row may see (a caller's mask), scaled; the online softmax in f32 (two lanes a row, 32 columns
 * each), P rounded to f16 and its row sums taken as rounded; O = O * rescale + P V with WMMA. */
#ifndef CUDA_ATTENTION_TILE_CUH
#define CUDA_ATTENTION_TILE_CUH

#include "cuda/cuda_internal.cuh"

#include <math.h>
#include <mma.h>

/* Carve `bytes` at `at` of a block's shared memory, keeping every region on 128 bytes (WMMA wants
 * 32-byte pointers). */
static __host__ __device__ inline size_t attn_smem_take(size_t &at, size_t bytes) {
    const size_t here = at;
    at = (at + bytes + 127) & ~(size_t)127;
    return here;
}

/* Row strides of the warp's scores (f32) and probabilities (f16) over a chunk of KV keys. */
template <int KV> struct attn_tile {
    enum { SP = KV + 4, PP = KV + 8 };
};

/* A block's shared memory for Q rows of queries over chunks of KV keys: Q, K and V (f16, rows
 * padded by 8), the scores and probabilities, the output (f32, padded by 4), and ml_floats f32
 * a query row for its running max and sum (and what else the caller keeps there). */
struct attn_smem {
    size_t q, k, v, s, p, o, ml, bytes;
};
template <int Q, int KV>
static __host__ __device__ inline attn_smem attn_smem_layout(int head_k, int head_v, int ml_floats) {
    attn_smem L;
    size_t at = 0;
    L.q = attn_smem_take(at, (size_t)Q * (head_k + 8) * 2);
    L.k = attn_smem_take(at, (size_t)KV * (head_k + 8) * 2);
    L.v = attn_smem_take(at, (size_t)KV * (head_v + 8) * 2);
    L.s = attn_smem_take(at, (size_t)Q * attn_tile<KV>::SP * 4);
    L.p = attn_smem_take(at, (size_t)Q * attn_tile<KV>::PP * 2);
    L.o = attn_smem_take(at, (size_t)Q * (head_v + 4) * 4);
    L.ml = attn_smem_take(at, (size_t)Q * ml_floats * 4);
    L.bytes = at;
    return L;
}

/* S [16][SP] = the warp's Q rows (Qs + warp * 16 rows, q_stride apart) times the chunk's keys
 * (Ks, k_stride apart), head_k a multiple of 16. */
template <int KV>
__device__ inline void attn_tile_scores(const __half *Qs, int q_stride, const __half *Ks, int k_stride, int head_k,
                                        int warp, float *S) {
    using namespace nvcuda;
    for (int j = 0; j < KV / 16; j++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
        wmma::fill_fragment(sf, 0.0f);
        for (int kk = 0; kk < head_k; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> qa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> kb;
            wmma::load_matrix_sync(qa, Qs + warp * 16 * q_stride + kk, q_stride);
            wmma::load_matrix_sync(kb, Ks + j * 16 * k_stride + kk, k_stride);
            wmma::mma_sync(sf, qa, kb, sf);
        }
        wmma::store_matrix_sync(S + j * 16, sf, attn_tile<KV>::SP, wmma::mem_row_major);
    }
    __syncwarp();
}

/* The online softmax over S and O += P V (Vs, v_stride apart; head_v a multiple of 16), for the
 * warp's rows: sees(R, c) says whether block row R sees the chunk's key c; row_m and row_l are
 * the block's running maxima and sums, O [16][o_stride] the warp's running output. A row that sees
 * no key yet keeps a zero P. */
template <int KV, class Sees>
__device__ inline void attn_tile_softmax_pv(float *S, __half *P, float *row_m, float *row_l, float *O, int o_stride,
                                            const __half *Vs, int v_stride, int head_v, float scale, int warp, int lane,
                                            Sees sees) {
    using namespace nvcuda;
    const int SP = attn_tile<KV>::SP, PP = attn_tile<KV>::PP;
    const int r = lane / 2, R = warp * 16 + r, col0 = (lane % 2) * 32;
    float mx = -INFINITY;
    for (int c = col0; c < col0 + 32; c++) {
        const float sv = sees(R, c) ? S[r * SP + c] * scale : -INFINITY;
        S[r * SP + c] = sv;
        mx = fmaxf(mx, sv);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = row_m[R], m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
    for (int c = col0; c < col0 + 32; c++) {
        const __half p = __float2half_rn(m_new == -INFINITY ? 0.0f : expf(S[r * SP + c] - m_new));
        P[r * PP + c] = p;
        sum += __half2float(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float rescale = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
    __syncwarp(); /* both lanes of the row have read row_m */
    if (lane % 2 == 0) {
        row_m[R] = m_new;
        row_l[R] = row_l[R] * rescale + sum;
    }
    for (int d = lane % 2; d < head_v; d += 2) O[r * o_stride + d] *= rescale;
    __syncwarp();
    for (int n = 0; n < head_v / 16; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
        wmma::load_matrix_sync(of, O + n * 16, o_stride, wmma::mem_row_major);
        for (int kk = 0; kk < KV; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vb;
            wmma::load_matrix_sync(pa, P + kk, PP);
            wmma::load_matrix_sync(vb, Vs + kk * v_stride + n * 16, v_stride);
            wmma::mma_sync(of, pa, vb, of);
        }
        wmma::store_matrix_sync(O + n * 16, of, o_stride, wmma::mem_row_major);
    }
}

#endif
