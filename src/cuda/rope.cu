/* RoPE tables and rotation, and the f16 store of new K/V into the cache. The table follows
 * src/cpu/rope.c exactly (multimodal rope too: three chains, one per position, and each pair
 * takes the angle of its section's): theta advances by repeated f32 multiplication with a theta_scale
 * computed on the host by the same powf, the YaRN constants come from the host too, and every
 * product and sum is written unfused (__fmul_rn...) as the CPU compiles it, so only cosf/sinf
 * may differ (by an ulp). */
#include "cuda/cuda_internal.cuh"

#include <math.h>

struct rope_dev {
    int n_dims;
    bool neox;
    float theta_scale, freq_scale, ext_factor, attn_factor, yarn_mscale, corr_lo, corr_hi;
    const float *freq_factors;
    int sections[3]; /* M-RoPE; all 0: one position */
};

/* As cpu_rope_axis. */
__device__ static int rope_axis(const rope_dev &r, int pair) {
    const int total = r.sections[0] + r.sections[1] + r.sections[2];
    if (total <= 0) return 0;
    const int k = pair % total;
    return k < r.sections[0] ? 0 : k < r.sections[0] + r.sections[1] ? 1 : 2;
}

/* Host: the same expressions as cpu_rope_table, evaluated by the same libm. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

static rope_dev rope_prepare(const struct rope_params *p, const float *freq_factors) {
    rope_dev r = {};
    r.n_dims = p->n_dims;
    r.neox = p->neox;
    r.theta_scale = powf(p->freq_base, -2.0f / (float)p->n_dims);
    r.freq_scale = p->freq_scale;
    r.ext_factor = p->ext_factor;
    r.attn_factor = p->attn_factor;
    if (p->ext_factor != 0.0f) {
        r.corr_lo = fmaxf(0.0f, floorf(yarn_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_fast, p->freq_base)));
        r.corr_hi = fminf((float)(p->n_dims - 1), ceilf(yarn_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_slow, p->freq_base)));
        float mscale = p->attn_factor;
        mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
        r.yarn_mscale = mscale;
    }
    r.freq_factors = freq_factors;
    for (int i = 0; i < 3; i++) r.sections[i] = p->sections[i];
    return r;
}

/* One thread per (token, rotated pair): the pair's angle is the position times theta_scale
 * multiplied in i times, rounded each time, as the CPU's sequential chain has it at pair i (a
 * pair walks its own chain of at most n_dims / 2 products: the table is one step of threads, not
 * a token's 64 pairs in a row). With M-RoPE the three positions of token t are pos[t],
 * pos[t + pos_stride], pos[t + 2 * pos_stride]. */
__global__ void rope_table_kernel(const rope_dev r, const int32_t *pos, int64_t pos_stride, int64_t n_tokens, float *cs) {
    dep_enter();
    const int half = r.n_dims / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * half) return;
    const int64_t t = idx / half;
    const int pair = (int)(idx % half), i0 = 2 * pair;
    const bool multi = r.sections[0] + r.sections[1] + r.sections[2] > 0;
    float theta = (float)pos[t + (multi ? rope_axis(r, pair) * pos_stride : 0)];
    for (int j = 0; j < pair; j++) theta = __fmul_rn(theta, r.theta_scale);
    const float factor = r.freq_factors ? r.freq_factors[pair] : 1.0f;
    const float theta_extrap = __fdiv_rn(theta, factor);
    const float theta_interp = __fmul_rn(r.freq_scale, theta_extrap);
    float angle = theta_interp, mscale = r.attn_factor;
    if (r.ext_factor != 0.0f) {
        const float y = __fdiv_rn(__fsub_rn((float)i0 / 2, r.corr_lo), fmaxf(0.001f, __fsub_rn(r.corr_hi, r.corr_lo)));
        const float mix = __fmul_rn(1.0f - fminf(1.0f, fmaxf(0.0f, y)), r.ext_factor);
        angle = __fadd_rn(__fmul_rn(theta_interp, __fsub_rn(1.0f, mix)), __fmul_rn(theta_extrap, mix));
        mscale = r.yarn_mscale;
    }
    float *out = cs + t * r.n_dims;
    out[i0] = __fmul_rn(cosf(angle), mscale);
    out[i0 + 1] = __fmul_rn(sinf(angle), mscale);
}

/* One thread per rotated pair of one head of one token. */
__global__ void rope_apply_kernel(const rope_dev r, const float *cs, float *x, int64_t n_tokens, int n_heads,
                                  int head_size) {
    dep_enter();
    const int half = r.n_dims / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_heads * half) return;
    const int i = (int)(idx % half);
    const int64_t th = idx / half, t = th / n_heads;
    float *v = x + th * head_size;
    const float c = cs[t * r.n_dims + 2 * i], s = cs[t * r.n_dims + 2 * i + 1];
    const int a = r.neox ? i : 2 * i, b = r.neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* A head's RMSNorm (w: its weights, as rmsnorm_kernel; none where the part has no norm) and then
 * its rotation (as rope_apply_kernel), bit for bit, in one pass: one block per head of a token,
 * over the rows of two tensors at once (a layer's q and k heads: one launch), first a's a_rows,
 * then b's. With a store (k_cache set), b's heads (k) also go to the KV cache as kv_store_kernel
 * writes them, and blocks past the heads store v's: the cache written in the same launch. */
struct nr_part {
    float *x;
    const float *w;
    int n_heads;
    bool norm;
};
struct nr_store {
    uint16_t *k_cache, *v_cache; /* NULL: no store */
    const int32_t *blocks;
    int blocks_stride, block_cells;
    const float *v;
    int head_v;
    const int32_t *seq, *pos;
};

/* x rounded to f16, as the KV cache stores it. */
__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

/* The pool row of token t's cell: cell pos[t] of sequence seq[t], through the sequence's blocks. */
__device__ __forceinline__ int64_t pool_row(const int32_t *blocks, int blocks_stride, int block_cells, const int32_t *seq,
                                            const int32_t *pos, int64_t t) {
    const int p = pos[t];
    return (int64_t)blocks[(int64_t)seq[t] * blocks_stride + p / block_cells] * block_cells + p % block_cells;
}

__device__ __forceinline__ int64_t nr_row(const nr_store &st, int64_t t) {
    return pool_row(st.blocks, st.blocks_stride, st.block_cells, st.seq, st.pos, t);
}

__global__ void __launch_bounds__(NORM_THREADS) norm_rope_kernel(const rope_dev r, const float *cs, const nr_part a,
                                                                 const nr_part b, int64_t a_rows, float eps, int head_size,
                                                                 const nr_store st, int64_t b_rows) {
    dep_enter();
    extern __shared__ float normed[];
    if ((int64_t)blockIdx.x >= a_rows + b_rows) { /* a v head to the cache: as kv_store_kernel, rounded to f16 */
        const int64_t th = (int64_t)blockIdx.x - a_rows - b_rows, t = th / b.n_heads, v_width = (int64_t)b.n_heads * st.head_v;
        const int64_t row = nr_row(st, t);
        for (int i = threadIdx.x; i < st.head_v; i += NORM_THREADS) {
            const int64_t at = (th % b.n_heads) * st.head_v + i;
            st.v_cache[row * v_width + at] = f16_bits(st.v[t * v_width + at]);
        }
        return;
    }
    const bool first = (int64_t)blockIdx.x < a_rows;
    const nr_part part = first ? a : b;
    const int64_t th = first ? (int64_t)blockIdx.x : (int64_t)blockIdx.x - a_rows, t = th / part.n_heads;
    const float *w = part.w;
    float *v = part.x + th * head_size;
    if (part.norm) {
        const float scale = rms_scale(v, head_size, eps);
        for (int i = threadIdx.x; i < head_size; i += NORM_THREADS) normed[i] = rms_value(v, w, scale, i);
    } else {
        for (int i = threadIdx.x; i < head_size; i += NORM_THREADS) normed[i] = v[i];
    }
    __syncthreads();
    const int half = r.n_dims / 2;
    /* (b's heads stored: this head's place in its token's K row of the pool) */
    uint16_t *cached = !first && st.k_cache ? st.k_cache + nr_row(st, t) * ((int64_t)part.n_heads * head_size) +
                                                  (th % part.n_heads) * head_size
                                            : nullptr;
    for (int i = threadIdx.x; i < head_size; i += NORM_THREADS) {
        float out;
        if (i >= r.n_dims) {
            out = normed[i];
        } else {
            const bool second = r.neox ? i >= half : i % 2 == 1;
            const int pair = r.neox ? (second ? i - half : i) : i / 2;
            const int ia = r.neox ? pair : 2 * pair, ib = r.neox ? pair + half : 2 * pair + 1;
            const float c = cs[t * r.n_dims + 2 * pair], s = cs[t * r.n_dims + 2 * pair + 1];
            const float x0 = normed[ia], x1 = normed[ib];
            out = second ? __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)) : __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        }
        v[i] = out;
        if (cached) cached[i] = f16_bits(out);
    }
}

static pshard_status norm_rope(const struct rope_params *p, const float *cs, const nr_part a, const nr_part b, float eps,
                               int64_t n_tokens, int head_size, const nr_store &st, cuda_stream s) {
    CUDA_ARG(p->n_dims > 0 && p->n_dims % 2 == 0 && p->n_dims <= head_size && head_size <= 4096,
             "norm+rope: %d of %d dimensions", p->n_dims, head_size);
    const int64_t a_rows = n_tokens * a.n_heads, b_rows = n_tokens * b.n_heads;
    const int64_t rows = a_rows + b_rows + (st.k_cache ? b_rows : 0); /* (with a store: v's heads last) */
    if (rows == 0) return PSHARD_OK;
    CUDA_ARG(rows < (1ll << 31), "norm+rope: %lld heads", (long long)rows);
    CUDA_TRY(launch_dep(norm_rope_kernel, (unsigned)rows, NORM_THREADS, sizeof(float) * (size_t)head_size,
                        raw_stream(s), rope_prepare(p, NULL), cs, a, b, a_rows, eps, head_size, st, b_rows));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_norm_rope(const struct rope_params *p, const float *cs, float *x, const float *w, float eps,
                                        int64_t n_tokens, int n_heads, int head_size, cuda_stream s) {
    return norm_rope(p, cs, nr_part{x, w, n_heads, true}, nr_part{NULL, NULL, 0, false}, eps, n_tokens, head_size,
                     nr_store{}, s);
}

/* q's and k's heads (normed or not) rotated, then k's and v's heads stored into the cache. */
static pshard_status qk_store(const struct rope_params *p, const float *cs, const nr_part q, const nr_part k, float eps,
                              int64_t n_tokens, int head_size, const struct cuda_kv_layer *kv, const float *v, int head_v,
                              const int32_t *seq, const int32_t *pos, cuda_stream s) {
    CUDA_ARG(kv->block_cells > 0 && head_v > 0, "rope+store: blocks of %d cells, heads of %d", kv->block_cells, head_v);
    const nr_store st = {kv->k, kv->v, kv->blocks, kv->blocks_stride, kv->block_cells, v, head_v, seq, pos};
    return norm_rope(p, cs, q, k, eps, n_tokens, head_size, st, s);
}

extern "C" pshard_status cuda_norm_rope_qk_store(const struct rope_params *p, const float *cs, float *q, const float *q_norm,
                                                 int n_head, float *k, const float *k_norm, int n_head_kv, float eps,
                                                 int64_t n_tokens, int head_size, const struct cuda_kv_layer *kv,
                                                 const float *v, int head_v, const int32_t *seq, const int32_t *pos,
                                                 cuda_stream s) {
    return qk_store(p, cs, nr_part{q, q_norm, n_head, true}, nr_part{k, k_norm, n_head_kv, true}, eps, n_tokens, head_size,
                    kv, v, head_v, seq, pos, s);
}

extern "C" pshard_status cuda_rope_qk_store(const struct rope_params *p, const float *cs, float *q, int n_head, float *k,
                                            int n_head_kv, int64_t n_tokens, int head_size, const struct cuda_kv_layer *kv,
                                            const float *v, int head_v, const int32_t *seq, const int32_t *pos,
                                            cuda_stream s) {
    return qk_store(p, cs, nr_part{q, NULL, n_head, false}, nr_part{k, NULL, n_head_kv, false}, 0.0f, n_tokens, head_size,
                    kv, v, head_v, seq, pos, s);
}

extern "C" pshard_status cuda_rope_table(const struct rope_params *p, const float *freq_factors, const int32_t *pos,
                                         int64_t pos_stride, int64_t n_tokens, float *cs, cuda_stream s) {
    CUDA_ARG(p->n_dims > 0 && p->n_dims % 2 == 0, "rope: %d rotated dimensions", p->n_dims);
    CUDA_ARG(!rope_is_multi(p) || pos_stride >= n_tokens, "rope: positions %lld apart for %lld tokens",
             (long long)pos_stride, (long long)n_tokens);
    if (n_tokens == 0) return PSHARD_OK;
    const int64_t n = n_tokens * (p->n_dims / 2);
    CUDA_ARG(ceil_div(n, 256) < (1ll << 31), "rope: %lld tokens", (long long)n_tokens);
    CUDA_TRY(launch_dep(rope_table_kernel, (unsigned)ceil_div(n, 256), 256, 0, raw_stream(s),
                        rope_prepare(p, freq_factors), pos, pos_stride, n_tokens, cs));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_rope_apply(const struct rope_params *p, const float *cs, float *x, int64_t n_tokens,
                                         int n_heads, int head_size, cuda_stream s) {
    CUDA_ARG(p->n_dims > 0 && p->n_dims % 2 == 0 && p->n_dims <= head_size, "rope: %d of %d dimensions", p->n_dims,
             head_size);
    const int64_t n = n_tokens * n_heads * (p->n_dims / 2);
    if (n == 0) return PSHARD_OK;
    CUDA_TRY(launch_dep(rope_apply_kernel, (unsigned)ceil_div(n, 256), 256, 0, raw_stream(s), rope_prepare(p, NULL), cs,
                        x, n_tokens, n_heads, head_size));
    return PSHARD_OK;
}

/* ---- KV store: round to f16 (nearest even, as half_from_f32) into cell pos[t] of seq[t], at its
 * row of the pool through the sequence's blocks. */

__global__ void kv_store_kernel(uint16_t *k_cache, uint16_t *v_cache, const int32_t *blocks, int blocks_stride,
                                int block_cells, const float *k, int64_t k_width, const float *v, int64_t v_width,
                                const int32_t *seq, const int32_t *pos, int64_t n_tokens) {
    dep_enter();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, width = k_width + v_width;
    if (idx >= n_tokens * width) return;
    const int64_t t = idx / width, i = idx % width;
    const int64_t row = pool_row(blocks, blocks_stride, block_cells, seq, pos, t);
    const bool is_k = i < k_width;
    if (is_k) k_cache[row * k_width + i] = f16_bits(k[t * k_width + i]);
    else v_cache[row * v_width + i - k_width] = f16_bits(v[t * v_width + i - k_width]);
}

extern "C" pshard_status cuda_kv_store(const struct cuda_kv_layer *kv, const float *k, const float *v, int64_t k_width,
                                       int64_t v_width, const int32_t *seq, const int32_t *pos, int64_t n_tokens,
                                       cuda_stream s) {
    CUDA_ARG(kv->block_cells > 0, "kv store: blocks of %d cells", kv->block_cells);
    if (n_tokens == 0) return PSHARD_OK;
    /* K and V in one launch: a token's K row, then its V row */
    CUDA_TRY(launch_dep(kv_store_kernel, (unsigned)ceil_div(n_tokens * (k_width + v_width), 256), 256, 0, raw_stream(s),
                        kv->k, kv->v, kv->blocks, kv->blocks_stride, kv->block_cells, k, k_width, v, v_width, seq, pos,
                        n_tokens));
    return PSHARD_OK;
}
