#!/usr/bin/env python3
"""Prompts with images on the GPU compute the CPU's function: gguf-synth's tiny Qwen2.5-VL pair
(language model in F32, so the two differ only by summation order), a text prompt, one image and
two images, greedy tokens of every shard on the GPU (--gpu), of the GPU plan under a budget that
streams, and of the automatic plan under one that puts prompt steps partly on the CPU, each equal to the CPU's for the first 8 tokens (M-RoPE
tables on the device, the image steps' embeddings placed on the host, decode steps after an
image replayed with rope positions behind their cells). With a GPU the images are encoded there, in
the scratch the executor lends between steps (no warning that the CPU took over), and give the
tokens the CPU's encoder gives on the same placement (--no-mmproj-offload). An image too large for that scratch but
within the budget is encoded in the whole budget (the language model's cells to the host, its plan carved again
after): the same tokens as the CPU's encoder and as a budget whose scratch holds it, in a one-shot prompt and in a
chat's second turn (the first turn's cells in VRAM go down and up again). Exits 0 with a "skipped" line where no
GPU exists.
Usage: tests/device/test_vision_gpu.py BUILD_DIR"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
PSHARD = os.path.join(BUILD, "pshard")
SYNTH = os.path.join(BUILD, "gguf-synth")
N, SAME = 16, 8
failures = []


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def ids(tmp, prompt, images, placement):
    args = [PSHARD, "run", "-m", os.path.join(tmp, "lm.gguf"), "--raw", "--temp", "0", "-n", str(N), "--ids", "-q",
            "-p", prompt, *placement]
    if images:
        args += ["--mmproj", os.path.join(tmp, "mmproj.gguf")]
        for im in images:
            args += ["--image", os.path.join(tmp, im)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return None, proc.stderr
    return [int(x) for x in re.search(r"^ids:(.*)$", proc.stdout, re.M).group(1).split()], proc.stderr


def least_mb(tmp):
    """The gpu plan's least VRAM for the language model, in MB, as pshard plan refuses a budget below it."""
    proc = subprocess.run([PSHARD, "plan", "-m", os.path.join(tmp, "lm.gguf"), "--plan", "gpu", "--vram-budget", "1M"],
                          capture_output=True, text=True, timeout=120)
    return int(re.search(r"needs at least (\d+) MB", proc.stderr + proc.stdout).group(1))


def write_png(path, height, width, seed):
    """A random RGB PNG, written with zlib alone (no imaging library needed on the device)."""
    import struct
    import zlib
    rows = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\0" + rows[r].tobytes() for r in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


WHOLE = "encoding in the whole budget"


def plan_memory(tmp, budget, size):
    """Where pshard plan says the encoder of an image of `size` takes its memory under the gpu plan at `budget`."""
    proc = subprocess.run([PSHARD, "plan", "-m", os.path.join(tmp, "lm.gguf"), "--plan", "gpu", "--vram-budget", budget,
                           "--mmproj", os.path.join(tmp, "mmproj.gguf"), "--image-size", size], capture_output=True,
                          text=True, timeout=120)
    m = re.search(r"runs on: the (GPU, in the scratch|GPU, in the whole budget|CPU)", proc.stdout)
    return m.group(1) if m else None


def chat(tmp, image, placement):
    """A chat's replies: a text turn, then the image with a question (its encoding finds the first turn's cells)."""
    stdin = "Say something\n/image %s\nWhat is it?\n/quit\n" % os.path.join(tmp, image)
    proc = subprocess.run([PSHARD, "chat", "-m", os.path.join(tmp, "lm.gguf"), "--mmproj", os.path.join(tmp, "mmproj.gguf"),
                           "--temp", "0", "-n", str(SAME), *placement], input=stdin, capture_output=True, text=True,
                          timeout=600)
    return (proc.stdout if proc.returncode == 0 else None), proc.stderr


def whole_budget(tmp, least):
    """The gpu plan at a budget whose lent scratch is short of the image's least but whose whole budget holds it
    (pshard plan's word, then the run's): the greedy tokens of the CPU's encoder and of a roomy budget."""
    size, image = "1288x728", "big.png"
    write_png(os.path.join(tmp, image), 728, 1288, 6)
    budgets = ["%dM" % mb for mb in range(least + 1, least + 65)]
    chosen = [b for b in budgets if plan_memory(tmp, b, size) == "GPU, in the whole budget"]
    check(bool(chosen), "pshard plan finds budgets where a %s image takes the whole budget" % size)
    if not chosen:
        return
    budget = chosen[len(chosen) // 2]  # (away from the edges, where plan and run may differ by a few MB)
    tight, roomy = ["--plan", "gpu", "--vram-budget", budget], ["--plan", "gpu", "--vram-budget", "512M"]
    prompt = "<__image__>What is it?"
    got, err = ids(tmp, prompt, [image], tight)
    check(got is not None and WHOLE in err and "encoded on the CPU" not in err,
          "%s budget: the %s image encoded in the whole budget%s" % (budget, size, "" if got is None else ": " + err.strip()))
    cpu_enc, err2 = ids(tmp, prompt, [image], tight + ["--no-mmproj-offload"])
    room, err3 = ids(tmp, prompt, [image], roomy)
    cpu, err4 = ids(tmp, prompt, [image], [])
    check(room is not None and WHOLE not in err3 and "encoded on the CPU" not in err3,
          "512M budget: the %s image encoded in the lent scratch%s" % (size, "" if room is None else ": " + err3.strip()))
    for name, other, e in (("the CPU encoder's on the same plan", cpu_enc, err2), ("a roomy budget's", room, err3),
                           ("the CPU's", cpu, err4)):
        check(got is not None and other is not None and got[:SAME] == other[:SAME],
              "%s budget, whole-budget encoding: first %d tokens as %s (%s vs %s)%s" %
              (budget, SAME, name, got, other, (err + e).strip()))
    # A chat's second turn: the first turn's cells in VRAM go to the host and come back.
    text, err = chat(tmp, image, tight)
    cpu_text, err2 = chat(tmp, image, tight + ["--no-mmproj-offload"])
    room_text, err3 = chat(tmp, image, roomy)
    check(text is not None and WHOLE in err, "%s budget, chat: the image encoded in the whole budget%s" %
          (budget, ": " + err.strip()))
    check(text is not None and text == cpu_text and text == room_text,
          "%s budget, chat: replies as with the CPU's encoder and a roomy budget (%r, %r, %r)%s" %
          (budget, text, cpu_text, room_text, (err + err2 + err3).strip()))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([SYNTH, "--shape", "tiny-qwen25vl", "--type", "F32", "-o", os.path.join(tmp, "lm.gguf"), "--quiet"],
                       check=True)
        subprocess.run([SYNTH, "--shape", "tiny-qwen25vl-mmproj", "-o", os.path.join(tmp, "mmproj.gguf"), "--quiet"],
                       check=True)
        write_png(os.path.join(tmp, "a.png"), 196, 308, 3)
        write_png(os.path.join(tmp, "b.png"), 120, 90, 4)
        write_png(os.path.join(tmp, "c.png"), 448, 644, 5)  # 32 x 46 patches: many windows, two chunks
        _, err = ids(tmp, "x", [], ["--gpu"])
        if "no CUDA device" in err:
            print("no CUDA device: skipped")
            return 0
        cases = [("The quick brown fox jumps over the lazy dog.", []), ("<__image__>Describe: ", ["a.png"]),
                 ("Compare <__image__> with <__image__> and say", ["a.png", "b.png"]), ("<__image__>What is it?", ["c.png"])]
        # (F32 weights of 12.6 MB; the gpu plan's least, with its buffers, is about 52-56 MB as the
        # executor's buffers grow: 2 MB above it, it streams the embedding and FFNs, and auto 6 MB
        # above it runs prompt tiers static, part on the CPU)
        least = least_mb(tmp)
        streamed, static = "%dM" % (least + 2), "%dM" % (least + 6)
        placements = {"--gpu": ["--gpu"],
                      "gpu plan, %s budget (streamed)" % streamed: ["--plan", "gpu", "--vram-budget", streamed],
                      "auto, %s budget (static prompt tiers)" % static: ["--vram-budget", static, "--no-profile"]}
        for prompt, images in cases:
            cpu, err = ids(tmp, prompt, images, [])
            if cpu is None:
                check(False, "%d image(s), CPU: %s" % (len(images), err.strip()))
                continue
            for name, placement in placements.items():
                gpu, err = ids(tmp, prompt, images, placement)
                check(gpu is not None and gpu[:SAME] == cpu[:SAME],
                      "%d image(s), %s: first %d greedy tokens as the CPU's (%s vs %s)%s" %
                      (len(images), name, SAME, gpu, cpu, "" if gpu is not None else ": " + err.strip()))
                if images:
                    check("encoded on the CPU" not in err, "%d image(s), %s: encoded on the GPU%s" %
                          (len(images), name, "" if "encoded on the CPU" not in err else ": " + err.strip()))
            if images:
                gpu_enc, err = ids(tmp, prompt, images, ["--gpu"])
                cpu_enc, err2 = ids(tmp, prompt, images, ["--gpu", "--no-mmproj-offload"])
                check(gpu_enc is not None and cpu_enc is not None and gpu_enc[:SAME] == cpu_enc[:SAME],
                      "%d image(s), --gpu: the GPU's encoder gives the CPU encoder's first %d tokens (%s vs %s)%s" %
                      (len(images), SAME, gpu_enc, cpu_enc, (err + err2).strip()))
        whole_budget(tmp, least)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
