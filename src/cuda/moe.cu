/* Mixture-of-experts on the GPU: routing (softmax, top-k, renormalization, as cpu_moe_route),
 * grouping of the (token, slot) pairs by expert, and the expert FFN, which runs each chosen
 * expert's gate/up/down once per step over all its tokens -- with the matrix-vector kernel up
 * to 8 pairs an expert, with the fused dequantizing GEMM beyond -- then the weighted sum. Small
 * steps (decode) take the fused kernels instead (moe_fused.cuh): two launches, no grouping
 * kernel. Experts can be restricted to a subset (a mask), leaving the others to the CPU or a
 * later call. */
#include "cuda/gemm.cuh"
#include "cuda/moe_fused.cuh"

#include <math.h>

enum { ROUTE_THREADS = 128, GROUP_THREADS = 1024, MOE_MAX_EXPERTS = 2048, MOE_MAX_K = 64 };

/* (value, index) argmax over the block, ties to the lower index. */
__device__ void block_argmax(float v, int i, float *sv, int *si, float *out_v, int *out_i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
    }
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) sv[warp] = v, si[warp] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ROUTE_THREADS / 32; w++)
            if (sv[w] > sv[0] || (sv[w] == sv[0] && si[w] < si[0])) sv[0] = sv[w], si[0] = si[w];
        *out_v = sv[0], *out_i = si[0];
    }
    __syncthreads();
}

/* What the top k compares: a probability, or -0.5 for a NaN one (logits gone NaN upstream), below
 * every probability but still taken before none: the k experts chosen are always real ones. */
__device__ __forceinline__ float route_key(float p) { return p == p ? p : -0.5f; }

/* One block per token. */
__global__ void __launch_bounds__(ROUTE_THREADS) route_kernel(const float *logits, int n_expert, int k, bool normalize,
                                                              int32_t *ids, float *weights, int32_t *mirror,
                                                              int64_t n_pairs) {
    dep_enter();
    __shared__ float probs[MOE_MAX_EXPERTS], pick[MOE_MAX_EXPERTS];
    __shared__ float sv[ROUTE_THREADS / 32], best_v, chosen_w[MOE_MAX_K];
    __shared__ int si[ROUTE_THREADS / 32], best_i;
    __shared__ double sd[ROUTE_THREADS / 32];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float *x = logits + (int64_t)t * n_expert;
    float mx = -INFINITY;
    for (int e = tid; e < n_expert; e += ROUTE_THREADS) mx = fmaxf(mx, probs[e] = x[e]);
    block_argmax(mx, 0, sv, si, &best_v, &best_i);
    mx = best_v;
    double sum = 0.0;
    for (int e = tid; e < n_expert; e += ROUTE_THREADS) sum += probs[e] = expf(probs[e] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (tid % 32 == 0) sd[tid / 32] = sum;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < ROUTE_THREADS / 32; w++) total += sd[w];
    const float inv = (float)(1.0 / total);
    for (int e = tid; e < n_expert; e += ROUTE_THREADS) {
        probs[e] *= inv;
        pick[e] = route_key(probs[e]);
    }
    __syncthreads();
    /* Top k by repeated argmax; keys are >= -0.5, so -1 marks a taken expert. */
    for (int j = 0; j < k; j++) {
        float v = -2.0f;
        int i = 1 << 30;
        for (int e = tid; e < n_expert; e += ROUTE_THREADS)
            if (pick[e] > v) v = pick[e], i = e;
        block_argmax(v, i, sv, si, &best_v, &best_i);
        if (tid == 0) {
            ids[t * k + j] = best_i;
            chosen_w[j] = probs[best_i];
            pick[best_i] = -1.0f;
        }
        __syncthreads();
    }
    if (tid == 0) {
        float wsum = 0.0f;
        for (int j = 0; j < k; j++) wsum += chosen_w[j];
        for (int j = 0; j < k; j++) weights[t * k + j] = normalize ? chosen_w[j] / wsum : chosen_w[j];
        if (mirror) {
            for (int j = 0; j < k; j++) {
                mirror[t * k + j] = ids[t * k + j];
                ((float *)(mirror + n_pairs))[t * k + j] = weights[t * k + j];
            }
            __threadfence_system(); /* in host memory before anything this stream signals later */
        }
    }
}

/* A warp per token, for up to 32 PER_LANE experts (lane + 32 i): the same softmax, top k and
 * weights as route_kernel without a block barrier (a decode step's routing is one token: the
 * block kernel's 2k + 4 barriers were most of its time). */
enum { ROUTE_WARP_LANE_MAX = 8, ROUTE_WARP_EXPERTS = 32 * ROUTE_WARP_LANE_MAX };
template <int PER_LANE>
__global__ void __launch_bounds__(ROUTE_THREADS) route_warp_kernel(const float *logits, int64_t n_tokens, int n_expert,
                                                                   int k, bool normalize, int32_t *ids, float *weights,
                                                                   int32_t *mirror, int64_t n_pairs) {
    dep_enter();
    const int64_t t = (int64_t)blockIdx.x * (ROUTE_THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (t >= n_tokens) return;
    const float *x = logits + t * n_expert;
    float p[PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n_expert ? x[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        p[i] = lane + 32 * i < n_expert ? expf(p[i] - mx) : 0.0f;
        sum += p[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) p[i] *= inv;
    /* Top k by repeated argmax, ties to the lower index; a taken expert's bit set in `taken`. */
    unsigned taken = 0;
    float wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        float v = -1.0f;
        int best = 1 << 30;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) { /* (ascending experts: the first of equals stays) */
            const float key = route_key(p[i]);
            if (!(taken >> i & 1u) && lane + 32 * i < n_expert && key > v) v = key, best = lane + 32 * i;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            const int b2 = __shfl_xor_sync(0xffffffffu, best, o);
            if (v2 > v || (v2 == v && b2 < best)) v = v2, best = b2;
        }
        if (best % 32 == lane) taken |= 1u << (best / 32);
        if (lane == 0) {
            ids[t * k + j] = best;
            weights[t * k + j] = v;
            wsum += v;
        }
    }
    if (lane != 0) return;
    if (normalize)
        for (int j = 0; j < k; j++) weights[t * k + j] /= wsum;
    if (mirror) {
        for (int j = 0; j < k; j++) {
            mirror[t * k + j] = ids[t * k + j];
            ((float *)(mirror + n_pairs))[t * k + j] = weights[t * k + j];
        }
        __threadfence_system(); /* in host memory before anything this stream signals later */
    }
}

extern "C" pshard_status cuda_moe_route_mirror(const float *logits, int64_t n_tokens, int n_expert, int k,
                                               bool normalize, int32_t *ids, float *weights, int32_t *mirror,
                                               cuda_stream s) {
    CUDA_ARG(n_expert > 0 && n_expert <= MOE_MAX_EXPERTS && k > 0 && k <= n_expert && k <= MOE_MAX_K,
             "MoE routing: top %d of %d experts", k, n_expert);
    if (n_tokens == 0) return PSHARD_OK;
    const unsigned warp_blocks = (unsigned)((n_tokens + ROUTE_THREADS / 32 - 1) / (ROUTE_THREADS / 32));
    cudaStream_t st = raw_stream(s);
    if (n_expert <= 128)
        CUDA_TRY(launch_dep(route_warp_kernel<4>, warp_blocks, ROUTE_THREADS, 0, st, logits, n_tokens, n_expert, k,
                            normalize, ids, weights, mirror, n_tokens * k));
    else if (n_expert <= ROUTE_WARP_EXPERTS)
        CUDA_TRY(launch_dep(route_warp_kernel<ROUTE_WARP_LANE_MAX>, warp_blocks, ROUTE_THREADS, 0, st, logits, n_tokens,
                            n_expert, k, normalize, ids, weights, mirror, n_tokens * k));
    else
        CUDA_TRY(launch_dep(route_kernel, (unsigned)n_tokens, ROUTE_THREADS, 0, st, logits, n_expert, k, normalize, ids,
                            weights, mirror, n_tokens * k));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_moe_route(const float *logits, int64_t n_tokens, int n_expert, int k, bool normalize,
                                        int32_t *ids, float *weights, cuda_stream s) {
    return cuda_moe_route_mirror(logits, n_tokens, n_expert, k, normalize, ids, weights, NULL, s);
}

/* ---- a routed split: which of one token's experts the GPU reads in place */

/* plan_routed_split's rule, into a mask of the experts: of the token's N experts from `first`
 * on, the first quota[N] in routing order; and, with resident_too, those below `first`. */
__global__ void routed_mask_kernel(const int32_t *ids, int k, int first, const uint8_t *quota, int n_expert,
                                   bool resident_too, uint8_t *mask) {
    dep_enter();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) mask[e] = 0;
    __syncthreads();
    if (threadIdx.x != 0) return;
    int n = 0, taken = 0;
    for (int j = 0; j < k; j++) n += ids[j] >= first;
    for (int j = 0; j < k; j++) {
        const int e = ids[j];
        if (e >= first && e < n_expert && taken < quota[n]) mask[e] = 1, taken++;
        else if (resident_too && e >= 0 && e < first) mask[e] = 1;
    }
}

extern "C" pshard_status cuda_moe_routed_mask(const int32_t *ids, int k, int first, const uint8_t *quota, int n_expert,
                                              bool resident_too, uint8_t *mask, cuda_stream s) {
    CUDA_ARG(n_expert > 0 && n_expert <= MOE_MAX_EXPERTS && k > 0 && k <= n_expert && k <= MOE_MAX_K && first >= 0,
             "MoE routed split: top %d of %d experts from %d", k, n_expert, first);
    CUDA_TRY(
        launch_dep(routed_mask_kernel, 1, 128, 0, raw_stream(s), ids, k, first, quota, n_expert, resident_too, mask));
    return PSHARD_OK;
}

/* ---- grouping: a counting sort of the pairs by expert, in one block */

/* The block's exclusive prefix sums of three counts a thread (GROUP_THREADS threads), and their
 * totals. */
__device__ void group_scan(int3 mine, int3 *before, int3 *total) {
    __shared__ int3 warp_sums[GROUP_THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int3 v = mine;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const int x = __shfl_up_sync(0xffffffffu, v.x, o), y = __shfl_up_sync(0xffffffffu, v.y, o),
                  z = __shfl_up_sync(0xffffffffu, v.z, o);
        if (lane >= o) v.x += x, v.y += y, v.z += z;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int3 w = lane < GROUP_THREADS / 32 ? warp_sums[lane] : make_int3(0, 0, 0);
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int x = __shfl_up_sync(0xffffffffu, w.x, o), y = __shfl_up_sync(0xffffffffu, w.y, o),
                      z = __shfl_up_sync(0xffffffffu, w.z, o);
            if (lane >= o) w.x += x, w.y += y, w.z += z;
        }
        if (lane < GROUP_THREADS / 32) warp_sums[lane] = w; /* inclusive, over the warps */
    }
    __syncthreads();
    const int3 earlier = warp > 0 ? warp_sums[warp - 1] : make_int3(0, 0, 0);
    *before = make_int3(earlier.x + v.x - mine.x, earlier.y + v.y - mine.y, earlier.z + v.z - mine.z);
    *total = warp_sums[GROUP_THREADS / 32 - 1];
}

struct moe_groups {
    int32_t *expert_start; /* [n_expert + 1] */
    int32_t *active, *n_active, *n_tiles;
    int32_t *tile_expert, *tile_start;
    int32_t *pairs;
};

__global__ void __launch_bounds__(GROUP_THREADS) group_kernel(const int32_t *ids, const uint8_t *mask, int n_pairs,
                                                              int n_expert, moe_groups g) {
    dep_enter();
    __shared__ int count[MOE_MAX_EXPERTS], cursor[MOE_MAX_EXPERTS];
    const int tid = threadIdx.x;
    for (int e = tid; e < n_expert; e += GROUP_THREADS) count[e] = 0;
    __syncthreads();
    for (int p = tid; p < n_pairs; p += GROUP_THREADS) {
        const int e = ids[p];
        if (!mask || mask[e]) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    /* Each thread a run of consecutive experts: their pairs, tiles and whether they are active,
     * placed after the earlier threads' (a scan), so the lists come out in expert order. */
    const int per = (n_expert + GROUP_THREADS - 1) / GROUP_THREADS, e0 = min(n_expert, tid * per),
              e1 = min(n_expert, e0 + per);
    int3 mine = make_int3(0, 0, 0), at, total; /* pairs, tiles, active experts */
    for (int e = e0; e < e1; e++)
        mine.x += count[e], mine.y += (count[e] + GEMM_TILE_M - 1) / GEMM_TILE_M, mine.z += count[e] > 0;
    group_scan(mine, &at, &total);
    for (int e = e0; e < e1; e++) {
        g.expert_start[e] = cursor[e] = at.x;
        if (count[e]) g.active[at.z++] = e;
        for (int s = 0; s < count[e]; s += GEMM_TILE_M) {
            g.tile_expert[at.y] = e;
            g.tile_start[at.y++] = at.x + s;
        }
        at.x += count[e];
    }
    if (tid == 0) {
        g.expert_start[n_expert] = total.x;
        *g.n_tiles = total.y;
        *g.n_active = total.z;
    }
    __syncthreads();
    /* Order inside an expert's group is arbitrary: every pair's result is computed alone. */
    for (int p = tid; p < n_pairs; p += GROUP_THREADS) {
        const int e = ids[p];
        if (!mask || mask[e]) g.pairs[atomicAdd(&cursor[e], 1)] = p;
    }
}

/* out[t] (=|+=) sum_j w[t][j] * down[t * k + j], over the experts computed here, unfused as
 * the CPU sums. */
__global__ void weighted_sum_kernel(const float *down, const int32_t *ids, const float *weights, const uint8_t *mask,
                                    int64_t n_tokens, int k, int64_t n_embd, float *out, bool accumulate) {
    dep_enter();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_embd) return;
    const int64_t t = idx / n_embd, i = idx % n_embd;
    float o = 0.0f;
    for (int j = 0; j < k; j++) {
        const int64_t pair = t * k + j;
        if (mask && !mask[ids[pair]]) continue;
        o = __fadd_rn(o, __fmul_rn(weights[pair], down[pair * n_embd + i]));
    }
    out[idx] = accumulate ? out[idx] + o : o;
}

/* ---- the expert FFN */

struct moe_work {
    moe_groups g;
    float *gate_out, *up_out, *down_out;
    uint8_t *x_act, *x_act_up, *h_act;
    size_t bytes;
};

/* Carve the work buffer at base (cuda_moe_layout's parts; base NULL: every pointer NULL). */
static moe_work moe_layout(const struct cuda_moe *m, int64_t n_tokens, uint8_t *base) {
    const struct cuda_moe_layout L = cuda_moe_layout(m, n_tokens);
    auto at = [&](size_t offset) { return base && offset != CUDA_NO_PART ? base + offset : nullptr; };
    moe_work w = {};
    w.g.expert_start = (int32_t *)at(L.expert_start);
    w.g.active = (int32_t *)at(L.active);
    w.g.n_active = (int32_t *)at(L.n_active);
    w.g.n_tiles = (int32_t *)at(L.n_tiles);
    w.g.tile_expert = (int32_t *)at(L.tile_expert);
    w.g.tile_start = (int32_t *)at(L.tile_start);
    w.g.pairs = (int32_t *)at(L.pairs);
    w.gate_out = (float *)at(L.gate_out);
    w.up_out = (float *)at(L.up_out);
    w.down_out = (float *)at(L.down_out);
    w.x_act = at(L.x_act);
    w.x_act_up = at(L.x_act_up);
    w.h_act = at(L.h_act);
    w.bytes = L.bytes;
    return w;
}

/* Whether the tiled path multiplies mat on int8 tensor cores (mmq.cu), its activations in Q8_1,
 * rather than dequantized to f16 (gemm.cu): from VRAM; read in place over PCIe, the f16 kernel's
 * loads keep more bytes in flight (bench/cuda_kernels.md). */
static bool tiled_int8(const struct cuda_matrix *mat) {
    return !mat->in_place && cuda_int8_products(mat->type, mat->n_cols);
}
/* The activations' format the tiled path reads for mat. */
static enum quant_type tiled_act(const struct cuda_matrix *mat) {
    return tiled_int8(mat) ? cuda_act_type(mat->type) : QUANT_F16;
}

/* One projection of every active expert: matrix mat (3-D, or the pointer table) over the
 * pairs, activations `act` (row = pair / act_div), into y [pairs][mat->n_rows]. */
static pshard_status expert_matmul(const struct cuda_moe *m, const struct cuda_matrix *mat, const void *const *ptrs,
                                   const moe_work &w, int64_t n_tokens, const uint8_t *act, int act_div, float *y,
                                   cudaStream_t st) {
    const int64_t pairs = n_tokens * m->k;
    if (!cuda_moe_tiled(m, n_tokens)) {
        mv_args a = {};
        a.w = (const uint8_t *)mat->data;
        a.row_bytes = mat->row_bytes;
        a.n_rows = (int)mat->n_rows;
        a.act = act;
        a.act_row_bytes = cuda_act_row_bytes(cuda_act_type(mat->type), mat->n_cols);
        a.y = y;
        a.y_stride = mat->n_rows;
        a.pairs = w.g.pairs, a.expert_start = w.g.expert_start, a.active = w.g.active, a.n_active = w.g.n_active;
        a.expert_ptrs = ptrs;
        a.expert_stride = (size_t)mat->n_rows * mat->row_bytes;
        a.act_div = act_div;
        a.in_vram = !mat->in_place && !ptrs; /* (a table may point to host memory) */
        /* The kernels run each group in passes sized to its pairs (matvec_kernel.cuh), whatever
         * the step's token count. */
        return mv_run(mat->type, mat->n_cols, a, CUDA_MATVEC_MAX_TOKENS, (unsigned)(m->n_expert < pairs ? m->n_expert : pairs),
                      st);
    }
    gemm_args a = {};
    a.w = (const uint8_t *)mat->data;
    a.row_bytes = mat->row_bytes;
    a.n_rows = (int)mat->n_rows;
    a.n_cols = (int)mat->n_cols;
    const bool int8 = tiled_int8(mat);
    if (int8) a.act = act, a.act_row_bytes = cuda_act_row_bytes(tiled_act(mat), mat->n_cols);
    else a.x = (const __half *)act, a.x_stride = mat->n_cols;
    a.y = y;
    a.y_stride = mat->n_rows;
    a.pairs = w.g.pairs, a.expert_start = w.g.expert_start, a.tile_expert = w.g.tile_expert;
    a.tile_start = w.g.tile_start, a.n_tiles = w.g.n_tiles;
    a.expert_ptrs = ptrs;
    a.expert_stride = (size_t)mat->n_rows * mat->row_bytes;
    a.act_div = act_div;
    const int64_t tiles = ceil_div(pairs, GEMM_TILE_M) + (m->n_expert < pairs ? m->n_expert : pairs);
    return int8 ? mmq_run(mat->type, a, (unsigned)tiles, st) : gemm_fused_run(mat->type, a, (unsigned)tiles, st);
}

/* ---- the fused kernels of small steps */

static int gcd_int(int a, int b) { return b ? gcd_int(b, a % b) : a; }

/* Blocks of `type` a chunk of a stream of `total` blocks takes: whole blocks, a multiple of 16
 * bytes (so every chunk starts on a load), at most MV_CHUNK bytes, the chunks of the stream made
 * equal (as mv_run does a row's). */
static int stream_chunk_blocks(enum quant_type type, int total) {
    const int bytes = cuda_block_bytes(type), unit = 16 / gcd_int(bytes, 16);
    const int max_blocks = MV_CHUNK / bytes / unit * unit;
    const int n_chunks = (int)ceil_div(total, max_blocks);
    return (int)(ceil_div(ceil_div(total, n_chunks), unit) * unit);
}

/* The stages a warp streaming `total` blocks of `type` in chunks of cb takes by asynchronous
 * copies (up to FUSED_STAGES), and their size: a chunk's bytes rounded up to 16. */
static void stream_stages(enum quant_type type, int total, int cb, int *stage_bytes, int *stages) {
    const int64_t n_chunks = ceil_div(total, cb);
    *stage_bytes = (int)(ceil_div((int64_t)cb * cuda_block_bytes(type), 16) * 16);
    *stages = n_chunks < FUSED_STAGES ? (int)n_chunks : FUSED_STAGES;
}

/* The widest load (16, 8 or 4 bytes) that every row of mat starts on and is a multiple of (0:
 * none). Expert tables (staging slots) put rows on 16 bytes when their size is a multiple. */
static int load_unit(const struct cuda_matrix *mat, const void *const *ptrs) {
    for (int u = 16; u >= 4; u /= 2)
        if (mat->row_bytes % u == 0 && (ptrs || (uintptr_t)mat->data % u == 0)) return u;
    return 0;
}

/* Whether a step of n_tokens takes the fused kernels. */
static bool moe_fused(const struct cuda_moe *m, int64_t n_tokens) {
    return n_tokens <= CUDA_MOE_FUSED_MAX_TOKENS && n_tokens <= CUDA_MATVEC_MAX_TOKENS && !cuda_moe_tiled(m, n_tokens) &&
           m->gate.type == m->up.type && m->k <= FUSED_MAX_K && load_unit(&m->gate, m->gate_ptrs) &&
           load_unit(&m->up, m->up_ptrs) && load_unit(&m->down, m->down_ptrs);
}

extern "C" bool cuda_moe_fuses(const struct cuda_moe *m, int64_t n_tokens) { return moe_fused(m, n_tokens); }

static pshard_status fused_gate_up(enum quant_type type, int nt, const moe_fused_args &a, cudaStream_t st) {
    switch (type) {
    case QUANT_F32: case QUANT_F16: case QUANT_BF16: return moe_gate_up_float(type, nt, a, st);
    case QUANT_Q2_K: case QUANT_Q3_K: case QUANT_Q4_K: case QUANT_Q5_K: case QUANT_Q6_K:
        return moe_gate_up_kquants(type, nt, a, st);
    default: return moe_gate_up_legacy(type, nt, a, st);
    }
}

static pshard_status fused_down(enum quant_type type, const moe_fused_args &a, cudaStream_t st) {
    switch (type) {
    case QUANT_F32: case QUANT_F16: case QUANT_BF16: return moe_down_float(type, a, st);
    case QUANT_Q2_K: case QUANT_Q3_K: case QUANT_Q4_K: case QUANT_Q5_K: case QUANT_Q6_K: return moe_down_kquants(type, a, st);
    default: return moe_down_legacy(type, a, st);
    }
}

/* The fused launches over x quantized for gate (x_act; h in the work buffer's gate_out, quantized
 * for down into its h_act between them). */
static pshard_status moe_ffn_fused(const struct cuda_moe *m, const uint8_t *x_act, const int32_t *ids,
                                   const float *weights, int64_t n_tokens, float *out, bool accumulate, const moe_work &w,
                                   cuda_stream s) {
    const int64_t n_embd = m->gate.n_cols, n_ff = m->gate.n_rows;
    const enum quant_type act = cuda_act_type(m->gate.type);
    moe_fused_args a = {};
    a.gate = (const uint8_t *)m->gate.data, a.up = (const uint8_t *)m->up.data, a.down = (const uint8_t *)m->down.data;
    a.gate_ptrs = m->gate_ptrs, a.up_ptrs = m->up_ptrs, a.down_ptrs = m->down_ptrs;
    a.gate_stride = (size_t)n_ff * m->gate.row_bytes;
    a.down_stride = (size_t)n_embd * m->down.row_bytes;
    a.gu_row_bytes = m->gate.row_bytes, a.down_row_bytes = m->down.row_bytes;
    a.gu_blocks = (int)(n_embd / cuda_block_elems(m->gate.type));
    a.gu_chunk_blocks = stream_chunk_blocks(m->gate.type, 2 * a.gu_blocks);
    a.down_blocks = (int)(n_ff / cuda_block_elems(m->down.type));
    a.down_chunk_blocks = stream_chunk_blocks(m->down.type, m->k * a.down_blocks);
    const int gu = load_unit(&m->gate, m->gate_ptrs), up = load_unit(&m->up, m->up_ptrs);
    a.gu_unit = gu < up ? gu : up;
    a.down_unit = load_unit(&m->down, m->down_ptrs);
    /* Asynchronous copies only where every expert is in VRAM: from host memory they are slower. */
    a.async = !m->gate_ptrs && !m->up_ptrs && !m->down_ptrs && !m->gate.in_place && !m->up.in_place && !m->down.in_place;
    stream_stages(m->gate.type, 2 * a.gu_blocks, a.gu_chunk_blocks, &a.gu_stage_bytes, &a.gu_stages);
    stream_stages(m->down.type, m->k * a.down_blocks, a.down_chunk_blocks, &a.down_stage_bytes, &a.down_stages);
    a.n_embd = (int)n_embd, a.n_ff = (int)n_ff, a.k = m->k, a.n_pairs = (int)(n_tokens * m->k);
    a.ids = ids, a.weights = weights, a.mask = m->expert_mask;
    a.x_act = x_act, a.x_act_row_bytes = cuda_act_row_bytes(act, n_embd);
    a.h = w.gate_out;
    const enum quant_type h_type = cuda_act_type(m->down.type);
    a.h_act = w.h_act, a.h_act_row_bytes = cuda_act_row_bytes(h_type, n_ff);
    a.out = out, a.accumulate = accumulate;
    cudaStream_t st = raw_stream(s);
    CORE_TRY(fused_gate_up(m->gate.type, (int)n_tokens, a, st));
    CORE_TRY(cuda_quantize(h_type, w.gate_out, n_ff, n_tokens * m->k, w.h_act, s));
    return fused_down(m->down.type, a, st);
}

static pshard_status moe_ffn(const struct cuda_moe *m, const float *x, const uint8_t *x_act, const int32_t *ids,
                             const float *weights, int64_t n_tokens, float *out, bool accumulate, void *work,
                             size_t work_bytes, cuda_stream s, bool may_fuse) {
    const int64_t n_embd = m->gate.n_cols, n_ff = m->gate.n_rows, pairs = n_tokens * m->k;
    CUDA_ARG(m->n_expert > 0 && m->n_expert <= MOE_MAX_EXPERTS && m->k > 0 && m->k <= m->n_expert,
             "MoE: top %d of %d experts", m->k, m->n_expert);
    CUDA_ARG(m->up.n_rows == n_ff && m->up.n_cols == n_embd && m->down.n_cols == n_ff && m->down.n_rows == n_embd,
             "MoE: gate/up/down shapes do not match");
    CUDA_ARG(pairs < (1 << 30), "MoE: %lld tokens", (long long)n_tokens);
    CUDA_ARG(work_bytes >= cuda_moe_work_bytes(m, n_tokens), "MoE: work buffer of %zu bytes, %zu needed", work_bytes,
             cuda_moe_work_bytes(m, n_tokens));
    if (n_tokens == 0) return PSHARD_OK;
    CUDA_ARG(cuda_type_supported(m->gate.type) && cuda_type_supported(m->up.type) && cuda_type_supported(m->down.type),
             "MoE: no GPU kernel for %s/%s/%s", quant_type_name(m->gate.type), quant_type_name(m->up.type),
             quant_type_name(m->down.type));
    const int64_t slice = cuda_moe_slice_tokens(m);
    if (n_tokens > slice) { /* slices in turn over the one work buffer: each token's sums are its own */
        const size_t x_act_row = cuda_act_row_bytes(cuda_act_type(m->gate.type), n_embd);
        for (int64_t t = 0; t < n_tokens; t += slice) {
            const int64_t n = n_tokens - t < slice ? n_tokens - t : slice;
            CORE_TRY(moe_ffn(m, x + t * n_embd, x_act ? x_act + (size_t)t * x_act_row : NULL, ids + t * m->k,
                             weights + t * m->k, n, out + t * n_embd, accumulate, work, work_bytes, s, may_fuse));
        }
        return PSHARD_OK;
    }
    cudaStream_t st = raw_stream(s);
    const moe_work w = moe_layout(m, n_tokens, (uint8_t *)work);
    const bool gemm = cuda_moe_tiled(m, n_tokens);
    if (!gemm && !x_act) { /* x quantized once for gate (and up, where they share a format) */
        CORE_TRY(cuda_quantize(cuda_act_type(m->gate.type), x, n_embd, n_tokens, w.x_act, s));
        x_act = w.x_act;
    }
    if (may_fuse && moe_fused(m, n_tokens)) return moe_ffn_fused(m, x_act, ids, weights, n_tokens, out, accumulate, w, s);
    CUDA_TRY(launch_dep(group_kernel, 1, GROUP_THREADS, 0, st, ids, m->expert_mask, (int)pairs, m->n_expert, w.g));
    if (gemm) {
        /* (gate and up in one format: x converted once, quantized for the int8 kernel, else f16) */
        CORE_TRY(cuda_quantize(tiled_act(&m->gate), x, n_embd, n_tokens, w.x_act, s));
        CORE_TRY(expert_matmul(m, &m->gate, m->gate_ptrs, w, n_tokens, w.x_act, m->k, w.gate_out, st));
        const uint8_t *up_act = w.x_act;
        if (tiled_act(&m->up) != tiled_act(&m->gate)) {
            CORE_TRY(cuda_quantize(tiled_act(&m->up), x, n_embd, n_tokens, w.x_act_up, s));
            up_act = w.x_act_up;
        }
        CORE_TRY(expert_matmul(m, &m->up, m->up_ptrs, w, n_tokens, up_act, m->k, w.up_out, st));
    } else {
        const uint8_t *up_act = x_act;
        if (cuda_act_type(m->up.type) != cuda_act_type(m->gate.type)) {
            CORE_TRY(cuda_quantize(cuda_act_type(m->up.type), x, n_embd, n_tokens, w.x_act_up, s));
            up_act = w.x_act_up;
        }
        CORE_TRY(expert_matmul(m, &m->gate, m->gate_ptrs, w, n_tokens, x_act, m->k, w.gate_out, st));
        CORE_TRY(expert_matmul(m, &m->up, m->up_ptrs, w, n_tokens, up_act, m->k, w.up_out, st));
    }
    /* Rows of pairs not computed here hold stale values; nothing below reads them. */
    CORE_TRY(cuda_swiglu(w.gate_out, w.up_out, w.gate_out, pairs * n_ff, s));
    CORE_TRY(cuda_quantize(gemm ? tiled_act(&m->down) : cuda_act_type(m->down.type), w.gate_out, n_ff, pairs, w.h_act, s));
    CORE_TRY(expert_matmul(m, &m->down, m->down_ptrs, w, n_tokens, w.h_act, 1, w.down_out, st));
    CUDA_TRY(launch_dep(weighted_sum_kernel, (unsigned)ceil_div(n_tokens * n_embd, 256), 256, 0, st, w.down_out, ids,
                        weights, m->expert_mask, n_tokens, m->k, n_embd, out, accumulate));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_moe_ffn(const struct cuda_moe *m, const float *x, const int32_t *ids,
                                      const float *weights, int64_t n_tokens, float *out, bool accumulate, void *work,
                                      size_t work_bytes, cuda_stream s) {
    return moe_ffn(m, x, NULL, ids, weights, n_tokens, out, accumulate, work, work_bytes, s, true);
}

extern "C" pshard_status cuda_moe_ffn_quantized(const struct cuda_moe *m, const float *x, const void *x_act,
                                                const int32_t *ids, const float *weights, int64_t n_tokens, float *out,
                                                bool accumulate, void *work, size_t work_bytes, cuda_stream s) {
    return moe_ffn(m, x, (const uint8_t *)x_act, ids, weights, n_tokens, out, accumulate, work, work_bytes, s, true);
}

extern "C" pshard_status cuda_moe_ffn_grouped(const struct cuda_moe *m, const float *x, const int32_t *ids,
                                              const float *weights, int64_t n_tokens, float *out, bool accumulate,
                                              void *work, size_t work_bytes, cuda_stream s) {
    return moe_ffn(m, x, NULL, ids, weights, n_tokens, out, accumulate, work, work_bytes, s, false);
}
