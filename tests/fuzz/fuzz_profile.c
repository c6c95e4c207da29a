/* libFuzzer target for the machine profile's JSON (a cache file, or one named with --profile):
 * any byte string must load cleanly or fail with a message, never out of bounds; a profile that
 * loads (a file dated within the last 90 days) must have every rate finite and not negative, and
 * save back to the same values. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan/profile.h"

static char path[64], copy[64];

static void check_rates(const struct profile *p) {
    const struct profile_rate *tables[] = {p->cpu_matmul, p->cpu_experts, p->gpu_matmul, p->gpu_experts};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (int f = 0; f < PROFILE_FORMATS; f++)
            for (int i = 0; i < PROFILE_TOKENS; i++)
                if (!(tables[t][f].s_per_byte[i] >= 0) || !isfinite(tables[t][f].s_per_byte[i])) abort();
    for (int i = 0; i < PROFILE_TOKENS; i++) {
        if (!(profile_at_tokens(p->cpu_attn, i * 300.0) >= 0)) abort();
        if (!(profile_at_size(p->h2d_gbps, i * 1e7) >= 0)) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/fuzz-profile-%d.json", (int)getpid());
        snprintf(copy, sizeof copy, "/tmp/fuzz-profile-%d-copy.json", (int)getpid());
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    struct profile p;
    memset(&p, 0, sizeof p);
    const pshard_status loaded = profile_load(path, NULL, &p);
    unlink(path); /* each input's files go as soon as they are read: a run leaves nothing behind */
    if (loaded != PSHARD_OK) return 0;
    check_rates(&p);
    struct profile again;
    const bool same = profile_save(copy, &p) == PSHARD_OK && profile_load(copy, NULL, &again) == PSHARD_OK;
    unlink(copy);
    if (!same) abort();
    if (memcmp(&p.cpu_matmul, &again.cpu_matmul, sizeof p.cpu_matmul) || p.zero_copy[3] != again.zero_copy[3]) abort();
    return 0;
}
