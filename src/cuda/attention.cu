/* Decode attention over the f16 KV cache, split over the KV length (flash-decoding): a block
 * takes one token, HB query heads that share one KV head (GQA: their warps read the same K and V
 * rows, mostly from L1 after the first), and one slice of the token's cells. Each warp owns one query
 * head and walks chunks of AD_CHUNK cells, four lanes a cell: a lane takes the 16-byte pieces
 * quarter, quarter + 4, ... of its cell's K row (a warp reads 64 contiguous bytes of each of 8
 * rows) and the same pieces of its V row, keeping its own cell's share of the output while the
 * running max stays the warp's (online softmax); the lanes of one piece sum their cells at the
 * end. A head's R = AD_WARPS / HB warps split the slice's chunks and merge in shared memory, and a second
 * kernel merges the slices. So a warp's chain of dependent instructions is one head's, not a
 * group's: the step's latency, not its bytes, is what a decode step at a short context waits on.
 * The slices are cut from the token's own length (pos + 1) over the grid's n_splits,
 * AD_SLICE_CELLS at the least: a captured step sized for the whole context spreads a short one
 * over few slices, and the others return at once. Scores are q (rounded to f16, as the CPU does)
 * . k in f32, times the scale; probabilities use expf. Any batch: each token has its own sequence
 * and position, its cells found through the sequence's blocks. Heads of up to 256 dimensions, in
 * multiples of 8.
 *
 * Steps of several tokens stage the rows in shared memory (STAGED): the block copies a tile of
 * AD_TILE_CELLS cells' K and V rows there by cp.async, the next tile in flight while its warps
 * walk this one, where every warp loaded the same rows itself before (the block's HB heads share
 * them). Taken where a step of several tokens has slices (a 64-sequence decode step: 9.2 -> 8.2 ms
 * over qwen30b's 48 layers, on two H100s); a prompt step of 2,048 tokens in one slice each ran
 * slower staged (85 -> 120 ms), its blocks already many. A warp walks the same chunks in the same order and does the
 * same arithmetic, so the two variants agree bit for bit. R = 1, 2 or 4 replicas (chunks of a tile
 * a warp). */
#include "cuda/async_copy.cuh"
#include "cuda/cuda_internal.cuh"
#include "cuda/cuda_sizes.h"
#include "cuda/quantize_act.cuh"

#include <math.h>

enum {
    AD_WARPS = 8,                 /* a block's warps: HB heads times R replicas */
    AD_CHUNK = 8,                 /* cells a warp takes at once: four lanes a cell */
    AD_SLICE_CELLS = 2 * AD_CHUNK, /* a slice's cells at the least, and their multiple */
    AD_TILE_CHUNKS = 4,            /* STAGED: a tile's chunks, */
    AD_TILE_CELLS = AD_TILE_CHUNKS * AD_CHUNK,
    AD_ROW_PAD = 64                /* and the bytes after each K and each V row */
};

struct ad_args {
    const float *q;
    const uint16_t *k, *v;   /* the layer's pool */
    const int32_t *blocks;   /* [sequence][blocks_stride]: the table of each sequence's blocks */
    int blocks_stride, block_cells;
    const int32_t *seq, *pos;
    int n_head, n_head_kv, head_k, head_v, group;
    int heads_per_block; /* HB: a divisor of the group, at most AD_WARPS */
    float scale;
    int first;      /* the cells below are attended elsewhere (the host: cuda_attention_decode_from) */
    int n_splits;
    float *part_o;  /* [token][head][split][head_v]: unnormalized outputs */
    float *part_ml; /* [token][head][split][2]: running max and sum (max -inf: an empty slice) */
};

/* The cells of one slice of a token with n_cells cells over n_splits slices. */
__device__ __forceinline__ int ad_slice_cells(int n_cells, int n_splits) {
    const int per = (n_cells + n_splits - 1) / n_splits;
    return (per + AD_SLICE_CELLS - 1) / AD_SLICE_CELLS * AD_SLICE_CELLS;
}

/* Eight halves (a 16-byte piece) as floats. */
__device__ __forceinline__ void ad_halves(uint4 raw, float (&f)[8]) {
    const __half2 *h = (const __half2 *)&raw;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 v = __half22float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

/* The heads a block takes: the largest divisor of the group up to AD_WARPS. */
static int ad_heads_per_block(int group) {
    int hb = group < AD_WARPS ? group : AD_WARPS;
    while (group % hb) hb--;
    return hb;
}

/* One chunk of a warp's walk: the lane's pieces quarter, quarter + 4, ... of its cell's K row kr
 * and V row vr (in global or shared memory; both loaded before any is used), its cell's score,
 * the warp's running max and sum, and the lane's share of the output. */
template <int KP, int VP>
__device__ __forceinline__ void ad_chunk(const float (&q)[KP][8], const uint4 *kr, const uint4 *vr, bool valid, int quarter,
                                         int k_pieces, int v_pieces, float scale, float &m, float &l, float (&acc)[VP][8]) {
    uint4 kraw[KP], vraw[VP];
#pragma unroll
    for (int i = 0; i < KP; i++) kraw[i] = valid && quarter + 4 * i < k_pieces ? kr[quarter + 4 * i] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < VP; i++) vraw[i] = valid && quarter + 4 * i < v_pieces ? vr[quarter + 4 * i] : make_uint4(0, 0, 0, 0);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < KP; i++) {
        float kf[8];
        ad_halves(kraw[i], kf);
        s += q[i][0] * kf[0] + q[i][1] * kf[1] + q[i][2] * kf[2] + q[i][3] * kf[3] + q[i][4] * kf[4] + q[i][5] * kf[5] +
             q[i][6] * kf[6] + q[i][7] * kf[7];
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s = valid ? s * scale : -INFINITY;
    float cm = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 4));
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
    if (cm > m) { /* (warp-uniform; finite: the chunk's first cell is valid) */
        const float rescale = expf(m - cm);
        l *= rescale;
#pragma unroll
        for (int i = 0; i < VP; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i][j] *= rescale;
        m = cm;
    }
    const float p = valid ? expf(s - m) : 0.0f;
    l += p;
#pragma unroll
    for (int i = 0; i < VP; i++) {
        float vf[8];
        ad_halves(vraw[i], vf);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] += p * vf[j];
    }
}

/* STAGED: the bytes a cell takes in a tile in shared memory (its K row, a pad, its V row, a pad).
 * At heads of 64 and 128 the pitch is a multiple of 128 bytes, so the two cells of a quarter-warp's
 * 16-byte loads meet in the same banks (two ways); one pad a cell would part them (not measured). */
__host__ __device__ inline int ad_row_pitch(int head_k, int head_v) { return head_k * 2 + head_v * 2 + 2 * AD_ROW_PAD; }

/* KP, VP: the 16-byte pieces of a K and a V row a lane owns at most (head_k <= 32 KP, head_v <=
 * 32 VP). The block is HB x R warps: warp w takes head w % HB and every R-th chunk from w / HB. */
template <int KP, int VP, bool STAGED> __global__ void __launch_bounds__(32 * AD_WARPS) attn_decode_kernel(const ad_args a) {
    dep_enter();
    __shared__ float merge_o[AD_WARPS][VP * 32], merge_ml[AD_WARPS][2];
    const int HB = a.heads_per_block, R = AD_WARPS / HB, blocks_per_kv = a.group / HB;
    const int split = blockIdx.x, kvh = blockIdx.y / blocks_per_kv, t = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, cell_lane = lane / 4, quarter = lane % 4;
    const int hb = warp % HB, r = warp / HB;
    const int h = kvh * a.group + blockIdx.y % blocks_per_kv * HB + hb; /* this warp's query head */
    const int n_cells = a.pos[t] + 1, slice = ad_slice_cells(n_cells - a.first, a.n_splits);
    const int c_begin = a.first + split * slice, c_end = min(n_cells, c_begin + slice);
    const int64_t slot = ((int64_t)t * a.n_head + h) * a.n_splits + split;
    if (c_begin >= c_end) { /* an empty slice: the merge skips it */
        if (r == 0 && lane == 0) a.part_ml[slot * 2] = -INFINITY, a.part_ml[slot * 2 + 1] = 0.0f;
        return;
    }
    const int k_pieces = a.head_k / 8, v_pieces = a.head_v / 8;
    float q[KP][8];
    const float *qh = a.q + ((int64_t)t * a.n_head + h) * a.head_k;
#pragma unroll
    for (int i = 0; i < KP; i++) {
        const int piece = quarter + 4 * i;
#pragma unroll
        for (int j = 0; j < 8; j++) q[i][j] = piece < k_pieces ? __half2float(__float2half_rn(qh[piece * 8 + j])) : 0.0f;
    }
    const int64_t k_width = (int64_t)a.n_head_kv * a.head_k, v_width = (int64_t)a.n_head_kv * a.head_v;
    const uint16_t *kb = a.k + kvh * a.head_k, *vb = a.v + kvh * a.head_v;
    const int32_t *blocks = a.blocks + (int64_t)a.seq[t] * a.blocks_stride, bc = a.block_cells;
    float m = -INFINITY, l = 0.0f, acc[VP][8];
#pragma unroll
    for (int i = 0; i < VP; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
    if (STAGED) {
        extern __shared__ __align__(16) uint8_t ad_tiles[]; /* [2][AD_TILE_CELLS][ad_row_pitch] */
        const int k_row = a.head_k * 2 + AD_ROW_PAD, pitch = ad_row_pitch(a.head_k, a.head_v);
        const int pieces = k_pieces + v_pieces, n_tiles = (c_end - c_begin + AD_TILE_CELLS - 1) / AD_TILE_CELLS;
        auto load = [&](int tile) { /* the tile's rows, cells past the slice left as they are */
            uint8_t *dst = ad_tiles + (tile & 1) * AD_TILE_CELLS * pitch;
            const int first = c_begin + tile * AD_TILE_CELLS;
            for (int i = threadIdx.x; i < AD_TILE_CELLS * pieces; i += blockDim.x) { /* (HB x R warps: not always AD_WARPS) */
                const int cell = i / pieces, p = i % pieces, c = first + cell;
                if (c >= c_end) break; /* (i grows with the cell) */
                const int64_t row = (int64_t)blocks[c / bc] * bc + c % bc;
                if (p < k_pieces) copy_unit(dst + cell * pitch + p * 16, (const uint8_t *)(kb + row * k_width) + p * 16, 16);
                else copy_unit(dst + cell * pitch + k_row + (p - k_pieces) * 16,
                               (const uint8_t *)(vb + row * v_width) + (p - k_pieces) * 16, 16);
            }
            copy_commit();
        };
        load(0);
        for (int tile = 0; tile < n_tiles; tile++) {
            const bool next = tile + 1 < n_tiles;
            if (next) load(tile + 1);
            copy_wait(next);
            __syncthreads();
            const uint8_t *rows = ad_tiles + (tile & 1) * AD_TILE_CELLS * pitch;
            for (int ch = r; ch < AD_TILE_CHUNKS; ch += R) {
                const int c0 = c_begin + tile * AD_TILE_CELLS + ch * AD_CHUNK;
                if (c0 >= c_end) break;
                const bool valid = c0 + cell_lane < c_end;
                const uint8_t *cell = rows + (ch * AD_CHUNK + cell_lane) * pitch;
                ad_chunk<KP, VP>(q, (const uint4 *)cell, (const uint4 *)(cell + k_row), valid, quarter, k_pieces, v_pieces,
                                 a.scale, m, l, acc);
            }
            __syncthreads(); /* (the next load writes over this tile's buffer) */
        }
    } else {
        for (int c0 = c_begin + r * AD_CHUNK; c0 < c_end; c0 += R * AD_CHUNK) {
            const int c = c0 + cell_lane;
            const bool valid = c < c_end;
            const int64_t row = valid ? (int64_t)blocks[c / bc] * bc + c % bc : 0;
            ad_chunk<KP, VP>(q, (const uint4 *)(kb + row * k_width), (const uint4 *)(vb + row * v_width), valid, quarter,
                             k_pieces, v_pieces, a.scale, m, l, acc);
        }
    }
    /* The eight cells' shares summed: every lane of a quarter ends with its pieces' sums. */
#pragma unroll
    for (int o = 4; o < 32; o *= 2) {
        l += __shfl_xor_sync(0xffffffffu, l, o);
#pragma unroll
        for (int i = 0; i < VP; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], o);
    }
    if (R > 1) { /* the head's replicas, merged by its first in replica order */
        if (r > 0) {
            if (cell_lane == 0)
#pragma unroll
                for (int i = 0; i < VP; i++)
                    if (quarter + 4 * i < v_pieces)
#pragma unroll
                        for (int j = 0; j < 8; j++) merge_o[warp][(quarter + 4 * i) * 8 + j] = acc[i][j];
            if (lane == 0) merge_ml[warp][0] = m, merge_ml[warp][1] = l;
        }
        __syncthreads();
        if (r > 0) return;
        for (int o = 1; o < R; o++) {
            const int w = warp + o * HB;
            const float *ow = merge_o[w];
            const float mo = merge_ml[w][0], M = fmaxf(m, mo);
            if (M == -INFINITY) continue; /* (both walked no cell) */
            const float fa = m == -INFINITY ? 0.0f : expf(m - M), fb = mo == -INFINITY ? 0.0f : expf(mo - M);
            l = l * fa + merge_ml[w][1] * fb;
            m = M;
#pragma unroll
            for (int i = 0; i < VP; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[i][j] = acc[i][j] * fa +
                                (quarter + 4 * i < v_pieces && fb != 0.0f ? ow[(quarter + 4 * i) * 8 + j] * fb : 0.0f);
        }
    }
    if (cell_lane == 0) {
        float *o = a.part_o + slot * a.head_v;
#pragma unroll
        for (int i = 0; i < VP; i++)
            if (quarter + 4 * i < v_pieces) {
                float4 *o4 = (float4 *)(o + (quarter + 4 * i) * 8);
                o4[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
                o4[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
            }
    }
    if (lane == 0) a.part_ml[slot * 2] = m, a.part_ml[slot * 2 + 1] = l;
}

/* Merge the slices of one (token, head): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
 * Empty slices (max -inf: their outputs were never written) are skipped. With host (not NULL),
 * the host's partial sums of the cells before the slices ([token][head][head_v + 2]: max, sum,
 * unnormalized output) are one more, added last. With at most
 * AC_MAX_SPLITS slices, their factors e^(m_s - M) are computed once into shared memory, the sum
 * in slice order, and the output's loop stops after the last slice with cells; more take them
 * from expf each time. The outputs are read as float4 (head_v a multiple of 4), warp w taking
 * slices w, w + 4, ...: four loads in flight a lane instead of one slice after another, the
 * warps' sums then added in warp order. With q (head_v a multiple of 32, at most AC_THREADS), the
 * head's output is also written there for the product after it, a warp a block of 32, as
 * cuda_quantize would (q_out: a qa_out). */
enum { AC_THREADS = 128, AC_WARPS = AC_THREADS / 32, AC_MAX_SPLITS = 512, AC_MAX_HEAD = 256 };
__global__ void __launch_bounds__(AC_THREADS) attn_combine_kernel(const float *part_o, const float *part_ml, int n_splits,
                                                                  int head_v, const float *host, float *out, uint8_t *q,
                                                                  int q_out) {
    dep_enter();
    __shared__ float factor[AC_MAX_SPLITS], weighted[AC_MAX_SPLITS]; /* e^(m_s - M), l_s e^(m_s - M) */
    __shared__ __align__(16) float sums[AC_WARPS][AC_MAX_HEAD];
    __shared__ float red[AC_WARPS];
    __shared__ int last;
    const int h = blockIdx.x, t = blockIdx.y, n_head = gridDim.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t slot0 = ((int64_t)t * n_head + h) * n_splits;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < n_splits; s += AC_THREADS) mx = fmaxf(mx, part_ml[(slot0 + s) * 2]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    if (threadIdx.x == 0) last = -1;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < AC_WARPS; w++) mx = fmaxf(mx, red[w]);
    const float *hs = host ? host + ((int64_t)t * n_head + h) * (head_v + 2) : NULL;
    if (hs) mx = fmaxf(mx, hs[0]);
    const float host_f = hs && hs[0] != -INFINITY ? expf(hs[0] - mx) : 0.0f;
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
    if (host_f != 0.0f) sum += hs[1] * host_f;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int units = head_v / 4, n_slices = cached ? last + 1 : n_splits;
    const float4 *o4 = (const float4 *)part_o;
    for (int u = lane; u < units; u += 32) {
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int s = warp; s < n_slices; s += AC_WARPS) {
            float f;
            if (cached) {
                f = factor[s];
            } else {
                const float ms = part_ml[(slot0 + s) * 2];
                f = ms != -INFINITY ? expf(ms - mx) : 0.0f;
            }
            if (f != 0.0f) {
                const float4 v = o4[(slot0 + s) * units + u];
                o.x += v.x * f, o.y += v.y * f, o.z += v.z * f, o.w += v.w * f;
            }
        }
        ((float4 *)sums[warp])[u] = o;
    }
    __syncthreads();
    float mine = 0.0f; /* (this thread's first output, for q) */
    for (int d = threadIdx.x; d < head_v; d += AC_THREADS) {
        float o = sums[0][d];
#pragma unroll
        for (int w = 1; w < AC_WARPS; w++) o += sums[w][d];
        if (host_f != 0.0f) o += hs[2 + d] * host_f;
        out[((int64_t)t * n_head + h) * head_v + d] = o * inv;
        if (d == threadIdx.x) mine = o * inv;
    }
    if (q && warp < head_v / 32) /* (whole warps: head_v is a multiple of 32) */
        qa_value32(q_out, mine, q, (((int64_t)t * n_head + h) * head_v) / 32 + warp, lane);
}

template <int KP, int VP> static pshard_status ad_launch(bool staged, const ad_args &p, dim3 grid, int threads, cudaStream_t st) {
    if (!staged) {
        CUDA_TRY(launch_dep(attn_decode_kernel<KP, VP, false>, grid, threads, 0, st, p));
    } else {
        const size_t smem = 2 * (size_t)AD_TILE_CELLS * ad_row_pitch(p.head_k, p.head_v);
        CUDA_TRY(cudaFuncSetAttribute(attn_decode_kernel<KP, VP, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_TRY(launch_dep(attn_decode_kernel<KP, VP, true>, grid, threads, smem, st, p));
    }
    return PSHARD_OK;
}

static pshard_status merge(const float *part_o, const float *part_ml, int n_splits, int n_head, int head_v, int64_t n_tokens,
                           const float *host, float *out, enum quant_type q_type, void *q_out, cuda_stream s) {
    CUDA_ARG(head_v % 4 == 0 && head_v <= AC_MAX_HEAD, "attention merge: heads of %d (a multiple of 4, at most %d)", head_v,
             (int)AC_MAX_HEAD);
    CUDA_TRY(launch_dep(attn_combine_kernel, dim3((unsigned)n_head, (unsigned)n_tokens), AC_THREADS, 0, raw_stream(s),
                        part_o, part_ml, n_splits, head_v, host, out, (uint8_t *)q_out, qa_out_of(q_type)));
    return PSHARD_OK;
}

extern "C" bool cuda_attention_decode_quantizes(const struct cuda_attn_shape *a, enum quant_type q_type) {
    return cuda_writes_act(q_type) && a->head_v % 32 == 0 && a->head_v <= AC_THREADS;
}

extern "C" pshard_status cuda_attention_decode(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                               const float *q, const int32_t *seq, const int32_t *pos,
                                               int64_t n_tokens, int32_t max_kv_len, float *out, void *work,
                                               size_t work_bytes, cuda_stream s) {
    return cuda_attention_decode_quantized(a, kv, q, seq, pos, n_tokens, max_kv_len, out, QUANT_F32, NULL, work, work_bytes,
                                           s);
}

/* The decode kernel over cells [first, pos[t]] of each token, its slices' partial sums into work;
 * their count into *n_splits. */
static pshard_status decode_slices(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *q,
                                   const int32_t *seq, const int32_t *pos, int64_t n_tokens, int32_t max_kv_len,
                                   int32_t first, void *work, size_t work_bytes, int *n_splits, cuda_stream s) {
    CUDA_ARG(a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0, "attention: %d query heads over %d KV heads",
             a->n_head, a->n_head_kv);
    CUDA_ARG(a->head_k % 8 == 0 && a->head_v % 8 == 0 && a->head_k <= 256 && a->head_v <= 256,
             "attention: head sizes %d/%d (multiples of 8, at most 256)", a->head_k, a->head_v);
    CUDA_ARG(first >= 0 && first < max_kv_len, "attention: from cell %d of %d", first, max_kv_len);
    CUDA_ARG(work_bytes >= cuda_attention_decode_work_bytes(a, n_tokens, max_kv_len - first),
             "attention: work buffer too small");
    CUDA_ARG(n_tokens < 65536, "attention: %lld tokens in one call", (long long)n_tokens);
    CUDA_ARG(kv->block_cells > 0, "attention: blocks of %d cells", kv->block_cells);
    ad_args p = {};
    p.q = q;
    p.k = kv->k, p.v = kv->v;
    p.blocks = kv->blocks, p.blocks_stride = kv->blocks_stride, p.block_cells = kv->block_cells;
    p.seq = seq, p.pos = pos;
    p.n_head = a->n_head, p.n_head_kv = a->n_head_kv, p.head_k = a->head_k, p.head_v = a->head_v;
    p.group = a->n_head / a->n_head_kv;
    p.heads_per_block = ad_heads_per_block(p.group);
    p.scale = a->scale;
    p.first = first;
    int slice_cells; /* (the kernel cuts each token's own slices: see ad_slice_cells) */
    cuda_decode_split(a, n_tokens, max_kv_len - first, &p.n_splits, &slice_cells);
    *n_splits = p.n_splits;
    if (n_tokens == 0) return PSHARD_OK;
    float *part = (float *)work;
    p.part_o = part;
    p.part_ml = part + (size_t)n_tokens * a->n_head * p.n_splits * a->head_v;
    const int hb = p.heads_per_block, threads = 32 * hb * (AD_WARPS / hb);
    const dim3 grid((unsigned)p.n_splits, (unsigned)(a->n_head_kv * (p.group / hb)), (unsigned)n_tokens);
    cudaStream_t st = raw_stream(s);
    const int widest = a->head_k > a->head_v ? a->head_k : a->head_v, R = AD_WARPS / hb;
    const bool staged = n_tokens > 1 && p.n_splits > 1 && AD_TILE_CHUNKS % R == 0; /* (see the head of the file) */
    if (widest <= 64) return ad_launch<2, 2>(staged, p, grid, threads, st);
    if (widest <= 128) return ad_launch<4, 4>(staged, p, grid, threads, st);
    return ad_launch<8, 8>(staged, p, grid, threads, st);
}

/* The slices' partial sums in work, of a call over cells [first, ...) with n_splits slices. */
static void slice_sums(const struct cuda_attn_shape *a, int64_t n_tokens, int n_splits, void *work, float **part_o,
                       float **part_ml) {
    *part_o = (float *)work;
    *part_ml = *part_o + (size_t)n_tokens * a->n_head * n_splits * a->head_v;
}

extern "C" pshard_status cuda_attention_decode_quantized(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                                         const float *q, const int32_t *seq, const int32_t *pos,
                                                         int64_t n_tokens, int32_t max_kv_len, float *out,
                                                         enum quant_type q_type, void *q_out, void *work, size_t work_bytes,
                                                         cuda_stream s) {
    CUDA_ARG(!q_out || cuda_attention_decode_quantizes(a, q_type), "attention: no quantized output to %s for heads of %d",
             quant_type_name(q_type), a->head_v);
    int n_splits;
    CORE_TRY(decode_slices(a, kv, q, seq, pos, n_tokens, max_kv_len > 0 ? max_kv_len : 1, 0, work, work_bytes, &n_splits, s));
    if (n_tokens == 0) return PSHARD_OK;
    float *part_o, *part_ml;
    slice_sums(a, n_tokens, n_splits, work, &part_o, &part_ml);
    return merge(part_o, part_ml, n_splits, a->n_head, a->head_v, n_tokens, NULL, out, q_type, q_out, s);
}

extern "C" pshard_status cuda_attention_decode_from(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                                    const float *q, const int32_t *seq, const int32_t *pos, int64_t n_tokens,
                                                    int32_t max_kv_len, int32_t first, void *work, size_t work_bytes,
                                                    cuda_stream s) {
    CUDA_ARG(work_bytes >= cuda_attention_split_work_bytes(a, n_tokens, max_kv_len, first),
             "attention: work buffer too small for the host's sums");
    int n_splits;
    return decode_slices(a, kv, q, seq, pos, n_tokens, max_kv_len, first, work, work_bytes, &n_splits, s);
}

extern "C" pshard_status cuda_attention_merge_host(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len,
                                                   int32_t first, float *out, enum quant_type q_type, void *q_out,
                                                   void *work, cuda_stream s) {
    CUDA_ARG(!q_out || cuda_attention_decode_quantizes(a, q_type), "attention: no quantized output to %s for heads of %d",
             quant_type_name(q_type), a->head_v);
    CUDA_ARG(first >= 0 && first < max_kv_len, "attention: from cell %d of %d", first, max_kv_len);
    if (n_tokens == 0) return PSHARD_OK;
    int n_splits, slice_cells;
    cuda_decode_split(a, n_tokens, max_kv_len - first, &n_splits, &slice_cells);
    float *part_o, *part_ml;
    slice_sums(a, n_tokens, n_splits, work, &part_o, &part_ml);
    return merge(part_o, part_ml, n_splits, a->n_head, a->head_v, n_tokens,
                 cuda_attention_host_sums(a, n_tokens, max_kv_len, first, work), out, q_type, q_out, s);
}

pshard_status cuda_attention_merge(const float *part_o, const float *part_ml, int n_splits, int n_head, int head_v,
                                   int64_t n_tokens, float *out, cuda_stream s) {
    return merge(part_o, part_ml, n_splits, n_head, head_v, n_tokens, NULL, out, QUANT_F32, NULL, s);
}
