#!/usr/bin/env bash
# The planner's switches (PSHARD_SPLIT_FFN, PSHARD_STAGE_STATIC) on the benchmark machine,
# each beside the default: the device plan test (tiny models against the CPU) under each; the
# first 32 greedy tokens of llama8b at 2 and 8 GB under each, compared with the default's; then
# the budget sweep's llama8b cases (bench/h200_budget.sh) under each.
# Usage: PSHARD_BUILD=build bench/h200_switches.sh OUT_DIR [SWITCH=VALUE ...]
#   (the switches default to PSHARD_SPLIT_FFN=0 PSHARD_STAGE_STATIC=0: each turned off; the default runs first;
#   PLANS=0 leaves out the device plan tests, PLANS=only runs nothing else)
set -uo pipefail
cd "$(dirname "$0")/.." || exit
out=$1
shift
switches=("$@")
[ ${#switches[@]} -gt 0 ] || switches=(PSHARD_SPLIT_FFN=0 PSHARD_STAGE_STATIC=0)
bin=${PSHARD_BUILD:-build-bench}
if [ -z "${PSHARD_BUILD:-}" ]; then
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DPSHARD_TESTS=OFF >/dev/null
  cmake --build build-bench --target pshard_cli gguf-synth >/dev/null
fi
mkdir -p "$out"
model=/dev/shm/llama8b.gguf
[ -f "$model" ] || "$bin/gguf-synth" --shape llama8b -o "$model" --quiet
status=0
# Runs teach the profile (measured over predicted, per model and family), so every switch starts
# from the profile as it was at the start, not from what the runs before it taught.
cache=${PSHARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pshard}
snapshot=0
mkdir -p "$out/cache-start" && cp -a "$cache"/. "$out/cache-start/" 2>/dev/null && snapshot=1
for sw in default "${switches[@]}"; do
  [ $snapshot = 0 ] || cp -a "$out/cache-start"/. "$cache/"
  env=()
  [ "$sw" = default ] || env=("$sw")
  name=${sw//=/_}
  if [ "${PLANS:-1}" != 0 ]; then
    echo "== $sw: device plan test"
    # A test that overruns its time must not leave its runs behind to skew the next measurement.
    env "${env[@]}" timeout 300 python3 tests/device/test_plans.py "$bin" > "$out/plans_$name.txt" 2>&1 || status=1
    pkill -f "$bin/pshard" || true
    grep '^FAIL' "$out/plans_$name.txt"
    tail -1 "$out/plans_$name.txt"
  fi
  [ "${PLANS:-1}" != only ] || continue
  for budget in 2G 8G; do
    env "${env[@]}" "$bin/pshard" run -m "$model" --vram-budget "$budget" --raw --temp 0 --ignore-eos -n 32 \
      -c 4096 -t 16 --ids -p "The history of the city begins with a small settlement" 2>/dev/null |
      grep '^ids:' | tail -1 > "$out/ids_${name}_$budget.txt"
    if [ "$sw" != default ]; then
      if cmp -s "$out/ids_default_$budget.txt" "$out/ids_${name}_$budget.txt"; then
        echo "$budget: the same 32 greedy tokens as the default"
      else
        echo "$budget: greedy tokens differ from the default's (see ids_*_$budget.txt)"
        status=1
      fi
    fi
  done
  echo "== $sw: budget sweep"
  mkdir -p "$out/$name"
  env "${env[@]}" PSHARD_BUILD="$bin" bench/h200_budget.sh "$out/$name" llama8b:2G:auto llama8b:4G:auto \
    llama8b:8G:auto > /dev/null 2>&1 || status=1
  grep -E '^== |^VRAM: arena|^prompt:|^decode:' "$out/$name/budget.txt"
done
exit $status
