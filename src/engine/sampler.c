/* The sampler: candidates are filtered in the order penalties, top-k, top-p, min-p, then
 * temperature and a draw. Buffers are allocated once; nothing is allocated per token. */
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct candidate {
    int32_t id;
    float logit;
};

struct sampler {
    struct sampler_params p;
    int32_t n_vocab;
    struct candidate *cand;
    float *adjusted;  /* logits after penalties */
    int32_t *history; /* ring of the last penalty_last_n tokens */
    int32_t n_history, history_pos;
    uint16_t *counts; /* occurrences per token in the window, for the penalties */
    uint64_t rng;
};

void sampler_default_params(struct sampler_params *p) {
    *p = (struct sampler_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                 .repeat_penalty = 1.0f, .penalty_last_n = 64, .seed = 0x5eed};
}

pshard_status sampler_create(const struct sampler_params *params, int32_t n_vocab, struct sampler **out) {
    *out = NULL;
    if (n_vocab <= 0) return core_fail(PSHARD_ERR_INVALID_ARG, "sampler: empty vocabulary");
    if (params->top_k < 0 || params->top_p <= 0.0f || params->top_p > 1.0f || params->min_p < 0.0f ||
        params->min_p > 1.0f || params->repeat_penalty <= 0.0f || params->penalty_last_n < 0 ||
        isnan(params->temperature))
        return core_fail(PSHARD_ERR_INVALID_ARG,
                         "sampler: top-k must be >= 0, top-p in (0, 1], min-p in [0, 1], repeat penalty > 0");
    struct sampler *s = calloc(1, sizeof *s);
    if (!s) return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    s->p = *params;
    s->n_vocab = n_vocab;
    s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
    s->adjusted = malloc(sizeof *s->adjusted * (size_t)n_vocab);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->history = malloc(sizeof *s->history * (size_t)(params->penalty_last_n ? params->penalty_last_n : 1));
    if (!s->cand || !s->adjusted || !s->counts || !s->history) {
        sampler_free(s);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory");
    }
    s->rng = params->seed ^ 0x9e3779b97f4a7c15ull;
    *out = s;
    return PSHARD_OK;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->adjusted);
    free(s->counts);
    free(s->history);
    free(s);
}

void sampler_reset(struct sampler *s) {
    memset(s->counts, 0, sizeof *s->counts * (size_t)s->n_vocab);
    s->n_history = s->history_pos = 0;
}

void sampler_accept(struct sampler *s, int32_t token) {
    if (s->p.penalty_last_n == 0 || token < 0 || token >= s->n_vocab) return;
    if (s->n_history == s->p.penalty_last_n) s->counts[s->history[s->history_pos]]--;
    else s->n_history++;
    s->history[s->history_pos] = token;
    s->counts[token]++;
    s->history_pos = (s->history_pos + 1) % s->p.penalty_last_n;
}

static uint64_t next_random(uint64_t *state) { /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int by_logit_desc(const void *a, const void *b) {
    const struct candidate *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Whether a goes before b in by_logit_desc's order. */
static bool better(const struct candidate *a, const struct candidate *b) { return by_logit_desc(a, b) < 0; }

/* c[i] down the heap c[0..n) whose root is its worst candidate. */
static void sift_down(struct candidate *c, int32_t n, int32_t i) {
    for (;;) {
        int32_t worst = i;
        const int32_t l = 2 * i + 1, r = l + 1;
        if (l < n && better(&c[worst], &c[l])) worst = l;
        if (r < n && better(&c[worst], &c[r])) worst = r;
        if (worst == i) return;
        const struct candidate t = c[i];
        c[i] = c[worst], c[worst] = t;
        i = worst;
    }
}

/* The k best of c[0..n) (k < n) into c[0..k), in by_logit_desc's order: exactly the first k of a
 * sort of all n. A heap of the k best so far, its worst at the root, passes over the rest once:
 * a full sort of a large vocabulary costs a sizeable share of a decode step (bench/RESULTS.md). */
static void select_best(struct candidate *c, int32_t n, int32_t k) {
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int32_t i = k; i < n; i++)
        if (better(&c[i], &c[0])) {
            c[0] = c[i];
            sift_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, by_logit_desc);
}

float sampler_logprobs(struct sampler *s, const float *logits, int32_t token, int32_t k, int32_t *ids, float *logprobs) {
    float max = logits[0];
    for (int32_t i = 1; i < s->n_vocab; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int32_t i = 0; i < s->n_vocab; i++) sum += exp((double)(logits[i] - max));
    const float log_z = max + (float)log(sum);
    if (k > 0) {
        for (int32_t i = 0; i < s->n_vocab; i++) s->cand[i] = (struct candidate){i, logits[i]};
        if (k < s->n_vocab) select_best(s->cand, s->n_vocab, k);
        else qsort(s->cand, (size_t)s->n_vocab, sizeof *s->cand, by_logit_desc);
        for (int32_t i = 0; i < k; i++) ids[i] = s->cand[i].id, logprobs[i] = s->cand[i].logit - log_z;
    }
    return logits[token] - log_z;
}

/* The logits to sample from: as they are where no penalty applies, else penalized in a copy. */
static const float *apply_penalties(struct sampler *s, const float *logits) {
    if (s->p.repeat_penalty == 1.0f && s->p.presence_penalty == 0.0f && s->p.frequency_penalty == 0.0f) return logits;
    memcpy(s->adjusted, logits, sizeof *logits * (size_t)s->n_vocab);
    for (int32_t i = 0; i < s->n_history; i++) {
        const int32_t id = s->history[i];
        bool seen_before = false; /* penalize each distinct token once; the window is short */
        for (int32_t j = 0; j < i && !seen_before; j++) seen_before = s->history[j] == id;
        if (seen_before) continue;
        float *l = &s->adjusted[id];
        *l = *l > 0 ? *l / s->p.repeat_penalty : *l * s->p.repeat_penalty;
        *l -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->counts[id];
    }
    return s->adjusted;
}

/* The first index of the largest logit, as a scan from the start keeping the first strictly
 * greater would find it (NaNs never win; l[0] where nothing beats it), in two passes: the largest
 * value over eight running maxima, then its first position. A scan that carries the index makes
 * each comparison wait for the last one's load: at qwen3's 151,936 logits 0.2-1.3 ms a token on the
 * development machine, against ~0.04 ms this way. */
static int32_t argmax(const float *l, int32_t n) {
    enum { LANES = 8 };
    float m[LANES];
    for (int k = 0; k < LANES; k++) m[k] = l[0];
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) m[k] = l[i + k] > m[k] ? l[i + k] : m[k];
    for (; i < n; i++) m[0] = l[i] > m[0] ? l[i] : m[0];
    float best = m[0];
    for (int k = 1; k < LANES; k++) best = m[k] > best ? m[k] : best;
    for (i = 0; i < n; i++)
        if (l[i] == best) return i;
    return 0; /* (l[0] is NaN) */
}

int32_t sampler_sample(struct sampler *s, const float *logits) {
    const float *l = apply_penalties(s, logits);
    if (s->p.temperature <= 0.0f) return argmax(l, s->n_vocab);
    int32_t n = s->n_vocab;
    for (int32_t i = 0; i < n; i++) s->cand[i] = (struct candidate){i, l[i]};
    /* top-k: keep the k best, in order (without it, the nucleus needs every candidate sorted). */
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_best(s->cand, n, s->p.top_k);
        n = s->p.top_k;
    } else {
        qsort(s->cand, (size_t)n, sizeof *s->cand, by_logit_desc);
    }
    /* Probabilities at temperature 1 for the nucleus and min-p filters. */
    const float max = s->cand[0].logit;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += exp((double)(s->cand[i].logit - max));
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)(s->cand[i].logit - max)) / total;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) {
        const float floor_logit = max + logf(s->p.min_p);
        int32_t keep = 1;
        while (keep < n && s->cand[keep].logit >= floor_logit) keep++;
        n = keep;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)(s->cand[i].logit - max) / s->p.temperature);
    const double r = (double)(next_random(&s->rng) >> 11) * 0x1p-53 * sum;
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((double)(s->cand[i].logit - max) / s->p.temperature);
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}
