"""Logits of the tiny synthetic dense (llama) and MoE (qwen3moe) models at every position of a
256-token sequence, against the independent numpy reference (tests/py/numpy_reference.py, built
on the gguf package's dequantization)."""
import os

import numpy as np
import pytest

import numpy_reference
from conftest import run_pshard, synth
from gguf_rewrite import with_shared_expert

N_TOKENS = 256

# The reference rounds activations as the engine does (act_quant=True), so with F32 and F16
# weights the two compute the same function and differ only in float summation order: every
# logit within 0.5% of the logits' spread, top-1 agreement >= 99%. With Q8_0 weights the 8-bit
# rounding of activations makes both chaotic: a last-bit difference flips a rounding, which
# spreads, so logits drift by about 1% of their spread and top-1 may differ where the
# reference's two best logits are within 0.2 spreads of each other. In the MoE model a drift can
# also flip which experts a token takes (where the router's k-th and next choices are close);
# such a position's logits move by up to a few spreads, so there only the share of such
# positions is bounded.
CASES = [
    ("tiny-llama", "F32"),
    ("tiny-moe", "F32"),
    ("tiny-llama", "F16"),
    ("tiny-moe", "F16"),
    ("tiny-llama", "Q8_0"),
    ("tiny-moe", "Q8_0"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.mark.parametrize("shape,wtype", CASES)
def test_logits_match_numpy_reference(model_dir, shape, wtype):
    path = synth(model_dir, shape, wtype)
    model = numpy_reference.Model(path, act_quant=True)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, model.t["token_embd.weight"].shape[0], N_TOKENS).tolist()
    ref = numpy_reference.forward(model, tokens)
    out = os.path.join(model_dir, "logits.f32")
    # -b 64: the 256 tokens run as four steps, so the KV cache carries across steps too.
    run_pshard("eval", "-m", path, "--tokens", ",".join(map(str, tokens)), "-b", "64", "-o", out)
    ours = np.fromfile(out, dtype=np.float32).reshape(N_TOKENS, -1)
    assert np.isfinite(ours).all()
    spread = ref.std(axis=1, keepdims=True)
    rel = np.abs(ours - ref) / spread
    disagree = ours.argmax(1) != ref.argmax(1)
    if wtype in ("F32", "F16"):
        assert rel.max() < 5e-3, "largest error %.4f of a logit's spread" % rel.max()
        assert disagree.mean() <= 0.01
    else:
        assert np.median(rel) < 0.03, "median error %.4f of a logit's spread" % np.median(rel)
        assert disagree.mean() <= 0.05
        if shape == "tiny-moe":
            assert (rel.max(axis=1) > 0.5).mean() <= 0.05, "too many positions moved as by a routing flip"
        else:
            top2 = np.sort(ref, axis=1)[:, -2:]
            margin = (top2[:, 1] - top2[:, 0]) / spread[:, 0]
            assert (margin[disagree] < 0.2).all(), "top-1 differs where the reference is not near a tie"


def test_shared_expert_matches_numpy_reference(model_dir):
    """A shared expert beside the routed ones, wider than the metadata's dense FFN length (the
    buffers it writes are sized by the layers' own FFNs), against the numpy reference."""
    path = with_shared_expert(synth(model_dir, "tiny-moe", "F32"), os.path.join(model_dir, "shexp.gguf"), 1024, 1024)
    model = numpy_reference.Model(path, act_quant=True)
    tokens = np.random.default_rng(6).integers(0, model.t["token_embd.weight"].shape[0], 96).tolist()
    ref = numpy_reference.forward(model, tokens)
    out = os.path.join(model_dir, "shexp-logits.f32")
    run_pshard("eval", "-m", path, "--tokens", ",".join(map(str, tokens)), "-b", "32", "-o", out)
    ours = np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)
    rel = np.abs(ours - ref) / ref.std(axis=1, keepdims=True)
    assert rel.max() < 5e-3, "largest error %.4f of a logit's spread" % rel.max()
    assert (ours.argmax(1) != ref.argmax(1)).mean() <= 0.01
