/* What the measuring code shares: measure.c (the model's shapes, timed loops, synthetic
 * weights, the order of it all), measure_cpu.c (the CPU's rates) and measure_gpu.c (the GPU's,
 * PCIe, latencies, and work run together). */
#ifndef MEASURE_INTERNAL_H
#define MEASURE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "cpu/attention.h"
#include "cpu/cpu_ops.h"
#include "cpu/moe.h"
#include "measure/measure.h"

enum {
    BIG_BYTES = 384 << 20,   /* working set of bandwidth-bound loops: past any L3 */
    SMALL_BYTES = 48 << 20,  /* compute-bound loops (many tokens) */
    ATTN_CTX = PROFILE_ATTN_CELLS,           /* cells a decode token attends */
    ATTN_CTX_PROMPT = PROFILE_ATTN_WINDOW,   /* cells each prompt token attends (prompt steps) */
};

/* The model's shapes and formats to measure. */
struct shapes {
    int64_t n_embd, rows, n_ff_exp;
    int n_expert, k;
    bool has_router;          /* an MoE layer's router: n_expert rows of n_embd, in format `router` */
    enum quant_type router;
    struct cpu_attn_shape attn;
    enum quant_type dense[PROFILE_FORMATS], gate[PROFILE_FORMATS], down[PROFILE_FORMATS];
    int n_dense, n_moe;
    /* The model's weights_skew (0 without a model): kernels reading weights in place are timed
     * from aligned memory and from this far past 256 bytes (32 where it is a multiple of 128). */
    size_t host_skew;
};

void measure_shapes_of(const struct model *m, struct shapes *s);

typedef void (*step_fn)(void *arg, int rep);
/* Mean seconds of one call of fn after a warm-up call, over at least 2 calls and TARGET_S. */
double measure_time_steps(step_fn fn, void *arg);
/* The best of three such means: a loop that shares the machine with something else for a moment
 * (the kernel settling after a large write, another process) reads slower, never faster. */
double measure_time_best(step_fn fn, void *arg);

/* Past the time budget: measuring adds no more formats or optional figures. */
bool measure_out_of_time(void);
void measure_report(const struct measure_request *req, const char *what, double done);

/* Bytes of the fill pattern: each byte in [0x1c, 0x3b], so every 16- and 32-bit float is normal,
 * and F32 and BF16 weights (top byte up to 0x3b: up to about 2^-9) keep the sums of an expert's
 * three matmuls normal too. */
void measure_fill(uint8_t *p, size_t n, uint32_t seed);

/* Figures timed more than once keep their median: at most MEASURE_SAMPLES samples. *out becomes
 * the median of v[0..n) where every one was measured (above 0); else it stays. */
enum { MEASURE_SAMPLES = 3 };
void measure_median(const double *v, int n, double *out);
/* The same for each token count of a table of n samples. */
void measure_median_table(const double (*v)[PROFILE_TOKENS], int n, double out[PROFILE_TOKENS]);

/* n copies of a rows x cols matrix (copies cycle, so a loop reads fresh memory each call). */
struct synth {
    struct cpu_matrix m;
    size_t bytes; /* one copy */
    int copies;
    uint8_t *data;
};

pshard_status measure_synth_make(enum quant_type type, int64_t rows, int64_t cols, int64_t experts, size_t want,
                                 struct synth *s);
struct cpu_matrix measure_synth_copy(const struct synth *s, int rep);

/* State of the CPU's timed loops (also used for routing and CPU work beside the GPU). */
struct cpu_bench {
    struct threadpool *pool;
    float *x, *y;
    void *acts;
    int64_t n_tokens;
    struct synth gate, up, down;
    /* experts */
    int32_t *ids;
    float *weights;
    struct moe_scratch scratch;
    void *scratch_mem;
    int k;
    uint64_t touched_bytes;
    /* attention */
    const struct cpu_attn_shape *attn;
    struct cpu_attn_units attn_units; /* as the executor cuts a step of n_tokens (cpu_attention_units) */
    uint16_t *kv, *kv_at; /* kv_copies copies of a layer's cache, each kv_elems; kv_at: this rep's */
    size_t kv_elems;
    int kv_copies;
    int64_t cells;
    float *q, *out, *partial; /* partial: a split attention step's (cpu_attention_partial_floats_max) */
    /* host reads */
    const uint64_t *mem;
    size_t mem_words;
    uint64_t sums[256];
};

void measure_cpu_matmul_step(void *arg, int rep);
/* A step's experts (b->n_tokens tokens), routed at random (rep seeds the routing). */
void measure_cpu_experts_step(void *arg, int rep);
/* A bench computing n_tokens tokens' experts of the model's first expert formats, as a split
 * MoE layer's step does (for work beside the GPU's); closed with measure_cpu_bench_close, which
 * frees what any cpu_bench holds. */
pshard_status measure_cpu_experts_open(const struct shapes *sh, struct threadpool *pool, int64_t n_tokens,
                                       struct cpu_bench *b);
void measure_cpu_bench_close(struct cpu_bench *b);
void measure_route_random(struct cpu_bench *b, int n_expert, int rep);
void measure_empty_job(void *arg, int thread, int n_threads);

/* The machine's CPU clock: all cores' busy time (steal included), this process's own CPU time,
 * and the wall clock. */
struct measure_cpu_clock {
    double busy_s, own_s, wall_s;
};
bool measure_cpu_clock(struct measure_cpu_clock *c);
/* Other work's share of all the cores since `from` (0 to 1): what other processes (and other
 * virtual machines, as steal) took; -1 where it cannot be read (no /proc/stat, under 50 ms). */
double measure_others_share(const struct measure_cpu_clock *from);

pshard_status measure_cpu_rates(const struct measure_request *req, const struct shapes *sh, struct threadpool *pool,
                                struct profile *p);

/* The CPU's figures that follow the host memory's load from other work at the moment they are
 * timed: host reads, dense matmuls of up to 4 tokens and experts of up to 16 (seconds per byte,
 * per format in the order of struct shapes; 0 where not measured). On a host shared with other
 * work they drift from moment to moment (bench/RESULTS.md), so the profile times them up to
 * CPU_SAMPLES times, the first with the rest of the CPU's rates, the second straight after and
 * the third once the GPU's are done (while the minute lasts), and keeps each figure's median. */
enum { CPU_SAMPLE_DENSE = 2, CPU_SAMPLE_EXPERTS = 3, CPU_SAMPLES = MEASURE_SAMPLES };
struct cpu_sample {
    double host_read_gbps;
    double dense[PROFILE_FORMATS][CPU_SAMPLE_DENSE];
    double experts[PROFILE_FORMATS][CPU_SAMPLE_EXPERTS];
};
/* The figures timed now: host reads, and the formats `which` has (0 for the others, and for
 * those past the time budget). */
pshard_status measure_cpu_sample(const struct shapes *sh, struct threadpool *pool, const struct cpu_sample *which,
                                 struct cpu_sample *s);
/* The figures as p holds them. */
void measure_cpu_sample_of(const struct profile *p, const struct shapes *sh, struct cpu_sample *s);
/* Each of p's figures of the n samples (CPU_SAMPLES at most) becomes its median over them, where
 * every sample has it. */
void measure_cpu_settle(const struct shapes *sh, const struct cpu_sample *s, int n, struct profile *p);

/* The device memory measuring the GPU takes: its arena (the fixed buffers, `fixed` bytes, and room
 * for matrices), the working set of its bandwidth-bound loops (`big`, up to BIG_BYTES; four of them
 * at once) and how many of a layer's n_expert experts (`expert_bytes` each, gate, up and down) it
 * holds. By default the arena is 6 BIG_BYTES, 768 MB and the work buffer; under a cap (a run's
 * VRAM budget), the cap where that holds the fixed buffers and six working sets of MIN_BIG_BYTES
 * (else that much, over_cap), the working sets shrunk to a sixth of the room and the experts to
 * what the room holds (at least k, where that many fit). */
enum { MIN_BIG_BYTES = 64 << 20 };
struct gpu_room {
    size_t arena, big;
    int64_t experts;
    bool over_cap;
};
void measure_gpu_room(size_t fixed, size_t work_bytes, uint64_t expert_bytes, int64_t n_expert, int k, int64_t cap,
                      struct gpu_room *out);
pshard_status measure_gpu_rates(const struct measure_request *req, const struct shapes *sh, struct threadpool *pool,
                                struct profile *p);

#endif
