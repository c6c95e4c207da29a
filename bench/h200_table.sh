#!/usr/bin/env bash
# pshard and llama.cpp's llama-server side by side on the same files, one case after the other in
# one run (the GPU kernels issue's table): a prompt of about PROMPT tokens, 128 generated tokens,
# greedy, end of text ignored, with the device memory the driver reports sampled every 0.2 s.
#   pshard:SHAPE:BUDGET[:ARGS]   pshard run -m SHAPE.gguf, BUDGET a --vram-budget or "gpu" (--gpu),
#                                -c (prompt + 256) -b 1024 (unless ARGS has -b) -t 16 and ARGS (commas
#                                for spaces)
#   llama:SHAPE:NAME:ARGS        llama-server -m SHAPE.gguf -c (prompt + 256) -t 16 -fa on and ARGS
#                                (commas for spaces; "fit:BUDGET" for --fit on leaving free - BUDGET),
#                                one /completion request, its own timings read back
# PROMPT (default 937) is the prompt's length in tokens: the protocol's sentence repeated, counted
# by pshard's tokenizer (llama-server's count is printed beside it); SHAPE@TOKENS sets one case's
# (e.g. pshard:qwen235b@16000:2G:-b,2048 llama:qwen235b@16000:2G-cpu-moe:-ngl,99,--cpu-moe). A file larger
# than half the RAM (qwen235b: 80 GB in /dev/shm) needs llama-server's default mmap: `--load-mode none`
# reads a second copy into memory and the server is killed while loading.
# Usage: bench/h200_table.sh OUT_DIR CASE...   (PSHARD_BUILD: a Release build, default build;
# LLAMA_BIN: the folder holding llama-server; models /dev/shm/SHAPE.gguf, written by gguf-synth if absent)
# Writes OUT_DIR/table.txt (the log) and OUT_DIR/table.tsv (one row a case).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
mkdir -p "$out"
[ -f "$out/table.tsv" ] || printf 'who\tshape\tbudget\targs\tprompt tokens\tprompt s\tdecode tok/s\tpeak MiB\n' >"$out/table.tsv"
bin=${PSHARD_BUILD:-build}
want=${PROMPT:-937}
port=18081
url=http://127.0.0.1:$port
sentence="The history of the city begins with a small settlement on the river where traders met to exchange grain, salt and cloth."

model_for() { # SHAPE -> its file, synthesized if absent
  local m=/dev/shm/$1.gguf
  [ -f "$m" ] || "$bin/gguf-synth" --shape "$1" -o "$m" --quiet
  echo "$m"
}

prompt_for() { # MODEL TOKENS -> the sentence repeated to about TOKENS tokens (cached per model and length)
  local f want=$2
  f=$out/prompt_$(basename "$1" .gguf)_$want.txt
  if [ ! -f "$f" ]; then
    local n
    n=$("$bin/pshard" tokenize -m "$1" -p "$sentence " 2>/dev/null | tail -1 | wc -w)
    python3 -c "import sys; print(' '.join([sys.argv[1]] * max(1, round(int(sys.argv[2]) / int(sys.argv[3])))))" \
      "$sentence" "$want" "$n" >"$f"
  fi
  echo "$f"
}

mib() { case $1 in *G) echo $((${1%G} * 1024)) ;; *M) echo "${1%M}" ;; *) echo "$1" ;; esac; }

# The card and its clocks: a compute-bound prompt follows the SM clock, a memory-bound decode does not.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv | tee -a "$out/table.txt"
n=$(($(wc -l <"$out/table.tsv") - 1)) # cases numbered on from an earlier run into the same OUT_DIR
for case in "$@"; do
  n=$((n + 1))
  IFS=: read -r who spec a b <<<"$case"
  shape=${spec%@*}
  len=$want
  [ "$spec" = "$shape" ] || len=${spec#*@}
  model=$(model_for "$shape")
  pf=$(prompt_for "$model" "$len")
  ctx=$(( ( $("$bin/pshard" tokenize -m "$model" -p "$(cat "$pf")" 2>/dev/null | tail -1 | wc -w) + 256 + 255 ) / 256 * 256 ))
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out/smi_$n.txt" &
  smi=$!
  log=$out/case_$n.log
  if [ "$who" = pshard ]; then
    args=${b//,/ }
    where="--vram-budget $a"
    [ "$a" = gpu ] && where=--gpu
    batch="-b 1024"
    case " $args " in *" -b "*) batch= ;; esac
    echo "== $n pshard $shape $a $args (context $ctx)"
    # shellcheck disable=SC2086
    "$bin/pshard" run -m "$model" $where --raw --temp 0 --ignore-eos -n 129 -c "$ctx" $batch -t 16 $args \
      -p "$(cat "$pf")" >/dev/null 2>"$log" || echo "(pshard failed: $(tail -1 "$log"))"
    grep -E "^(plan|prompt|decode|VRAM)" "$log" || true
    row=$(python3 - "$log" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
p = re.search(r"^prompt: (\d+) tokens .* in (\d+) ms", t, re.M)
d = re.search(r"^decode: \d+ tokens at ([\d.]+) tok/s", t, re.M)
print("\t".join([p.group(1) if p else "-", "%.3f" % (int(p.group(2)) / 1e3) if p else "-", d.group(1) if d else "-"]))
PY
)
  else
    args=${b//,/ }
    case $b in fit:*) args="--fit on --fit-target $((free - $(mib "${b#fit:}"))) --load-mode none" ;; esac
    echo "== $n llama-server $shape $a: $args (context $ctx)"
    # shellcheck disable=SC2086
    "$LLAMA_BIN/llama-server" -m "$model" -np 1 -c "$ctx" -t 16 -fa on --no-webui --port $port $args >"$log" 2>&1 &
    server=$!
    t0=$(date +%s)
    until python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" $url/health 2>/dev/null; do
      if ! kill -0 $server 2>/dev/null; then echo "(the server exited: $(tail -1 "$log"))"; break; fi
      sleep 1
    done
    row="-	-	-"
    if kill -0 $server 2>/dev/null; then
      echo "ready after $(($(date +%s) - t0)) s"
      row=$(python3 - "$url" "$pf" <<'PY'
import json, sys, urllib.request
body = {"prompt": open(sys.argv[2]).read().strip(), "n_predict": 128, "temperature": 0, "ignore_eos": True,
        "cache_prompt": False}
req = urllib.request.Request(sys.argv[1] + "/completion", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
t = json.load(urllib.request.urlopen(req, timeout=1800))["timings"]
print("llama: prompt %d tokens in %.0f ms, decode %d tokens at %.1f tok/s" %
      (t["prompt_n"], t["prompt_ms"], t["predicted_n"], t["predicted_per_second"]), file=sys.stderr)
print("%d\t%.3f\t%.1f" % (t["prompt_n"], t["prompt_ms"] / 1e3, t["predicted_per_second"]))
PY
) || echo "(the request failed)"
    fi
    kill -INT $server 2>/dev/null || true
    wait $server 2>/dev/null || true
  fi
  kill $smi
  peak=$(sort -n "$out/smi_$n.txt" | tail -1)
  echo "peak device memory (nvidia-smi): $peak MiB, $((peak - base)) MiB above the idle $base MiB"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$who" "$spec" "$a" "${b:-}" "$row" "$peak" >>"$out/table.tsv"
done 2>&1 | tee -a "$out/table.txt"
