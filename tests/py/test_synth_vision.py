"""gguf-synth's Qwen2.5-VL shapes, read by the `gguf` package (llama.cpp's own Python reader):
the language model (architecture qwen2vl) and its mmproj file (architecture clip) carry the keys
llama.cpp reads, with the tensor names and shapes its converter writes. The 7B shapes are
written header-only (the tensor data a hole), which is all the reader needs. `pshard info`
describes both. Where llama-cpp-python is installed, llama.cpp loads and runs the tiny language
model."""
import os
import subprocess

import numpy as np
import pytest

from conftest import BUILD, run_pshard
from llama_cpp_plain import plain_cpu_kernels  # noqa: F401 (autouse: AMX kernels crash)

gguf = pytest.importorskip("gguf")

SYNTH = os.path.join(BUILD, "gguf-synth")

# name: (layers, d, heads, kv heads, head, ff, vocab, rope sections)
LM = {
    "tiny-qwen25vl": (4, 256, 4, 2, 64, 512, 1536, [8, 12, 12, 0]),
    "qwen25vl7b": (28, 3584, 28, 4, 128, 18944, 152064, [16, 24, 24, 0]),
}
# name: (layers, width, heads, ff, n_wa_pattern, projection)
MMPROJ = {
    "tiny-qwen25vl-mmproj": (4, 128, 4, 256, 2, 256),
    "qwen25vl7b-mmproj": (32, 1280, 16, 3420, 8, 3584),
}


def write(tmp_path, shape, *args):
    path = tmp_path / f"{shape}.gguf"
    extra = ["--header-only"] if "7b" in shape else []
    subprocess.run([SYNTH, "--shape", shape, "-o", str(path), "--quiet", *extra, *args], check=True)
    return path


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def shapes(reader):
    return {t.name: [int(x) for x in t.shape] for t in reader.tensors}


@pytest.mark.parametrize("shape", sorted(LM))
def test_language_model(tmp_path, shape):
    layers, d, heads, kv, head, ff, vocab, sections = LM[shape]
    r = gguf.GGUFReader(str(write(tmp_path, shape)))
    assert field(r, "general.architecture") == "qwen2vl"
    assert field(r, "qwen2vl.block_count") == layers
    assert field(r, "qwen2vl.embedding_length") == d
    assert field(r, "qwen2vl.attention.head_count") == heads
    assert field(r, "qwen2vl.attention.head_count_kv") == kv
    assert field(r, "qwen2vl.feed_forward_length") == ff
    assert list(field(r, "qwen2vl.rope.dimension_sections")) == sections
    assert 2 * sum(sections) == head
    assert field(r, "qwen2vl.rope.freq_base") == 1e6
    t = shapes(r)
    assert t["token_embd.weight"] == [d, vocab]
    assert t["output.weight"] == [d, vocab]
    assert t["blk.0.attn_q.weight"] == [d, heads * head]
    assert t["blk.0.attn_q.bias"] == [heads * head]
    assert t[f"blk.{layers - 1}.attn_k.bias"] == [kv * head]
    assert t["blk.0.attn_v.bias"] == [kv * head]
    assert t["blk.0.ffn_down.weight"] == [ff, d]
    assert len(t) == 3 + 12 * layers


@pytest.mark.parametrize("shape", sorted(MMPROJ))
def test_mmproj(tmp_path, shape):
    layers, width, heads, ff, pattern, proj = MMPROJ[shape]
    r = gguf.GGUFReader(str(write(tmp_path, shape)))
    assert field(r, "general.architecture") == "clip"
    assert field(r, "general.type") == "mmproj"
    assert field(r, "clip.projector_type") == "qwen2.5vl_merger"
    assert field(r, "clip.has_vision_encoder") is True
    assert field(r, "clip.use_silu") is True
    assert field(r, "clip.vision.image_size") == 560
    assert field(r, "clip.vision.patch_size") == 14
    assert field(r, "clip.vision.embedding_length") == width
    assert field(r, "clip.vision.feed_forward_length") == ff
    assert field(r, "clip.vision.block_count") == layers
    assert field(r, "clip.vision.attention.head_count") == heads
    assert field(r, "clip.vision.projection_dim") == proj
    assert field(r, "clip.vision.n_wa_pattern") == pattern
    assert np.isclose(field(r, "clip.vision.attention.layer_norm_epsilon"), 1e-6)
    np.testing.assert_allclose(field(r, "clip.vision.image_mean"), [0.48145466, 0.4578275, 0.40821073], rtol=1e-6)
    np.testing.assert_allclose(field(r, "clip.vision.image_std"), [0.26862954, 0.26130258, 0.27577711], rtol=1e-6)
    t = shapes(r)
    assert t["v.patch_embd.weight"] == [14, 14, 3, width]
    assert t["v.patch_embd.weight.1"] == [14, 14, 3, width]
    for il in (0, layers - 1):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            assert t[f"v.blk.{il}.{name}.weight"] == [width, width]
            assert t[f"v.blk.{il}.{name}.bias"] == [width]
        assert t[f"v.blk.{il}.ffn_gate.weight"] == [width, ff]
        assert t[f"v.blk.{il}.ffn_up.bias"] == [ff]
        assert t[f"v.blk.{il}.ffn_down.weight"] == [ff, width]
        assert t[f"v.blk.{il}.ln1.weight"] == [width]
        assert t[f"v.blk.{il}.ln2.weight"] == [width]
    assert t["v.post_ln.weight"] == [width]
    assert t["mm.0.weight"] == [4 * width, 4 * width]
    assert t["mm.0.bias"] == [4 * width]
    assert t["mm.2.weight"] == [4 * width, proj]
    assert t["mm.2.bias"] == [proj]
    assert len(t) == 2 + 16 * layers + 5
    types = {x.name: x.tensor_type.name for x in r.tensors}
    assert types["v.patch_embd.weight"] == "F16" and types["mm.0.weight"] == "F16"
    assert types["v.blk.0.ln1.weight"] == "F32" and types["mm.2.bias"] == "F32"


def test_pshard_info_describes_both(tmp_path):
    out = run_pshard("info", str(write(tmp_path, "qwen25vl7b-mmproj"))).stdout
    assert "projector     qwen2.5vl_merger, output width 3584" in out
    assert "image size    560" in out
    assert "patch size    14 x 14" in out
    assert "layers        32, width 1280, feed-forward 3420, 16 heads of 80" in out
    assert "full attention in layers 7 15 23 31" in out
    out = run_pshard("info", str(write(tmp_path, "qwen25vl7b"))).stdout
    assert "architecture  qwen2vl" in out
    assert "rope sections 16 24 24 0" in out


def test_synth_mmproj_is_deterministic(tmp_path):
    a = write(tmp_path, "tiny-qwen25vl-mmproj")
    b = tmp_path / "again.gguf"
    subprocess.run([SYNTH, "--shape", "tiny-qwen25vl-mmproj", "-o", str(b), "--quiet", "--threads", "1"], check=True)
    assert a.read_bytes() == b.read_bytes()


def test_llama_cpp_runs_tiny_qwen2vl_and_its_mmproj(tmp_path):
    """llama.cpp loads the language model and runs text through it, loads the mmproj file into
    its multimodal library and encodes an image with it into finite embeddings of the language
    model's width. Low-level calls, since llama-cpp-python's eval() gives one position per token
    where M-RoPE wants four (a null position array lets llama.cpp fill them)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import ctypes

    from llama_cpp import mtmd_cpp as mt

    lm = write(tmp_path, "tiny-qwen25vl")
    mmproj = write(tmp_path, "tiny-qwen25vl-mmproj")
    model = llama_cpp.Llama(model_path=str(lm), n_ctx=256, verbose=False, n_threads=2)
    ids = model.tokenize(b"The quick brown fox jumps over the lazy dog.", add_bos=False)
    tokens = (llama_cpp.llama_token * len(ids))(*ids)
    assert llama_cpp.llama_decode(model.ctx, llama_cpp.llama_batch_get_one(tokens, len(ids))) == 0
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(model.ctx, -1), shape=(model.n_vocab(),))
    assert np.isfinite(logits).all() and logits.std() > 0.3

    params = mt.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 2
    params.print_timings = False
    ctx = mt.mtmd_init_from_file(str(mmproj).encode(), model.model, params)
    assert ctx, "llama.cpp refused the mmproj file"
    try:
        assert mt.mtmd_support_vision(ctx) and mt.mtmd_decode_use_mrope(ctx)
        width, height = 84, 56
        pixels = (np.arange(width * height * 3) % 251).astype(np.uint8)
        bitmap = mt.mtmd_bitmap_init(width, height, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
        chunks = mt.mtmd_input_chunks_init()
        prompt = b"look: <__media__>"
        text = mt.mtmd_input_text()
        text.text, text.text_len, text.add_special, text.parse_special = prompt, len(prompt), False, True
        bitmaps = (mt.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mt.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        images = [mt.mtmd_input_chunks_get(chunks, i) for i in range(mt.mtmd_input_chunks_size(chunks))]
        images = [c for c in images if mt.mtmd_input_chunk_get_type(c) == 1]
        assert len(images) == 1
        n_tokens = mt.mtmd_input_chunk_get_n_tokens(images[0])
        assert mt.mtmd_encode_chunk(ctx, images[0]) == 0
        embd = np.ctypeslib.as_array(mt.mtmd_get_output_embd(ctx), shape=(n_tokens * 256,))
        assert n_tokens >= 4 and np.isfinite(embd).all() and embd.std() > 0.01
        mt.mtmd_input_chunks_free(chunks)
        mt.mtmd_bitmap_free(bitmap)
    finally:
        mt.mtmd_free(ctx)
