/* RoPE tables and rotation. theta advances by repeated multiplication with
 * base^(-2/n_dims), in float, as the reference implementation does, so angles agree to the
 * last bit at long positions. */
#include "cpu/rope.h"

#include <math.h>

static float yarn_ramp(float low, float high, int i0) {
    float y = ((float)i0 / 2 - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

/* The dimension at which a rotation completes n_rot turns over the training context. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

int cpu_rope_axis(const struct rope_params *p, int pair) {
    const int total = p->sections[0] + p->sections[1] + p->sections[2];
    if (total <= 0) return 0;
    const int k = pair % total;
    return k < p->sections[0] ? 0 : k < p->sections[0] + p->sections[1] ? 1 : 2;
}

/* Each position's angle advances by its own chain of multiplications, so three equal positions
 * give exactly cpu_rope_table's numbers. */
void cpu_rope_table_multi(const struct rope_params *p, const int32_t pos[3], float *cs) {
    const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_dims);
    float corr_lo = 0, corr_hi = 0;
    if (p->ext_factor != 0.0f) {
        corr_lo = fmaxf(0.0f, floorf(yarn_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_fast, p->freq_base)));
        corr_hi = fminf((float)(p->n_dims - 1), ceilf(yarn_corr_dim(p->n_dims, p->n_ctx_orig, p->beta_slow, p->freq_base)));
    }
    float theta[3] = {(float)pos[0], (float)pos[1], (float)pos[2]};
    for (int i0 = 0; i0 < p->n_dims; i0 += 2) {
        float factor = p->freq_factors ? p->freq_factors[i0 / 2] : 1.0f;
        float theta_extrap = theta[cpu_rope_axis(p, i0 / 2)] / factor;
        float theta_interp = p->freq_scale * theta_extrap;
        float angle = theta_interp, mscale = p->attn_factor;
        if (p->ext_factor != 0.0f) {
            float mix = yarn_ramp(corr_lo, corr_hi, i0) * p->ext_factor;
            angle = theta_interp * (1 - mix) + theta_extrap * mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
        }
        cs[i0] = cosf(angle) * mscale;
        cs[i0 + 1] = sinf(angle) * mscale;
        for (int a = 0; a < 3; a++) theta[a] *= theta_scale;
    }
}

void cpu_rope_table(const struct rope_params *p, int32_t pos, float *cs) {
    const int32_t same[3] = {pos, pos, pos};
    cpu_rope_table_multi(p, same, cs);
}

void cpu_rope_apply(const struct rope_params *p, const float *cs, float *x, int n_heads, int head_size) {
    const int half = p->n_dims / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_size;
        for (int i = 0; i < half; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const int a = p->neox ? i : 2 * i, b = p->neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}
