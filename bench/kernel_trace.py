#!/usr/bin/env python3
"""Where a window of a CUDA run's time went, from a timeline (bench/kernel_trace.c, a CUPTI
injection library): each kernel's calls and time as it ran among the others (no profiler
serializes it, unlike bench/kernel_profile.py), the memory copies by direction, and the GPU's idle
time -- the part of the window no kernel, copy or memset covered, which is the host's share of a
step (sampling, scheduling, launches, waiting).

Usage:
  bench/kernel_trace.py run [--lib PATH] [--csv FILE] [WINDOW] -- COMMAND...
      run COMMAND under the library, then summarize its trace
  bench/kernel_trace.py summarize FILE.csv [WINDOW]
WINDOW: --last-ms MS (the run's last MS of GPU activity) or --from-ms A --to-ms B (from the first
record), and --steps REGEX: a step is one call of the kernels REGEX matches (say the embedding
lookup), and every row is also given per step; with --each-step, a row a step as well: its length,
the GPU's idle time in it, its longest gap and what came before it, and its largest kernel.
Without a window: the whole run. Also printed: how busy the GPU was in each twentieth of the run,
to find the phases. Only the standard library."""
import argparse
import bisect
import csv
import os
import re
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_profile import short_name  # noqa: E402

DEFAULT_LIB = "build/tests/device/libkernel_trace.so"


def parse(lines):
    """The CSV's lines -> records (kind, start_ns, end_ns, grid, bytes, copy, name), by start.
    Raises ValueError on a file that is not the library's."""
    reader = csv.reader(lines)
    head = next(reader, None)
    want = ["kind", "start_ns", "end_ns", "stream", "grid", "block", "bytes", "copy", "name"]
    if head != want:
        raise ValueError("not a kernel_trace CSV: the header should be %s" % ",".join(want))
    records = []
    for n, row in enumerate(reader, start=2):
        if len(row) != len(want):
            raise ValueError("line %d has %d fields, not %d" % (n, len(row), len(want)))
        kind, start, end, _stream, grid, _block, nbytes, copy, name = row
        try:
            start, end, nbytes = int(start), int(end), int(nbytes or 0)
        except ValueError:
            raise ValueError("line %d: start, end and bytes must be whole numbers" % n) from None
        if end < start:
            raise ValueError("line %d ends before it starts" % n)
        records.append((kind, start, end, grid, nbytes, copy, name))
    if not records:
        raise ValueError("the trace holds no record (did the program use the GPU?)")
    records.sort(key=lambda r: r[1])
    return records


def demangle(records):
    """The records with C++ kernel names (CUPTI gives them mangled) as c++filt reads them, where
    c++filt is installed; else as they are."""
    tool = shutil.which("c++filt")
    mangled = sorted({r[6] for r in records if r[6].startswith("_Z")})
    if not tool or not mangled:
        return records
    out = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True, text=True)
    names = out.stdout.splitlines()
    if out.returncode != 0 or len(names) != len(mangled):
        return records
    plain = dict(zip(mangled, names))
    return [r[:6] + (plain.get(r[6], r[6]),) for r in records]


def clip(records, t0, t1):
    """The records that overlap [t0, t1), cut to it."""
    return [(k, max(s, t0), min(e, t1), g, b, c, n) for k, s, e, g, b, c, n in records if e > t0 and s < t1]


def busy_ns(records):
    """The time some record covers (their union)."""
    total, cur_s, cur_e = 0, None, None
    for _, s, e, *_ in sorted(records, key=lambda r: r[1]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def phases(records, parts=20):
    """How busy the GPU was in each of `parts` equal slices of the run: [(from_ms, to_ms, busy)]."""
    t0, t1 = records[0][1], max(r[2] for r in records)
    width = max(1, (t1 - t0) // parts)
    out = []
    for i in range(parts):
        a, b = t0 + i * width, (t1 if i == parts - 1 else t0 + (i + 1) * width)
        part = clip(records, a, b)
        out.append(((a - t0) / 1e6, (b - t0) / 1e6, busy_ns(part) / (b - a) if b > a else 0.0))
    return out


def window(records, last_ms=None, from_ms=None, to_ms=None):
    """(t0, t1) in ns: the last last_ms of the run, or [from_ms, to_ms) after its first record, or all."""
    first, end = records[0][1], max(r[2] for r in records)
    if last_ms is not None:
        return max(first, end - int(last_ms * 1e6)), end
    a = first + int(from_ms * 1e6) if from_ms is not None else first
    b = first + int(to_ms * 1e6) if to_ms is not None else end
    if b <= a:
        raise ValueError("the window is empty")
    return a, b


def summarize(records, t0, t1, steps=None):
    """Rows (label, calls, median us, total ms, share of the window) by total, largest first; the
    idle ms; and the steps counted (None without a pattern)."""
    part = clip(records, t0, t1)
    groups = {}
    for kind, s, e, grid, nbytes, copy, name in part:
        key = (short_name(name), grid) if kind == "kernel" else (("%s %s" % (kind, copy)).strip(), "")
        g = groups.setdefault(key, [[], 0])
        g[0].append((e - s) / 1e3)
        g[1] += nbytes
    span_ms = (t1 - t0) / 1e6
    rows = []
    for (label, grid), (times, nbytes) in groups.items():
        total = sum(times) / 1e3
        rows.append({"label": label, "grid": grid, "calls": len(times), "median_us": statistics.median(times),
                     "total_ms": total, "share": total / span_ms if span_ms > 0 else 0.0, "mb": nbytes / 1e6})
    rows.sort(key=lambda r: -r["total_ms"])
    idle_ms = span_ms - busy_ns(part) / 1e6
    n_steps = None
    if steps:
        pattern = re.compile(steps)
        n_steps = sum(1 for k, *_rest, name in part if k == "kernel" and pattern.search(name))
    return rows, idle_ms, n_steps


def each_step(records, t0, t1, steps):
    """A row a step of the window (from one call of the kernels `steps` matches to the next): its
    start (ms after the first record), length and idle ms, its longest gap with the record before
    it, and its largest kernel with its ms."""
    pattern = re.compile(steps)
    starts = [s for k, s, _e, _g, _b, _c, name in records if k == "kernel" and t0 <= s < t1 and pattern.search(name)]
    rows = []
    for a, b in zip(starts, starts[1:]):
        part = clip(records, a, b)
        gap, after, end = 0, "", None
        for kind, s, e, _g, _b, copy, name in part:
            if end is not None and s - end > gap:
                gap, after = s - end, before
            before = short_name(name) if kind == "kernel" else ("%s %s" % (kind, copy)).strip()
            end = e if end is None else max(end, e)
        if end is not None and b - end > gap:  # (up to the next step's first kernel)
            gap, after = b - end, before
        totals = {}
        for kind, s, e, _g, _b, _c, name in part:
            if kind == "kernel":
                totals[short_name(name)] = totals.get(short_name(name), 0) + e - s
        top = max(totals.items(), key=lambda kv: kv[1]) if totals else ("", 0)
        rows.append({"from_ms": (a - records[0][1]) / 1e6, "ms": (b - a) / 1e6, "idle_ms": (b - a - busy_ns(part)) / 1e6,
                     "gap_ms": gap / 1e6, "gap_after": after, "top": top[0], "top_ms": top[1] / 1e6})
    return rows


def report(records, t0, t1, steps=None, every=False):
    lines = ["GPU busy by twentieth of the run:"]
    lines += ["  %9.1f - %9.1f ms  %5.1f%%" % (a, b, 100 * busy) for a, b, busy in phases(records)]
    rows, idle_ms, n_steps = summarize(records, t0, t1, steps)
    span_ms = (t1 - t0) / 1e6
    base = records[0][1]
    lines.append("")
    lines.append("window %.1f - %.1f ms (%.1f ms)%s" % ((t0 - base) / 1e6, (t1 - base) / 1e6, span_ms,
                                                    ", %d steps" % n_steps if n_steps is not None else ""))
    per = n_steps if n_steps else None
    head = "| kernel or copy | grid | calls | median µs | total ms | share |" + (" ms a step |" if per else "")
    lines += [head, "|---|---|---|---|---|---|" + ("---|" if per else "")]
    for r in rows:
        label = r["label"] + (" (%.1f MB)" % r["mb"] if r["mb"] else "")
        line = "| %s | %s | %d | %.2f | %.3f | %.1f%% |" % (label, r["grid"], r["calls"], r["median_us"],
                                                        r["total_ms"], 100 * r["share"])
        lines.append(line + (" %.3f |" % (r["total_ms"] / per) if per else ""))
    idle = "| **GPU idle** | | | | %.3f | %.1f%% |" % (idle_ms, 100 * idle_ms / span_ms if span_ms > 0 else 0.0)
    lines.append(idle + (" %.3f |" % (idle_ms / per) if per else ""))
    if per:
        lines.append("a step: %.3f ms" % (span_ms / per))
    if every and steps:
        lines += ["", "| step from, ms | ms | GPU idle, ms | longest gap, ms | after | largest kernel | its ms |",
                  "|---|---|---|---|---|---|---|"]
        for r in each_step(records, t0, t1, steps):
            lines.append("| %.1f | %.3f | %.3f | %.3f | %s | %s | %.3f |" % (
                r["from_ms"], r["ms"], r["idle_ms"], r["gap_ms"], r["gap_after"], r["top"], r["top_ms"]))
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(prog="kernel_trace.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run", help="run a command under the library, then summarize")
    run.add_argument("--lib", default=DEFAULT_LIB, help="the injection library (default %s)" % DEFAULT_LIB)
    run.add_argument("--csv", default="kernel_trace.csv", help="where the trace goes (default kernel_trace.csv)")
    summ = sub.add_parser("summarize", help="summarize a trace the library wrote")
    summ.add_argument("csv_file")
    for p in (run, summ):
        p.add_argument("--last-ms", type=float)
        p.add_argument("--from-ms", type=float)
        p.add_argument("--to-ms", type=float)
        p.add_argument("--steps", help="a regex: one call of the kernels it matches is one step")
        p.add_argument("--each-step", action="store_true", help="also a row a step (with --steps)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    a = ap.parse_args(argv)
    if a.last_ms is not None and (a.from_ms is not None or a.to_ms is not None):
        ap.error("--last-ms or --from-ms/--to-ms, not both")
    if a.each_step and not a.steps:
        ap.error("--each-step needs --steps")
    if a.steps:
        try:
            re.compile(a.steps)
        except re.error as e:
            ap.error("--steps: %s" % e)
    path = a.csv_file if a.mode == "summarize" else a.csv
    if a.mode == "run":
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        if not cmd:
            ap.error("run needs a command after --")
        if not os.path.exists(a.lib):
            raise SystemExit("kernel_trace: no library at %s (build the kernel_trace target)" % a.lib)
        env = dict(os.environ, CUDA_INJECTION64_PATH=os.path.abspath(a.lib), KERNEL_TRACE_FILE=os.path.abspath(path))
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            print("kernel_trace: the command exited %d; its trace so far:" % rc, file=sys.stderr)
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            records = demangle(parse(f))
        t0, t1 = window(records, a.last_ms, a.from_ms, a.to_ms)
    except (OSError, ValueError) as e:
        raise SystemExit("kernel_trace: %s: %s" % (path, e))
    print(report(records, t0, t1, a.steps, a.each_step))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
