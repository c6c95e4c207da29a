/* Expert FFN grouped by expert. Work is split into units of (expert, block of output rows);
 * each thread takes a contiguous run of units and, for its rows, multiplies every token routed
 * to that expert, so no two threads read the same weight rows. */
#include "cpu/moe.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

enum { MOE_ROW_BLOCK = 32 };

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t down_act_bytes(enum quant_type down_type, int64_t n_ff, int64_t rows) {
    return cpu_acts_bytes(down_type, n_ff, rows);
}

size_t cpu_moe_scratch_bytes(int64_t n_tokens, int k, int64_t n_expert, int64_t n_embd, int64_t n_ff,
                             enum quant_type down_type) {
    const int64_t pairs = n_tokens * k;
    return align64(sizeof(int32_t) * (size_t)n_expert) * 2 + align64(sizeof(int32_t) * (size_t)(n_expert + 1)) +
           align64(sizeof(int32_t) * (size_t)pairs) + 2 * align64(sizeof(float) * (size_t)(pairs * n_ff)) +
           align64(sizeof(float) * (size_t)(pairs * n_embd)) + align64(down_act_bytes(down_type, n_ff, pairs)) +
           align64(sizeof(float) * (size_t)(pairs * n_embd)) + 64;
}

void cpu_moe_scratch_init(struct moe_scratch *s, void *mem, int64_t n_tokens, int k, int64_t n_expert, int64_t n_embd,
                          int64_t n_ff, enum quant_type down_type) {
    uint8_t *p = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    const int64_t pairs = n_tokens * k;
    s->expert_count = (int32_t *)p, p += align64(sizeof(int32_t) * (size_t)n_expert);
    s->work = (int32_t *)p, p += align64(sizeof(int32_t) * (size_t)n_expert);
    s->expert_start = (int32_t *)p, p += align64(sizeof(int32_t) * (size_t)(n_expert + 1));
    s->pairs = (int32_t *)p, p += align64(sizeof(int32_t) * (size_t)pairs);
    s->gate = (float *)p, p += align64(sizeof(float) * (size_t)(pairs * n_ff));
    s->up = (float *)p, p += align64(sizeof(float) * (size_t)(pairs * n_ff));
    s->down = (float *)p, p += align64(sizeof(float) * (size_t)(pairs * n_embd));
    /* F32 activations are the widest format, so any gate/up activation rows fit. */
    s->acts_grouped = p, p += align64(sizeof(float) * (size_t)(pairs * n_embd));
    s->act_buf = p;
}

void cpu_moe_route(float *logits, int64_t n_tokens, int64_t n_expert, int k, bool normalize, int32_t *ids,
                   float *weights) {
    for (int64_t t = 0; t < n_tokens; t++) {
        float *probs = logits + t * n_expert;
        cpu_softmax(probs, n_expert);
        cpu_topk(probs, n_expert, k, ids + t * k);
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += weights[t * k + j] = probs[ids[t * k + j]];
        if (normalize)
            for (int j = 0; j < k; j++) weights[t * k + j] /= sum;
    }
}

static bool computed_here(const struct moe_routing *r, int32_t e) { return !r->end || (e >= r->first && e < r->end); }

/* Group (token, slot) pairs by expert: a counting sort. Returns the number of active experts,
 * listed in s->work; *n_pairs is the number of pairs they take. */
static int group_by_expert(const struct moe_routing *r, int64_t n_expert, struct moe_scratch *s, int64_t *n_pairs) {
    memset(s->expert_count, 0, sizeof(int32_t) * (size_t)n_expert);
    const int64_t pairs = r->n_tokens * r->k;
    for (int64_t p = 0; p < pairs; p++)
        if (computed_here(r, r->ids[p])) s->expert_count[r->ids[p]]++;
    int active = 0;
    s->expert_start[0] = 0;
    for (int64_t e = 0; e < n_expert; e++) {
        s->expert_start[e + 1] = s->expert_start[e] + s->expert_count[e];
        if (s->expert_count[e]) s->work[active++] = (int32_t)e;
        s->expert_count[e] = 0; /* reused as a fill cursor below */
    }
    for (int64_t p = 0; p < pairs; p++) {
        int32_t e = r->ids[p];
        if (computed_here(r, e)) s->pairs[s->expert_start[e] + s->expert_count[e]++] = (int32_t)p;
    }
    *n_pairs = s->expert_start[n_expert];
    return active;
}

struct moe_job {
    const struct cpu_matrix *a, *b; /* a: gate (or down), b: up (or NULL) */
    const struct cpu_acts *acts;    /* one row per (token, slot) pair, in grouped order */
    struct moe_scratch *s;
    int n_active;
    float *out_a, *out_b;           /* [pairs][a->n_rows], grouped order */
    _Atomic int64_t next;           /* units claimed so far */
    /* Gate and up: when not NULL, each unit also applies the gated unit to its rows and
     * quantizes them into these activations for down (a unit's rows being whole blocks of
     * their format), so no pass over all rows is needed between the two products. */
    const struct cpu_acts *hidden;
    const struct quant_kernels *hidden_kernels; /* down's, which quantize them */
};

/* A unit's rows are a short stream (32 rows of an expert, tens of KB), too short for the
 * hardware's prefetcher to get ahead, and one token's experts read host memory well below its
 * bandwidth unless each row first asks for the cache lines of the rows after it
 * (bench/RESULTS.md). So the first pass over a row asks for the row PREFETCH_AHEAD bytes or
 * more past it (rows_ahead rows), if that one is the unit's. */
enum { PREFETCH_AHEAD = 2048 };
static int64_t rows_ahead(size_t row_bytes) {
    return row_bytes >= PREFETCH_AHEAD ? 1 : (int64_t)((PREFETCH_AHEAD + row_bytes - 1) / row_bytes);
}
static inline void prefetch_row(const uint8_t *row, size_t row_bytes) {
    for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
}

/* Rows r0..r1 of one expert for its grouped activation rows i0..i1: by tiles of four rows where
 * the format has them, else four tokens at a time where it has a four-token kernel (both
 * bit-identical to one at a time). */
static void expert_rows(const struct cpu_matrix *m, const struct cpu_acts *acts, int32_t i0, int32_t i1, int64_t r0,
                        int64_t r1, float *out) {
    const uint8_t *w = m->data, *a = acts->data;
    const int64_t ahead = rows_ahead(m->row_bytes);
    if (m->kernels->dot_tile) {
        for (int64_t r = r0; r < r1; r += 4) {
            const int64_t end = r + 4 < r1 ? r + 4 : r1;
            for (int64_t next = r + ahead; next < end + ahead && next < r1; next++)
                prefetch_row(w + next * m->row_bytes, m->row_bytes);
            cpu_matmul_tiles(m, acts, i0, i1, r, end, out, m->n_rows);
        }
        return;
    }
    int32_t i = i0;
    if (m->kernels->vec_dot4)
        for (; i + 4 <= i1; i += 4)
            for (int64_t r = r0; r < r1; r++) {
                float four[4];
                if (i == i0 && r + ahead < r1) prefetch_row(w + (r + ahead) * m->row_bytes, m->row_bytes);
                m->kernels->vec_dot4(m->n_cols, w + r * m->row_bytes, a + i * acts->row_bytes, acts->row_bytes, four);
                for (int j = 0; j < 4; j++) out[(i + j) * m->n_rows + r] = four[j];
            }
    for (; i < i1; i++)
        for (int64_t r = r0; r < r1; r++) {
            if (i == i0 && r + ahead < r1) prefetch_row(w + (r + ahead) * m->row_bytes, m->row_bytes);
            out[i * m->n_rows + r] = m->kernels->vec_dot(m->n_cols, w + r * m->row_bytes, a + i * acts->row_bytes);
        }
}

/* Units of (expert, block of rows), claimed one at a time: experts with many tokens take
 * longer, so a static split would leave threads idle. */
static void moe_worker(void *p, int thread, int n_threads) {
    struct moe_job *job = p;
    (void)thread, (void)n_threads;
    const int64_t n_rows = job->a->n_rows, blocks = (n_rows + MOE_ROW_BLOCK - 1) / MOE_ROW_BLOCK;
    const int64_t total = job->n_active * blocks;
    for (int64_t unit = atomic_fetch_add(&job->next, 1); unit < total; unit = atomic_fetch_add(&job->next, 1)) {
        const int32_t e = job->s->work[unit / blocks];
        const int64_t r0 = unit % blocks * MOE_ROW_BLOCK, r1 = r0 + MOE_ROW_BLOCK < n_rows ? r0 + MOE_ROW_BLOCK : n_rows;
        const int32_t i0 = job->s->expert_start[e], i1 = job->s->expert_start[e + 1];
        const struct cpu_matrix ma = cpu_matrix_expert(job->a, e);
        expert_rows(&ma, job->acts, i0, i1, r0, r1, job->out_a);
        if (job->b) {
            const struct cpu_matrix mb = cpu_matrix_expert(job->b, e);
            expert_rows(&mb, job->acts, i0, i1, r0, r1, job->out_b);
        }
        if (job->hidden)
            for (int32_t i = i0; i < i1; i++) {
                float *g = job->out_a + i * n_rows + r0;
                cpu_swiglu(g, job->out_b + i * n_rows + r0, g, r1 - r0);
                const size_t piece = job->hidden->row_bytes / (size_t)blocks;
                job->hidden_kernels->quantize_act(g, (uint8_t *)job->hidden->data + i * job->hidden->row_bytes + r0 / MOE_ROW_BLOCK * piece,
                                                  r1 - r0);
            }
    }
}

/* Whether a unit's rows of the hidden layer quantize on their own: whole blocks of down's
 * activation format, laid end to end in a row (Q8_0 and Q8_1 blocks of 32; not Q8_K's 256). */
static bool by_unit(const struct quant_kernels *down, int64_t n_ff) {
    return n_ff % MOE_ROW_BLOCK == 0 &&
           quant_act_row_bytes(down, MOE_ROW_BLOCK) * (size_t)(n_ff / MOE_ROW_BLOCK) == quant_act_row_bytes(down, n_ff) &&
           quant_act_row_bytes(down, MOE_ROW_BLOCK) > 0;
}

void cpu_moe(struct threadpool *pool, const struct cpu_matrix *gate_exps, const struct cpu_matrix *up_exps,
             const struct cpu_matrix *down_exps, const struct cpu_acts *acts, const struct moe_routing *routing,
             struct moe_scratch *s, float *out) {
    const int64_t n_ff = gate_exps->n_rows, n_embd = down_exps->n_rows;
    int64_t pairs;
    int n_active = group_by_expert(routing, down_exps->n_experts, s, &pairs);
    /* Each pair's token row, copied into grouped order so an expert's rows are contiguous. */
    struct cpu_acts grouped = *acts;
    grouped.data = s->acts_grouped;
    grouped.n_tokens = pairs;
    for (int64_t i = 0; i < pairs; i++)
        memcpy((uint8_t *)grouped.data + i * acts->row_bytes,
               (const uint8_t *)acts->data + (s->pairs[i] / routing->k) * acts->row_bytes, acts->row_bytes);
    struct cpu_acts hidden = {down_exps->kernels->act_type, n_ff, pairs, quant_act_row_bytes(down_exps->kernels, n_ff),
                              s->act_buf}; /* grouped order too */
    struct moe_job job = {gate_exps, up_exps, &grouped, s, n_active, s->gate, s->up, 0, NULL, down_exps->kernels};
    if (by_unit(down_exps->kernels, n_ff)) job.hidden = &hidden;
    threadpool_run(pool, moe_worker, &job);
    if (!job.hidden) {
        cpu_swiglu_parallel(pool, s->gate, s->up, s->gate, pairs * n_ff); /* rows are contiguous */
        cpu_quantize_acts(pool, down_exps, s->gate, pairs, s->act_buf, &hidden);
    }
    struct moe_job down_job = {down_exps, NULL, &hidden, s, n_active, s->down, NULL, 0, NULL, NULL};
    threadpool_run(pool, moe_worker, &down_job);
    /* Weighted sum; a token's experts are added in expert order, whatever its batch. */
    memset(out, 0, sizeof(float) * (size_t)(routing->n_tokens * n_embd));
    for (int64_t i = 0; i < pairs; i++) {
        const int32_t pair = s->pairs[i];
        const float w = routing->weights[pair];
        const float *d = s->down + i * n_embd;
        float *o = out + (pair / routing->k) * n_embd;
        for (int64_t c = 0; c < n_embd; c++) o[c] += w * d[c];
    }
}
