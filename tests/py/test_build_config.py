"""The CUDA architectures a fresh configure builds for: machine code for Hopper (sm_90) and PTX for
any other GPU from sm_75 on, whatever the compiler's own default (CUDA 13's, sm_75 alone, once
took the place of ours, and Hopper ran JIT-compiled sm_75 code); a value the user gives, by
-DCMAKE_CUDA_ARCHITECTURES or the CUDAARCHS environment variable, is kept. The GPU tests' own
build (tests/device) defaults to sm_90 alike. Configure only, in fresh build folders."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="no CUDA compiler: the CUDA backend is not built")


def architectures(tmp_path, source=ROOT, args=(), env=None):
    """Configure source into a fresh folder; the cached CMAKE_CUDA_ARCHITECTURES."""
    build = tmp_path / "build"
    environ = {k: v for k, v in os.environ.items() if k != "CUDAARCHS"}
    environ.update(env or {})
    if shutil.which("nvcc") is None:
        environ["PATH"] = "/usr/local/cuda/bin:" + environ.get("PATH", "")
    proc = subprocess.run(["cmake", "-S", source, "-B", str(build), "-DPSHARD_TESTS=OFF", *args], capture_output=True,
                          text=True, timeout=300, env=environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(build / "CMakeCache.txt") as f:
        m = re.search(r"^CMAKE_CUDA_ARCHITECTURES:\w+=(.*)$", f.read(), re.M)
    assert m, "no CUDA architectures in the cache: was CUDA not found?"
    return m.group(1)


@needs_nvcc
def test_the_default_is_sm90_code_and_ptx(tmp_path):
    assert architectures(tmp_path) == "90-real;75-virtual"


@needs_nvcc
def test_the_users_choice_is_kept(tmp_path):
    assert architectures(tmp_path / "flag", args=["-DCMAKE_CUDA_ARCHITECTURES=89-real"]) == "89-real"
    assert architectures(tmp_path / "env", env={"CUDAARCHS": "86-real"}) == "86-real"


@needs_nvcc
def test_the_gpu_tests_default_to_sm90(tmp_path):
    assert architectures(tmp_path, source=os.path.join(ROOT, "tests", "device")) == "90-real"
