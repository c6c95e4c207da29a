/* What the CPU can do, read once with cpuid; SIMD kernels are chosen from this at run time. */
#ifndef CORE_CPU_FEATURES_H
#define CORE_CPU_FEATURES_H

#include <stdbool.h>

struct cpu_features {
    bool avx2;       /* AVX2 + FMA + F16C together */
    bool avx512;     /* AVX-512 F, BW, VL, DQ together */
    bool avx512_vnni;
    bool avx512_bf16;
    bool amx_int8;
    bool amx_bf16;
    bool avx512_half_rate; /* 512-bit ops run as two 256-bit halves (AMD Zen 4) */
    char brand[64];
};

/* The features of this CPU, minus those disabled by the environment variable
 * PSHARD_CPU_DISABLE (comma list of avx2, avx512, vnni, bf16, amx), so tests can force the
 * portable paths. The table is computed once and never changes afterwards. */
const struct cpu_features *cpu_features(void);

#endif
