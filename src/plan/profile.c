/* The machine profile: conservative defaults, this machine's fingerprint, and the JSON file in
 * the user's cache that holds what `pshard profile` measured (written and read with jansson). */
#include "plan/profile.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "quant/types.h"

const int32_t profile_tokens[PROFILE_TOKENS] = {1, 4, 16, 64, 256, 1024};
const uint64_t profile_sizes[PROFILE_SIZES] = {64 << 10, 512 << 10, 4 << 20, 32 << 20, 128 << 20};

enum { SECONDS_PER_DAY = 86400, PATH_BYTES = 4096 };

/* ---- defaults */

/* pshard knows more types than a table holds; without a measurement these are the likely ones
 * (a model's other formats are added when it is planned). */
static const enum quant_type common_formats[] = {
    QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q8_0, QUANT_Q4_0, QUANT_Q4_K, QUANT_Q6_K, QUANT_Q2_K,
};

static bool default_format(uint32_t type, int n_known) {
    if (!quant_type_info(type)) return false;
    if (n_known <= PROFILE_FORMATS) return true;
    for (size_t i = 0; i < sizeof common_formats / sizeof common_formats[0]; i++)
        if (common_formats[i] == (enum quant_type)type) return true;
    return false;
}

/* Memory-bound at few tokens; past `knee` tokens each weight byte is reused enough for compute
 * to take over, and the time per byte grows with n. */
static void fill_rates(struct profile_rate table[PROFILE_FORMATS], double base_s_per_byte, double knee) {
    int n_known = 0;
    for (uint32_t type = 0; type < 64; type++) n_known += quant_type_info(type) != NULL;
    for (uint32_t type = 0; type < 64; type++) {
        if (!default_format(type, n_known)) continue;
        struct profile_rate *rate = profile_rate_add(table, quant_type_name(type));
        if (!rate) break;
        for (int i = 0; i < PROFILE_TOKENS; i++)
            rate->s_per_byte[i] = base_s_per_byte * fmax(1, profile_tokens[i] / knee);
    }
}

void profile_defaults(struct profile *p) {
    memset(p, 0, sizeof *p);
    p->version = PROFILE_VERSION;
    snprintf(p->pshard, sizeof p->pshard, "%s", PSHARD_VERSION);
    p->created = (int64_t)time(NULL);

    const double cpu_s_per_byte = 1 / 20e9, gpu_s_per_byte = 1 / 1000e9;
    p->host_read_gbps = 20;
    fill_rates(p->cpu_matmul, cpu_s_per_byte, 8);
    fill_rates(p->cpu_experts, cpu_s_per_byte * 1.3, 8);
    for (int i = 0; i < PROFILE_TOKENS; i++) p->cpu_attn[i] = cpu_s_per_byte;
    p->cpu_step_s = 20e-6;

    /* has_gpu stays false: a caller with a GPU switches it on and uses these numbers. */
    fill_rates(p->gpu_matmul, gpu_s_per_byte, 64);
    fill_rates(p->gpu_experts, gpu_s_per_byte * 1.5, 64);
    for (int i = 0; i < PROFILE_TOKENS; i++) p->gpu_attn[i] = p->gpu_attn_long[i] = gpu_s_per_byte;
    p->gpu_attn_call_s = 10e-6;
    for (int i = 0; i < PROFILE_SIZES; i++) {
        /* Small copies pay the fixed cost of a DMA transfer. */
        p->h2d_gbps[i] = p->d2h_gbps[i] = profile_sizes[i] <= 64 << 10 ? 6 : 12;
    }
    for (int i = 0; i < PROFILE_TOKENS; i++) {
        p->zero_copy[i] = 1 / 10e9 * (profile_tokens[i] > 8 ? profile_tokens[i] / 8.0 : 1);
        p->zero_copy_experts[i] = 1 / 8e9 * (profile_tokens[i] > 8 ? profile_tokens[i] / 8.0 : 1);
        p->zero_copy_off[i] = p->zero_copy[i], p->zero_copy_experts_off[i] = p->zero_copy_experts[i];
    }
    p->zero_copy_expert_call_s = 20e-6;
    p->cpu_moe_call_s = 60e-6;
    p->launch_s = 5e-6;
    p->graph_node_s = 2e-6;
    p->kernel_s = 5e-6;
    p->sync_s = 10e-6;
    p->round_trip_s = 60e-6;
    p->graph_round_trip_s = 30e-6;
    p->h2d_share_under_cpu = 0.8;
    p->cpu_share_under_h2d = 0.8;
    p->reads_share_under_cpu = p->cpu_share_under_reads = 0.8;
    p->expert_reads_share_under_cpu = p->cpu_share_under_expert_reads = 0.8;
    p->expert_reads_share_under_cpu_16 = p->cpu_share_under_expert_reads_16 = 0.8;
}

/* ---- fingerprint and path */

static void read_cpu_name(char *out, size_t size) {
    snprintf(out, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *value = strchr(line, ':');
        if (!value) continue;
        value += 1 + strspn(value + 1, " \t");
        size_t n = strcspn(value, "\n");
        while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t')) n--;
        if (n > 0) snprintf(out, size, "%.*s", (int)n, value);
        break;
    }
    fclose(f);
}

void profile_fingerprint_here(int32_t threads, const char *gpu, int32_t driver, struct profile_fingerprint *fp) {
    memset(fp, 0, sizeof *fp);
    read_cpu_name(fp->cpu, sizeof fp->cpu);
    fp->threads = threads;
    snprintf(fp->gpu, sizeof fp->gpu, "%s", gpu ? gpu : "");
    fp->driver = driver;
}

static uint64_t fingerprint_hash(const struct profile_fingerprint *fp) {
    char text[sizeof fp->cpu + sizeof fp->gpu + 32];
    const int n = snprintf(text, sizeof text, "%s\n%d\n%s\n%d", fp->cpu, (int)fp->threads, fp->gpu, (int)fp->driver);
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i < n && i < (int)sizeof text - 1; i++) h = (h ^ (uint8_t)text[i]) * 1099511628211ull;
    return h;
}

static bool env_set(const char *name, const char **value) {
    *value = getenv(name);
    return *value && **value;
}

pshard_status profile_path(const struct profile_fingerprint *fp, char *out, size_t out_size) {
    const char *dir, *suffix;
    if (env_set("PSHARD_CACHE_DIR", &dir)) suffix = "";
    else if (env_set("XDG_CACHE_HOME", &dir)) suffix = "/pshard";
    else if (env_set("HOME", &dir)) suffix = "/.cache/pshard";
    else return core_fail(PSHARD_ERR_NOT_FOUND, "no cache folder for the profile: set PSHARD_CACHE_DIR or HOME");
    const int n = snprintf(out, out_size, "%s%s/profile-%016" PRIx64 ".json", dir, suffix, fingerprint_hash(fp));
    if (n < 0 || (size_t)n >= out_size)
        return core_fail(PSHARD_ERR_RANGE, "the profile's path under %s is too long", dir);
    return PSHARD_OK;
}

/* ---- rate tables and interpolation */

static int rate_index(const struct profile_rate table[PROFILE_FORMATS], const char *format) {
    for (int i = 0; i < PROFILE_FORMATS; i++)
        if (table[i].format[0] && !strcmp(table[i].format, format)) return i;
    return -1;
}

const struct profile_rate *profile_rate_find(const struct profile_rate table[PROFILE_FORMATS], const char *format) {
    const int i = rate_index(table, format);
    return i < 0 ? NULL : &table[i];
}

struct profile_rate *profile_rate_add(struct profile_rate table[PROFILE_FORMATS], const char *format) {
    const int i = rate_index(table, format);
    if (i >= 0) return &table[i];
    if (!format[0] || strlen(format) >= sizeof table[0].format) return NULL;
    for (int j = 0; j < PROFILE_FORMATS; j++)
        if (!table[j].format[0]) {
            memset(&table[j], 0, sizeof table[j]);
            snprintf(table[j].format, sizeof table[j].format, "%s", format);
            return &table[j];
        }
    return NULL;
}

/* Piecewise linear in log x through (points[i], values[i]), flat outside the points. */
static double interpolate(const double *values, const double *points, int n, double x) {
    if (!(x > points[0])) return values[0]; /* also NaN */
    if (x >= points[n - 1]) return values[n - 1];
    int i = 0;
    while (x >= points[i + 1]) i++;
    const double t = (log(x) - log(points[i])) / (log(points[i + 1]) - log(points[i]));
    return values[i] + t * (values[i + 1] - values[i]);
}

int profile_token_index(int32_t n_tokens) {
    int i = 0;
    while (i + 1 < PROFILE_TOKENS && profile_tokens[i + 1] <= n_tokens) i++;
    return i;
}

double profile_at_tokens(const double values[PROFILE_TOKENS], double n_tokens) {
    double points[PROFILE_TOKENS];
    for (int i = 0; i < PROFILE_TOKENS; i++) points[i] = profile_tokens[i];
    return interpolate(values, points, PROFILE_TOKENS, n_tokens);
}

double profile_at_size(const double values[PROFILE_SIZES], double bytes) {
    double points[PROFILE_SIZES];
    for (int i = 0; i < PROFILE_SIZES; i++) points[i] = (double)profile_sizes[i];
    return interpolate(values, points, PROFILE_SIZES, bytes);
}

/* A GPU attention rate at n tokens from the points its kernel was timed at: the split-KV
 * kernel's (below PROFILE_PROMPT_ATTN tokens) or the prompt kernel's, never a mix (a 32-token
 * step of the split-KV kernel is as slow per token as at 16 tokens, not halfway to the prompt
 * kernel's rate at 64). */
static double attn_at_tokens(const double values[PROFILE_TOKENS], double n, bool prompt) {
    double points[PROFILE_TOKENS];
    int first = 0, count = 0;
    for (int i = 0; i < PROFILE_TOKENS; i++) points[i] = profile_tokens[i];
    while (first + count < PROFILE_TOKENS && profile_tokens[first + count] < PROFILE_PROMPT_ATTN) count++;
    if (prompt || count == 0) first = count, count = PROFILE_TOKENS - count;
    return interpolate(values + first, points + first, count, n);
}

const double *profile_in_place(const struct profile *p, uint32_t skew, bool experts) {
    if (skew % 128 == 0) return experts ? p->zero_copy_experts : p->zero_copy;
    return experts ? p->zero_copy_experts_off : p->zero_copy_off;
}

double profile_gpu_attn(const struct profile *p, double n, double cells, bool prompt) {
    const double short_cells = prompt ? PROFILE_ATTN_WINDOW - fmin(n, PROFILE_ATTN_WINDOW) / 2 : PROFILE_ATTN_CELLS;
    const double long_cells = prompt ? PROFILE_ATTN_LONG_WINDOW - fmin(n, PROFILE_ATTN_LONG_WINDOW) / 2 : PROFILE_ATTN_LONG_CELLS;
    const double at_short = attn_at_tokens(p->gpu_attn, n, prompt), at_long = attn_at_tokens(p->gpu_attn_long, n, prompt);
    if (!(at_long > 0) || cells <= short_cells) return at_short;
    if (cells >= long_cells) return at_long;
    const double f = log(cells / short_cells) / log(long_cells / short_cells);
    return at_short + f * (at_long - at_short);
}

/* ---- writing */

/* Takes ownership of `value` (NULL when building it failed, e.g. json_real of a NaN). */
static bool put(json_t *object, const char *key, json_t *value) { return json_object_set_new(object, key, value) == 0; }

static json_t *reals_json(const double *values, size_t n) {
    json_t *array = json_array();
    for (size_t i = 0; array && i < n; i++)
        if (json_array_append_new(array, json_real(values[i])) != 0) {
            json_decref(array);
            return NULL;
        }
    return array;
}

static json_t *integers_json(const int64_t *values, size_t n) {
    json_t *array = json_array();
    for (size_t i = 0; array && i < n; i++)
        if (json_array_append_new(array, json_integer(values[i])) != 0) {
            json_decref(array);
            return NULL;
        }
    return array;
}

static json_t *rates_json(const struct profile_rate table[PROFILE_FORMATS]) {
    json_t *object = json_object();
    for (int i = 0; object && i < PROFILE_FORMATS; i++)
        if (table[i].format[0] && !put(object, table[i].format, reals_json(table[i].s_per_byte, PROFILE_TOKENS))) {
            json_decref(object);
            return NULL;
        }
    return object;
}

static json_t *fingerprint_json(const struct profile_fingerprint *fp) {
    json_t *object = json_object();
    bool ok = put(object, "cpu", json_string(fp->cpu));
    ok &= put(object, "threads", json_integer(fp->threads));
    ok &= put(object, "gpu", json_string(fp->gpu));
    ok &= put(object, "driver", json_integer(fp->driver));
    if (ok) return object;
    json_decref(object);
    return NULL;
}

static json_t *profile_json(const struct profile *p) {
    int64_t tokens[PROFILE_TOKENS], sizes[PROFILE_SIZES];
    for (int i = 0; i < PROFILE_TOKENS; i++) tokens[i] = profile_tokens[i];
    for (int i = 0; i < PROFILE_SIZES; i++) sizes[i] = (int64_t)profile_sizes[i];
    char utc[32] = "";
    const time_t created = (time_t)p->created;
    struct tm tm;
    if (gmtime_r(&created, &tm)) strftime(utc, sizeof utc, "%Y-%m-%dT%H:%M:%SZ", &tm);

    json_t *root = json_object();
    bool ok = put(root, "version", json_integer(p->version));
    ok &= put(root, "pshard", json_string(p->pshard));
    ok &= put(root, "fingerprint", fingerprint_json(&p->fp));
    ok &= put(root, "created", json_integer(p->created));
    ok &= put(root, "created_utc", json_string(utc));
    ok &= put(root, "measured", json_boolean(p->measured));
    ok &= put(root, "seconds", json_real(p->seconds));
    ok &= put(root, "tokens", integers_json(tokens, PROFILE_TOKENS));
    ok &= put(root, "sizes", integers_json(sizes, PROFILE_SIZES));
    ok &= put(root, "host_read_gbps", json_real(p->host_read_gbps));
    ok &= put(root, "host_served_gbps", json_real(p->host_served_gbps));
    ok &= put(root, "cpu_matmul", rates_json(p->cpu_matmul));
    ok &= put(root, "cpu_experts", rates_json(p->cpu_experts));
    ok &= put(root, "cpu_router", reals_json(p->cpu_router, PROFILE_TOKENS));
    ok &= put(root, "cpu_attn", reals_json(p->cpu_attn, PROFILE_TOKENS));
    ok &= put(root, "cpu_step_s", json_real(p->cpu_step_s));
    ok &= put(root, "has_gpu", json_boolean(p->has_gpu));
    ok &= put(root, "gpu_matmul", rates_json(p->gpu_matmul));
    ok &= put(root, "gpu_experts", rates_json(p->gpu_experts));
    ok &= put(root, "gpu_attn", reals_json(p->gpu_attn, PROFILE_TOKENS));
    ok &= put(root, "gpu_attn_long", reals_json(p->gpu_attn_long, PROFILE_TOKENS));
    ok &= put(root, "gpu_attn_call_s", json_real(p->gpu_attn_call_s));
    ok &= put(root, "h2d_gbps", reals_json(p->h2d_gbps, PROFILE_SIZES));
    ok &= put(root, "d2h_gbps", reals_json(p->d2h_gbps, PROFILE_SIZES));
    ok &= put(root, "zero_copy", reals_json(p->zero_copy, PROFILE_TOKENS));
    ok &= put(root, "zero_copy_off", reals_json(p->zero_copy_off, PROFILE_TOKENS));
    ok &= put(root, "kernel_s", json_real(p->kernel_s));
    json_t *refine = json_array();
    for (int i = 0; refine && i < PROFILE_MODELS && p->refine[i].model[0]; i++) {
        json_t *entry = json_object(), *scale = json_array();
        for (int f = 0; scale && f < PROFILE_FAMILIES; f++)
            ok &= json_array_append_new(scale, reals_json(p->refine[i].scale[f], PROFILE_TOKENS)) == 0;
        ok &= entry && scale && put(entry, "model", json_string(p->refine[i].model)) && put(entry, "scale", scale);
        ok &= entry && json_array_append_new(refine, entry) == 0;
    }
    ok &= refine && put(root, "refine", refine);
    ok &= put(root, "zero_copy_experts", reals_json(p->zero_copy_experts, PROFILE_TOKENS));
    ok &= put(root, "zero_copy_experts_off", reals_json(p->zero_copy_experts_off, PROFILE_TOKENS));
    ok &= put(root, "zero_copy_expert_call_s", json_real(p->zero_copy_expert_call_s));
    ok &= put(root, "in_place_skew", json_integer(p->in_place_skew));
    ok &= put(root, "cpu_moe_call_s", json_real(p->cpu_moe_call_s));
    ok &= put(root, "launch_s", json_real(p->launch_s));
    ok &= put(root, "graph_node_s", json_real(p->graph_node_s));
    ok &= put(root, "sync_s", json_real(p->sync_s));
    ok &= put(root, "round_trip_s", json_real(p->round_trip_s));
    ok &= put(root, "graph_round_trip_s", json_real(p->graph_round_trip_s));
    ok &= put(root, "h2d_share_under_cpu", json_real(p->h2d_share_under_cpu));
    ok &= put(root, "cpu_share_under_h2d", json_real(p->cpu_share_under_h2d));
    ok &= put(root, "reads_share_under_cpu", json_real(p->reads_share_under_cpu));
    ok &= put(root, "cpu_share_under_reads", json_real(p->cpu_share_under_reads));
    ok &= put(root, "expert_reads_share_under_cpu", json_real(p->expert_reads_share_under_cpu));
    ok &= put(root, "cpu_share_under_expert_reads", json_real(p->cpu_share_under_expert_reads));
    ok &= put(root, "expert_reads_share_under_cpu_16", json_real(p->expert_reads_share_under_cpu_16));
    ok &= put(root, "cpu_share_under_expert_reads_16", json_real(p->cpu_share_under_expert_reads_16));
    if (ok) return root;
    json_decref(root);
    return NULL;
}

/* mkdir -p of the folder holding `path`. */
static pshard_status make_parent_dirs(const char *path) {
    char dir[PATH_BYTES];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return core_fail(PSHARD_ERR_RANGE, "%s: path too long", path);
    for (char *slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return core_fail(PSHARD_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
        *slash = '/';
    }
    return PSHARD_OK;
}

/* Written, flushed to the disk, and only then renamed over the old file, so a crash leaves the
 * old profile or the new one, never half of one. */
static pshard_status write_json(const char *path, const char *tmp, const json_t *root) {
    FILE *f = fopen(tmp, "w");
    if (!f) return core_fail(PSHARD_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    errno = 0;
    bool ok = json_dumpf(root, f, JSON_INDENT(1)) == 0 && fputc('\n', f) != EOF && fflush(f) == 0 &&
              fsync(fileno(f)) == 0;
    int error = errno;
    if (fclose(f) != 0 && ok) ok = false, error = errno;
    if (!ok) {
        const pshard_status status = core_fail(PSHARD_ERR_IO, "cannot write %s: %s", tmp, strerror(error));
        unlink(tmp);
        return status;
    }
    if (rename(tmp, path) != 0) {
        const pshard_status status = core_fail(PSHARD_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return status;
    }
    return PSHARD_OK;
}

pshard_status profile_save(const char *path, const struct profile *p) {
    char tmp[PATH_BYTES];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return core_fail(PSHARD_ERR_RANGE, "%s: path too long", path);
    json_t *root = profile_json(p);
    if (!root) return core_fail(PSHARD_ERR_INVALID_ARG, "%s: cannot encode the profile (a number is not finite)", path);
    pshard_status status = make_parent_dirs(path);
    if (status == PSHARD_OK) status = write_json(path, tmp, root);
    json_decref(root);
    return status;
}

/* ---- reading: every check names the file and the key */

/* The value at a dotted key ("fingerprint.cpu"); NULL when missing. */
static json_t *lookup(json_t *root, const char *key) {
    const char *dot = strchr(key, '.');
    if (!dot) return json_object_get(root, key);
    char head[32];
    snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
    return lookup(json_object_get(root, head), dot + 1);
}

static pshard_status check_real(const char *path, const char *key, const json_t *value, double *out) {
    if (!json_is_number(value)) return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" is missing or not a number", path, key);
    const double x = json_number_value(value);
    if (!isfinite(x) || x < 0)
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" holds %g, not a number >= 0", path, key, x);
    *out = x;
    return PSHARD_OK;
}

static pshard_status check_reals(const char *path, const char *key, const json_t *value, double *out, size_t n) {
    if (!json_is_array(value) || json_array_size(value) != n)
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" is missing or not an array of %zu numbers", path, key, n);
    for (size_t i = 0; i < n; i++) CORE_TRY(check_real(path, key, json_array_get(value, i), &out[i]));
    return PSHARD_OK;
}

/* A rate the profiler could not measure at some token counts is 0 there (in older profiles, a
 * step that outgrew the work buffer); read as free, it would make such steps cost nothing. Those
 * points take the nearest measured one's rate, the one below first. */
static void hold_unmeasured(double v[PROFILE_TOKENS]) {
    for (int i = 1; i < PROFILE_TOKENS; i++)
        if (!(v[i] > 0)) v[i] = v[i - 1];
    for (int i = PROFILE_TOKENS - 2; i >= 0; i--)
        if (!(v[i] > 0)) v[i] = v[i + 1];
}

static pshard_status read_real(const char *path, json_t *root, const char *key, double *out) {
    return check_real(path, key, lookup(root, key), out);
}

static pshard_status read_reals(const char *path, json_t *root, const char *key, double *out, size_t n) {
    return check_reals(path, key, lookup(root, key), out, n);
}

static pshard_status read_int(const char *path, json_t *root, const char *key, int64_t min, int64_t max, int64_t *out) {
    const json_t *value = lookup(root, key);
    if (!json_is_integer(value) || json_integer_value(value) < min || json_integer_value(value) > max)
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" is missing or not an integer from %" PRId64 " to %" PRId64,
                         path, key, min, max);
    *out = json_integer_value(value);
    return PSHARD_OK;
}

static pshard_status read_int32(const char *path, json_t *root, const char *key, int32_t *out) {
    int64_t value;
    CORE_TRY(read_int(path, root, key, 0, INT32_MAX, &value));
    *out = (int32_t)value;
    return PSHARD_OK;
}

static pshard_status read_bool(const char *path, json_t *root, const char *key, bool *out) {
    const json_t *value = lookup(root, key);
    if (!json_is_boolean(value))
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" is missing or not true/false", path, key);
    *out = json_is_true(value);
    return PSHARD_OK;
}

static pshard_status read_text(const char *path, json_t *root, const char *key, char *out, size_t size) {
    const json_t *value = lookup(root, key);
    if (!json_is_string(value) || json_string_length(value) >= size || strlen(json_string_value(value)) >= size)
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" is missing or not a text of at most %zu bytes", path, key,
                         size - 1);
    memcpy(out, json_string_value(value), json_string_length(value) + 1);
    return PSHARD_OK;
}

static pshard_status read_rates(const char *path, json_t *root, const char *key,
                                struct profile_rate table[PROFILE_FORMATS]) {
    json_t *object = lookup(root, key);
    if (!json_is_object(object))
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" is missing or not an object", path, key);
    if (json_object_size(object) > PROFILE_FORMATS)
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" has %zu formats, more than %d", path, key,
                         json_object_size(object), PROFILE_FORMATS);
    memset(table, 0, PROFILE_FORMATS * sizeof table[0]);
    const char *format;
    json_t *value;
    int i = 0;
    json_object_foreach(object, format, value) {
        char name[64];
        snprintf(name, sizeof name, "%s.%s", key, format);
        if (!format[0] || strlen(format) >= sizeof table[i].format)
            return core_fail(PSHARD_ERR_FORMAT, "%s: \"%s\" is not a format name of 1 to %zu characters", path, name,
                             sizeof table[i].format - 1);
        memcpy(table[i].format, format, strlen(format) + 1);
        CORE_TRY(check_reals(path, name, value, table[i].s_per_byte, PROFILE_TOKENS));
        hold_unmeasured(table[i].s_per_byte);
        i++;
    }
    return PSHARD_OK;
}

/* Everything but the version, already checked; "tokens", "sizes" and "created_utc" are for
 * readers only (PROFILE_VERSION changes when the measured points, how one is measured, or the
 * kernels timed do). */
static pshard_status profile_from_json(const char *path, json_t *root, struct profile *p) {
    CORE_TRY(read_text(path, root, "pshard", p->pshard, sizeof p->pshard));
    CORE_TRY(read_text(path, root, "fingerprint.cpu", p->fp.cpu, sizeof p->fp.cpu));
    CORE_TRY(read_int32(path, root, "fingerprint.threads", &p->fp.threads));
    CORE_TRY(read_text(path, root, "fingerprint.gpu", p->fp.gpu, sizeof p->fp.gpu));
    CORE_TRY(read_int32(path, root, "fingerprint.driver", &p->fp.driver));
    CORE_TRY(read_int(path, root, "created", 0, INT64_MAX, &p->created));
    CORE_TRY(read_bool(path, root, "measured", &p->measured));
    CORE_TRY(read_real(path, root, "seconds", &p->seconds));
    CORE_TRY(read_real(path, root, "host_read_gbps", &p->host_read_gbps));
    CORE_TRY(read_real(path, root, "host_served_gbps", &p->host_served_gbps));
    CORE_TRY(read_rates(path, root, "cpu_matmul", p->cpu_matmul));
    CORE_TRY(read_rates(path, root, "cpu_experts", p->cpu_experts));
    CORE_TRY(read_reals(path, root, "cpu_router", p->cpu_router, PROFILE_TOKENS));
    hold_unmeasured(p->cpu_router); /* never measured (a dense model's): all stay 0 */
    CORE_TRY(read_reals(path, root, "cpu_attn", p->cpu_attn, PROFILE_TOKENS));
    CORE_TRY(read_real(path, root, "cpu_step_s", &p->cpu_step_s));
    CORE_TRY(read_bool(path, root, "has_gpu", &p->has_gpu));
    CORE_TRY(read_rates(path, root, "gpu_matmul", p->gpu_matmul));
    CORE_TRY(read_rates(path, root, "gpu_experts", p->gpu_experts));
    CORE_TRY(read_reals(path, root, "gpu_attn", p->gpu_attn, PROFILE_TOKENS));
    CORE_TRY(read_reals(path, root, "gpu_attn_long", p->gpu_attn_long, PROFILE_TOKENS));
    CORE_TRY(read_real(path, root, "gpu_attn_call_s", &p->gpu_attn_call_s));
    CORE_TRY(read_reals(path, root, "h2d_gbps", p->h2d_gbps, PROFILE_SIZES));
    CORE_TRY(read_reals(path, root, "d2h_gbps", p->d2h_gbps, PROFILE_SIZES));
    CORE_TRY(read_reals(path, root, "zero_copy", p->zero_copy, PROFILE_TOKENS));
    CORE_TRY(read_reals(path, root, "zero_copy_off", p->zero_copy_off, PROFILE_TOKENS));
    CORE_TRY(read_real(path, root, "kernel_s", &p->kernel_s));
    const json_t *refine = json_object_get(root, "refine");
    if (!json_is_array(refine) || json_array_size(refine) > PROFILE_MODELS)
        return core_fail(PSHARD_ERR_FORMAT, "%s: \"refine\" must be an array of at most %d models", path, PROFILE_MODELS);
    for (size_t i = 0; i < json_array_size(refine); i++) {
        const json_t *entry = json_array_get(refine, i), *model = json_object_get(entry, "model"),
                     *scale = json_object_get(entry, "scale");
        if (!json_is_string(model) || !json_string_length(model) ||
            json_string_length(model) >= sizeof p->refine[i].model || !json_is_array(scale) ||
            json_array_size(scale) != PROFILE_FAMILIES)
            return core_fail(PSHARD_ERR_FORMAT, "%s: \"refine\" entries need a \"model\" (1-%d characters) and "
                             "\"scale\", %d arrays", path, (int)sizeof p->refine[i].model - 1, PROFILE_FAMILIES);
        memcpy(p->refine[i].model, json_string_value(model), json_string_length(model) + 1);
        for (int f = 0; f < PROFILE_FAMILIES; f++) {
            const json_t *row = json_array_get(scale, (size_t)f);
            for (int k = 0; k < PROFILE_TOKENS; k++) {
                const json_t *v = json_array_get(row, (size_t)k);
                if (!json_is_array(row) || json_array_size(row) != PROFILE_TOKENS || !json_is_number(v) ||
                    !(json_number_value(v) >= 0) || !isfinite(json_number_value(v)))
                    return core_fail(PSHARD_ERR_FORMAT, "%s: \"refine\" must hold %d non-negative numbers per family",
                                     path, PROFILE_TOKENS);
                p->refine[i].scale[f][k] = json_number_value(v);
            }
        }
    }
    CORE_TRY(read_reals(path, root, "zero_copy_experts", p->zero_copy_experts, PROFILE_TOKENS));
    CORE_TRY(read_reals(path, root, "zero_copy_experts_off", p->zero_copy_experts_off, PROFILE_TOKENS));
    CORE_TRY(read_real(path, root, "zero_copy_expert_call_s", &p->zero_copy_expert_call_s));
    int64_t skew;
    CORE_TRY(read_int(path, root, "in_place_skew", 0, 255, &skew));
    p->in_place_skew = (int32_t)skew;
    CORE_TRY(read_real(path, root, "cpu_moe_call_s", &p->cpu_moe_call_s));
    CORE_TRY(read_real(path, root, "launch_s", &p->launch_s));
    CORE_TRY(read_real(path, root, "graph_node_s", &p->graph_node_s));
    CORE_TRY(read_real(path, root, "sync_s", &p->sync_s));
    CORE_TRY(read_real(path, root, "round_trip_s", &p->round_trip_s));
    CORE_TRY(read_real(path, root, "graph_round_trip_s", &p->graph_round_trip_s));
    CORE_TRY(read_real(path, root, "h2d_share_under_cpu", &p->h2d_share_under_cpu));
    CORE_TRY(read_real(path, root, "cpu_share_under_h2d", &p->cpu_share_under_h2d));
    CORE_TRY(read_real(path, root, "reads_share_under_cpu", &p->reads_share_under_cpu));
    CORE_TRY(read_real(path, root, "cpu_share_under_reads", &p->cpu_share_under_reads));
    CORE_TRY(read_real(path, root, "expert_reads_share_under_cpu", &p->expert_reads_share_under_cpu));
    CORE_TRY(read_real(path, root, "cpu_share_under_expert_reads", &p->cpu_share_under_expert_reads));
    CORE_TRY(read_real(path, root, "expert_reads_share_under_cpu_16", &p->expert_reads_share_under_cpu_16));
    CORE_TRY(read_real(path, root, "cpu_share_under_expert_reads_16", &p->cpu_share_under_expert_reads_16));
    return PSHARD_OK;
}

static bool same_fingerprint(const struct profile_fingerprint *a, const struct profile_fingerprint *b) {
    return !strcmp(a->cpu, b->cpu) && a->threads == b->threads && !strcmp(a->gpu, b->gpu) && a->driver == b->driver;
}

/* Well-formed; is it usable here and now? */
static pshard_status check_usable(const char *path, const struct profile *p, const struct profile_fingerprint *here) {
    if (strcmp(p->pshard, PSHARD_VERSION) != 0)
        return core_fail(PSHARD_ERR_RANGE, "%s: measured by pshard %s (this is %s)", path, p->pshard, PSHARD_VERSION);
    if (here && !same_fingerprint(&p->fp, here))
        return core_fail(PSHARD_ERR_RANGE, "%s: measured on another machine (CPU %s, %d threads, GPU %s, driver %d)",
                         path, p->fp.cpu, (int)p->fp.threads, p->fp.gpu[0] ? p->fp.gpu : "none", (int)p->fp.driver);
    const int64_t age = (int64_t)time(NULL) - p->created;
    if (age > (int64_t)PROFILE_MAX_AGE_DAYS * SECONDS_PER_DAY)
        return core_fail(PSHARD_ERR_RANGE, "%s: measured %" PRId64 " days ago (more than %d)", path,
                         age / SECONDS_PER_DAY, PROFILE_MAX_AGE_DAYS);
    if (age < -SECONDS_PER_DAY)
        return core_fail(PSHARD_ERR_RANGE, "%s: dated %" PRId64 " days in the future", path, -age / SECONDS_PER_DAY);
    return PSHARD_OK;
}

pshard_status profile_load(const char *path, const struct profile_fingerprint *here, struct profile *out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return core_fail(PSHARD_ERR_NOT_FOUND, "%s: no profile", path);
        return core_fail(PSHARD_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    json_error_t error;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &error);
    fclose(f);
    if (!root) return core_fail(PSHARD_ERR_FORMAT, "%s: not JSON (line %d: %s)", path, error.line, error.text);

    struct profile p;
    memset(&p, 0, sizeof p);
    /* The version first: a file of another format version is out of date, not malformed. */
    pshard_status status = read_int32(path, root, "version", &p.version);
    if (status == PSHARD_OK && p.version != PROFILE_VERSION)
        status = core_fail(PSHARD_ERR_RANGE, "%s: profile format version %d (this pshard reads %d)", path,
                           (int)p.version, PROFILE_VERSION);
    if (status == PSHARD_OK) status = profile_from_json(path, root, &p);
    if (status == PSHARD_OK) status = check_usable(path, &p, here);
    json_decref(root);
    if (status == PSHARD_OK) *out = p;
    return status;
}
