/* Prefill attention on tensor cores (flash attention): a block takes 64 queries of one
 * sequence and one head, walks the cache in tiles of 64 cells up to its last position, and
 * keeps the output in shared memory. Each of its 4 warps owns 16 queries: S = Q K^T with WMMA
 * (f16 in, f32 accumulate), then a causal mask, the online softmax in f32 (two lanes per row),
 * P rounded to f16, O = O * rescale + P V with WMMA. The row sums add the same rounded P that
 * multiplies V, so every output is an exact convex combination of the f16 values. Where the
 * tiles and heads give fewer blocks than fill the GPU (a few dozen tokens at the end of a long
 * cache), the cache is split into slices, a block per slice, and the decode kernel's merge
 * combines them (flash-decoding). */
#include "cuda/attention_tile.cuh"
#include "cuda/cuda_sizes.h"

#include <math.h>

enum { AP_Q = CUDA_PREFILL_Q_ROWS, AP_KV = CUDA_KV_TILE, AP_THREADS = 128, AP_MAX_HEAD = CUDA_PREFILL_MAX_HEAD,
       SP = attn_tile<AP_KV>::SP, PP = attn_tile<AP_KV>::PP };

struct ap_args {
    const float *q;
    const uint16_t *k, *v;  /* the layer's pool */
    const int32_t *blocks;  /* the sequence's blocks */
    int block_cells;        /* a multiple of AP_KV: a tile is one block's run of rows */
    int64_t k_width, v_width;
    const int32_t *pos;
    int n_tokens, n_head, group, head_k, head_v;
    float scale;
    float *out;
    int n_splits, split_len;
    float *part_o, *part_ml; /* with slices: [token][head][slice] outputs (unnormalized), max and sum */
};

/* (three words a query row: its running max and sum, and its position) */
static __host__ __device__ attn_smem ap_smem(int head_k, int head_v) {
    return attn_smem_layout<AP_Q, AP_KV>(head_k, head_v, 3);
}

__global__ void __launch_bounds__(AP_THREADS) attn_prefill_kernel(const ap_args a) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int HK = a.head_k, HV = a.head_v, HKP = HK + 8, HVP = HV + 8, OP = HV + 4;
    const attn_smem L = ap_smem(HK, HV);
    __half *Qs = (__half *)(smem + L.q), *Ks = (__half *)(smem + L.k), *Vs = (__half *)(smem + L.v);
    float *row_m = (float *)(smem + L.ml), *row_l = row_m + AP_Q;
    int *row_pos = (int *)(row_l + AP_Q);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float *S = (float *)(smem + L.s) + warp * 16 * SP;
    __half *P = (__half *)(smem + L.p) + warp * 16 * PP;
    float *O = (float *)(smem + L.o) + warp * 16 * OP;
    const int t0 = blockIdx.x * AP_Q, h = blockIdx.y, kvh = h / a.group, split = blockIdx.z;

    if (tid < AP_Q) {
        row_pos[tid] = t0 + tid < a.n_tokens ? a.pos[t0 + tid] : -1;
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    for (int i = tid; i < AP_Q * HK; i += AP_THREADS) {
        const int r = i / HK, d = i % HK, t = t0 + r;
        Qs[r * HKP + d] = __float2half_rn(t < a.n_tokens ? a.q[((int64_t)t * a.n_head + h) * HK + d] : 0.0f);
    }
    for (int i = lane; i < 16 * OP; i += 32) O[i] = 0.0f;
    __syncthreads();
    int kv_end = 0;
    for (int r = 0; r < AP_Q; r++) kv_end = max(kv_end, row_pos[r] + 1);
    /* This block's slice; the last one runs to the end whatever the caller's bound said. */
    const int c_begin = split * a.split_len;
    if (split + 1 < a.n_splits) kv_end = min(kv_end, c_begin + a.split_len);

    for (int c0 = c_begin; c0 < kv_end; c0 += AP_KV) {
        /* K and V tiles, from the rows of the block holding them (one lookup: c0 is a multiple of
         * AP_KV, which divides the block); cells past the last position are zeros (never garbage:
         * 0 * NaN). */
        const int64_t row0 = (int64_t)a.blocks[c0 / a.block_cells] * a.block_cells + c0 % a.block_cells;
        const uint16_t *kb = a.k + row0 * a.k_width + kvh * HK, *vb = a.v + row0 * a.v_width + kvh * HV;
        for (int i = tid; i < AP_KV * (HK / 8); i += AP_THREADS) {
            const int r = i / (HK / 8), d8 = i % (HK / 8), c = c0 + r;
            *(uint4 *)(Ks + r * HKP + d8 * 8) = c < kv_end ? *(const uint4 *)(kb + (int64_t)r * a.k_width + d8 * 8) : make_uint4(0, 0, 0, 0);
        }
        for (int i = tid; i < AP_KV * (HV / 8); i += AP_THREADS) {
            const int r = i / (HV / 8), d8 = i % (HV / 8), c = c0 + r;
            *(uint4 *)(Vs + r * HVP + d8 * 8) = c < kv_end ? *(const uint4 *)(vb + (int64_t)r * a.v_width + d8 * 8) : make_uint4(0, 0, 0, 0);
        }
        __syncthreads();
        attn_tile_scores<AP_KV>(Qs, HKP, Ks, HKP, HK, warp, S);
        attn_tile_softmax_pv<AP_KV>(S, P, row_m, row_l, O, OP, Vs, HVP, HV, a.scale, warp, lane,
                                    [&](int R, int c) { return c0 + c <= row_pos[R] && c0 + c < kv_end; });
        __syncthreads(); /* K/V tiles are replaced next */
    }
    __syncwarp();
    if (a.n_splits > 1) { /* the slice's running output, max and sum, for the merge */
        for (int i = lane; i < 16 * HV; i += 32) {
            const int r = i / HV, d = i % HV, t = t0 + warp * 16 + r;
            if (t < a.n_tokens) a.part_o[(((int64_t)t * a.n_head + h) * a.n_splits + split) * HV + d] = O[r * OP + d];
        }
        if (lane < 16 && t0 + warp * 16 + lane < a.n_tokens) {
            const int R = warp * 16 + lane;
            const int64_t slot = ((int64_t)(t0 + R) * a.n_head + h) * a.n_splits + split;
            a.part_ml[slot * 2] = row_m[R];
            a.part_ml[slot * 2 + 1] = row_l[R];
        }
        return;
    }
    for (int i = lane; i < 16 * HV; i += 32) {
        const int r = i / HV, d = i % HV, R = warp * 16 + r, t = t0 + R;
        if (t < a.n_tokens)
            a.out[((int64_t)t * a.n_head + h) * HV + d] = row_l[R] > 0.0f ? O[r * OP + d] / row_l[R] : 0.0f;
    }
}

extern "C" pshard_status cuda_attention_prefill(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                                const float *q, int32_t seq, const int32_t *pos, int64_t n_tokens,
                                                int32_t max_kv_len, float *out, void *work, size_t work_bytes,
                                                cuda_stream s) {
    CUDA_ARG(cuda_attention_prefill_supported(a), "prefill attention: heads %d/%d of %d/%d not supported", a->n_head,
             a->n_head_kv, a->head_k, a->head_v);
    CUDA_ARG(n_tokens < (1 << 30), "prefill attention: %lld tokens", (long long)n_tokens);
    CUDA_ARG(kv->block_cells > 0 && kv->block_cells % AP_KV == 0, "prefill attention: blocks of %d cells (a multiple of %d)",
             kv->block_cells, (int)AP_KV);
    CUDA_ARG(!work || work_bytes >= cuda_prefill_split_bytes(a, n_tokens, max_kv_len), "prefill attention: work buffer too small");
    if (n_tokens == 0) return PSHARD_OK;
    ap_args p = {};
    p.q = q;
    p.k = kv->k, p.v = kv->v;
    p.blocks = kv->blocks + (int64_t)seq * kv->blocks_stride;
    p.block_cells = kv->block_cells;
    p.k_width = (int64_t)a->n_head_kv * a->head_k;
    p.v_width = (int64_t)a->n_head_kv * a->head_v;
    p.pos = pos;
    p.n_tokens = (int)n_tokens;
    p.n_head = a->n_head, p.group = a->n_head / a->n_head_kv, p.head_k = a->head_k, p.head_v = a->head_v;
    p.scale = a->scale;
    p.out = out;
    cuda_prefill_split(a, n_tokens, max_kv_len, &p.n_splits, &p.split_len);
    if (!work) p.n_splits = 1, p.split_len = 0; /* no room for slices: one block walks the cache */
    if (p.n_splits > 1) {
        p.part_o = (float *)work;
        p.part_ml = p.part_o + (size_t)n_tokens * a->n_head * p.n_splits * a->head_v;
    }
    const size_t smem = ap_smem(a->head_k, a->head_v).bytes;
    CUDA_TRY(cudaFuncSetAttribute(attn_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)ceil_div(n_tokens, AP_Q), (unsigned)a->n_head, (unsigned)p.n_splits);
    attn_prefill_kernel<<<grid, AP_THREADS, smem, raw_stream(s)>>>(p);
    CUDA_TRY_LAUNCH("attention prefill");
    if (p.n_splits > 1)
        CORE_TRY(cuda_attention_merge(p.part_o, p.part_ml, p.n_splits, a->n_head, a->head_v, n_tokens, out, s));
    return PSHARD_OK;
}
