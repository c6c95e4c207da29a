/* Printing plans: each shard's place per tier, the candidates auto weighed with their predicted
 * times, the budget's breakdown and the bytes a decode token moves. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "plan/cost.h"
#include "plan/plan.h"

static double mb(uint64_t bytes) { return bytes / 1048576.0; }

/* Prose lines of the printout wrap at this width (the tables are as wide as their columns). */
enum { NOTE_WIDTH = 100 };

void plan_note(FILE *out, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    const char *line = text;
    while (strlen(line) > NOTE_WIDTH) {
        const char *cut = line + NOTE_WIDTH;
        while (cut > line && *cut != ' ') cut--;
        if (cut == line) cut = strchr(line + NOTE_WIDTH, ' '); /* one word longer than the width */
        if (!cut) break;
        fprintf(out, "%.*s\n", (int)(cut - line), line);
        line = cut + 1;
    }
    fprintf(out, "%s\n", line);
}

/* A shard's place in one tier, as a column of the shard table. */
static void place_text(const struct plan *p, const struct model *m, const struct plan_tier *t, const struct shard *s,
                       uint32_t i, char *buf, size_t size) {
    if (s->kind == SHARD_MOE && t->shard[i] != PLACE_CPU) {
        const uint32_t r = p->experts_resident[s->layer], v = plan_experts_vram(p, t, s->layer), g = t->experts_gpu[s->layer];
        if (v > r)
            snprintf(buf, size, "%u+%u/%u/%u", r, v - r, g - v, s->n_expert - g);
        else
            snprintf(buf, size, "%u/%u/%u", r, g - r, s->n_expert - g);
    } else if (t->shard[i] == PLACE_STREAMED && plan_ffn_split(t, s)) {
        const uint32_t f = t->ffn_rows_gpu[s->layer];
        snprintf(buf, size, "0/%u/%u", f, m->hp.n_ff - f);
    } else {
        snprintf(buf, size, "%s", plan_reads_lent(p, t, i) ? "IN SLOT" : placement_name(t->shard[i]));
    }
}

static void range_label(int32_t lo, int32_t hi, char *buf, size_t size) {
    if (lo == hi) snprintf(buf, size, "%d", lo);
    else if (hi) snprintf(buf, size, "%d-%d", lo, hi);
    else snprintf(buf, size, "%d+", lo);
}

/* The steps tier t runs in this plan (its start moves down where the tier's plan is predicted
 * faster than the one before: planner.c, move_boundaries). */
static void tier_label(const struct plan *p, int t, char *buf, size_t size) {
    range_label(p->tier[t].min_tokens, t + 1 < PLAN_TIERS ? p->tier[t + 1].min_tokens - 1 : 0, buf, size);
}

/* The steps a tier's candidates are weighed for. */
static void weighed_label(int t, char *buf, size_t size) {
    range_label(plan_tier_tokens[t], t + 1 < PLAN_TIERS ? plan_tier_tokens[t + 1] - 1 : 0, buf, size);
}

const char *plan_set_name(enum plan_set set) {
    switch (set) {
    case PLAN_SET_NO_RING: return "no ring";
    case PLAN_SET_RING: return "ring";
    case PLAN_SET_ALL_KV: return "all KV";
    default: return "?";
    }
}

void plan_candidate_name(const struct plan_candidate *c, char *buf, size_t size) {
    char family[32];
    if (c->family == PLAN_DYNAMIC && c->share > 0) snprintf(family, sizeof family, "dynamic %.2f", c->share);
    else if (c->family == PLAN_DYNAMIC) snprintf(family, sizeof family, "dynamic balanced");
    else snprintf(family, sizeof family, "%s", plan_family_name(c->family));
    if (c->family == PLAN_CPU || c->set == PLAN_SET_RING) snprintf(buf, size, "%s", family);
    else snprintf(buf, size, "%s (%s)", family, plan_set_name(c->set));
}

/* auto: what each tier weighed, predicted times, and the choice. */
static void print_candidates(const struct plan *p, FILE *out) {
    const int last = plan_prompt_tier(p);
    plan_note(out, "candidates (predicted seconds per step of the tier's fewest tokens at the end of the context; "
              "* = chosen, from %d tokens on for its time per token at both ends of the tier; = the same "
              "placement as a candidate above):", PLAN_RING_MIN_TOKENS);
    fprintf(out, "  %-26s", "plan");
    for (int t = 0; t <= last; t++) {
        char label[24];
        weighed_label(t, label, sizeof label);
        fprintf(out, " %11s", label);
    }
    fprintf(out, " %9s %8s %9s %10s %10s\n", "VRAM wts", "KV", "staging", "host B/tok", "PCIe B/tok");
    for (uint32_t c = 0; c < p->n_candidates; c++) {
        const struct plan_candidate *k = &p->candidates[c];
        char name[40];
        plan_candidate_name(k, name, sizeof name);
        fprintf(out, "  %-26s", name);
        for (int t = 0; t <= last; t++) {
            char cell[24];
            bool same = false;
            for (uint32_t e = 0; e < c; e++) same |= p->candidates[e].key[t] == k->key[t];
            snprintf(cell, sizeof cell, "%.4g%s", k->seconds[t], p->chosen[t] == (int)c ? "*" : same ? "=" : "");
            fprintf(out, " %11s", cell);
        }
        fprintf(out, " %8.0fM %7.0fM %8.0fM %9.1fM %9.1fM\n", mb(k->vram_weights), mb(k->vram_kv), mb(k->vram_staging),
                mb(k->host_bytes_per_token), mb(k->pcie_bytes_per_token));
    }
    const int n_prompt = plan_typical_prompt(p->n_ctx);
    char sets[256];
    const struct plan_band *band = &p->weighed_band;
    if (p->decode && p->decode_from > 0) { /* a band, or a decode set asked for over long caches only */
        const bool b = band->weighed;
        const enum plan_set to = b ? band->set : p->weighed_phases.decode, from = b ? band->below : p->weighed_phases.prompt;
        snprintf(sets, sizeof sets, "steps of fewer than %d tokens over caches of %d cells or more run over the %s set, "
                 "the others over the %s set: VRAM is carved anew when the set changes (predicted %.0f ms to the %s set, "
                 "%.0f ms back)", PLAN_PHASE_TOKENS, p->decode_from, plan_set_name(to), plan_set_name(from),
                 1e3 * (b ? band->to_long : p->weighed_phases.to_decode), plan_set_name(to),
                 1e3 * (b ? band->back : p->weighed_phases.to_prompt));
    } else if (p->decode && p->decode_until < INT32_MAX)
        snprintf(sets, sizeof sets, "steps of fewer than %d tokens over caches of fewer than %d cells run over the %s set, "
                 "the others over the %s set: VRAM is carved anew when the set changes (predicted %.0f ms to decode, "
                 "%.0f ms back)", PLAN_PHASE_TOKENS, p->decode_until, plan_set_name(p->weighed_phases.decode),
                 plan_set_name(p->weighed_phases.prompt), 1e3 * p->weighed_phases.to_decode,
                 1e3 * p->weighed_phases.to_prompt);
    else if (p->decode)
        snprintf(sets, sizeof sets, "steps of fewer than %d tokens run over the %s set, larger ones over the %s set: "
                 "VRAM is carved anew when the phase changes (predicted %.0f ms to decode, %.0f ms back)",
                 PLAN_PHASE_TOKENS, plan_set_name(p->weighed_phases.decode), plan_set_name(p->weighed_phases.prompt),
                 1e3 * p->weighed_phases.to_decode, 1e3 * p->weighed_phases.to_prompt);
    else
        snprintf(sets, sizeof sets, "the tiers share one resident set, so switching between them copies nothing");
    if (p->n_seq > 1)
        plan_note(out, "predicted for %d requests at once: %.3f s until every %d-token prompt is read, then %.1f tokens/s "
                  "in all (%.1f each); %s", p->n_seq, p->predicted_ttft, n_prompt,
                  p->predicted_decode > 0 ? p->n_seq / p->predicted_decode : 0,
                  p->predicted_decode > 0 ? 1 / p->predicted_decode : 0, sets);
    else
        plan_note(out, "predicted: %.3f s to the first token of a %d-token prompt, then %.1f tokens/s; %s", p->predicted_ttft,
                  n_prompt, p->predicted_decode > 0 ? 1 / p->predicted_decode : 0, sets);
    /* Which set, and why: each one's typical request, its tiers at their best. */
    const int n_out = p->n_decode;
    char times[32] = "";
    if (p->n_seq > 1) snprintf(times, sizeof times, ", %d times at once", p->n_seq);
    plan_note(out, "resident sets weighed, for a %d-token prompt then %d tokens%s (the soonest wins, or within %.0f%% of it "
              "one whose first token is more than %.0f%% sooner; decoding over another set wins where the request, "
              "both changes counted, is more than %.0f%% sooner):",
         n_prompt, n_out, times, 100 * PLAN_SET_MARGIN, 100 * PLAN_SET_MARGIN, 100 * PLAN_SET_MARGIN);
    static const enum plan_set order[] = {PLAN_SET_RING, PLAN_SET_NO_RING, PLAN_SET_ALL_KV};
    const int chosen = p->chosen[last] >= 0 ? p->chosen[last] : -1;
    const bool cpu_chosen = chosen >= 0 && p->candidates[chosen].family == PLAN_CPU;
    for (size_t i = 0; i <= sizeof order / sizeof order[0]; i++) {
        const bool cpu = i == sizeof order / sizeof order[0];
        const double ttft = cpu ? p->weighed_cpu.ttft : p->weighed_set[order[i]].ttft;
        const double decode = cpu ? p->weighed_cpu.decode : p->weighed_set[order[i]].decode;
        if (ttft <= 0 || !isfinite(ttft) || !isfinite(decode)) continue;
        const bool is_chosen = cpu ? cpu_chosen : !cpu_chosen && chosen >= 0 && p->candidates[chosen].set == order[i];
        fprintf(out, "  %-10s %8.3f s + %d x %.4f s = %7.2f s%s\n", cpu ? "CPU alone" : plan_set_name(order[i]), ttft,
                n_out, decode, ttft + n_out * decode, is_chosen && !p->decode ? "   chosen" : is_chosen ? "   chosen for prompts" : "");
    }
    const struct plan_phases *ph = &p->weighed_phases;
    if (ph->weighed) {
        const double ttft = p->weighed_set[ph->prompt].ttft, decode = p->weighed_set[ph->decode].decode;
        const bool pair = p->decode && (p->decode_until < INT32_MAX || p->decode_from == 0);
        fprintf(out, "  %s, then decoding over %s: %.3f s + %.3f s + %d x %.4f s + %.3f s = %.2f s%s\n",
                plan_set_name(ph->prompt), plan_set_name(ph->decode), ttft, ph->to_decode, n_out, decode, ph->to_prompt,
                ttft + ph->to_decode + n_out * decode + ph->to_prompt, pair ? "   chosen" : "");
    }
    if (band->weighed) {
        char back[64] = "; none back: it is the prompt's set";
        if (band->back > 0) snprintf(back, sizeof back, ", %.3f s back", band->back); /* (0: the prompt's set) */
        plan_note(out, "long caches: from %d cells on, a decode token over the %s set is predicted %.4f s, over the %s set "
                  "%.4f s; %d tokens save %.3f s there, more than the changes of set cost (%.3f s to it%s)", band->from,
                  plan_set_name(band->set), band->set_s, plan_set_name(band->below), band->below_s, n_out,
                  n_out * (band->below_s - band->set_s), band->to_long, back);
    }
}

/* A plan's VRAM, one line. */
static void print_budget(const struct plan *p, const char *what, FILE *out) {
    const struct plan_budget *b = &p->budget;
    fprintf(out, "VRAM%s: weights %.1f MB + KV %.1f MB + activations %.1f MB + work %.1f MB + cuBLAS %.1f MB + staging "
                 "%.1f MB (%u slots of %.1f MB) + file mapping %.1f MB; %.1f MB of the budget unused\n",
            what, mb(b->weights), mb(b->kv), mb(b->activations), mb(b->work), mb(b->blas), mb(b->staging), p->n_slots,
            mb(p->slot_bytes), mb(b->mapping), mb(b->free));
}

/* A shard's row after its number, kind and layer: its place in decode steps (dp's decode tier)
 * and in full prompt steps (p's last tier), its weights, and where its KV cache lies. Returns
 * the row's length (cut at size - 1). */
static int shard_row(const struct plan *p, const struct plan *dp, const struct model *m, uint32_t i, char *buf,
                      size_t size) {
    const struct shard *s = &m->shards[i];
    char decode[48], prompt[48], kv[16] = "";
    place_text(dp, m, &dp->tier[PLAN_TIER_DECODE], s, i, decode, sizeof decode);
    place_text(p, m, &p->tier[plan_prompt_tier(p)], s, i, prompt, sizeof prompt);
    if (s->kind == SHARD_ATTN) {
        const char *at = p->kv_gpu[s->layer] ? "VRAM" : "host", *at_decode = dp->kv_gpu[s->layer] ? "VRAM" : "host";
        if (at == at_decode) snprintf(kv, sizeof kv, " %9s", at);
        else snprintf(kv, sizeof kv, " %4s/%4s", at, at_decode);
    }
    return snprintf(buf, size, " %-12s %-12s %12.1f%s", decode, prompt, mb(s->weight_bytes), kv);
}

enum { SHARD_ROW = 512 }; /* room for shard_row's widest row */

/* Layers like+1 .. to, placed as layer `like`, whose shards are [first, first + n): printed as
 * one line (none while to == like). */
struct fold {
    int32_t like, to;
    uint32_t first, n;
};

static void print_fold(const struct fold *f, FILE *out) {
    if (f->to <= f->like) return;
    char layers[32];
    range_label(f->like + 1, f->to, layers, sizeof layers);
    fprintf(out, "  %-12s (shards %u-%u, layer%s %s: as layer %d)\n", "", f->first + f->n,
            f->first + f->n * (uint32_t)(f->to - f->like + 1) - 1, f->to > f->like + 1 ? "s" : "", layers, f->like);
}

/* Whether shards [i, i + n) are placed as f's layer's, kind for kind and row for row. */
static bool placed_alike(const struct plan *p, const struct plan *dp, const struct model *m, uint32_t i, uint32_t n,
                         const struct fold *f) {
    if (n != f->n) return false;
    for (uint32_t j = 0; j < n; j++) {
        char row[SHARD_ROW], like[SHARD_ROW];
        shard_row(p, dp, m, i + j, row, sizeof row);
        shard_row(p, dp, m, f->first + j, like, sizeof like);
        if (m->shards[i + j].kind != m->shards[f->first + j].kind || strcmp(row, like)) return false;
    }
    return true;
}

/* The shard table. Unless every_shard, a run of layers whose shards are all placed alike prints
 * its first layer and one line for the rest (qwen30b's 48 layers at 8 GB: 2 layers' rows). */
static void print_shards(const struct plan *p, const struct plan *dp, const struct model *m, bool every_shard,
                         FILE *out) {
    struct fold f = {-1, -1, 0, 0};
    fprintf(out, "  %-5s %-6s %5s %-12s %-12s %12s %9s\n", "#", "shard", "layer", "decode", "prompt", "weights MB",
            "KV");
    for (uint32_t i = 0; i < m->n_shards;) {
        const struct shard *s = &m->shards[i];
        uint32_t end = i + 1; /* the layer's shards: [i, end) */
        while (s->layer >= 0 && end < m->n_shards && m->shards[end].layer == s->layer) end++;
        if (!every_shard && f.like >= 0 && s->layer == f.to + 1 && placed_alike(p, dp, m, i, end - i, &f)) {
            f.to = s->layer;
            i = end;
            continue;
        }
        print_fold(&f, out);
        for (uint32_t j = i; j < end; j++) {
            char row[SHARD_ROW], layer[16] = "-";
            if (m->shards[j].layer >= 0) snprintf(layer, sizeof layer, "%d", m->shards[j].layer);
            shard_row(p, dp, m, j, row, sizeof row);
            fprintf(out, "  %-5u %-6s %5s%s\n", j, shard_kind_name(m->shards[j].kind), layer, row);
        }
        f = (struct fold){s->layer, s->layer, i, end - i};
        i = end;
    }
    print_fold(&f, out);
}

/* A tier's ring, in the tiers line: whether it carries KV up, and the share of those cells its
 * one-token steps leave to the CPU. */
static const char *ring_tag(const struct plan_tier *t, char *buf, size_t size) {
    if (t->kv_stream && t->kv_cpu_share > 0) snprintf(buf, size, " (ring, KV up, %.0f%% on the CPU)", 100.0 * t->kv_cpu_share);
    else snprintf(buf, size, "%s", t->kv_stream ? " (ring, KV up)" : t->ring ? " (ring)" : "");
    return buf;
}

void plan_print(const struct plan *p, const struct model *m, bool every_shard, FILE *out) {
    const int last = plan_prompt_tier(p);
    const int32_t typical = plan_typical_prompt(p->n_ctx) + 1; /* a typical request's first decode step */
    const struct plan *dp = plan_for_step(p, 1, typical); /* the decode phase's plan there */
    const struct plan_tier *d = &dp->tier[PLAN_TIER_DECODE];
    fprintf(out, "plan %s: VRAM budget %.0f MB; per tier (tokens per step):", plan_family_name(dp->family),
            mb(p->budget.total));
    for (int t = 0; t <= last; t++) {
        char label[24];
        tier_label(p, t, label, sizeof label);
        const struct plan *runs = plan_for_step(p, plan_tier_tokens[t], typical);
        const struct plan_tier *rt = &runs->tier[t];
        char tag[48];
        fprintf(out, " %s '%s'%s%s", label, plan_family_name(rt->family), ring_tag(rt, tag, sizeof tag),
                runs != p ? " (decode set)" : "");
    }
    fputc('\n', out);
    for (int t = 1; t <= last; t++)
        if (p->tier[t].min_tokens < plan_tier_tokens[t])
            plan_note(out, "(steps of %d-%d tokens run the %d-token tier's plan, predicted faster there than the %d-token "
                      "tier's)", p->tier[t].min_tokens, plan_tier_tokens[t] - 1, plan_tier_tokens[t],
                 plan_tier_tokens[t - 1]);
    if (p->n_candidates) {
        print_candidates(p, out);
    } else if (p->any_gpu) {
        fprintf(out, "predicted seconds per step:");
        for (int t = 0; t <= last; t++) fprintf(out, " %d token%s %.4g;", plan_tier_tokens[t], plan_tier_tokens[t] == 1 ? "" : "s", p->predicted[t]);
        fprintf(out, " %.3f s to the first token, then %.1f tokens/s\n", p->predicted_ttft,
                p->predicted_decode > 0 ? 1 / p->predicted_decode : 0);
    }
    if (p->n_expert) {
        plan_note(out, "(MoE shards on the GPU: experts resident/streamed/on the CPU; router and shared parts resident)");
        plan_note(out, "(an MoE layer's resident and streamed experts are computed in one call)");
    }
    const struct plan_tier *decode = &p->tier[PLAN_TIER_DECODE];
    if (decode->routed) {
        const int k = (int)m->hp.n_expert_used;
        char quota[8 * (PLAN_MAX_ROUTED + 1)] = "";
        for (int n = 1; n <= k && n <= PLAN_MAX_ROUTED; n++) {
            const size_t used = strlen(quota);
            snprintf(quota + used, sizeof quota - used, "%s%d:%d", n > 1 ? " " : "", n, decode->routed_quota[n]);
        }
        plan_note(out, "(one-token steps split where the layer splits by each token's routing, not by range: of N of its "
                  "%d experts not resident, the GPU reads in place N=%s; the CPU computes the rest)", k, quota);
    }
    if (plan_splits_ffn(p) || plan_splits_ffn(dp))
        plan_note(out, "(FFN shards split with the CPU: rows resident/streamed/on the CPU, both sides at once)");
    if (p->decode && dp == p->decode)
        plan_note(out, "(decode: its own resident set, carved when the phase changes; KV: prompt/decode phase where they "
                  "differ)");
    if (p->decode && dp != p->decode) {
        const struct plan_tier *lt = &p->decode->tier[PLAN_TIER_DECODE];
        char tag[48];
        plan_note(out, "(decode steps over caches of %d cells or more: '%s'%s over a resident set of their own, carved when "
                  "the cache grows that long; the shard table shows shorter caches)", p->decode_from,
                  plan_family_name(lt->family), ring_tag(lt, tag, sizeof tag));
    }
    for (int t = 0; t <= last; t++)
        if (p->tier[t].kv_stream) {
            plan_note(out, "(KV up: the ring carries the cached KV cells of the layers whose cache is in host memory to "
                      "the GPU's attention with its matrices, and the step's new cells back down)");
            break;
        }
    if (d->kv_cpu_share > 0 || (p->decode && p->decode->tier[PLAN_TIER_DECODE].kv_cpu_share > 0))
        plan_note(out, "(KV up, N%% on the CPU: one-token steps attend the first N%% of each carried layer's cached cells on "
                  "the CPU from host memory while the GPU attends the rest, whose cells alone go up; the GPU merges both)");
    if (plan_lends(p))
        plan_note(out, "(IN SLOT, and experts R+S: read from the staging slot where the ring's last step left it, "
                  "S experts past the R resident; copied there first when no prompt step has used the ring yet)");
    print_shards(p, dp, m, every_shard, out);
    char what[64];
    if (p->decode && p->decode_from > 0)
        snprintf(what, sizeof what, " in decode steps over %d cells or more", p->decode_from);
    else if (p->decode && p->decode_until < INT32_MAX)
        snprintf(what, sizeof what, " in decode steps over fewer than %d cells", p->decode_until);
    else
        snprintf(what, sizeof what, " in decode steps");
    print_budget(p, p->decode ? " in prompt steps" : "", out);
    if (p->decode) print_budget(p->decode, what, out);
    plan_note(out, "per decode token: %.1f MB of weights read by the CPU from host memory, %.1f MB streamed over PCIe, "
              "%.1f MB read by the GPU from VRAM",
         mb(d->host_bytes_per_token), mb(d->pcie_bytes_per_token), mb(d->gpu_bytes_per_token));
}

void plan_print_times(const struct plan *p, const struct model *m, const struct profile *prof, FILE *out) {
    if (!p->any_gpu) return;
    struct profile defaults;
    prof = plan_profile(prof, &defaults);
    plan_note(out, "where a step's time goes (predicted ms per step of each tier's plan at the tier's fewest tokens; "
              "the GPU and the CPU work at once in split layers, so the parts add up to more than the step):");
    fprintf(out, "  %-10s %9s %9s %9s %9s %15s\n", "tokens", "step", "GPU", "CPU", "PCIe", "launches, waits");
    for (int t = 0; t <= plan_prompt_tier(p); t++) {
        const int32_t n = plan_tier_step_tokens(p, t);
        const struct plan *runs = plan_for_step(p, n, p->n_ctx);
        struct cost_step c;
        cost_step(prof, m, runs, &runs->tier[t], n, p->n_ctx > n ? p->n_ctx - n : 0, &c);
        fprintf(out, "  %-10d %9.2f %9.2f %9.2f %9.2f %15.2f\n", n, c.seconds * 1e3, c.gpu_s * 1e3, c.cpu_s * 1e3,
                c.pcie_s * 1e3, c.overhead_s * 1e3);
    }
}
