/* The comparison switches (struct plan_options) from the environment: the one place they are read,
 * for the commands that compare placements (plan, bench, eval, run). The library never reads them;
 * docs/cli.md lists them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/error.h"

/* A switch that is on unless set to "0": true where it is turned off. */
static bool turned_off(const char *name) {
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
}

/* PSHARD_DECODE_FROM=N: with --decode-set, decode steps run over that set only over caches of N
 * cells or more, as a band over long caches would. */
static pshard_status decode_from(int32_t *out) {
    const char *v = getenv("PSHARD_DECODE_FROM");
    if (!v || !*v) return PSHARD_OK;
    char *end;
    const long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > INT32_MAX)
        return core_fail(PSHARD_ERR_INVALID_ARG, "PSHARD_DECODE_FROM=%s: want a count of cells of at least 1", v);
    *out = (int32_t)n;
    return PSHARD_OK;
}

/* PSHARD_KV_CPU_SHARE=S: one-token ring tiers that carry KV up give the CPU this share of each
 * carried layer's cached cells, in place of the cost model's. */
static pshard_status kv_cpu_share(float *out) {
    const char *v = getenv("PSHARD_KV_CPU_SHARE");
    if (!v || !*v) return PSHARD_OK;
    char *end;
    const double s = strtod(v, &end);
    if (*end || !(s > 0 && s < 1))
        return core_fail(PSHARD_ERR_INVALID_ARG, "PSHARD_KV_CPU_SHARE=%s: want a share between 0 and 1", v);
    *out = (float)s;
    return PSHARD_OK;
}

/* PSHARD_ROUTED_QUOTA=q1,q2,...,qk: routed tiers' GPU share of a token's experts, for 1..k of them
 * not resident, in place of the cost model's (plan_build checks it against the model). */
static pshard_status routed_quota(struct plan_options *o) {
    const char *v = getenv("PSHARD_ROUTED_QUOTA");
    if (!v || !*v) return PSHARD_OK;
    int n = 0;
    o->routed_quota[0] = 0;
    for (const char *s = v; *s;) {
        char *end;
        const long q = strtol(s, &end, 10);
        if (end == s || q < 0 || q > PLAN_MAX_ROUTED || n == PLAN_MAX_ROUTED || (*end && *end != ','))
            return core_fail(PSHARD_ERR_INVALID_ARG, "PSHARD_ROUTED_QUOTA=%s: want up to %d counts 0..%d, comma-separated", v,
                             PLAN_MAX_ROUTED, PLAN_MAX_ROUTED);
        o->routed_quota[++n] = (uint8_t)q;
        s = *end ? end + 1 : end;
    }
    o->routed_quota_count = n;
    return PSHARD_OK;
}

pshard_status cli_plan_options(struct plan_options *o) {
    *o = (struct plan_options){
        .no_split_ffn = turned_off("PSHARD_SPLIT_FFN"),
        .no_stage_static = turned_off("PSHARD_STAGE_STATIC"),
        .no_kv_stream = turned_off("PSHARD_KV_STREAM"),
        .no_kv_split = turned_off("PSHARD_KV_SPLIT"),
        .no_long_decode = turned_off("PSHARD_LONG_DECODE"),
        .trace_handoffs = getenv("PSHARD_TRACE_HANDOFFS") != NULL,
    };
    CORE_TRY(decode_from(&o->decode_from));
    CORE_TRY(kv_cpu_share(&o->kv_cpu_share));
    return routed_quota(o);
}
