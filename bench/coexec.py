#!/usr/bin/env python3
"""Co-execution with a game (bench/coexec.sh): sample `pshard serve` and the device, and plot.
  coexec.py sample URL OUT.csv SECONDS   every 0.5 s: pshard's budget, arena, plan, tokens/s (from
                                         /metrics' generated-token counter) and the device's used
                                         memory (nvidia-smi), into a CSV
  coexec.py plot OUT_DIR                 OUT_DIR/coexec.png: per mode (auto, fixed), the game's
                                         frame rate and memory (game_<mode>.csv) over pshard's
                                         tokens/s and budget (pshard_<mode>.csv), on the sampler's
                                         clock (the game's moved by game_offset_<mode>.txt, the
                                         seconds it started after the sampler); and a summary of
                                         each mode's figures on stdout, pshard's over the game's span
Only the standard library to sample; matplotlib to plot."""
import csv
import os
import re
import subprocess
import sys
import time
import urllib.request


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    value = lambda name: float(re.search(r"^pshard_%s (\S+)$" % name, text, re.M).group(1))
    plan = re.search(r'pshard_plan_info\{plan="([^"]*)"', text)
    return {"budget_mib": value("vram_budget_bytes") / 2**20, "arena_mib": value("vram_arena_bytes") / 2**20,
            "tokens": value("tokens_generated_total"), "changes": value("vram_budget_changes_total"),
            "plan": plan.group(1) if plan else ""}


def used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0]) if out.strip() else -1


def sample(url, path, seconds):
    start, last = time.monotonic(), None
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "budget_mib", "arena_mib", "tokens_per_s", "changes", "device_used_mib", "plan"])
        while time.monotonic() - start < seconds:
            t = time.monotonic()
            try:
                m = metrics(url)
            except (OSError, AttributeError):
                time.sleep(0.5)
                continue
            tps = (m["tokens"] - last[1]) / (t - last[0]) if last else 0.0
            last = (t, m["tokens"])
            w.writerow(["%.2f" % (t - start), "%.0f" % m["budget_mib"], "%.0f" % m["arena_mib"], "%.1f" % tps,
                        "%d" % m["changes"], used_mib(), m["plan"]])
            f.flush()
            time.sleep(max(0.0, 0.5 - (time.monotonic() - t)))


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def plot(out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("auto", "fixed") if os.path.exists(os.path.join(out, "game_%s.csv" % m))]
    fig, axes = plt.subplots(2, len(modes), figsize=(7 * len(modes), 7), sharex=True, squeeze=False)
    for col, mode in enumerate(modes):
        game, ps = read(os.path.join(out, "game_%s.csv" % mode)), read(os.path.join(out, "pshard_%s.csv" % mode))
        # The game starts after the sampler: its times moved onto the sampler's clock (coexec.sh
        # writes the gap; none: 0).
        gap_path = os.path.join(out, "game_offset_%s.txt" % mode)
        gap = float(open(gap_path).read()) if os.path.exists(gap_path) else 0.0
        gt = [float(r["t_s"]) + gap for r in game]
        ax = axes[0][col]
        ax.plot(gt, [float(r["fps"]) for r in game], color="tab:green", label="game FPS")
        ax.set_ylabel("frames/s")
        ax.set_title("%s budget" % mode)
        ax2 = ax.twinx()
        ax2.plot(gt, [float(r["have_mib"]) / 1024 for r in game], color="tab:purple", label="game has (GiB)")
        ax2.plot(gt, [float(r["want_mib"]) / 1024 for r in game], color="tab:purple", ls=":", label="game wants (GiB)")
        ax2.set_ylabel("GiB")
        ax.legend(loc="upper left"), ax2.legend(loc="upper right")
        pt = [float(r["t_s"]) for r in ps]
        ax = axes[1][col]
        ax.plot(pt, [float(r["tokens_per_s"]) for r in ps], color="tab:blue", label="pshard tokens/s")
        ax.set_ylabel("tokens/s")
        ax.set_xlabel("seconds")
        ax2 = ax.twinx()
        ax2.plot(pt, [float(r["budget_mib"]) / 1024 for r in ps], color="tab:orange", label="pshard budget (GiB)")
        ax2.set_ylabel("GiB")
        ax.legend(loc="upper left"), ax2.legend(loc="upper right")
        fps = [float(r["fps"]) for r in game]
        missed = sum(int(r["missed"]) for r in game)
        short = sum(1 for r in game if float(r["have_mib"]) < float(r["want_mib"]))
        # pshard's figures over the game's span (the game's first second covers the second before its first row)
        tps = [float(r["tokens_per_s"]) for r in ps[1:] if gt[0] - 1 <= float(r["t_s"]) <= gt[-1]]
        print("%-5s game: mean %.1f FPS, min %.1f, %d missed frames, %d of %d seconds short of memory; pshard over the "
              "game's span: mean %.1f tokens/s, min %.1f, budget %.1f-%.1f GiB, %s changes (the game's clock %.2f s "
              "after the sampler's)" % (
                  mode, sum(fps) / len(fps), min(fps), missed, short, len(game), sum(tps) / max(1, len(tps)),
                  min(tps or [0]), min(float(r["budget_mib"]) for r in ps) / 1024,
                  max(float(r["budget_mib"]) for r in ps) / 1024, ps[-1]["changes"], gap))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "coexec.png"), dpi=120)
    print("wrote", os.path.join(out, "coexec.png"))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "plot":
        plot(sys.argv[2])
    else:
        sys.exit(__doc__)
