/* cuda_matvec: checks, row chunking and the choice of format family for the shared
 * matrix-vector kernel (matvec_kernel.cuh). */
#include "cuda/matvec.cuh"

static int gcd_int(int a, int b) {
    while (b) {
        const int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

pshard_status mv_run(enum quant_type type, int64_t n_cols, mv_args a, int nt, unsigned grid_y, cudaStream_t st) {
    const int elems = cuda_block_elems(type), bytes = cuda_block_bytes(type);
    if (!elems) return core_fail(PSHARD_ERR_UNSUPPORTED, "matvec: no GPU kernel for %s", quant_type_name(type));
    CUDA_ARG(n_cols % elems == 0 && n_cols / elems < (1 << 30),
             "matvec: a %s row of %lld elements is not a whole number of %d-element blocks", quant_type_name(type),
             (long long)n_cols, elems);
    CUDA_ARG(a.n_rows > 0 && nt >= 1 && nt <= CUDA_MATVEC_MAX_TOKENS, "matvec: %d rows, %d tokens", a.n_rows, nt);
    a.n_blocks = (int)(n_cols / elems);
    a.aligned = a.row_bytes % 16 == 0 && (uintptr_t)a.w % 16 == 0;
    for (int p = 1; p < a.n_parts; p++) a.aligned = a.aligned && (uintptr_t)a.part_w[p] % 16 == 0;
    /* Chunks hold whole blocks and, when aligned, a multiple of 16 bytes (groups of `unit`
     * blocks); chunks of a row are made equal so the last one is not a sliver. */
    const int unit = 16 / gcd_int(bytes, 16);
    const int max_blocks = MV_CHUNK / bytes / unit * unit;
    const int n_chunks = (int)ceil_div(a.n_blocks, max_blocks);
    a.chunk_blocks = (int)(ceil_div(ceil_div(a.n_blocks, n_chunks), unit) * unit);
    /* Straight from VRAM where a lane's items are those the staged path gives it; host memory read
     * in place keeps the staged path's whole 16-byte runs a warp (expert groups too: measured for
     * dense products only). */
    a.direct = a.in_vram && !a.pairs && a.aligned && a.chunk_blocks % 32 == 0;
    /* Expert groups in VRAM stage each pass's activations in shared memory where they fit (read
     * in place, a warp a row keeps more reads in flight). */
    const size_t stage_stride = (size_t)ceil_div((int64_t)a.act_row_bytes, 16) * 16;
    a.act_stage_stride =
        a.pairs && a.in_vram && MV_GROUP_PASS * stage_stride <= MV_GROUP_ACT_BYTES ? stage_stride : 0;
    const dim3 grid((unsigned)ceil_div(a.n_rows, MV_WARPS), grid_y);
    if (type == QUANT_F32 && mv_f32_tiles(a, n_cols)) return mv_f32_tiled(a, n_cols, st);
    if (type == QUANT_F32 && mv_f32_rows(a, n_cols)) return mv_f32_by_rows(a, n_cols, st);
    switch (type) {
    case QUANT_F32: case QUANT_F16: case QUANT_BF16: return mv_launch_float(type, nt, a, grid, st);
    case QUANT_Q2_K: case QUANT_Q3_K: case QUANT_Q4_K: case QUANT_Q5_K: case QUANT_Q6_K:
        return mv_launch_kquants(type, nt, a, grid, st);
    default: return mv_launch_legacy(type, nt, a, grid, st);
    }
}

extern "C" pshard_status cuda_matvec_each(const struct cuda_matrix *const *m, int count, const void *acts, int n_tokens,
                                          float *const *y, bool accumulate, cuda_stream s) {
    CUDA_ARG(count >= 1 && count <= CUDA_MATVEC_MAX_PARTS, "matvec: %d matrices in one launch", count);
    CUDA_ARG(n_tokens >= 0 && n_tokens <= 65535 * CUDA_MATVEC_MAX_TOKENS, "matvec: %d tokens", n_tokens);
    if (n_tokens == 0) return PSHARD_OK;
    mv_args a = {};
    int64_t rows = 0;
    for (int p = 0; p < count; p++) {
        CUDA_ARG(m[p]->type == m[0]->type && m[p]->n_cols == m[0]->n_cols && m[p]->row_bytes == m[0]->row_bytes,
                 "matvec: matrices of one launch differ in format or width");
        rows += m[p]->n_rows;
        a.part_w[p] = (const uint8_t *)m[p]->data;
        a.part_end[p] = (int)rows;
        a.part_y[p] = y[p];
        a.part_y_stride[p] = m[p]->n_rows;
    }
    CUDA_ARG(rows < (1 << 30), "matvec: %lld rows", (long long)rows);
    a.in_vram = true;
    for (int p = 0; p < count; p++) a.in_vram = a.in_vram && !m[p]->in_place;
    a.n_parts = count;
    a.w = a.part_w[0];
    a.row_bytes = m[0]->row_bytes;
    a.n_rows = (int)rows;
    a.act = (const uint8_t *)acts;
    a.act_row_bytes = cuda_act_row_bytes(cuda_act_type(m[0]->type), m[0]->n_cols);
    a.y = y[0];
    a.y_stride = m[0]->n_rows;
    a.act_div = 1;
    a.n_tokens = n_tokens;
    a.accumulate = accumulate;
    const int nt = n_tokens < CUDA_MATVEC_MAX_TOKENS ? n_tokens : CUDA_MATVEC_MAX_TOKENS;
    return mv_run(m[0]->type, m[0]->n_cols, a, nt, (unsigned)ceil_div(n_tokens, CUDA_MATVEC_MAX_TOKENS), raw_stream(s));
}

extern "C" pshard_status cuda_matvec(const struct cuda_matrix *m, const void *acts, int n_tokens, float *y,
                                     int64_t y_stride, cuda_stream s) {
    CUDA_ARG(m->n_rows < (1 << 30), "matvec: %lld rows", (long long)m->n_rows);
    CUDA_ARG(n_tokens >= 0 && n_tokens <= 65535 * CUDA_MATVEC_MAX_TOKENS, "matvec: %d tokens", n_tokens);
    if (n_tokens == 0) return PSHARD_OK;
    /* More than 8 tokens: passes of 8 in one launch (the GEMM paths are faster for most formats;
     * cuda_matmul sends F32 weights this way at any count, for f32 sums). */
    mv_args a = {};
    a.w = (const uint8_t *)m->data;
    a.row_bytes = m->row_bytes;
    a.n_rows = (int)m->n_rows;
    a.in_vram = !m->in_place;
    a.act = (const uint8_t *)acts;
    a.act_row_bytes = cuda_act_row_bytes(cuda_act_type(m->type), m->n_cols);
    a.y = y;
    a.y_stride = y_stride;
    a.act_div = 1;
    a.n_tokens = n_tokens;
    const int nt = n_tokens < CUDA_MATVEC_MAX_TOKENS ? n_tokens : CUDA_MATVEC_MAX_TOKENS;
    return mv_run(m->type, m->n_cols, a, nt, (unsigned)ceil_div(n_tokens, CUDA_MATVEC_MAX_TOKENS), raw_stream(s));
}
