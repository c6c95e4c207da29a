#!/usr/bin/env bash
# pshard serve beside llama.cpp's llama-server under one load (the serve issue's targets: qwen30b,
# 16 concurrent chat streams of a ~1K-token prompt and 128 tokens each), with the device memory the
# driver reports sampled every 0.2 s around each case.
#   pshard:BUDGET[:ARGS]          pshard serve --vram-budget BUDGET --parallel 16 -c 18432 -t 16 -b 2048
#                                 and ARGS (commas for spaces, e.g. pshard:2G:--plan,dynamic)
#   llama:BUDGET:fit              llama-server -np 16 -c 18432 with --fit on, leaving (free - BUDGET) free,
#                                 and --load-mode none
#   llama:NAME:ARGS               llama-server -np 16 -c 18432 with ARGS (commas for spaces,
#                                 e.g. llama:2G-cpu-moe:-ngl,99,--cpu-moe,-nkvo,--load-mode,none)
# With mmap on (its default) llama-server copies the experts it keeps on the CPU up for batched
# prompt steps from the file's pageable mapping, several times slower (RESULTS.md, start BN).
# Usage: bench/h200_serve.sh OUT_DIR CASE...   (PSHARD_BUILD: a Release build; LLAMA_BIN: the folder
# holding llama-server; MODEL: default /dev/shm/qwen30b.gguf, written by gguf-synth if absent;
# DEADLINE: seconds each load may take, default 240, figures of a cut load are bounds)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
bin=${PSHARD_BUILD:-build}
model=${MODEL:-/dev/shm/qwen30b.gguf}
deadline=${DEADLINE:-240}
port=18080
url=http://127.0.0.1:$port
[ -f "$model" ] || "$bin"/gguf-synth --shape qwen30b -o "$model" --quiet

mib() { # "2G" -> 2048, "512M" -> 512
  case $1 in *G) echo $((${1%G} * 1024)) ;; *M) echo "${1%M}" ;; *) echo "$1" ;; esac
}

n=0
for case in "$@"; do
  n=$((n + 1))
  IFS=: read -r who a b <<<"$case"
  free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  log=$out/server_$n.log
  if [ "$who" = pshard ]; then
    args=${b//,/ }
    echo "== pshard serve, budget $a $args"
    # shellcheck disable=SC2086
    "$bin"/pshard serve -m "$model" --vram-budget "$a" --parallel 16 -c 18432 -t 16 -b 2048 --port $port $args >"$log" 2>&1 &
  else
    args=${b//,/ }
    [ "$b" = fit ] && args="--fit on --fit-target $((free - $(mib "$a"))) --load-mode none"
    echo "== llama-server, $a: $args"
    # shellcheck disable=SC2086
    "$LLAMA_BIN/llama-server" -m "$model" -np 16 -c 18432 -t 16 -b 2048 -fa on --no-webui --port $port $args \
      >"$log" 2>&1 &
  fi
  server=$!
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out/smi_$n.txt" &
  smi=$!
  t0=$(date +%s)
  until python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" $url/health 2>/dev/null; do
    if ! kill -0 $server 2>/dev/null; then echo "(the server exited)"; tail -5 "$log"; break; fi
    sleep 1
  done
  if kill -0 $server 2>/dev/null; then
    echo "ready after $(($(date +%s) - t0)) s"
    python3 bench/serve_load.py $url 16 16 128 520 --deadline "$deadline" || echo "(the load failed)"
  fi
  kill -INT $server 2>/dev/null || true
  wait $server 2>/dev/null || true
  kill $smi
  peak=$(sort -n "$out/smi_$n.txt" | tail -1)
  echo "peak device memory (nvidia-smi): $peak MiB, $((peak - base)) MiB above the idle $base MiB"
  { grep -E "CUDA0 .*buffer size" "$log" || true; } | awk '{s += $(NF-1)} END {if (NR) printf "llama.cpp CUDA0 buffers: %.0f MiB\n", s}'
  grep -E "^plan|budget" "$log" | head -3 || true
done | tee -a "$out/serve.txt"
