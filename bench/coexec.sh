#!/usr/bin/env bash
# Co-execution with a game: bench/game_standin.cu (a working set of device memory, frames at a
# target rate, its memory growing and shrinking in a scripted pattern, frames slowed by streaming
# what it could not keep) beside `pshard serve` under a load of streamed completions, twice: with
# --vram-budget auto:keep=KEEP (pshard gives memory back when the game takes it, and takes it again
# when the game frees it) and with a fixed budget (the paper's setting). Every 0.5 s it samples
# pshard's budget, plan and tokens/s (/metrics) and the device's memory; every second the game logs
# its frame rate, missed frames and memory. bench/coexec.py plots both modes into OUT_DIR/coexec.png
# and prints each one's figures.
# Usage: bench/coexec.sh OUT_DIR [FIXED_BUDGET]
# Environment: MODEL (default /dev/shm/qwen30b.gguf, written by gguf-synth if absent); FIXED_BUDGET
# (default: the budget auto starts at, what the model needs whole, so both start alike); KEEP
# (default 1G); PATTERN (the game's wants over time, default from the device's total T GiB:
# 0:(T-40)G,20:(T-10)G,50:(T-40)G,70:(T-6)G,90:(T-40)G); READ (the share of its assets a frame
# reads, default 0.03); DURATION (default 110 s); PSHARD_BUILD (an
# existing Release build; else build-bench is made here).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
bin=${PSHARD_BUILD:-build-bench}
if [ -z "${PSHARD_BUILD:-}" ]; then
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DPSHARD_TESTS=OFF >/dev/null
  cmake --build build-bench --target pshard_cli gguf-synth >/dev/null
fi
# The game stand-in (one file, nvcc alone).
nvcc -O2 -o "$bin/game_standin" bench/game_standin.cu
model=${MODEL:-/dev/shm/qwen30b.gguf}
[ -f "$model" ] || "$bin/gguf-synth" --shape qwen30b -o "$model" --quiet
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
t=$((total / 1024))
pattern=${PATTERN:-0:$((t - 40))G,20:$((t - 10))G,50:$((t - 40))G,70:$((t - 6))G,90:$((t - 40))G}
duration=${DURATION:-110}
# The game runs DURATION - 10 s from 5 s in: say so where its pattern's last step comes after that.
last=$(tr ',' '\n' <<<"$pattern" | cut -d: -f1 | sort -n | tail -1)
if [ "$last" -ge $((duration - 10)) ]; then
  echo "coexec.sh: the game's last step at $last s comes after its $((duration - 10)) s; DURATION=$((last + 20)) plays it all" >&2
fi
keep=${KEEP:-1G}
# The share of its assets a frame reads: the pattern scales the game to the device (~100-134 GB on
# an H200), so the stand-in's default quarter would read ~30 GB a frame, more than the GPU serves at
# its frame rate, and take the GPU from pshard whenever it has its memory (start BP). 0.03 reads
# ~3-4 GB a frame, ~200 GB/s at 60 frames a second, as a game's frame does on a client card.
read=${READ:-0.03}
port=18080

serve_and_play() { # MODE BUDGET
  local mode=$1 budget=$2
  echo "== $mode: pshard serve --vram-budget $budget; the game wants $pattern"
  "$bin/pshard" serve -m "$model" --vram-budget "$budget" --parallel 4 -c 16384 -t 16 --port $port \
    > "$out/serve_$mode.log" 2>&1 &
  local serve=$!
  until grep -q "ready:" "$out/serve_$mode.log"; do
    kill -0 $serve 2>/dev/null || { cat "$out/serve_$mode.log"; exit 1; }
    sleep 0.5
  done
  grep "^VRAM" "$out/serve_$mode.log" || true
  python3 bench/serve_load.py "http://127.0.0.1:$port" 4 100000 256 64 --deadline "$duration" \
    > "$out/load_$mode.txt" 2>&1 &
  local load=$!
  local t_sampler t_game
  t_sampler=$(date +%s.%N)
  python3 bench/coexec.py sample "http://127.0.0.1:$port" "$out/pshard_$mode.csv" "$duration" &
  local sampler=$!
  sleep 5 # pshard at speed before the game starts
  t_game=$(date +%s.%N)
  awk -v a="$t_sampler" -v b="$t_game" 'BEGIN { printf "%.3f\n", b - a }' > "$out/game_offset_$mode.txt" # (the plot's clocks)
  "$bin/game_standin" --pattern "$pattern" --read "$read" --duration "$((duration - 10))" --log "$out/game_$mode.csv"
  wait $sampler $load || true
  kill -TERM $serve
  wait $serve || true
  grep -E "budget|stopped" "$out/serve_$mode.log" | tail -5 || true
}

# auto first: the budget it starts at (the model whole, or free memory less the keep) is the fixed
# run's default, so the two start alike.
serve_and_play auto "auto:keep=$keep"
start=$(grep -o "VRAM: arena [^=]*" "$out/serve_auto.log" | head -1 || true)
fixed=${2:-${FIXED_BUDGET:-}}
if [ -z "$fixed" ]; then
  fixed=$(awk -F, 'NR == 2 { printf "%dM", $2 }' "$out/pshard_auto.csv")
fi
echo "(auto started with $start; the fixed run's budget: $fixed)"
serve_and_play fixed "$fixed"
python3 bench/coexec.py plot "$out" | tee "$out/summary.txt"
