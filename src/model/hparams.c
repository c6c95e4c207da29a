/* Hyperparameters from GGUF metadata ("{arch}.block_count", ...). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"

const char *model_arch_name(enum model_arch arch) {
    switch (arch) {
    case ARCH_LLAMA: return "llama";
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    case ARCH_QWEN3MOE: return "qwen3moe";
    case ARCH_QWEN2VL: return "qwen2vl";
    case ARCH_UNKNOWN: break;
    }
    return "unknown";
}

static enum model_arch arch_from_name(const char *name) {
    for (enum model_arch a = ARCH_LLAMA; a <= ARCH_QWEN2VL; a++)
        if (!strcmp(name, model_arch_name(a))) return a;
    return ARCH_UNKNOWN;
}

/* Read "{arch}.{suffix}" as u32; absent keys leave *out unchanged, malformed ones fail. */
static pshard_status arch_u32(const struct gguf_file *f, const char *arch, const char *suffix, uint32_t *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) return PSHARD_OK;
    return gguf_get_u32(f, key, out);
}

static pshard_status arch_f32(const struct gguf_file *f, const char *arch, const char *suffix, float *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) return PSHARD_OK;
    return gguf_get_f32(f, key, out);
}

/* qwen2vl.rope.dimension_sections: up to 4 counts of rotated pairs (llama.cpp pads to 4), which
 * must cover the rotated dimensions exactly, so text positions give plain rope. */
static pshard_status read_rope_sections(const struct gguf_file *f, struct model_hparams *hp) {
    char key[160];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", hp->arch_name);
    if (!gguf_find(f, key)) return core_fail(PSHARD_ERR_FORMAT, "%s: metadata key '%s' is missing", gguf_path(f), key);
    struct gguf_array a;
    pshard_status st = gguf_get_array(f, key, &a);
    if (st != PSHARD_OK) return core_fail_context(st, "%s: ", gguf_path(f));
    if (a.n == 0 || a.n > 4 || a.type == GGUF_TYPE_STRING || a.type == GGUF_TYPE_ARRAY || a.type == GGUF_TYPE_FLOAT32 ||
        a.type == GGUF_TYPE_FLOAT64 || a.type == GGUF_TYPE_BOOL)
        return core_fail(PSHARD_ERR_FORMAT, "%s: '%s' must hold 1 to 4 integers", gguf_path(f), key);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < a.n; i++) {
        int64_t v = gguf_array_int(&a, i);
        if (v < 0 || v > 65536) return core_fail(PSHARD_ERR_FORMAT, "%s: '%s' holds %lld", gguf_path(f), key, (long long)v);
        hp->rope_sections[i] = (uint32_t)v;
        sum += (uint64_t)v;
    }
    if (sum * 2 != hp->rope_dim)
        return core_fail(PSHARD_ERR_FORMAT, "%s: '%s' covers %llu rotated pairs, the rope dimension %u has %u", gguf_path(f), key,
                         (unsigned long long)sum, hp->rope_dim, hp->rope_dim / 2);
    return PSHARD_OK;
}

static pshard_status read_hparams(const struct gguf_file *f, struct model_hparams *hp) {
    struct gguf_str arch;
    CORE_TRY(gguf_get_str(f, "general.architecture", &arch));
    if (arch.len == 0 || arch.len >= sizeof hp->arch_name)
        return core_fail(PSHARD_ERR_FORMAT, "%s: general.architecture has a bad length", gguf_path(f));
    memcpy(hp->arch_name, arch.data, arch.len);
    hp->arch_name[arch.len] = '\0';
    hp->arch = arch_from_name(hp->arch_name);
    const char *a = hp->arch_name;
    hp->rope_freq_base = 10000.0f;
    hp->rms_eps = 1e-5f;
    CORE_TRY(arch_u32(f, a, "block_count", &hp->n_layers));
    CORE_TRY(arch_u32(f, a, "embedding_length", &hp->n_embd));
    CORE_TRY(arch_u32(f, a, "context_length", &hp->n_ctx_train));
    CORE_TRY(arch_u32(f, a, "feed_forward_length", &hp->n_ff));
    CORE_TRY(arch_u32(f, a, "attention.head_count", &hp->n_head));
    hp->n_head_kv = hp->n_head;
    CORE_TRY(arch_u32(f, a, "attention.head_count_kv", &hp->n_head_kv));
    if (hp->n_head) hp->head_dim_k = hp->head_dim_v = hp->n_embd / hp->n_head;
    CORE_TRY(arch_u32(f, a, "attention.key_length", &hp->head_dim_k));
    CORE_TRY(arch_u32(f, a, "attention.value_length", &hp->head_dim_v));
    hp->rope_dim = hp->head_dim_k;
    CORE_TRY(arch_u32(f, a, "rope.dimension_count", &hp->rope_dim));
    CORE_TRY(arch_f32(f, a, "rope.freq_base", &hp->rope_freq_base));
    CORE_TRY(arch_f32(f, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps));
    CORE_TRY(arch_u32(f, a, "expert_count", &hp->n_expert));
    CORE_TRY(arch_u32(f, a, "expert_used_count", &hp->n_expert_used));
    CORE_TRY(arch_u32(f, a, "expert_feed_forward_length", &hp->n_ff_expert));
    CORE_TRY(arch_u32(f, a, "expert_shared_feed_forward_length", &hp->n_ff_shared_expert));
    CORE_TRY(arch_u32(f, a, "vocab_size", &hp->n_vocab));
    const struct gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    if (hp->n_vocab == 0 && embd && embd->n_dims >= 2) hp->n_vocab = (uint32_t)embd->ne[1];
    hp->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    if (hp->arch == ARCH_QWEN2VL) CORE_TRY(read_rope_sections(f, hp));
    if (hp->n_expert_used > hp->n_expert)
        return core_fail(PSHARD_ERR_FORMAT, "%s: %s.expert_used_count (%u) exceeds expert_count (%u)", gguf_path(f), a,
                         hp->n_expert_used, hp->n_expert);
    /* (a NaN or a non-positive value here turns every activation into NaN) */
    if (!(isfinite(hp->rope_freq_base) && hp->rope_freq_base > 0.0f))
        return core_fail(PSHARD_ERR_FORMAT, "%s: %s.rope.freq_base must be a positive number, not %g", gguf_path(f), a,
                         (double)hp->rope_freq_base);
    if (!(isfinite(hp->rms_eps) && hp->rms_eps > 0.0f))
        return core_fail(PSHARD_ERR_FORMAT, "%s: %s.attention.layer_norm_rms_epsilon must be a positive number, not %g",
                         gguf_path(f), a, (double)hp->rms_eps);
    if (hp->n_head && (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0))
        return core_fail(PSHARD_ERR_FORMAT, "%s: head_count %u is not a multiple of head_count_kv %u", gguf_path(f),
                         hp->n_head, hp->n_head_kv);
    return PSHARD_OK;
}

pshard_status model_read_hparams(const struct gguf_file *file, struct model_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    return read_hparams(file, hp);
}
