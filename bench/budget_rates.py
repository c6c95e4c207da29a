#!/usr/bin/env python3
"""Tokens/s at each budget of a run whose budget changes, against runs started at those budgets
(the live-budget issue's third promise). `pshard serve` on MODEL at the first budget streams one
long greedy completion (end-of-text ignored); at each change time the budget is set over
POST /v1/pshard/budget; every streamed chunk is timestamped, and each segment's rate is counted
from SETTLE seconds after its change (the change itself, and for a rise its weights still going
up, are not the segment's steady rate) to the next change. Then each budget runs alone in a fresh
server, the same request, its rate counted over the same span of tokens. Prints a row a segment:
budget, tokens/s under changes, tokens/s started there, their ratio.
Usage: bench/budget_rates.py PSHARD MODEL TOKENS BUDGET[@SECONDS] ... [--settle S] [--port P]
  e.g. bench/budget_rates.py build/pshard /dev/shm/qwen30b.gguf 1500 8G 2G@8 6G@16   (8G from the
  start, 2G at 8 s, 6G at 16 s into the stream)
Only the standard library."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PROMPT = "Write a long story about a city by a river, its markets, its bridges and the people who cross them."


def parse_changes(specs):
    """["8G", "2G@8", "6G@16"] -> [(0.0, "8G"), (8.0, "2G"), (16.0, "6G")]: the first budget from the
    start, each later one at its time, in order."""
    out = []
    for k, spec in enumerate(specs):
        budget, _, at = spec.partition("@")
        if not budget or (k == 0) != (at == ""):
            raise ValueError("%r: the first budget has no time, every later one BUDGET@SECONDS" % spec)
        t = float(at) if at else 0.0
        if out and t <= out[-1][0]:
            raise ValueError("%r: change times must grow" % spec)
        out.append((t, budget))
    return out


def segment_rates(times, changes, settle):
    """Tokens/s of each segment between changes, from `settle` seconds after its start to the next
    change (the last: to the last token), and the token indices it spans; times are the chunks'
    seconds from the stream's start. A segment with fewer than 2 tokens in its span has rate None."""
    rows = []
    for k, (start, budget) in enumerate(changes):
        lo = start + (settle if k else 0.0)
        hi = changes[k + 1][0] if k + 1 < len(changes) else float("inf")
        idx = [i for i, t in enumerate(times) if lo <= t < hi]
        rate = (len(idx) - 1) / (times[idx[-1]] - times[idx[0]]) if len(idx) >= 2 and times[idx[-1]] > times[idx[0]] else None
        rows.append({"budget": budget, "rate": rate, "first": idx[0] if idx else None, "last": idx[-1] if idx else None})
    return rows


def span_rate(times, first, last):
    """Tokens/s over chunks first..last of a stream (None where it has not that many)."""
    if first is None or last is None or last >= len(times) or last <= first or times[last] <= times[first]:
        return None
    return (last - first) / (times[last] - times[first])


class Serve:
    def __init__(self, pshard, model, budget, port, log):
        self.url = "http://127.0.0.1:%d" % port
        self.proc = subprocess.Popen([pshard, "serve", "-m", model, "--vram-budget", budget, "--parallel", "1", "-c", "4096",
                                      "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("pshard serve exited (see %s)" % log.name)
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit("pshard serve not ready within 600 s")

    def set_budget(self, budget):
        req = urllib.request.Request(self.url + "/v1/pshard/budget", data=json.dumps({"vram_budget": budget}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def stream(self, tokens, changes=()):
        """Timestamps of the streamed chunks (seconds from the request), the budgets set on the way."""
        body = json.dumps({"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        times, start, ended = [], time.monotonic(), threading.Event()

        def change():  # each budget at its time, beside the stream, while it lasts
            for at, budget in changes:
                if ended.wait(max(0.0, at - (time.monotonic() - start))):
                    return
                self.set_budget(budget)

        changer = threading.Thread(target=change, daemon=True)
        with urllib.request.urlopen(req, timeout=900) as r:
            changer.start()
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    times.append(time.monotonic() - start)
        ended.set()
        changer.join(timeout=120)
        return times

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def main():
    args = sys.argv[1:]
    settle, port = 2.0, 18090
    for flag in ("--settle", "--port"):
        if flag in args:
            k = args.index(flag)
            value = args[k + 1]
            del args[k:k + 2]
            settle, port = (float(value), port) if flag == "--settle" else (settle, int(value))
    if len(args) < 4:
        sys.exit(__doc__)
    pshard, model, tokens = args[0], args[1], int(args[2])
    try:
        changes = parse_changes(args[3:])
    except ValueError as e:
        sys.exit("budget_rates: %s" % e)
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        s = Serve(pshard, model, changes[0][1], port, log)
        try:
            times = s.stream(tokens, changes[1:])
        finally:
            s.stop()
        rows = segment_rates(times, changes, settle)
        alone = {}
        for budget in sorted({b for _, b in changes}):
            s = Serve(pshard, model, budget, port, log)
            try:
                alone[budget] = s.stream(tokens)
            finally:
                s.stop()
    print("%-8s %10s %10s %8s %14s" % ("budget", "changed", "from start", "ratio", "tokens counted"))
    for r in rows:
        other = span_rate(alone[r["budget"]], r["first"], r["last"])
        ratio = r["rate"] / other if r["rate"] and other else None
        fmt = lambda x: "%.1f" % x if x else "-"
        print("%-8s %10s %10s %8s %14s" % (r["budget"], fmt(r["rate"]), fmt(other), "%.3f" % ratio if ratio else "-",
                                           "%s-%s" % (r["first"], r["last"])))
    print("(tokens/s; 'changed' from %.1f s after each change to the next; 'from start' a server started at that budget, "
          "over the same tokens; server log: %s)" % (settle, log.name))


if __name__ == "__main__":
    main()
