#!/usr/bin/env bash
# Runs under VRAM budgets (BENCH.md protocol: a ~918-token prompt, 128 generated tokens, greedy,
# 16 threads, context 4096, micro-batch 1024), sampling the device memory the driver reports
# every 0.2 s. Each case is SHAPE:BUDGET:PLAN[:SHARE], e.g. qwen30b:2G:dynamic.
# Usage: bench/h200_budget.sh OUT_DIR CASE...
#   (PSHARD_TRACE_HANDOFFS=1 in the environment adds the GPU-timed hand-offs of decode steps)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
bin=${PSHARD_BUILD:-build-bench} # an existing Release build, or one made here
if [ -z "${PSHARD_BUILD:-}" ]; then
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DPSHARD_TESTS=OFF >/dev/null
  cmake --build build-bench --target pshard_cli gguf-synth >/dev/null
fi
prompt_for() {
  python3 - "$1" "$bin" <<'PY'
import subprocess, sys
words = ("The history of the city begins with a small settlement on the river where traders met to exchange "
         "grain salt and cloth and over the centuries the market grew into a town ").split()
text, n = "", 0
while n < 918:
    text += " ".join(words) + " "
    n = len(subprocess.run([sys.argv[2] + "/pshard", "tokenize", "-m", sys.argv[1], "-p", text],
                           capture_output=True, text=True).stdout.split())
print(text)
PY
}
for case in "$@"; do
  IFS=: read -r shape budget plan share <<<"$case"
  model=/dev/shm/$shape.gguf
  [ -f "$model" ] || "$bin"/gguf-synth --shape "$shape" -o "$model" --quiet
  [ -f "$out/prompt_$shape.txt" ] || prompt_for "$model" > "$out/prompt_$shape.txt"
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/smi_${shape}_${budget}_${plan}.txt" &
  smi=$!
  echo "== $shape, budget $budget, plan $plan ${share:+share $share}"
  "$bin"/pshard plan -m "$model" --vram-budget "$budget" --plan "$plan" -c 4096 -b 1024 ${share:+--stream-share $share} | tail -2
  "$bin"/pshard run -m "$model" --vram-budget "$budget" --plan "$plan" ${share:+--stream-share $share} --raw \
    --temp 0 --ignore-eos -n 129 -c 4096 -b 1024 -t 16 -p "$(cat "$out/prompt_$shape.txt")" 2>&1 >/dev/null | grep -v '^\s*$' | tail -7 ||
    echo "(the run failed)" # and the sampler below is still stopped
  sleep 0.5
  kill $smi
  peak=$(sort -n "$out/smi_${shape}_${budget}_${plan}.txt" | tail -1)
  echo "peak device memory (nvidia-smi): $peak MiB, $((peak - base)) MiB above the idle $base MiB"
done | tee -a "$out/budget.txt"
