/* cuda_matmul: the choice between the matrix-vector kernel (<= 8 tokens: quantize the
 * activations as the CPU does, then dp4a dots; F32 weights at any count) and the tensor-core
 * paths for many tokens -- the fused dequantizing GEMM (gemm.cu), or cuBLAS on f16 weights
 * dequantized chunk by chunk into the caller's work buffer (F16/BF16 weights go to cuBLAS as they
 * are, except F16 weights read in place, which are copied in chunks first: see copy_first). */
#include "cuda/gemm.cuh"

enum { MIN_CHUNK_ROWS = CUDA_MATMUL_CHUNK_ROWS };

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* AUTO: cuBLAS on f16 weights, measured faster than the fused kernel for dense prefill of 512
 * tokens and more (bench/cuda_kernels.md); but the fused kernel for at most one tile of tokens
 * (64) over a matrix in VRAM whose rows it copies raw and whose row tiles fill every SM twice (a
 * vocabulary's head: 1,187 blocks at 151,936 rows): it reads the weights' bytes once, where
 * the cuBLAS path writes and reads back an f16 copy of them (4 bytes an element against Q4_0's
 * 0.56) at every call. The fused kernel needs no scratch. */
static enum cuda_gemm_path pick_path(const struct cuda_ctx *ctx, const struct cuda_matrix *m, int64_t n_tokens) {
    if (ctx->gemm_path != CUDA_GEMM_AUTO) return ctx->gemm_path;
    const bool tall = m->n_rows >= (int64_t)GEMM_TILE_N * 2 * ctx->info.sm_count;
    return n_tokens <= GEMM_TILE_M && tall && !m->in_place && gemm_reads_raw(m->type, m->n_cols) ? CUDA_GEMM_FUSED
                                                                                                   : CUDA_GEMM_CUBLAS;
}

extern "C" bool cuda_matmul_reads_once(const struct cuda_ctx *ctx, const struct cuda_matrix *m, int64_t n_tokens) {
    return n_tokens > CUDA_MATVEC_MAX_TOKENS && m->type != QUANT_F32 && m->type != QUANT_F16 && m->type != QUANT_BF16 &&
           pick_path(ctx, m, n_tokens) == CUDA_GEMM_FUSED;
}

/* F16 weights read in place from host memory, above 8 tokens: cuBLAS reads them through the
 * mapping slower than a copy kernel does (bench/RESULTS.md), so they are copied into the work
 * buffer in chunks, each multiplied there. */
static bool copy_first(const struct cuda_matrix *m) { return m->type == QUANT_F16 && m->in_place; }

static pshard_status blas_gemm(struct cuda_ctx *ctx, cudaDataType type, const void *w, int w_stride, const void *x,
                               int rows, int n_tokens, int n_cols, float *y, int64_t y_stride, cudaStream_t st) {
    /* Column-major view: W (rows x cols, row-major, w_stride elements apart: a view of the
     * first columns of a wider matrix has them further apart) is a cols x rows matrix, x
     * likewise; y^T = W . x^T is rows x tokens with leading dimension y_stride. */
    const float one = 1.0f, zero = 0.0f;
    BLAS_TRY(cublasSetStream(ctx->blas, st));
    BLAS_TRY(cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tokens, n_cols, &one, w, type, w_stride, x, type,
                          n_cols, &zero, y, CUDA_R_32F, (int)y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return PSHARD_OK;
}

/* Rows to f16 as many at a time as the work buffer holds past the activations (x16_bytes),
 * each chunk then multiplied by cuBLAS. */
static pshard_status gemm_in_chunks(struct cuda_ctx *ctx, const struct cuda_matrix *m, int nt, void *work,
                                    size_t work_bytes, size_t x16_bytes, float *y, int64_t y_stride, cuda_stream s) {
    const int rows = (int)m->n_rows, cols = (int)m->n_cols;
    uint16_t *w16 = (uint16_t *)((uint8_t *)work + x16_bytes);
    int64_t chunk = (int64_t)((work_bytes - x16_bytes) / ((size_t)cols * 2));
    if (chunk > rows) chunk = rows;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        CORE_TRY(cuda_dequantize_f16(m, r0, n, w16, s));
        CORE_TRY(blas_gemm(ctx, CUDA_R_16F, w16, cols, work, (int)n, nt, cols, y + r0, y_stride, raw_stream(s)));
    }
    return PSHARD_OK;
}

extern "C" pshard_status cuda_matmul(struct cuda_ctx *ctx, const struct cuda_matrix *m, const float *x,
                                     int64_t n_tokens, float *y, int64_t y_stride, void *work, size_t work_bytes,
                                     cuda_stream s) {
    CUDA_ARG(cuda_type_supported(m->type), "matmul: no GPU kernel for %s", quant_type_name(m->type));
    CUDA_ARG(work_bytes >= cuda_matmul_work_bytes(m, n_tokens), "matmul: work buffer of %zu bytes, %zu needed",
             work_bytes, cuda_matmul_work_bytes(m, n_tokens));
    CUDA_ARG(m->n_rows < (1 << 30) && m->n_cols < (1 << 30) && n_tokens < (1 << 30), "matmul: matrix too large");
    if (n_tokens == 0) return PSHARD_OK;
    if (m->type == QUANT_F32) return cuda_matvec(m, x, (int)n_tokens, y, y_stride, s);
    cudaStream_t st = raw_stream(s);
    if (n_tokens <= CUDA_MATVEC_MAX_TOKENS) {
        CORE_TRY(cuda_quantize(cuda_act_type(m->type), x, m->n_cols, n_tokens, work, s));
        return cuda_matvec(m, work, (int)n_tokens, y, y_stride, s);
    }
    const int rows = (int)m->n_rows, cols = (int)m->n_cols, nt = (int)n_tokens;
    /* Activations in the weights' 16-bit format (f16, or bf16 for BF16 weights). */
    const size_t x16_bytes = align256((size_t)n_tokens * (size_t)m->n_cols * 2);
    CORE_TRY(cuda_quantize(m->type == QUANT_BF16 ? QUANT_BF16 : QUANT_F16, x, m->n_cols, n_tokens, work, s));
    if (m->type == QUANT_BF16)
        return blas_gemm(ctx, CUDA_R_16BF, m->data, (int)(m->row_bytes / 2), work, rows, nt, cols, y, y_stride, st);
    if (copy_first(m) && pick_path(ctx, m, n_tokens) == CUDA_GEMM_CUBLAS)
        return gemm_in_chunks(ctx, m, nt, work, work_bytes, x16_bytes, y, y_stride, s);
    if (m->type == QUANT_F16 && pick_path(ctx, m, n_tokens) == CUDA_GEMM_CUBLAS)
        return blas_gemm(ctx, CUDA_R_16F, m->data, (int)(m->row_bytes / 2), work, rows, nt, cols, y, y_stride, st);
    if (pick_path(ctx, m, n_tokens) == CUDA_GEMM_FUSED || m->type == QUANT_F16) {
        gemm_args a = {};
        a.w = (const uint8_t *)m->data;
        a.row_bytes = m->row_bytes;
        a.n_rows = rows;
        a.n_cols = cols;
        a.x = (const __half *)work;
        a.x_stride = cols;
        a.n_tokens = nt;
        a.y = y;
        a.y_stride = y_stride;
        return gemm_fused_run(m->type, a, (unsigned)ceil_div(nt, GEMM_TILE_M), st);
    }
    return gemm_in_chunks(ctx, m, nt, work, work_bytes, x16_bytes, y, y_stride, s);
}

extern "C" pshard_status cuda_matmul_add(struct cuda_ctx *ctx, const struct cuda_matrix *m, const float *x,
                                         int64_t n_tokens, float *y, float *tmp, void *work, size_t work_bytes,
                                         cuda_stream s) {
    if (n_tokens > CUDA_MATVEC_MAX_TOKENS || m->type == QUANT_F32) {
        CORE_TRY(cuda_matmul(ctx, m, x, n_tokens, tmp, m->n_rows, work, work_bytes, s));
        return cuda_add(y, tmp, n_tokens * m->n_rows, s);
    }
    CUDA_ARG(cuda_type_supported(m->type), "matmul: no GPU kernel for %s", quant_type_name(m->type));
    CUDA_ARG(work_bytes >= cuda_matmul_work_bytes(m, n_tokens), "matmul: work buffer of %zu bytes, %zu needed",
             work_bytes, cuda_matmul_work_bytes(m, n_tokens));
    if (n_tokens == 0) return PSHARD_OK;
    CORE_TRY(cuda_quantize(cuda_act_type(m->type), x, m->n_cols, n_tokens, work, s));
    return cuda_matvec_each(&m, 1, work, (int)n_tokens, &y, true, s);
}
