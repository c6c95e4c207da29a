/* Block layouts of the quantized formats, byte for byte as GGUF stores them, plus the
 * activation formats the dot products consume (Q8_0, Q8_1, Q8_K; never stored in files).
 * Structs are packed (alignment 1) so a block may sit at any address of a mapped file;
 * halves are kept as raw uint16_t bits (see half.h). */
#ifndef QUANT_BLOCKS_H
#define QUANT_BLOCKS_H

#include <stdint.h>

#define QUANT_QK 32    /* elements per block of the legacy formats */
#define QUANT_QK_K 256 /* elements per super-block of the K formats */

#define QUANT_PACKED __attribute__((packed))

/* x = d * (q - 8), q in 0..15. Byte j of qs holds element j (low nibble) and j + 16 (high). */
struct QUANT_PACKED block_q4_0 {
    uint16_t d;
    uint8_t qs[QUANT_QK / 2];
};

/* x = d * q + m, q in 0..15, nibbles as in Q4_0. */
struct QUANT_PACKED block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QUANT_QK / 2];
};

/* x = d * (q - 16), q in 0..31: low 4 bits as in Q4_0, bit 4 of element j is bit j of qh
 * (read as a little-endian uint32). */
struct QUANT_PACKED block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QUANT_QK / 2];
};

/* x = d * q + m, q in 0..31, bits as in Q5_0. */
struct QUANT_PACKED block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QUANT_QK / 2];
};

/* x = d * q, q in -128..127 (the quantizers produce -127..127). */
struct QUANT_PACKED block_q8_0 {
    uint16_t d;
    int8_t qs[QUANT_QK];
};

/* Activation format for Q4_1/Q5_1 dots: Q8_0 plus s = d * sum(qs), so the weights' offset m
 * costs one multiply per block. */
struct QUANT_PACKED block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[QUANT_QK];
};

/* 16 sub-blocks of 16: x = d * (scales[i] & 15) * q - dmin * (scales[i] >> 4), q in 0..3.
 * Within each half of 128 elements, element 32 * j + l is bits 2j..2j+1 of qs[32 * half + l]. */
struct QUANT_PACKED block_q2_K {
    uint8_t scales[QUANT_QK_K / 16];
    uint8_t qs[QUANT_QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};

/* 16 sub-blocks of 16: x = d * (scale - 32) * (q - (hbit ? 0 : 4)), q's low 2 bits packed as
 * in Q2_K, hbit of element 32 * g + l is bit g of hmask[l]; 6-bit scales packed in 12 bytes
 * (low nibbles in bytes 0..7, high 2 bits in bytes 8..11). */
struct QUANT_PACKED block_q3_K {
    uint8_t hmask[QUANT_QK_K / 8];
    uint8_t qs[QUANT_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};

/* 8 sub-blocks of 32: x = d * sc[i] * q - dmin * m[i], q in 0..15, 6-bit sc/m packed in 12
 * bytes. Each 64 elements share 32 bytes of qs: the first 32 in low nibbles, next 32 in high. */
struct QUANT_PACKED block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[QUANT_QK_K / 2];
};

/* As Q4_K with a fifth bit: bit 4 of element 64 * j + l (l < 32) is bit 2j of qh[l], of
 * element 64 * j + 32 + l bit 2j + 1. */
struct QUANT_PACKED block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QUANT_QK_K / 8];
    uint8_t qs[QUANT_QK_K / 2];
};

/* 16 sub-blocks of 16: x = d * scales[i] * (q - 32), q in 0..63. Per half of 128 elements
 * (ql advances 64 bytes, qh 32): element l, l+32, l+64, l+96 (l < 32) take the low nibble of
 * ql[l], ql[l+32], the high nibble of ql[l], ql[l+32], and bits 0-1, 2-3, 4-5, 6-7 of qh[l]. */
struct QUANT_PACKED block_q6_K {
    uint8_t ql[QUANT_QK_K / 2];
    uint8_t qh[QUANT_QK_K / 4];
    int8_t scales[QUANT_QK_K / 16];
    uint16_t d;
};

/* Activation format for the K dots: f32 scale, and the sums of each 16 quants so that the
 * weights' minimums and offsets cost one multiply per sub-block. */
struct QUANT_PACKED block_q8_K {
    float d;
    int8_t qs[QUANT_QK_K];
    int16_t bsums[QUANT_QK_K / 16];
};

_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(struct block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(struct block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(struct block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(struct block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(struct block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(struct block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(struct block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(struct block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(struct block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(struct block_q8_K) == 292, "q8_K layout");

#endif
