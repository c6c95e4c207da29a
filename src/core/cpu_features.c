/* cpuid/xgetbv probing of the instruction sets the kernels use. */
#include "core/cpu_features.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void probe(struct cpu_features *f) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    const bool amd = b == 0x68747541; /* "Auth"enticAMD */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const unsigned family = ((a >> 8) & 0xf) == 0xf ? 0xf + ((a >> 20) & 0xff) : (a >> 8) & 0xf;
    f->avx512_half_rate = amd && family == 0x19;
    bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
    if (!osxsave) return;
    uint64_t xcr0 = read_xcr0();
    bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
    bool amx_os = (xcr0 & (3u << 17)) == (3u << 17);
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    bool avx2 = b & (1u << 5);
    bool f512 = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
    bool vnni = c & (1u << 11);
    bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    bool bf16 = a1 & (1u << 5);
    (void)b1; (void)c1; (void)d1;
    f->avx2 = ymm_os && avx2 && fma && f16c;
    f->avx512 = f->avx2 && zmm_os && f512 && dq && bw && vl;
    f->avx512_vnni = f->avx512 && vnni;
    f->avx512_bf16 = f->avx512 && bf16;
    f->amx_int8 = amx_os && amx_tile && amx_int8;
    f->amx_bf16 = amx_os && amx_tile && amx_bf16;
    unsigned brand[12];
    if (__get_cpuid_max(0x80000000, NULL) >= 0x80000004) {
        for (unsigned i = 0; i < 3; i++)
            __cpuid(0x80000002 + i, brand[4 * i], brand[4 * i + 1], brand[4 * i + 2], brand[4 * i + 3]);
        memcpy(f->brand, brand, 48);
        f->brand[48] = '\0';
    }
}
#else
static void probe(struct cpu_features *f) { (void)f; }
#endif

static void apply_disable_list(struct cpu_features *f, const char *list) {
    if (strstr(list, "avx2")) f->avx2 = false;
    if (strstr(list, "avx512") || !f->avx2) f->avx512 = false;
    if (strstr(list, "vnni") || !f->avx512) f->avx512_vnni = false;
    if (strstr(list, "bf16") || !f->avx512) f->avx512_bf16 = false;
    if (strstr(list, "amx")) f->amx_int8 = f->amx_bf16 = false;
}

const struct cpu_features *cpu_features(void) {
    static struct cpu_features features;
    static int ready; /* benign: every thread computes the same table */
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        struct cpu_features f = {0};
        probe(&f);
        const char *disable = getenv("PSHARD_CPU_DISABLE");
        if (disable) apply_disable_list(&f, disable);
        features = f;
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    return &features;
}
