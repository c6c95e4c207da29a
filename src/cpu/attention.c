/* Online-softmax attention over f16 keys and values. Keys are scored a block at a time; the
 * running maximum and sum rescale the output accumulator once per block. The query is rounded
 * to f16 first, as the reference implementation does for its f16 dot products. */
#include "cpu/attention.h"

#include <math.h>

#include "core/cpu_features.h"
#include "cpu/attention_kernels.h"
#include "quant/half.h"

enum { KEY_BLOCK = 64, MAX_HEAD = 512, PREFETCH_CELLS = 8, HEAD_CHUNK = 8 };

/* A cell's row of one KV head is a few cache lines, and the next cell's is a whole row of KV
 * heads further (1-2 KB for qwen30b and llama8b): too far apart for the hardware to follow
 * across pages, so the rows PREFETCH_CELLS cells ahead are asked for by hand. The profile's CPU
 * attention on the H200 machine, llama8b, 16 threads: one token 61-68 GB/s per query head's KV
 * byte against 45-48 without, 4-1024 tokens 86-104 against 59-82 (bench/RESULTS.md); on one
 * thread of the development machine, 32 heads over 4096 cells took 6.0-7.5 ms a layer against
 * 9.3-10.2. The sums are the same, bit for bit. */
static inline void prefetch_row(const uint16_t *row, int n) {
    for (int i = 0; i < n; i += 32) __builtin_prefetch(row + i);
}

static float dot_f16_ref(const float *q, const uint16_t *k, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += q[i] * half_to_f32(k[i]);
    return sum;
}

static void axpy_f16_ref(float *acc, float a, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) acc[i] += a * half_to_f32(v[i]);
}

/* Up to HEAD_CHUNK query heads that share a KV head go through the cache together: each block
 * of key rows is scored for every head while it is in L1, then each block of value rows is added
 * into every head's output. Each head's sums run in the same order as alone, so the result is
 * the same bit for bit; the cache is read once for the heads of a chunk rather than once for
 * each. */
static void attend_chunk(const struct cpu_attn_shape *s, const float *q, const uint16_t *k, const uint16_t *v,
                         int64_t n_cells, int kvh, int h0, int n_heads, float *out) {
    const int64_t k_stride = (int64_t)s->n_head_kv * s->head_k, v_stride = (int64_t)s->n_head_kv * s->head_v;
    const uint16_t *k_head = k + (int64_t)kvh * s->head_k, *v_head = v + (int64_t)kvh * s->head_v;
    float qh[HEAD_CHUNK][MAX_HEAD], acc[HEAD_CHUNK][MAX_HEAD], scores[HEAD_CHUNK][KEY_BLOCK];
    float max[HEAD_CHUNK], sum[HEAD_CHUNK];
    const int simd = cpu_features()->avx2;
    float (*dot_f16)(const float *, const uint16_t *, int) = simd ? attn_dot_f16_avx2 : dot_f16_ref;
    void (*axpy_f16)(float *, float, const uint16_t *, int) = simd ? attn_axpy_f16_avx2 : axpy_f16_ref;
    for (int g = 0; g < n_heads; g++) {
        const float *qg = q + (int64_t)(h0 + g) * s->head_k;
        for (int i = 0; i < s->head_k; i++) qh[g][i] = half_to_f32(half_from_f32(qg[i]));
        for (int i = 0; i < s->head_v; i++) acc[g][i] = 0.0f;
        max[g] = -INFINITY, sum[g] = 0.0f;
    }
    for (int64_t c0 = 0; c0 < n_cells; c0 += KEY_BLOCK) {
        const int64_t n = n_cells - c0 < KEY_BLOCK ? n_cells - c0 : KEY_BLOCK;
        float new_max[HEAD_CHUNK];
        for (int g = 0; g < n_heads; g++) {
            float block_max = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                if (g == 0 && c0 + j + PREFETCH_CELLS < n_cells)
                    prefetch_row(k_head + (c0 + j + PREFETCH_CELLS) * k_stride, s->head_k);
                scores[g][j] = dot_f16(qh[g], k_head + (c0 + j) * k_stride, s->head_k) * s->scale;
                block_max = scores[g][j] > block_max ? scores[g][j] : block_max;
            }
            new_max[g] = block_max > max[g] ? block_max : max[g];
            const float rescale = expf(max[g] - new_max[g]); /* 0 on the first block */
            sum[g] *= rescale;
            for (int i = 0; i < s->head_v; i++) acc[g][i] *= rescale;
        }
        for (int g = 0; g < n_heads; g++) {
            for (int64_t j = 0; j < n; j++) {
                if (g == 0 && c0 + j + PREFETCH_CELLS < n_cells)
                    prefetch_row(v_head + (c0 + j + PREFETCH_CELLS) * v_stride, s->head_v);
                const float p = expf(scores[g][j] - new_max[g]);
                sum[g] += p;
                axpy_f16(acc[g], p, v_head + (c0 + j) * v_stride, s->head_v);
            }
            max[g] = new_max[g];
        }
    }
    for (int g = 0; g < n_heads; g++) {
        const float inv = sum[g] > 0.0f ? 1.0f / sum[g] : 0.0f;
        for (int i = 0; i < s->head_v; i++) out[(int64_t)(h0 + g) * s->head_v + i] = acc[g][i] * inv;
    }
}

void cpu_attention_heads(const struct cpu_attn_shape *s, const float *q, const uint16_t *k, const uint16_t *v,
                         int64_t n_cells, int head_begin, int head_end, float *out) {
    const int group = s->n_head / s->n_head_kv;
    for (int h = head_begin; h < head_end;) {
        const int kvh = h / group, group_end = (kvh + 1) * group;
        const int end = head_end < group_end ? head_end : group_end;
        const int n = end - h < HEAD_CHUNK ? end - h : HEAD_CHUNK;
        attend_chunk(s, q, k, v, n_cells, kvh, h, n, out);
        h += n;
    }
}

void cpu_attention_units(const struct cpu_attn_shape *s, int64_t n_tokens, int n_threads, struct cpu_attn_units *u) {
    const int group = s->n_head / s->n_head_kv;
    int per = group < HEAD_CHUNK ? group : HEAD_CHUNK;
    while (per > 1 && n_tokens * s->n_head_kv * ((group + per - 1) / per) < n_threads) per = (per + 1) / 2;
    u->per = per;
    u->slices = (group + per - 1) / per;
    u->count = n_tokens * s->n_head_kv * u->slices;
}

void cpu_attention_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t unit, int64_t *token,
                        int *head_begin, int *head_end) {
    const int group = s->n_head / s->n_head_kv;
    const int64_t per_token = (int64_t)s->n_head_kv * u->slices;
    *token = unit / per_token;
    const int kvh = (int)(unit % per_token / u->slices), slice = (int)(unit % u->slices);
    *head_begin = kvh * group + slice * u->per;
    *head_end = *head_begin + u->per < (kvh + 1) * group ? *head_begin + u->per : (kvh + 1) * group;
}
