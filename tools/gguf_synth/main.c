/* gguf-synth: command line. Picks a shape, applies the options, and writes the file. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "synth.h"

static const enum quant_type writable_types[] = {
    QUANT_F32,  QUANT_F16,  QUANT_BF16, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1,
    QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K,
};

struct options {
    const char *shape, *output, *pre;
    uint64_t seed;
    int n_threads;
    long long layers, vocab, context; /* -1: the shape's own */
    int matrix_type, expert_type;     /* -1: the shape's own */
    int tied;                         /* -1: the shape's own, else 0/1 */
    bool list, dry_run, quiet, progress, header_only;
    int io;                           /* enum synth_io */
};

static void usage(FILE *out) {
    fprintf(out,
            "usage: gguf-synth --shape NAME -o PATH [options]\n"
            "       gguf-synth --list\n\n"
            "Writes a GGUF file with random weights in the shape of a real model, with a working\n"
            "byte-level BPE vocabulary. Same seed, same bytes, whatever the thread count.\n\n"
            "options:\n"
            "  --shape NAME        model shape (see --list)\n"
            "  -o, --output PATH   file to write (written as PATH.partial, then renamed)\n"
            "  --seed N            random seed (default 1)\n"
            "  --type T            type of all weight matrices, experts included\n"
            "  --expert-type T     type of the expert matrices only\n"
            "  --layers N          number of layers (default: the shape's)\n"
            "  --vocab N           vocabulary size (default: the shape's; at least 259)\n"
            "  --context N         context_length written to the metadata\n"
            "  --tied, --untied    share token_embd as the output head, or not (default untied)\n"
            "  --pre NAME          tokenizer.ggml.pre (default gpt-2 for llama, qwen2 for qwen3moe)\n"
            "  --threads N         writer threads (default: all cores)\n"
            "  --dry-run           print the tensor list and sizes, write nothing\n"
            "  --progress          show progress even for small files\n"
            "  --header-only       write the metadata and tensor table; the tensor data is left a\n"
            "                      hole that reads as zeros and takes no space (for `pshard plan`\n"
            "                      and `pshard info` where the weights do not fit)\n"
            "  --mmap, --no-mmap   fill a shared mapping of the file, or pwrite() chunks\n"
            "                      (default: mapping on tmpfs, pwrite elsewhere: faster each)\n"
            "  --quiet             print nothing but errors\n"
            "  --list              list the shapes\n"
            "  -h, --help          this text\n\n"
            "types: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K\n");
}

static int fail_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A bad command line: say what is wrong, point at --help, exit status 2. */
static int fail_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gguf-synth: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(gguf-synth --help lists the options)\n");
    va_end(ap);
    return 2;
}

static bool parse_number(const char *text, long long min, long long max, long long *out) {
    char *end;
    errno = 0;
    if (text[0] == '-' && min >= 0) return false;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) return false;
    *out = v;
    return true;
}

static int parse_type(const char *text) {
    for (size_t i = 0; i < sizeof writable_types / sizeof writable_types[0]; i++)
        if (!strcasecmp(text, quant_type_name(writable_types[i]))) return (int)writable_types[i];
    return -1;
}

/* Returns 0 to go on; nonzero to stop, with the exit status in *exit_code (2 for a bad
 * command line, 0 after --help). */
static int parse_args(int argc, char **argv, struct options *o, int *exit_code) {
    *o = (struct options){.seed = 1, .layers = -1, .vocab = -1, .context = -1,
                          .matrix_type = -1, .expert_type = -1, .tied = -1};
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->n_threads = n_cpu > 0 ? (int)n_cpu : 1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
#define NEED_VALUE()                                                                             \
    do {                                                                                         \
        if (!value) {                                                                            \
            *exit_code = fail_usage("%s needs a value", arg);                              \
            return 1;                                                                            \
        }                                                                                        \
        i++;                                                                                     \
    } while (0)
#define NUMBER(min, max, dest)                                                                   \
    do {                                                                                         \
        NEED_VALUE();                                                                            \
        if (!parse_number(value, min, max, &n)) {                                                \
            *exit_code = fail_usage("%s: '%s' is not a number in range", arg, value);            \
            return 1;                                                                            \
        }                                                                                        \
        dest = n;                                                                                \
    } while (0)
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            usage(stdout);
            *exit_code = 0;
            return 1;
        } else if (!strcmp(arg, "--shape")) {
            NEED_VALUE();
            o->shape = value;
        } else if (!strcmp(arg, "-o") || !strcmp(arg, "--output")) {
            NEED_VALUE();
            o->output = value;
        } else if (!strcmp(arg, "--pre")) {
            NEED_VALUE();
            o->pre = value;
        } else if (!strcmp(arg, "--seed")) {
            NEED_VALUE();
            char *end;
            errno = 0;
            unsigned long long seed = strtoull(value, &end, 0);
            if (errno || end == value || *end || value[0] == '-') {
                *exit_code = fail_usage("%s: '%s' is not a non-negative integer", arg, value);
                return 1;
            }
            o->seed = seed;
        } else if (!strcmp(arg, "--threads")) {
            NUMBER(1, 1024, o->n_threads);
        } else if (!strcmp(arg, "--layers")) {
            NUMBER(1, 100000, o->layers);
        } else if (!strcmp(arg, "--vocab")) {
            NUMBER(259, 1LL << 24, o->vocab);
        } else if (!strcmp(arg, "--context")) {
            NUMBER(1, 1LL << 31, o->context);
        } else if (!strcmp(arg, "--type") || !strcmp(arg, "--expert-type")) {
            NEED_VALUE();
            int type = parse_type(value);
            if (type < 0) {
                *exit_code = fail_usage("%s: unknown or unsupported type '%s' (types: F32 F16 BF16 "
                                        "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K)", arg, value);
                return 1;
            }
            if (!strcmp(arg, "--type")) o->matrix_type = type;
            else o->expert_type = type;
        } else if (!strcmp(arg, "--tied")) {
            o->tied = 1;
        } else if (!strcmp(arg, "--untied")) {
            o->tied = 0;
        } else if (!strcmp(arg, "--list")) {
            o->list = true;
        } else if (!strcmp(arg, "--dry-run")) {
            o->dry_run = true;
        } else if (!strcmp(arg, "--quiet")) {
            o->quiet = true;
        } else if (!strcmp(arg, "--progress")) {
            o->progress = true;
        } else if (!strcmp(arg, "--header-only")) {
            o->header_only = true;
        } else if (!strcmp(arg, "--mmap")) {
            o->io = SYNTH_IO_MMAP;
        } else if (!strcmp(arg, "--no-mmap")) {
            o->io = SYNTH_IO_PWRITE;
        } else {
            *exit_code = fail_usage("unknown option '%s'", arg);
            return 1;
        }
#undef NUMBER
#undef NEED_VALUE
    }
    return 0;
}

static void format_bytes(char *out, size_t n, uint64_t bytes) {
    if (bytes >= 1000000000ull) snprintf(out, n, "%.2f GB", bytes / 1e9);
    else snprintf(out, n, "%.2f MB", bytes / 1e6);
}

static int list_shapes(void) {
    printf("%-20s %-9s %6s %5s %9s %13s %7s %-12s %13s\n", "shape", "arch", "layers", "d",
           "heads", "experts", "vocab", "types", "tensor bytes");
    for (size_t i = 0; i < synth_shape_count(); i++) {
        const struct synth_shape *s = synth_shape_at(i);
        struct synth_model model;
        if (synth_model_build(&model, s) != PSHARD_OK) {
            fprintf(stderr, "gguf-synth: %s\n", pshard_last_error());
            return 1;
        }
        char heads[32], experts[32], types[32];
        snprintf(heads, sizeof heads, "%u/%ux%u", s->n_head, s->n_head_kv, s->head_dim);
        if (s->n_expert) snprintf(experts, sizeof experts, "%u(%u)x%u", s->n_expert, s->n_expert_used, s->n_ff_exp);
        else snprintf(experts, sizeof experts, "- ff %u", s->n_ff);
        if (s->expert_type != s->matrix_type && s->n_expert)
            snprintf(types, sizeof types, "%s+%s", quant_type_name(s->matrix_type), quant_type_name(s->expert_type));
        else snprintf(types, sizeof types, "%s", quant_type_name(s->matrix_type));
        printf("%-20s %-9s %6u %5u %9s %13s %7u %-12s %13llu\n", s->name, synth_arch_name(s->arch),
               s->n_layer, s->n_embd, heads, experts, s->n_vocab, types,
               (unsigned long long)model.data_bytes);
        synth_model_free(&model);
    }
    return 0;
}

static void print_tensors(const struct synth_model *model) {
    for (size_t i = 0; i < model->n_tensors; i++) {
        const struct synth_tensor *t = &model->tensors[i];
        char dims[96];
        int len = snprintf(dims, sizeof dims, "[%lld", (long long)t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims; d++) len += snprintf(dims + len, sizeof dims - len, ", %lld", (long long)t->ne[d]);
        snprintf(dims + len, sizeof dims - len, "]");
        printf("%-28s %-22s %-5s %12llu\n", t->name, dims, quant_type_name(t->type), (unsigned long long)t->bytes);
    }
    printf("%zu tensors, %llu bytes of tensor data\n", model->n_tensors, (unsigned long long)model->data_bytes);
}

static int fail_status(void) {
    fprintf(stderr, "gguf-synth: %s\n", pshard_last_error());
    return 1;
}

int main(int argc, char **argv) {
    struct options o;
    int exit_code = 0;
    if (parse_args(argc, argv, &o, &exit_code)) return exit_code;
    if (o.list) return list_shapes();
    if (!o.shape) return fail_usage("--shape is required");
    const struct synth_shape *found = synth_shape_find(o.shape);
    if (!found) {
        fprintf(stderr, "gguf-synth: unknown shape '%s'; shapes:", o.shape);
        for (size_t i = 0; i < synth_shape_count(); i++) fprintf(stderr, " %s", synth_shape_at(i)->name);
        fprintf(stderr, "\n");
        return 2;
    }
    if (!o.output && !o.dry_run) return fail_usage("-o PATH is required");

    struct synth_shape shape = *found;
    if (o.layers > 0) shape.n_layer = (uint32_t)o.layers;
    if (o.vocab > 0) shape.n_vocab = (uint32_t)o.vocab;
    if (o.context > 0) shape.n_ctx = (uint32_t)o.context;
    if (o.matrix_type >= 0) shape.matrix_type = shape.expert_type = (enum quant_type)o.matrix_type;
    if (o.expert_type >= 0) {
        if (!shape.n_expert) return fail_usage("--expert-type: shape '%s' has no experts", shape.name);
        shape.expert_type = (enum quant_type)o.expert_type;
    }
    if (o.tied >= 0) shape.tied = o.tied;
    if (o.pre) shape.pre = o.pre;

    struct synth_model model;
    if (synth_model_build(&model, &shape) != PSHARD_OK) return fail_status();
    if (model.n_fallback && !o.quiet)
        fprintf(stderr, "gguf-synth: note: %u tensors have rows too short for %s blocks and use a "
                "fallback type (as llama-quantize does)\n", model.n_fallback,
                quant_type_name(shape.n_expert ? shape.expert_type : shape.matrix_type));
    if (o.dry_run) {
        print_tensors(&model);
        synth_model_free(&model);
        return 0;
    }

    int rc = 1;
    struct synth_vocab vocab = {0};
    struct synth_kv kv = {0};
    struct synth_buf header = {0};
    struct synth_fill_cache *cache = NULL;
    double seconds = 0;
    if (shape.arch != SYNTH_ARCH_CLIP && synth_vocab_build(&vocab, shape.n_vocab) != PSHARD_OK) goto done;
    if (shape.arch == SYNTH_ARCH_QWEN2VL && synth_vocab_add_vision(&vocab) != PSHARD_OK) goto done;
    synth_metadata(&kv, &model, &vocab, o.seed);
    if (synth_fill_prepare(&cache, &model, o.seed) != PSHARD_OK) goto done;
    if (synth_gguf_header(&header, &kv, &model) != PSHARD_OK) goto done;
    const uint64_t total = header.len + model.data_bytes;
    struct synth_write_options wo = {.path = o.output, .seed = o.seed, .n_threads = o.n_threads,
                                     .progress = !o.quiet && (o.progress || total >= (1ull << 30)),
                                     .io = (enum synth_io)o.io, .header_only = o.header_only};
    if (synth_write_file(&model, &header, &wo, &seconds) != PSHARD_OK) goto done;
    if (!o.quiet && o.header_only) {
        fprintf(stderr, "gguf-synth: wrote %s: %s, %u layers, %zu tensors, %zu tokens; the header only (%llu "
                "bytes), its %llu bytes of tensor data a hole of zeros\n", o.output, shape.name, shape.n_layer,
                model.n_tensors, vocab.n_tokens, (unsigned long long)header.len, (unsigned long long)model.data_bytes);
    } else if (!o.quiet) {
        char size[32];
        format_bytes(size, sizeof size, total);
        fprintf(stderr, "gguf-synth: wrote %s: %s, %u layers, %zu tensors, %zu tokens, %s (%llu bytes) "
                "in %.2f s, %.2f GB/s with %d threads\n", o.output, shape.name, shape.n_layer,
                model.n_tensors, vocab.n_tokens, size, (unsigned long long)total, seconds,
                seconds > 0 ? total / 1e9 / seconds : 0.0, o.n_threads);
    }
    rc = 0;
done:
    if (rc != 0) fail_status();
    synth_fill_cache_free(cache);
    synth_buf_free(&header);
    synth_buf_free(&kv.buf);
    synth_vocab_free(&vocab);
    synth_model_free(&model);
    return rc;
}
