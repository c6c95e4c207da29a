/* What a CPU prompt's Q4_0 products would gain from weights repacked so that a vector's lanes are
 * weight rows instead of positions along one row. Today's kernels (quant_kernels' vec_dot4) give
 * each pair of blocks of ONE row a vpdpbusd whose 16 lanes are positions, and every token then
 * pays a conversion, a scale spread and an fma for those two blocks. Here 16 rows are interleaved:
 * lane r of a vpdpbusd is row r, four codes of row r against the same four activations (one
 * broadcast), so a block of 16 rows takes 8 vpdpbusd a token and one conversion, one multiply and
 * one fma for all 16 rows. Q8_0 activations as the engine makes them; single thread; an L2-sized
 * matrix, as bench/quant_bench's L2x4 column.
 *
 * Build: cc -O2 -march=native -Isrc -Iinclude bench/repack_probe.c -Lbuild -lpshard \
 *          -Wl,-rpath,$PWD/build -lm -o build/repack_probe        (a CPU with AVX-512 VNNI)
 * Run:   build/repack_probe [n=2048] [rows=448]
 * Prints GB/s of Q4_0 weights for 1 and 4 tokens a row, the engine's kernel beside the repacked
 * one, and the largest difference between their results (the sums' order differs). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant.h"

enum { LANES = 16, TOKENS = 4, TRIALS = 9 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static float next_value(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((int64_t)(rng % 2001) - 1000) / 997.0f;
}

/* 16 rows' block b: the codes as four 64-byte vectors, vector j's byte 4r + i holding row r's
 * elements 4j + i (low nibble) and 16 + 4j + i (high nibble), as a Q4_0 byte holds i and i + 16;
 * then the 16 rows' scales. */
struct group_block {
    uint8_t codes[4][64];
    uint16_t d[LANES];
};

static void repack(const struct block_q4_0 *w, int64_t nb, int64_t rows, struct group_block *out) {
    for (int64_t g = 0; g < rows / LANES; g++)
        for (int64_t b = 0; b < nb; b++) {
            struct group_block *o = &out[g * nb + b];
            for (int r = 0; r < LANES; r++) {
                const struct block_q4_0 *src = &w[(g * LANES + r) * nb + b];
                o->d[r] = src->d;
                for (int j = 0; j < 4; j++)
                    for (int i = 0; i < 4; i++) o->codes[j][4 * r + i] = src->qs[4 * j + i];
            }
        }
}

/* y[t][row] for NT (1 or 4) activation rows; offset8[t][b]: 8 * the sum of token t's block b
 * (the Q4_0 offset), worked out once per token as a prompt would. Two chains of vpdpbusd a token,
 * so the tokens' chains overlap. */
static inline __attribute__((always_inline)) void repacked_product_n(const struct group_block *wg, int64_t nb,
                                                                     int64_t rows, const struct block_q8_0 *const *a,
                                                                     const int32_t *const *offset8, const int NT,
                                                                     float *y) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int64_t g = 0; g < rows / LANES; g++) {
        __m512 acc[TOKENS];
        for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const struct group_block *blk = &wg[g * nb + b];
            __m512i c[8];
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512(blk->codes[j]);
                c[j] = _mm512_and_si512(v, low);
                c[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
            const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk->d));
            for (int t = 0; t < NT; t++) {
                const int8_t *q = a[t][b].qs;
                __m512i s0 = _mm512_set1_epi32(-offset8[t][b]), s1 = _mm512_setzero_si512();
                for (int j = 0; j < 4; j++) { /* the activations' 4-byte groups j and 4 + j, broadcast */
                    int32_t lo, hi;
                    memcpy(&lo, q + 4 * j, 4);
                    memcpy(&hi, q + 16 + 4 * j, 4);
                    s0 = _mm512_dpbusd_epi32(s0, c[j], _mm512_set1_epi32(lo));
                    s1 = _mm512_dpbusd_epi32(s1, c[j + 4], _mm512_set1_epi32(hi));
                }
                const __m512 scale = _mm512_mul_ps(wd, _mm512_set1_ps(half_to_f32(a[t][b].d)));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[t]);
            }
        }
        for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + (int64_t)t * rows + g * LANES, acc[t]);
    }
}

static void repacked_product(const struct group_block *wg, int64_t nb, int64_t rows, const struct block_q8_0 *const *a,
                             const int32_t *const *offset8, int n_tokens, float *y) {
    if (n_tokens == 1) repacked_product_n(wg, nb, rows, a, offset8, 1, y);
    else repacked_product_n(wg, nb, rows, a, offset8, TOKENS, y);
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : 2048, rows = argc > 2 ? atoll(argv[2]) : 448;
    if (n <= 0 || n % 32 || rows <= 0 || rows % LANES) {
        fprintf(stderr, "repack_probe: n a multiple of 32, rows a multiple of %d\n", LANES);
        return 2;
    }
    const struct quant_kernels *k = quant_kernels_get(QUANT_Q4_0);
    if (!k || !__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "repack_probe: needs AVX-512 VNNI\n");
        return 2;
    }
    const int64_t nb = n / 32;
    const size_t row_bytes = quant_row_bytes(QUANT_Q4_0, n), act_bytes = quant_act_row_bytes(k, n);
    float *x = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * TOKENS * rows);
    float *out = malloc(sizeof(float) * TOKENS * rows);
    uint8_t *w = malloc(row_bytes * rows), *act = malloc(act_bytes * TOKENS);
    struct group_block *wg = malloc(sizeof *wg * (rows / LANES) * nb);
    int32_t *off = malloc(sizeof(int32_t) * TOKENS * nb);
    if (!x || !ref || !out || !w || !act || !wg || !off) return 1;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++) x[i] = next_value();
        quant_quantize_row(QUANT_Q4_0, x, w + r * row_bytes, n);
    }
    const struct block_q8_0 *a[TOKENS];
    const int32_t *offset8[TOKENS];
    for (int t = 0; t < TOKENS; t++) {
        for (int64_t i = 0; i < n; i++) x[i] = next_value();
        k->quantize_act(x, act + t * act_bytes, n);
        a[t] = (const struct block_q8_0 *)(act + t * act_bytes);
        for (int64_t b = 0; b < nb; b++) {
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += a[t][b].qs[i];
            off[t * nb + b] = 8 * s;
        }
        offset8[t] = off + t * nb;
    }
    repack((const struct block_q4_0 *)w, nb, rows, wg);

    double best[2][2] = {{0}}; /* [engine, repacked][1 token, 4 tokens] */
    for (int trial = 0; trial < TRIALS; trial++)
        for (int tokens = 1, m = 0; tokens <= TOKENS; tokens += 3, m++) {
            double t0 = now_s(), t1;
            int reps = 0;
            do {
                for (int64_t r = 0; r < rows; r++) {
                    if (tokens == 1) ref[r] = k->vec_dot(n, w + r * row_bytes, act);
                    else {
                        float o4[TOKENS];
                        k->vec_dot4(n, w + r * row_bytes, act, act_bytes, o4);
                        for (int t = 0; t < TOKENS; t++) ref[t * rows + r] = o4[t];
                    }
                }
                reps++;
            } while ((t1 = now_s()) - t0 < 0.05);
            const double engine = (double)row_bytes * rows * reps / (t1 - t0) / 1e9;
            t0 = now_s(), reps = 0;
            do {
                repacked_product(wg, nb, rows, a, offset8, tokens, out);
                reps++;
            } while ((t1 = now_s()) - t0 < 0.05);
            const double packed = (double)row_bytes * rows * reps / (t1 - t0) / 1e9;
            if (engine > best[0][m]) best[0][m] = engine;
            if (packed > best[1][m]) best[1][m] = packed;
        }
    double worst = 0, spread = 0;
    for (int64_t i = 0; i < TOKENS * rows; i++) {
        worst = fmax(worst, fabs((double)out[i] - ref[i]));
        spread = fmax(spread, fabs((double)ref[i]));
    }
    printf("Q4_0, n = %lld, %lld rows (%.0f KB), single thread, best of %d; GB/s of weights\n", (long long)n,
           (long long)rows, (double)row_bytes * rows / 1024, TRIALS);
    printf("%-22s %9s %9s\n", "", "1 token", "4 tokens");
    printf("%-22s %9.1f %9.1f\n", quant_impl_name(k->impl), best[0][0], best[0][1]);
    printf("%-22s %9.1f %9.1f\n", "16 rows interleaved", best[1][0], best[1][1]);
    printf("largest difference %.3g of results up to %.3g\n", worst, spread);
    free(x), free(ref), free(out), free(w), free(act), free(wg), free(off);
    return worst <= 1e-4 * spread ? 0 : 1;
}
