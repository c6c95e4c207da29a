#!/usr/bin/env python3
"""Many sequences at once on every plan family: on tiny synthetic dense and MoE models, each
request of a continuously batched run (`pshard batch`, three sequences at once, one prompt joining
every two steps, so prompts join while others decode and steps mix prompt chunks with decode
tokens) gives the greedy tokens it gives alone on the CPU, up to numerical near-ties (as
test_plans.py rules them). Exits 0 with a "skipped" line where no GPU exists.
Usage: tests/device/test_batch.py BUILD_DIR"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_gpu_equivalence as eq  # noqa: E402
import test_plans as tp  # noqa: E402

PROMPTS = ["The capital of France is", "1, 2, 3, 4, 5,", "Once upon a time,", "def fibonacci(n):",
           "One morning, as Gregor Samsa was waking up from anxious dreams, he discovered that in bed he",
           # long enough that its prompt steps (with the others' decode tokens) reach the 64-token tier
           " ".join("the %s step of a long prompt," % w for w in ("first", "second", "third", "fourth", "fifth",
                                                               "sixth", "seventh", "eighth", "ninth", "tenth",
                                                               "eleventh", "twelfth"))]
N_OUT = 24


def minimum_mb(model, family, cells=4096):
    """The least budget of a plan for three sequences sharing a pool of `cells` cells."""
    proc = eq.run("plan", "-m", model, "--vram-budget", "1M", "--plan", family, "-c", str(cells), "--parallel", "3")
    m = re.search(r"(?:minimum for this model and context is|needs at least) (\d+) MB", proc.stderr)
    if not m:
        raise SystemExit("no minimum in: " + proc.stderr)
    return int(m.group(1))


def batched(model, placement):
    cells = [] if "-c" in placement else ["-c", "4096"]
    proc = eq.run("batch", "-m", model, "--raw", "--temp", "0", "-n", str(N_OUT), "--ignore-eos", "--jsonl", "-q",
                  "--parallel", "3", "--stagger", "2", *cells, *[a for p in PROMPTS for a in ("-p", p)], *placement)
    if proc.returncode != 0:
        raise SystemExit("pshard batch failed: " + proc.stderr)
    replies = {}
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        replies[PROMPTS[r["index"] - 1]] = r["ids"]
    return replies


def main():
    with tempfile.TemporaryDirectory() as tmp:
        if not eq.gpu_probe(tmp):
            return 0
        for shape, wtype in (("tiny-llama", "Q8_0"), ("tiny-moe", "Q8_0")):
            path = os.path.join(tmp, "%s-%s.gguf" % (shape, wtype))
            layers = ["--layers", "8"] if shape == "tiny-llama" else []
            subprocess.run([os.path.join(eq.BUILD, "gguf-synth"), "--shape", shape, "--type", wtype, "--seed", "4",
                            *layers, "-o", path, "--quiet"], check=True)
            alone = {p: tp.greedy(path, p, [])[0][:N_OUT] for p in PROMPTS}
            placements = [("cpu", []), ("gpu, all resident", ["--gpu"])]
            for family in ("gpu", "static", "dynamic", "auto"):
                low = minimum_mb(path, family)
                placements.append(("%s at %dM" % (family, low + 2), ["--vram-budget", "%dM" % (low + 2), "--plan", family,
                                                                     "--no-profile"]))
            # A pool small enough that a layer's cells of every sequence ride in the ring's slots
            # (the KV of the layers it leaves on the host goes up with their matrices in its large steps).
            for family in ("dynamic",):
                low = minimum_mb(path, family, 256)
                args = ["--vram-budget", "%dM" % (low + 2), "--plan", family, "--no-profile", "-c", "256"]
                shown = eq.run("plan", "-m", path, "--parallel", "3", *args).stdout
                eq.check("KV up" in shown, "%s %s, %s at %dM, pool of 256: the ring carries the host's KV cells"
                         % (shape, wtype, family, low + 2))
                placements.append(("%s at %dM, pool of 256, KV up" % (family, low + 2), args))
            for label, placement in placements:
                got = batched(path, placement)
                report = []
                for prompt, ref in alone.items():
                    ids = got.get(prompt, [])
                    step = next((i for i, (a, b) in enumerate(zip(ref, ids)) if a != b), None)
                    if step is None and len(ids) == len(ref):
                        report.append((True, "%s %s, %s, %r: batched tokens equal the CPU's alone"
                                       % (shape, wtype, label, prompt[:20])))
                        continue
                    if step is None:
                        report.append((False, "%s %s, %s, %r: %d tokens, not %d" % (shape, wtype, label, prompt[:20],
                                                                                     len(ids), len(ref))))
                        continue
                    l = eq.logits(path, eq.prompt_token_ids(path, prompt) + ref[:step], False, 64,
                                  os.path.join(tmp, "b.f32"))[-1]
                    top2 = sorted(l)[-2:]
                    report.append((top2[1] - top2[0] < eq.NEAR_TIE, "%s %s, %s, %r: parts from the CPU at step %d "
                                   "only at a near-tie (gap %.3f)" % (shape, wtype, label, prompt[:20], step,
                                                                      top2[1] - top2[0])))
                for ok, text in report:
                    eq.check(ok, text)
    print("%d failed" % len(eq.failures))
    return 1 if eq.failures else 0


if __name__ == "__main__":
    sys.exit(main())
