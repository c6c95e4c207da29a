/* Whole-row dequantization: the embedding lookup (f32, exactly the CPU's values) and rows to
 * f16 for the cuBLAS prefill path. One thread per 8 elements. */
#include "cuda/dequant.cuh"

template <int TYPE>
__global__ void get_rows_kernel(const uint8_t *w, size_t row_bytes, int64_t n_cols, const int32_t *rows, int64_t n,
                                float *out) {
    dep_enter();
    const int64_t groups = n_cols / 8;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups * n) return;
    const int64_t i = g / groups, k0 = (g % groups) * 8;
    float f[8];
    dq8<TYPE>(w + (size_t)rows[i] * row_bytes, (int)k0, f);
    float4 *o = (float4 *)(out + i * n_cols + k0);
    o[0] = make_float4(f[0], f[1], f[2], f[3]);
    o[1] = make_float4(f[4], f[5], f[6], f[7]);
}

template <int TYPE>
__global__ void dequant_f16_kernel(const uint8_t *w, size_t row_bytes, int64_t n_cols, int64_t n_rows, __half *out) {
    dep_enter();
    const int64_t groups = n_cols / 8;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups * n_rows) return;
    const int64_t r = g / groups, k0 = (g % groups) * 8;
    float f[8];
    dq8<TYPE>(w + (size_t)r * row_bytes, (int)k0, f);
    uint4 v;
    __half2 *h = (__half2 *)&v;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    *(uint4 *)(out + r * n_cols + k0) = v;
}

static pshard_status check_matrix(const struct cuda_matrix *m, const char *what) {
    const int elems = cuda_block_elems(m->type);
    if (!elems) return core_fail(PSHARD_ERR_UNSUPPORTED, "%s: no GPU kernel for %s", what, quant_type_name(m->type));
    CUDA_ARG(m->n_cols % 32 == 0 && m->n_cols % elems == 0, "%s: a %s row of %lld elements", what,
             quant_type_name(m->type), (long long)m->n_cols);
    return PSHARD_OK;
}

extern "C" pshard_status cuda_get_rows(const struct cuda_matrix *m, const int32_t *rows, int64_t n, float *out,
                                       cuda_stream s) {
    CORE_TRY(check_matrix(m, "get_rows"));
    if (n == 0) return PSHARD_OK;
    const int64_t threads = n * m->n_cols / 8;
    const unsigned grid = (unsigned)ceil_div(threads, 256);
    const uint8_t *w = (const uint8_t *)m->data;
#define LAUNCH(T)                                                                                                      \
    CUDA_TRY(launch_dep(get_rows_kernel<T>, grid, 256, 0, raw_stream(s), w, m->row_bytes, m->n_cols, rows, n, out))
    switch (m->type) {
        CUDA_TYPE_CASES(LAUNCH)
    default: break;
    }
#undef LAUNCH
    return PSHARD_OK;
}

extern "C" pshard_status cuda_dequantize_f16(const struct cuda_matrix *m, int64_t row0, int64_t n_rows, uint16_t *out,
                                             cuda_stream s) {
    CORE_TRY(check_matrix(m, "dequantize"));
    CUDA_ARG(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= m->n_rows, "dequantize: rows %lld..%lld of %lld",
             (long long)row0, (long long)(row0 + n_rows), (long long)m->n_rows);
    if (n_rows == 0) return PSHARD_OK;
    const unsigned grid = (unsigned)ceil_div(n_rows * m->n_cols / 8, 256);
    const uint8_t *w = (const uint8_t *)m->data + (size_t)row0 * m->row_bytes;
#define LAUNCH(T)                                                                                                      \
    CUDA_TRY(launch_dep(dequant_f16_kernel<T>, grid, 256, 0, raw_stream(s), w, m->row_bytes, m->n_cols, n_rows,        \
                        (__half *)out))
    switch (m->type) {
        CUDA_TYPE_CASES(LAUNCH)
    default: break;
    }
#undef LAUNCH
    return PSHARD_OK;
}
