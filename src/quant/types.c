/* The table of element types: names, block sizes and which ones we compute with. */
#include "quant/types.h"

static const struct quant_type_info type_table[QUANT_TYPE_LIMIT] = {
    [QUANT_F32] = {"F32", 1, 4, true},
    [QUANT_F16] = {"F16", 1, 2, true},
    [QUANT_Q4_0] = {"Q4_0", 32, 18, true},
    [QUANT_Q4_1] = {"Q4_1", 32, 20, true},
    [QUANT_Q5_0] = {"Q5_0", 32, 22, true},
    [QUANT_Q5_1] = {"Q5_1", 32, 24, true},
    [QUANT_Q8_0] = {"Q8_0", 32, 34, true},
    [QUANT_Q8_1] = {"Q8_1", 32, 36, false}, /* ggml's layout (gguf-py still says 40) */
    [QUANT_Q2_K] = {"Q2_K", 256, 84, true},
    [QUANT_Q3_K] = {"Q3_K", 256, 110, true},
    [QUANT_Q4_K] = {"Q4_K", 256, 144, true},
    [QUANT_Q5_K] = {"Q5_K", 256, 176, true},
    [QUANT_Q6_K] = {"Q6_K", 256, 210, true},
    [QUANT_Q8_K] = {"Q8_K", 256, 292, false},
    [QUANT_IQ2_XXS] = {"IQ2_XXS", 256, 66, false},
    [QUANT_IQ2_XS] = {"IQ2_XS", 256, 74, false},
    [QUANT_IQ3_XXS] = {"IQ3_XXS", 256, 98, false},
    [QUANT_IQ1_S] = {"IQ1_S", 256, 50, false},
    [QUANT_IQ4_NL] = {"IQ4_NL", 32, 18, false},
    [QUANT_IQ3_S] = {"IQ3_S", 256, 110, false},
    [QUANT_IQ2_S] = {"IQ2_S", 256, 82, false},
    [QUANT_IQ4_XS] = {"IQ4_XS", 256, 136, false},
    [QUANT_I8] = {"I8", 1, 1, false},
    [QUANT_I16] = {"I16", 1, 2, false},
    [QUANT_I32] = {"I32", 1, 4, false},
    [QUANT_I64] = {"I64", 1, 8, false},
    [QUANT_F64] = {"F64", 1, 8, false},
    [QUANT_IQ1_M] = {"IQ1_M", 256, 56, false},
    [QUANT_BF16] = {"BF16", 1, 2, true},
    [QUANT_TQ1_0] = {"TQ1_0", 256, 54, false},
    [QUANT_TQ2_0] = {"TQ2_0", 256, 66, false},
    [QUANT_MXFP4] = {"MXFP4", 32, 17, false},
};

const struct quant_type_info *quant_type_info(uint32_t type) {
    if (type >= QUANT_TYPE_LIMIT || type_table[type].name == NULL) return NULL;
    return &type_table[type];
}

const char *quant_type_name(uint32_t type) {
    const struct quant_type_info *info = quant_type_info(type);
    return info ? info->name : "unknown";
}

size_t quant_row_bytes(enum quant_type type, int64_t n_elems) {
    const struct quant_type_info *info = quant_type_info((uint32_t)type);
    if (!info || n_elems < 0 || n_elems % info->block_elems != 0) return 0;
    return (size_t)(n_elems / info->block_elems) * info->block_bytes;
}
