/* The machine profile: defaults, the JSON file's round trip, where it lives, what load refuses
 * (another machine, too old, malformed, missing), interpolation, the rate tables, and the CPU
 * figures timed at several moments. */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "measure/measure_internal.h"
#include "plan/profile.h"
#include "test_helpers.h"

static char cache_dir[64];
static char path[512];
static struct profile_fingerprint here;

static int setup(void **state) {
    (void)state;
    snprintf(cache_dir, sizeof cache_dir, "/tmp/pshard-test-profile-XXXXXX");
    if (!mkdtemp(cache_dir)) return -1;
    /* A folder below the temporary one, so that save has to create it. */
    char dir[128];
    snprintf(dir, sizeof dir, "%s/cache/pshard", cache_dir);
    setenv("PSHARD_CACHE_DIR", dir, 1);
    profile_fingerprint_here(8, "NVIDIA H200", 12040, &here);
    return profile_path(&here, path, sizeof path) == PSHARD_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A measured-looking profile of this machine, with distinct numbers everywhere. */
static struct profile sample(void) {
    struct profile p;
    profile_defaults(&p);
    p.fp = here;
    p.measured = true;
    p.has_gpu = true;
    p.seconds = 12.345;
    p.host_read_gbps = 1.0 / 3.0;
    p.host_served_gbps = 2.0 / 3.0;
    p.cpu_matmul[0].s_per_byte[3] = 0.1 + 0.2; /* not a short decimal */
    p.h2d_gbps[2] = 24.6789012345678;
    p.round_trip_s = 5.4321e-5;
    p.graph_round_trip_s = 2.345e-5;
    p.reads_share_under_cpu = 0.61, p.cpu_share_under_reads = 0.73;
    p.expert_reads_share_under_cpu = 0.47, p.cpu_share_under_expert_reads = 0.89;
    p.zero_copy_experts[4] = 1.0 / 31.25e9;
    p.cpu_moe_call_s = 7.5e-5;
    for (int i = 0; i < PROFILE_TOKENS; i++) p.cpu_router[i] = (i + 1) / 27e9;
    p.zero_copy_expert_call_s = 3.25e-5;
    p.in_place_skew = 96;
    p.zero_copy_off[2] = 1.0 / 35.5e9, p.zero_copy_experts_off[1] = 1.0 / 17.75e9;
    p.kernel_s = 4.25e-6;
    p.gpu_attn_call_s = 3.125e-5;
    p.gpu_attn_long[2] = 2.0 / 3.0 * 1e-12;
    snprintf(p.refine[0].model, sizeof p.refine[0].model, "llama 2x64 e0 0.01 GB");
    p.refine[0].scale[3][0] = 1.375;
    return p;
}

static void write_text(const char *file, const char *text) {
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Replace the first `from` in the saved file by `to`. */
static void edit_file(const char *from, const char *to) {
    size_t size = 0;
    char *text = (char *)test_read_file(path, &size);
    assert_non_null(text);
    char *copy = malloc(size + strlen(to) + 1);
    assert_non_null(copy);
    memcpy(copy, text, size);
    copy[size] = '\0';
    char *at = strstr(copy, from);
    assert_non_null(at);
    char *rest = strdup(at + strlen(from));
    strcpy(at, to);
    strcat(at, rest);
    write_text(path, copy);
    free(rest);
    free(copy);
    free(text);
}

static void assert_rates_equal(const struct profile_rate *a, const struct profile_rate *b) {
    for (int i = 0; i < PROFILE_FORMATS; i++) {
        assert_string_equal(a[i].format, b[i].format);
        for (int t = 0; t < PROFILE_TOKENS; t++) assert_true(a[i].s_per_byte[t] == b[i].s_per_byte[t]);
    }
}

static void assert_reals_equal(const double *a, const double *b, int n) {
    for (int i = 0; i < n; i++) assert_true(a[i] == b[i]);
}

static void assert_profiles_equal(const struct profile *a, const struct profile *b) {
    assert_int_equal(a->version, b->version);
    assert_string_equal(a->pshard, b->pshard);
    assert_string_equal(a->fp.cpu, b->fp.cpu);
    assert_int_equal(a->fp.threads, b->fp.threads);
    assert_string_equal(a->fp.gpu, b->fp.gpu);
    assert_int_equal(a->fp.driver, b->fp.driver);
    assert_int_equal(a->created, b->created);
    assert_int_equal(a->measured, b->measured);
    assert_true(a->seconds == b->seconds);
    assert_true(a->host_read_gbps == b->host_read_gbps);
    assert_true(a->host_served_gbps == b->host_served_gbps);
    assert_rates_equal(a->cpu_matmul, b->cpu_matmul);
    assert_rates_equal(a->cpu_experts, b->cpu_experts);
    assert_reals_equal(a->cpu_attn, b->cpu_attn, PROFILE_TOKENS);
    assert_reals_equal(a->cpu_router, b->cpu_router, PROFILE_TOKENS);
    assert_true(a->cpu_step_s == b->cpu_step_s);
    assert_int_equal(a->has_gpu, b->has_gpu);
    assert_rates_equal(a->gpu_matmul, b->gpu_matmul);
    assert_rates_equal(a->gpu_experts, b->gpu_experts);
    assert_reals_equal(a->gpu_attn, b->gpu_attn, PROFILE_TOKENS);
    assert_reals_equal(a->gpu_attn_long, b->gpu_attn_long, PROFILE_TOKENS);
    assert_reals_equal(a->h2d_gbps, b->h2d_gbps, PROFILE_SIZES);
    assert_reals_equal(a->d2h_gbps, b->d2h_gbps, PROFILE_SIZES);
    assert_true(!memcmp(a->zero_copy, b->zero_copy, sizeof a->zero_copy));
    assert_true(!memcmp(a->zero_copy_experts, b->zero_copy_experts, sizeof a->zero_copy_experts));
    assert_true(a->cpu_moe_call_s == b->cpu_moe_call_s);
    assert_true(a->zero_copy_expert_call_s == b->zero_copy_expert_call_s);
    assert_int_equal(a->in_place_skew, b->in_place_skew);
    assert_true(!memcmp(a->zero_copy_off, b->zero_copy_off, sizeof a->zero_copy_off));
    assert_true(!memcmp(a->zero_copy_experts_off, b->zero_copy_experts_off, sizeof a->zero_copy_experts_off));
    assert_true(a->kernel_s == b->kernel_s);
    assert_true(!memcmp(a->refine, b->refine, sizeof a->refine));
    assert_true(a->launch_s == b->launch_s);
    assert_true(a->graph_node_s == b->graph_node_s);
    assert_true(a->sync_s == b->sync_s);
    assert_true(a->round_trip_s == b->round_trip_s);
    assert_true(a->graph_round_trip_s == b->graph_round_trip_s);
    assert_true(a->reads_share_under_cpu == b->reads_share_under_cpu && a->cpu_share_under_reads == b->cpu_share_under_reads);
    assert_true(a->expert_reads_share_under_cpu == b->expert_reads_share_under_cpu &&
                a->cpu_share_under_expert_reads == b->cpu_share_under_expert_reads);
    assert_true(a->h2d_share_under_cpu == b->h2d_share_under_cpu);
    assert_true(a->cpu_share_under_h2d == b->cpu_share_under_h2d);
}

static void test_defaults(void **state) {
    (void)state;
    struct profile p;
    memset(&p, 0xff, sizeof p);
    profile_defaults(&p);
    assert_int_equal(p.version, PROFILE_VERSION);
    assert_string_equal(p.pshard, PSHARD_VERSION);
    assert_false(p.measured);
    assert_false(p.has_gpu);
    assert_true(llabs(p.created - (int64_t)time(NULL)) <= 2);
    assert_true(p.host_read_gbps == 20);
    const char *formats[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "Q2_K"};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        const struct profile_rate *cpu = profile_rate_find(p.cpu_matmul, formats[i]);
        const struct profile_rate *gpu = profile_rate_find(p.gpu_experts, formats[i]);
        assert_non_null(cpu);
        assert_non_null(gpu);
        assert_true(cpu->s_per_byte[0] == 1 / 20e9);
        assert_true(cpu->s_per_byte[5] == 1 / 20e9 * (1024 / 8.0)); /* compute-bound at 1024 tokens */
        assert_true(gpu->s_per_byte[0] == 1 / 1000e9 * 1.5);
    }
    assert_true(p.h2d_gbps[0] == 6 && p.h2d_gbps[1] == 12 && p.d2h_gbps[4] == 12);
    assert_true(p.launch_s == 5e-6 && p.h2d_share_under_cpu == 0.8);
}

static void test_round_trip(void **state) {
    (void)state;
    struct profile saved = sample(), loaded;
    memset(&loaded, 0, sizeof loaded);
    assert_int_equal(profile_save(path, &saved), PSHARD_OK);
    assert_int_equal(profile_load(path, &here, &loaded), PSHARD_OK);
    assert_profiles_equal(&saved, &loaded);
    /* The defaults too (has_gpu false, measured false). */
    profile_defaults(&saved);
    saved.fp = here;
    assert_int_equal(profile_save(path, &saved), PSHARD_OK);
    assert_int_equal(profile_load(path, &here, &loaded), PSHARD_OK);
    assert_profiles_equal(&saved, &loaded);

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 1000 && st.st_size < 200 * 1000);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    assert_int_equal(access(tmp, F_OK), -1); /* renamed away */
}

/* A rate left unmeasured at some token counts (0: an older profiler skipped qwen235b's GPU experts
 * at 1024 tokens) reads as the nearest measured point, the one below first, never as free. */
static void test_unmeasured_points_hold(void **state) {
    (void)state;
    struct profile saved = sample(), loaded;
    struct profile_rate *r = &saved.gpu_experts[0];
    assert_true(r->format[0] && r->s_per_byte[1] > 0 && r->s_per_byte[4] > 0);
    const double at256 = r->s_per_byte[4], at4 = r->s_per_byte[1];
    r->s_per_byte[5] = 0, r->s_per_byte[0] = 0;
    assert_int_equal(profile_save(path, &saved), PSHARD_OK);
    assert_int_equal(profile_load(path, &here, &loaded), PSHARD_OK);
    const struct profile_rate *l = profile_rate_find(loaded.gpu_experts, saved.gpu_experts[0].format);
    assert_non_null(l);
    assert_true(l->s_per_byte[5] == at256 && l->s_per_byte[0] == at4 && l->s_per_byte[4] == at256);
    /* The router's table too; one never measured (a dense model's) stays unmeasured. */
    const double router4 = saved.cpu_router[1];
    saved.cpu_router[0] = 0;
    assert_int_equal(profile_save(path, &saved), PSHARD_OK);
    assert_int_equal(profile_load(path, &here, &loaded), PSHARD_OK);
    assert_true(loaded.cpu_router[0] == router4 && loaded.cpu_router[1] == router4);
    memset(saved.cpu_router, 0, sizeof saved.cpu_router);
    assert_int_equal(profile_save(path, &saved), PSHARD_OK);
    assert_int_equal(profile_load(path, &here, &loaded), PSHARD_OK);
    for (int i = 0; i < PROFILE_TOKENS; i++) assert_true(loaded.cpu_router[i] == 0);
}

static void test_path(void **state) {
    (void)state;
    const char *dir = getenv("PSHARD_CACHE_DIR");
    char again[512], other_path[512];
    assert_int_equal(strncmp(path, dir, strlen(dir)), 0);
    assert_true(strlen(path) == strlen(dir) + strlen("/profile-0123456789abcdef.json"));
    assert_int_equal(strncmp(path + strlen(dir), "/profile-", 9), 0);
    assert_int_equal(strspn(path + strlen(dir) + 9, "0123456789abcdef"), 16);
    assert_string_equal(path + strlen(path) - 5, ".json");

    struct profile_fingerprint same;
    profile_fingerprint_here(8, "NVIDIA H200", 12040, &same);
    assert_int_equal(profile_path(&same, again, sizeof again), PSHARD_OK);
    assert_string_equal(again, path);
    struct profile_fingerprint other = here;
    snprintf(other.cpu, sizeof other.cpu, "Another CPU");
    assert_int_equal(profile_path(&other, other_path, sizeof other_path), PSHARD_OK);
    assert_string_not_equal(other_path, path);

    /* Without PSHARD_CACHE_DIR: XDG_CACHE_HOME, then HOME, then nothing. */
    char *saved_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    char *saved_xdg = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    char *saved_dir = strdup(dir);
    unsetenv("PSHARD_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    assert_int_equal(profile_path(&here, again, sizeof again), PSHARD_OK);
    assert_int_equal(strncmp(again, "/x/cache/pshard/profile-", 24), 0);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/someone", 1);
    assert_int_equal(profile_path(&here, again, sizeof again), PSHARD_OK);
    assert_int_equal(strncmp(again, "/home/someone/.cache/pshard/profile-", 36), 0);
    unsetenv("HOME");
    assert_int_equal(profile_path(&here, again, sizeof again), PSHARD_ERR_NOT_FOUND);
    assert_int_equal(profile_path(&here, again, 20), PSHARD_ERR_NOT_FOUND);
    setenv("PSHARD_CACHE_DIR", saved_dir, 1);
    assert_int_equal(profile_path(&here, again, 20), PSHARD_ERR_RANGE); /* too small for the path */
    if (saved_home) setenv("HOME", saved_home, 1);
    if (saved_xdg) setenv("XDG_CACHE_HOME", saved_xdg, 1);
    free(saved_home);
    free(saved_xdg);
    free(saved_dir);
}

static void test_fingerprint(void **state) {
    (void)state;
    struct profile_fingerprint fp;
    profile_fingerprint_here(3, NULL, 0, &fp);
    assert_true(strlen(fp.cpu) > 0);
    assert_null(strchr(fp.cpu, '\n'));
    assert_int_equal(fp.threads, 3);
    assert_string_equal(fp.gpu, "");
    assert_int_equal(fp.driver, 0);
}

/* A refused load leaves *out as it was. */
static void assert_load_fails(const struct profile_fingerprint *fp, pshard_status expected, const char *message) {
    struct profile out, before;
    memset(&out, 0x5a, sizeof out);
    before = out;
    assert_int_equal(profile_load(path, fp, &out), expected);
    assert_memory_equal(&out, &before, sizeof out);
    if (message && !strstr(pshard_last_error(), message))
        fail_msg("message '%s' lacks '%s'", pshard_last_error(), message);
}

static void test_refuses_another_machine(void **state) {
    (void)state;
    struct profile p = sample();
    assert_int_equal(profile_save(path, &p), PSHARD_OK);
    struct profile_fingerprint other = here;
    snprintf(other.cpu, sizeof other.cpu, "Another CPU");
    assert_load_fails(&other, PSHARD_ERR_RANGE, "another machine");
    other = here;
    other.threads = 9;
    assert_load_fails(&other, PSHARD_ERR_RANGE, "another machine");
    other = here;
    snprintf(other.gpu, sizeof other.gpu, "NVIDIA A100");
    assert_load_fails(&other, PSHARD_ERR_RANGE, "GPU NVIDIA H200");
    other = here;
    other.driver = 12020;
    assert_load_fails(&other, PSHARD_ERR_RANGE, "another machine");
    /* Without a fingerprint to compare, it loads. */
    struct profile out;
    assert_int_equal(profile_load(path, NULL, &out), PSHARD_OK);
    assert_string_equal(out.fp.gpu, "NVIDIA H200");
}

static void test_refuses_old_and_other_versions(void **state) {
    (void)state;
    struct profile p = sample();
    p.created = (int64_t)time(NULL) - (PROFILE_MAX_AGE_DAYS + 30) * 86400LL;
    assert_int_equal(profile_save(path, &p), PSHARD_OK);
    assert_load_fails(&here, PSHARD_ERR_RANGE, "measured 120 days ago");
    assert_load_fails(NULL, PSHARD_ERR_RANGE, "days ago");
    p.created = (int64_t)time(NULL) - (PROFILE_MAX_AGE_DAYS - 1) * 86400LL;
    struct profile out;
    assert_int_equal(profile_save(path, &p), PSHARD_OK);
    assert_int_equal(profile_load(path, &here, &out), PSHARD_OK);
    p.created = (int64_t)time(NULL) + 3 * 86400LL;
    assert_int_equal(profile_save(path, &p), PSHARD_OK);
    assert_load_fails(&here, PSHARD_ERR_RANGE, "future");

    p = sample();
    snprintf(p.pshard, sizeof p.pshard, "0.0.9");
    assert_int_equal(profile_save(path, &p), PSHARD_OK);
    assert_load_fails(NULL, PSHARD_ERR_RANGE, "measured by pshard 0.0.9");
    p = sample();
    p.version = PROFILE_VERSION + 1;
    assert_int_equal(profile_save(path, &p), PSHARD_OK);
    assert_load_fails(NULL, PSHARD_ERR_RANGE, "version");
}

static void test_refuses_malformed(void **state) {
    (void)state;
    struct profile p = sample();
    assert_int_equal(profile_save(path, &p), PSHARD_OK);
    size_t size = 0;
    unsigned char *bytes = test_read_file(path, &size);
    assert_non_null(bytes);
    char *good = strndup((const char *)bytes, size); /* test_read_file does not end it with '\0' */
    free(bytes);
    char *text = strndup(good, size / 2); /* truncated */
    write_text(path, text);
    free(text);
    assert_load_fails(&here, PSHARD_ERR_FORMAT, "not JSON");
    write_text(path, "\x7f" "ELF garbage");
    assert_load_fails(&here, PSHARD_ERR_FORMAT, path);
    write_text(path, "");
    assert_load_fails(&here, PSHARD_ERR_FORMAT, "not JSON");
    write_text(path, "[1, 2]");
    assert_load_fails(&here, PSHARD_ERR_FORMAT, "\"version\"");

    /* Each edit of a good file: the key the message must name. */
    const struct {
        const char *from, *to, *key;
    } edits[] = {
        {"\"cpu_attn\": [", "\"cpu_attn\": [1.0, ", "\"cpu_attn\""},              /* 7 numbers */
        {"\"h2d_gbps\": [", "\"h2d_gbps\": [-1.0, ", "\"h2d_gbps\""},              /* 6, one negative */
        {"\"launch_s\": ", "\"launch_s\": -", "\"launch_s\""},                     /* negative */
        {"\"gpu_attn_call_s\"", "\"gpu_attn_call\"", "\"gpu_attn_call_s\""},     /* missing */
        {"\"sync_s\": ", "\"sync_s\": \"fast\", \"x\": ", "\"sync_s\""},           /* not a number */
        {"\"Q4_0\": [", "\"Q4_0_and_a_long_tail\": [", "Q4_0_and_a_long_tail"},   /* name too long */
        {"\"cpu_matmul\": {", "\"cpu_matmul\": {\"X\": [1,1,1,1,1,1], ", "\"cpu_matmul\""}, /* 9 formats */
        {"\"gpu_matmul\": {", "\"gpu_matmul\": {\"Q4_0\": [1,1,1,1,1,1], ", "duplicate"},
        {"\"measured\": ", "\"measured\": 1, \"x\": ", "\"measured\""},
        {"\"threads\": ", "\"threads\": 1.5, \"x\": ", "\"fingerprint.threads\""},
        {"\"cpu_step_s\"", "\"cpu_step\"", "\"cpu_step_s\""},                      /* missing */
        {"\"created\": ", "\"created\": -", "\"created\""},
        {"\"model\": \"", "\"model\": \"\", \"x\": \"", "\"refine\""},                /* a model without a name */
        {"\"scale\": [", "\"scale\": [[1,1,1,1,1,1], ", "\"refine\""},               /* 6 families */
        {"1.375", "-1.375", "\"refine\""},                                              /* negative */
        {"\"in_place_skew\": 96", "\"in_place_skew\": 256", "\"in_place_skew\""},    /* past 255 */
        {"\"in_place_skew\": 96", "\"in_place_skew\": 9.5", "\"in_place_skew\""},    /* not an integer */
        {"\"zero_copy_off\": [", "\"zero_copy_off\": [1.0, ", "\"zero_copy_off\""},  /* 7 numbers */
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        write_text(path, good);
        edit_file(edits[i].from, edits[i].to);
        assert_load_fails(&here, PSHARD_ERR_FORMAT, edits[i].key);
    }
    write_text(path, good);
    struct profile out;
    assert_int_equal(profile_load(path, &here, &out), PSHARD_OK); /* the edits above broke it, not the file */
    free(good);
}

static void test_missing_file(void **state) {
    (void)state;
    assert_int_equal(unlink(path) == 0 || access(path, F_OK) != 0, 1);
    assert_load_fails(&here, PSHARD_ERR_NOT_FOUND, NULL);
}

static void test_save_refuses_nan(void **state) {
    (void)state;
    struct profile p = sample();
    p.sync_s = NAN;
    assert_int_equal(profile_save(path, &p), PSHARD_ERR_INVALID_ARG);
}

static void test_interpolation(void **state) {
    (void)state;
    const double tokens[PROFILE_TOKENS] = {10, 20, 40, 30, 30, 5};
    for (int i = 0; i < PROFILE_TOKENS; i++) assert_true(profile_at_tokens(tokens, profile_tokens[i]) == tokens[i]);
    assert_float_equal(profile_at_tokens(tokens, 2), 15, 1e-12);   /* midway between 1 and 4 in log n */
    assert_float_equal(profile_at_tokens(tokens, 8), 30, 1e-12);   /* between 4 and 16 */
    assert_float_equal(profile_at_tokens(tokens, 512), 17.5, 1e-12);
    assert_float_equal(profile_at_tokens(tokens, 10), 20 + 20 * log(2.5) / log(4), 1e-12);
    assert_true(profile_at_tokens(tokens, 0) == 10);
    assert_true(profile_at_tokens(tokens, -5) == 10);
    assert_true(profile_at_tokens(tokens, 0.5) == 10);
    assert_true(profile_at_tokens(tokens, 1e6) == 5);
    assert_true(profile_at_tokens(tokens, NAN) == 10);

    const double sizes[PROFILE_SIZES] = {1, 2, 4, 8, 16};
    for (int i = 0; i < PROFILE_SIZES; i++) assert_true(profile_at_size(sizes, (double)profile_sizes[i]) == sizes[i]);
    assert_float_equal(profile_at_size(sizes, sqrt(4.0 * (1 << 20) * 32.0 * (1 << 20))), 6, 1e-12);
    assert_true(profile_at_size(sizes, 100) == 1);
    assert_true(profile_at_size(sizes, 1e12) == 16);
}

/* GPU attention's rate between the short and the long cache's, in log cells: split-KV steps
 * over the whole cache, prompt steps (from PROFILE_PROMPT_ATTN tokens) over their causal window. */
static void test_attention_by_cache_length(void **state) {
    (void)state;
    struct profile p;
    profile_defaults(&p);
    for (int i = 0; i < PROFILE_TOKENS; i++) p.gpu_attn[i] = 1e-12, p.gpu_attn_long[i] = 3e-12;
    assert_true(profile_gpu_attn(&p, 16, 100, false) == 1e-12); /* below the short cache: its rate */
    assert_true(profile_gpu_attn(&p, 16, PROFILE_ATTN_CELLS, false) == 1e-12);
    assert_float_equal(profile_gpu_attn(&p, 16, 2.0 * PROFILE_ATTN_CELLS, false), 1e-12 + 2e-12 / 3, 1e-24); /* 32K = 8 x 4K */
    assert_true(profile_gpu_attn(&p, 16, PROFILE_ATTN_LONG_CELLS, false) == 3e-12);
    assert_true(profile_gpu_attn(&p, 1, 1e6, false) == 3e-12); /* beyond the long one: its rate */
    /* 64 tokens attend a window of their own: the short one's mean is 1024 - 32 cells. */
    assert_true(profile_gpu_attn(&p, 64, PROFILE_ATTN_WINDOW - 32, true) == 1e-12);
    assert_true(profile_gpu_attn(&p, 64, PROFILE_ATTN_LONG_WINDOW - 32, true) == 3e-12);
    assert_true(profile_gpu_attn(&p, 64, 4000, true) > 1e-12 && profile_gpu_attn(&p, 64, 4000, true) < 3e-12);
    /* Unmeasured (zero) long rates fall back to the short ones. */
    for (int i = 0; i < PROFILE_TOKENS; i++) p.gpu_attn_long[i] = 0;
    assert_true(profile_gpu_attn(&p, 16, 1e6, false) == 1e-12);
    /* Each kernel's rate comes from its own points: 63 tokens by the split-KV kernel (timed at
     * 1, 4 and 16 tokens) take the 16-token rate, not one halfway to the prompt kernel's; 40
     * tokens by the prompt kernel its rate at 64, its first point. */
    for (int i = 0; i < PROFILE_TOKENS; i++) p.gpu_attn[i] = profile_tokens[i] < PROFILE_PROMPT_ATTN ? 4e-12 : 1e-12;
    assert_true(profile_gpu_attn(&p, 63, 100, false) == 4e-12);
    assert_true(profile_gpu_attn(&p, 40, 100, false) == 4e-12);
    assert_true(profile_gpu_attn(&p, 40, 100, true) == 1e-12);
    assert_true(profile_gpu_attn(&p, 64, 100, true) == 1e-12);
    assert_true(profile_gpu_attn(&p, 100, 100, true) == 1e-12);
    p.gpu_attn[1] = 2e-12; /* 4 tokens */
    assert_float_equal(profile_gpu_attn(&p, 8, 100, false), 3e-12, 1e-24); /* halfway in log tokens */
}

/* Measuring the GPU under a cap (a run's VRAM budget) takes no more device memory than the cap
 * where the cap holds the fixed buffers and six of the least working sets; its working sets then
 * shrink to a sixth of the room and the experts to what it holds. Without a cap, or a cap above
 * what it takes, nothing changes. */
static void test_gpu_measure_room(void **state) {
    (void)state;
    const size_t MB = 1 << 20, fixed = 513 * MB, work = 256 * MB;
    const uint64_t expert = 3 * MB; /* one expert's gate, up and down */
    struct gpu_room r;
    measure_gpu_room(fixed, work, expert, 128, 8, 0, &r); /* as it always was */
    assert_int_equal(r.arena, 6 * (size_t)BIG_BYTES + 768 * MB + work);
    assert_int_equal(r.big, BIG_BYTES);
    assert_int_equal(r.experts, 128);
    assert_false(r.over_cap);
    measure_gpu_room(fixed, work, expert, 128, 8, (int64_t)64 << 30, &r); /* a cap above it */
    assert_int_equal(r.arena, 6 * (size_t)BIG_BYTES + 768 * MB + work);
    assert_int_equal(r.big, BIG_BYTES);
    for (int64_t cap_mb = 900; cap_mb <= 4096; cap_mb += 97) { /* within the cap; loops past any cache */
        measure_gpu_room(fixed, work, expert, 128, 8, cap_mb * (int64_t)MB, &r);
        assert_false(r.over_cap);
        assert_true(r.arena <= (size_t)cap_mb * MB);
        assert_true(r.big >= MIN_BIG_BYTES && r.big <= BIG_BYTES && r.big % MB == 0);
        assert_true(fixed + 4 * r.big <= r.arena); /* the four copies a small step's loop reads */
        assert_true(r.experts >= 8 && r.experts <= 128);
        assert_true(fixed + (uint64_t)r.experts * (expert + 3 * 256) <= r.arena); /* one layer's experts */
        if (cap_mb * MB >= fixed + 128 * expert + 3 * 128 * 256) assert_int_equal(r.experts, 128);
    }
    measure_gpu_room(fixed, work, expert, 128, 8, (int64_t)2 << 30, &r); /* 2 GB: a sixth of what is left */
    assert_int_equal(r.arena, (size_t)2 << 30);
    assert_int_equal(r.big, ((2048 - 513) / 6) * MB);
    measure_gpu_room(fixed, work, 30 * MB, 128, 8, (int64_t)1 << 30, &r); /* large experts: as many as fit */
    assert_int_equal(r.experts, (int64_t)((1024 - 513) * MB / (30 * MB + 768)));
    measure_gpu_room(fixed, work, expert, 128, 8, 100 * (int64_t)MB, &r); /* below what it needs: that, said so */
    assert_true(r.over_cap);
    assert_int_equal(r.arena, fixed + 6 * (size_t)MIN_BIG_BYTES);
    assert_int_equal(r.big, MIN_BIG_BYTES);
    measure_gpu_room(fixed, work, 0, 0, 0, (int64_t)2 << 30, &r); /* a dense model */
    assert_int_equal(r.experts, 0);
}

static void test_rate_tables(void **state) {
    (void)state;
    struct profile_rate table[PROFILE_FORMATS];
    memset(table, 0, sizeof table);
    assert_null(profile_rate_find(table, "Q4_0"));
    struct profile_rate *q4 = profile_rate_add(table, "Q4_0");
    assert_non_null(q4);
    assert_string_equal(q4->format, "Q4_0");
    q4->s_per_byte[2] = 7;
    assert_ptr_equal(profile_rate_find(table, "Q4_0"), q4);
    assert_ptr_equal(profile_rate_add(table, "Q4_0"), q4); /* the existing slot */
    assert_true(q4->s_per_byte[2] == 7);
    assert_null(profile_rate_add(table, "a_name_of_16_chr"));
    assert_null(profile_rate_add(table, ""));

    char name[16];
    for (int i = 1; i < PROFILE_FORMATS; i++) {
        snprintf(name, sizeof name, "T%d", i);
        struct profile_rate *slot = profile_rate_add(table, name);
        assert_ptr_equal(slot, &table[i]);
        assert_true(slot->s_per_byte[0] == 0);
    }
    assert_null(profile_rate_add(table, "ONE_TOO_MANY"));
    assert_ptr_equal(profile_rate_add(table, "T3"), &table[3]); /* a full table still finds */
    assert_ptr_equal(profile_rate_find(table, "T7"), &table[7]);
    assert_null(profile_rate_find(table, "T8"));
    /* A freed slot is reused. */
    table[2].format[0] = '\0';
    table[2].s_per_byte[0] = 99;
    struct profile_rate *reused = profile_rate_add(table, "NEW");
    assert_ptr_equal(reused, &table[2]);
    assert_true(reused->s_per_byte[0] == 0);
}

/* The CPU's figures that drift with the host's load keep their median over the samples, each
 * where every sample has it; other figures, and formats the profile lacks, are left alone. */
static void test_cpu_samples_settle(void **state) {
    (void)state;
    struct shapes sh;
    memset(&sh, 0, sizeof sh);
    sh.n_embd = 256, sh.rows = 512, sh.n_ff_exp = 128, sh.n_expert = 8, sh.k = 2;
    sh.n_dense = 2, sh.dense[0] = QUANT_Q4_0, sh.dense[1] = QUANT_Q8_0;
    sh.n_moe = 1, sh.gate[0] = sh.down[0] = QUANT_Q4_0;
    struct profile p;
    profile_defaults(&p);
    memset(p.cpu_matmul, 0, sizeof p.cpu_matmul), memset(p.cpu_experts, 0, sizeof p.cpu_experts);
    struct profile_rate *q4 = profile_rate_add(p.cpu_matmul, "Q4_0"), *ex = profile_rate_add(p.cpu_experts, "Q4_0");
    for (int i = 0; i < PROFILE_TOKENS; i++) q4->s_per_byte[i] = 10 + i, ex->s_per_byte[i] = 20 + i;
    p.host_read_gbps = 50;

    struct cpu_sample s[CPU_SAMPLES];
    measure_cpu_sample_of(&p, &sh, &s[0]);
    assert_true(s[0].host_read_gbps == 50 && s[0].dense[0][1] == 11 && s[0].experts[0][2] == 22);
    assert_true(s[0].dense[1][0] == 0); /* Q8_0: not in the profile */
    s[1] = s[0], s[2] = s[0];
    s[1].host_read_gbps = 90, s[2].host_read_gbps = 80;  /* median 80 */
    s[1].dense[0][0] = 4, s[2].dense[0][0] = 30;         /* 4, 10, 30: 10 stays */
    s[1].experts[0][0] = 25, s[2].experts[0][0] = 23;    /* 20, 25, 23: 23 */
    s[1].experts[0][1] = 0;                              /* one sample lacks it: 21 stays */
    s[1].dense[1][0] = s[2].dense[1][0] = 5;             /* a format the profile lacks */
    measure_cpu_settle(&sh, s, CPU_SAMPLES, &p);
    assert_true(p.host_read_gbps == 80);
    assert_true(q4->s_per_byte[0] == 10 && ex->s_per_byte[0] == 23 && ex->s_per_byte[1] == 21);
    assert_null(profile_rate_find(p.cpu_matmul, "Q8_0"));
    assert_true(q4->s_per_byte[2] == 12 && ex->s_per_byte[3] == 23); /* past the drifting points */

    /* Two samples (the minute ran out): the mean of the two. */
    s[1].experts[0][2] = 30;
    measure_cpu_settle(&sh, s, 2, &p);
    assert_true(ex->s_per_byte[2] == 26 && p.host_read_gbps == 70);

    /* Timed for real: every figure the shapes have, above 0. */
    struct threadpool *pool;
    assert_int_equal(threadpool_create(2, &pool), PSHARD_OK);
    struct cpu_sample now;
    struct cpu_sample which;
    memset(&which, 0, sizeof which);
    which.dense[0][0] = which.dense[1][0] = which.experts[0][0] = 1; /* every format the shapes have */
    assert_int_equal(measure_cpu_sample(&sh, pool, &which, &now), PSHARD_OK);
    assert_true(now.host_read_gbps > 0 && isfinite(now.host_read_gbps));
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < CPU_SAMPLE_DENSE; i++) assert_true(now.dense[f][i] > 0 && isfinite(now.dense[f][i]));
    for (int i = 0; i < CPU_SAMPLE_EXPERTS; i++) assert_true(now.experts[0][i] > 0 && isfinite(now.experts[0][i]));
    assert_true(now.dense[2][0] == 0 && now.experts[1][0] == 0);
    /* Only the formats asked for. */
    which.dense[0][0] = which.experts[0][0] = 0;
    assert_int_equal(measure_cpu_sample(&sh, pool, &which, &now), PSHARD_OK);
    assert_true(now.dense[0][0] == 0 && now.dense[1][0] > 0 && now.experts[0][0] == 0);

    /* The bench the GPU's measuring runs CPU experts beside it with: a step of 16 tokens fits. */
    struct cpu_bench b;
    assert_int_equal(measure_cpu_experts_open(&sh, pool, 16, &b), PSHARD_OK);
    assert_true(b.n_tokens == 16 && b.k == 2 && b.gate.data && b.up.data && b.down.data);
    measure_cpu_experts_step(&b, 0);
    float sum = 0;
    for (int i = 0; i < 16 * 256; i++) sum += fabsf(b.y[i]);
    assert_true(sum > 0 && isfinite(sum));
    measure_cpu_bench_close(&b);
    threadpool_free(pool);
}

/* measure_cpu_now times the figures that follow host memory again, in the formats the profile
 * has, and leaves the rest of the profile as it was. */
static void test_measure_now(void **state) {
    (void)state;
    struct profile p;
    profile_defaults(&p);
    memset(p.cpu_matmul, 0, sizeof p.cpu_matmul), memset(p.cpu_experts, 0, sizeof p.cpu_experts);
    struct profile_rate *q4 = profile_rate_add(p.cpu_matmul, "Q4_0");
    for (int i = 0; i < PROFILE_TOKENS; i++) q4->s_per_byte[i] = 1; /* a second a byte: nothing runs so slowly */
    p.host_read_gbps = 0.001;
    struct profile before = p;
    assert_int_equal(measure_cpu_now(NULL, 2, &p), PSHARD_OK); /* no model: 4096-wide Q4_0, Q8_0, F16 shapes */
    assert_true(p.host_read_gbps > 0.1 && isfinite(p.host_read_gbps));
    for (int i = 0; i < CPU_SAMPLE_DENSE; i++) assert_true(q4->s_per_byte[i] > 0 && q4->s_per_byte[i] < 1e-6);
    for (int i = CPU_SAMPLE_DENSE; i < PROFILE_TOKENS; i++) assert_true(q4->s_per_byte[i] == 1);
    assert_null(profile_rate_find(p.cpu_matmul, "Q8_0")); /* not in the profile: not added */
    assert_null(profile_rate_find(p.cpu_experts, "Q4_0"));
    assert_memory_equal(p.cpu_attn, before.cpu_attn, sizeof p.cpu_attn);
    assert_memory_equal(p.gpu_matmul, before.gpu_matmul, sizeof p.gpu_matmul);
    assert_true(p.h2d_gbps[0] == before.h2d_gbps[0] && p.cpu_step_s == before.cpu_step_s);
}

/* A table timed more than once (the in-place expert rates) keeps each point's median over the
 * samples; a point one sample lacks stays as it was. */
static void test_median_table(void **state) {
    (void)state;
    double v[MEASURE_SAMPLES][PROFILE_TOKENS], out[PROFILE_TOKENS];
    for (int i = 0; i < PROFILE_TOKENS; i++) v[0][i] = 1 + i, v[1][i] = 5 + i, v[2][i] = 2 + i, out[i] = -1;
    v[1][3] = 0; /* not measured in the second sample */
    measure_median_table(v, 3, out);
    assert_true(out[0] == 2 && out[PROFILE_TOKENS - 1] == 2 + PROFILE_TOKENS - 1);
    assert_true(out[3] == -1);
    measure_median_table(v, 2, out); /* two samples: their mean */
    assert_true(out[0] == 3 && out[1] == 4 && out[3] == -1);
    measure_median_table(v, 1, out);
    assert_true(out[0] == 1 && out[3] == 4);
    out[0] = -1;
    measure_median_table(v, 0, out); /* none: nothing changes */
    measure_median_table(v, MEASURE_SAMPLES + 1, out);
    assert_true(out[0] == -1 && out[1] == 2);
}

/* The fill pattern's bytes all lie in [0x1c, 0x3b], at any length, and vary. */
static void test_fill_pattern(void **state) {
    (void)state;
    uint8_t buf[1029];
    memset(buf, 0, sizeof buf);
    measure_fill(buf, sizeof buf, 3);
    int seen[256] = {0};
    for (size_t i = 0; i < sizeof buf; i++) {
        assert_true(buf[i] >= 0x1c && buf[i] <= 0x3b);
        seen[buf[i]] = 1;
    }
    int distinct = 0;
    for (int v = 0; v < 256; v++) distinct += seen[v];
    assert_int_equal(distinct, 32);
    uint8_t other[1029];
    measure_fill(other, sizeof other, 4); /* another seed, other bytes */
    assert_true(memcmp(buf, other, sizeof buf) != 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),          cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_unmeasured_points_hold),
        cmocka_unit_test(test_path),              cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_refuses_another_machine), cmocka_unit_test(test_refuses_old_and_other_versions),
        cmocka_unit_test(test_refuses_malformed), cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_save_refuses_nan),  cmocka_unit_test(test_interpolation), cmocka_unit_test(test_attention_by_cache_length),
        cmocka_unit_test(test_rate_tables),       cmocka_unit_test(test_gpu_measure_room),
        cmocka_unit_test(test_cpu_samples_settle), cmocka_unit_test(test_measure_now),
        cmocka_unit_test(test_median_table),
        cmocka_unit_test(test_fill_pattern),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
