#!/usr/bin/env bash
# CPU-only decode of the benchmark shapes on the H200 machine's 16 cores, beside the measured
# host read bandwidth. Usage: bench/h200_cpu.sh [OUT_DIR]. Writes results to OUT_DIR/cpu.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp}
threads=${THREADS:-16}
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DPSHARD_TESTS=OFF >/dev/null
cmake --build build-bench --target pshard_cli gguf-synth membw >/dev/null
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cpus"
  build-bench/membw "$threads" 8192
  for shape in qwen30b llama8b; do
    build-bench/gguf-synth --shape "$shape" -o "/dev/shm/$shape.gguf" --quiet
    echo "== $shape, CPU only, $threads threads"
    build-bench/pshard run -m "/dev/shm/$shape.gguf" --raw --temp 0 --ignore-eos -n 65 -t "$threads" -c 4096 \
      -p "The history of the city begins with a small settlement on the river, where traders met." 2>&1 >/dev/null | tail -2
    rm -f "/dev/shm/$shape.gguf"
  done
} | tee "$out/cpu.txt"
