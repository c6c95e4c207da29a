#!/usr/bin/env python3
"""Draws an oracle sweep (`pshard bench --oracle` output, one JSON line per step size, files as in
bench/oracle/): left, how much slower than the measured best each configuration's chosen plan ran
(1.0: the best), by budget and context, one marker per step size; right, every candidate's
predicted step time against its measured one, the chosen ones filled.
Usage: bench/oracle_plot.py OUT.png FILE.json [FILE.json ...]   (needs matplotlib)"""
import json
import sys


def configurations(paths):
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def measured(candidate):
    return candidate.get("measured_s") if not candidate.get("skipped") else None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sorted(configurations(sys.argv[2:]), key=lambda r: (r["budget_gb"], r["context"], r["tokens"]))
    groups = sorted({(r["budget_gb"], r["context"]) for r in rows})
    sizes = sorted({r["tokens"] for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for n, marker in zip(sizes, "os^Dv*x"):
        xs, ys = [], []
        for r in rows:
            if r["tokens"] != n:
                continue
            by_plan = {c["plan"]: measured(c) for c in r["candidates"]}
            chosen, best = by_plan.get(r["chosen"]), by_plan.get(r["best"])
            if chosen and best:
                xs.append(groups.index((r["budget_gb"], r["context"])) + 0.12 * (sizes.index(n) - len(sizes) / 2))
                ys.append(chosen / best)
        left.plot(xs, ys, marker, label="%d token%s a step" % (n, "" if n == 1 else "s"), alpha=0.8)
    left.axhline(1.10, color="grey", linestyle="--", linewidth=1)
    left.text(len(groups) - 0.5, 1.102, "10% slower", ha="right", va="bottom", fontsize=8, color="grey")
    left.set_xticks(range(len(groups)))
    left.set_xticklabels(["%g GB\n%dK" % (b, c // 1024) for b, c in groups], fontsize=8)
    left.set_ylabel("chosen plan's step time / the best's")
    left.set_title("the planner's choice against the measured best")
    left.legend(fontsize=7)
    every = []
    for chosen_only, style in ((False, dict(facecolors="none", edgecolors="tab:blue", alpha=0.4)),
                               (True, dict(color="tab:red"))):
        pts = [(c["predicted_s"], measured(c)) for r in rows for c in r["candidates"]
               if measured(c) and c.get("predicted_s") and (c["plan"] == r["chosen"]) == chosen_only]
        right.scatter([p[1] for p in pts], [p[0] for p in pts], s=12, label="chosen" if chosen_only else "other candidates",
                      **style)
        every += pts
    lo, hi = min(min(p) for p in every), max(max(p) for p in every)
    right.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("measured step time (s)")
    right.set_ylabel("predicted (s)")
    right.set_title("the cost model's predictions")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
