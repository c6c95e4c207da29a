/* Online-softmax attention over f16 keys and values. Keys are scored a block at a time; the
 * running maximum and sum rescale the output accumulator once per block. The query is rounded
 * to f16 first, as the reference implementation does for its f16 dot products. */
#include "cpu/attention.h"

#include <math.h>

#include "core/cpu_features.h"
#include "cpu/attention_kernels.h"
#include "quant/half.h"
#include "quant/quant.h"

enum { KEY_BLOCK = CPU_ATTN_KEY_BLOCK, MAX_HEAD = 512, PREFETCH_CELLS = 8, HEAD_CHUNK = 8 };

/* A prompt's tokens of one sequence go through the cache a tile at a time: up to TILE_ROWS query
 * rows (tokens times the heads of a unit) score each run of SUB_KEYS keys while it is in L1,
 * widened to f32 once for all of them; a decode step's token does the same with the heads of its
 * unit's KV heads, a run of fewer keys where their rows are wider than TILE_HEAD (WIDE_BLOCK
 * values at most). Heads wider than TILE_HEAD go head by head (attend_chunk). A tile's queries,
 * outputs, widened run and scores take about 180 KB of the calling thread's stack. */
enum { TILE_ROWS = CPU_ATTN_TILE_TOKENS, TILE_HEAD = 256, SUB_KEYS = 16, WIDE_BLOCK = 2 * SUB_KEYS * TILE_HEAD };

/* A cell's row of one KV head is a few cache lines, and the next cell's is a whole row of KV
 * heads further (1-2 KB): too far apart for the hardware to follow across pages, so where a tile
 * reads part of each row, the rows PREFETCH_CELLS cells ahead are asked for by hand, which reads
 * the cache markedly faster (bench/RESULTS.md). Whole rows, one after another, the hardware
 * follows, and asking for them as well reads them slower (bench/kv_read_probe.c). The sums are the
 * same, bit for bit. */
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

static void scores_tile_ref(const float *q, int64_t q_stride, int n_rows, const float *k, int64_t k_stride, int n_keys, int n,
                            float scale, float *out, int64_t out_stride) {
    for (int r = 0; r < n_rows; r++)
        for (int j = 0; j < n_keys; j++) {
            float sum = 0.0f;
            for (int i = 0; i < n; i++) sum += q[r * q_stride + i] * k[j * k_stride + i];
            out[r * out_stride + j] = sum * scale;
        }
}

static float max_ref(const float *s, int n) {
    float max = -INFINITY;
    for (int j = 0; j < n; j++) max = s[j] > max ? s[j] : max;
    return max;
}

static float exp_sum_ref(float *s, int n, float max) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += s[j] = expf(s[j] - max);
    return sum;
}

static void accumulate_tile_ref(float *acc, int64_t acc_stride, const float *p, int64_t p_stride, int n_rows, const float *v,
                                int64_t v_stride, int n_keys, int n) {
    for (int r = 0; r < n_rows; r++)
        for (int j = 0; j < n_keys; j++)
            for (int i = 0; i < n; i++) acc[r * acc_stride + i] += p[r * p_stride + j] * v[j * v_stride + i];
}

/* Rows of one KV head from cell c (a multiple of KEY_BLOCK: its key block lies in one block of
 * the view), `stride` values apart: one lookup of the table per block of keys. */
static inline const uint16_t *head_rows(const uint16_t *base, const struct cpu_kv_view *kv, int64_t c, int64_t stride) {
    const int64_t b = c / kv->block_cells;
    return base + ((int64_t)kv->blocks[b] * kv->block_cells + (c - b * kv->block_cells)) * stride;
}

/* Where to prefetch row j + PREFETCH_CELLS of the key block at `rows`, the next key block's rows
 * being `next` (NULL: past the cells). */
static inline const uint16_t *ahead_row(const uint16_t *rows, const uint16_t *next, int64_t j, int64_t stride) {
    const int64_t a = j + PREFETCH_CELLS;
    return a < KEY_BLOCK ? rows + a * stride : next ? next + (a - KEY_BLOCK) * stride : NULL;
}

/* Up to HEAD_CHUNK query heads that share a KV head go through the cache together: each block
 * of key rows is scored for every head while it is in L1, then each block of value rows is added
 * into every head's output. Each head's sums run in the same order as alone, so the result is
 * the same bit for bit; the cache is read once for the heads of a chunk rather than once for
 * each. Cells [c_begin, c_end), c_begin a multiple of KEY_BLOCK. */
/* partial (not NULL): each head's maximum, sum and unnormalized output go there instead, head g's
 * at partial + g * partial_stride (a run of a split step). */
static void attend_chunk(const struct cpu_attn_shape *s, const float *q, const struct cpu_kv_view *kv, int64_t c_begin,
                         int64_t c_end, int kvh, int h0, int n_heads, float *out, float *partial, int64_t partial_stride) {
    const int64_t k_stride = (int64_t)s->n_head_kv * s->head_k, v_stride = (int64_t)s->n_head_kv * s->head_v;
    const uint16_t *k_base = kv->k + (int64_t)kvh * s->head_k, *v_base = kv->v + (int64_t)kvh * s->head_v;
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
    const uint16_t *k_rows = c_begin < c_end ? head_rows(k_base, kv, c_begin, k_stride) : NULL;
    const uint16_t *v_rows = c_begin < c_end ? head_rows(v_base, kv, c_begin, v_stride) : NULL;
    for (int64_t c0 = c_begin; c0 < c_end; c0 += KEY_BLOCK) {
        const int64_t n = c_end - c0 < KEY_BLOCK ? c_end - c0 : KEY_BLOCK;
        /* the next block's rows, for the prefetches that reach past this one */
        const bool more = c0 + KEY_BLOCK < c_end;
        const uint16_t *k_next = more ? head_rows(k_base, kv, c0 + KEY_BLOCK, k_stride) : NULL;
        const uint16_t *v_next = more ? head_rows(v_base, kv, c0 + KEY_BLOCK, v_stride) : NULL;
        float new_max[HEAD_CHUNK];
        for (int g = 0; g < n_heads; g++) {
            float block_max = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                if (g == 0 && c0 + j + PREFETCH_CELLS < c_end) prefetch_row(ahead_row(k_rows, k_next, j, k_stride), s->head_k);
                scores[g][j] = dot_f16(qh[g], k_rows + j * k_stride, s->head_k) * s->scale;
                block_max = scores[g][j] > block_max ? scores[g][j] : block_max;
            }
            new_max[g] = block_max > max[g] ? block_max : max[g];
            const float rescale = expf(max[g] - new_max[g]); /* 0 on the first block */
            sum[g] *= rescale;
            for (int i = 0; i < s->head_v; i++) acc[g][i] *= rescale;
        }
        for (int g = 0; g < n_heads; g++) {
            for (int64_t j = 0; j < n; j++) {
                if (g == 0 && c0 + j + PREFETCH_CELLS < c_end) prefetch_row(ahead_row(v_rows, v_next, j, v_stride), s->head_v);
                const float p = expf(scores[g][j] - new_max[g]);
                sum[g] += p;
                axpy_f16(acc[g], p, v_rows + j * v_stride, s->head_v);
            }
            max[g] = new_max[g];
        }
        k_rows = k_next, v_rows = v_next;
    }
    for (int g = 0; g < n_heads; g++) {
        if (partial) {
            float *pg = partial + g * partial_stride;
            pg[0] = max[g], pg[1] = sum[g];
            for (int i = 0; i < s->head_v; i++) pg[2 + i] = acc[g][i];
            continue;
        }
        const float inv = sum[g] > 0.0f ? 1.0f / sum[g] : 0.0f;
        for (int i = 0; i < s->head_v; i++) out[(int64_t)(h0 + g) * s->head_v + i] = acc[g][i] * inv;
    }
}

/* The n cells of a key block of a tile's KV heads (rows `width` values, `stride` apart, from
 * `rows`; the next key block's from `next`) widened to f32 into `block`, a row after another; the
 * rows PREFETCH_CELLS ahead are asked for on the way where they are part of each cell's (left:
 * cells before `left` of the tile's end). */
static void widen_block(void (*widen)(const void *, float *, int64_t), const uint16_t *rows, const uint16_t *next,
                        int64_t stride, int width, int64_t j0, int64_t n, int64_t left, float *block) {
    for (int64_t j = j0; j < j0 + n; j++) {
        if (width < stride && j + PREFETCH_CELLS < left) prefetch_row(ahead_row(rows, next, j, stride), width);
        widen(rows + j * stride, block + (j - j0) * width, width);
    }
}

/* The same for a tile of tokens of one sequence, token i attending cells [c_begin, n_cells[i])
 * (c_begin a multiple of KEY_BLOCK): each run of keys of a block, then of its values, is widened
 * to f32 once, while it stays in L1, and serves every (token, head) row of the tile. A row's
 * operations do not depend on the other rows of its tile or on its place among them, so each
 * token's result is the one it gets alone, bit for bit; the cache is read once for the tile rather
 * than once for each token (a prompt step of n tokens would read it n times), and once for the
 * heads of a KV head, widened once for all of them (a decode step's).
 *
 * One token (n_tokens 1) may take kv_count > 1 KV heads, kvh onwards, n_heads / kv_count query
 * heads each (their whole groups): a run's rows are then widened across all of them, a cell's
 * rows of its KV heads being side by side, so the cache is read in one pass from its first cell to
 * its last rather than once for each KV head, each pass taking a few lines of every cell's row.
 * partial (one token; not NULL): each head's maximum, sum and unnormalized output go there
 * instead, as attend_chunk's. */
static void attend_tile(const struct cpu_attn_shape *s, const float *q, const int64_t *n_cells, int n_tokens,
                        const struct cpu_kv_view *kv, int kvh, int kv_count, int h0, int n_heads, int64_t c_begin,
                        float *out, float *partial, int64_t partial_stride) {
    const int64_t k_stride = (int64_t)s->n_head_kv * s->head_k, v_stride = (int64_t)s->n_head_kv * s->head_v;
    const int64_t q_width = (int64_t)s->n_head * s->head_k, o_width = (int64_t)s->n_head * s->head_v;
    const uint16_t *k_base = kv->k + (int64_t)kvh * s->head_k, *v_base = kv->v + (int64_t)kvh * s->head_v;
    const int k_width = kv_count * s->head_k, v_width = kv_count * s->head_v, per = n_heads / kv_count;
    const int widest = k_width > v_width ? k_width : v_width;
    const int sub = widest <= TILE_HEAD ? SUB_KEYS : WIDE_BLOCK / widest; /* keys a run widens */
    float qh[TILE_ROWS][TILE_HEAD], acc[TILE_ROWS][TILE_HEAD], block[WIDE_BLOCK], scores[TILE_ROWS][KEY_BLOCK];
    float max[TILE_ROWS], sum[TILE_ROWS], new_max[TILE_ROWS];
    const struct cpu_features *f = cpu_features();
    const int simd = f->avx2;
    void (*score)(const float *, int64_t, int, const float *, int64_t, int, int, float, float *, int64_t) =
        simd ? attn_scores_tile_avx2 : scores_tile_ref;
    float (*block_max)(const float *, int) = simd ? attn_max_avx2 : max_ref;
    float (*exp_sum)(float *, int, float) = simd ? attn_exp_sum_avx2 : exp_sum_ref;
    /* (the outputs on AVX-512 wherever it runs: the AVX2 kernel's sums, faster; bench/RESULTS.md) */
    void (*accumulate)(float *, int64_t, const float *, int64_t, int, const float *, int64_t, int, int) =
        f->avx512 ? attn_accumulate_tile_avx512 : simd ? attn_accumulate_tile_avx2 : accumulate_tile_ref;
    void (*widen)(const void *, float *, int64_t) = quant_kernels_get(QUANT_F16)->dequant_row;
    const int rows = n_tokens * n_heads;
    int64_t longest = 0;
    for (int i = 0; i < n_tokens; i++) longest = n_cells[i] > longest ? n_cells[i] : longest;
    for (int r = 0; r < rows; r++) {
        const float *qr = q + (int64_t)(r / n_heads) * q_width + (int64_t)(h0 + r % n_heads) * s->head_k;
        for (int i = 0; i < s->head_k; i++) qh[r][i] = half_to_f32(half_from_f32(qr[i]));
        for (int i = 0; i < s->head_v; i++) acc[r][i] = 0.0f;
        max[r] = -INFINITY, sum[r] = 0.0f;
    }
    const uint16_t *k_rows = longest > c_begin ? head_rows(k_base, kv, c_begin, k_stride) : NULL;
    const uint16_t *v_rows = longest > c_begin ? head_rows(v_base, kv, c_begin, v_stride) : NULL;
    for (int64_t c0 = c_begin; c0 < longest; c0 += KEY_BLOCK) {
        const int64_t n = longest - c0 < KEY_BLOCK ? longest - c0 : KEY_BLOCK;
        const bool more = c0 + KEY_BLOCK < longest;
        const uint16_t *k_next = more ? head_rows(k_base, kv, c0 + KEY_BLOCK, k_stride) : NULL;
        const uint16_t *v_next = more ? head_rows(v_base, kv, c0 + KEY_BLOCK, v_stride) : NULL;
        int64_t take[TILE_ROWS]; /* the block's cells each token attends */
        for (int i = 0; i < n_tokens; i++) take[i] = n_cells[i] - c0 < n ? n_cells[i] - c0 : n;
        /* Keys, then values, a run of rows at a time: a run widened to f32 stays in L1 while every
         * row of the tile reads it. Each score and each output's sums run as over the whole block
         * at once (a key's dot alone, an output's adds in the order of the keys). */
        for (int64_t j0 = 0; j0 < n; j0 += sub) {
            const int64_t m = n - j0 < sub ? n - j0 : sub;
            widen_block(widen, k_rows, k_next, k_stride, k_width, j0, m, longest - c0, block);
            /* (every row scores the run's m keys; those past a row's own cells go unread) */
            for (int g = 0; g < kv_count; g++) /* (one KV head: every token's rows in one call) */
                score(qh[g * per], TILE_HEAD, kv_count == 1 ? rows : per, block + g * s->head_k, k_width, (int)m, s->head_k,
                      s->scale, scores[g * per] + j0, KEY_BLOCK);
        }
        for (int r = 0; r < rows; r++) {
            const int64_t nr = take[r / n_heads];
            if (nr <= 0) continue;
            const float m = block_max(scores[r], (int)nr);
            new_max[r] = m > max[r] ? m : max[r];
            const float rescale = expf(max[r] - new_max[r]); /* 0 on the first block */
            for (int i = 0; i < s->head_v; i++) acc[r][i] *= rescale;
            sum[r] = sum[r] * rescale + exp_sum(scores[r], (int)nr, new_max[r]); /* (the weights, in place) */
            max[r] = new_max[r];
        }
        for (int64_t j0 = 0; j0 < n; j0 += sub) {
            const int64_t m = n - j0 < sub ? n - j0 : sub;
            widen_block(widen, v_rows, v_next, v_stride, v_width, j0, m, longest - c0, block);
            for (int r = 0; r < rows;) { /* a token's rows of one KV head together: as many keys */
                const int64_t nr = take[r / n_heads] - j0;
                if (nr > 0)
                    accumulate(acc[r], TILE_HEAD, scores[r] + j0, KEY_BLOCK, per, block + r % n_heads / per * s->head_v,
                               v_width, (int)(nr < m ? nr : m), s->head_v);
                r += per;
            }
        }
        k_rows = k_next, v_rows = v_next;
    }
    for (int r = 0; r < rows; r++) {
        if (partial) {
            float *pr = partial + r * partial_stride;
            pr[0] = max[r], pr[1] = sum[r];
            for (int i = 0; i < s->head_v; i++) pr[2 + i] = acc[r][i];
            continue;
        }
        const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
        float *o = out + (int64_t)(r / n_heads) * o_width + (int64_t)(h0 + r % n_heads) * s->head_v;
        for (int i = 0; i < s->head_v; i++) o[i] = acc[r][i] * inv;
    }
}

/* Whether heads this wide go through attend_tile (wider ones through attend_chunk). */
static bool tiles(const struct cpu_attn_shape *s) { return s->head_k <= TILE_HEAD && s->head_v <= TILE_HEAD; }

/* The KV heads one token's tile takes from head h up to head_end: whole groups of at most
 * HEAD_CHUNK heads, h the first of its group, as many as fit TILE_ROWS rows and a widened run of
 * at least 8 keys; else 1 (the heads of one KV head, HEAD_CHUNK at most). */
static int tile_kv_heads(const struct cpu_attn_shape *s, int h, int head_end) {
    const int group = s->n_head / s->n_head_kv, widest = s->head_k > s->head_v ? s->head_k : s->head_v;
    if (!tiles(s) || group > HEAD_CHUNK || h % group) return 1;
    const int whole = (head_end - h) / group, most_rows = TILE_ROWS / group, most_wide = WIDE_BLOCK / 8 / widest;
    const int most = most_rows < most_wide ? most_rows : most_wide;
    return whole < 1 ? 1 : whole < most ? whole : most;
}

/* One token's heads [head_begin, head_end) over cells [c_begin, c_end) (c_begin a multiple of
 * KEY_BLOCK), into out, or (partial not NULL) head h's sums at partial + h * partial_stride. */
static void attend_heads(const struct cpu_attn_shape *s, const float *q, const struct cpu_kv_view *kv, int64_t c_begin,
                         int64_t c_end, int head_begin, int head_end, float *out, float *partial, int64_t partial_stride) {
    const int group = s->n_head / s->n_head_kv;
    for (int h = head_begin; h < head_end;) {
        const int kvh = h / group, group_end = (kvh + 1) * group < head_end ? (kvh + 1) * group : head_end;
        const int kv_count = tile_kv_heads(s, h, head_end);
        const int n = kv_count > 1 ? kv_count * group : group_end - h < HEAD_CHUNK ? group_end - h : HEAD_CHUNK;
        float *p = partial ? partial + h * partial_stride : NULL;
        if (p && c_end <= c_begin) /* past the token's cells: nothing */
            for (int g = 0; g < n; g++) p[g * partial_stride] = -INFINITY, p[g * partial_stride + 1] = 0.0f;
        else if (tiles(s)) attend_tile(s, q, &c_end, 1, kv, kvh, kv_count, h, n, c_begin, out, p, partial_stride);
        else attend_chunk(s, q, kv, c_begin, c_end, kvh, h, n, out, p, partial_stride);
        h += n;
    }
}

void cpu_attention_heads(const struct cpu_attn_shape *s, const float *q, const struct cpu_kv_view *kv, int64_t n_cells,
                         int head_begin, int head_end, float *out) {
    attend_heads(s, q, kv, 0, n_cells, head_begin, head_end, out, NULL, 0);
}

void cpu_attention_tokens(const struct cpu_attn_shape *s, const float *q, const struct cpu_kv_view *kv,
                          const int64_t *n_cells, int n_tokens, int head_begin, int head_end, float *out) {
    const int64_t q_width = (int64_t)s->n_head * s->head_k, o_width = (int64_t)s->n_head * s->head_v;
    const int group = s->n_head / s->n_head_kv;
    if (n_tokens == 1 || !tiles(s)) {
        for (int i = 0; i < n_tokens; i++)
            cpu_attention_heads(s, q + i * q_width, kv, n_cells[i], head_begin, head_end, out + i * o_width);
        return;
    }
    for (int h = head_begin; h < head_end;) {
        const int kvh = h / group, group_end = (kvh + 1) * group;
        const int end = head_end < group_end ? head_end : group_end;
        const int heads = end - h < HEAD_CHUNK ? end - h : HEAD_CHUNK, step = TILE_ROWS / heads;
        for (int t0 = 0; t0 < n_tokens; t0 += step)
            attend_tile(s, q + t0 * q_width, n_cells + t0, n_tokens - t0 < step ? n_tokens - t0 : step, kv, kvh, 1, h, heads,
                        0, out + t0 * o_width, NULL, 0);
        h += heads;
    }
}

/* Units of a token's (or a tile's) heads sharing a KV head, or of one token's heads of kv_per KV
 * heads, each over a run of its cells; tiles first shrink, then the KV heads a unit takes, then
 * the query heads, until there is a unit for every thread. */
static int64_t unit_count(const struct cpu_attn_shape *s, int64_t n_tokens, int tokens, int per, int kv_per, int splits) {
    const int group = s->n_head / s->n_head_kv;
    const int64_t tiles = (n_tokens + tokens - 1) / tokens;
    if (kv_per > 1) return tiles * ((s->n_head_kv + kv_per - 1) / kv_per) * splits;
    return tiles * s->n_head_kv * ((group + per - 1) / per) * splits;
}

void cpu_attention_units(const struct cpu_attn_shape *s, int64_t n_tokens, int64_t max_cells, bool one_sequence,
                         int n_threads, struct cpu_attn_units *u) {
    const int group = s->n_head / s->n_head_kv;
    int per = group < HEAD_CHUNK ? group : HEAD_CHUNK, splits = 1;
    int64_t split_cells = 0;
    if ((n_tokens == 1 || (!one_sequence && n_tokens <= CPU_ATTN_SPLIT_TOKENS)) && max_cells >= 2 * CPU_ATTN_SPLIT_CELLS) {
        split_cells = CPU_ATTN_SPLIT_CELLS;
        if (max_cells > (int64_t)CPU_ATTN_MAX_SPLITS * split_cells) /* whole key blocks, at most the most runs */
            split_cells = (max_cells + CPU_ATTN_MAX_SPLITS * KEY_BLOCK - 1) / (CPU_ATTN_MAX_SPLITS * KEY_BLOCK) * KEY_BLOCK;
        splits = (int)((max_cells + split_cells - 1) / split_cells);
    }
    int tokens = splits == 1 && one_sequence && s->head_k <= TILE_HEAD && s->head_v <= TILE_HEAD ? TILE_ROWS / per : 1;
    if (tokens > n_tokens) tokens = (int)(n_tokens > 0 ? n_tokens : 1);
    while (tokens > 1 && unit_count(s, n_tokens, tokens, per, 1, splits) < n_threads) tokens = (tokens + 1) / 2;
    /* A token's unit takes every KV head of its run of cells and reads it in one pass, a cell's
     * rows of all of them side by side (attend_tile): one thread reads such a run about three times
     * as fast as in a pass for each KV head, or in parts of each row (bench/RESULTS.md). Fewer KV
     * heads a unit only where there are fewer units than threads. */
    int kv_per = tokens == 1 ? s->n_head_kv : 1;
    while (kv_per > 1 && unit_count(s, n_tokens, tokens, per, kv_per, splits) < n_threads) kv_per = (kv_per + 1) / 2;
    while (kv_per == 1 && per > 1 && unit_count(s, n_tokens, tokens, per, 1, splits) < n_threads) per = (per + 1) / 2;
    u->per = kv_per > 1 ? group : per;
    u->slices = kv_per > 1 ? 1 : (group + per - 1) / per;
    u->kv_per = kv_per;
    u->tokens = tokens;
    u->splits = splits;
    u->split_cells = split_cells;
    u->n_tokens = n_tokens;
    u->count = unit_count(s, n_tokens, tokens, per, kv_per, splits);
}

void cpu_attention_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t unit, int64_t *token_begin,
                        int64_t *token_end, int *head_begin, int *head_end, int *split) {
    const int group = s->n_head / s->n_head_kv;
    *split = (int)(unit % u->splits);
    unit /= u->splits;
    const int kv_units = (s->n_head_kv + u->kv_per - 1) / u->kv_per;
    const int64_t per_tile = (int64_t)kv_units * u->slices;
    *token_begin = unit / per_tile * u->tokens;
    *token_end = *token_begin + u->tokens < u->n_tokens ? *token_begin + u->tokens : u->n_tokens;
    const int kvu = (int)(unit % per_tile / u->slices), slice = (int)(unit % u->slices);
    if (u->kv_per > 1) { /* whole groups of KV heads kvu * kv_per .. */
        const int kv_end = (kvu + 1) * u->kv_per < s->n_head_kv ? (kvu + 1) * u->kv_per : s->n_head_kv;
        *head_begin = kvu * u->kv_per * group;
        *head_end = kv_end * group;
        return;
    }
    *head_begin = kvu * group + slice * u->per;
    *head_end = *head_begin + u->per < (kvu + 1) * group ? *head_begin + u->per : (kvu + 1) * group;
}

/* A run's partial sums of (token, head) in the step's buffer. */
static inline int64_t partial_at(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t token, int head,
                                 int split) {
    return ((token * s->n_head + head) * u->splits + split) * (s->head_v + 2);
}

void cpu_attention_split(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *q,
                         const struct cpu_kv_view *kv, int64_t n_cells, int64_t token, int head_begin, int head_end, int split,
                         float *partial) {
    const int64_t c0 = split * u->split_cells, end = c0 + u->split_cells < n_cells ? c0 + u->split_cells : n_cells;
    const int64_t stride = (int64_t)u->splits * (s->head_v + 2); /* from one head's run to the next head's */
    attend_heads(s, q, kv, c0, end, head_begin, head_end, NULL, partial + partial_at(s, u, token, 0, split), stride);
}

void cpu_attention_run_unit(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, int64_t token_begin,
                            int64_t token_end, int head_begin, int head_end, int split, const float *q,
                            const struct cpu_kv_view *kv, const int64_t *n_cells, float *partial, float *out) {
    const float *qt = q + token_begin * s->n_head * s->head_k;
    if (u->splits > 1)
        cpu_attention_split(s, u, qt, kv, n_cells[0], token_begin, head_begin, head_end, split, partial);
    else
        cpu_attention_tokens(s, qt, kv, n_cells, (int)(token_end - token_begin), head_begin, head_end,
                             out + token_begin * s->n_head * s->head_v);
}

/* The runs of (token t, head h) summed: their largest maximum, and the sum and output scaled to
 * it, into max, *sum and o. */
static void merge_runs(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *partial, int64_t t,
                       int h, float *max, float *sum, float *o) {
    const float *p = partial + partial_at(s, u, t, h, 0);
    *max = -INFINITY, *sum = 0.0f;
    for (int j = 0; j < u->splits; j++) *max = p[j * (s->head_v + 2)] > *max ? p[j * (s->head_v + 2)] : *max;
    for (int i = 0; i < s->head_v; i++) o[i] = 0.0f;
    for (int j = 0; j < u->splits; j++) {
        const float *r = p + j * (s->head_v + 2);
        if (!(r[1] > 0.0f)) continue; /* an empty run */
        const float w = expf(r[0] - *max);
        *sum += w * r[1];
        for (int i = 0; i < s->head_v; i++) o[i] += w * r[2 + i];
    }
}

void cpu_attention_merge(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *partial, float *out) {
    for (int64_t t = 0; t < u->n_tokens; t++)
        for (int h = 0; h < s->n_head; h++) {
            float max, sum, *o = out + (t * s->n_head + h) * s->head_v;
            merge_runs(s, u, partial, t, h, &max, &sum, o);
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            for (int i = 0; i < s->head_v; i++) o[i] *= inv;
        }
}

void cpu_attention_merge_sums(const struct cpu_attn_shape *s, const struct cpu_attn_units *u, const float *partial,
                              float *sums) {
    for (int64_t t = 0; t < u->n_tokens; t++)
        for (int h = 0; h < s->n_head; h++) {
            float *r = sums + (t * s->n_head + h) * (s->head_v + 2);
            merge_runs(s, u, partial, t, h, &r[0], &r[1], r + 2);
        }
}
