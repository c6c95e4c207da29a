/* `pshard profile`: measure this machine for the planner (under a minute), save the profile in
 * the user's cache directory, and print what was measured. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "engine/tools_api.h"

static void print_usage(FILE *out) {
    fprintf(out, "usage: pshard profile [-m MODEL] [-t THREADS] [--vram-budget SIZE] [--cpu-only] [--show]\n"
                 "  Measures what the planner's cost model needs -- CPU and GPU kernels on the model's shapes\n"
                 "  and formats at 1 to 1024 tokens, host memory, PCIe copies by size, reads of host memory\n"
                 "  in place, launch and hand-off latencies, and copies and CPU work run together -- in\n"
                 "  under a minute, and saves it in the cache directory ($PSHARD_CACHE_DIR, else\n"
                 "  $XDG_CACHE_HOME/pshard or ~/.cache/pshard), one file per CPU, thread count, GPU and\n"
                 "  driver. `pshard run` does this on first use of an automatic plan under a budget, taking\n"
                 "  no more device memory than the budget besides the CUDA context; --vram-budget does the\n"
                 "  same here (else measuring takes about 3 GB; under a budget its loops run on smaller sets).\n"
                 "  --show prints the cached profile without measuring, with what runs taught it per model.\n");
}

static struct cli_measuring measuring = {.who = "pshard profile", .label = "measuring"};

/* Weight bytes per second of a rate table's rows at each token count. */
static void print_rates(const char *title, const struct profile_rate table[PROFILE_FORMATS]) {
    for (int f = 0; f < PROFILE_FORMATS; f++) {
        if (!table[f].format[0] || table[f].s_per_byte[0] <= 0) continue;
        printf("  %-12s %-6s", title, table[f].format);
        for (int i = 0; i < PROFILE_TOKENS; i++) printf(" %9.3g", 1e-9 / table[f].s_per_byte[i]);
        printf("\n");
    }
}

/* What running taught: measured over predicted step time per model, plan family and step size. */
static void print_learned(const struct profile *p) {
    for (int i = 0; i < PROFILE_MODELS && p->refine[i].model[0]; i++) {
        printf("  learned from runs of %s (measured / predicted at 1 ... 1024 tokens per step):\n", p->refine[i].model);
        for (int f = 0; f < PROFILE_FAMILIES; f++) {
            bool any = false;
            for (int k = 0; k < PROFILE_TOKENS; k++) any |= p->refine[i].scale[f][k] > 0;
            if (!any) continue;
            printf("    %-10s", plan_family_name((enum plan_family)f));
            for (int k = 0; k < PROFILE_TOKENS; k++)
                p->refine[i].scale[f][k] > 0 ? printf(" %6.2f", p->refine[i].scale[f][k]) : printf(" %6s", "-");
            printf("\n");
        }
    }
}

/* GB/s at each token count from seconds per byte. */
static void print_gbps(const double s_per_byte[PROFILE_TOKENS]) {
    for (int i = 0; i < PROFILE_TOKENS; i++) printf(" %9.3g", s_per_byte[i] > 0 ? 1e-9 / s_per_byte[i] : 0);
}

/* The GPU's part: attention, copies, reads in place, latencies, and work run together. */
static void print_gpu(const struct profile *p) {
    printf("  %-19s", "KV GB/s: GPU attn");
    for (int i = 0; i < PROFILE_TOKENS; i++) printf(" %9.1f", p->gpu_attn[i] > 0 ? 1e-9 / p->gpu_attn[i] : 0);
    printf("\n  pinned copies GB/s by size:");
    for (int i = 0; i < PROFILE_SIZES; i++) printf(" %.0fK %.1f/%.1f", profile_sizes[i] / 1024.0, p->h2d_gbps[i], p->d2h_gbps[i]);
    printf(" (H2D/D2H)\n");
    printf("  %-19s", "in place: matmul");
    print_gbps(p->zero_copy);
    printf(" (aligned)\n  %-19s", "");
    print_gbps(p->zero_copy_off);
    printf(" (%d bytes past 256)\n  %-19s", p->in_place_skew, "in place: experts");
    print_gbps(p->zero_copy_experts);
    printf(" (aligned; one token's call: %.1f us besides its bytes)\n  %-19s", p->zero_copy_expert_call_s * 1e6, "");
    print_gbps(p->zero_copy_experts_off);
    printf(" (%d bytes past 256)", p->in_place_skew);
    printf("\n  launch %.1f us, graph node %.2f us, small kernel %.1f us, sync %.1f us, hand-off %.1f us (in a graph "
           "%.1f us), CPU expert call %.1f us, GPU attention call %.1f us besides its cells\n",
           p->launch_s * 1e6, p->graph_node_s * 1e6, p->kernel_s * 1e6, p->sync_s * 1e6, p->round_trip_s * 1e6,
           p->graph_round_trip_s * 1e6, p->cpu_moe_call_s * 1e6, p->gpu_attn_call_s * 1e6);
    printf("  together: a copy keeps %.0f%% of its speed while the CPU computes, the CPU %.0f%% of its; "
           "reads in place keep %.0f%%, the CPU %.0f%%",
           100 * p->h2d_share_under_cpu, 100 * p->cpu_share_under_h2d, 100 * p->reads_share_under_cpu,
           100 * p->cpu_share_under_reads);
    printf("; experts read in place keep %.0f%% beside the CPU's experts, which keep %.0f%% (steps of %d tokens: "
           "%.0f%% and %.0f%%)\n",
           100 * p->expert_reads_share_under_cpu, 100 * p->cpu_share_under_expert_reads, PROFILE_SPLIT_TOKENS,
           100 * p->expert_reads_share_under_cpu_16, 100 * p->cpu_share_under_expert_reads_16);
}

static void print_profile(const struct profile *p, const char *path) {
    printf("profile %s\n  CPU %s, %d threads; GPU %s (driver %d); pshard %s; %s in %.1f s\n", path, p->fp.cpu, p->fp.threads,
           p->fp.gpu[0] ? p->fp.gpu : "none", p->fp.driver, p->pshard, p->measured ? "measured" : "defaults", p->seconds);
    printf("  host memory read %.1f GB/s (served %.1f GB/s to the CPU and the GPU at once); a CPU job costs %.1f us\n",
           p->host_read_gbps, p->host_served_gbps, p->cpu_step_s * 1e6);
    printf("  weight GB/s at tokens per step:");
    for (int i = 0; i < PROFILE_TOKENS; i++) printf(" %9d", profile_tokens[i]);
    printf("\n");
    print_rates("CPU matmul", p->cpu_matmul);
    print_rates("CPU experts", p->cpu_experts);
    if (p->cpu_router[0] > 0) {
        printf("  %-19s", "CPU router");
        for (int i = 0; i < PROFILE_TOKENS; i++) printf(" %9.3g", 1e-9 / p->cpu_router[i]);
        printf("\n");
    }
    if (p->has_gpu) {
        print_rates("GPU matmul", p->gpu_matmul);
        print_rates("GPU experts", p->gpu_experts);
    }
    printf("  %-19s", "KV GB/s: CPU attn");
    for (int i = 0; i < PROFILE_TOKENS; i++) printf(" %9.1f", p->cpu_attn[i] > 0 ? 1e-9 / p->cpu_attn[i] : 0);
    printf("\n");
    if (p->has_gpu) print_gpu(p);
    print_learned(p);
}


int cmd_profile(int argc, char **argv) {
    const char *model_path = NULL;
    int threads = 0;
    bool cpu_only = false, show = false;
    int64_t vram_cap = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-m") && v) {
            model_path = argv[++i];
        } else if (!strcmp(argv[i], "-t") && v) {
            int64_t k;
            if (cli_int("profile", argv[i], argv[i + 1], 1, 1024, &k)) return 2;
            threads = (int)k, i++;
        } else if (!strcmp(argv[i], "--vram-budget") && v) {
            if (cli_size("profile", argv[i], argv[i + 1], &vram_cap)) return 2;
            if (vram_cap <= 0) {
                fprintf(stderr, "pshard profile: --vram-budget takes a size of device memory above 0 (--cpu-only "
                                "measures the CPU alone), got '%s'\n", argv[i + 1]);
                return 2;
            }
            i++;
        } else if (!strcmp(argv[i], "--cpu-only")) {
            cpu_only = true;
        } else if (!strcmp(argv[i], "--show")) {
            show = true;
        } else {
            cli_refuse("profile", argv[i], "-m -t --vram-budget");
            print_usage(stderr);
            return 2;
        }
    }
    struct gguf_file *file = NULL;
    struct model model;
    const struct model *m = NULL;
    if (model_path) {
        if (gguf_open(model_path, &file) != PSHARD_OK || model_load(file, &model) != PSHARD_OK) {
            fprintf(stderr, "pshard profile: %s\n", pshard_last_error());
            if (file) gguf_close(file);
            return 1;
        }
        m = &model;
    }
    const int n_threads = threads > 0 ? threads : 0;
    struct profile p;
    bool measured_now = false;
    pshard_status st;
    if (show) {
        st = measure_machine_profile(m, n_threads, 0, PROFILE_CACHED, cli_measure_progress, &measuring, &p, &measured_now);
        if (st == PSHARD_OK && !p.measured) {
            fprintf(stderr, "pshard profile: no profile is cached for this machine; run `pshard profile`\n");
            st = PSHARD_ERR_NOT_FOUND;
        }
    } else {
        /* A usable cached profile is extended (this model's formats added); else a fresh one. */
        if (cpu_only || measure_machine_profile(m, n_threads, 0, PROFILE_CACHED, NULL, NULL, &p, &measured_now) != PSHARD_OK ||
            !p.measured)
            profile_defaults(&p);
        struct measure_request req = {m, n_threads, !cpu_only, cli_measure_progress, &measuring, vram_cap};
        st = measure_profile(&req, &p);
        if (st == PSHARD_OK) {
            /* The fingerprint the cache is keyed by: this GPU as the driver names it. */
            char name[256] = "";
            int driver = 0;
            const bool gpu = !cpu_only && cuda_device_count() > 0 &&
                             cuda_device_identify(0, name, sizeof name, &driver) == PSHARD_OK;
            profile_fingerprint_here(p.fp.threads, gpu ? name : NULL, gpu ? driver : 0, &p.fp);
        }
    }
    char path[4096] = "";
    if (st == PSHARD_OK) st = profile_path(&p.fp, path, sizeof path);
    if (st == PSHARD_OK && !show) st = profile_save(path, &p);
    if (file) {
        model_free(&model);
        gguf_close(file);
    }
    if (st != PSHARD_OK) {
        cli_measure_end_line(&measuring);
        if (!show || p.measured) fprintf(stderr, "pshard profile: %s\n", pshard_last_error());
        return 1;
    }
    print_profile(&p, path);
    struct stat sb;
    if (!show && stat(path, &sb) == 0) printf("saved %s (%lld bytes)\n", path, (long long)sb.st_size);
    return 0;
}
