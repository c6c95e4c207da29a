#!/usr/bin/env bash
# The oracle check on the benchmark machine: measures the machine's profile (once per model), then
# runs `pshard bench --oracle` for each case within a deadline, one JSON file per case, and prints
# the summary over all of them. Each case is SHAPE:BUDGETS:CONTEXTS:TIERS, for example
# qwen30b:2G,8G:4096:1,4,16,64,256,1024. Models are made with gguf-synth in /dev/shm if missing.
# Usage: bench/h200_oracle.sh OUT_DIR SECONDS CASE...
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1 seconds=$2
shift 2
mkdir -p "$out"
bin=${PSHARD_BUILD:-build-bench} # an existing Release build, or one made here
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
n=0
for case in "$@"; do
  IFS=: read -r shape budgets contexts tiers <<<"$case"
  model=/dev/shm/$shape.gguf
  [ -f "$out/profile_$shape.txt" ] || "$bin/pshard" profile -m "$model" -t 16 > "$out/profile_$shape.txt" 2>&1
  if [ "$(left)" -le 20 ]; then echo "== $case: no time left"; continue; fi
  n=$((n + 1))
  echo "== $case ($(left) s left)"
  timeout "$(left)" "$bin/pshard" bench --oracle -m "$model" --budgets "$budgets" --contexts "$contexts" \
    --tiers "$tiers" -t 16 --json "$out/oracle_$n.json" > "$out/oracle_$n.txt" 2> "$out/oracle_$n.log"
  tail -3 "$out/oracle_$n.txt"
done
cp "${PSHARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pshard}"/profile-*.json "$out/" 2>/dev/null
python3 - "$out" <<'PY'
import glob, json, statistics, sys
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/oracle_*.json")):
    for line in open(f):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # cut short by the deadline
best = within = 0
worst, errors = 0.0, []
for r in rows:
    def plan_time(c):
        runs = [x["measured_s"] for x in r["candidates"] if x["placement"] == c["placement"] and x["measured_s"] > 0]
        return statistics.mean(runs) if runs else None
    times = {c["plan"]: plan_time(c) for c in r["candidates"] if plan_time(c)}
    chosen = next(c for c in r["candidates"] if c["plan"] == r["chosen"])
    slower = times[r["chosen"]] / min(times.values()) - 1
    best += slower <= 0
    within += slower <= 0.10
    worst = max(worst, slower)
    errors.append(abs(chosen["predicted_s"] / times[r["chosen"]] - 1))
if rows:
    print("all cases: %d configurations, the choice the measured best in %d (%.0f%%), within 10%% in %d, at worst "
          "%.1f%% slower; median prediction error of the chosen plans %.1f%%"
          % (len(rows), best, 100.0 * best / len(rows), within, 100 * worst, 100 * statistics.median(errors)))
PY
