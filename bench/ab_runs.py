#!/usr/bin/env python3
"""Two or more builds of pshard side by side on one machine, in turn: each run of `pshard run` with
the same arguments, the builds alternating (A B A B ...), so a change is compared with its
baseline under the same host, clocks and cache state, as the GPU kernels' figures in
bench/RESULTS.md are. A row a run: prompt tokens, prompt ms, TTFT, decode tokens/s and the md5 of
the generated text (greedy runs of the same ids print the same); then each build's medians.

Usage: bench/ab_runs.py [--runs N] PSHARD_A PSHARD_B [PSHARD ...] -- RUN_ARGS...
  e.g. bench/ab_runs.py --runs 2 base/pshard build/pshard -- -m /dev/shm/qwen30b.gguf --gpu --raw \\
         --temp 0 --ignore-eos -n 128 -c 4096 -b 1024 -t 16 -p "$P"
Each PSHARD is a pshard binary; RUN_ARGS go to `pshard run`. Only the standard library."""
import argparse
import hashlib
import re
import statistics
import subprocess
import sys

PROMPT = re.compile(r"^prompt: (\d+) tokens .* in (\d+) ms = .*; TTFT (\d+) ms", re.M)
DECODE = re.compile(r"^decode: (\d+) tokens at ([\d.]+) tok/s", re.M)


def parse(stderr):
    """`pshard run`'s report -> {prompt_tokens, prompt_ms, ttft_ms, decode_tokens, decode_tps}
    (None where it printed no such line)."""
    out = dict.fromkeys(["prompt_tokens", "prompt_ms", "ttft_ms", "decode_tokens", "decode_tps"])
    p = PROMPT.search(stderr)
    if p:
        out.update(prompt_tokens=int(p.group(1)), prompt_ms=float(p.group(2)), ttft_ms=float(p.group(3)))
    d = DECODE.search(stderr)
    if d:
        out.update(decode_tokens=int(d.group(1)), decode_tps=float(d.group(2)))
    return out


def order(n_builds, runs):
    """The runs in turn: (run, build) for every run, every build within it."""
    return [(r, b) for r in range(runs) for b in range(n_builds)]


def fmt(v, spec):
    return "-" if v is None else spec % v


def table(builds, results):
    """results: [(run, build, parsed, md5, rc)] -> markdown rows, then each build's medians."""
    lines = ["| build | run | prompt tokens | prompt ms | TTFT ms | decode tok/s | output md5 |",
             "|---|---|---|---|---|---|---|"]
    for run, b, r, md5, rc in results:
        status = md5[:8] if rc == 0 else "exit %d" % rc
        lines.append("| %s | %d | %s | %s | %s | %s | %s |" % (
            builds[b], run + 1, fmt(r["prompt_tokens"], "%d"), fmt(r["prompt_ms"], "%.0f"), fmt(r["ttft_ms"], "%.0f"),
            fmt(r["decode_tps"], "%.1f"), status))
    for b, name in enumerate(builds):
        mine = [r for _, rb, r, _, rc in results if rb == b and rc == 0]

        def med(key):
            vals = [r[key] for r in mine if r[key] is not None]
            return statistics.median(vals) if vals else None
        lines.append("| %s | median | | %s | %s | %s | |" % (
            name, fmt(med("prompt_ms"), "%.0f"), fmt(med("ttft_ms"), "%.0f"), fmt(med("decode_tps"), "%.1f")))
    return "\n".join(lines)


def main(argv):
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if "--" not in argv:
        raise SystemExit("ab_runs: give the builds, then -- and `pshard run`'s arguments (see --help)")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="ab_runs.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="runs of each build (default 2)")
    ap.add_argument("builds", nargs="+", help="pshard binaries, two or more")
    a = ap.parse_args(argv[:cut])
    run_args = argv[cut + 1:]
    if len(a.builds) < 2:
        raise SystemExit("ab_runs: two builds at the least, to compare")
    if a.runs < 1:
        raise SystemExit("ab_runs: --runs must be 1 or more")
    if not run_args:
        raise SystemExit("ab_runs: no arguments for `pshard run` after --")
    results = []
    for run, b in order(len(a.builds), a.runs):
        try:
            p = subprocess.run([a.builds[b], "run"] + run_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            raise SystemExit("ab_runs: %s: %s" % (a.builds[b], e.strerror))
        err = p.stderr.decode("utf-8", "replace")
        if p.returncode != 0:
            sys.stderr.write("ab_runs: %s exited with %d: %s\n" % (a.builds[b], p.returncode, err.strip()[-300:]))
        results.append((run, b, parse(err), hashlib.md5(p.stdout).hexdigest(), p.returncode))
        r = results[-1][2]
        print("run %d %s: TTFT %s ms, decode %s tok/s" % (run + 1, a.builds[b], fmt(r["ttft_ms"], "%.0f"),
                                                         fmt(r["decode_tps"], "%.1f")), file=sys.stderr, flush=True)
    print(table(a.builds, results))
    return 0 if all(rc == 0 for *_, rc in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
