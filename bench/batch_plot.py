#!/usr/bin/env python3
"""Draws `pshard bench --batch --json` output: generation and prompt throughput against the number
of parallel sequences, one line per VRAM budget (and per file, when several are given, e.g.
pshard's beside llama.cpp's batched-bench read into the same fields by bench/h200_batch.sh).
Usage: bench/batch_plot.py OUT.png FILE.json [FILE.json ...]   (needs matplotlib)"""
import json
import os
import sys


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for path in sys.argv[2:]:
        data = rows(path)
        tag = os.path.basename(path).rsplit(".", 1)[0]
        for budget in sorted({r["budget_bytes"] for r in data}):
            pts = sorted((r["npl"], r["gen_tps"], r["prompt_tps"]) for r in data if r["budget_bytes"] == budget)
            label = "%s, %s" % (tag, "%g GB" % (budget / 2**30) if budget > 0 else "CPU" if budget == 0 else "all in VRAM")
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
            axes[1].plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=label)
    for ax, what in zip(axes, ("generation", "prompt")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("parallel sequences")
        ax.set_ylabel("%s tokens/s (all sequences)" % what)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    d = data[0] if data else {}
    fig.suptitle("%s: %s-token prompts, %s generated tokens each" % (os.path.basename(d.get("model", "")), d.get("npp"),
                                                                      d.get("ntg")))
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
