/* Inner loops of attention, in a portable and an AVX2/F16C version chosen at run time. */
#ifndef CPU_ATTENTION_KERNELS_H
#define CPU_ATTENTION_KERNELS_H

#include <stdint.h>

/* sum of q[i] * k[i] for f16 k */
float attn_dot_f16_avx2(const float *q, const uint16_t *k, int n);
/* acc[i] += a * v[i] for f16 v */
void attn_axpy_f16_avx2(float *acc, float a, const uint16_t *v, int n);

#endif
