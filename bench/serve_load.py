#!/usr/bin/env python3
"""A load for an OpenAI-compatible server (pshard serve, llama.cpp's llama-server): C clients at
once stream N chat completions of T tokens each (end-of-text ignored, greedy), every prompt its own
of about W words; prints the aggregate generated tokens/s over the wall time, TTFT p50 and p99,
and how many requests failed. Tokens are the usage chunk's count, or the content chunks where a
server sends no usage. With --deadline S the load stops after S seconds and reports what it got
by then, as bounds: requests not finished are counted by the tokens they streamed, and those
still waiting for a first token as TTFT > S. Only the standard library.
Usage: bench/serve_load.py URL CONCURRENCY REQUESTS TOKENS WORDS [--deadline S]"""
import json
import os
import random
import sys
import threading
import time
import urllib.request

WORDS = ("the history of the city begins with a small settlement on the river where traders met to exchange grain "
         "salt and cloth and over the centuries the market grew into a town").split()


def main():
    args = sys.argv[1:]
    deadline = None
    if len(args) == 7 and args[5] == "--deadline":
        deadline = float(args[6])
        args = args[:5]
    if len(args) != 5:
        sys.exit(__doc__)
    url, conc, n_req, tokens, n_words = args[0], *map(int, args[1:])
    lock = threading.Lock()
    todo, ttfts, done = list(range(n_req)), [], {"tokens": 0, "failed": 0, "finished": 0}
    streamed = {}  # request -> content chunks so far (the tokens of a request cut by the deadline)

    def one(i):
        rng = random.Random(i)
        prompt = "%d: %s" % (i, " ".join(rng.choice(WORDS) for _ in range(n_words)))
        body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
                           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
        start, first, used = time.monotonic(), None, None
        req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
                elif chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    if first is None:
                        first = time.monotonic() - start
                        with lock:
                            ttfts.append(first)
                    with lock:
                        streamed[i] = streamed.get(i, 0) + 1
        return used if used is not None else streamed.get(i, 0)

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            try:
                used = one(i)
                with lock:
                    streamed.pop(i, None)
                    done["tokens"] += used
                    done["finished"] += 1
            except Exception as e:  # a failed request is counted, the load goes on
                with lock:
                    done["failed"] += 1
                print("request %d failed: %s" % (i, e), file=sys.stderr)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(None if deadline is None else max(0.0, start + deadline - time.monotonic()))
    wall = time.monotonic() - start
    with lock:
        cut = n_req - done["finished"] - done["failed"]
        total = done["tokens"] + sum(streamed.values())
        waits = sorted(ttfts) + [float("inf")] * (n_req - done["failed"] - len(ttfts))
    pick = lambda q: waits[min(len(waits) - 1, int(q * len(waits)))] if waits else float("nan")  # noqa: E731
    show = lambda v: "> %.0f s" % wall if v == float("inf") else "%.3f s" % v  # noqa: E731
    print("%d clients, %d requests of %d tokens (%d-word prompts): %.2f s, %.1f generated tokens/s, TTFT p50 %s, "
          "p99 %s, %d failed%s" % (conc, n_req, tokens, n_words, wall, total / wall, show(pick(0.5)), show(pick(0.99)),
                                   done["failed"], ", %d cut by the deadline (figures are bounds)" % cut if cut else ""))
    sys.stdout.flush()
    os._exit(0)  # threads still streaming at the deadline are left behind


if __name__ == "__main__":
    main()
