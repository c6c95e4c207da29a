/* Token sampling: repetition/presence/frequency penalties, top-k, top-p, min-p, temperature,
 * and a seeded generator, so the same seed gives the same text. Temperature 0 is greedy. */
#ifndef ENGINE_SAMPLER_H
#define ENGINE_SAMPLER_H

#include <stdint.h>

#include "pshard.h"

struct sampler_params {
    float temperature;      /* <= 0: greedy (argmax after penalties) */
    int32_t top_k;          /* 0: off */
    float top_p;            /* 1: off */
    float min_p;            /* 0: off */
    float repeat_penalty;   /* 1: off; divides positive logits, multiplies negative ones */
    float presence_penalty; /* 0: off; subtracted once from tokens seen in the window */
    float frequency_penalty;/* 0: off; subtracted per occurrence */
    int32_t penalty_last_n; /* window of recent tokens the penalties look at */
    uint64_t seed;
};

void sampler_default_params(struct sampler_params *p);

struct sampler;

pshard_status sampler_create(const struct sampler_params *params, int32_t n_vocab, struct sampler **out);
void sampler_free(struct sampler *s);

/* Choose the next token from logits (n_vocab floats, left unchanged). */
int32_t sampler_sample(struct sampler *s, const float *logits);

/* Log-probabilities under the raw distribution of logits (no penalties, temperature 1): token's,
 * returned, and the k most likely tokens' (ids most likely first, ties by id) into ids and
 * logprobs (k <= n_vocab; 0: none). Uses the sampler's scratch. */
float sampler_logprobs(struct sampler *s, const float *logits, int32_t token, int32_t k, int32_t *ids, float *logprobs);

/* Record a token as part of the text (prompt or generated) for the penalties. */
void sampler_accept(struct sampler *s, int32_t token);

/* Forget the history (a new conversation); the generator keeps its state. */
void sampler_reset(struct sampler *s);

#endif
