#!/usr/bin/env python3
"""A pshard run's GPU kernels one by one, as bench/cuda_kernels.md's tables are measured: Nsight
Compute times a window of the run's launches (the nodes of a captured decode step one by one,
caches and clocks left as they are), and each kernel, told apart by its name and grid, gets its
calls, median time, total and share, and the HBM bytes it read with the rate they make.

Usage:
  bench/kernel_profile.py run [--skip N] [--count N] [--csv FILE] [--ncu PATH] -- COMMAND...
      profile launches N+1.. of COMMAND (e.g. `build/pshard run -m qwen30b.gguf --gpu ...`)
  bench/kernel_profile.py summarize FILE.csv
      the table of a CSV that `run` (or ncu --csv with the same metrics) wrote

The default window (--skip 1500 --count 1400) falls on decode steps of qwen30b after a short
prompt; a prompt's kernels: --skip 0. Each kernel runs alone under the profiler and pays its own
ramp, so the times sum above a captured step's. Only the standard library."""
import argparse
import csv
import io
import os
import shutil
import statistics
import subprocess
import sys

METRICS = "gpu__time_duration.sum,dram__bytes_read.sum"
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def parse(text):
    """ncu's CSV (its lines among the profiled program's) -> {(kernel, grid): [(us, bytes or None)]},
    in launch order. Raises ValueError when no launch has a time."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise ValueError("no CSV header from ncu (a line starting \"ID\",) in the input")
    rows = [line for line in lines[start:] if line.startswith('"')]
    table = list(csv.reader(io.StringIO("\n".join(rows))))
    head = table[0]
    try:
        cols = [head.index(c) for c in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Unit", "Metric Value")]
    except ValueError:
        raise ValueError("ncu's CSV header lacks ID, Kernel Name, Grid Size or the Metric columns") from None
    launches = {}  # ID -> [name, grid, us, bytes]
    for r in table[1:]:
        if len(r) < len(head):
            continue
        lid, name, grid, metric, unit, value = (r[c] for c in cols)
        entry = launches.setdefault(lid, [name, grid, None, None])
        try:
            v = float(value.replace(",", ""))
        except ValueError:
            continue
        if metric == "gpu__time_duration.sum" and unit in TIME_UNITS:
            entry[2] = v * TIME_UNITS[unit]
        elif metric == "dram__bytes_read.sum" and unit in BYTE_UNITS:
            entry[3] = v * BYTE_UNITS[unit]
    kernels = {}
    for name, grid, us, nbytes in launches.values():
        if us is not None:
            kernels.setdefault((name, grid), []).append((us, nbytes))
    if not kernels:
        raise ValueError("no launch in the input has a gpu__time_duration.sum")
    return kernels


def short_name(name, width=60):
    """A kernel's name without its parameter list, cut to width."""
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the '(' that opens the parameters: outside any template's '<>'
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    name = name[:cut].strip()
    if name.startswith("void "):
        name = name[5:]
    return name if len(name) <= width else name[:width - 1] + "…"


def summarize(kernels):
    """Rows by total time, largest first: name, grid, calls, median us, total ms, share, median MB read, TB/s."""
    total = sum(us for calls in kernels.values() for us, _ in calls)
    rows = []
    for (name, grid), calls in kernels.items():
        times = [us for us, _ in calls]
        read = [b for _, b in calls if b is not None]
        med = statistics.median(times)
        med_bytes = statistics.median(read) if read else None
        rows.append({
            "kernel": short_name(name), "grid": grid, "calls": len(calls), "median_us": med,
            "total_ms": sum(times) / 1e3, "share": sum(times) / total if total > 0 else 0.0,
            "read_mb": med_bytes / 1e6 if med_bytes is not None else None,
            "tb_s": med_bytes / (med * 1e6) if med_bytes is not None and med > 0 else None,
        })
    rows.sort(key=lambda r: -r["total_ms"])
    return rows, total


def markdown(rows, total_us):
    out = ["| kernel | grid | calls | median µs | total ms | share | HBM read, MB (median) | TB/s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        read = "%.3f" % r["read_mb"] if r["read_mb"] is not None else "-"
        rate = "%.2f" % r["tb_s"] if r["tb_s"] is not None else "-"
        out.append("| %s | %s | %d | %.2f | %.3f | %.1f%% | %s | %s |" % (
            r["kernel"], r["grid"], r["calls"], r["median_us"], r["total_ms"], 100 * r["share"], read, rate))
    out.append("| **all** | | %d | | **%.3f** | | | |" % (sum(r["calls"] for r in rows), total_us / 1e3))
    return "\n".join(out)


def find_ncu(given):
    if given:
        return given
    for path in [shutil.which("ncu"), "/usr/local/cuda/bin/ncu"]:
        if path and os.access(path, os.X_OK):
            return path
    raise SystemExit("kernel_profile: no ncu on PATH or in /usr/local/cuda/bin (Nsight Compute); name it with --ncu")


def main(argv):
    ap = argparse.ArgumentParser(prog="kernel_profile.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run", help="profile a command's launches with ncu, then summarize")
    run.add_argument("--skip", type=int, default=1500, help="launches left out first (default 1500)")
    run.add_argument("--count", type=int, default=1400, help="launches profiled (default 1400)")
    run.add_argument("--csv", help="keep ncu's CSV here")
    run.add_argument("--ncu", help="the ncu binary (default: on PATH, else /usr/local/cuda/bin/ncu)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to profile")
    summ = sub.add_parser("summarize", help="the table of a CSV ncu wrote")
    summ.add_argument("csv_file")
    a = ap.parse_args(argv)
    if a.mode == "summarize":
        try:
            with open(a.csv_file, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise SystemExit("kernel_profile: %s" % e)
    else:
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        if not cmd:
            raise SystemExit("kernel_profile: no command to profile (give it after --)")
        if a.skip < 0 or a.count < 1:
            raise SystemExit("kernel_profile: --skip must be >= 0 and --count >= 1")
        ncu = [find_ncu(a.ncu), "--clock-control", "none", "--cache-control", "none", "--graph-profiling", "node",
               "--metrics", METRICS, "--csv", "--launch-skip", str(a.skip), "--launch-count", str(a.count)]
        print("kernel_profile: %s" % " ".join(ncu + cmd), file=sys.stderr)
        p = subprocess.run(ncu + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        text = p.stdout
        if a.csv:
            with open(a.csv, "w", encoding="utf-8") as f:
                f.write(text)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-2000:])
            raise SystemExit("kernel_profile: ncu exited with %d" % p.returncode)
    try:
        rows, total = summarize(parse(text))
    except ValueError as e:
        raise SystemExit("kernel_profile: %s" % e)
    print(markdown(rows, total))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
