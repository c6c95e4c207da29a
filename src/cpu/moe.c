/* Expert FFN grouped by expert. Work is split into units of (expert, block of output rows);
 * each thread takes a contiguous run of units and, for its rows, multiplies every token routed
 * to that expert, so no two threads read the same weight rows. */
#include "cpu/moe.h"

#include <math.h>
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
           align64(sizeof(float) * (size_t)(pairs * n_embd)) + align64(down_act_bytes(down_type, n_ff, pairs)) + 64;
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

/* Group (token, slot) pairs by expert: a counting sort. Returns the number of active experts,
 * listed in s->work. */
static int group_by_expert(const struct moe_routing *r, int64_t n_expert, struct moe_scratch *s) {
    memset(s->expert_count, 0, sizeof(int32_t) * (size_t)n_expert);
    const int64_t pairs = r->n_tokens * r->k;
    for (int64_t p = 0; p < pairs; p++) s->expert_count[r->ids[p]]++;
    int active = 0;
    s->expert_start[0] = 0;
    for (int64_t e = 0; e < n_expert; e++) {
        s->expert_start[e + 1] = s->expert_start[e] + s->expert_count[e];
        if (s->expert_count[e]) s->work[active++] = (int32_t)e;
        s->expert_count[e] = 0; /* reused as a fill cursor below */
    }
    for (int64_t p = 0; p < pairs; p++) {
        int32_t e = r->ids[p];
        s->pairs[s->expert_start[e] + s->expert_count[e]++] = (int32_t)p;
    }
    return active;
}

struct moe_job {
    const struct cpu_matrix *a, *b; /* a: gate (or down), b: up (or NULL) */
    const struct cpu_acts *acts;
    bool acts_per_pair;             /* acts rows indexed by pair (down) or by token (gate/up) */
    const struct moe_routing *routing;
    struct moe_scratch *s;
    int n_active;
    float *out_a, *out_b;           /* [pairs][a->n_rows] */
};

static void moe_worker(void *p, int thread, int n_threads) {
    struct moe_job *job = p;
    const int64_t n_rows = job->a->n_rows, blocks = (n_rows + MOE_ROW_BLOCK - 1) / MOE_ROW_BLOCK;
    int64_t begin, end;
    threadpool_range(job->n_active * blocks, 1, thread, n_threads, &begin, &end);
    for (int64_t unit = begin; unit < end; unit++) {
        const int32_t e = job->s->work[unit / blocks];
        const int64_t r0 = unit % blocks * MOE_ROW_BLOCK, r1 = r0 + MOE_ROW_BLOCK < n_rows ? r0 + MOE_ROW_BLOCK : n_rows;
        const struct cpu_matrix ma = cpu_matrix_expert(job->a, e);
        const struct cpu_matrix mb = job->b ? cpu_matrix_expert(job->b, e) : ma;
        for (int32_t i = job->s->expert_start[e]; i < job->s->expert_start[e + 1]; i++) {
            const int32_t pair = job->s->pairs[i];
            const int64_t act_row = job->acts_per_pair ? pair : pair / job->routing->k;
            const uint8_t *act = (const uint8_t *)job->acts->data + act_row * job->acts->row_bytes;
            for (int64_t r = r0; r < r1; r++) {
                job->out_a[pair * n_rows + r] = ma.kernels->vec_dot(ma.n_cols, (const uint8_t *)ma.data + r * ma.row_bytes, act);
                if (job->b)
                    job->out_b[pair * n_rows + r] = mb.kernels->vec_dot(mb.n_cols, (const uint8_t *)mb.data + r * mb.row_bytes, act);
            }
        }
    }
}

void cpu_moe(struct threadpool *pool, const struct cpu_matrix *gate_exps, const struct cpu_matrix *up_exps,
             const struct cpu_matrix *down_exps, const struct cpu_acts *acts, const struct moe_routing *routing,
             struct moe_scratch *s, float *out) {
    const int64_t pairs = routing->n_tokens * routing->k, n_ff = gate_exps->n_rows, n_embd = down_exps->n_rows;
    int n_active = group_by_expert(routing, down_exps->n_experts, s);
    struct moe_job job = {gate_exps, up_exps, acts, false, routing, s, n_active, s->gate, s->up};
    threadpool_run(pool, moe_worker, &job);
    cpu_swiglu_parallel(pool, s->gate, s->up, s->gate, pairs * n_ff); /* rows are contiguous */
    struct cpu_acts hidden;
    cpu_quantize_acts(pool, down_exps, s->gate, pairs, s->act_buf, &hidden);
    struct moe_job down_job = {down_exps, NULL, &hidden, true, routing, s, n_active, s->down, NULL};
    threadpool_run(pool, moe_worker, &down_job);
    for (int64_t t = 0; t < routing->n_tokens; t++) {
        float *o = out + t * n_embd;
        memset(o, 0, sizeof(float) * (size_t)n_embd);
        for (int j = 0; j < routing->k; j++) {
            const float w = routing->weights[t * routing->k + j];
            const float *d = s->down + (t * routing->k + j) * n_embd;
            for (int64_t i = 0; i < n_embd; i++) o[i] += w * d[i];
        }
    }
}
