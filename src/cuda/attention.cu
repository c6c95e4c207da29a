/* Decode attention over the f16 KV cache, split over the KV length (flash-decoding): a block
 * takes one token, one KV head with all the query heads that share it (GQA: K and V are read
 * once per group), and one slice of the token's cells. Inside it each warp walks chunks of
 * AD_CHUNK cells, four lanes a cell for the scores (a lane's quarter of the row's 16-byte
 * pieces, interleaved, so a warp reads 64 contiguous bytes of each of 8 rows) and every lane a
 * 32nd of the V dimensions for the output (lane + 32 i: a warp reads each V row contiguously),
 * keeping its own running max, sum and output per head (online softmax); the four warps merge
 * in shared memory at the end, and a second kernel merges the slices. The slices are cut from
 * the token's own length (pos + 1) over the grid's n_splits, AD_SLICE_CELLS at the least: a
 * captured step sized for the whole context spreads a short one over few slices, and the
 * others return at once. Scores are q (rounded to f16, as the CPU does) . k in f32, times the
 * scale; probabilities use expf. Any batch: each token has its own sequence and position, its
 * cells found through the sequence's blocks. */
#include "cuda/cuda_internal.cuh"
#include "cuda/cuda_sizes.h"
#include "cuda/quantize_act.cuh"

#include <math.h>

enum {
    AD_THREADS = 128,
    AD_WARPS = AD_THREADS / 32,
    AD_CHUNK = 8,                           /* cells a warp scores at once: four lanes a cell */
    AD_SLICE_CELLS = AD_WARPS * AD_CHUNK,   /* a slice's cells at the least, and their multiple */
    AD_MAX_GROUP = 16
};

struct ad_args {
    const float *q;
    const uint16_t *k, *v;   /* the layer's pool */
    const int32_t *blocks;   /* [sequence][blocks_stride]: the table of each sequence's blocks */
    int blocks_stride, block_cells;
    const int32_t *seq, *pos;
    int n_head, n_head_kv, head_k, head_v, group;
    float scale;
    int n_splits;
    float *part_o;  /* [token][head][split][head_v]: unnormalized outputs */
    float *part_ml; /* [token][head][split][2]: running max and sum (max -inf: an empty slice) */
};

/* The cells of one slice of a token with n_cells cells over n_splits slices. */
__device__ __forceinline__ int ad_slice_cells(int n_cells, int n_splits) {
    const int per = (n_cells + n_splits - 1) / n_splits;
    return (per + AD_SLICE_CELLS - 1) / AD_SLICE_CELLS * AD_SLICE_CELLS;
}

/* (m, l, acc) := the merge of itself and another part of the same softmax. */
template <int VPL, int GMAX>
__device__ __forceinline__ void ad_merge(int G, float (&m)[GMAX], float (&l)[GMAX], float (&acc)[GMAX][VPL],
                                         const float *om, const float *ol, const float *oacc, int head_v, int lane) {
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (g >= G) continue;
        const float mo = om[g], M = fmaxf(m[g], mo);
        if (M == -INFINITY) continue; /* both empty */
        const float fa = m[g] == -INFINITY ? 0.0f : expf(m[g] - M), fb = mo == -INFINITY ? 0.0f : expf(mo - M);
        l[g] = l[g] * fa + ol[g] * fb;
        m[g] = M;
#pragma unroll
        for (int i = 0; i < VPL; i++) {
            const int d = lane + 32 * i;
            acc[g][i] = acc[g][i] * fa + (d < head_v && fb != 0.0f ? oacc[g * head_v + d] * fb : 0.0f);
        }
    }
}

/* VPL: V dimensions a lane owns (head_v <= 32 VPL); GMAX: query heads a KV head has at most. */
template <int VPL, int GMAX> __global__ void __launch_bounds__(AD_THREADS) attn_decode_kernel(const ad_args a) {
    extern __shared__ float4 sm4[];
    float *sm = (float *)sm4;
    const int G = a.group, split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32, cell_lane = lane / 4, quarter = lane % 4;
    const int n_cells = a.pos[t] + 1, slice = ad_slice_cells(n_cells, a.n_splits);
    const int c_begin = split * slice, c_end = min(n_cells, c_begin + slice);
    const int64_t base = ((int64_t)t * a.n_head + kvh * G) * a.n_splits + split; /* head g's part: base + g n_splits */
    if (c_begin >= c_end) { /* an empty slice: the merge skips it */
        if (tid < G) {
            a.part_ml[(base + (int64_t)tid * a.n_splits) * 2] = -INFINITY;
            a.part_ml[(base + (int64_t)tid * a.n_splits) * 2 + 1] = 0.0f;
        }
        return;
    }
    float *qs = sm; /* [G][head_k] */
    for (int i = tid; i < G * a.head_k; i += AD_THREADS)
        qs[i] = __half2float(__float2half_rn(a.q[((int64_t)t * a.n_head + kvh * G) * a.head_k + i]));
    __syncthreads();
    const int64_t k_width = (int64_t)a.n_head_kv * a.head_k, v_width = (int64_t)a.n_head_kv * a.head_v;
    const uint16_t *kb = a.k + kvh * a.head_k, *vb = a.v + kvh * a.head_v;
    const int32_t *blocks = a.blocks + (int64_t)a.seq[t] * a.blocks_stride, bc = a.block_cells;
    const int pieces = a.head_k / 8; /* 16-byte pieces of a K row */
    float m[GMAX], l[GMAX], acc[GMAX][VPL];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < VPL; i++) acc[g][i] = 0.0f;
    }
    for (int c0 = c_begin + warp * AD_CHUNK; c0 < c_end; c0 += AD_WARPS * AD_CHUNK) {
        const int c = c0 + cell_lane;
        const bool valid = c < c_end;
        const int64_t row = valid ? (int64_t)blocks[c / bc] * bc + c % bc : 0; /* this lane's cell: one lookup */
        /* The chunk's V rows, loaded before the scores so their latency overlaps them. */
        float vf[AD_CHUNK][VPL];
#pragma unroll
        for (int j = 0; j < AD_CHUNK; j++) {
            const int64_t rj = __shfl_sync(0xffffffffu, row, j * 4);
            const __half *vr = (const __half *)(vb + rj * v_width);
#pragma unroll
            for (int i = 0; i < VPL; i++) {
                const int d = lane + 32 * i;
                vf[j][i] = c0 + j < c_end && d < a.head_v ? __half2float(vr[d]) : 0.0f;
            }
        }
        /* Scores: this lane's pieces of its cell's K row against every head of the group. */
        float s[GMAX];
#pragma unroll
        for (int g = 0; g < GMAX; g++) s[g] = 0.0f;
        if (valid) {
            const uint4 *kr = (const uint4 *)(kb + row * k_width);
#pragma unroll 4
            for (int piece = quarter; piece < pieces; piece += 4) {
                const uint4 kv = kr[piece];
                const __half2 *kh = (const __half2 *)&kv;
                float kf[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float2 f = __half22float2(kh[i]);
                    kf[2 * i] = f.x, kf[2 * i + 1] = f.y;
                }
#pragma unroll
                for (int g = 0; g < GMAX; g++)
                    if (g < G) {
                        const float4 *q4 = (const float4 *)(qs + g * a.head_k + piece * 8);
                        const float4 qa = q4[0], qb = q4[1];
                        s[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                                qb.z * kf[6] + qb.w * kf[7];
                    }
            }
        }
        /* Per head: the cell's score (its four lanes summed), the chunk's max and sum, the running
         * max, sum and output rescaled, then the chunk's V rows weighted in. */
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            if (g >= G) continue;
            float sc = s[g];
            sc += __shfl_xor_sync(0xffffffffu, sc, 1);
            sc += __shfl_xor_sync(0xffffffffu, sc, 2);
            sc = valid ? sc * a.scale : -INFINITY;
            float cm = sc;
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 4));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
            const float m_new = fmaxf(m[g], cm); /* finite: cell c0 is valid */
            const float rescale = expf(m[g] - m_new), p = expf(sc - m_new);
            float ps = p;
            ps += __shfl_xor_sync(0xffffffffu, ps, 4);
            ps += __shfl_xor_sync(0xffffffffu, ps, 8);
            ps += __shfl_xor_sync(0xffffffffu, ps, 16);
            l[g] = l[g] * rescale + ps;
            m[g] = m_new;
#pragma unroll
            for (int i = 0; i < VPL; i++) acc[g][i] *= rescale;
#pragma unroll
            for (int j = 0; j < AD_CHUNK; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j * 4); /* 0 for cells past the slice */
#pragma unroll
                for (int i = 0; i < VPL; i++) acc[g][i] += pj * vf[j][i];
            }
        }
    }
    /* The warps' parts merged: 2 and 3 into 0 and 1, then 1 into 0, through shared memory (the
     * queries' room: two warps' outputs and sums). */
    __syncthreads();
    float *mo = sm, *mml = sm + 2 * G * a.head_v; /* [2][G][head_v], [2][G][2] */
    for (int round = 2; round >= 1; round /= 2) {
        if (warp >= round && warp < 2 * round) {
            const int slot = warp - round;
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                if (g >= G) continue;
#pragma unroll
                for (int i = 0; i < VPL; i++) {
                    const int d = lane + 32 * i;
                    if (d < a.head_v) mo[(slot * G + g) * a.head_v + d] = acc[g][i];
                }
                if (lane == 0) mml[(slot * G + g) * 2] = m[g], mml[(slot * G + g) * 2 + 1] = l[g];
            }
        }
        __syncthreads();
        if (warp < round) {
            float om[GMAX], ol[GMAX];
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                om[g] = g < G ? mml[(warp * G + g) * 2] : -INFINITY;
                ol[g] = g < G ? mml[(warp * G + g) * 2 + 1] : 0.0f;
            }
            ad_merge<VPL, GMAX>(G, m, l, acc, om, ol, mo + (int64_t)warp * G * a.head_v, a.head_v, lane);
        }
        __syncthreads();
    }
    if (warp != 0) return;
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (g >= G) continue;
        const int64_t slot = base + (int64_t)g * a.n_splits;
#pragma unroll
        for (int i = 0; i < VPL; i++) {
            const int d = lane + 32 * i;
            if (d < a.head_v) a.part_o[slot * a.head_v + d] = acc[g][i];
        }
        if (lane == 0) {
            a.part_ml[slot * 2] = m[g];
            a.part_ml[slot * 2 + 1] = l[g];
        }
    }
}

/* Merge the slices of one (token, head): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M), in
 * slice order. Empty slices (max -inf: their outputs were never written) are skipped. With at most
 * AC_MAX_SPLITS slices, their factors e^(m_s - M) are computed once into shared memory and the
 * output's loop stops after the last slice with cells; more take them from expf each time. With q
 * (head_v a multiple of 32, at most AC_THREADS), the head's output is also quantized there, a warp
 * a block of 32, as cuda_quantize would (q_sum: Q8_1, else Q8_0). */
enum { AC_THREADS = 128, AC_MAX_SPLITS = 512 };
__global__ void __launch_bounds__(AC_THREADS) attn_combine_kernel(const float *part_o, const float *part_ml, int n_splits,
                                                                  int head_v, float *out, uint8_t *q, bool q_sum) {
    __shared__ float factor[AC_MAX_SPLITS], weighted[AC_MAX_SPLITS]; /* e^(m_s - M), l_s e^(m_s - M) */
    __shared__ float red[AC_THREADS / 32];
    __shared__ int last;
    const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = AC_THREADS / 32;
    const int64_t slot0 = ((int64_t)t * n_head + h) * n_splits;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < n_splits; s += AC_THREADS) mx = fmaxf(mx, part_ml[(slot0 + s) * 2]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    if (threadIdx.x == 0) last = -1;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < n_warps; w++) mx = fmaxf(mx, red[w]);
    const bool cached = n_splits <= AC_MAX_SPLITS;
    float sum = 0.0f;
    if (cached) {
        int mine = -1;
        for (int s = threadIdx.x; s < n_splits; s += AC_THREADS) {
            const float ms = part_ml[(slot0 + s) * 2];
            factor[s] = ms != -INFINITY ? expf(ms - mx) : 0.0f;
            weighted[s] = ms != -INFINITY ? part_ml[(slot0 + s) * 2 + 1] * factor[s] : 0.0f;
            if (ms != -INFINITY) mine = s;
        }
        if (mine >= 0) atomicMax(&last, mine);
        __syncthreads();
        for (int s = 0; s <= last; s++) sum += weighted[s]; /* (every thread the same sum, in slice order) */
    } else {
        for (int s = 0; s < n_splits; s++) {
            const float ms = part_ml[(slot0 + s) * 2];
            if (ms != -INFINITY) sum += part_ml[(slot0 + s) * 2 + 1] * expf(ms - mx);
        }
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    float mine = 0.0f; /* (this thread's first output, for q) */
    for (int d = threadIdx.x; d < head_v; d += AC_THREADS) {
        float o = 0.0f;
        if (cached) {
#pragma unroll 4
            for (int s = 0; s <= last; s++) {
                const float f = factor[s];
                if (f != 0.0f) o += part_o[(slot0 + s) * head_v + d] * f;
            }
        } else {
            for (int s = 0; s < n_splits; s++) {
                const float ms = part_ml[(slot0 + s) * 2];
                if (ms != -INFINITY) o += part_o[(slot0 + s) * head_v + d] * expf(ms - mx);
            }
        }
        out[((int64_t)t * n_head + h) * head_v + d] = o * inv;
        if (d == threadIdx.x) mine = o * inv;
    }
    if (q && warp < head_v / 32) { /* (whole warps: head_v is a multiple of 32) */
        const int64_t block = (((int64_t)t * n_head + h) * head_v) / 32 + warp;
        if (q_sum) qa_q8_value<true>(mine, q + block * 36, lane);
        else qa_q8_value<false>(mine, q + block * 34, lane);
    }
}

static pshard_status merge(const float *part_o, const float *part_ml, int n_splits, int n_head, int head_v, int64_t n_tokens,
                           float *out, enum quant_type q_type, void *q_out, cuda_stream s) {
    attn_combine_kernel<<<dim3((unsigned)n_head, (unsigned)n_tokens), AC_THREADS, 0, raw_stream(s)>>>(
        part_o, part_ml, n_splits, head_v, out, (uint8_t *)q_out, q_type == QUANT_Q8_1);
    CUDA_TRY_LAUNCH("attention combine");
    return PSHARD_OK;
}

extern "C" bool cuda_attention_decode_quantizes(const struct cuda_attn_shape *a, enum quant_type q_type) {
    return (q_type == QUANT_Q8_0 || q_type == QUANT_Q8_1) && a->head_v % 32 == 0 && a->head_v <= AC_THREADS;
}

extern "C" pshard_status cuda_attention_decode(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                               const float *q, const int32_t *seq, const int32_t *pos,
                                               int64_t n_tokens, int32_t max_kv_len, float *out, void *work,
                                               size_t work_bytes, cuda_stream s) {
    return cuda_attention_decode_quantized(a, kv, q, seq, pos, n_tokens, max_kv_len, out, QUANT_F32, NULL, work, work_bytes,
                                           s);
}

extern "C" pshard_status cuda_attention_decode_quantized(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                                         const float *q, const int32_t *seq, const int32_t *pos,
                                                         int64_t n_tokens, int32_t max_kv_len, float *out,
                                                         enum quant_type q_type, void *q_out, void *work, size_t work_bytes,
                                                         cuda_stream s) {
    CUDA_ARG(!q_out || cuda_attention_decode_quantizes(a, q_type), "attention: no quantized output to %s for heads of %d",
             quant_type_name(q_type), a->head_v);
    CUDA_ARG(a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 && a->n_head / a->n_head_kv <= AD_MAX_GROUP,
             "attention: %d query heads over %d KV heads (at most %d per KV head)", a->n_head, a->n_head_kv,
             (int)AD_MAX_GROUP);
    CUDA_ARG(a->head_k % 8 == 0 && a->head_k <= 512 && a->head_v <= 256,
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
    int slice_cells; /* (the kernel cuts each token's own slices: see ad_slice_cells) */
    cuda_decode_split(a, n_tokens, max_kv_len, &p.n_splits, &slice_cells);
    float *part = (float *)work;
    p.part_o = part;
    p.part_ml = part + (size_t)n_tokens * a->n_head * p.n_splits * a->head_v;
    const size_t q_floats = (size_t)p.group * a->head_k, merge_floats = (size_t)p.group * (2 * a->head_v + 4);
    const size_t smem = sizeof(float) * (q_floats > merge_floats ? q_floats : merge_floats);
    const dim3 grid((unsigned)p.n_splits, (unsigned)a->n_head_kv, (unsigned)n_tokens);
    cudaStream_t st = raw_stream(s);
    const bool small_group = p.group <= 8;
    if (a->head_v <= 64)
        small_group ? attn_decode_kernel<2, 8><<<grid, AD_THREADS, smem, st>>>(p) : attn_decode_kernel<2, 16><<<grid, AD_THREADS, smem, st>>>(p);
    else if (a->head_v <= 128)
        small_group ? attn_decode_kernel<4, 8><<<grid, AD_THREADS, smem, st>>>(p) : attn_decode_kernel<4, 16><<<grid, AD_THREADS, smem, st>>>(p);
    else
        small_group ? attn_decode_kernel<8, 8><<<grid, AD_THREADS, smem, st>>>(p) : attn_decode_kernel<8, 16><<<grid, AD_THREADS, smem, st>>>(p);
    CUDA_TRY_LAUNCH("attention decode");
    return merge(p.part_o, p.part_ml, p.n_splits, a->n_head, a->head_v, n_tokens, out, q_type, q_out, s);
}

pshard_status cuda_attention_merge(const float *part_o, const float *part_ml, int n_splits, int n_head, int head_v,
                                   int64_t n_tokens, float *out, cuda_stream s) {
    return merge(part_o, part_ml, n_splits, n_head, head_v, n_tokens, out, QUANT_F32, NULL, s);
}
