#!/usr/bin/env python3
"""One row of bench/h200_vision.sh's table from a case's log: `pshard run`'s report (TTFT, the
image's encoding, prompt tokens, decode tokens/s) or llama-mtmd-cli's (its images' encoding plus
its prompt evaluation, which decodes the image's tokens too, as the time to the first token; its
eval rate as decode; its library prints them at `-lv 4`).
Usage: bench/vision_parse.py NAME IMAGE LOG WALL_SECONDS PEAK_MIB"""
import re
import sys


def number(pattern, text, group=1, conv=float):
    m = re.search(pattern, text)
    return conv(m.group(group)) if m else None


def pshard(text):
    return {"ttft": number(r"TTFT (\d+) ms", text), "image": number(r"images: \d+ encoded in (\d+) ms", text),
            "prompt": number(r"prompt: (\d+) tokens", text, conv=int),
            "decode": number(r"decode: \d+ tokens at ([\d.]+) tok/s", text)}


def llama(text):
    # its encoding: the CLI's batch of images (newer llama.cpp), else the library's slices
    batches = re.findall(r"mtmd batch encoding done in (\d+) ms", text)
    encode = sum(float(x) for x in batches or re.findall(r"slice encoded in (\d+) ms", text)) or None
    prompt_ms = number(r"prompt eval time =\s*([\d.]+) ms", text)
    return {"ttft": (encode or 0) + prompt_ms if prompt_ms is not None else None, "image": encode,
            "prompt": number(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", text, conv=int),
            "decode": number(r"\s eval time =\s*[\d.]+ ms /\s*\d+ runs\s*\(\s*[\d.]+ ms per token,\s*([\d.]+) tokens per second",
                             text)}


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    name, image, log, wall, peak = sys.argv[1:]
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    r = llama(text) if "llama_perf" in text or "mtmd" in text else pshard(text)

    def cell(v, scale=1.0, fmt="%.3f"):
        return fmt % (v * scale) if v is not None else "-"

    print("%-34s %-10s %9s %9s %9s %9s %9s %9s" % (name, image, cell(r["ttft"], 1e-3), cell(r["image"], 1e-3),
                                                   cell(r["prompt"], fmt="%d"), cell(r["decode"], fmt="%.1f"),
                                                   "%.1f" % float(wall), peak if int(peak) > 0 else "-"))


if __name__ == "__main__":
    main()
