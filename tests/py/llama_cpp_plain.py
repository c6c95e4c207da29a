"""llama.cpp (through llama-cpp-python 0.3.36) on its plain CPU kernels, for the tests that use
it as a reference. On CPUs with AMX (AMX_INT8 here) it places Q8_0 weights in its AMX buffer
type, whose matmul crashes the process (a segmentation fault in ggml_backend_amx_mul_mat, the
same for tiny-llama, tiny-moe and tiny-qwen25vl); with the extra buffer types off the same files
run. Import the fixture into a test module to apply it there."""
import pytest


@pytest.fixture(autouse=True)
def plain_cpu_kernels(monkeypatch):
    try:
        import llama_cpp.llama_cpp as low
    except ImportError:  # the tests that need llama.cpp skip themselves
        return
    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False  # no AMX or repacked weight buffers
        return p

    monkeypatch.setattr(low, "llama_model_default_params", params)
