#!/usr/bin/env python3
"""The vision table of bench/h200_vision.sh (its vision.txt) as a plot: per budget, the time to the
first token (image encoding included), the whole run (load, encoding, prompt and the generated
tokens) and the driver's peak device memory against the image's size, one line per program and
place of its encoder, the budget drawn on the memory panel. Prints, per budget and size, pshard's
TTFT and whole run against each llama-mtmd-cli case's (how many times lower).
Usage: bench/vision_plot.py VISION_TXT OUT.png"""
import re
import sys


def read_table(path):
    """Rows of the table as dicts: case, budget, image, pixels, ttft, image_s, prompt, decode, wall,
    peak (None where the run printed none)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("case") or not line.strip() or line.startswith("("):
                continue
            name, rest = line[:34].strip(), line[34:].split()
            if len(rest) != 7:
                continue
            m = re.match(r"^(\d+)x(\d+)$", rest[0])
            budget = re.search(r"\b(\d+[GM])\b", name)
            if not m or not budget:
                continue
            value = lambda s, conv=float: None if s == "-" else conv(s)
            rows.append({"case": name, "program": re.sub(r"\s*\b\d+[GM]\b", "", name).strip(),
                         "budget": budget.group(1), "image": rest[0], "pixels": int(m.group(1)) * int(m.group(2)),
                         "ttft": value(rest[1]), "image_s": value(rest[2]), "prompt": value(rest[3], int),
                         "decode": value(rest[4]), "wall": value(rest[5]), "peak": value(rest[6], int)})
    return rows


def mib(budget):
    return int(budget[:-1]) * (1024 if budget.endswith("G") else 1)


def compare(rows):
    """pshard against each other case at the same budget and size: (budget, image, case, TTFT
    ratio, wall ratio), a ratio above 1 where pshard is the sooner."""
    out = []
    for r in rows:
        if not r["program"].startswith("pshard"):
            continue
        for o in rows:
            if o is r or o["budget"] != r["budget"] or o["image"] != r["image"] or o["program"].startswith("pshard"):
                continue
            ratio = lambda a, b: b / a if a and b else None
            out.append((r["budget"], r["image"], o["program"], ratio(r["ttft"], o["ttft"]), ratio(r["wall"], o["wall"])))
    return out


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    budgets = sorted({r["budget"] for r in rows}, key=mib)
    panels = (("ttft", "time to first token (s)"), ("wall", "whole run (s)"), ("peak", "driver's peak (MiB)"))
    fig, axes = plt.subplots(len(budgets), len(panels), figsize=(5 * len(panels), 3.6 * len(budgets)), squeeze=False)
    for i, budget in enumerate(budgets):
        mine = [r for r in rows if r["budget"] == budget]
        sizes = sorted({(r["pixels"], r["image"]) for r in mine})
        for j, (key, label) in enumerate(panels):
            ax = axes[i][j]
            for program in sorted({r["program"] for r in mine}):
                points = [(next(k for k, (_, im) in enumerate(sizes) if im == r["image"]), r[key])
                          for r in mine if r["program"] == program and r[key] is not None]
                if points:
                    points.sort()
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=program)
            if key == "peak":  # (the budget leaves out the CUDA context, which the driver counts)
                ax.axhline(mib(budget), color="gray", linestyle=":", label="budget (the CUDA context on top)")
                ax.legend(fontsize=7)
            ax.set_ylim(bottom=0)
            ax.set_xticks(range(len(sizes)))
            ax.set_xticklabels([im for _, im in sizes], fontsize=8)
            ax.set_title("%s, %s" % (budget, label), fontsize=10)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = read_table(sys.argv[1])
    if not rows:
        sys.exit("vision_plot: no rows in %s" % sys.argv[1])
    for budget, image, other, ttft, wall in compare(rows):
        cell = lambda x: "%.2fx" % x if x else "-"
        print("%-4s %-10s pshard against %-24s TTFT %s lower, whole run %s lower" % (budget, image, other, cell(ttft), cell(wall)))
    plot(rows, sys.argv[2])
    print("wrote %s" % sys.argv[2])


if __name__ == "__main__":
    main()
