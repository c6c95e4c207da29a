#!/usr/bin/env bash
# Builds the GPU tests and the kernel benchmark standalone (tests/device/CMakeLists.txt) and
# runs them all, on a machine with an NVIDIA GPU. Without a GPU every test prints
# "no CUDA device: skipped" and passes.
#   tests/device/run.sh            build in build-dev, run the tests
#   BENCH=1 tests/device/run.sh    also run the benchmark (bench/cuda_bench.c)
#   BUILD_DIR=dir                  another build folder
#   TEST_TIMEOUT=seconds           limit per program (default 180)
# Exit status: nonzero if the build or any test failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build-dev}
JOBS=${JOBS:-$(nproc)}
# cuBLAS where CUDA images usually keep it, for a build carried from another machine.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib"

# A build carried from another machine is reused when its programs can load their libraries.
if [ ! -x "$BUILD_DIR/test_cuda_memory" ] || ldd "$BUILD_DIR/test_cuda_memory" 2>/dev/null | grep -q "not found"; then
  echo "== building in $BUILD_DIR"
  rm -rf "$BUILD_DIR"
  cmake -S tests/device -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  cmake --build "$BUILD_DIR" -j "$JOBS" || exit 1
fi

status=0
for t in "$BUILD_DIR"/test_cuda_*; do
  [ -x "$t" ] || continue
  echo "== $(basename "$t")"
  # A hung driver call must not eat the machine's time: each program gets TEST_TIMEOUT seconds.
  timeout "${TEST_TIMEOUT:-180}" "$t" || { echo "== $(basename "$t") failed or timed out (status $?)"; status=1; }
done
if [ "${BENCH:-0}" = 1 ]; then
  echo "== cuda_bench"
  timeout "${TEST_TIMEOUT:-180}" "$BUILD_DIR/cuda_bench" || status=1
fi
[ $status = 0 ] && echo "== all device tests passed" || echo "== some device tests FAILED"
exit $status
