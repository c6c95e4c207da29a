/* What a model file holds, as `pshard info` prints it: the file, the architecture's hyperparameters,
 * tensor types and sizes, the shard list; a vision encoder (mmproj) file's settings. Nothing is
 * loaded but the file's header. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "pshard.h"
#include "quant/types.h"
#include "vision/mmproj.h"

const char *pshard_format_bytes(uint64_t bytes, char *buf, size_t buf_size) {
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1000.0 && unit < 4) {
        value /= 1000.0;
        unit++;
    }
    if (unit == 0) snprintf(buf, buf_size, "%llu B", (unsigned long long)bytes);
    else snprintf(buf, buf_size, "%.*f %s", value < 10 ? 2 : value < 100 ? 1 : 0, value, units[unit]);
    return buf;
}

static void print_scalar(FILE *out, enum gguf_value_type type, const struct gguf_kv *kv) {
    int64_t i;
    double f;
    if (type == GGUF_TYPE_BOOL) fprintf(out, "%s", kv->value[0] ? "true" : "false");
    else if (type == GGUF_TYPE_UINT64)
        fprintf(out, "%" PRIu64, (uint64_t)gguf_array_int(&(struct gguf_array){type, 1, kv->value, NULL}, 0));
    else if (gguf_kv_i64(kv, &i) == PSHARD_OK) fprintf(out, "%" PRId64, i);
    else if (gguf_kv_f64(kv, &f) == PSHARD_OK) fprintf(out, "%.9g", f);
}

static void print_escaped(FILE *out, struct gguf_str s, uint64_t max) {
    fputc('"', out);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '\n') fputs("\\n", out);
        else if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c < 0x20) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
    }
    fputc('"', out);
    if (s.len > max) fprintf(out, "...(%" PRIu64 " bytes)", s.len);
}

static void print_metadata(FILE *out, const struct gguf_file *file) {
    fprintf(out, "metadata\n");
    for (uint64_t k = 0; k < gguf_kv_count(file); k++) {
        const struct gguf_kv *kv = gguf_kv_at(file, k);
        fprintf(out, "  %.*s: %s = ", (int)kv->key.len, kv->key.data, gguf_type_name(kv->type));
        if (kv->type == GGUF_TYPE_STRING) {
            struct gguf_str s = {(const char *)kv->value + 8, 0};
            memcpy(&s.len, kv->value, 8);
            print_escaped(out, s, 120);
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            const struct gguf_array *a = &kv->array;
            fprintf(out, "[%s; %" PRIu64 "]", gguf_type_name(a->type), a->n);
            struct gguf_str *strings = NULL;
            if (a->type == GGUF_TYPE_STRING && gguf_array_strings(a, &strings) == PSHARD_OK)
                for (uint64_t i = 0; i < a->n && i < 4; i++) fputc(' ', out), print_escaped(out, strings[i], 40);
            else if (a->type == GGUF_TYPE_FLOAT32 || a->type == GGUF_TYPE_FLOAT64)
                for (uint64_t i = 0; i < a->n && i < 4; i++) fprintf(out, " %.9g", gguf_array_float(a, i));
            else
                for (uint64_t i = 0; i < a->n && i < 4; i++) fprintf(out, " %" PRId64, gguf_array_int(a, i));
            free(strings);
        } else {
            print_scalar(out, kv->type, kv);
        }
        fputc('\n', out);
    }
}

static void print_tensors(FILE *out, const struct gguf_file *file) {
    fprintf(out, "tensor list (name, type, shape, offset, bytes)\n");
    for (uint64_t i = 0; i < gguf_tensor_count(file); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(file, i);
        fprintf(out, "  %.*s %s [", (int)t->name.len, t->name.data, quant_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) fprintf(out, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        fprintf(out, "] %" PRIu64 " %" PRIu64 "\n", t->offset, t->n_bytes);
    }
}

static void print_hparams(FILE *out, const struct model_hparams *hp) {
    fprintf(out, "architecture  %s%s\n", hp->arch_name,
            hp->arch == ARCH_UNKNOWN ? "  (not supported for running; supported: llama, qwen2, qwen2vl, qwen3, qwen3moe)" : "");
    fprintf(out, "layers        %u\n", hp->n_layers);
    fprintf(out, "embedding     %u\n", hp->n_embd);
    fprintf(out, "heads         %u query / %u key-value, head size %u (k) %u (v)\n", hp->n_head, hp->n_head_kv,
            hp->head_dim_k, hp->head_dim_v);
    if (hp->n_ff) fprintf(out, "feed-forward  %u\n", hp->n_ff);
    if (hp->n_expert)
        fprintf(out, "experts       %u (%u used per token), expert width %u%s\n", hp->n_expert, hp->n_expert_used,
                hp->n_ff_expert, hp->n_ff_shared_expert ? ", shared expert" : "");
    fprintf(out, "vocabulary    %u%s\n", hp->n_vocab, hp->tied_embeddings ? " (output tied to the embedding)" : "");
    fprintf(out, "context       %u (trained)\n", hp->n_ctx_train);
    fprintf(out, "rope          base %g, %u dims; rms eps %g\n", hp->rope_freq_base, hp->rope_dim, hp->rms_eps);
    if (hp->arch == ARCH_QWEN2VL)
        fprintf(out, "rope sections %u %u %u %u pairs (time, row, column, -): multimodal rope\n", hp->rope_sections[0],
                hp->rope_sections[1], hp->rope_sections[2], hp->rope_sections[3]);
}

static void print_types(FILE *out, const struct gguf_file *file);

/* An mmproj file: the vision encoder and projector settings, and its weights. */
static pshard_status print_mmproj(FILE *out, struct gguf_file *file) {
    struct mmproj m;
    const pshard_status st = mmproj_load(file, &m);
    if (st != PSHARD_OK) {
        print_types(out, file);
        return st;
    }
    const struct vision_hparams *hp = &m.hp;
    fprintf(out, "architecture  clip (vision encoder and projector for a language model)\n");
    fprintf(out, "projector     %s, output width %u (the language model's embedding)\n", hp->projector_name, hp->projection_dim);
    fprintf(out, "image size    %u (model's nominal side); resized to %llu..%llu pixels in multiples of %u\n", hp->image_size,
            (unsigned long long)hp->min_pixels, (unsigned long long)hp->max_pixels, hp->patch_size * hp->spatial_merge);
    fprintf(out, "patch size    %u x %u, %u frames per patch; %u x %u patches merged per image token\n", hp->patch_size,
            hp->patch_size, (unsigned)VISION_TEMPORAL_PATCH, hp->spatial_merge, hp->spatial_merge);
    fprintf(out, "layers        %u, width %u, feed-forward %u, %u heads of %u; rms eps %g\n", hp->n_layer, hp->n_embd, hp->n_ff,
            hp->n_head, hp->head_dim, hp->eps);
    fprintf(out, "window layers %u of %u attend within %u x %u pixel windows; full attention in layers",
            hp->n_layer - hp->n_full_attention, hp->n_layer, hp->window_size, hp->window_size);
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if (hp->full_attention[il]) fprintf(out, " %u", il);
    fprintf(out, "\n");
    fprintf(out, "normalize     mean %.8g %.8g %.8g, std %.8g %.8g %.8g\n", hp->image_mean[0], hp->image_mean[1],
            hp->image_mean[2], hp->image_std[0], hp->image_std[1], hp->image_std[2]);
    print_types(out, file);
    mmproj_free(&m);
    return PSHARD_OK;
}

static void print_types(FILE *out, const struct gguf_file *file) {
    uint64_t count[QUANT_TYPE_LIMIT] = {0}, bytes[QUANT_TYPE_LIMIT] = {0}, total = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(file); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(file, i);
        count[t->type]++;
        bytes[t->type] += t->n_bytes;
        total += t->n_bytes;
    }
    char buf[32];
    fprintf(out, "tensors       %" PRIu64 ", %s of weights\n", gguf_tensor_count(file),
            pshard_format_bytes(total, buf, sizeof buf));
    for (uint32_t type = 0; type < QUANT_TYPE_LIMIT; type++) {
        if (!count[type]) continue;
        const struct quant_type_info *info = quant_type_info(type);
        fprintf(out, "  %-8s %6" PRIu64 " tensors  %10s%s\n", info->name, count[type],
                pshard_format_bytes(bytes[type], buf, sizeof buf),
                info->supported ? "" : "  (type not supported for running)");
    }
}

static void print_shards(FILE *out, const struct model *model) {
    char w[32], e[32], kv[32];
    fprintf(out, "shards        %u (weights; experts as count x bytes each; KV bytes per token in f16)\n", model->n_shards);
    fprintf(out, "  %-5s %-6s %5s %12s %22s %12s\n", "#", "shard", "layer", "weights", "experts", "KV/token");
    for (uint32_t i = 0; i < model->n_shards; i++) {
        const struct shard *s = &model->shards[i];
        char layer[16] = "-";
        if (s->layer >= 0) snprintf(layer, sizeof layer, "%d", s->layer);
        char experts[40] = "";
        if (s->n_expert)
            snprintf(experts, sizeof experts, "%u x %s", s->n_expert, pshard_format_bytes(s->expert_bytes, e, sizeof e));
        fprintf(out, "  %-5u %-6s %5s %12s %22s %12s\n", i, shard_kind_name(s->kind), layer,
                pshard_format_bytes(s->weight_bytes, w, sizeof w), experts,
                s->kv_bytes_per_token ? pshard_format_bytes(s->kv_bytes_per_token, kv, sizeof kv) : "");
    }
    if (model->n_unplaced) fprintf(out, "  (%u tensors belong to no shard)\n", model->n_unplaced);
}

pshard_status pshard_describe(const char *model_path, unsigned flags, FILE *out) {
    if (!model_path || !out) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_describe: a NULL argument");
    struct gguf_file *file;
    CORE_TRY(gguf_open(model_path, &file));
    char buf[32];
    struct gguf_str name = {"", 0};
    gguf_get_str(file, "general.name", &name);
    fprintf(out, "model         %s\n", model_path);
    fprintf(out, "file          GGUF v%u, %u part%s, %s, alignment %u, %" PRIu64 " metadata keys\n", gguf_version(file),
            gguf_part_count(file), gguf_part_count(file) == 1 ? "" : "s",
            pshard_format_bytes(gguf_file_bytes(file), buf, sizeof buf),
            gguf_alignment(file), gguf_kv_count(file));
    if (name.len) fprintf(out, "name          %.*s\n", (int)(name.len > 200 ? 200 : name.len), name.data);
    struct model model;
    pshard_status st;
    if (mmproj_is_mmproj(file)) {
        st = print_mmproj(out, file);
    } else if ((st = model_load(file, &model)) != PSHARD_OK) {
        print_types(out, file);
    } else {
        print_hparams(out, &model.hp);
        print_types(out, file);
        if (flags & PSHARD_DESCRIBE_SHARDS) print_shards(out, &model);
        model_free(&model);
    }
    /* What failed is said after what could be written: keep its message. */
    char why[1024] = "";
    if (st != PSHARD_OK) snprintf(why, sizeof why, "%s", pshard_last_error());
    if (flags & PSHARD_DESCRIBE_METADATA) print_metadata(out, file);
    if (flags & PSHARD_DESCRIBE_TENSORS) print_tensors(out, file);
    gguf_close(file);
    return st == PSHARD_OK ? PSHARD_OK : core_fail(st, "%s", why);
}

pshard_status pshard_model_context(const char *model_path, uint32_t *n_ctx_train) {
    if (!model_path || !n_ctx_train) return core_fail(PSHARD_ERR_INVALID_ARG, "pshard_model_context: a NULL argument");
    struct gguf_file *file;
    struct model model;
    CORE_TRY(gguf_open(model_path, &file));
    const pshard_status st = model_load(file, &model);
    if (st == PSHARD_OK) {
        *n_ctx_train = model.hp.n_ctx_train;
        model_free(&model);
    }
    gguf_close(file);
    return st;
}
