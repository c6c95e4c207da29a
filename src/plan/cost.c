/* The cost model (see cost.h). */
#include "plan/cost.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant/types.h"

/* Small kernels a shard launches on the GPU besides its matrix products (norms, rope, KV store,
 * attention, routing, adds; each costs at least the kernel floor), and jobs it hands the CPU's
 * thread pool besides one per matrix. An MoE shard's expert calls add their own (below). */
static const int extra_kernels[SHARD_KIND_COUNT] = {1, 7, 3, 6, 2};
/* Launches the host makes: per matrix product (the activations' conversion, the product), per
 * expert call (grouping, two conversions, three products, the gated unit, the weighted sum), and
 * per CPU/GPU hand-off of a split layer (an event or flag, and the add that reads the CPU's sum in
 * place; the kernels before it write the input down themselves). */
enum { MATRIX_OPS = 2, EXPERT_CALL_OPS = 8, HAND_OFF_OPS = 2 };
static const int extra_jobs[SHARD_KIND_COUNT] = {0, 3, 2, 3, 1};

double cost_expert_rate_of(const double values[PROFILE_TOKENS], double E, double k, double n) {
    /* The share of experts touched, per token: the time per pair over time per touched byte. */
    double per_pair[PROFILE_TOKENS];
    for (int i = 0; i < PROFILE_TOKENS; i++) {
        const double t = profile_tokens[i];
        per_pair[i] = values[i] * cost_touched(1, E, k, t) / t;
    }
    const double share = cost_touched(1, E, k, n);
    return share > 0 ? profile_at_tokens(per_pair, n) * n / share : profile_at_tokens(values, n);
}

/* A rate table at n tokens: the format's row, or the slowest row when the format was not
 * measured (a conservative guess); experts (E > 0) by token-expert pairs, the rest per byte
 * (cost_expert_rate_of of no experts). */
static double table_rate(const struct profile_rate table[PROFILE_FORMATS], uint32_t type, double E, double k, double n) {
    const struct profile_rate *r = profile_rate_find(table, quant_type_name(type));
    if (r && r->s_per_byte[0] > 0) return cost_expert_rate_of(r->s_per_byte, E, k, n);
    double worst = 0;
    for (int i = 0; i < PROFILE_FORMATS; i++)
        if (table[i].format[0]) worst = fmax(worst, cost_expert_rate_of(table[i].s_per_byte, E, k, n));
    return worst > 0 ? worst : 1e-9;
}

double cost_rate(const struct profile_rate table[PROFILE_FORMATS], uint32_t type, double n) {
    return table_rate(table, type, 0, 0, n);
}

double cost_expert_rate(const struct profile_rate table[PROFILE_FORMATS], uint32_t type, double E, double k, double n) {
    return table_rate(table, type, E, k, n);
}

static double gbps_s(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e9) : 0; }

double cost_copy_s(const struct profile *prof, double bytes, bool up) {
    return gbps_s(bytes, profile_at_size(up ? prof->h2d_gbps : prof->d2h_gbps, bytes));
}

enum { COST_CPU_SPANS = 512 }; /* the CPU spans a ring tier's walk keeps (more are not weighed) */

/* Where a step's work stands as the walk goes on. */
struct walk {
    const struct profile *prof;
    const struct model *m;
    const struct plan *p;
    const struct plan_tier *t;
    double n, n_out, ctx; /* tokens, output rows of the head, mean attended cells */
    double carried;       /* KV-up: cells cached before the step, of every sequence in it */
    bool graph, on_gpu;
    struct cost_step *out;
    /* A ring tier's copies, on their own clock: they run ahead while the GPU computes other
     * units and while the CPU computes (a static tier's CPU FFNs, a dense gpu tier's attention
     * of layers whose KV cache is in host memory), so a sum of max(copy, compute) shard by
     * shard would overstate the step. The ring unit the walk is at, when the copy stream is free,
     * when each slot's reader is done (all on the step's clock, out->seconds). */
    uint32_t unit;
    double copy_free, slot_free[PLAN_STAGING_SLOTS];
    /* ... and when the CPU computed, reading host memory at what rate: a copy scheduled into that
     * time shares host memory with it. */
    int n_cpu;
    struct { double from, to, bps; } cpu[COST_CPU_SPANS];
};

/* The GPU's busy time for a shard: its matrices' and attention's compute, plus its small
 * kernels (a norm, rope, routing, an add), each at least its shortest run. Replayed as a graph,
 * a node follows the last within graph_node_s; launched one by one, the host's `ops` launches
 * pace the GPU whenever its kernels are shorter than a launch (decode steps). */
double cost_gpu_busy_s(const struct profile *pr, double compute_s, int small_kernels, int ops, bool graph) {
    if (graph) return compute_s + small_kernels * (pr->graph_node_s > pr->kernel_s ? pr->graph_node_s : pr->kernel_s);
    const double run = compute_s + small_kernels * pr->kernel_s, issue = ops * pr->launch_s;
    return run > issue ? run : issue;
}

static double gpu_time(const struct walk *w, double compute_s, int small_kernels, int ops) {
    return cost_gpu_busy_s(w->prof, compute_s, small_kernels, ops, w->graph);
}

static void gpu_busy(struct walk *w, double compute_s, int small_kernels, int ops) {
    const double busy = gpu_time(w, compute_s, small_kernels, ops);
    w->out->gpu_s += busy;
    w->out->overhead_s += busy - compute_s;
    w->out->seconds += busy;
}

/* The share of its own speed each side keeps while the CPU reads host memory at cpu_bps and the
 * GPU at pcie_bps (copies or in-place reads) at the same time: host memory serves both from one
 * bandwidth, so what they ask beyond it slows both alike. The bandwidth is the CPU's streaming
 * read rate (host_read_gbps), or what the profile saw served to both at once where that was
 * more: the cores alone may not reach what host memory serves (bench/RESULTS.md). */
static double host_memory_share(const struct profile *pr, double cpu_bps, double pcie_bps) {
    const double ceiling = fmax(pr->host_read_gbps, pr->host_served_gbps) * 1e9, asked = cpu_bps + pcie_bps;
    return ceiling > 0 && asked > ceiling ? ceiling / asked : 1;
}

/* How the GPU uses host memory beside the CPU: pinned copies, a dense kernel reading in place,
 * or the expert kernel reading a token's experts in place (scattered rows, which slow more
 * beside the CPU than dense reads do; bench/RESULTS.md). */
enum host_use { HOST_COPIES, HOST_READS, HOST_EXPERT_READS };

/* The shares of their speed the expert kernel's reads in place and the CPU's experts keep beside
 * each other in a step of n tokens: measured at one token and at PROFILE_SPLIT_TOKENS, between
 * them in log n, and the latter's beyond. The two sides slow each other more in larger steps than
 * one token's shares say (bench/RESULTS.md). */
static double expert_share(double one, double many, double n) {
    if (n <= 1) return one;
    if (n >= PROFILE_SPLIT_TOKENS) return many;
    const double f = log(n) / log(PROFILE_SPLIT_TOKENS);
    return one + f * (many - one);
}

/* How much longer the CPU (reading host memory at cpu_bps) and the GPU's use of host memory
 * beside it (at pcie_bps) take for each second they run together in a step of n tokens: the
 * shares measured beside each other, at most what their shared bandwidth allows. */
static void side_by_side(const struct profile *pr, enum host_use use, double n, double cpu_bps, double pcie_bps,
                         double *cpu_more, double *pcie_more) {
    const double cpu_share =
        use == HOST_COPIES ? pr->cpu_share_under_h2d
        : use == HOST_READS ? pr->cpu_share_under_reads
                            : expert_share(pr->cpu_share_under_expert_reads, pr->cpu_share_under_expert_reads_16, n);
    const double pcie_share =
        use == HOST_COPIES ? pr->h2d_share_under_cpu
        : use == HOST_READS ? pr->reads_share_under_cpu
                            : expert_share(pr->expert_reads_share_under_cpu, pr->expert_reads_share_under_cpu_16, n);
    const double shared = host_memory_share(pr, cpu_bps, pcie_bps);
    *cpu_more = 1 / fmin(cpu_share > 0 ? cpu_share : 1, shared) - 1;
    *pcie_more = 1 / fmin(pcie_share > 0 ? pcie_share : 1, shared) - 1;
}

/* The CPU computes from `from` on (reading `bytes` of host memory): its time, longer where the
 * copies of a ring tier already running ahead share host memory with it, which take longer for
 * it too; copies scheduled later into this time do the same (copy_ahead), from the span kept
 * here. */
static double cpu_span(struct walk *w, double from, double compute_s, double bytes) {
    const struct profile *pr = w->prof;
    const double ahead = w->copy_free - from;
    if (w->t->ring && ahead > 0 && compute_s > 0) {
        double cpu_more, copy_more;
        side_by_side(pr, HOST_COPIES, w->n, bytes / compute_s, profile_at_size(pr->h2d_gbps, (double)w->p->slot_bytes) * 1e9,
                     &cpu_more, &copy_more);
        const double overlap = compute_s < ahead ? compute_s : ahead;
        w->copy_free += overlap * copy_more;
        compute_s += overlap * cpu_more;
    }
    if (w->t->ring && compute_s > 0 && w->n_cpu < COST_CPU_SPANS) {
        w->cpu[w->n_cpu].from = from;
        w->cpu[w->n_cpu].to = from + compute_s;
        w->cpu[w->n_cpu++].bps = bytes / compute_s;
    }
    return compute_s;
}

/* The CPU computes (reading `bytes` of host memory), the step waiting for it. */
static void cpu_busy(struct walk *w, double compute_s, int jobs, double bytes) {
    const struct profile *pr = w->prof;
    compute_s = cpu_span(w, w->out->seconds, compute_s, bytes);
    const double busy = compute_s + jobs * pr->cpu_step_s;
    w->out->cpu_s += busy;
    w->out->overhead_s += jobs * pr->cpu_step_s;
    w->out->seconds += busy;
}

/* The activations move to the side the next shard runs on. */
static void move_to(struct walk *w, bool gpu) {
    if (w->on_gpu == gpu) return;
    const double bytes = w->n * w->m->hp.n_embd * 4.0;
    const double copy = gbps_s(bytes, profile_at_size(gpu ? w->prof->h2d_gbps : w->prof->d2h_gbps, bytes));
    const double wait = gpu ? w->prof->launch_s : w->prof->sync_s;
    w->out->pcie_s += copy;
    w->out->overhead_s += wait;
    w->out->seconds += copy + wait;
    w->on_gpu = gpu;
}

/* Attention over the cache: seconds for n tokens attending ctx cells each. The CPU's rate is per
 * KV byte each query head attends; the GPU's kernels read a KV head once for its group, at a
 * rate that depends on how long the cache is (profile_gpu_attn). On the GPU a step runs the
 * kernel the executor picks (plan_kernels): the split-KV kernel pays the call's fixed part
 * besides, and the prompt kernel costs a full tile of queries at fewer tokens. */
static double attention_cells_s(const struct walk *w, const struct shard *s, bool gpu, double cells) {
    const double per_cell = (double)s->kv_bytes_per_token * (gpu ? 1 : cost_query_heads_per_kv(w->m));
    if (!gpu) return w->n * cells * per_cell * profile_at_tokens(w->prof->cpu_attn, w->n);
    const int64_t from = w->p->kernels.attention_prompt_from;
    const bool prompt = from > 0 && (int64_t)w->n >= from; /* a step of one sequence */
    const double n = prompt ? fmax(w->n, PROFILE_PROMPT_ATTN) : w->n;
    const double call = prompt ? 0 : w->prof->gpu_attn_call_s;
    return call + n * cells * per_cell * profile_gpu_attn(w->prof, n, cells, prompt);
}

static double attention_s(const struct walk *w, const struct shard *s, bool gpu) {
    return attention_cells_s(w, s, gpu, w->ctx);
}

/* A ring tier's unit copied into slot k as soon as the copy stream and the slot are free
 * (the slot's reader done): the step waits only for what the copy has not finished by now. */
static void copy_ahead(struct walk *w, double bytes, int k) {
    const double gbps = profile_at_size(w->prof->h2d_gbps, bytes);
    double copy = gbps_s(bytes, gbps);
    const double start = w->copy_free > w->slot_free[k] ? w->copy_free : w->slot_free[k];
    /* Where it runs beside the CPU's earlier work, both took longer: the copy here, the CPU's
     * spans (so the step) by what it lost. */
    double cpu_lost = 0;
    for (int i = 0; i < w->n_cpu; i++) {
        const double from = fmax(start, w->cpu[i].from), to = fmin(start + copy, w->cpu[i].to);
        if (to <= from) continue;
        double cpu_more, copy_more;
        side_by_side(w->prof, HOST_COPIES, w->n, w->cpu[i].bps, gbps * 1e9, &cpu_more, &copy_more);
        copy += (to - from) * copy_more;
        cpu_lost += (to - from) * cpu_more;
    }
    w->copy_free = start + copy;
    w->out->pcie_s += copy;
    w->out->cpu_s += cpu_lost;
    w->out->seconds += cpu_lost;
    if (w->copy_free > w->out->seconds) w->out->seconds = w->copy_free;
}

/* A dense shard's matrices (not experts): compute time on one side, and their bytes. */
static double matrices_s(const struct walk *w, const struct shard *s, bool gpu, double n, uint64_t *bytes, int *count) {
    double sec = 0;
    *bytes = 0;
    *count = 0;
    const bool router_timed = !gpu && w->prof->cpu_router[0] > 0;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const struct gguf_tensor *t = s->tensors[i];
        if (!model_tensor_is_matrix(t) || model_tensor_is_experts(t)) continue;
        uint64_t b = t->n_bytes;
        if (s->kind == SHARD_EMBED) b = t->ne[1] ? t->n_bytes / t->ne[1] * (uint64_t)n : 0; /* rows looked up */
        /* The CPU's router runs at the rate timed at its own small shape (profile.cpu_router). */
        const bool router = router_timed && model_tensor_is_router(w->m, s, t);
        sec += b * (router ? profile_at_tokens(w->prof->cpu_router, n)
                           : cost_rate(gpu ? w->prof->gpu_matmul : w->prof->cpu_matmul, t->type, n));
        *bytes += b;
        (*count)++;
    }
    return sec;
}

double cost_query_heads_per_kv(const struct model *m) {
    return m->hp.n_head_kv > 0 ? (double)m->hp.n_head / m->hp.n_head_kv : 1;
}

double cost_touched(double range, double E, double k, double n) {
    return E > 0 ? range * (1 - pow(1 - k / E, n)) : 0;
}

/* A layer split between the GPU (gpu seconds of compute, `stream` of them waiting on
 * stream_bytes of host memory) and the CPU (cpu seconds reading cpu_bytes), both at once: each
 * slows the other's use of host memory as measured together (for an MoE layer's experts, the
 * expert kernel's reads beside the CPU's experts), and at most as their shared bandwidth
 * allows; the input goes down and the CPU's sum comes back up (a hand-off). */
struct split_time {
    double side, gpu, cpu, stream, hand_off;
};

static struct split_time split_time(const struct walk *w, bool experts, double gpu, int kernels, int ops, double stream,
                                    double stream_bytes, double cpu, double cpu_bytes) {
    const struct profile *pr = w->prof;
    if (stream > 0 && cpu > 0) { /* reads in place, beside the CPU */
        const enum host_use use = experts ? HOST_EXPERT_READS : HOST_READS; /* ring tiers do not split */
        double cpu_more, pcie_more;
        side_by_side(pr, use, w->n, cpu_bytes / cpu, stream_bytes / stream, &cpu_more, &pcie_more);
        const double overlap = cpu < stream ? cpu : stream;
        cpu += overlap * cpu_more;
        gpu += overlap * pcie_more;
    }
    /* Replayed, the host meets the graph at flags; launched, it waits on an event. The input's
     * way down and the sum's way up are the GPU's own kernels, writing and reading host memory
     * (the layer's norm, its last add), so they lengthen its side too: counted on the host's
     * side alone, they would hide behind a long GPU side. */
    const double meet = w->graph && pr->graph_round_trip_s > 0 ? pr->graph_round_trip_s : pr->round_trip_s;
    const double moved = gbps_s(w->n * w->m->hp.n_embd * 4.0 * 2, profile_at_size(pr->d2h_gbps, 65536));
    const double hand_off = meet + moved;
    gpu = gpu_time(w, gpu, kernels, ops) + moved;
    return (struct split_time){gpu > cpu + hand_off ? gpu : cpu + hand_off, gpu, cpu, stream, hand_off};
}

/* Adds a split layer's time, or `weight` times it (one of its routings, weighed by its odds). */
static void split_add(struct walk *w, struct split_time t, double weight) {
    w->out->gpu_s += weight * t.gpu;
    w->out->cpu_s += weight * t.cpu;
    w->out->pcie_s += weight * t.stream;
    w->out->overhead_s += weight * t.hand_off;
    w->out->seconds += weight * t.side;
}

static void split_sides(struct walk *w, bool experts, double gpu, int kernels, int ops, double stream,
                        double stream_bytes, double cpu, double cpu_bytes) {
    split_add(w, split_time(w, experts, gpu, kernels, ops, stream, stream_bytes, cpu, cpu_bytes), 1);
}

/* A dense FFN split by rows (ffn_rows_gpu): the GPU's rows read in place, the CPU's at its rate. */
static void split_ffn(struct walk *w, const struct shard *s) {
    const double gpu_part = (double)w->t->ffn_rows_gpu[s->layer] / w->m->hp.n_ff;
    uint64_t bytes;
    int count;
    const double gpu_compute = matrices_s(w, s, true, w->n, &bytes, &count) * gpu_part;
    const double *in_place = profile_in_place(w->prof, w->m->weights_skew, false);
    const double stream = (double)bytes * gpu_part * profile_at_tokens(in_place, w->n);
    const double cpu = matrices_s(w, s, false, w->n, &bytes, &count) * (1 - gpu_part) +
                       (count + extra_jobs[SHARD_FFN]) * w->prof->cpu_step_s;
    split_sides(w, false, gpu_compute > stream ? gpu_compute : stream, extra_kernels[SHARD_FFN],
                extra_kernels[SHARD_FFN] + MATRIX_OPS * count + HAND_OFF_OPS, stream, (double)bytes * gpu_part, cpu,
                (double)bytes * (1 - gpu_part));
}

/* The CPU's side of a carried layer's attention split with it (plan_kv_cpu_cells): from `from`
 * (once the GPU has q) to when its partial sums are up, the query's way down and theirs up
 * included. */
static double kv_split_cpu_s(struct walk *w, const struct shard *s, double from, double cpu_cells) {
    const struct profile *pr = w->prof;
    const struct model_hparams *hp = &w->m->hp;
    const double q_bytes = 4.0 * hp->n_head * hp->head_dim_k, sums_bytes = 4.0 * hp->n_head * (hp->head_dim_v + 2);
    const double moved = gbps_s(q_bytes, profile_at_size(pr->d2h_gbps, q_bytes)) +
                         gbps_s(sums_bytes, profile_at_size(pr->h2d_gbps, sums_bytes));
    const double cpu = cpu_span(w, from + pr->round_trip_s, attention_cells_s(w, s, false, cpu_cells),
                                cpu_cells * (double)s->kv_bytes_per_token);
    w->out->cpu_s += cpu + pr->cpu_step_s;
    w->out->overhead_s += pr->round_trip_s + moved + pr->cpu_step_s;
    return pr->round_trip_s + moved + pr->cpu_step_s + cpu;
}

static void dense_shard(struct walk *w, const struct shard *s, uint32_t i) {
    const enum placement place = w->t->shard[i];
    const double n = s->kind == SHARD_HEAD ? w->n_out : w->n;
    uint64_t bytes;
    int count;
    if (place == PLACE_CPU) {
        move_to(w, false);
        double sec = matrices_s(w, s, false, n, &bytes, &count);
        if (s->kind == SHARD_ATTN) sec += attention_s(w, s, false);
        cpu_busy(w, sec, count + extra_jobs[s->kind], (double)bytes);
        return;
    }
    move_to(w, true);
    if (place == PLACE_STREAMED && plan_ffn_split(w->t, s)) {
        split_ffn(w, s);
        return;
    }
    double sec = matrices_s(w, s, true, n, &bytes, &count);
    int slot = -1;
    /* Attention whose KV is on the host, in a ring tier (plan.kv_stream): the cached cells go up
     * with the matrices, but those the CPU attends in a step of one token (plan_kv_cpu_cells),
     * and the step's new cells come down on the compute stream. */
    const bool kv_up = s->kind == SHARD_ATTN && !w->p->kv_gpu[s->layer];
    const double cpu_cells = kv_up && w->n == 1 ? (double)plan_kv_cpu_cells(w->t, (int64_t)w->carried) : 0;
    if (kv_up) {
        const double down = w->n * (double)s->kv_bytes_per_token;
        sec += gbps_s(down, profile_at_size(w->prof->d2h_gbps, down));
    }
    if (place == PLACE_STREAMED && s->kind != SHARD_EMBED && !plan_reads_lent(w->p, w->t, i)) {
        const struct profile *pr = w->prof;
        if (w->t->ring && plan_shard_units(w->p, s, place)) {
            slot = (int)(w->unit % w->p->n_slots);
            copy_ahead(w, (double)bytes + (kv_up ? (w->carried - cpu_cells) * (double)s->kv_bytes_per_token : 0), slot);
        } else {
            const double *in_place = profile_in_place(pr, w->m->weights_skew, false);
            const double stream = w->t->ring ? gbps_s((double)bytes, profile_at_size(pr->h2d_gbps, (double)bytes))
                                             : (double)bytes * profile_at_tokens(in_place, n);
            w->out->pcie_s += stream;
            /* In place: the kernel waits on the reads. Ring: copies run ahead of compute. */
            sec = sec > stream ? sec : stream;
        }
    }
    double cpu_wait = 0;
    if (cpu_cells > 0) {
        const double gpu_attn = attention_cells_s(w, s, true, w->ctx - cpu_cells);
        cpu_wait = kv_split_cpu_s(w, s, w->out->seconds + sec, cpu_cells) - gpu_attn;
        sec += gpu_attn;
    } else if (s->kind == SHARD_ATTN) {
        sec += attention_s(w, s, true);
    }
    gpu_busy(w, sec, extra_kernels[s->kind] + (cpu_cells > 0), extra_kernels[s->kind] + MATRIX_OPS * count + (cpu_cells > 0 ? HAND_OFF_OPS : 0));
    /* (split, the slot is free once the GPU's side has read it: wo is copied out first) */
    if (slot >= 0) w->slot_free[slot] = w->out->seconds;
    if (cpu_wait > 0) w->out->seconds += cpu_wait;
}

/* An expert call on the tiled GEMM (tiled_experts) computing `touched` of a layer's E experts
 * takes at least the time of EXPERT_CALL_MIN_SHARE of them: below that its tiles do not fill the
 * GPU, and the call lasts one wave of them whatever their number. The profile's rate was
 * measured over every expert of a layer; the share is a small call's measured time over a whole
 * layer's (bench/RESULTS.md). */
static const double EXPERT_CALL_MIN_SHARE = 0.28;

static double expert_call_s(double touched, double E, double eb, double gpu_rate, bool tiled) {
    if (!(touched > 0)) return 0;
    return (tiled ? fmax(touched, EXPERT_CALL_MIN_SHARE * E) : touched) * eb * gpu_rate;
}

/* Whether a step's expert calls run the tiled GEMM rather than the matrix-vector kernel
 * (plan_kernels), over experts in VRAM (a staging slot's among them) or a call that reads some in
 * place. */
static bool tiled_experts(const struct walk *w, bool in_place) {
    const struct plan_kernels *k = &w->p->kernels;
    return w->n > (double)(in_place ? k->moe_matvec_max_tokens_in_place : k->moe_matvec_max_tokens);
}

/* An MoE shard of a ring tier (its experts all run on the GPU): the router, shared and
 * resident parts (gpu seconds), then each staged piece of experts, computed once its copy (on
 * the copy clock, copy_ahead) has landed in its slot. A sum of each piece's max(copy, compute)
 * would charge the GPU's other work on top of copies that in fact run meanwhile. */
static void staged_pieces(struct walk *w, const struct shard *s, double gpu, int count, double gpu_rate) {
    const double E = s->n_expert, k = w->m->hp.n_expert_used, eb = (double)s->expert_bytes;
    const double r = w->p->experts_resident[s->layer], piece = w->p->piece_experts ? w->p->piece_experts : 1;
    gpu_busy(w, gpu, extra_kernels[SHARD_MOE] + 3,
             extra_kernels[SHARD_MOE] + MATRIX_OPS * count + EXPERT_CALL_OPS * (r > 0));
    uint32_t j = 0;
    for (double e = r; e < E; e += piece, j++) {
        const double in_piece = fmin(piece, E - e);
        const int slot = (int)((w->unit + j) % w->p->n_slots);
        copy_ahead(w, in_piece * eb, slot);
        gpu_busy(w, expert_call_s(cost_touched(in_piece, E, k, w->n), E, eb, gpu_rate, tiled_experts(w, false)), 3,
                 EXPERT_CALL_OPS);
        w->slot_free[slot] = w->out->seconds;
    }
}

static double log_choose(double n, double k) {
    return k < 0 || k > n ? -INFINITY : lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1);
}

/* The odds that `hit` of k experts drawn from E land among `among` of them. */
static double hypergeometric(double E, double among, int k, int hit) {
    return exp(log_choose(among, hit) + log_choose(E - among, k - hit) - log_choose(E, k));
}

/* Whether an MoE layer's resident and streamed experts run as one call, rather than a call of
 * each (where some are resident and some not, outside ring tiers). */
static bool one_expert_call(const struct walk *w, const struct shard *s) {
    const uint32_t r = plan_experts_vram(w->p, w->t, s->layer);
    return r > 0 && r < s->n_expert && !w->t->ring;
}

/* The expert kernel reading `bytes` of experts in place in a step of n tokens; one token's call
 * pays its fixed part besides (the rates of more tokens were measured with it), in the share
 * `reading` of steps that read any expert in place at all: `bytes` may be an average over steps,
 * and where few experts are read in place, many steps read none and pay nothing. */
static double expert_reads_s(const struct walk *w, const struct shard *s, double bytes, double reading) {
    const struct profile *pr = w->prof;
    const double k = w->m->hp.n_expert_used, n = w->n;
    return bytes > 0 ? bytes * cost_expert_rate_of(profile_in_place(pr, w->m->weights_skew, true), s->n_expert, k, n) +
                           (n < 2 ? reading * pr->zero_copy_expert_call_s : 0)
                     : 0;
}

/* The GPU's experts of a layer: `resident` seconds of experts in VRAM, then those read in place
 * (their compute, or the reads, whichever is longer): even in one call the reads do not hide
 * behind the resident experts. Where one call computes both (`one`) on the tiled kernel
 * (tiled_experts: fewer, larger blocks, likely more of them at once), steps of up to
 * BESIDE_MAX_TOKENS tokens count halfway between that and the reads fully beside them
 * (bench/RESULTS.md). */
enum { BESIDE_MAX_TOKENS = 256 };
static double experts_and_reads(const struct walk *w, const struct shard *s, double resident, double compute,
                                double reads, bool one) {
    const double apart = resident + fmax(compute, reads);
    const bool beside = one && tiled_experts(w, true) && w->n <= BESIDE_MAX_TOKENS;
    return beside ? (apart + fmax(resident + compute, reads)) / 2 : apart;
}

/* How the experts a step touches fall between two sides: the GPU's range of `a` experts and the
 * CPU's of `b`, a step of n tokens each routed to k of E. Relative spreads (standard deviation
 * over mean) of each side's count of distinct experts touched, and their correlation (negative:
 * a token's k experts that land on one side are not on the other). Every pair of distinct experts
 * is hit together with the same odds, so one covariance serves within a side and across. */
struct spread {
    double gpu, cpu, correlation;
};

static struct spread touched_spread(double a, double b, double E, double k, double n) {
    const double miss = pow(1 - k / E, n), p = 1 - miss;
    const double both_missed = E > 1 ? pow((E - k) * (E - k - 1) / (E * (E - 1)), n) : miss;
    const double pair = both_missed - miss * miss; /* covariance of two experts' hits */
    const double var_a = a * p * (1 - p) + a * (a - 1) * pair, var_b = b * p * (1 - p) + b * (b - 1) * pair;
    struct spread sp = {0, 0, 0};
    if (a * p > 0 && var_a > 0) sp.gpu = sqrt(var_a) / (a * p);
    if (b * p > 0 && var_b > 0) sp.cpu = sqrt(var_b) / (b * p);
    if (var_a > 0 && var_b > 0) sp.correlation = a * b * pair / sqrt(var_a * var_b);
    return sp;
}

/* A split layer waits for its later side. Each side's time varies with the experts it touches
 * from step to step, so near the balance the later one is later on average than either side's
 * mean says: the expected larger of two correlated normal variables (Clark, 1961). */
static double later_side(struct split_time t, struct spread sp) {
    const double g = t.gpu, c = t.cpu + t.hand_off, sg = sp.gpu * t.gpu, sc = sp.cpu * t.cpu;
    const double spread = sqrt(fmax(sg * sg + sc * sc - 2 * sp.correlation * sg * sc, 0));
    if (!(spread > 0)) return t.side;
    const double z = (g - c) / spread, phi = exp(-z * z / 2) / sqrt(2 * M_PI), Phi = 0.5 * erfc(-z / sqrt(2));
    return fmax(t.side, g * Phi + c * (1 - Phi) + spread * phi);
}

/* An MoE layer split with the CPU, for `res` experts (a token's, or a step's on average) the GPU
 * computes from VRAM, `in_place` it reads from host memory and `cpu` the CPU computes; `gpu`
 * holds its other work (router, shared experts). */
static struct split_time moe_split(const struct walk *w, const struct shard *s, double gpu, int count, double res,
                                   double in_place, double cpu, bool streams) {
    const struct profile *pr = w->prof;
    const double eb = (double)s->expert_bytes, n = w->n;
    const uint32_t type = shard_expert_type(s);
    const double E = s->n_expert, k = w->m->hp.n_expert_used;
    const double gpu_rate = cost_expert_rate(pr->gpu_experts, type, E, k, n), moved = in_place * eb;
    const double stream = expert_reads_s(w, s, moved, 1);
    const bool one = one_expert_call(w, s) && streams;
    gpu += experts_and_reads(w, s, res * eb * gpu_rate, moved * gpu_rate, stream, one);
    /* Small kernels: routing, norms, adds; and each expert call's own (grouping, conversions,
     * the gated unit, the weighted sum: replayed, each is a graph node however little it does,
     * so all of them count); a routed tier's mask. */
    const int calls = one ? 1 : (plan_experts_vram(w->p, w->t, s->layer) > 0) + streams;
    const int kernels = extra_kernels[SHARD_MOE] + EXPERT_CALL_OPS * calls + w->t->routed;
    const int ops = extra_kernels[SHARD_MOE] + MATRIX_OPS * count + EXPERT_CALL_OPS * calls + HAND_OFF_OPS + w->t->routed;
    return split_time(w, true, gpu, kernels, ops, stream, moved, pr->cpu_moe_call_s + cpu * eb * cost_expert_rate(pr->cpu_experts, type, E, k, n),
                      cpu * eb);
}

static void moe_shard(struct walk *w, const struct shard *s, uint32_t i) {
    const struct profile *pr = w->prof;
    const double E = s->n_expert, k = w->m->hp.n_expert_used, eb = (double)s->expert_bytes, n = w->n;
    const uint32_t type = shard_expert_type(s);
    uint64_t shared_bytes;
    int count;
    if (w->t->shard[i] == PLACE_CPU) {
        move_to(w, false);
        const double touched = cost_touched(E, E, k, n) * eb;
        const double sec = matrices_s(w, s, false, n, &shared_bytes, &count) + pr->cpu_moe_call_s +
                           touched * cost_expert_rate(pr->cpu_experts, type, E, k, n);
        cpu_busy(w, sec, count + 3 + extra_jobs[SHARD_MOE], (double)shared_bytes + touched);
        return;
    }
    move_to(w, true);
    const double r = plan_experts_vram(w->p, w->t, s->layer), g = w->t->experts_gpu[s->layer];
    const double gpu_rate = cost_expert_rate(pr->gpu_experts, type, E, k, n);
    double gpu = matrices_s(w, s, true, n, &shared_bytes, &count);
    const bool one = one_expert_call(w, s) && g > r;
    if ((g >= E && !one) || w->t->ring) gpu += cost_touched(r, E, k, n) * eb * gpu_rate;
    if (w->t->ring && g > r) { /* every piece staged, on the copy clock (ring tiers stream all) */
        staged_pieces(w, s, gpu, count, gpu_rate);
        return;
    }
    if (g >= E) {
        double stream = 0;
        if (g > r) { /* in place: only the touched experts' bytes cross PCIe */
            const double moved = cost_touched(g - r, E, k, n) * eb;
            stream = expert_reads_s(w, s, moved, n < 2 ? 1 - hypergeometric(E, g - r, (int)k, 0) : 1);
            gpu += experts_and_reads(w, s, one ? cost_touched(r, E, k, n) * eb * gpu_rate : 0, moved * gpu_rate, stream, one);
        }
        w->out->pcie_s += stream;
        const int calls = one ? 1 : (g > r) + (r > 0);
        gpu_busy(w, gpu, extra_kernels[SHARD_MOE] + EXPERT_CALL_OPS * calls,
                 extra_kernels[SHARD_MOE] + MATRIX_OPS * count + EXPERT_CALL_OPS * calls);
        return;
    }
    /* Split: the CPU computes [g, E) while the GPU computes its share. One token routes to k
     * experts, so the two sides' shares vary from token to token and the layer takes the longer
     * one each time: weighed over the routings (by range, or by the tier's routed quota). */
    if (n == 1 && k <= PLAN_MAX_ROUTED) {
        const int K = (int)k;
        for (int res = 0; res <= K; res++)
            for (int in_place = 0; in_place <= K - res; in_place++) {
                const int cpu = K - res - in_place;
                double odds;
                if (w->t->routed)
                    odds = in_place == w->t->routed_quota[K - res] ? hypergeometric(E, r, K, res) : 0;
                else
                    odds = exp(log_choose(r, res) + log_choose(g - r, in_place) + log_choose(E - g, cpu) - log_choose(E, K));
                if (odds > 1e-12) split_add(w, moe_split(w, s, gpu, count, res, in_place, cpu, g > r || w->t->routed), odds);
            }
        return;
    }
    const double moved = g > r ? cost_touched(g - r, E, k, n) : 0;
    struct split_time t = moe_split(w, s, gpu, count, cost_touched(r, E, k, n), moved, cost_touched(E - g, E, k, n), g > r);
    t.side = later_side(t, touched_spread(g, E - g, E, k, n));
    split_add(w, t, 1);
}

void cost_routed_quota(const struct profile *prof, const struct model *m, const struct plan *p, const struct plan_tier *t,
                       uint8_t quota[PLAN_MAX_ROUTED + 1]) {
    memset(quota, 0, PLAN_MAX_ROUTED + 1);
    const struct shard *s = NULL;
    for (uint32_t i = 0; i < m->n_shards && !s; i++)
        if (m->shards[i].kind == SHARD_MOE && m->shards[i].expert_bytes) s = &m->shards[i];
    const int k = (int)m->hp.n_expert_used;
    if (!s || k > PLAN_MAX_ROUTED) return;
    struct cost_step out = {0};
    const struct walk w = {.prof = prof, .m = m, .p = p, .t = t, .n = 1, .n_out = 1, .graph = true, .out = &out};
    for (int n = 1; n <= k; n++) {
        double best = INFINITY;
        for (int q = 0; q <= n; q++) {
            const double side = moe_split(&w, s, 0, 0, k - n, q, n - q, true).side;
            if (side < best) best = side, quota[n] = (uint8_t)q;
        }
    }
}

/* The model's entry in prof->refine, -1 when running it has taught nothing yet. */
static int refine_index(const struct profile *prof, const struct model *m) {
    char key[sizeof prof->refine[0].model];
    cost_model_key(m, key, sizeof key);
    for (int i = 0; i < PROFILE_MODELS && prof->refine[i].model[0]; i++)
        if (!strcmp(prof->refine[i].model, key)) return i;
    return -1;
}

/* What running model m taught about steps of this family and size: its own measured over
 * predicted, or, for a GPU family not run at this size yet, the geometric mean of those that
 * were. Scaling only the family that ran would hand the next choice to one that did not, on no
 * evidence. 0: nothing learned. */
static double learned_scale(const struct profile *prof, const struct model *m, enum plan_family family, int k) {
    const int i = refine_index(prof, m);
    if (i < 0 || (int)family >= (int)PROFILE_FAMILIES) return 0;
    const struct profile_refine *r = &prof->refine[i];
    if (r->scale[family][k] > 0 || family == PLAN_CPU) return r->scale[family][k];
    double log_sum = 0;
    int n = 0;
    for (int f = PLAN_GPU; f < PROFILE_FAMILIES; f++)
        if (r->scale[f][k] > 0) log_sum += log(r->scale[f][k]), n++;
    return n ? exp(log_sum / n) : 0;
}

/* A step whose tokens attend mean_cells cells each (one sequence's: its past and half the step),
 * carrying `carried` cached cells up for each layer whose KV rides the ring (every sequence's in
 * the step: the executor copies each one's blocks). */
static void step_attending(const struct profile *prof, const struct model *m, const struct plan *p,
                           const struct plan_tier *t, int32_t n_tokens, double carried, double mean_cells,
                           struct cost_step *out) {
    memset(out, 0, sizeof *out);
    const double n = n_tokens > 0 ? n_tokens : 1;
    struct walk w = {.prof = prof, .m = m, .p = p, .t = t, .n = n, .n_out = 1, .ctx = mean_cells, .carried = carried, .out = out};
    w.graph = plan_tier_replays(t, n_tokens);
    if (!prof->has_gpu && t->any_gpu) {
        out->seconds = INFINITY;
        return;
    }
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        if (s->kind == SHARD_MOE) moe_shard(&w, s, i);
        else dense_shard(&w, s, i);
        if (t->ring) w.unit += plan_shard_units(p, s, t->shard[i]);
    }
    move_to(&w, false); /* logits back to the host */
    if (t->any_gpu && !w.graph) out->overhead_s += prof->sync_s, out->seconds += prof->sync_s;
    out->raw_seconds = out->seconds;
    const double scale = learned_scale(prof, m, t->family, profile_token_index(n_tokens));
    if (scale > 0) out->seconds *= scale;
}

void cost_model_key(const struct model *m, char *out, size_t size) {
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) bytes += m->shards[i].weight_bytes;
    snprintf(out, size, "%.24s %ux%u e%u %.2f GB", m->hp.arch_name, m->hp.n_layers, m->hp.n_embd, m->hp.n_expert,
             bytes / 1e9);
}

void cost_learn(struct profile *prof, const struct model *m, enum plan_family family, int32_t n_tokens,
                double raw_predicted_s, double measured_s) {
    if ((int)family >= (int)PROFILE_FAMILIES || !(raw_predicted_s > 0) || !(measured_s > 0) || !isfinite(measured_s)) return;
    int i = refine_index(prof, m);
    if (i < 0) { /* a new model: the first free entry, else the oldest makes room at the end */
        for (i = 0; i < PROFILE_MODELS && prof->refine[i].model[0]; i++) continue;
        if (i == PROFILE_MODELS) {
            memmove(&prof->refine[0], &prof->refine[1], sizeof prof->refine[0] * (PROFILE_MODELS - 1));
            i = PROFILE_MODELS - 1;
        }
        memset(&prof->refine[i], 0, sizeof prof->refine[i]);
        cost_model_key(m, prof->refine[i].model, sizeof prof->refine[i].model);
    }
    double ratio = measured_s / raw_predicted_s;
    ratio = ratio < 0.25 ? 0.25 : ratio > 4 ? 4 : ratio;
    double *r = &prof->refine[i].scale[family][profile_token_index(n_tokens)];
    *r = *r > 0 ? (*r + ratio) / 2 : ratio;
}

void cost_step(const struct profile *prof, const struct model *m, const struct plan *p, const struct plan_tier *t,
               int32_t n_tokens, int32_t n_past, struct cost_step *out) {
    step_attending(prof, m, p, t, n_tokens, n_past, n_past + ((n_tokens > 0 ? n_tokens : 1) + 1) / 2.0, out);
}

void cost_plan_step(const struct profile *prof, const struct model *m, const struct plan *p, int32_t n_tokens,
                    int32_t n_past, struct cost_step *out) {
    const struct plan *runs = plan_for_step(p, n_tokens, n_past + n_tokens);
    cost_step(prof, m, runs, plan_tier_for(runs, n_tokens), n_tokens, n_past, out);
}

/* A step of tokens of many sequences: each attends its own sequence's mean_cells cells, and the
 * sequences in it had `carried` cells cached before it, all together. */
static void plan_step_attending(const struct profile *prof, const struct model *m, const struct plan *p, int32_t n_tokens,
                                double carried, double mean_cells, struct cost_step *out) {
    const struct plan *runs = plan_for_step(p, n_tokens, (int32_t)mean_cells + 1);
    step_attending(prof, m, runs, plan_tier_for(runs, n_tokens), n_tokens, carried, mean_cells, out);
}

void cost_decode_mean(const struct profile *prof, const struct model *m, const struct plan *p, int32_t n_prompt,
                      int32_t n_steps, struct cost_step *out, bool *one_plan) {
    const int k = n_steps < COST_DECODE_SAMPLES ? (n_steps > 0 ? n_steps : 1) : COST_DECODE_SAMPLES;
    double seconds = 0, raw = 0;
    const struct plan *first = NULL;
    *one_plan = true;
    for (int i = 0; i < k; i++) {
        const int32_t past = n_prompt + (int32_t)((i + 0.5) * n_steps / k);
        struct cost_step one;
        cost_plan_step(prof, m, p, 1, past, &one);
        seconds += one.seconds, raw += one.raw_seconds;
        const struct plan *runs = plan_for_step(p, 1, past + 1);
        *one_plan &= !first || runs == first;
        first = runs;
    }
    memset(out, 0, sizeof *out);
    out->seconds = seconds / k, out->raw_seconds = raw / k;
}

void cost_request(const struct profile *prof, const struct model *m, const struct plan *p, int32_t n_prompt,
                  int32_t n_batch, int32_t n_gen, int32_t n_seq, double *ttft_s, double *decode_s) {
    struct cost_step c;
    double ttft = 0;
    if (n_seq <= 1) { /* one sequence: its prompt's steps over the cells before them */
        for (int32_t done = 0; done < n_prompt;) {
            const int32_t n = n_prompt - done < n_batch ? n_prompt - done : n_batch;
            cost_plan_step(prof, m, p, n, done, &c);
            ttft += c.seconds;
            done += n;
        }
        cost_plan_step(prof, m, p, 1, n_prompt + n_gen / 2, &c);
        *ttft_s = ttft;
        *decode_s = c.seconds;
        return;
    }
    /* Many: a step takes the next prompt's tokens where one ends, and each token attends only its
     * own sequence's cells (its place in its prompt, plus itself). */
    const int64_t total = (int64_t)n_prompt * n_seq;
    for (int64_t done = 0; done < total;) {
        const int32_t n = total - done < n_batch ? (int32_t)(total - done) : n_batch;
        double cells = 0;
        for (int64_t i = done; i < done + n; i++) cells += (double)(i % n_prompt) + 1;
        /* cached before the step: the first prompt's tokens read already (the others start in it) */
        plan_step_attending(prof, m, p, n, (double)(done % n_prompt), cells / n, &c);
        ttft += c.seconds;
        done += n;
    }
    plan_step_attending(prof, m, p, n_seq, n_seq * (n_prompt + n_gen / 2.0), n_prompt + n_gen / 2.0 + 1, &c);
    *ttft_s = ttft;
    *decode_s = c.seconds;
}

double cost_kv_position_bytes(const struct model *m, const struct plan *p) {
    double bytes = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const struct shard *s = &m->shards[i];
        if (s->kind == SHARD_ATTN && p->kv_gpu[s->layer]) bytes += (double)s->kv_bytes_per_token;
    }
    return bytes;
}

double cost_switch(const struct profile *prof, const struct model *m, double up_bytes, double down_bytes) {
    const double h2d = prof->h2d_gbps[PROFILE_SIZES - 1] * 1e9, d2h = prof->d2h_gbps[PROFILE_SIZES - 1] * 1e9;
    if (!(h2d > 0) || !(d2h > 0)) return INFINITY;
    /* Besides the copies: draining both streams, and capturing the decode step's graph anew. */
    return up_bytes / h2d + down_bytes / d2h + 2 * prof->sync_s + 4.0 * m->n_shards * prof->launch_s;
}
