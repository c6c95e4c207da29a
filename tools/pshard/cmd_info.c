/* `pshard info MODEL`: what a model file holds and the shard list the planner works with. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/types.h"
#include "vision/mmproj.h"

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard info [-m] [MODEL.gguf] [--no-shards] [--metadata] [--tensors]\n"
                 "  Prints architecture, hyperparameters, tensor types and sizes, and the shard list;\n"
                 "  for a vision encoder (mmproj) file, its image, patch, layer and projector settings.\n"
                 "  --metadata  also every metadata key with its type and value (arrays: length and first items)\n"
                 "  --tensors   also every tensor: name, type, shape, byte offset in its file, bytes\n"
                 "  Without MODEL, the default model is used.\n");
}

static void print_scalar(enum gguf_value_type type, const struct gguf_kv *kv) {
    int64_t i;
    double f;
    if (type == GGUF_TYPE_BOOL) printf("%s", kv->value[0] ? "true" : "false");
    else if (type == GGUF_TYPE_UINT64) printf("%" PRIu64, (uint64_t)gguf_array_int(&(struct gguf_array){type, 1, kv->value, NULL}, 0));
    else if (gguf_kv_i64(kv, &i) == PSHARD_OK) printf("%" PRId64, i);
    else if (gguf_kv_f64(kv, &f) == PSHARD_OK) printf("%.9g", f);
}

static void print_escaped(struct gguf_str s, uint64_t max) {
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (s.len > max) printf("...(%" PRIu64 " bytes)", s.len);
}

static void print_metadata(const struct gguf_file *file) {
    printf("metadata\n");
    for (uint64_t k = 0; k < gguf_kv_count(file); k++) {
        const struct gguf_kv *kv = gguf_kv_at(file, k);
        printf("  %.*s: %s = ", (int)kv->key.len, kv->key.data, gguf_type_name(kv->type));
        if (kv->type == GGUF_TYPE_STRING) {
            struct gguf_str s = {(const char *)kv->value + 8, 0};
            memcpy(&s.len, kv->value, 8);
            print_escaped(s, 120);
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            const struct gguf_array *a = &kv->array;
            printf("[%s; %" PRIu64 "]", gguf_type_name(a->type), a->n);
            struct gguf_str *strings = NULL;
            if (a->type == GGUF_TYPE_STRING && gguf_array_strings(a, &strings) == PSHARD_OK)
                for (uint64_t i = 0; i < a->n && i < 4; i++) putchar(' '), print_escaped(strings[i], 40);
            else if (a->type == GGUF_TYPE_FLOAT32 || a->type == GGUF_TYPE_FLOAT64)
                for (uint64_t i = 0; i < a->n && i < 4; i++) printf(" %.9g", gguf_array_float(a, i));
            else
                for (uint64_t i = 0; i < a->n && i < 4; i++) printf(" %" PRId64, gguf_array_int(a, i));
            free(strings);
        } else {
            print_scalar(kv->type, kv);
        }
        putchar('\n');
    }
}

static void print_tensors(const struct gguf_file *file) {
    printf("tensor list (name, type, shape, offset, bytes)\n");
    for (uint64_t i = 0; i < gguf_tensor_count(file); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(file, i);
        printf("  %.*s %s [", (int)t->name.len, t->name.data, quant_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        printf("] %" PRIu64 " %" PRIu64 "\n", t->offset, t->n_bytes);
    }
}

static void print_hparams(const struct model_hparams *hp) {
    printf("architecture  %s%s\n", hp->arch_name,
           hp->arch == ARCH_UNKNOWN ? "  (not supported for running; supported: llama, qwen2, qwen2vl, qwen3, qwen3moe)" : "");
    printf("layers        %u\n", hp->n_layers);
    printf("embedding     %u\n", hp->n_embd);
    printf("heads         %u query / %u key-value, head size %u (k) %u (v)\n", hp->n_head, hp->n_head_kv,
           hp->head_dim_k, hp->head_dim_v);
    if (hp->n_ff) printf("feed-forward  %u\n", hp->n_ff);
    if (hp->n_expert)
        printf("experts       %u (%u used per token), expert width %u%s\n", hp->n_expert, hp->n_expert_used,
               hp->n_ff_expert, hp->n_ff_shared_expert ? ", shared expert" : "");
    printf("vocabulary    %u%s\n", hp->n_vocab, hp->tied_embeddings ? " (output tied to the embedding)" : "");
    printf("context       %u (trained)\n", hp->n_ctx_train);
    printf("rope          base %g, %u dims; rms eps %g\n", hp->rope_freq_base, hp->rope_dim, hp->rms_eps);
    if (hp->arch == ARCH_QWEN2VL)
        printf("rope sections %u %u %u %u pairs (time, row, column, -): multimodal rope\n", hp->rope_sections[0],
               hp->rope_sections[1], hp->rope_sections[2], hp->rope_sections[3]);
}

static void print_types(const struct gguf_file *file);

/* An mmproj file: the vision encoder and projector settings, and its weights. */
static int print_mmproj(struct gguf_file *file) {
    struct mmproj m;
    if (mmproj_load(file, &m) != PSHARD_OK) {
        fprintf(stderr, "pshard info: %s\n", pshard_last_error());
        print_types(file);
        return 1;
    }
    const struct vision_hparams *hp = &m.hp;
    printf("architecture  clip (vision encoder and projector for a language model)\n");
    printf("projector     %s, output width %u (the language model's embedding)\n", hp->projector_name, hp->projection_dim);
    printf("image size    %u (model's nominal side); resized to %llu..%llu pixels in multiples of %u\n", hp->image_size,
           (unsigned long long)hp->min_pixels, (unsigned long long)hp->max_pixels, hp->patch_size * hp->spatial_merge);
    printf("patch size    %u x %u, %u frames per patch; %u x %u patches merged per image token\n", hp->patch_size,
           hp->patch_size, VISION_TEMPORAL_PATCH, hp->spatial_merge, hp->spatial_merge);
    printf("layers        %u, width %u, feed-forward %u, %u heads of %u; rms eps %g\n", hp->n_layer, hp->n_embd, hp->n_ff,
           hp->n_head, hp->head_dim, hp->eps);
    printf("window layers %u of %u attend within %u x %u pixel windows; full attention in layers", hp->n_layer - hp->n_full_attention,
           hp->n_layer, hp->window_size, hp->window_size);
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if (hp->full_attention[il]) printf(" %u", il);
    printf("\n");
    printf("normalize     mean %.8g %.8g %.8g, std %.8g %.8g %.8g\n", hp->image_mean[0], hp->image_mean[1], hp->image_mean[2],
           hp->image_std[0], hp->image_std[1], hp->image_std[2]);
    print_types(file);
    mmproj_free(&m);
    return 0;
}

static void print_types(const struct gguf_file *file) {
    uint64_t count[QUANT_TYPE_LIMIT] = {0}, bytes[QUANT_TYPE_LIMIT] = {0}, total = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(file); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(file, i);
        count[t->type]++;
        bytes[t->type] += t->n_bytes;
        total += t->n_bytes;
    }
    char buf[32];
    printf("tensors       %" PRIu64 ", %s of weights\n", gguf_tensor_count(file), cli_format_bytes(total, buf, sizeof buf));
    for (uint32_t type = 0; type < QUANT_TYPE_LIMIT; type++) {
        if (!count[type]) continue;
        const struct quant_type_info *info = quant_type_info(type);
        printf("  %-8s %6" PRIu64 " tensors  %10s%s\n", info->name, count[type], cli_format_bytes(bytes[type], buf, sizeof buf),
               info->supported ? "" : "  (type not supported for running)");
    }
}

static void print_shards(const struct model *model) {
    char w[32], e[32], kv[32];
    printf("shards        %u (weights; experts as count x bytes each; KV bytes per token in f16)\n", model->n_shards);
    printf("  %-5s %-6s %5s %12s %22s %12s\n", "#", "shard", "layer", "weights", "experts", "KV/token");
    for (uint32_t i = 0; i < model->n_shards; i++) {
        const struct shard *s = &model->shards[i];
        char layer[16] = "-";
        if (s->layer >= 0) snprintf(layer, sizeof layer, "%d", s->layer);
        char experts[40] = "";
        if (s->n_expert) snprintf(experts, sizeof experts, "%u x %s", s->n_expert, cli_format_bytes(s->expert_bytes, e, sizeof e));
        printf("  %-5u %-6s %5s %12s %22s %12s\n", i, shard_kind_name(s->kind), layer,
               cli_format_bytes(s->weight_bytes, w, sizeof w), experts,
               s->kv_bytes_per_token ? cli_format_bytes(s->kv_bytes_per_token, kv, sizeof kv) : "");
    }
    if (model->n_unplaced) printf("  (%u tensors belong to no shard)\n", model->n_unplaced);
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    int show_shards = 1, show_metadata = 0, show_tensors = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--no-shards")) {
            show_shards = 0;
        } else if (!strcmp(argv[i], "--metadata")) {
            show_metadata = 1;
        } else if (!strcmp(argv[i], "--tensors")) {
            show_tensors = 1;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            path = argv[++i];
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            fprintf(stderr, "pshard info: unexpected argument '%s'\n", argv[i]);
            print_usage(stderr);
            return 2;
        }
    }
    char default_path[4096];
    if (!path) {
        if (cli_default_model(default_path, sizeof default_path) != 0) return 1;
        path = default_path;
    }
    struct gguf_file *file;
    if (gguf_open(path, &file) != PSHARD_OK) {
        fprintf(stderr, "pshard info: %s\n", pshard_last_error());
        return 1;
    }
    char buf[32];
    struct gguf_str name = {"", 0};
    gguf_get_str(file, "general.name", &name);
    printf("model         %s\n", path);
    printf("file          GGUF v%u, %u part%s, %s, alignment %u, %" PRIu64 " metadata keys\n", gguf_version(file),
           gguf_part_count(file), gguf_part_count(file) == 1 ? "" : "s", cli_format_bytes(gguf_file_bytes(file), buf, sizeof buf),
           gguf_alignment(file), gguf_kv_count(file));
    if (name.len) printf("name          %.*s\n", (int)(name.len > 200 ? 200 : name.len), name.data);
    struct model model;
    int rc = 0;
    if (mmproj_is_mmproj(file)) {
        rc = print_mmproj(file);
    } else if (model_load(file, &model) != PSHARD_OK) {
        fprintf(stderr, "pshard info: %s\n", pshard_last_error());
        print_types(file);
        rc = 1;
    } else {
        print_hparams(&model.hp);
        print_types(file);
        if (show_shards) print_shards(&model);
        model_free(&model);
    }
    if (show_metadata) print_metadata(file);
    if (show_tensors) print_tensors(file);
    gguf_close(file);
    return rc;
}
