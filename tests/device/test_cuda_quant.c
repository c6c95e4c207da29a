/* GPU test: activation quantization (F32, F16, BF16, Q8_0, Q8_1, Q8_K) must produce the CPU
 * reference's bytes exactly, on random rows, rows with outliers, all-zero blocks, ties in the
 * rounding and ties in the largest magnitude; dequantization (embedding rows in f32, rows to
 * f16) must equal the reference dequantizers exactly for all 13 weight formats. */
#include "device_test.h"

static const enum quant_type weight_types[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q4_0, QUANT_Q4_1,
                                               QUANT_Q5_0, QUANT_Q5_1, QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K,
                                               QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K};

typedef void (*act_ref_fn)(const float *, void *, int64_t);

/* Rows of several kinds, n_cols a multiple of 256. */
static void make_rows(float *x, int64_t n_rows, int64_t n_cols) {
    for (int64_t r = 0; r < n_rows; r++) {
        float *row = x + r * n_cols;
        switch (r % 5) {
        case 0: dt_fill(row, n_cols, -1.0f, 1.0f); break;
        case 1: /* outliers */
            dt_fill(row, n_cols, -0.1f, 0.1f);
            for (int64_t i = 0; i < n_cols; i += 37) row[i] = dt_uniform(-50.0f, 50.0f);
            break;
        case 2: /* zero blocks among values */
            dt_fill(row, n_cols, -3.0f, 3.0f);
            for (int64_t i = 0; i < n_cols && i < 512; i++) row[i] = 0.0f;
            break;
        case 3: /* amax 127, halves: x * 127 / amax lands exactly on .5 (rounding ties) */
            for (int64_t i = 0; i < n_cols; i++) row[i] = (float)((int)(dt_next() % 254) - 127) + 0.5f * (float)(i % 2);
            for (int64_t i = 0; i < n_cols; i += 32) row[i] = 127.0f;
            break;
        default: /* the largest magnitude twice, both signs: the first one sets the sign */
            dt_fill(row, n_cols, -1.0f, 1.0f);
            for (int64_t i = 0; i < n_cols; i += 256) row[i + 3] = -2.0f, row[i + 100] = 2.0f;
            for (int64_t i = 512; i < n_cols; i += 256) row[i + 7] = 2.0f, row[i + 9] = -2.0f;
            break;
        }
    }
}

static void test_act(struct dt *d, enum quant_type type, act_ref_fn ref, int64_t n_rows, int64_t n_cols) {
    const size_t row_bytes = cuda_act_row_bytes(type, n_cols), bytes = row_bytes * (size_t)n_rows;
    float *x = dt_malloc(sizeof(float) * (size_t)(n_rows * n_cols));
    make_rows(x, n_rows, n_cols);
    uint8_t *want = dt_malloc(bytes), *got = dt_malloc(bytes);
    for (int64_t r = 0; r < n_rows; r++) ref(x + r * n_cols, want + r * row_bytes, n_cols);
    const size_t mark = cuda_arena_mark(&d->arena);
    float *dx = dt_upload(d, x, sizeof(float) * (size_t)(n_rows * n_cols));
    void *dout = dt_alloc(d, bytes);
    DT_CHECK(cuda_quantize(type, dx, n_cols, n_rows, dout, d->s));
    dt_download(d, got, dout, bytes);
    size_t first = bytes;
    for (size_t i = 0; i < bytes && first == bytes; i++)
        if (got[i] != want[i]) first = i;
    dt_case(d, first == bytes, "quantize %-4s %4lld x %5lld: byte-identical%s", quant_type_name(type),
            (long long)n_rows, (long long)n_cols, first == bytes ? "" : " -- first difference below");
    if (first != bytes)
        printf("    byte %zu (row %zu, offset %zu): got %02x want %02x\n", first, first / row_bytes, first % row_bytes,
               got[first], want[first]);
    cuda_arena_reset(&d->arena, mark);
    free(x), free(want), free(got);
}

static void test_dequant(struct dt *d, enum quant_type type, int64_t n_rows, int64_t n_cols) {
    const size_t row_bytes = quant_row_bytes(type, n_cols);
    uint8_t *w = dt_malloc(row_bytes * (size_t)n_rows);
    dt_random_weights(type, w, n_rows, n_cols);
    const struct quant_kernels *k = quant_kernels_variant(type, QUANT_IMPL_REF);
    const int64_t n_pick = 7;
    int32_t rows[7];
    for (int i = 0; i < n_pick; i++) rows[i] = (int32_t)(dt_next() % (uint64_t)n_rows);
    float *want = dt_malloc(sizeof(float) * (size_t)(n_pick * n_cols)), *got = dt_malloc(sizeof(float) * (size_t)(n_pick * n_cols));
    for (int i = 0; i < n_pick; i++) k->dequant_row(w + (size_t)rows[i] * row_bytes, want + i * n_cols, n_cols);
    const size_t mark = cuda_arena_mark(&d->arena);
    struct cuda_matrix m = {type, dt_upload(d, w, row_bytes * (size_t)n_rows), n_cols, n_rows, 1, row_bytes, false};
    int32_t *drows = dt_upload(d, rows, sizeof rows);
    float *dout = dt_alloc(d, sizeof(float) * (size_t)(n_pick * n_cols));
    DT_CHECK(cuda_get_rows(&m, drows, n_pick, dout, d->s));
    dt_download(d, got, dout, sizeof(float) * (size_t)(n_pick * n_cols));
    int64_t bad = -1;
    for (int64_t i = 0; i < n_pick * n_cols && bad < 0; i++)
        if (memcmp(&got[i], &want[i], 4) != 0) bad = i;
    dt_case(d, bad < 0, "get_rows %-4s %lld cols: bit-identical to the reference dequantizer", quant_type_name(type),
            (long long)n_cols);
    if (bad >= 0) printf("    element %lld: got %.9g want %.9g\n", (long long)bad, got[bad], want[bad]);

    /* Rows 1..n_rows-1 to f16: the rounded reference values. */
    uint16_t *h = dt_malloc(2 * (size_t)(n_rows * n_cols));
    float *full = dt_malloc(sizeof(float) * (size_t)n_cols);
    uint16_t *dh = dt_alloc(d, 2 * (size_t)(n_rows * n_cols));
    DT_CHECK(cuda_dequantize_f16(&m, 1, n_rows - 1, dh, d->s));
    dt_download(d, h, dh, 2 * (size_t)((n_rows - 1) * n_cols));
    bad = -1;
    for (int64_t r = 1; r < n_rows && bad < 0; r++) {
        k->dequant_row(w + (size_t)r * row_bytes, full, n_cols);
        for (int64_t i = 0; i < n_cols && bad < 0; i++)
            if (h[(r - 1) * n_cols + i] != half_from_f32(full[i])) bad = r * n_cols + i;
    }
    dt_case(d, bad < 0, "dequantize_f16 %-4s: f16 of the reference values", quant_type_name(type));
    cuda_arena_reset(&d->arena, mark);
    free(w), free(want), free(got), free(h), free(full);
}

int main(void) {
    struct dt d;
    dt_init(&d, "test_cuda_quant", 512 << 20);
    dt_seed(1);
    const int64_t shapes[][2] = {{1, 256}, {5, 4096}, {13, 2304}, {3, 14336}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t rows = shapes[i][0], cols = shapes[i][1];
        test_act(&d, QUANT_Q8_0, quant_act_q8_0_ref, rows, cols);
        test_act(&d, QUANT_Q8_1, quant_act_q8_1_ref, rows, cols);
        test_act(&d, QUANT_Q8_K, quant_act_q8_K_ref, rows, cols);
        test_act(&d, QUANT_F16, quant_act_f16_ref, rows, cols);
        test_act(&d, QUANT_BF16, quant_act_bf16_ref, rows, cols);
        test_act(&d, QUANT_F32, quant_act_f32_ref, rows, cols);
    }
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
        test_dequant(&d, weight_types[t], 19, 256);
        test_dequant(&d, weight_types[t], 5, 2304);
    }
    return dt_finish(&d);
}
