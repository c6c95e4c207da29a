#!/usr/bin/env bash
# All-in-VRAM runs of the benchmark shapes (BENCH.md protocol: a ~918-token prompt, 128
# generated tokens, greedy, context 4096, micro-batch 1024), with the device memory the driver
# reports sampled every 0.2 s. Usage: bench/h200_gpu.sh [OUT_DIR] [SHAPES...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp}
shift || true
shapes=${*:-qwen30b llama8b}
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DPSHARD_TESTS=OFF >/dev/null
cmake --build build-bench --target pshard_cli gguf-synth >/dev/null
{
  for shape in $shapes; do
    model=/dev/shm/$shape.gguf
    [ -f "$model" ] || build-bench/gguf-synth --shape "$shape" -o "$model" --quiet
    # A prompt of about 918 tokens in this model's vocabulary.
    prompt=$(python3 - "$model" <<'PY'
import subprocess, sys
words = ("The history of the city begins with a small settlement on the river where traders met to exchange "
         "grain salt and cloth and over the centuries the market grew into a town ").split()
text, n = "", 0
while n < 918:
    text += " ".join(words) + " "
    n = len(subprocess.run(["build-bench/pshard", "tokenize", "-m", sys.argv[1], "-p", text],
                           capture_output=True, text=True).stdout.split())
print(text)
PY
)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/smi_$shape.txt" &
    smi=$!
    echo "== $shape, all in VRAM"
    build-bench/pshard run -m "$model" --gpu --raw --temp 0 --ignore-eos -n 129 -c 4096 -b 1024 -p "$prompt" 2>&1 >/dev/null | tail -3
    kill $smi
    echo "peak device memory (nvidia-smi, MiB): $(sort -n "$out/smi_$shape.txt" | tail -1)"
  done
} | tee "$out/gpu.txt"
