/* Whether the profile's CPU expert rates read part of their weights from the L3: times the
 * profile's expert step (qwen30b's shapes, 128 experts of 768 x 2048, 8 routed a token, Q4_0)
 * over working sets from the profile's own (a layer's experts, copied to BIG_BYTES) up to many
 * times that, routed at random over the copy of the rep ("copy", as the profile does), over every
 * copy as a whole ("random"), or as at random over one copy with each expert a step touches
 * dealt from a shuffled deck of every copy's ("deck": an expert comes back only after all the
 * others), and host reads over the same sizes. A rate that falls as
 * the working set grows was partly served from the cache.
 * With `sustain` for MULTIPLE: the profile's own working set, one token a step without a pause
 * for five seconds, its rate printed every quarter second (whether it moves as the load lasts).
 * Usage: expert_cache_probe THREADS MULTIPLE|sustain... (multiples of BIG_BYTES, 1 to 64) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "core/timer.h"
#include "measure/measure_internal.h"
#include "plan/cost.h"
#include "quant/quant.h"

enum { E = 128, K = 8, FF = 768, EMBD = 2048, MAX_TOKENS = 16 };

enum mode { COPY, RANDOM, DECK, MODES };
static const char *const mode_name[MODES] = {"copy", "random", "deck"};

struct probe {
    struct cpu_bench b;
    enum mode mode;
    struct synth all[3]; /* every copy as one set of experts */
    int32_t *deck, *dealt; /* a shuffled order of all of them; this step's expert for each of E */
    int64_t n_deck, next;
};

/* Each expert of E this step's routing chose, dealt the next one of the deck. */
static void deal(struct probe *p) {
    struct cpu_bench *b = &p->b;
    for (int e = 0; e < E; e++) p->dealt[e] = -1;
    for (int64_t i = 0; i < b->n_tokens * b->k; i++) {
        int32_t *d = &p->dealt[b->ids[i]];
        if (*d < 0) *d = p->deck[p->next++ % p->n_deck];
        b->ids[i] = *d;
    }
}

/* As measure_cpu_experts_step, or over every copy at once. */
static void experts_step(void *arg, int rep) {
    struct probe *p = arg;
    if (p->mode == COPY) {
        measure_cpu_experts_step(&p->b, rep);
        return;
    }
    struct cpu_bench *b = &p->b;
    measure_route_random(b, p->mode == RANDOM ? (int)(E * b->gate.copies) : E, rep);
    if (p->mode == DECK) deal(p);
    struct cpu_acts acts;
    cpu_quantize_acts(b->pool, &p->all[0].m, b->x, b->n_tokens, b->acts, &acts);
    struct moe_routing routing = {b->n_tokens, b->k, b->ids, b->weights, 0, 0};
    cpu_moe(b->pool, &p->all[0].m, &p->all[1].m, &p->all[2].m, &acts, &routing, &b->scratch, b->y);
}

static void read_job(void *arg, int thread, int n_threads) {
    struct cpu_bench *b = arg;
    int64_t begin, end;
    threadpool_range((int64_t)b->mem_words, 512, thread, n_threads, &begin, &end);
    uint64_t s = 0;
    for (int64_t i = begin; i < end; i++) s += b->mem[i];
    b->sums[thread & 255] += s;
}

static void read_step(void *arg, int rep) {
    (void)rep;
    threadpool_run(((struct cpu_bench *)arg)->pool, read_job, arg);
}

/* Median of three timings of fn, and the best of them in *best. */
static double median3(step_fn fn, void *arg, double *best) {
    double t[3];
    for (int i = 0; i < 3; i++) t[i] = measure_time_steps(fn, arg);
    double lo = t[0], hi = t[0];
    for (int i = 1; i < 3; i++) lo = t[i] < lo ? t[i] : lo, hi = t[i] > hi ? t[i] : hi;
    *best = lo;
    return t[0] + t[1] + t[2] - lo - hi;
}

int main(int argc, char **argv) {
    const int threads = argc > 2 ? atoi(argv[1]) : 0;
    if (argc < 3 || threads < 1 || threads > 256) {
        fprintf(stderr, "usage: expert_cache_probe THREADS MULTIPLE...\n");
        return 2;
    }
    static struct probe p;
    struct cpu_bench *b = &p.b;
    if (threadpool_create(threads, &b->pool) != PSHARD_OK) return 1;
    b->k = K;
    b->x = calloc((size_t)MAX_TOKENS * FF * 4, sizeof(float));
    b->y = calloc((size_t)MAX_TOKENS * FF * 4 * K, sizeof(float));
    b->acts = malloc(cpu_acts_bytes(QUANT_F32, FF * 4, MAX_TOKENS * K));
    b->ids = calloc((size_t)MAX_TOKENS * K, sizeof *b->ids);
    b->weights = calloc((size_t)MAX_TOKENS * K, sizeof *b->weights);
    for (int i = 0; i < MAX_TOKENS * FF * 4; i++) b->x[i] = (float)((i * 37) % 101 - 50) / 50.0f;
    printf("MB working set  read GB/s  | experts GB/s at 1 / 4 / 16 tokens, median of 3 (best)\n");
    for (int a = 2; a < argc; a++) {
        const bool sustain = !strcmp(argv[a], "sustain");
        const int mult = sustain ? 1 : atoi(argv[a]);
        if (mult < 1 || mult > 64) continue;
        const size_t want = (size_t)mult * (BIG_BYTES / 3);
        if (measure_synth_make(QUANT_Q4_0, FF, EMBD, E, want, &b->gate) != PSHARD_OK ||
            measure_synth_make(QUANT_Q4_0, FF, EMBD, E, want, &b->up) != PSHARD_OK ||
            measure_synth_make(QUANT_Q4_0, EMBD, FF, E, want, &b->down) != PSHARD_OK) {
            fprintf(stderr, "expert_cache_probe: %s\n", pshard_last_error());
            return 1;
        }
        const int copies = b->gate.copies;
        const int64_t all_e = (int64_t)E * copies;
        const size_t scratch = cpu_moe_scratch_bytes(MAX_TOKENS, K, all_e, EMBD, FF, QUANT_F32);
        b->scratch_mem = malloc(scratch);
        if (!b->scratch_mem) return 1;
        cpu_moe_scratch_init(&b->scratch, b->scratch_mem, MAX_TOKENS, K, all_e, EMBD, FF, QUANT_F32);
        for (int i = 0; i < 3; i++) {
            const struct synth *s = i == 0 ? &b->gate : i == 1 ? &b->up : &b->down;
            p.all[i] = *s;
            p.all[i].m.n_experts = all_e;
        }
        free(p.deck), free(p.dealt);
        p.deck = malloc(sizeof *p.deck * (size_t)all_e), p.dealt = malloc(sizeof *p.dealt * E);
        if (!p.deck || !p.dealt) return 1;
        p.n_deck = all_e, p.next = 0;
        for (int64_t i = 0; i < all_e; i++) p.deck[i] = (int32_t)i;
        srand(7);
        for (int64_t i = all_e - 1; i > 0; i--) {
            const int64_t j = rand() % (i + 1);
            const int32_t t = p.deck[i];
            p.deck[i] = p.deck[j], p.deck[j] = t;
        }
        const double set = (double)(b->gate.bytes + b->up.bytes + b->down.bytes) * copies;
        if (sustain) {
            b->n_tokens = 1;
            const double touched = K * (double)(b->gate.bytes + b->up.bytes + b->down.bytes) / E;
            const double start = core_now_ms();
            double t0 = start;
            int rep = 0, from = 0;
            printf("sustained, one token:");
            while (core_now_ms() - start < 5000) {
                measure_cpu_experts_step(b, rep++);
                const double now = core_now_ms();
                if (now - t0 >= 250) {
                    printf(" %.1f", touched * (rep - from) / (now - t0) / 1e6);
                    t0 = now, from = rep;
                }
            }
            printf(" GB/s\n");
        }
        b->mem = (const uint64_t *)b->gate.data, b->mem_words = b->gate.bytes * (size_t)copies / 8;
        double best;
        const double read = median3(read_step, b, &best);
        printf("%6.0f  %6.1f (%5.1f)", set / 1e6, (double)b->mem_words * 8 / read / 1e9,
               (double)b->mem_words * 8 / best / 1e9);
        for (int mode = 0; mode < MODES; mode++) {
            p.mode = (enum mode)mode;
            printf("  | %-6s", mode_name[mode]);
            const int tokens[3] = {1, 4, 16};
            for (int i = 0; i < 3; i++) {
                b->n_tokens = tokens[i];
                const double per_expert = (double)(b->gate.bytes + b->up.bytes + b->down.bytes) / E;
                const double range = mode == RANDOM ? (double)all_e : E;
                const double touched = cost_touched(range, range, K, (double)tokens[i]) * per_expert;
                const double t = median3(experts_step, &p, &best);
                printf(" %5.1f (%5.1f)", touched / t / 1e9, touched / best / 1e9);
            }
        }
        printf("\n");
        fflush(stdout);
        free(b->gate.data), free(b->up.data), free(b->down.data), free(b->scratch_mem);
        b->gate.data = b->up.data = b->down.data = NULL, b->scratch_mem = NULL;
    }
    threadpool_free(b->pool);
    return 0;
}
