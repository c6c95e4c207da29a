"""Model files that are well formed GGUF but not a runnable model are refused at load with a
clear error naming what is wrong, before anything runs: nothing crashes or reads past a buffer
(each case once did, or turned every activation into NaN). Written from gguf-synth's tiny
models by the gguf package (gguf_rewrite.py)."""
import math

import pytest

from conftest import run_pshard, synth
from gguf_rewrite import rewrite, with_shared_expert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    return {"dir": d, **{shape: synth(d, shape, "F32") for shape in ("tiny-llama", "tiny-moe")}}


def refused(path, needle):
    proc = run_pshard("run", "-m", path, "--raw", "-p", "hello " * 100, "-n", "2", check=False)
    assert proc.returncode == 1 and needle in proc.stderr, proc.stderr
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr
    return proc.stderr


@pytest.mark.parametrize("rows,metadata_rows,needle", [
    (4096, 1024, "'blk.0.ffn_gate_shexp.weight' has shape"),
    (1024, None, "expert_shared_feed_forward_length"),
])
def test_bad_shared_expert_refused(tiny, rows, metadata_rows, needle):
    """A shared expert whose width disagrees with the metadata, or whose width the metadata does
    not give (it wrote past the buffers sized for it)."""
    refused(with_shared_expert(tiny["tiny-moe"], str(tiny["dir"] / "bad-shexp.gguf"), rows, metadata_rows), needle)


@pytest.mark.parametrize("shape,key,value", [
    ("tiny-llama", "llama.feed_forward_length", 0),  # the dense FFN's buffers are sized by it
    ("tiny-llama", "llama.rope.freq_base", 0.0),
    ("tiny-llama", "llama.rope.freq_base", math.nan),
    ("tiny-moe", "qwen3moe.rope.freq_base", -1.0),
    ("tiny-llama", "llama.attention.layer_norm_rms_epsilon", -1.0),
    ("tiny-moe", "qwen3moe.attention.layer_norm_rms_epsilon", math.nan),
])
def test_bad_metadata_refused(tiny, shape, key, value):
    path = rewrite(tiny[shape], str(tiny["dir"] / "bad-meta.gguf"), value=lambda name, v: value if name == key else v)
    refused(path, key.split(".", 1)[1])


def test_tokenizer_larger_than_model_refused(tiny):
    """A tokenizer with more tokens than the model has rows of embeddings, naming both counts (it
    ran until a prompt reached such a token); tokenizing alone still works."""
    extra = {"tokenizer.ggml.tokens": "<|extra|>", "tokenizer.ggml.token_type": 3, "tokenizer.ggml.scores": 0.0}
    path = rewrite(tiny["tiny-llama"], str(tiny["dir"] / "big-vocab.gguf"),
                   value=lambda name, v: list(v) + [extra[name]] if name in extra else v)
    stderr = refused(path, "1537 tokens")
    assert "1536 rows" in stderr
    assert run_pshard("tokenize", "-m", path, "-p", "hi <|extra|>").stdout.split()[-1] == "1536"
