/* The machine profile: what `pshard profile` measured on this machine, the numbers the cost
 * model predicts from. Stored as JSON in the user's cache directory, one file per hardware
 * fingerprint (CPU model and threads, GPU and driver); a profile measured on other hardware,
 * by another pshard version or format version, or too old, is not used.
 *
 * Rates are seconds per byte of weights (or of KV cache) for a step of n new tokens, measured
 * at the token counts of profile_tokens[]; the cost model interpolates between them in log n.
 * A profile holds the tensor formats it was measured for; the formats of a model about to run
 * are added to it when missing. */
#ifndef PLAN_PROFILE_H
#define PLAN_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pshard.h"

/* Changes with the points measured, how one is measured, or the kernels timed: a profile of
 * another version holds rates of other kernels or other probes, so it is measured again. */
#define PROFILE_VERSION 34
enum {
    PROFILE_TOKENS = 6,   /* token counts: 1, 4, 16, 64, 256, 1024 */
    PROFILE_SIZES = 5,    /* transfer sizes: 64 KiB, 512 KiB, 4 MiB, 32 MiB, 128 MiB */
    PROFILE_FORMATS = 8,  /* tensor formats per profile */
    PROFILE_MAX_AGE_DAYS = 90,
    PROFILE_FAMILIES = 5, /* auto, cpu, gpu, static, dynamic */
    PROFILE_MODELS = 8,   /* models whose step times are learned from (the latest kept) */
    PROFILE_PROMPT_ATTN = 64, /* GPU attention is timed with the split-KV kernel below this many tokens
                                 and the prompt kernel (a full tile of queries) from it; a model's
                                 steps change kernels where the executor says (plan_kernels), and the
                                 cost model follows them */
    /* GPU attention is measured over two caches: split-KV steps attend PROFILE_ATTN_CELLS cells
     * and PROFILE_ATTN_LONG_CELLS, prompt steps a window of PROFILE_ATTN_WINDOW and
     * PROFILE_ATTN_LONG_WINDOW cells, since the rate per cell depends on the length (a long
     * cache reads faster per KV byte). */
    PROFILE_ATTN_CELLS = 4096,
    PROFILE_ATTN_LONG_CELLS = 32768,
    PROFILE_ATTN_WINDOW = 1024,
    PROFILE_ATTN_LONG_WINDOW = 8192,
    PROFILE_SPLIT_TOKENS = 16, /* a split MoE layer's prompt step, as measured beside the CPU */
};
extern const int32_t profile_tokens[PROFILE_TOKENS];
extern const uint64_t profile_sizes[PROFILE_SIZES];

/* One operation on one tensor format: seconds per weight byte at each token count. */
struct profile_rate {
    char format[16]; /* the type's name as quant_type_name() gives it, e.g. "Q4_0"; "" = unused slot */
    double s_per_byte[PROFILE_TOKENS];
};

/* What running one model taught the cost model (see struct profile's refine). */
struct profile_refine {
    char model[64]; /* the model's key (cost_model_key), "" = unused slot */
    double scale[PROFILE_FAMILIES][PROFILE_TOKENS];
};

struct profile_fingerprint {
    char cpu[128];   /* the CPU's model name */
    int32_t threads; /* threads the CPU rates were measured with */
    char gpu[128];   /* the GPU's name, "" without one */
    int32_t driver;  /* the CUDA driver's version, 0 without a GPU */
};

struct profile {
    int32_t version;  /* PROFILE_VERSION */
    char pshard[16];  /* PSHARD_VERSION that measured it */
    struct profile_fingerprint fp;
    int64_t created;  /* seconds since the epoch */
    bool measured;    /* false: the conservative defaults (nothing measured) */
    double seconds;   /* how long measuring took */

    /* Host memory and the CPU (at fp.threads threads). */
    double host_read_gbps;                           /* streaming read of host memory, GB/s */
    double host_served_gbps; /* host memory served to the CPU and the GPU at once in the probes that run
                                them together (GB/s; 0: not measured): their shared ceiling is at least
                                this, and the CPU's cores alone may not reach it (host_read_gbps) */
    struct profile_rate cpu_matmul[PROFILE_FORMATS]; /* dense matrix times n tokens */
    struct profile_rate cpu_experts[PROFILE_FORMATS];/* one expert's matrices times its tokens */
    double cpu_router[PROFILE_TOKENS];               /* seconds per byte of an MoE layer's router matrix
                                                        (n_expert rows, in its format) times n tokens: a
                                                        small matrix runs below a large one's rate; 0 where
                                                        unmeasured (a dense model: cpu_matmul prices it) */
    double cpu_attn[PROFILE_TOKENS];                 /* seconds per KV byte per query head that reads it
                                                        (a KV head serves n_head / n_head_kv), per new token */
    double cpu_step_s;                               /* fixed cost of a CPU shard (thread pool wake) */
    double cpu_moe_call_s;                           /* fixed cost of computing some experts on the CPU */

    /* The GPU (zero in a measured profile without one; the defaults fill it, has_gpu false). */
    bool has_gpu;
    struct profile_rate gpu_matmul[PROFILE_FORMATS];   /* weights resident in VRAM */
    struct profile_rate gpu_experts[PROFILE_FORMATS];
    double gpu_attn[PROFILE_TOKENS];                   /* seconds per KV byte read per new token */
    double gpu_attn_long[PROFILE_TOKENS];              /* the same over the long cache (or window) */
    double gpu_attn_call_s; /* an attention call of a step below 64 tokens (the split-KV kernel) costs
                               this besides its cells: the kernel's fixed part, apart from gpu_attn */
    double h2d_gbps[PROFILE_SIZES], d2h_gbps[PROFILE_SIZES]; /* pinned copies by size */
    /* Kernels reading registered host memory in place, seconds per weight byte at each token
     * count (a kernel may read its weights more than once when it takes many tokens): a dense
     * matmul, and the expert kernel per byte of the experts the tokens chose; from 128-byte
     * aligned memory, and (_off, format 14) from in_place_skew bytes past 256, not a multiple of
     * 128: the profiled model's weights' offset, or 32 where that was aligned. A model's reads
     * take the table of its own weights' alignment (profile_in_place). */
    double zero_copy[PROFILE_TOKENS], zero_copy_experts[PROFILE_TOKENS];
    double zero_copy_off[PROFILE_TOKENS], zero_copy_experts_off[PROFILE_TOKENS];
    int32_t in_place_skew;
    /* One token's expert call reading n experts in place takes this plus their bytes at
     * zero_copy_experts[0] (fitted from calls of 2 and of k experts: a call of few experts costs
     * more than their share of k experts' bytes says). */
    double zero_copy_expert_call_s;
    double launch_s;          /* one kernel launch, queued */
    double graph_node_s;      /* one kernel of a replayed CUDA graph */
    double kernel_s;          /* a small kernel's shortest run (a matvec of a few rows, in a graph) */
    double sync_s;            /* host waits for an idle stream */
    double round_trip_s;      /* a CPU/GPU hand-off as the executor makes it: the host waits on an event
                                 after GPU work, runs thread-pool jobs, copies back, the GPU goes on */
    double graph_round_trip_s; /* the same inside a replayed graph: the GPU raises a flag the host polls,
                                  the host raises one the GPU polls */
    /* Measured together: a pinned copy while the CPU runs matmuls, and those matmuls while
     * the copy runs, each as a fraction of its rate alone (1: no interference). */
    double h2d_share_under_cpu, cpu_share_under_h2d;
    /* The same with a kernel reading host memory in place (how decode steps stream) instead. */
    double reads_share_under_cpu, cpu_share_under_reads;
    /* And with the expert kernel reading one token's experts in place beside the CPU computing
     * one token's experts (how a split MoE layer's decode step runs), then the same for steps of
     * PROFILE_SPLIT_TOKENS tokens (format 13): the CPU's experts of many tokens kept less of
     * their speed beside the reads than one token's did (see cost.c, expert_shares). Measured
     * with a model that has experts; until then, the defaults. */
    double expert_reads_share_under_cpu, cpu_share_under_expert_reads;
    double expert_reads_share_under_cpu_16, cpu_share_under_expert_reads_16;

    /* Learned while running, per model (what the cost model misses differs by model): measured
     * over predicted step time, per plan family (in enum plan_family's order) and size of step
     * (index i: from profile_tokens[i] tokens up to the next, like the plan's tiers); 0 =
     * nothing learned yet. The cost model scales its predictions by these (see cost_learn). */
    struct profile_refine refine[PROFILE_MODELS];
};

/* The conservative defaults used when nothing was measured (`--no-profile`): a slow CPU, PCIe
 * 3 x16, a mid-range GPU. Formats are filled for common types (pshard knows more than a table holds). */
void profile_defaults(struct profile *p);

/* The fingerprint of this machine: the CPU from /proc/cpuinfo, `threads`, and the GPU's name and
 * driver version as given (empty/0 without a GPU). */
void profile_fingerprint_here(int32_t threads, const char *gpu, int32_t driver, struct profile_fingerprint *fp);

/* Where this fingerprint's profile lives: $PSHARD_CACHE_DIR, else $XDG_CACHE_HOME/pshard, else
 * ~/.cache/pshard; the file is profile-<16 hex digits of a hash of the fingerprint>.json. */
pshard_status profile_path(const struct profile_fingerprint *fp, char *out, size_t out_size);

/* Read a profile. PSHARD_ERR_NOT_FOUND: no file; PSHARD_ERR_FORMAT: malformed (the message
 * says what); PSHARD_ERR_RANGE: well-formed but not usable here -- another machine's
 * fingerprint, another version, or older than PROFILE_MAX_AGE_DAYS (the message says which). */
pshard_status profile_load(const char *path, const struct profile_fingerprint *here, struct profile *out);
/* Write a profile (atomically: a temporary file renamed over the old one), creating the folder. */
pshard_status profile_save(const char *path, const struct profile *p);

/* The rate slot of a format in a table, or NULL; profile_rate_add returns a free slot named
 * `format` (NULL when the table is full or the name is longer than 15 characters). */
const struct profile_rate *profile_rate_find(const struct profile_rate table[PROFILE_FORMATS], const char *format);
struct profile_rate *profile_rate_add(struct profile_rate table[PROFILE_FORMATS], const char *format);

/* Interpolations in log n (token counts) or log size, clamped at the measured ends. */
double profile_at_tokens(const double values[PROFILE_TOKENS], double n_tokens);
/* The index of the last of profile_tokens[] at or below n_tokens (0 below the first). */
int profile_token_index(int32_t n_tokens);
double profile_at_size(const double values[PROFILE_SIZES], double bytes);
/* The GPU's attention rate (seconds per KV byte per new token) for steps of n tokens attending
 * `cells` cells on average, run by the prompt kernel or the split-KV one (from the points that
 * kernel was timed at): between the two caches' rates in log cells, clamped at each. */
double profile_gpu_attn(const struct profile *p, double n_tokens, double cells, bool prompt);

/* The in-place read rates (seconds per byte by token count; experts or dense) for weights that
 * lie `skew` bytes past 256 in their file: the aligned table where skew is a multiple of 128. */
const double *profile_in_place(const struct profile *p, uint32_t skew, bool experts);

#endif
