"""gguf-synth's tiny models in llama.cpp (through llama-cpp-python, which builds it from
source): they must load, tokenize as the `tokenizers` library does, and give finite, varied
logits. Skipped where llama-cpp-python is not installed."""
import os
import subprocess

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")
from llama_cpp_plain import plain_cpu_kernels  # noqa: F401 (autouse: AMX kernels crash)

SYNTH = os.path.join(os.environ.get("PSHARD_BUILD_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build")), "gguf-synth")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Numbers 1234567 and symbols #$% can't stop us.",
    "héllo wörld ✓ 日本語 🙂\n\n  indented\tline",
]


def write(tmp_path, shape, *args):
    path = tmp_path / f"{shape}.gguf"
    subprocess.run([SYNTH, "--shape", shape, "-o", str(path), "--quiet", *args], check=True)
    return path


def hf_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(str(path))
    tokens = list(r.fields["tokenizer.ggml.tokens"].contents())
    merges = [tuple(m.split(" ")) for m in r.fields["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-moe"])
def test_llama_cpp_runs_tiny_model(tmp_path, shape):
    path = write(tmp_path, shape)
    model = llama_cpp.Llama(model_path=str(path), n_ctx=256, logits_all=True, verbose=False,
                            n_threads=2)
    for text in TEXTS:
        ids = model.tokenize(text.encode(), add_bos=False, special=False)
        assert model.detokenize(ids).decode() == text
    if shape == "tiny-llama":  # pre "gpt-2": the same split as the tokenizers ByteLevel regex
        hf = hf_tokenizer(path)
        for text in TEXTS[:2]:
            assert model.tokenize(text.encode(), add_bos=False) == hf.encode(text).ids, text

    ids = model.tokenize(TEXTS[0].encode(), add_bos=True)
    model.eval(ids)
    logits = np.array(model.scores[: len(ids)], dtype=np.float64)
    assert np.isfinite(logits).all()
    assert (logits.std(axis=1) > 0.3).all()  # not flat
    assert len(set(logits.argmax(axis=1).tolist())) > 2  # the prediction depends on the input


@pytest.mark.parametrize("type_name", ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K",
                                       "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_llama_cpp_runs_every_type(tmp_path, type_name):
    path = write(tmp_path, "tiny-moe", "--type", type_name)
    model = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False,
                            n_threads=2)
    ids = model.tokenize(TEXTS[0].encode(), add_bos=False)
    model.eval(ids)
    logits = np.array(model.scores[: len(ids)], dtype=np.float64)
    assert np.isfinite(logits).all()
    assert (logits.std(axis=1) > 0.3).all()
