#!/usr/bin/env bash
# The vision issue's table: a Qwen2.5-VL-7B-shaped pair (gguf-synth qwen25vl7b and its mmproj, both
# F16), one image and a short question, 128 tokens, greedy, at each VRAM budget and image size:
# `pshard run` beside llama.cpp's multimodal CLI (llama-mtmd-cli) at the same budget, with the
# device memory the driver reports sampled every 0.2 s around each case. llama-mtmd-cli runs
# twice a case: `--fit on` leaving (free - BUDGET) free with the vision encoder on the GPU, and
# the same with `--no-mmproj-offload` (its encoder on the CPU); --fit sizes the language model
# alone, so the first may pass the budget: the peak says.
# Usage: bench/h200_vision.sh OUT_DIR
# Environment: PSHARD_BUILD (a Release build, default build); LLAMA_BIN (the folder holding
# llama-mtmd-cli; without it only pshard runs); BUDGETS (default "2G 8G"); SIZES (default
# "854x480 1280x720 1920x1080 2560x1440"); LLAMA_VISION (where llama-mtmd-cli's encoder runs, by
# budget: "gpu cpu" both, the default; "2G=cpu 8G=gpu" one each); LM and MMPROJ (default
# /dev/shm/qwen25vl7b.gguf and /dev/shm/qwen25vl7b-mmproj.gguf, written by gguf-synth if absent);
# N (tokens, default 128); SHORT_N with LONG_SIZE (e.g. SHORT_N=16 LONG_SIZE=2560x1440: N tokens
# only at that size, SHORT_N at the others, whose TTFT and peak are what they add; the decode rate
# does not depend on the image); CTX (both programs' context, default 8192: a 2560x1440 image is 4,641
# tokens of Qwen2.5-VL); THREADS (default 16). Writes OUT_DIR/vision.txt (the table) and each
# case's log, and OUT_DIR/vision.png (bench/vision_plot.py); llama-mtmd-cli runs with `-lv 4`, where its library
# prints its timings.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
bin=${PSHARD_BUILD:-build}
lm=${LM:-/dev/shm/qwen25vl7b.gguf}
mmproj=${MMPROJ:-/dev/shm/qwen25vl7b-mmproj.gguf}
n=${N:-128}
# tokens_for SIZE: N, or SHORT_N at sizes other than LONG_SIZE
tokens_for() { if [ -n "${SHORT_N:-}" ] && [ "$1" != "${LONG_SIZE:-}" ]; then echo "$SHORT_N"; else echo "$n"; fi; }
ctx=${CTX:-8192}
threads=${THREADS:-16}
question="Describe this image in detail."
[ -f "$lm" ] || "$bin/gguf-synth" --shape qwen25vl7b --type F16 -o "$lm" --quiet
[ -f "$mmproj" ] || "$bin/gguf-synth" --shape qwen25vl7b-mmproj --type F16 -o "$mmproj" --quiet

# Images of each size: smooth gradients with noise, so no size compresses to nothing.
for size in ${SIZES:-854x480 1280x720 1920x1080 2560x1440}; do
  python3 - "$out/image_$size.png" "${size%x*}" "${size#*x}" <<'PY'
import struct, sys, zlib
path, w, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows, seed = [], 12345
for y in range(h):
    row = bytearray(b"\0")
    for x in range(w):
        seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
        n = seed >> 26
        row += bytes(((x * 255 // w + n) & 255, (y * 255 // h + n) & 255, ((x + y) * 127 // (w + h) + n) & 255))
    rows.append(bytes(row))
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
with open(path, "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"".join(rows), 6)) + chunk(b"IEND", b""))
PY
done

have_smi() { command -v nvidia-smi >/dev/null; }
# vision_places BUDGET: where llama-mtmd-cli's encoder runs at that budget (LLAMA_VISION).
vision_places() {
  local spec=${LLAMA_VISION:-gpu cpu} item places=""
  case $spec in *=*) ;; *) echo "$spec"; return ;; esac
  for item in $spec; do [ "${item%%=*}" = "$1" ] && places="$places ${item#*=}"; done
  echo "${places:-gpu cpu}"
}
mib() { case $1 in *G) echo $((${1%G} * 1024)) ;; *M) echo "${1%M}" ;; *) echo "$1" ;; esac; }

# run_case NAME SIZE LOG COMMAND...: runs it with the driver's memory sampled; prints its row.
run_case() {
  local name=$1 size=$2 log=$3 smi="" base=0 t0 t1
  shift 3
  if have_smi; then
    base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$log.smi" &
    smi=$!
  fi
  t0=$(date +%s.%N)
  "$@" >"$log" 2>&1 || echo "($name failed: $(tail -2 "$log" | tr '\n' ' '))"
  t1=$(date +%s.%N)
  if [ -n "$smi" ]; then kill $smi; wait $smi 2>/dev/null || true; fi
  local peak=0
  [ -s "$log.smi" ] && peak=$(sort -n "$log.smi" | tail -1)
  python3 bench/vision_parse.py "$name" "$size" "$log" "$(python3 -c "print($t1 - $t0)")" "$((peak - base))"
}

{
  printf "%-34s %-10s %9s %9s %9s %9s %9s %9s\n" case image "TTFT s" "image s" "prompt t" "decode t/s" "wall s" "peak MiB"
  for budget in ${BUDGETS:-2G 8G}; do
    for size in ${SIZES:-854x480 1280x720 1920x1080 2560x1440}; do
      img=$out/image_$size.png
      tokens=$(tokens_for "$size")
      run_case "pshard $budget" "$size" "$out/pshard_${budget}_$size.log" "$bin/pshard" run -m "$lm" --mmproj "$mmproj" \
        --image "$img" -p "$question" --vram-budget "$budget" --temp 0 --ignore-eos -n "$tokens" -c "$ctx" -t "$threads"
      if [ -n "${LLAMA_BIN:-}" ] && [ -x "$LLAMA_BIN/llama-mtmd-cli" ]; then
        free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
        fit=(--fit on --fit-target $((free - $(mib "$budget"))) --load-mode none)
        common=(-m "$lm" --mmproj "$mmproj" --image "$img" -p "$question" -n "$tokens" --temp 0 --ignore-eos -c "$ctx"
          -t "$threads" -lv 4)
        for where in $(vision_places "$budget"); do
          if [ "$where" = gpu ]; then
            run_case "llama $budget, vision on GPU" "$size" "$out/llama_${budget}_$size.log" "$LLAMA_BIN/llama-mtmd-cli" \
              "${common[@]}" "${fit[@]}"
          else
            run_case "llama $budget, vision on CPU" "$size" "$out/llama_cpu_${budget}_$size.log" "$LLAMA_BIN/llama-mtmd-cli" \
              "${common[@]}" "${fit[@]}" --no-mmproj-offload
          fi
        done
      fi
    done
  done
} | tee "$out/vision.txt"
# The plot (and pshard's TTFT and whole run against each llama case), where matplotlib is installed.
if python3 -c "import matplotlib" 2>/dev/null; then python3 bench/vision_plot.py "$out/vision.txt" "$out/vision.png"; fi
