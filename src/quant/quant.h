/* Quantized formats: per weight type, a kernel table (dequantize a row, quantize activations,
 * dot a weight row with quantized activations) in a reference and SIMD variants, chosen for
 * this CPU; plus quantizers from f32 for writing weights.
 *
 * A dot product follows the CPU backend of llama.cpp: activations are first quantized to the
 * type's `act_type` (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K formats,
 * F16/BF16/F32 for the float formats) with the same rounding, so the integer products are the
 * same and results agree with llama.cpp up to float summation order. */
#ifndef QUANT_QUANT_H
#define QUANT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/types.h"

enum quant_impl {
    QUANT_IMPL_REF,    /* portable C; the definition the others are tested against */
    QUANT_IMPL_AVX2,   /* AVX2 + FMA + F16C */
    QUANT_IMPL_AVX512, /* AVX-512 F/BW/VL/DQ + VNNI */
    QUANT_IMPL_VNNI256, /* 32-element formats at 256 bits with VNNI: preferred where 512-bit ops
                           run at half rate (AMD Zen 4); other types have none */
    QUANT_IMPL_COUNT,
};

/* Row-wise kernels of one weight type. `n` is a row's element count and must be a multiple of
 * `block_elems`; rows need no alignment. Every pointer is set, so a caller never checks. */
struct quant_kernels {
    enum quant_type type;     /* weight format */
    enum quant_type act_type; /* format vec_dot wants the activations in */
    enum quant_impl impl;
    uint32_t block_elems; /* of the weight format; the activation format divides it */
    /* w (n elements) -> y, f32. */
    void (*dequant_row)(const void *w, float *y, int64_t n);
    /* x (n f32) -> act (quant_act_row_bytes(k, n) bytes). */
    void (*quantize_act)(const float *x, void *act, int64_t n);
    /* sum over i < n of w[i] * act[i]. */
    float (*vec_dot)(int64_t n, const void *w, const void *act);
    /* The same for four activation rows act_stride bytes apart, bit-identical to four vec_dot
     * calls (so a token's result never depends on its batch); NULL where not implemented. */
    void (*vec_dot4)(int64_t n, const void *w, const void *act, size_t act_stride, float *out);
    /* Four weight rows w_stride bytes apart, each against n_tokens (1 to 4) activation rows
     * act_stride bytes apart: out[t * 4 + r], bit-identical to vec_dot; NULL where not
     * implemented. It converts each weight once for every token and keeps 4-16 sums going. */
    void (*dot_tile)(int64_t n, const void *w, size_t w_stride, const void *act, size_t act_stride, int n_tokens,
                     float *out);
};

/* The fastest kernels for `type` on this CPU (honouring PSHARD_CPU_DISABLE); NULL if pshard
 * does not compute with this type. Cheap: fetch once per matrix, not per row. */
const struct quant_kernels *quant_kernels_get(enum quant_type type);

/* One specific variant, or NULL if the type is unsupported or this CPU lacks the variant. */
const struct quant_kernels *quant_kernels_variant(enum quant_type type, enum quant_impl impl);

/* "ref", "avx2", "avx512". */
const char *quant_impl_name(enum quant_impl impl);

/* Bytes of a quantized activation row of n elements for these kernels. */
size_t quant_act_row_bytes(const struct quant_kernels *kernels, int64_t n);

/* Whether quant_quantize_row can write `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q6_K). */
bool quant_can_quantize(enum quant_type type);

/* Quantize n f32 values to a weight row of `type` (quant_row_bytes(type, n) bytes): the
 * round-to-nearest reference quantizers, byte-identical to gguf-py/ggml for the legacy types;
 * Q4_K and Q6_K choose scales by a short least-squares search. */
pshard_status quant_quantize_row(enum quant_type type, const float *x, void *dst, int64_t n);

/* Dequantize a row of `type` with the reference kernels, after checking the arguments. */
pshard_status quant_dequantize_row(enum quant_type type, const void *src, float *y, int64_t n);

/* ---- Reference kernels by name, for callers that want one type without the table (and for
 * the Python tests through ctypes). */
void quant_dequant_f32_ref(const void *w, float *y, int64_t n);
void quant_dequant_f16_ref(const void *w, float *y, int64_t n);
void quant_dequant_bf16_ref(const void *w, float *y, int64_t n);
void quant_dequant_q4_0_ref(const void *w, float *y, int64_t n);
void quant_dequant_q4_1_ref(const void *w, float *y, int64_t n);
void quant_dequant_q5_0_ref(const void *w, float *y, int64_t n);
void quant_dequant_q5_1_ref(const void *w, float *y, int64_t n);
void quant_dequant_q8_0_ref(const void *w, float *y, int64_t n);
void quant_dequant_q2_K_ref(const void *w, float *y, int64_t n);
void quant_dequant_q3_K_ref(const void *w, float *y, int64_t n);
void quant_dequant_q4_K_ref(const void *w, float *y, int64_t n);
void quant_dequant_q5_K_ref(const void *w, float *y, int64_t n);
void quant_dequant_q6_K_ref(const void *w, float *y, int64_t n);

/* Activation quantizers (reference; the SIMD ones produce identical bytes). */
void quant_act_f32_ref(const float *x, void *act, int64_t n);
void quant_act_f16_ref(const float *x, void *act, int64_t n);
void quant_act_bf16_ref(const float *x, void *act, int64_t n);
void quant_act_q8_0_ref(const float *x, void *act, int64_t n);
void quant_act_q8_1_ref(const float *x, void *act, int64_t n);
void quant_act_q8_K_ref(const float *x, void *act, int64_t n);

#endif
