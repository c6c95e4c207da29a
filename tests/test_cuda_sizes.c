/* The CUDA kernels' work sizes as shape arithmetic (src/cuda/cuda_sizes.c), which every build has:
 * the MoE work buffer's parts are aligned, in order and apart, and its activations take the
 * matrix-vector kernel's formats up to its bound and f16 beyond; decode and prompt attention cut
 * a cache into slices that cover it, of the least length or more, filling the GPU and no more;
 * a product's work holds its activations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cuda/cuda_sizes.h"

/* qwen30b's experts: 128 of them, 8 a token, 2048 wide, 768 rows, Q4_0. */
static struct cuda_moe qwen30b_moe(void) {
    struct cuda_moe m = {0};
    m.gate = (struct cuda_matrix){.type = QUANT_Q4_0, .n_rows = 768, .n_cols = 2048};
    m.up = m.gate;
    m.down = (struct cuda_matrix){.type = QUANT_Q4_0, .n_rows = 2048, .n_cols = 768};
    m.n_expert = 128, m.k = 8;
    return m;
}

static void moe_parts_in_order(const struct cuda_moe_layout *L) {
    const size_t parts[] = {L->expert_start, L->active, L->n_active, L->n_tiles, L->tile_expert, L->tile_start,
                            L->pairs, L->gate_out, L->up_out, L->down_out, L->x_act, L->x_act_up, L->h_act};
    size_t last = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i] == CUDA_NO_PART) continue;
        assert_int_equal(parts[i] % 256, 0);
        if (i) assert_true(parts[i] > last); /* every part takes room: the next starts past it */
        last = parts[i];
    }
    assert_true(L->bytes > last);
    assert_int_equal(L->bytes % 256, 0);
}

static void test_moe_layout(void **state) {
    (void)state;
    const struct cuda_moe m = qwen30b_moe();
    const int64_t bound = cuda_moe_matvec_bound(&m);
    const struct cuda_moe_layout small = cuda_moe_layout(&m, 1), at = cuda_moe_layout(&m, bound),
                                 big = cuda_moe_layout(&m, bound + 1);
    moe_parts_in_order(&small), moe_parts_in_order(&at), moe_parts_in_order(&big);
    /* up to the bound: Q8_1 activations for gate and up apart; beyond: one f16 copy */
    assert_false(cuda_moe_tiled(&m, bound));
    assert_true(cuda_moe_tiled(&m, bound + 1));
    assert_true(small.x_act_up != CUDA_NO_PART && at.x_act_up != CUDA_NO_PART);
    assert_true(big.x_act_up == CUDA_NO_PART);
    assert_int_equal(small.h_act - small.x_act_up >= cuda_act_row_bytes(QUANT_Q8_1, 2048), 1);
    assert_true(big.bytes > at.bytes);
    assert_int_equal(cuda_moe_work_bytes(&m, 7), cuda_moe_layout(&m, 7).bytes);
    /* a caller's own bound moves the switch; experts read in place keep the matrix-vector
     * kernel's bound whatever the device (the int8 kernel's lower one is for VRAM) */
    struct cuda_moe m8 = m;
    m8.matvec_max_tokens = 8;
    assert_true(cuda_moe_tiled(&m8, 9) && !cuda_moe_tiled(&m8, 8));
    struct cuda_moe host = m;
    host.gate.in_place = true;
    assert_int_equal(cuda_moe_matvec_bound(&host), cuda_moe_matvec_max_tokens(m.n_expert, m.k));
}

/* A step past a slice takes a slice's work buffer, or the last, shorter slice's where that one
 * (on the other kernel) needs more; up to a slice, the step's own. */
static void test_moe_slices(void **state) {
    (void)state;
    struct cuda_moe m = qwen30b_moe();
    const int64_t S = cuda_moe_slice_tokens(&m);
    assert_int_equal(S, CUDA_MOE_SLICE_TOKENS);
    assert_int_equal(cuda_moe_work_bytes(&m, S), cuda_moe_layout(&m, S).bytes);
    assert_int_equal(cuda_moe_work_bytes(&m, 2 * S), cuda_moe_layout(&m, S).bytes);
    assert_int_equal(cuda_moe_work_bytes(&m, 4 * S + 3), cuda_moe_layout(&m, S).bytes);
    assert_true(cuda_moe_layout(&m, 2 * S).bytes > cuda_moe_layout(&m, S).bytes);
    /* slices of 5: every step past 5 tokens takes the larger of 5 tokens' layout and its rest's */
    m.slice_tokens = 5;
    for (int64_t n = 1; n <= 40; n++) {
        const size_t whole = cuda_moe_layout(&m, n < 5 ? n : 5).bytes, rest = cuda_moe_layout(&m, n % 5).bytes;
        assert_int_equal(cuda_moe_work_bytes(&m, n), n <= 5 || whole >= rest ? whole : rest);
    }
    /* a tiled slice (bound + 1 tokens) with a last slice on the matrix-vector kernel */
    const int64_t bound = cuda_moe_matvec_bound(&m);
    m.slice_tokens = (int)bound + 1;
    const size_t tiled = cuda_moe_layout(&m, bound + 1).bytes, mv = cuda_moe_layout(&m, bound).bytes;
    assert_int_equal(cuda_moe_work_bytes(&m, 2 * bound + 1), tiled > mv ? tiled : mv);
}

static void test_attention_slices(void **state) {
    (void)state;
    const struct cuda_attn_shape a = {.n_head = 32, .n_head_kv = 4, .head_k = 128, .head_v = 128};
    const int32_t lens[] = {1, 63, 64, 1000, 4096, 40000};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (int64_t n = 1; n <= 64; n *= 4) {
            int splits, len;
            cuda_decode_split(&a, n, lens[i], &splits, &len);
            assert_true(splits >= 1 && len % CUDA_DECODE_MIN_SPLIT == 0);
            assert_true((int64_t)splits * len >= lens[i] && (int64_t)(splits - 1) * len < lens[i]); /* covers, none empty */
            if (splits > 1) assert_true((int64_t)(splits - 1) * a.n_head_kv * n < CUDA_DECODE_TARGET_BLOCKS);
            assert_int_equal(cuda_attention_decode_work_bytes(&a, n, lens[i]),
                             (size_t)n * a.n_head * splits * (a.head_v + 2) * sizeof(float));
            cuda_prefill_split(&a, n, lens[i], &splits, &len);
            assert_true(splits >= 1 && len % CUDA_KV_TILE == 0 && (int64_t)splits * len >= lens[i]);
            if (splits > 1) assert_true(len >= CUDA_PREFILL_MIN_SPLIT);
            assert_int_equal(cuda_prefill_split_bytes(&a, n, lens[i]) == 0, splits == 1);
        }
    }
    /* a prompt's work holds the slices of its largest split count over every tile count */
    assert_true(cuda_attention_prefill_work_bytes(&a, 1024, 16384) >= cuda_prefill_split_bytes(&a, 64, 16384));
    assert_int_equal(cuda_attention_prefill_work_bytes(&a, 1024, 256), 0); /* too short to split */
}

static void test_matmul_work(void **state) {
    (void)state;
    const struct cuda_matrix q = {.type = QUANT_Q4_K, .n_rows = 4096, .n_cols = 4096};
    const struct cuda_matrix f = {.type = QUANT_F32, .n_rows = 4096, .n_cols = 4096};
    const struct cuda_matrix h = {.type = QUANT_F16, .n_rows = 4096, .n_cols = 4096};
    assert_int_equal(cuda_act_type(QUANT_Q4_K), QUANT_Q8_K);
    assert_int_equal(cuda_act_type(QUANT_Q4_0), QUANT_Q8_1);
    assert_true(cuda_matmul_work_bytes(&q, 1) >= cuda_act_row_bytes(QUANT_Q8_K, 4096));
    assert_int_equal(cuda_matmul_work_bytes(&f, 512), 0);
    /* many tokens: f16 activations, and F16 weights room for a chunk of rows copied up */
    assert_true(cuda_matmul_work_bytes(&h, 512) >= (size_t)512 * 4096 * 2 + (size_t)CUDA_MATMUL_CHUNK_ROWS * 4096 * 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_layout),
        cmocka_unit_test(test_moe_slices),
        cmocka_unit_test(test_attention_slices),
        cmocka_unit_test(test_matmul_work),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
