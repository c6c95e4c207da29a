/* Online-softmax attention over f16 keys and values. Keys are scored a block at a time; the
 * running maximum and sum rescale the output accumulator once per block. The query is rounded
 * to f16 first, as the reference implementation does for its f16 dot products. */
#include "cpu/attention.h"

#include <math.h>

#include "core/cpu_features.h"
#include "cpu/attention_kernels.h"
#include "quant/half.h"

enum { KEY_BLOCK = 64, MAX_HEAD = 512, PREFETCH_CELLS = 8 };

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

void cpu_attention_heads(const struct cpu_attn_shape *s, const float *q, const uint16_t *k, const uint16_t *v,
                         int64_t n_cells, int head_begin, int head_end, float *out) {
    const int group = s->n_head / s->n_head_kv;
    const int64_t k_stride = (int64_t)s->n_head_kv * s->head_k, v_stride = (int64_t)s->n_head_kv * s->head_v;
    float qh[MAX_HEAD], acc[MAX_HEAD], scores[KEY_BLOCK];
    const int simd = cpu_features()->avx2;
    float (*dot_f16)(const float *, const uint16_t *, int) = simd ? attn_dot_f16_avx2 : dot_f16_ref;
    void (*axpy_f16)(float *, float, const uint16_t *, int) = simd ? attn_axpy_f16_avx2 : axpy_f16_ref;
    for (int h = head_begin; h < head_end; h++) {
        const int kvh = h / group;
        for (int i = 0; i < s->head_k; i++) qh[i] = half_to_f32(half_from_f32(q[(int64_t)h * s->head_k + i]));
        for (int i = 0; i < s->head_v; i++) acc[i] = 0.0f;
        float max = -INFINITY, sum = 0.0f;
        for (int64_t c0 = 0; c0 < n_cells; c0 += KEY_BLOCK) {
            const int64_t n = n_cells - c0 < KEY_BLOCK ? n_cells - c0 : KEY_BLOCK;
            float block_max = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                if (c0 + j + PREFETCH_CELLS < n_cells)
                    prefetch_row(k + (c0 + j + PREFETCH_CELLS) * k_stride + (int64_t)kvh * s->head_k, s->head_k);
                scores[j] = dot_f16(qh, k + (c0 + j) * k_stride + (int64_t)kvh * s->head_k, s->head_k) * s->scale;
                block_max = scores[j] > block_max ? scores[j] : block_max;
            }
            const float new_max = block_max > max ? block_max : max;
            const float rescale = expf(max - new_max); /* 0 on the first block */
            sum *= rescale;
            for (int i = 0; i < s->head_v; i++) acc[i] *= rescale;
            for (int64_t j = 0; j < n; j++) {
                if (c0 + j + PREFETCH_CELLS < n_cells)
                    prefetch_row(v + (c0 + j + PREFETCH_CELLS) * v_stride + (int64_t)kvh * s->head_v, s->head_v);
                const float p = expf(scores[j] - new_max);
                sum += p;
                axpy_f16(acc, p, v + (c0 + j) * v_stride + (int64_t)kvh * s->head_v, s->head_v);
            }
            max = new_max;
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int i = 0; i < s->head_v; i++) out[(int64_t)h * s->head_v + i] = acc[i] * inv;
    }
}
