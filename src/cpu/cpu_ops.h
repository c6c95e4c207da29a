/* CPU operators of the forward pass. Activations are f32 row-major [n_tokens][width]; weights
 * are GGUF rows of any supported format. Multi-threaded ops take the pool and split rows
 * across its threads; nothing here allocates. */
#ifndef CPU_CPU_OPS_H
#define CPU_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "quant/quant.h"

/* A weight matrix as the kernels see it: n_rows rows of n_cols elements of `type`. For a 3-D
 * expert tensor, cpu_matrix_expert() gives one expert's slice. */
struct cpu_matrix {
    enum quant_type type;
    const void *data;
    int64_t n_cols; /* input width: elements per row */
    int64_t n_rows; /* output width */
    int64_t n_experts; /* 3-D expert tensors: how many matrices follow each other; else 1 */
    size_t row_bytes;
    const struct quant_kernels *kernels;
};

struct gguf_tensor;
/* View a 2-D (or 3-D, for experts) GGUF tensor; fails on unsupported types. */
pshard_status cpu_matrix_from_tensor(const struct gguf_tensor *t, struct cpu_matrix *out);
struct cpu_matrix cpu_matrix_expert(const struct cpu_matrix *all, int64_t expert);

/* Quantized activations for one activation format: n_tokens rows of row_bytes. */
struct cpu_acts {
    enum quant_type type;
    int64_t n_cols, n_tokens;
    size_t row_bytes;
    void *data;
};

/* Bytes needed to hold n_tokens activation rows of n_cols for matrices of weight type `type`. */
size_t cpu_acts_bytes(enum quant_type type, int64_t n_cols, int64_t n_tokens);

/* Quantize x [n_tokens][n_cols] into the activation format the matrix `like` wants. `buf`
 * holds cpu_acts_bytes() bytes. */
void cpu_quantize_acts(struct threadpool *pool, const struct cpu_matrix *like, const float *x, int64_t n_tokens,
                       void *buf, struct cpu_acts *out);

/* y [n_tokens][m->n_rows] = x · m^T, from activations quantized for m (same format). */
void cpu_matmul_acts(struct threadpool *pool, const struct cpu_matrix *m, const struct cpu_acts *acts, float *y,
                     int64_t y_stride);

/* Several products in one parallel job (one barrier instead of one per matrix), e.g. q/k/v
 * or gate/up, which share their input. */
struct cpu_matmul_task {
    const struct cpu_matrix *m;
    const struct cpu_acts *acts;
    float *y;
    int64_t y_stride;
};
void cpu_matmul_many(struct threadpool *pool, const struct cpu_matmul_task *tasks, int n_tasks);

/* Both steps; act_buf holds cpu_acts_bytes(m->type, m->n_cols, n_tokens). */
void cpu_matmul(struct threadpool *pool, const struct cpu_matrix *m, const float *x, int64_t n_tokens, float *y,
                void *act_buf);

/* Single-threaded matmul of a few token rows (used inside a job already split by the caller):
 * y[t][r] for r in [row_begin, row_end). */
void cpu_matmul_rows(const struct cpu_matrix *m, const struct cpu_acts *acts, int64_t row_begin, int64_t row_end,
                     float *y, int64_t y_stride);

/* For a format with a tile kernel (quant_kernels.dot_tile): y[t][r] for tokens t0..t1 and rows
 * r0..r1, four rows by up to four tokens at a time, the rows past the last four one by one. */
void cpu_matmul_tiles(const struct cpu_matrix *m, const struct cpu_acts *acts, int64_t t0, int64_t t1, int64_t r0,
                      int64_t r1, float *y, int64_t y_stride);

/* Row of an embedding table, dequantized. */
void cpu_get_row(const struct cpu_matrix *m, int64_t row, float *out);

/* out = x / rms(x) * w over n elements (w may be NULL for no weight). */
void cpu_rmsnorm(const float *x, const float *w, float *out, int64_t n, float eps);

void cpu_add(float *acc, const float *x, int64_t n);
void cpu_add_bias(float *x, const float *bias, int64_t n_tokens, int64_t n);

/* SwiGLU: out[i] = silu(gate[i]) * up[i]. */
void cpu_swiglu(const float *gate, const float *up, float *out, int64_t n);
/* The same split across the pool when n is large (prefill). */
void cpu_swiglu_parallel(struct threadpool *pool, const float *gate, const float *up, float *out, int64_t n);

/* In-place softmax over n values. */
void cpu_softmax(float *x, int64_t n);

/* Indices of the k largest of x[0..n) (ties: lower index first), largest first. */
void cpu_topk(const float *x, int64_t n, int k, int32_t *idx);

#endif
