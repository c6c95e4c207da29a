/* The AVX2 kernels of the 32-element formats rebuilt with 256-bit VNNI (one vpdpbusd per
 * block), for CPUs whose 512-bit ops run at half rate (AMD Zen 4): there one block per 256-bit
 * instruction beats two blocks per 512-bit one. Same integer sums, same float order as AVX2. */
#define LEGACY_DOT_NAME(type) quant_dot_##type##_vnni256
#define LEGACY_DOT4_NAME(type) quant_dot4_##type##_vnni256
#define LEGACY_DOTS_ONLY
#include "legacy_avx2.c"
