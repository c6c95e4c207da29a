#!/usr/bin/env python3
"""A load for an OpenAI-compatible server (pshard serve, llama.cpp's llama-server): C clients at
once stream N chat completions of T tokens each (end-of-text ignored, greedy), every prompt its own
of about W words; prints the aggregate generated tokens/s over the wall time, TTFT p50 and p99,
and how many requests failed. Only the standard library.
Usage: bench/serve_load.py URL CONCURRENCY REQUESTS TOKENS WORDS"""
import json
import random
import sys
import threading
import time
import urllib.request

WORDS = ("the history of the city begins with a small settlement on the river where traders met to exchange grain "
         "salt and cloth and over the centuries the market grew into a town").split()


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    url, conc, n_req, tokens, n_words = sys.argv[1], *map(int, sys.argv[2:])
    lock = threading.Lock()
    todo, ttfts, done = list(range(n_req)), [], {"tokens": 0, "failed": 0}

    def one(i):
        rng = random.Random(i)
        prompt = "%d: %s" % (i, " ".join(rng.choice(WORDS) for _ in range(n_words)))
        body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
                           "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
        start, first, used = time.monotonic(), None, 0
        req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
                elif chunk["choices"] and chunk["choices"][0]["delta"].get("content") and first is None:
                    first = time.monotonic() - start
        return first, used

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            try:
                first, used = one(i)
                with lock:
                    ttfts.append(first if first is not None else float("nan"))
                    done["tokens"] += used
            except Exception as e:  # a failed request is counted, the load goes on
                with lock:
                    done["failed"] += 1
                print("request %d failed: %s" % (i, e), file=sys.stderr)

    start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    ttfts.sort()
    pick = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")  # noqa: E731
    print("%d clients, %d requests of %d tokens (%d-word prompts): %.2f s, %.1f generated tokens/s, TTFT p50 %.3f s, "
          "p99 %.3f s, %d failed" % (conc, n_req, tokens, n_words, wall, done["tokens"] / wall, pick(0.5), pick(0.99),
                                     done["failed"]))


if __name__ == "__main__":
    main()
