/* Decode attention over the f16 KV cache, split over the KV length (flash-decoding): a block
 * takes one token, one KV head with all the query heads that share it (GQA: K and V are read
 * once per group), and one slice of cells; it keeps a running max, sum and output per head
 * (online softmax), and a second kernel merges the slices. Scores are q (rounded to f16, as
 * the CPU does) . k in f32, times the scale; probabilities use expf. Any batch: each token
 * has its own sequence and position, its cells found through the sequence's blocks. */
#include "cuda/cuda_internal.cuh"
#include "cuda/cuda_sizes.h"

#include <math.h>

enum { AD_THREADS = 128, AD_WARPS = AD_THREADS / 32, AD_TILE = AD_THREADS, AD_MAX_GROUP = 16 };

struct ad_args {
    const float *q;
    const uint16_t *k, *v;   /* the layer's pool */
    const int32_t *blocks;   /* [sequence][blocks_stride]: the table of each sequence's blocks */
    int blocks_stride, block_cells;
    const int32_t *seq, *pos;
    int n_head, n_head_kv, head_k, head_v, group;
    float scale;
    int n_splits, split_len;
    float *part_o;  /* [token][head][split][head_v]: unnormalized outputs */
    float *part_ml; /* [token][head][split][2]: running max and sum */
};

template <int DPT> __global__ void __launch_bounds__(AD_THREADS) attn_decode_kernel(const ad_args a) {
    extern __shared__ float sm[];
    const int G = a.group;
    float *qs = sm;                         /* [G][head_k] */
    float *ps = qs + G * a.head_k;          /* [G][AD_TILE] scores, then probabilities */
    float *wred = ps + G * AD_TILE;         /* [AD_WARPS][G] per-warp max / sum */
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int64_t k_width = (int64_t)a.n_head_kv * a.head_k, v_width = (int64_t)a.n_head_kv * a.head_v;
    const int c_begin = split * a.split_len, c_end = min(a.pos[t] + 1, c_begin + a.split_len);
    for (int i = tid; i < G * a.head_k; i += AD_THREADS)
        qs[i] = __half2float(__float2half_rn(a.q[((int64_t)t * a.n_head + kvh * G) * a.head_k + i]));
    const uint16_t *kb = a.k + kvh * a.head_k, *vb = a.v + kvh * a.head_v;
    const int32_t *blocks = a.blocks + (int64_t)a.seq[t] * a.blocks_stride, bc = a.block_cells;
    float m[AD_MAX_GROUP], l[AD_MAX_GROUP], acc[AD_MAX_GROUP][DPT];
#pragma unroll
    for (int g = 0; g < AD_MAX_GROUP; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPT; i++) acc[g][i] = 0.0f;
    }
    __syncthreads();
    for (int c0 = c_begin; c0 < c_end; c0 += AD_TILE) {
        /* Scores of this thread's cell for every head of the group. */
        const int c = c0 + tid;
        float s[AD_MAX_GROUP];
#pragma unroll
        for (int g = 0; g < AD_MAX_GROUP; g++) s[g] = 0.0f;
        if (c < c_end) {
            const int64_t row = (int64_t)blocks[c / bc] * bc + c % bc; /* this thread's cell: one lookup */
            const uint4 *kr = (const uint4 *)(kb + row * k_width);
            for (int d8 = 0; d8 < a.head_k / 8; d8++) {
                const uint4 kv = kr[d8];
                const __half2 *kh = (const __half2 *)&kv;
                float kf[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float2 f = __half22float2(kh[i]);
                    kf[2 * i] = f.x, kf[2 * i + 1] = f.y;
                }
#pragma unroll
                for (int g = 0; g < AD_MAX_GROUP; g++)
                    if (g < G) {
                        const float *qq = qs + g * a.head_k + d8 * 8;
#pragma unroll
                        for (int i = 0; i < 8; i++) s[g] += qq[i] * kf[i];
                    }
            }
        }
        /* Tile max per head: warp shuffles, then across the warps through shared memory. */
#pragma unroll
        for (int g = 0; g < AD_MAX_GROUP; g++) {
            s[g] = c < c_end ? s[g] * a.scale : -INFINITY;
            if (g < G) {
                const float wm = warp_max(s[g]);
                if (lane == 0) wred[warp * G + g] = wm;
            }
        }
        __syncthreads();
        float rescale[AD_MAX_GROUP];
#pragma unroll
        for (int g = 0; g < AD_MAX_GROUP; g++) {
            if (g >= G) continue;
            float tile_max = wred[g];
            for (int w = 1; w < AD_WARPS; w++) tile_max = fmaxf(tile_max, wred[w * G + g]);
            const float m_new = fmaxf(m[g], tile_max); /* finite: cell c0 is valid */
            rescale[g] = expf(m[g] - m_new);           /* 0 on the first tile */
            m[g] = m_new;
            s[g] = c < c_end ? expf(s[g] - m_new) : 0.0f;
            ps[g * AD_TILE + tid] = s[g];
        }
        __syncthreads(); /* wred reads done, ps written */
#pragma unroll
        for (int g = 0; g < AD_MAX_GROUP; g++)
            if (g < G) {
                const float ws = warp_sum(s[g]);
                if (lane == 0) wred[warp * G + g] = ws;
            }
        __syncthreads();
        const int n = min(AD_TILE, c_end - c0);
#pragma unroll
        for (int g = 0; g < AD_MAX_GROUP; g++) {
            if (g >= G) continue;
            float tile_sum = 0.0f;
            for (int w = 0; w < AD_WARPS; w++) tile_sum += wred[w * G + g];
            l[g] = l[g] * rescale[g] + tile_sum;
#pragma unroll
            for (int i = 0; i < DPT; i++) acc[g][i] *= rescale[g];
        }
        /* Output: this thread owns dimensions tid + 128 i of every head's V. */
#pragma unroll
        for (int i = 0; i < DPT; i++) {
            const int d = tid + AD_THREADS * i;
            if (d >= a.head_v) break;
            for (int j0 = 0; j0 < n;) { /* the tile's cells a block at a time: one lookup each */
                const int c = c0 + j0, in_block = c % bc, run = min(n - j0, bc - in_block);
                const uint16_t *vr = vb + ((int64_t)blocks[c / bc] * bc + in_block) * v_width + d;
#pragma unroll 8
                for (int j = 0; j < run; j++) { /* (unrolled: eight cells' loads in flight at once) */
                    const float vf = __half2float(*(const __half *)(vr + (int64_t)j * v_width));
#pragma unroll
                    for (int g = 0; g < AD_MAX_GROUP; g++)
                        if (g < G) acc[g][i] += ps[g * AD_TILE + j0 + j] * vf;
                }
                j0 += run;
            }
        }
        __syncthreads(); /* ps and wred are rewritten by the next tile */
    }
    const int64_t base = ((int64_t)t * a.n_head + kvh * G) * a.n_splits + split;
#pragma unroll
    for (int g = 0; g < AD_MAX_GROUP; g++) {
        if (g >= G) continue;
        const int64_t slot = base + (int64_t)g * a.n_splits;
#pragma unroll
        for (int i = 0; i < DPT; i++) {
            const int d = tid + AD_THREADS * i;
            if (d < a.head_v) a.part_o[slot * a.head_v + d] = acc[g][i];
        }
        if (tid == 0) {
            a.part_ml[slot * 2] = m[g];
            a.part_ml[slot * 2 + 1] = l[g];
        }
    }
}

/* Merge the slices of one (token, head): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M). The
 * slices' factors e^(m_s - M) are computed once into shared memory (at most AC_MAX_SPLITS slices
 * there; more take them from expf each time), the sums run in slice order either way. */
enum { AC_MAX_SPLITS = 512 };
__global__ void attn_combine_kernel(const float *part_o, const float *part_ml, int n_splits, int head_v, float *out) {
    __shared__ float factor[AC_MAX_SPLITS];
    __shared__ float red[32];
    const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    const int64_t slot0 = ((int64_t)t * n_head + h) * n_splits;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) mx = fmaxf(mx, part_ml[(slot0 + s) * 2]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < n_warps; w++) mx = fmaxf(mx, red[w]);
    const bool cached = n_splits <= AC_MAX_SPLITS;
    for (int s = threadIdx.x; cached && s < n_splits; s += blockDim.x) {
        const float ms = part_ml[(slot0 + s) * 2];
        factor[s] = ms != -INFINITY ? expf(ms - mx) : 0.0f;
    }
    __syncthreads();
    float sum = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const float ms = part_ml[(slot0 + s) * 2];
        if (ms != -INFINITY) sum += part_ml[(slot0 + s) * 2 + 1] * (cached ? factor[s] : expf(ms - mx));
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int d = threadIdx.x; d < head_v; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll 8
        for (int s = 0; s < n_splits; s++) {
            const float ms = part_ml[(slot0 + s) * 2];
            if (ms != -INFINITY) o += part_o[(slot0 + s) * head_v + d] * (cached ? factor[s] : expf(ms - mx));
        }
        out[((int64_t)t * n_head + h) * head_v + d] = o * inv;
    }
}

extern "C" pshard_status cuda_attention_decode(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                               const float *q, const int32_t *seq, const int32_t *pos,
                                               int64_t n_tokens, int32_t max_kv_len, float *out, void *work,
                                               size_t work_bytes, cuda_stream s) {
    CUDA_ARG(a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 && a->n_head / a->n_head_kv <= AD_MAX_GROUP,
             "attention: %d query heads over %d KV heads (at most %d per KV head)", a->n_head, a->n_head_kv,
             (int)AD_MAX_GROUP);
    CUDA_ARG(a->head_k % 8 == 0 && a->head_k <= 512 && a->head_v <= 2 * AD_THREADS,
             "attention: head sizes %d/%d (head_k a multiple of 8, head_v <= 256)", a->head_k, a->head_v);
    CUDA_ARG(work_bytes >= cuda_attention_decode_work_bytes(a, n_tokens, max_kv_len),
             "attention: work buffer too small");
    CUDA_ARG(n_tokens < 65536, "attention: %lld tokens in one call", (long long)n_tokens);
    CUDA_ARG(kv->block_cells > 0, "attention: blocks of %d cells", kv->block_cells);
    if (n_tokens == 0) return PSHARD_OK;
    ad_args p = {};
    p.q = q;
    p.k = kv->k, p.v = kv->v;
    p.blocks = kv->blocks, p.blocks_stride = kv->blocks_stride, p.block_cells = kv->block_cells;
    p.seq = seq, p.pos = pos;
    p.n_head = a->n_head, p.n_head_kv = a->n_head_kv, p.head_k = a->head_k, p.head_v = a->head_v;
    p.group = a->n_head / a->n_head_kv;
    p.scale = a->scale;
    cuda_decode_split(a, n_tokens, max_kv_len, &p.n_splits, &p.split_len);
    float *part = (float *)work;
    p.part_o = part;
    p.part_ml = part + (size_t)n_tokens * a->n_head * p.n_splits * a->head_v;
    const size_t smem = sizeof(float) * ((size_t)p.group * a->head_k + (size_t)p.group * AD_TILE + AD_WARPS * p.group);
    const dim3 grid((unsigned)p.n_splits, (unsigned)a->n_head_kv, (unsigned)n_tokens);
    if (a->head_v <= AD_THREADS) attn_decode_kernel<1><<<grid, AD_THREADS, smem, raw_stream(s)>>>(p);
    else attn_decode_kernel<2><<<grid, AD_THREADS, smem, raw_stream(s)>>>(p);
    CUDA_TRY_LAUNCH("attention decode");
    return cuda_attention_merge(p.part_o, p.part_ml, p.n_splits, a->n_head, a->head_v, n_tokens, out, s);
}

pshard_status cuda_attention_merge(const float *part_o, const float *part_ml, int n_splits, int n_head, int head_v,
                                   int64_t n_tokens, float *out, cuda_stream s) {
    attn_combine_kernel<<<dim3((unsigned)n_head, (unsigned)n_tokens), 128, 0, raw_stream(s)>>>(part_o, part_ml, n_splits,
                                                                                              head_v, out);
    CUDA_TRY_LAUNCH("attention combine");
    return PSHARD_OK;
}
