#!/usr/bin/env bash
# The oracle check on the benchmark machine: measures the machine's profile (once per model), then
# runs `pshard bench --oracle` for each case, one JSON file per case (the profile its plans were
# weighed with beside it), and replays them all with bench/oracle_replay.py for the summary. Each
# case is SHAPE:BUDGETS:CONTEXTS:TIERS, for example qwen30b:2G,8G:4096:1,4,16,64,256. Models are
# made with gguf-synth in /dev/shm if missing.
# Resumable: a case done is skipped, so the same command run again (on the same machine) goes on
# where the last one stopped. A case starts only if it can finish within SECONDS (judged by the
# longest case of its model so far, 200 s before the first, and by the time a run of it was cut
# at).
# PSHARD_ORACLE_ARGS: more arguments for every `pshard bench --oracle`, for example "--recheck 4"
# (five loads for close calls: on the H200 the same choices were the measured best in 16 of 20
# configurations against 12 of 20 with the default, each case taking about a quarter longer).
# Usage: bench/h200_oracle.sh OUT_DIR SECONDS CASE...
set -uo pipefail
cd "$(dirname "$0")/.." || exit
out=$1 seconds=$2
shift 2
mkdir -p "$out"
bin=${PSHARD_BUILD:-build-bench} # an existing Release build, or one made here
read -r -a extra <<<"${PSHARD_ORACLE_ARGS:-}"
if [ -z "${PSHARD_BUILD:-}" ]; then
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DPSHARD_TESTS=OFF >/dev/null || exit 1
  cmake --build build-bench --target pshard_cli gguf-synth >/dev/null || exit 1
fi
start=$(date +%s)
left() { echo $((seconds - ($(date +%s) - start))); }
# Every model first, then a pause: CPU rates measured soon after large writes to /dev/shm have
# read up to 2x slow (bench/RESULTS.md).
wrote=0
for case in "$@"; do
  model=/dev/shm/${case%%:*}.gguf
  [ -f "$model" ] || { "$bin/gguf-synth" --shape "${case%%:*}" -o "$model" --quiet && wrote=1; } || exit 1
done
[ "$wrote" = 0 ] || sleep 20
for case in "$@"; do
  IFS=: read -r shape budgets contexts tiers <<<"$case"
  model=/dev/shm/$shape.gguf
  name=oracle_$(echo "$case" | tr ':,' '__')
  [ -f "$out/$name.done" ] && continue
  need=$(cat "$out/longest_$shape" 2>/dev/null)
  need=${need:-200}
  [ -f "$out/profile_$shape.txt" ] || need=$((need + 60)) # the profile first
  cut=$(cat "$out/$name.cut" 2>/dev/null) # the time a run of this case was cut at
  [ -z "$cut" ] || [ "$need" -gt "$cut" ] || need=$((cut + 1))
  if [ "$(left)" -lt "$need" ] || [ "$(left)" -le 0 ]; then echo "== $case: $(left) s left, it takes about $need"; continue; fi
  [ -f "$out/profile_$shape.txt" ] || "$bin/pshard" profile -m "$model" -t 16 > "$out/profile_$shape.txt" 2>&1
  echo "== $case ($(left) s left)"
  t0=$(date +%s) given=$(left)
  timeout "$given" "$bin/pshard" bench --oracle -m "$model" --budgets "$budgets" --contexts "$contexts" \
    --tiers "$tiers" -t 16 "${extra[@]}" --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.log"
  rc=$?
  if [ "$rc" = 124 ]; then echo "$given" > "$out/$name.cut"; echo "   cut at $given s"; continue; fi
  if [ "$rc" != 0 ]; then tail -3 "$out/$name.log"; continue; fi
  touch "$out/$name.done"
  took=$(($(date +%s) - t0))
  [ "$took" -le "$need" ] && [ -f "$out/longest_$shape" ] || echo "$took" > "$out/longest_$shape"
  tail -3 "$out/$name.txt"
done
runs=() # the cases done, for the replay
for f in "$out"/oracle_*.done; do
  [ -f "$f" ] && runs+=("${f%.done}.json")
done
[ ${#runs[@]} = 0 ] || python3 bench/oracle_replay.py "$bin/pshard" /dev/null /dev/shm "${runs[@]}" | tail -5
