#!/usr/bin/env python3
"""Every plan family at several VRAM budgets computes the CPU's function: on tiny synthetic dense
and MoE models, logits at every position (decode steps of one token, which read streamed weights
in place and split MoE experts between the GPU and the CPU; and prompt steps of 64 tokens, which
stage streamed shards through the slot ring) stay within the CPU's rounding noise, and greedy
continuations equal the CPU's up to numerical near-ties. The arena printed at load is exactly the
budget. The configurations run side by side (each is its own process on the one GPU); their
reports print in order. Exits 0 with a "skipped" line where no GPU exists. Every plan lends the ring's
slots (MoE expert pieces too) to tiers without the ring, static tiers stage the attention they stream through the ring (a
static plan over the all-KV set at a budget that streams attention covers it), and dynamic tiers
split tiny-llama's FFNs by rows with the CPU; PSHARD_STAGE_STATIC=0 and PSHARD_SPLIT_FFN=0 in
the environment turn the last two off, PSHARD_ROUTED_QUOTA=0,1 has the balanced
dynamic tiers' one-token steps give the CPU a share of each token's experts (ctest runs each so
too); an MoE layer's resident and streamed experts run in one call. Auto plans whose decode steps run over another resident set than
their prompt steps (--decode-set, each set that differs from the prompt's) change phase between
steps of a mixed run (20, 3, 1, 17 and 5 tokens in turn: the KV cache moves both ways) and between
a prompt of more than 16 tokens and its continuation; the arena stays the budget. With
PSHARD_DECODE_FROM=40 they decode over that set only over caches of 40 cells or more (as a band over
long caches does), so decode steps change set in the middle of a run. At the least
budget where dynamic and auto carry the KV cells of layers whose cache is on the host through the
ring to the GPU's attention (ring tiers, "KV up"; PSHARD_KV_STREAM=0 turns it off), their prompt
steps write the new cells back to the host's cache, which the CPU's attention of later small steps
reads; and decode steps that split a carried layer's attention with the CPU (the CPU attending the
first cells from the host's cache, the GPU the rest) agree with the CPU over a long sequence.
Usage: tests/device/test_plans.py BUILD_DIR"""
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_gpu_equivalence as eq  # noqa: E402  (shares BUILD, run, logits, check, near-tie rule)


def minimum_mb(model, family):
    proc = eq.run("plan", "-m", model, "--vram-budget", "1M", "--plan", family, "-c", "4096")
    m = re.search(r"(?:minimum for this model and context is|needs at least) (\d+) MB", proc.stderr)
    if not m:
        raise SystemExit("no minimum in: " + proc.stderr)
    return int(m.group(1))


def streaming_attention_budget(model):
    """The smallest budget at which static over the all-KV set streams some layer's attention (in
    place with PSHARD_STAGE_STATIC=0, else staged through the ring)."""
    for mb in range(8, 256):
        if re.search(r"attn\s+\d+ STREAMED", plan_text(model, "%dM" % mb, "static", ["--set", "all-kv"])):
            return "%dM" % mb
    raise SystemExit("no budget streams attention in a static plan")


def kv_up_budget(model, family):
    """The smallest budget at which the plan's ring tiers carry the KV cells of layers whose cache
    is on the host to the GPU ("KV up" in the tiers line)."""
    low = minimum_mb(model, family)
    for mb in range(low, low + 64):
        text = plan_text(model, "%dM" % mb, family, ["--no-profile"])
        if "KV up" in next((line for line in text.splitlines() if line.startswith("plan ")), ""):
            return "%dM" % mb
    raise SystemExit("no budget carries KV cells through the ring in a %s plan" % family)


def plan_text(model, budget, family, extra):
    return eq.run("plan", "-m", model, "--vram-budget", budget, "--plan", family, "-c", "4096", "--shards",
                  *extra).stdout


def greedy(model, prompt, placement):
    proc = eq.run("run", "-m", model, "--raw", "--temp", "0", "-n", "32", "--ignore-eos", "--ids", "-c", "4096",
                  "-p", prompt, *placement)
    if proc.returncode != 0:
        raise SystemExit("pshard run failed: " + proc.stderr)
    arena = re.search(r"VRAM: arena (\S+ \S+).*; file mapping (\S+ \S+);", proc.stderr)
    ids = [int(x) for x in [l for l in proc.stdout.splitlines() if l.startswith("ids:")][-1].split()[1:]]
    return ids, arena.groups() if arena else None


def tokens_agree(model, label, placement, cpu_runs, tmp, report):
    """Greedy tokens against the CPU's; returns the arena the load report printed."""
    arena = None
    for prompt, cpu in cpu_runs.items():
        ids, arena = greedy(model, prompt, placement)
        step = next((i for i, (a, b) in enumerate(zip(cpu, ids)) if a != b), None)
        if step is None:
            report.append((True, "%s, %r: greedy tokens equal the CPU's" % (label, prompt[:20])))
            continue
        l = eq.logits(model, eq.prompt_token_ids(model, prompt) + cpu[:step], False, 64, os.path.join(tmp, "b.f32"))[-1]
        top2 = np.sort(l)[-2:]
        report.append((top2[1] - top2[0] < eq.NEAR_TIE, "%s, %r: parts from the CPU at step %d only at a near-tie "
                       "(gap %.3f)" % (label, prompt[:20], step, top2[1] - top2[0])))
    return arena


def decimal_mb(size):
    value, unit = size.split()
    return float(value) * {"B": 1e-6, "KB": 1e-3, "MB": 1, "GB": 1e3}[unit]


MIXED_STEPS = "20,3,1,17,5"  # prompt and decode steps in turn: a two-phase plan changes phase at each
LONG_PROMPT = "One morning, as Gregor Samsa was waking up from anxious dreams, he discovered that in bed he"


def decode_sets(model, budget):
    """The sets auto's decode steps may be asked to run over at this budget: those the plan then
    marks as the decode set (they differ from the prompt steps')."""
    return [s for s in ("ring", "no-ring", "all-kv")
            if "(decode set)" in plan_text(model, budget, "auto", ["--no-profile", "--decode-set", s])]


def run_config(path, shape, wtype, family, budget, extra, tokens, cpu, cpu_runs, tmp):
    """One plan at one budget against the CPU; returns [(ok or None for a note, text)]."""
    report = []
    tmp = tempfile.mkdtemp(dir=tmp)
    label = "%s %s, plan %s at %s %s" % (shape, wtype, family, budget, " ".join(extra))
    placement = ["--vram-budget", budget, "--plan", family, "-c", "4096", *extra]
    text = plan_text(path, budget, family, extra)
    head = next(line for line in text.splitlines() if line.startswith("plan "))
    report.append((None, head + " | " + text.splitlines()[-2][:150]))
    spread = cpu.std(axis=1, keepdims=True)
    top2 = np.sort(cpu, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= eq.NEAR_TIE  # positions whose CPU choice is no near-tie
    for batch, steps in ((1, []), (64, []), (64, ["--steps", MIXED_STEPS])):
        got = eq.logits(path, tokens, False, batch, os.path.join(tmp, "p.f32"), placement + steps)
        run = "steps of " + MIXED_STEPS if steps else "batch %d" % batch
        rel = np.abs(got - cpu) / spread
        same = got.argmax(1) == cpu.argmax(1)
        agree, agree_clear = same.mean(), same[clear].mean() if clear.any() else 0.0
        report.append((None, "%s, %s: median %.2g, top-1 %.3f (%.3f of the %d positions without a near-tie)"
                       % (label, run, np.median(rel), agree, agree_clear, clear.sum())))
        # Rounding may flip the top token where the CPU's top two are near-tied (as the greedy
        # check allows), and in MoE prompt steps it moves routing too (test_gpu_equivalence: up
        # to a third of positions; tiny-moe Q8_0 read 0.844-0.885 in every family here, the gpu
        # plan included). So: top-1 over all positions at 0.85 (MoE prompt steps 0.8), or over
        # the clear positions when they are at least half; and the clear positions always at
        # 0.95 (they agreed at 1.000 in every case measured). A wrong kernel misses these.
        limit = 0.8 if shape == "tiny-moe" and batch > 1 else 0.85
        top1 = ((agree >= limit or (clear.mean() >= 0.5 and agree_clear >= 0.95))
                and (not clear.any() or agree_clear >= 0.95))
        report.append((np.isfinite(got).all() and np.median(rel) < 0.1 and top1,
                       "%s: %s computes the CPU's function" % (label, run)))
    arena = tokens_agree(path, label, placement, cpu_runs, tmp, report)
    # The arena is the budget less the file mapping's reserve (both MiB in the plan; the load
    # report prints decimal units), and the mapping took no more than its reserve.
    if head.startswith("plan cpu"):  # auto may find the CPU fastest: then nothing is on the GPU
        report.append((arena is None, "%s: the CPU plan uses no VRAM" % label))
        return report
    report.append((fits(text, budget, arena), "%s: the arena and the file mapping fit the budget (%s)" % (label, arena),
                   (path, placement, text, budget)))
    return report


def fits(text, budget, arena):
    # (a plan with a decode set of its own prints each phase's VRAM: the arena leaves room for the
    # larger reserve)
    reserve = max(float(x) for x in re.findall(r"file mapping ([\d.]+) MB", text))
    mb = (float(budget[:-1]) - reserve) * 1048576 / 1e6
    return (arena is not None and abs(decimal_mb(arena[0]) / mb - 1) < 0.01
            and decimal_mb(arena[1]) <= reserve * 1.048576 + 0.01)


def fits_alone(path, placement, text, budget, prompt):
    """The file mapping is measured as the device memory its registration took, so a test process
    beside it that allocated meanwhile counts too: a failed budget check is measured again alone."""
    return fits(text, budget, greedy(path, prompt, placement)[1])


def split_attention_agrees(tmp, rng):
    """Decode steps that split each carried layer's attention with the CPU compute the CPU's
    function: tiny-llama (8 layers) in a static plan over the ring's set at the least budget whose
    one-token tier carries KV up, with PSHARD_KV_CPU_SHARE=0.5 (the CPU attends the first half of
    each carried layer's cached cells, in whole runs of 512, so from 2,048 cells on), over a
    2,600-token sequence one token a step."""
    path = os.path.join(tmp, "split-llama.gguf")
    subprocess.run([os.path.join(eq.BUILD, "gguf-synth"), "--shape", "tiny-llama", "--type", "Q8_0", "--seed", "4",
                    "--layers", "8", "--context", "4096", "-o", path, "--quiet"], check=True)
    env = dict(os.environ, PSHARD_KV_CPU_SHARE="0.5")
    low = minimum_mb(path, "static")
    budget = None
    for mb in range(low, low + 64):
        proc = subprocess.run([eq.PSHARD, "plan", "-m", path, "--vram-budget", "%dM" % mb, "--plan", "static", "--set",
                               "ring", "-c", "4096", "--no-profile"], capture_output=True, text=True, env=env, timeout=600)
        head = next((line for line in proc.stdout.splitlines() if line.startswith("plan ")), "")
        if re.search(r"1-3 'static' \(ring, KV up, 50% on the CPU\)", head):
            budget = "%dM" % mb
            break
    eq.check(budget is not None, "tiny-llama: a static plan over the ring's set whose decode steps split the KV with the CPU")
    if budget is None:
        return
    tokens = rng.integers(0, 1000, 2600).tolist()
    cpu = eq.logits(path, tokens, False, 64, os.path.join(tmp, "split-c.f32"))
    out = os.path.join(tmp, "split-g.f32")
    proc = subprocess.run([eq.PSHARD, "eval", "-m", path, "--tokens", ",".join(map(str, tokens)), "-b", "1", "-o", out,
                           "--vram-budget", budget, "--plan", "static", "--set", "ring", "-c", "4096", "--no-profile"],
                          capture_output=True, text=True, env=env, timeout=1200)
    eq.check(proc.returncode == 0, "tiny-llama, KV split at %s: pshard eval ran (%s)" % (budget, proc.stderr[-300:]))
    if proc.returncode != 0:
        return
    got = np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)
    split = slice(2048, None)  # the steps whose carried layers split (the CPU's cells: 1,024)
    rel = np.abs(got[split] - cpu[split]) / cpu[split].std(axis=1, keepdims=True)
    top2 = np.sort(cpu[split], axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= eq.NEAR_TIE
    same = got[split].argmax(1) == cpu[split].argmax(1)
    eq.check(np.isfinite(got).all() and np.median(rel) < 0.1 and same[clear].mean() >= 0.95,
             "tiny-llama, static at %s, the CPU attending half of each carried layer's cells: the CPU's function over "
             "positions 2,048-2,599 (median %.2g, top-1 %.3f of %d clear positions)"
             % (budget, np.median(rel), same[clear].mean(), clear.sum()))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        probe_model = os.path.join(tmp, "probe.gguf")
        subprocess.run([os.path.join(eq.BUILD, "gguf-synth"), "--shape", "tiny-llama", "--layers", "1", "-o",
                        probe_model, "--quiet"], check=True)
        if "no CUDA device" in eq.run("run", "--raw", "-p", "x", "-n", "1", "--gpu", "-m", probe_model).stderr:
            print("no CUDA device: skipped")
            return 0
        rng = np.random.default_rng(11)
        prompts = ["The capital of France is", "1, 2, 3, 4, 5,"]
        jobs = []
        for shape, wtype in (("tiny-llama", "Q8_0"), ("tiny-moe", "Q8_0"), ("tiny-moe", "Q4_0")):
            path = os.path.join(tmp, "%s-%s.gguf" % (shape, wtype))
            # tiny-llama with 8 layers: with the default 4, the weights (3.2 MB) are less than the
            # host mapping and staging slots a plan that streams takes besides them, so no budget
            # streams attention in a static plan over the all-KV set.
            layers = ["--layers", "8"] if shape == "tiny-llama" else []
            subprocess.run([os.path.join(eq.BUILD, "gguf-synth"), "--shape", shape, "--type", wtype, "--seed", "4",
                            *layers, "-o", path, "--quiet"], check=True)
            tokens = rng.integers(0, 1000, 96).tolist()
            cpu = eq.logits(path, tokens, False, 64, os.path.join(tmp, "c.f32"))
            cpu_runs = {p: greedy(path, p, [])[0] for p in prompts}
            cpu_runs[LONG_PROMPT] = greedy(path, LONG_PROMPT, [])[0]
            configs = []
            for family in ("gpu", "static", "dynamic", "auto") if wtype == "Q8_0" else ("gpu", "dynamic"):
                low = minimum_mb(path, family)
                for budget in (low + 1, low + 3) if family != "auto" else (low + 2,):
                    # auto: chosen with the default costs, so the test does not measure the machine
                    configs.append((family, "%dM" % budget, ["--no-profile"] if family == "auto" else []))
            low = minimum_mb(path, "auto")
            # the two least budgets above the minimum where auto may decode over another set
            phased = []
            for mb in range(low + 1, low + 48):
                phased += [("auto", "%dM" % mb, ["--no-profile", "--decode-set", s]) for s in decode_sets(path, "%dM" % mb)]
                if len({budget for _, budget, _ in phased}) == 2:
                    break
            if not phased:
                raise SystemExit("%s %s: no budget where auto decodes over another set" % (shape, wtype))
            configs += phased
            if shape == "tiny-llama":
                configs.append(("static", streaming_attention_budget(path), ["--set", "all-kv"]))
            if os.environ.get("PSHARD_KV_STREAM") != "0":
                configs += [(family, kv_up_budget(path, family), ["--no-profile"]) for family in ("dynamic", "auto")]
            if shape == "tiny-moe":
                low = minimum_mb(path, "dynamic")
                configs += [("dynamic", "%dM" % (low + 1), ["--stream-share", share]) for share in ("0", "1")]
            jobs += [(path, shape, wtype, family, budget, extra, tokens, cpu, cpu_runs, tmp)
                     for family, budget, extra in configs]
        again = []
        with ThreadPoolExecutor(max_workers=6) as pool:
            for report in pool.map(lambda job: run_config(*job), jobs):
                for ok, text, *alone in report:
                    if ok is None:
                        print("     " + text)
                    elif not ok and alone:
                        print("     %s: to be measured again alone" % text)
                        again.append((text, alone[0]))
                    else:
                        eq.check(ok, text)
        for text, alone in again:
            eq.check(fits_alone(*alone, prompts[0]), text + ", measured alone")
        if os.environ.get("PSHARD_KV_STREAM") != "0":
            split_attention_agrees(tmp, rng)
    print("%d failed" % len(eq.failures))
    return 1 if eq.failures else 0


if __name__ == "__main__":
    sys.exit(main())
