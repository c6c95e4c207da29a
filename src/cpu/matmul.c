/* Matrix products of quantized weights with f32 activations. The activations are quantized
 * once into the weight format's activation type (as llama.cpp's CPU backend does, so the
 * integer products match); then every thread takes a slice of output rows. For one token this
 * is a bandwidth-bound GEMV; for many, rows are visited in small blocks so each weight block
 * stays in cache while every token's activations pass over it, and each pass takes four tokens
 * where the format has a kernel for that (the K and 32-element formats: a row's blocks unpacked
 * once for four), or a tile of four rows by four tokens (the float formats). Both give every
 * product bit for bit as a lone dot product does, so a token's logits never depend on its batch. */
#include <stdatomic.h>
#include <string.h>

#include "core/error.h"
#include "cpu/cpu_ops.h"
#include "gguf/gguf.h"

enum {
    ROW_BLOCK = 16,   /* weight rows kept hot while the tokens pass over them */
    TOKEN_BLOCK = 64, /* activation rows per pass, sized to stay in L2 */
};

pshard_status cpu_matrix_from_tensor(const struct gguf_tensor *t, struct cpu_matrix *out) {
    memset(out, 0, sizeof *out);
    out->kernels = quant_kernels_get((enum quant_type)t->type);
    if (!out->kernels)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "tensor '%.*s' has type %s, which pshard cannot compute with",
                         (int)t->name.len, t->name.data, quant_type_name(t->type));
    out->type = (enum quant_type)t->type;
    out->data = t->data;
    out->n_cols = t->ne[0];
    out->n_rows = t->ne[1];
    out->n_experts = t->ne[2];
    out->row_bytes = quant_row_bytes(out->type, t->ne[0]);
    return PSHARD_OK;
}

struct cpu_matrix cpu_matrix_expert(const struct cpu_matrix *all, int64_t expert) {
    struct cpu_matrix m = *all;
    m.data = (const uint8_t *)all->data + (size_t)expert * (size_t)all->n_rows * all->row_bytes;
    m.n_experts = 1;
    return m;
}

size_t cpu_acts_bytes(enum quant_type type, int64_t n_cols, int64_t n_tokens) {
    const struct quant_kernels *k = quant_kernels_get(type);
    return k ? quant_act_row_bytes(k, n_cols) * (size_t)n_tokens : 0;
}

struct quantize_job {
    const struct quant_kernels *kernels;
    const float *x;
    struct cpu_acts *acts;
};

static void quantize_worker(void *p, int thread, int n_threads) {
    struct quantize_job *job = p;
    int64_t begin, end;
    threadpool_range(job->acts->n_tokens, 1, thread, n_threads, &begin, &end);
    for (int64_t t = begin; t < end; t++)
        job->kernels->quantize_act(job->x + t * job->acts->n_cols, (uint8_t *)job->acts->data + t * job->acts->row_bytes,
                                   job->acts->n_cols);
}

void cpu_quantize_acts(struct threadpool *pool, const struct cpu_matrix *like, const float *x, int64_t n_tokens,
                       void *buf, struct cpu_acts *out) {
    out->type = like->kernels->act_type;
    out->n_cols = like->n_cols;
    out->n_tokens = n_tokens;
    out->row_bytes = quant_act_row_bytes(like->kernels, like->n_cols);
    out->data = buf;
    struct quantize_job job = {like->kernels, x, out};
    if (n_tokens == 1 || !pool) quantize_worker(&job, 0, 1);
    else threadpool_run(pool, quantize_worker, &job);
}

void cpu_matmul_tiles(const struct cpu_matrix *m, const struct cpu_acts *acts, int64_t t0, int64_t t1, int64_t r0,
                      int64_t r1, float *y, int64_t y_stride) {
    const uint8_t *w = m->data, *a = acts->data;
    for (int64_t t = t0; t < t1; t += 4) {
        const int n = t1 - t < 4 ? (int)(t1 - t) : 4;
        int64_t r = r0;
        /* A lone token goes a row at a time: on one thread of the development machine, four rows
         * read side by side came from memory at 11-14 GB/s, one at a time at 13-22. */
        if (n > 1)
            for (; r + 4 <= r1; r += 4) {
                float out[16];
                m->kernels->dot_tile(m->n_cols, w + r * m->row_bytes, m->row_bytes, a + t * acts->row_bytes,
                                     acts->row_bytes, n, out);
                for (int j = 0; j < n; j++) memcpy(&y[(t + j) * y_stride + r], &out[j * 4], sizeof out[0] * 4);
            }
        for (; r < r1; r++)
            for (int j = 0; j < n; j++)
                y[(t + j) * y_stride + r] =
                    m->kernels->vec_dot(m->n_cols, w + r * m->row_bytes, a + (t + j) * acts->row_bytes);
    }
}

void cpu_matmul_rows(const struct cpu_matrix *m, const struct cpu_acts *acts, int64_t row_begin, int64_t row_end,
                     float *y, int64_t y_stride) {
    const uint8_t *w = m->data;
    const uint8_t *a = acts->data;
    for (int64_t t0 = 0; t0 < acts->n_tokens; t0 += TOKEN_BLOCK) {
        int64_t t1 = t0 + TOKEN_BLOCK < acts->n_tokens ? t0 + TOKEN_BLOCK : acts->n_tokens;
        for (int64_t r0 = row_begin; r0 < row_end; r0 += ROW_BLOCK) {
            int64_t r1 = r0 + ROW_BLOCK < row_end ? r0 + ROW_BLOCK : row_end;
            if (m->kernels->dot_tile) {
                cpu_matmul_tiles(m, acts, t0, t1, r0, r1, y, y_stride);
                continue;
            }
            int64_t t = t0;
            /* Four tokens per weight-row pass where the format has it (same results as one by one). */
            if (m->kernels->vec_dot4)
                for (; t + 4 <= t1; t += 4)
                    for (int64_t r = r0; r < r1; r++) {
                        float out[4];
                        m->kernels->vec_dot4(m->n_cols, w + r * m->row_bytes, a + t * acts->row_bytes, acts->row_bytes, out);
                        for (int j = 0; j < 4; j++) y[(t + j) * y_stride + r] = out[j];
                    }
            for (; t < t1; t++)
                for (int64_t r = r0; r < r1; r++)
                    y[t * y_stride + r] = m->kernels->vec_dot(m->n_cols, w + r * m->row_bytes, a + t * acts->row_bytes);
        }
    }
}

enum { MAX_TASKS = 8 };

struct matmul_job {
    const struct cpu_matmul_task *tasks;
    int n_tasks;
    int64_t blocks[MAX_TASKS + 1]; /* prefix sums of row blocks per task */
    _Atomic int64_t next;          /* first unclaimed block */
};

/* The row blocks of all tasks form one range; threads claim a few blocks at a time, so a
 * thread that was late or slow takes fewer and none waits long at the end. */
static void matmul_worker(void *p, int thread, int n_threads) {
    struct matmul_job *job = p;
    (void)thread;
    const int64_t total = job->blocks[job->n_tasks];
    const int64_t claim = total >= 16 * n_threads ? 2 : 1;
    int i = 0;
    for (int64_t b = atomic_fetch_add(&job->next, claim); b < total; b = atomic_fetch_add(&job->next, claim)) {
        const int64_t end = b + claim < total ? b + claim : total;
        while (b < end) {
            while (b >= job->blocks[i + 1]) i++;
            const struct cpu_matmul_task *t = &job->tasks[i];
            const int64_t stop = end < job->blocks[i + 1] ? end : job->blocks[i + 1];
            const int64_t r0 = (b - job->blocks[i]) * ROW_BLOCK;
            const int64_t r1 = (stop - job->blocks[i]) * ROW_BLOCK < t->m->n_rows ? (stop - job->blocks[i]) * ROW_BLOCK
                                                                                  : t->m->n_rows;
            cpu_matmul_rows(t->m, t->acts, r0, r1, t->y, t->y_stride);
            b = stop;
        }
    }
}

void cpu_matmul_many(struct threadpool *pool, const struct cpu_matmul_task *tasks, int n_tasks) {
    for (int start = 0; start < n_tasks; start += MAX_TASKS) {
        struct matmul_job job = {tasks + start, n_tasks - start < MAX_TASKS ? n_tasks - start : MAX_TASKS, {0}, 0};
        for (int i = 0; i < job.n_tasks; i++)
            job.blocks[i + 1] = job.blocks[i] + (job.tasks[i].m->n_rows + ROW_BLOCK - 1) / ROW_BLOCK;
        if (!pool) matmul_worker(&job, 0, 1);
        else threadpool_run(pool, matmul_worker, &job);
    }
}

void cpu_matmul_acts(struct threadpool *pool, const struct cpu_matrix *m, const struct cpu_acts *acts, float *y,
                     int64_t y_stride) {
    const struct cpu_matmul_task task = {m, acts, y, y_stride};
    cpu_matmul_many(pool, &task, 1);
}

void cpu_matmul(struct threadpool *pool, const struct cpu_matrix *m, const float *x, int64_t n_tokens, float *y,
                void *act_buf) {
    struct cpu_acts acts;
    cpu_quantize_acts(pool, m, x, n_tokens, act_buf, &acts);
    cpu_matmul_acts(pool, m, &acts, y, m->n_rows);
}

void cpu_get_row(const struct cpu_matrix *m, int64_t row, float *out) {
    m->kernels->dequant_row((const uint8_t *)m->data + row * m->row_bytes, out, m->n_cols);
}
