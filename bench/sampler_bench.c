/* Milliseconds a token the sampler takes with its default filters (top-k 40, top-p 0.95, min-p
 * 0.05, temperature 0.8) over a vocabulary of each size given, the mean of 50 tokens of random
 * logits (uniform over [-10, 10)).
 * Usage: sampler_bench VOCAB... (for example 49152 151936: SmolLM2's and qwen3's) */
#include <stdio.h>
#include <stdlib.h>

#include "core/timer.h"
#include "engine/sampler.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: sampler_bench VOCAB...\n");
        return 2;
    }
    for (int a = 1; a < argc; a++) {
        const int vocab = atoi(argv[a]), tokens = 50;
        float *logits = vocab > 0 ? malloc(sizeof *logits * (size_t)vocab) : NULL;
        struct sampler_params p;
        sampler_default_params(&p);
        struct sampler *s = NULL;
        if (!logits || sampler_create(&p, vocab, &s) != PSHARD_OK) {
            fprintf(stderr, "sampler_bench: '%s' is not a vocabulary size this machine can sample\n", argv[a]);
            free(logits);
            return 1;
        }
        uint32_t seed = 1;
        double ms = 0;
        long ids = 0;
        for (int t = 0; t < tokens; t++) {
            for (int i = 0; i < vocab; i++) {
                seed = seed * 1664525u + 1013904223u;
                logits[i] = (float)(seed >> 8) / 16777216.0f * 20.0f - 10.0f;
            }
            const double t0 = core_now_ms();
            ids += sampler_sample(s, logits);
            ms += core_now_ms() - t0;
        }
        printf("vocabulary %d: %.3f ms a token (mean token id %ld)\n", vocab, ms / tokens, ids / tokens);
        sampler_free(s);
        free(logits);
    }
    return 0;
}
