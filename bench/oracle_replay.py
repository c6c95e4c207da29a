#!/usr/bin/env python3
"""Score the planner against step times measured by `pshard bench --oracle` (its --json output),
without a GPU: for each configuration, `pshard plan --profile PROFILE --tokens ...` (the profile
measured on the machine that ran the oracle) gives every candidate's predicted time at each step
size timed and the candidate the plan runs there; the measured times say which candidate really
was fastest.

Usage: bench/oracle_replay.py [--by-plan] [--latest] [--anchor] [--as-profiled | --cpu-now] PSHARD PROFILE MODEL_DIR ORACLE.json[:PROFILE.json][@N][,NAME=VALUE...] [...]
(an oracle run's file may name its own profile after a colon; without one, the profile the run wrote
beside it (FILE less .json, plus .profile.json) where there is one; PROFILE is for the others; a profile
of an older format is read with the fields added since set to what its format meant; @N keeps
only its steps of at most N tokens, for a run whose larger steps the executor has changed since;
NAME=VALUE sets a variable for `pshard plan` on that run's steps, e.g. PSHARD_KV_STREAM=0 for a
run measured before ring tiers carried KV cells, whose candidates placed attention otherwise)
Prints one line per configuration and the summary `pshard bench --oracle` prints: how often the
choice was the measured best (among all candidates, and among those over the chosen plan's
resident set), how much slower when not (and how often within 2, 5 and 10% of the best), how many
misses were timed over loads that overlap the best's (one more load could rank the two the other
way; among all candidates, and again over the chosen set), and the
median prediction error; and how repeatable the
measured best is: redrawn from the loads it was timed over, how often the same plan comes out
best; and what the loads' strays from their plan's median share: the correlation of one load's strays
across its step sizes (a load runs slow or fast throughout) against that of the plans of one round
of loads at one step size (the machine ran slow or fast for a while); and, beyond what the oracle
prints, whether the resident set the choices share was the fastest for the request the planner
weighs sets by (a 1K-token prompt, or half the context, then 128 tokens), each set at its best plan
measured at each step size. --by-plan adds, per model, candidate and tokens per step, the median signed prediction
error (where the cost model is off, and which way). --latest keeps, of a configuration (model,
budget, context, tokens per step) measured in several of the files, only its row in the file
given last (give the files oldest first): each configuration at its latest measurement. Which
configurations were timed again is a choice, often of the ones that missed; a miss timed again
may come out best by chance, so the summary over all measurements is the one to trust. --anchor
replays each configuration whose run recorded the host's read speed around it (`host_read_gbps`;
runs before this field have none) with the profile's CPU rates scaled to that speed: whether the host's
drift since profiling explains the CPU's share of the prediction error. Runs since start BD
recorded the CPU's figures that follow host memory (host reads, matmuls of up to 4 tokens,
experts of up to 16) timed again before each configuration (`cpu_now`); a row is replayed with
the profile its plans were weighed with (the cached one, or with those figures under `pshard
bench --oracle --cpu-now`, as on BD), --as-profiled with the cached one, --cpu-now with the
figures timed again: one run then scores both ways of weighing its plans against the same
measurements."""
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile


def canonical(label):
    """One name for a candidate, from `pshard plan`'s table or an oracle's JSON of any version:
    "dynamic 0.50 (no ring)", "dynamic 0.5 noring" -> "dynamic 0.50 (no ring)"."""
    label = label.replace(" noring", " (no ring)")
    m = re.match(r"^(\w+)(?: ([\d.]+|balanced))?(?: \((.*)\))?$", label.strip())
    family, share, resident = m.groups()
    name = family + ((" %.2f" % float(share) if share != "balanced" else " balanced") if share else "")
    return name + (" (%s)" % resident if resident else "")


def resident_set(name):
    """The resident set a candidate places over ("(no ring)", "(all KV)", "" for the ring set);
    None for the CPU alone, which takes none (so is within reach of every set)."""
    if name.startswith("cpu"):
        return None
    return name[name.find("("):] if "(" in name else ""


# Fields a profile format added, with what the format before meant by their absence: format 9's
# expert reads beside the CPU were, in format 8, the dense reads' shares.
UPGRADES = {9: {"expert_reads_share_under_cpu": "reads_share_under_cpu",
                "cpu_share_under_expert_reads": "cpu_share_under_reads"},
            12: {"gpu_attn_long": "gpu_attn"},  # format 11 measured attention over one cache length
            13: {"expert_reads_share_under_cpu_16": "expert_reads_share_under_cpu",  # format 12 measured
                 "cpu_share_under_expert_reads_16": "cpu_share_under_expert_reads"}}  # one token's only


def query_heads_per_kv(model):
    """The model's query heads per KV head (its GGUF's attention head counts)."""
    from gguf import GGUFReader
    fields = GGUFReader(model).fields
    def value(suffix):
        key = next(k for k in fields if k.endswith(suffix))
        return int(fields[key].parts[fields[key].data[0]][0])
    return value(".attention.head_count") / value(".attention.head_count_kv")


def upgraded(profile, refusal, model):
    """A copy of profile brought up to the format this pshard reads, where `pshard plan` refused it
    for its format (older oracle runs' profiles): each added field takes the value its format's
    predecessor stood for; format 10's CPU attention is per query head, where format 9 counted a
    KV byte once (taken here as measured with the model replayed); format 11's fixed part of an
    in-place expert call was inside format 10's rate per byte (zero apart). None where the refusal is for
    something else."""
    m = re.search(r"profile format version (\d+) \(this pshard reads (\d+)\)", refusal)
    if not m:
        return None
    p, have, want = json.load(open(profile)), int(m.group(1)), int(m.group(2))
    for version in range(have + 1, want + 1):
        if version == 10:
            group = query_heads_per_kv(model)
            p["cpu_attn"] = [v / group for v in p["cpu_attn"]]
            continue
        if version == 11:  # one token's in-place expert call: its fixed part was in the rate;
            p.setdefault("zero_copy_expert_call_s", 0.0)  # host memory served to both: unmeasured
            p.setdefault("host_served_gbps", 0.0)
            continue
        if version == 14:  # format 13 read weights in place from aligned memory only
            p.setdefault("zero_copy_off", p["zero_copy"])
            p.setdefault("zero_copy_experts_off", p["zero_copy_experts"])
            p.setdefault("in_place_skew", 32)
            continue
        if version == 15:  # format 14's CPU attention read one cache over and over (from the
            continue       # L3); no field was added, so it stands as measured
        if version == 16:  # format 15 timed the CPU's old prompt-step kernels (F16 and the K
            continue       # formats before tiles and four-token kernels); it stands as measured
        if version == 17:  # format 16 timed the AVX2 K kernels before they went by step (and
            continue       # Q4_K/Q5_K before their folded mins) and the CPU's attention head by
                           # head; it stands as measured
        if version == 18:  # format 17 timed the CPU's prompt attention token by token, before
            continue       # tiles; it stands as measured
        if version == 19:  # format 18 timed a decode token's CPU attention over its whole cache,
            continue       # a KV head's group cut among threads; it stands as measured
        if version == 20:  # format 19 priced an MoE router at the model's large matrices' rate:
            p.setdefault("cpu_router", [0.0] * len(p["cpu_attn"]))  # unmeasured, which prices it so
            continue
        if version not in UPGRADES:
            sys.exit("%s: format %d, and no upgrade to format %d is known" % (profile, have, version))
        for field, like in UPGRADES[version].items():
            p.setdefault(field, p[like])
    p["version"] = want
    out = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(p, out)
    out.close()
    print("(%s: format %d read as %d)" % (profile, have, want))
    return out.name


READ_AS = {}  # (profile, model) -> the upgraded copy read in its place


def plan_table(pshard, profile, model, budget_gb, ctx, batch, tokens, env=()):
    """Every candidate's predicted seconds per step at each of `tokens`, as `pshard plan --tokens`
    prices them (each candidate's own plan, at the end of the context), with whether the
    automatic plan runs that candidate's placement there: {name: {n: (seconds, chosen)}}."""
    args = ["-m", model, "--vram-budget", "%dG" % budget_gb, "-c", str(ctx), "-b", str(batch),
            "--tokens", ",".join(str(n) for n in tokens)]

    def plan(p):
        return subprocess.run([pshard, "plan", "--profile", p] + args, capture_output=True, text=True,
                              env=dict(os.environ, **dict(env)))

    proc = plan(READ_AS.get((profile, model), profile))
    if proc.returncode != 0 and (profile, model) not in READ_AS:
        newer = upgraded(profile, proc.stderr, model)
        if newer:
            READ_AS[(profile, model)] = newer
            proc = plan(newer)
    if proc.returncode != 0:
        sys.exit("pshard plan: " + proc.stderr.strip())
    lines = proc.stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("steps ("))
    columns = [int(n) for n in lines[start + 1].split()[1:]]
    table = {}
    for line in lines[start + 2:]:
        m = re.match(r"^  (.+?)\s{2,}(\d.*)$", line)
        if not m:
            break
        cells = m.group(2).split()
        table[canonical(m.group(1))] = {n: (float(c.rstrip("*")), c.endswith("*")) for n, c in zip(columns, cells)}
    return table


def configuration(r):
    """An oracle row's configuration: model, budget, context and tokens per step."""
    return r["model"], r["budget_gb"], r["context"], r["tokens"]


REDRAWS = 1000
DRAW = random.Random(1)


VARIANTS = {}  # (profile, what changed) -> a copy of the profile so changed
PROFILES = {}  # profile path -> its contents, read once


def contents(profile):
    """The profile file's contents, read once."""
    if profile not in PROFILES:
        with open(profile) as f:
            PROFILES[profile] = json.load(f)
    return PROFILES[profile]


def variant(profile, key, change):
    """A copy of the profile changed by change(contents), written once for each key."""
    if (profile, key) not in VARIANTS:
        d = json.loads(json.dumps(contents(profile)))  # a copy to change
        change(d)
        out = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(d, out)
        out.close()
        VARIANTS[(profile, key)] = out.name
    return VARIANTS[(profile, key)]


def anchored(profile, r):
    """The profile to replay row r with under --anchor: where the oracle recorded the host's read
    speed around the configuration (host_read_gbps: before, after), a copy of the profile whose CPU
    rates (matmuls, experts, attention, host reads) are scaled by how much slower or faster the host
    read then than when profiled; else the profile itself."""
    reads = r.get("host_read_gbps")
    if not reads or min(reads) <= 0:
        return profile
    ratio = round(contents(profile)["host_read_gbps"] / statistics.mean(reads), 2)  # > 1: the host read slower
    if ratio == 1:
        return profile

    def scale(d):
        for table in ("cpu_matmul", "cpu_experts"):
            d[table] = {fmt: [v * ratio for v in values] for fmt, values in d[table].items()}
        d["cpu_attn"] = [v * ratio for v in d["cpu_attn"]]
        d["host_read_gbps"] /= ratio
    return variant(profile, ("anchor", ratio), scale)


def weighed_with(profile, r, cpu_now=None):
    """The profile to replay row r with: where the oracle timed the CPU's figures that follow host
    memory again before the configuration (cpu_now), the profile with those if the row's plans were
    weighed with them (weighed_with "cpu_now"; rows of start BD, which has no weighed_with, all
    were) or cpu_now is True; else, or with cpu_now False, the profile itself."""
    now = r.get("cpu_now")
    weighed_now = r.get("weighed_with", "cpu_now") == "cpu_now"
    if not now or cpu_now is False or (cpu_now is None and not weighed_now):
        return profile

    def update(d):
        d["host_read_gbps"] = now["host_read_gbps"]
        for table in ("cpu_matmul", "cpu_experts"):
            d[table].update(now[table])
    return variant(profile, ("now", json.dumps(now, sort_keys=True)), update)


def beside(oracle_file):
    """The profile `pshard bench --oracle --json FILE` writes beside FILE (FILE less .json, plus
    .profile.json), when it is there: the one the run's plans were weighed with."""
    stem = oracle_file[:-5] if oracle_file.endswith(".json") else oracle_file
    return stem + ".profile.json" if os.path.exists(stem + ".profile.json") else ""


def noise_pairs(deviations):
    """Pairs of deviations from a plan's median load: the same load at two step sizes, and two plans
    in the same round of loads (the same index) at one step size."""
    same_load, same_round = [], []
    for by_load in deviations.values():
        for (plan, i), by_tokens in by_load.items():
            steps = sorted(by_tokens)
            same_load += [(by_tokens[a], by_tokens[b]) for k, a in enumerate(steps) for b in steps[k + 1:]]
            for (other, j), theirs in by_load.items():
                if j == i and other > plan:
                    same_round += [(by_tokens[n], theirs[n]) for n in steps if n in theirs]
    return same_load, same_round


def correlation(pairs):
    """Pearson's correlation of the pairs; 0 where either side does not vary."""
    try:
        return statistics.correlation([a for a, _ in pairs], [b for _, b in pairs])
    except statistics.StatisticsError:
        return 0.0


GENERATED = 128  # tokens a request generates, as the planner weighs its resident sets


def workload_report(timed):
    """Whether the resident set the choices share was the measured-fastest for the request the
    planner weighs sets by: a prompt of 1K tokens (or half the context) in steps of the largest
    size timed, then GENERATED one-token steps, each set at each size taking its best plan
    measured (the CPU alone is in reach of every set). Configurations without one-token steps
    and steps of 256 tokens or more (as a prompt runs) are left out."""
    right = total = 0
    worst = 0.0
    for (_, _, model, budget, context), by_n in sorted(timed.items()):
        big = max(by_n)
        if 1 not in by_n or big < 256:
            continue
        chosen = next((resident_set(c) for _, c in by_n.values() if resident_set(c) is not None), None)
        sets = {resident_set(name) for n in (1, big) for name in by_n[n][0]} - {None}
        prompt = min(1024, context // 2)
        request = {}
        for s in sets:
            best = [min((t for name, t in by_n[n][0].items() if resident_set(name) in (None, s)), default=None)
                    for n in (big, 1)]
            if None not in best:
                request[s] = math.ceil(prompt / big) * best[0] + GENERATED * best[1]
        if chosen is None or chosen not in request:
            continue
        slower = request[chosen] / min(request.values()) - 1
        total += 1
        right += slower <= 0
        worst = max(worst, slower)
        if slower > 0:
            print("%-14s %3dG %6d  the set chosen (%s) was %.1f%% slower for a %d-token prompt and %d tokens" % (
                model[:14], budget, context, chosen.strip("()") or "the ring's", 100 * slower, prompt, GENERATED))
    if total:
        print("the resident set the choices share, for a prompt of 1K tokens (or half the context) and %d generated: the "
              "measured fastest in %d of %d; at worst %.1f%% slower" % (GENERATED, right, total, 100 * worst))


def loads_overlap(loads, mine, theirs):
    """Whether two plans (keys of `loads`, each timed over several loads) could be ranked the other
    way by one more load: the first's fastest load beat the second's slowest. Plans not timed over
    loads, or one plan twice, do not overlap."""
    a, b = loads.get(mine), loads.get(theirs)
    return bool(a and b and a is not b and min(a) <= max(b))


def main():
    args = sys.argv[1:]
    by_plan, latest, anchor = "--by-plan" in args, "--latest" in args, "--anchor" in args
    cpu_now = True if "--cpu-now" in args else False if "--as-profiled" in args else None
    for flag in ("--by-plan", "--latest", "--anchor", "--as-profiled", "--cpu-now"):
        if flag in args:
            args.remove(flag)
    if len(args) < 4 or any(a.startswith("--") for a in args):
        sys.exit("usage: " + __doc__.split("Usage: ")[1].split("\n(")[0])
    pshard, profile, model_dir, files = args[0], args[1], args[2], args[3:]
    signed = {}  # (model, candidate) -> tokens -> signed errors
    rows = []
    for item in files:
        item, *assignments = item.split(",")
        env = tuple(tuple(a.split("=", 1)) for a in assignments)
        item, _, most = item.partition("@")
        f, _, own = item.partition(":")
        own = own or beside(f)
        for line in open(f):
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut short (the run was stopped while writing it)
            if not most or r["tokens"] <= int(most):
                p = own or profile
                p = p if anchor else weighed_with(p, r, cpu_now)
                rows.append((anchored(p, r) if anchor else p, env, r))
    if latest:  # the last file's row of each configuration
        last = {configuration(r): r for _, _, r in rows}
        rows = [row for row in rows if last[configuration(row[2])] is row[2]]
    tokens = {}  # (profile, env, model, budget, context) -> the step sizes timed there
    for profile, env, r in rows:
        tokens.setdefault((profile, env, r["model"], r["budget_gb"], r["context"]), set()).add(r["tokens"])
    cache = {}
    best_n = within = configs = 0
    worst = 0.0
    set_best = set_within = 0
    set_worst = 0.0
    overlapped = 0  # choices not the best whose loads overlapped the best's
    set_overlapped = 0  # the same against the best over the choice's resident set
    repeat = []  # per configuration: the share of redraws of its loads that name the same best
    errors, all_errors = [], []
    slowdowns = []  # per configuration: how much slower the choice was than the best (0: it was)
    timed = {}  # configuration less its step size -> step size -> (each plan's time, the choice)
    deviations = {}  # configuration key -> (plan, load) -> tokens -> log(load / plan's median)
    for profile, env, r in rows:
        key = (profile, env, r["model"], r["budget_gb"], r["context"])
        if key not in cache:
            cache[key] = plan_table(pshard, profile, "%s/%s" % (model_dir, r["model"]), r["budget_gb"], r["context"], 1024,
                                    sorted(tokens[key]), env)
        n = r["tokens"]
        table = {name: cells[n] for name, cells in cache[key].items()}
        # Candidates that place the step alike (equal predictions, printed to six digits; at four,
        # gpu and static over another set once read alike) are one plan: its time is the mean of
        # their runs.
        runs = {}
        for c in r["candidates"]:
            name = canonical(c["plan"])
            if c["measured_s"] > 0 and name in table:
                runs.setdefault(table[name][0], []).append(c["measured_s"])
        plan_time = {name: statistics.mean(runs[cell[0]]) for name, cell in table.items() if cell[0] in runs}
        measured = {canonical(c["plan"]): c["measured_s"] for c in r["candidates"] if c["measured_s"] > 0 and not c["cut"]}
        if not plan_time:
            continue
        chosen = next((name for name, cell in table.items() if cell[1]), None)
        if chosen not in plan_time:
            print("%-14s %3dG %6d %5d  chosen %-20s was not measured" % (r["model"][:14], r["budget_gb"], r["context"],
                                                                         r["tokens"], chosen))
            continue
        best = min(plan_time, key=plan_time.get)
        lower = plan_time
        slower = lower[chosen] / lower[best] - 1
        # Close calls are timed over several loads: where the choice's fastest load beat the
        # best's slowest, one more load could have ranked them the other way.
        # (A close call's loads are kept on one of the candidates that place the step alike.)
        loads = {table[canonical(c["plan"])][0]: c["loads"] for c in r["candidates"]
                 if len(c.get("loads") or []) > 1 and canonical(c["plan"]) in table}
        for c in r["candidates"]:
            if len(c.get("loads") or []) > 2:
                mid = statistics.median(c["loads"])
                for i, t in enumerate(c["loads"]):
                    deviations.setdefault(key, {}).setdefault((canonical(c["plan"]), i), {})[n] = math.log(t / mid)
        overlapped += slower > 0 and loads_overlap(loads, table[chosen][0], table[best][0])
        # How often measuring again would name the same best: each plan timed over several loads
        # takes the median of a resample of them (the others keep their one time).
        same = 0
        for _ in range(REDRAWS):  # (candidates that place the step alike are one plan, drawn once)
            drawn = {key: statistics.median(DRAW.choices(times, k=len(times))) for key, times in loads.items()}
            again = {name: drawn.get(table[name][0], t) for name, t in lower.items()}
            same += table[min(again, key=again.get)][0] == table[best][0]
        repeat.append(same / REDRAWS)
        timed.setdefault(key[:5], {})[n] = (lower, chosen)
        configs += 1
        slowdowns.append(slower)
        best_n += slower <= 0
        within += slower <= 0.10
        worst = max(worst, slower)
        # A phase's tiers share one resident set: its best there (or the CPU alone) is in reach.
        reach = {n: t for n, t in lower.items() if resident_set(n) in (None, resident_set(chosen))}
        set_slower = lower[chosen] / min(reach.values()) - 1
        set_overlapped += set_slower > 0 and loads_overlap(loads, table[chosen][0], table[min(reach, key=reach.get)][0])
        set_best += set_slower <= 0
        set_within += set_slower <= 0.10
        set_worst = max(set_worst, set_slower)
        pred = table[chosen][0]
        errors.append(abs(pred / lower[chosen] - 1))
        for name, t in measured.items():
            if name in table:
                all_errors.append(abs(table[name][0] / t - 1))
                signed.setdefault((r["model"], name), {}).setdefault(n, []).append(table[name][0] / t - 1)
        print("%-14s %3dG %6d %5d  %-20s %-20s %8.4f %8.4f %+7.1f%% pred %+7.1f%%" % (
            r["model"][:14], r["budget_gb"], r["context"], r["tokens"], chosen, best, lower[chosen], lower[best],
            100 * slower, 100 * (pred / lower[chosen] - 1)))
    close = [sum(x <= limit for x in slowdowns) for limit in (0.02, 0.05)]
    print("\n%d configurations: the choice was the measured best in %d (%.0f%%), within 2%% in %d, 5%% in %d, 10%% in "
          "%d; at worst %.1f%% slower" % (configs, best_n, 100.0 * best_n / max(configs, 1), *close, within, 100 * worst))
    print("of the %d where it was not, %d were timed over several loads with the choice's fastest load faster than "
          "the best's slowest" % (configs - best_n, overlapped))
    print("measured again (each plan timed over several loads taking the median of a resample of them), the same "
          "plan would be the best in %.0f%% of the configurations on average" % (100 * statistics.mean(repeat) if repeat else 0))
    load_pairs, round_pairs = noise_pairs(deviations)
    if len(load_pairs) > 2 and len(round_pairs) > 2:
        print("where the loads' times stray from their plan's median: within one load, across its step sizes, alike "
              "(correlation %.2f over %d pairs); across the plans of one round of loads, %.2f (%d pairs)" % (
                  correlation(load_pairs), len(load_pairs), correlation(round_pairs), len(round_pairs)))
    print("against the candidates over the resident set the choice runs over (a phase's tiers share one): the measured best in %d "
          "(%.0f%%), within 10%% in %d; at worst %.1f%% slower" % (set_best, 100.0 * set_best / max(configs, 1),
                                                                    set_within, 100 * set_worst))
    print("of the %d where it was not, %d were timed over several loads with the choice's fastest load faster than "
          "the best's slowest (the best there, or not told from it by its loads, in %d)" % (
              configs - set_best, set_overlapped, set_best + set_overlapped))
    workload_report(timed)
    print("prediction error: median %.1f%% for the chosen plans, %.1f%% over %d measured candidates" % (
        100 * statistics.median(errors) if errors else 0, 100 * statistics.median(all_errors) if all_errors else 0,
        len(all_errors)))
    if by_plan:
        columns = sorted({n for by_tokens in signed.values() for n in by_tokens})
        print("\nmedian signed prediction error (predicted over measured, less one), by tokens per step:")
        print("%-14s %-28s" % ("model", "candidate") + "".join("%8d" % n for n in columns))
        for (model, name), by_tokens in sorted(signed.items()):
            print("%-14s %-28s" % (model[:14], name) + "".join(
                "%+7.0f%%" % (100 * statistics.median(by_tokens[n])) if n in by_tokens else "%8s" % "" for n in columns))


if __name__ == "__main__":
    main()
