/* Tensor element types as GGUF numbers them (ggml's type ids), and their block geometry.
 * A row of n elements of a block type occupies n / block_elems * block_bytes bytes. */
#ifndef QUANT_TYPES_H
#define QUANT_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum quant_type {
    QUANT_F32 = 0,
    QUANT_F16 = 1,
    QUANT_Q4_0 = 2,
    QUANT_Q4_1 = 3,
    QUANT_Q5_0 = 6,
    QUANT_Q5_1 = 7,
    QUANT_Q8_0 = 8,
    QUANT_Q8_1 = 9,
    QUANT_Q2_K = 10,
    QUANT_Q3_K = 11,
    QUANT_Q4_K = 12,
    QUANT_Q5_K = 13,
    QUANT_Q6_K = 14,
    QUANT_Q8_K = 15,
    QUANT_IQ2_XXS = 16,
    QUANT_IQ2_XS = 17,
    QUANT_IQ3_XXS = 18,
    QUANT_IQ1_S = 19,
    QUANT_IQ4_NL = 20,
    QUANT_IQ3_S = 21,
    QUANT_IQ2_S = 22,
    QUANT_IQ4_XS = 23,
    QUANT_I8 = 24,
    QUANT_I16 = 25,
    QUANT_I32 = 26,
    QUANT_I64 = 27,
    QUANT_F64 = 28,
    QUANT_IQ1_M = 29,
    QUANT_BF16 = 30,
    QUANT_TQ1_0 = 34,
    QUANT_TQ2_0 = 35,
    QUANT_MXFP4 = 39,
    QUANT_TYPE_LIMIT = 40, /* one past the largest id we know */
};

struct quant_type_info {
    const char *name;     /* "Q4_K"; NULL for ids that are not types */
    uint32_t block_elems; /* elements per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
    bool supported;       /* pshard can compute with it (dequant + dot) */
};

/* Geometry of a type id; NULL if the id is not a known type. */
const struct quant_type_info *quant_type_info(uint32_t type);

/* Name of a type id, or "type#N" style text for unknown ids (static buffer per call site is
 * not used: returns "unknown" for those). */
const char *quant_type_name(uint32_t type);

/* Bytes of a row of n_elems elements; 0 if n_elems is not a multiple of the block size. */
size_t quant_row_bytes(enum quant_type type, int64_t n_elems);

#endif
