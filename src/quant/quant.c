/* The kernel tables: which dequant/activation/dot functions serve each type in each variant,
 * the choice of variant for this CPU, and checked entry points for whole rows. */
#include "quant/quant.h"

#include "core/cpu_features.h"
#include "core/error.h"
#include "quant/quant_internal.h"

/* One table entry: type T (kernel suffix t, block size), activation format A (quantizer a),
 * the variant, and the variant that supplies dequantization (not every variant has its own). */
#define ENTRY_WITH(T, t, elems, A, a, impl, dq, dot4, tile) \
    [QUANT_##T] = {QUANT_##T,                                \
                   QUANT_##A,                                \
                   IMPL_##impl,                              \
                   elems,                                    \
                   quant_dequant_##t##_##dq,                 \
                   quant_act_##a##_##impl,                   \
                   quant_dot_##t##_##impl,                   \
                   dot4,                                     \
                   tile}
#define ENTRY(T, t, elems, A, a, impl, dq) ENTRY_WITH(T, t, elems, A, a, impl, dq, NULL, NULL)
/* An entry that also has a four-token dot product. */
#define ENTRY4(T, t, elems, A, a, impl, dq) ENTRY_WITH(T, t, elems, A, a, impl, dq, quant_dot4_##t##_##impl, NULL)
/* An entry with a tile of four rows by up to four tokens. */
#define ENTRYT(T, t, elems, A, a, impl, dq) ENTRY_WITH(T, t, elems, A, a, impl, dq, NULL, quant_tile_##t##_##impl)
#define IMPL_ref QUANT_IMPL_REF
#define IMPL_avx2 QUANT_IMPL_AVX2
#define IMPL_avx512 QUANT_IMPL_AVX512

/* clang-format off */
static const struct quant_kernels ref_table[QUANT_TYPE_LIMIT] = {
    ENTRY(F32, f32, 1, F32, f32, ref, ref),
    ENTRY(F16, f16, 1, F16, f16, ref, ref),
    ENTRY(BF16, bf16, 1, BF16, bf16, ref, ref),
    ENTRY(Q4_0, q4_0, 32, Q8_0, q8_0, ref, ref),
    ENTRY(Q4_1, q4_1, 32, Q8_1, q8_1, ref, ref),
    ENTRY(Q5_0, q5_0, 32, Q8_0, q8_0, ref, ref),
    ENTRY(Q5_1, q5_1, 32, Q8_1, q8_1, ref, ref),
    ENTRY(Q8_0, q8_0, 32, Q8_0, q8_0, ref, ref),
    ENTRY(Q2_K, q2_K, 256, Q8_K, q8_K, ref, ref),
    ENTRY(Q3_K, q3_K, 256, Q8_K, q8_K, ref, ref),
    ENTRY(Q4_K, q4_K, 256, Q8_K, q8_K, ref, ref),
    ENTRY(Q5_K, q5_K, 256, Q8_K, q8_K, ref, ref),
    ENTRY(Q6_K, q6_K, 256, Q8_K, q8_K, ref, ref),
};

/* F32 activations are a plain copy in every variant. */
#define quant_act_f32_avx2 quant_act_f32_ref
#define quant_act_f32_avx512 quant_act_f32_ref

static const struct quant_kernels avx2_table[QUANT_TYPE_LIMIT] = {
    ENTRYT(F32, f32, 1, F32, f32, avx2, ref),
    ENTRYT(F16, f16, 1, F16, f16, avx2, avx2),
    ENTRYT(BF16, bf16, 1, BF16, bf16, avx2, avx2),
    ENTRY4(Q4_0, q4_0, 32, Q8_0, q8_0, avx2, avx2),
    ENTRY4(Q4_1, q4_1, 32, Q8_1, q8_1, avx2, ref),
    ENTRY(Q5_0, q5_0, 32, Q8_0, q8_0, avx2, avx2),
    ENTRY(Q5_1, q5_1, 32, Q8_1, q8_1, avx2, ref),
    ENTRY4(Q8_0, q8_0, 32, Q8_0, q8_0, avx2, avx2),
    ENTRY4(Q2_K, q2_K, 256, Q8_K, q8_K, avx2, ref),
    ENTRY4(Q3_K, q3_K, 256, Q8_K, q8_K, avx2, ref),
    ENTRY4(Q4_K, q4_K, 256, Q8_K, q8_K, avx2, ref),
    ENTRY4(Q5_K, q5_K, 256, Q8_K, q8_K, avx2, ref),
    ENTRY4(Q6_K, q6_K, 256, Q8_K, q8_K, avx2, ref),
};

/* AVX-512 machines run the AVX2 dequantizers of the legacy formats (store-bound anyway). The
 * K formats and offset formats dequantize with the reference everywhere: see legacy_avx2.c. */
static const struct quant_kernels avx512_table[QUANT_TYPE_LIMIT] = {
    ENTRYT(F32, f32, 1, F32, f32, avx512, ref),
    ENTRYT(F16, f16, 1, F16, f16, avx512, avx512),
    ENTRYT(BF16, bf16, 1, BF16, bf16, avx512, avx512),
    ENTRY4(Q4_0, q4_0, 32, Q8_0, q8_0, avx512, avx2),
    ENTRY4(Q4_1, q4_1, 32, Q8_1, q8_1, avx512, ref),
    ENTRY(Q5_0, q5_0, 32, Q8_0, q8_0, avx512, avx2),
    ENTRY(Q5_1, q5_1, 32, Q8_1, q8_1, avx512, ref),
    ENTRY4(Q8_0, q8_0, 32, Q8_0, q8_0, avx512, avx2),
    ENTRY4(Q2_K, q2_K, 256, Q8_K, q8_K, avx512, ref),
    ENTRY4(Q3_K, q3_K, 256, Q8_K, q8_K, avx512, ref),
    ENTRY4(Q4_K, q4_K, 256, Q8_K, q8_K, avx512, ref),
    ENTRY4(Q5_K, q5_K, 256, Q8_K, q8_K, avx512, ref),
    ENTRY4(Q6_K, q6_K, 256, Q8_K, q8_K, avx512, ref),
};

/* clang-format on */

const char *quant_impl_name(enum quant_impl impl) {
    switch (impl) {
    case QUANT_IMPL_REF: return "ref";
    case QUANT_IMPL_AVX2: return "avx2";
    case QUANT_IMPL_AVX512: return "avx512";
    case QUANT_IMPL_VNNI256: return "vnni256";
    default: return "unknown";
    }
}

/* For CPUs that run 512-bit ops at half rate: the legacy formats at 256 bits with VNNI, and the
 * AVX-512 activation quantizers (same bytes as every variant). */
#define IMPL_vnni256 QUANT_IMPL_VNNI256
#define quant_act_q8_0_vnni256 quant_act_q8_0_avx512
#define quant_act_q8_1_vnni256 quant_act_q8_1_avx512
static const struct quant_kernels vnni256_table[QUANT_TYPE_LIMIT] = {
    ENTRY4(Q4_0, q4_0, 32, Q8_0, q8_0, vnni256, avx2),
    ENTRY4(Q4_1, q4_1, 32, Q8_1, q8_1, vnni256, ref),
    ENTRY(Q5_0, q5_0, 32, Q8_0, q8_0, vnni256, avx2),
    ENTRY(Q5_1, q5_1, 32, Q8_1, q8_1, vnni256, ref),
    ENTRY4(Q8_0, q8_0, 32, Q8_0, q8_0, vnni256, avx2),
};

static const struct quant_kernels *table_of(enum quant_impl impl) {
    switch (impl) {
    case QUANT_IMPL_REF: return ref_table;
    case QUANT_IMPL_AVX2: return avx2_table;
    case QUANT_IMPL_AVX512: return avx512_table;
    case QUANT_IMPL_VNNI256: return vnni256_table;
    default: return NULL;
    }
}

static bool impl_available(enum quant_impl impl) {
    const struct cpu_features *f = cpu_features();
    switch (impl) {
    case QUANT_IMPL_REF: return true;
    case QUANT_IMPL_AVX2: return f->avx2;
    case QUANT_IMPL_AVX512:
    case QUANT_IMPL_VNNI256: return f->avx512 && f->avx512_vnni;
    default: return false;
    }
}

const struct quant_kernels *quant_kernels_variant(enum quant_type type, enum quant_impl impl) {
    if ((unsigned)type >= QUANT_TYPE_LIMIT || (unsigned)impl >= QUANT_IMPL_COUNT) return NULL;
    const struct quant_kernels *table = table_of(impl);
    if (!table || !table[type].vec_dot || !impl_available(impl)) return NULL;
    return &table[type];
}

const struct quant_kernels *quant_kernels_get(enum quant_type type) {
    /* Where 512-bit ops run at half rate, one block per 256-bit VNNI instruction beats the
     * two-blocks-per-vector kernels (measured on Zen 4: prefill 0.88x -> see bench/RESULTS.md).
     * Intel stays on the pairs: one Xeon ran the 256-bit kernels faster, the benchmark machine's
     * ran Q4_1 and Q8_0 slower (bench/RESULTS.md, the 32-element formats on Intel). */
    const struct quant_kernels *narrow = quant_kernels_variant(type, QUANT_IMPL_VNNI256);
    if (narrow && cpu_features()->avx512_half_rate) return narrow;
    for (int impl = QUANT_IMPL_AVX512; impl >= 0; impl--) {
        const struct quant_kernels *k = quant_kernels_variant(type, (enum quant_impl)impl);
        if (k) return k;
    }
    return NULL;
}

size_t quant_act_row_bytes(const struct quant_kernels *kernels, int64_t n) {
    switch (kernels->act_type) {
    case QUANT_F32: return (size_t)n * 4;
    case QUANT_F16:
    case QUANT_BF16: return (size_t)n * 2;
    case QUANT_Q8_0: return (size_t)(n / QUANT_QK) * sizeof(struct block_q8_0);
    case QUANT_Q8_1: return (size_t)(n / QUANT_QK) * sizeof(struct block_q8_1);
    case QUANT_Q8_K: return (size_t)(n / QUANT_QK_K) * sizeof(struct block_q8_K);
    default: return 0;
    }
}

bool quant_can_quantize(enum quant_type type) {
    switch (type) {
    case QUANT_F32:
    case QUANT_F16:
    case QUANT_BF16:
    case QUANT_Q4_0:
    case QUANT_Q4_1:
    case QUANT_Q5_0:
    case QUANT_Q5_1:
    case QUANT_Q8_0:
    case QUANT_Q4_K:
    case QUANT_Q6_K: return true;
    default: return false;
    }
}

static pshard_status check_row(enum quant_type type, const void *a, const void *b, int64_t n) {
    const struct quant_type_info *info = quant_type_info((uint32_t)type);
    if (!info || !ref_table[type].vec_dot)
        return core_fail(PSHARD_ERR_UNSUPPORTED, "quant: type %s is not supported", quant_type_name((uint32_t)type));
    if (!a || !b) return core_fail(PSHARD_ERR_INVALID_ARG, "quant: NULL row");
    if (n < 0 || n % info->block_elems != 0)
        return core_fail(PSHARD_ERR_INVALID_ARG, "quant: row of %lld elements is not a multiple of the %s block (%u)",
                         (long long)n, info->name, info->block_elems);
    return PSHARD_OK;
}

pshard_status quant_quantize_row(enum quant_type type, const float *x, void *dst, int64_t n) {
    if (!quant_can_quantize(type))
        return core_fail(PSHARD_ERR_UNSUPPORTED, "quant: cannot quantize to %s", quant_type_name((uint32_t)type));
    CORE_TRY(check_row(type, x, dst, n));
    switch (type) {
    case QUANT_F32: quant_act_f32_ref(x, dst, n); break;
    case QUANT_F16: quant_act_f16_ref(x, dst, n); break;
    case QUANT_BF16: quant_act_bf16_ref(x, dst, n); break;
    case QUANT_Q4_0: quant_quantize_q4_0(x, dst, n); break;
    case QUANT_Q4_1: quant_quantize_q4_1(x, dst, n); break;
    case QUANT_Q5_0: quant_quantize_q5_0(x, dst, n); break;
    case QUANT_Q5_1: quant_quantize_q5_1(x, dst, n); break;
    case QUANT_Q8_0: quant_quantize_q8_0(x, dst, n); break;
    case QUANT_Q4_K: quant_quantize_q4_K(x, dst, n); break;
    case QUANT_Q6_K: quant_quantize_q6_K(x, dst, n); break;
    default: return core_fail(PSHARD_ERR_INTERNAL, "quant: no quantizer for %s", quant_type_name((uint32_t)type));
    }
    return PSHARD_OK;
}

pshard_status quant_dequantize_row(enum quant_type type, const void *src, float *y, int64_t n) {
    CORE_TRY(check_row(type, src, y, n));
    ref_table[type].dequant_row(src, y, n);
    return PSHARD_OK;
}
