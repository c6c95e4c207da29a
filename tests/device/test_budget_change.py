#!/usr/bin/env python3
"""The VRAM budget changed while decoding, on the GPU (qwen30b's shape by default): one sequence
(`pshard run --budget-file`, SIGUSR1) goes 8G -> 2G -> (1M, refused) -> 6G while it decodes, and
several (`pshard serve`, POST /v1/pshard/budget) 8G -> 2G -> 6G -> 2G while they stream. Checks: the
greedy tokens equal those of a run at a constant budget (where they part, only at a plan-level
near-tie: a constant 2G or 6G run parts there too); the device memory sampled after a cut is no
more than the new budget plus the CUDA context (and a little slack); the refused budget names
the least and changes nothing; auto starts at free memory less its keep, and its tokens are those
of a constant run at the budget it says it chose (up to a near-tie, as above). Prints the time from
each change until the memory was free (pshard's own figure and the one sampled). Exits 0 with a
"skipped" line where no GPU exists.
Usage: tests/device/test_budget_change.py BUILD_DIR
Environment: PSHARD_BUDGET_MODEL (default /dev/shm/qwen30b.gguf, written by gguf-synth if
absent), PSHARD_BUDGET_TOKENS (default 768)."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_gpu_equivalence as eq  # noqa: E402

MODEL = os.environ.get("PSHARD_BUDGET_MODEL", "/dev/shm/qwen30b.gguf")
N_OUT = int(os.environ.get("PSHARD_BUDGET_TOKENS", "768"))
PROMPT = ("The history of the city begins with a small settlement on the river where traders met to exchange "
          "grain, salt and cloth, and over the centuries the market grew into a town")
COMMON = ["--raw", "--temp", "0", "--ignore-eos", "-n", str(N_OUT), "-c", "4096", "-t", "16", "--ids", "--no-profile",
          "-p", PROMPT]
SLACK_MIB = 64
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def gib(text):
    return int(float(text[:-1]) * (1 << 30))


def used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


class Sampler(threading.Thread):
    """The device's used memory (MiB) as fast as nvidia-smi answers, with the time of each."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples, self.stop = [], False

    def run(self):
        while not self.stop:
            t = time.monotonic()
            self.samples.append((t, used_mib()))


def context_mib(stderr):
    m = re.search(r"CUDA context ([\d.]+) (B|KB|MB|GB) outside the budget", stderr)
    return float(m.group(1)) * UNITS[m.group(2)] / (1 << 20) if m else None


def ids_of(stdout):
    line = [l for l in stdout.splitlines() if l.startswith("ids:")]
    return [int(x) for x in line[-1].split()[1:]] if line else []


constant_ids, constant_stderr = {}, {}


def constant(budget):
    """The greedy tokens of a run at a constant budget (each budget run once)."""
    if budget not in constant_ids:
        proc = eq.run("run", "-m", MODEL, "--vram-budget", budget, *COMMON)
        if proc.returncode:
            raise SystemExit("pshard run at %s failed: %s" % (budget, proc.stderr))
        constant_ids[budget], constant_stderr[budget] = ids_of(proc.stdout), proc.stderr
    return constant_ids[budget]


def plan_of(stderr):
    m = re.search(r"; plan ([^(\n]+)", stderr)
    return "plan " + m.group(1).strip() if m else "no plan line"


def parted_at(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def check_tokens(label, got, ref, refs_other):
    step = parted_at(got, ref)
    if step is None:
        eq.check(True, "%s: %d greedy tokens equal the constant budget's" % (label, len(got)))
        return
    # a plan-level near-tie: some constant budget of the schedule parts from the first there too
    tie = any(parted_at(o, ref) is not None and parted_at(o, ref) <= step for o in refs_other())
    eq.check(tie, "%s: parts from the constant budget's tokens at step %d%s" % (
        label, step, " where a constant run at another budget parts too (a near-tie)" if tie else ""))


def wait_for(path, needle, count, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if text.count(needle) >= count:
            return text, time.monotonic()
        time.sleep(0.005)
    raise SystemExit("no %r (x%d) within %d s in: %s" % (needle, count, timeout, text))


def check_memory(label, sampler, base, budget_bytes, ctx_mib, since, until):
    bound = base + budget_bytes / (1 << 20) + ctx_mib + SLACK_MIB
    after = [(t, m) for t, m in sampler.samples if since <= t <= until]
    worst = max((m for _, m in after), default=None)
    eq.check(worst is not None and worst <= bound, "%s: device memory after the change at most %s MiB (bound %.0f = "
             "idle %d + budget + CUDA context %.0f + %d), %d samples" % (label, worst, bound, base, ctx_mib, SLACK_MIB,
                                                                         len(after)))


def run_with_changes(tmp, ref, refs_other):
    """pshard run 8G, then 2G, 1M (refused), 6G through its budget file while it decodes."""
    path, log = os.path.join(tmp, "budget"), os.path.join(tmp, "run.log")
    with open(path, "w") as f:
        f.write("8G\n")
    base = used_mib()
    sampler = Sampler()
    sampler.start()
    out = []
    with open(log, "w") as err:
        proc = subprocess.Popen([eq.PSHARD, "run", "-m", MODEL, "--vram-budget", "8G", "--budget-file", path, *COMMON],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    text, _ = wait_for(log, "VRAM: arena", 1)
    ctx_mib = context_mib(text)
    time.sleep(1.0)  # decoding
    changes = 0
    for budget, ok in (("2G", True), ("1M", False), ("6G", True)):
        with open(path, "w") as f:
            f.write(budget + "\n")
        sent = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        needle = "pshard run: VRAM budget" if ok else "the budget stays"
        text, seen = wait_for(log, needle, changes + 1 if ok else 1)
        if not ok:
            eq.check("minimum for this model and context is" in text, "run: a budget of 1M is refused naming the least")
            continue
        changes += 1
        m = re.findall(r"memory given back after (\d+) ms, changed in (\d+) ms", text)
        if m:
            print("  %s: memory free %s ms after the change was asked, all done in %s ms (pshard's clock)" % (
                budget, m[-1][0], m[-1][1]))
        time.sleep(1.0)
        check_memory("run at %s" % budget, sampler, base, gib(budget), ctx_mib, seen + 0.05, time.monotonic())
        below = [t for t, m in sampler.samples if t >= sent and m <= base + gib(budget) / (1 << 20) + ctx_mib + SLACK_MIB]
        if below and gib(budget) < 8 << 30:
            print("  %s: device memory under the bound %.0f ms after SIGUSR1 (sampled by nvidia-smi)" % (
                budget, (below[0] - sent) * 1e3))
    eq.check(proc.wait(timeout=600) == 0, "run with changes ends well")
    reader.join()
    sampler.stop = True
    check_tokens("run 8G -> 2G -> 6G", ids_of(out[0] if out else ""), ref, refs_other)
    eq.check(changes == 2, "run: the decode lasted through both changes (raise PSHARD_BUDGET_TOKENS if not)")


def serve_with_changes(tmp):
    """pshard serve --parallel 3: three streams at 8G, changed to 2G, 6G and 2G again while they
    generate, against the same requests at a constant 8G."""
    os.environ["PSHARD_BUILD_DIR"] = eq.BUILD
    sys.path.insert(0, os.path.join(eq.ROOT, "tests", "py"))
    from server_helpers import Server

    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a city by the sea,"]
    body = lambda p: {"prompt": p, "max_tokens": 384, "temperature": 0, "ignore_eos": True}

    def texts(changes, start="8G"):
        s = Server(MODEL, "--vram-budget", start, "--parallel", "3", "-c", "4096", "--no-profile", "-t", "16", log_dir=tmp)
        try:
            results = [None] * len(prompts)

            def one(i):
                results[i] = s.request("POST", "/v1/completions", body(prompts[i]))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            replies = []
            for budget in changes:
                time.sleep(1.0)
                status, _, reply = s.request("POST", "/v1/pshard/budget", {"vram_budget": budget})
                replies.append((budget, status, reply))
                parts = reply.get("last_change_parts_ms", {}) if status == 200 else {}
                if parts:  # planning, freeing, pinning, the arena, carving: about the whole change
                    whole = parts["plan"] + (reply["last_change_free_ms"] - parts["plan"]) + parts["pin"] + \
                        parts["arena"] + parts["fill"]
                    eq.check(abs(whole - reply["last_change_ms"]) < 2.0, "serve, %s: the change's parts (%s) add up to "
                             "%.1f of its %.1f ms" % (budget, ", ".join("%s %.1f" % kv for kv in parts.items()), whole,
                                                     reply["last_change_ms"]))
                if status == 200 and budget == "6G":  # a rise: its resident weights go up while steps go on
                    weights, deadline = 0, time.monotonic() + 5
                    while not weights and time.monotonic() < deadline:
                        time.sleep(0.02)
                        weights = s.request("GET", "/props")[2]["vram"]["budget"].get("last_change_weights_ms", 0)
                    eq.check(weights >= reply.get("last_change_ms", 0) > 0, "serve: the rise to 6G went on in %.1f ms, its "
                             "resident weights in VRAM after %.1f ms" % (reply.get("last_change_ms", 0), weights))
            for t in threads:
                t.join()
            status, _, metrics = s.request("GET", "/metrics")
            return [r[2]["choices"][0]["text"] if r and r[0] == 200 else None for r in results], replies, metrics
        finally:
            s.stop()

    ref, _, _ = texts([])
    # the second cut finds the host's KV cache made and pinned: the cut a running server pays
    got, replies, metrics = texts(["2G", "6G", "2G"])
    for budget, status, reply in replies:
        eq.check(status == 200 and reply.get("vram_budget_bytes") == gib(budget),
                 "serve: POST %s answered with the new budget (%s)" % (budget, json.dumps(reply)[:200]))
    eq.check("pshard_vram_budget_changes_total 3" in metrics, "serve: /metrics counts the three changes")
    others = []
    for i, (p, a, b) in enumerate(zip(prompts, got, ref)):
        if a is None or b is None:
            eq.check(False, "serve, %r: both requests answered" % p[:20])
            continue
        at = parted_at(a, b)
        if at is None:
            eq.check(True, "serve, %r: the text under changes equals the constant budget's" % p[:20])
            continue
        # as for run: a plan-level near-tie where a constant run at another budget parts as soon
        if not others:
            others.extend([texts([], "2G")[0], texts([], "6G")[0]])
        tie = any(o[i] is not None and parted_at(o[i], b) is not None and parted_at(o[i], b) <= at for o in others)
        eq.check(tie, "serve, %r: parts from the constant budget's text at character %d%s" % (
            p[:20], at, " where a constant run at another budget parts too (a near-tie)" if tie else ""))


def auto_start(tmp):
    """auto:keep=K with K = free memory less 4G: pshard starts at about 4G."""
    free = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True).stdout.split()[0])
    keep = free - 4096
    proc = eq.run("run", "-m", MODEL, "--vram-budget", "auto:keep=%dM" % keep, *COMMON)
    m = re.search(r"VRAM: arena ([\d.]+) (B|KB|MB|GB)", proc.stderr)
    arena_mib = float(m.group(1)) * UNITS[m.group(2)] / (1 << 20) if m else 0
    eq.check(proc.returncode == 0 and 3000 < arena_mib <= 4096 + SLACK_MIB, "auto:keep=%dM: the arena is %.0f MiB (about 4G less "
             "the file's mapping)" % (keep, arena_mib))
    # The budget auto chose is the one to compare with: another budget may run another plan.
    chose = re.search(r"VRAM budget (\d+) MiB, following free memory", proc.stderr)
    eq.check(chose is not None, "auto: run says the budget it follows free memory at")
    if chose:
        # Where they part, a constant run at another budget parts from that budget's as soon (the
        # near-tie rule of the runs with changes); the plans are printed for the reader.
        budget = "%sM" % chose.group(1)
        ref = constant(budget)
        check_tokens("auto at %s MiB (%s; constant: %s)" % (chose.group(1), plan_of(proc.stderr), plan_of(constant_stderr[budget])),
                     ids_of(proc.stdout), ref, lambda: [constant(b) for b in ("2G", "6G", "8G")])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        if not eq.gpu_probe(tmp):
            return 0
        if not os.path.exists(MODEL):
            subprocess.run([os.path.join(eq.BUILD, "gguf-synth"), "--shape", "qwen30b", "-o", MODEL, "--quiet"], check=True)
        run_with_changes(tmp, constant("8G"), lambda: [constant("2G"), constant("6G")])
        serve_with_changes(tmp)
        auto_start(tmp)
    print("%d failed" % len(eq.failures))
    return 1 if eq.failures else 0


if __name__ == "__main__":
    sys.exit(main())
