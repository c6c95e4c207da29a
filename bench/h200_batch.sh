#!/usr/bin/env bash
# Many sequences at once (issue targets: qwen30b, 1,024-token prompts, 128 tokens each), with the
# device memory the driver reports sampled every 0.2 s around each case.
#   pshard:BUDGET:NPL[,NPL...]   pshard bench --batch under that budget (16 threads, -b 2048)
#   llama:NPL[,NPL...]:ARGS      llama.cpp's batched-bench on the same file (ARGS: its offload options,
#                                commas for spaces, e.g. llama:16:-ngl,99,--n-cpu-moe,30)
# Usage: bench/h200_batch.sh OUT_DIR CASE...   (PSHARD_BUILD: a Release build; LLAMA_BIN: the folder
# holding llama-batched-bench; MODEL: default /dev/shm/qwen30b.gguf, written by gguf-synth if absent)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
bin=${PSHARD_BUILD:-build}
model=${MODEL:-/dev/shm/qwen30b.gguf}
[ -f "$model" ] || "$bin"/gguf-synth --shape qwen30b -o "$model" --quiet
n=0
for case in "$@"; do
  n=$((n + 1))
  IFS=: read -r who a b <<<"$case"
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/smi_$n.txt" &
  smi=$!
  if [ "$who" = pshard ]; then
    echo "== pshard, budget $a, sequences $b"
    "$bin"/pshard bench --batch -m "$model" --vram-budget "$a" -npp 1024 -ntg 128 -npl "$b" -t 16 -b 2048 -q \
      --json "$out/pshard_$a.json" || echo "(the run failed)"
  else
    npls=$a
    max=$(echo "$npls" | tr , '\n' | sort -n | tail -1)
    echo "== llama.cpp batched-bench, sequences $npls, ${b//,/ }"
    # shellcheck disable=SC2086 # (the case's arguments, split on purpose)
    "$LLAMA_BIN/llama-batched-bench" -m "$model" -c $((max * 1152)) -b 2048 -ub 512 -npp 1024 -ntg 128 -npl "$npls" \
      -t 16 -fa on ${b//,/ } 2>&1 | grep -E '^\|' || echo "(the run failed)"
  fi
  sleep 0.5
  kill $smi
  peak=$(sort -n "$out/smi_$n.txt" | tail -1)
  echo "peak device memory (nvidia-smi): $peak MiB, $((peak - base)) MiB above the idle $base MiB"
done | tee -a "$out/batch.txt"
