"""The CPU vision encoder against an independent numpy version of Hugging Face's Qwen2.5-VL
vision tower, which works differently where it can: it reorders the patches window by window
(the model's get_window_index, with its padding), attends within each cu_seqlens segment or over
everything in the full-attention blocks, builds the rotary table from the row/column position
ids, and undoes the order after the merger. Weights are gguf-synth's tiny-qwen25vl-mmproj, read
by the `gguf` package; both sides get the same patches (made by Pillow and numpy).

Tolerance: the numpy side runs in float64, ours in float32 (F32 weights here): every output
within 2e-3 of the output's standard deviation (absolute)."""
import ctypes
import os
import subprocess

import numpy as np
import pytest

from conftest import BUILD
from llama_cpp_plain import plain_cpu_kernels  # noqa: F401 (autouse: AMX kernels crash)
from test_vision_preprocess import LIB_PATH, VisionPatches, normalize, reference_patches

gguf = pytest.importorskip("gguf")
Image = pytest.importorskip("PIL.Image")

SYNTH = os.path.join(BUILD, "gguf-synth")


class Embeddings(ctypes.Structure):
    _fields_ = [("n_tokens", ctypes.c_uint32), ("n_embd", ctypes.c_uint32), ("data", ctypes.POINTER(ctypes.c_float))]


def weights(path):
    r = gguf.GGUFReader(str(path))
    w = {t.name: np.array(t.data, dtype=np.float64) for t in r.tensors}
    kv = {k: f.contents() for k, f in r.fields.items() if k.startswith("clip.")}
    return w, kv


def rms(x, g, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def window_index(gh, gw, merge=2, ws=4):
    """The model's get_window_index for one image: merged-unit order and window boundaries."""
    lh, lw = gh // merge, gw // merge
    index = np.arange(lh * lw).reshape(lh, lw)
    pad_h, pad_w = ws - lh % ws, ws - lw % ws
    nh, nw = (lh + pad_h) // ws, (lw + pad_w) // ws
    padded = np.pad(index, ((0, pad_h), (0, pad_w)), constant_values=-100)
    padded = padded.reshape(nh, ws, nw, ws).transpose(0, 2, 1, 3).reshape(nh * nw, ws, ws)
    seqlens = (padded != -100).sum(axis=(1, 2))
    flat = padded.reshape(-1)
    cu = np.concatenate([[0], np.cumsum(seqlens) * merge * merge])
    return flat[flat != -100], np.unique(cu)


def hf_encode(w, kv, patches, gh, gw, all_full=False):
    e, heads, layers = kv["clip.vision.embedding_length"], kv["clip.vision.attention.head_count"], kv["clip.vision.block_count"]
    eps, pattern, hd = kv["clip.vision.attention.layer_norm_epsilon"], kv["clip.vision.n_wa_pattern"], e // heads
    full_layers = {il for il in range(layers) if (il + 1) % pattern == 0 or all_full}
    n = patches.shape[0]
    x = patches.reshape(n, 3, 2, 14 * 14)
    k0 = w["v.patch_embd.weight"].reshape(e, 3, 14 * 14)
    k1 = w["v.patch_embd.weight.1"].reshape(e, 3, 14 * 14)
    h = np.einsum("ncp,ecp->ne", x[:, :, 0], k0) + np.einsum("ncp,ecp->ne", x[:, :, 1], k1)
    # rotary position ids as the model makes them: (row, col) permuted into the 2x2 group order
    hpos = np.arange(gh)[:, None].repeat(gw, 1).reshape(gh // 2, 2, gw // 2, 2).transpose(0, 2, 1, 3).reshape(-1)
    wpos = np.arange(gw)[None, :].repeat(gh, 0).reshape(gh // 2, 2, gw // 2, 2).transpose(0, 2, 1, 3).reshape(-1)
    dim = hd // 2
    inv_freq = 1.0 / (10000 ** (np.arange(0, dim, 2) / dim))
    rot = np.concatenate([hpos[:, None] * inv_freq, wpos[:, None] * inv_freq], axis=1)
    widx, cu_window = window_index(gh, gw)
    h = h.reshape(n // 4, 4, e)[widx].reshape(n, e)
    rot = rot.reshape(n // 4, 4, -1)[widx].reshape(n, -1)
    emb = np.concatenate([rot, rot], axis=1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]

    def rope(t):
        half = t.shape[-1] // 2
        return t * cos + np.concatenate([-t[..., half:], t[..., :half]], axis=-1) * sin

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    for il in range(layers):
        p = f"v.blk.{il}."
        a = rms(h, w[p + "ln1.weight"], eps)
        q, k, v = (lin(a, p + t).reshape(n, heads, hd) for t in ("attn_q", "attn_k", "attn_v"))
        q, k = rope(q), rope(k)
        cu = [0, n] if il in full_layers else cu_window
        out = np.zeros_like(q)
        for s, t in zip(cu[:-1], cu[1:]):
            scores = np.einsum("qhd,khd->hqk", q[s:t], k[s:t]) / np.sqrt(hd)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            out[s:t] = np.einsum("hqk,khd->qhd", scores, v[s:t])
        h = h + lin(out.reshape(n, e), p + "attn_out")
        a = rms(h, w[p + "ln2.weight"], eps)
        g = lin(a, p + "ffn_gate")
        h = h + lin(g / (1 + np.exp(-g)) * lin(a, p + "ffn_up"), p + "ffn_down")
    h = rms(h, w["v.post_ln.weight"], eps).reshape(n // 4, 4 * e)
    from math import erf
    m = lin(h, "mm.0")
    m = 0.5 * m * (1 + np.vectorize(erf)(m / np.sqrt(2)))
    out = lin(m, "mm.2")
    return out[np.argsort(widx)]


def pshard_encode(mmproj_path, patches, grid_h, grid_w):
    """libpshard's vision_encode on float32 patches (n, 1176), through ctypes."""
    lib = ctypes.CDLL(str(LIB_PATH))
    lib.gguf_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.mmproj_load.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.vision_encode.argtypes = [ctypes.c_void_p, ctypes.POINTER(VisionPatches), ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.POINTER(Embeddings)]
    lib.gguf_close.argtypes = [ctypes.c_void_p]
    lib.mmproj_free.argtypes = [ctypes.c_void_p]
    lib.vision_embeddings_free.argtypes = [ctypes.POINTER(Embeddings)]
    file = ctypes.c_void_p()
    assert lib.gguf_open(str(mmproj_path).encode(), ctypes.byref(file)) == 0
    mmproj = ctypes.create_string_buffer(16384)  # struct mmproj is far smaller
    assert lib.mmproj_load(file, mmproj) == 0
    patches = np.ascontiguousarray(patches, dtype=np.float32)
    vp = VisionPatches(height=grid_h * 14, width=grid_w * 14, grid_t=1, grid_h=grid_h, grid_w=grid_w, patch_dim=1176,
                       n_patches=grid_h * grid_w, data=patches.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
    out = Embeddings()
    assert lib.vision_encode(mmproj, ctypes.byref(vp), None, None, ctypes.byref(out)) == 0
    got = np.ctypeslib.as_array(out.data, shape=(out.n_tokens, out.n_embd)).astype(np.float64).copy()
    lib.vision_embeddings_free(ctypes.byref(out))
    lib.mmproj_free(mmproj)
    lib.gguf_close(file)
    return got


def test_encoder_matches_numpy_reference(tmp_path):
    if not LIB_PATH.exists():
        pytest.skip(f"{LIB_PATH} not built")
    path = tmp_path / "mmproj.gguf"
    # F32 weights: the kernels then keep activations in F32 too, so this compares the algorithm.
    subprocess.run([SYNTH, "--shape", "tiny-qwen25vl-mmproj", "--type", "F32", "-o", str(path), "--quiet"], check=True)
    w, kv = weights(path)
    # 300x200 -> 308x196: 22 x 14 patches, 11 x 7 groups, windows of 4 x 4 groups (3 x 2 of them,
    # the last ones partial), so window and full attention differ.
    rng = np.random.default_rng(3)
    src = Image.fromarray(rng.integers(0, 256, size=(200, 300, 3), dtype=np.uint8))
    resized = np.asarray(src.resize((308, 196), Image.Resampling.BICUBIC))
    patches = np.ascontiguousarray(reference_patches(normalize(resized)), dtype=np.float32)
    gh, gw = 14, 22
    want = hf_encode(w, kv, patches.astype(np.float64), gh, gw)

    got = pshard_encode(path, patches, gh, gw)
    assert got.shape == want.shape == (77, kv["clip.vision.projection_dim"])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * want.std())
    # The windows matter: without them the output is far outside that tolerance.
    unwindowed = hf_encode(w, kv, patches.astype(np.float64), gh, gw, all_full=True)
    assert np.abs(unwindowed - want).max() > 0.05 * want.std()


def test_encoder_matches_llama_cpp(tmp_path):
    """llama.cpp's own Qwen2.5-VL encoder (its multimodal library, through llama-cpp-python) on
    the same pixels: a 308x196 image needs no resizing by either side, and both normalize with
    the file's mean and std. llama.cpp computes attention in F16 (flash attention) and its GELU
    by the tanh approximation, so: every output within 1% of the output's standard deviation
    (measured here: 0.22%)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp import mtmd_cpp as mt

    if not LIB_PATH.exists():
        pytest.skip(f"{LIB_PATH} not built")
    lm, mmproj = tmp_path / "lm.gguf", tmp_path / "mmproj.gguf"
    subprocess.run([SYNTH, "--shape", "tiny-qwen25vl", "--type", "F16", "-o", str(lm), "--quiet"], check=True)
    subprocess.run([SYNTH, "--shape", "tiny-qwen25vl-mmproj", "-o", str(mmproj), "--quiet"], check=True)
    width, height = 308, 196
    pixels = np.random.default_rng(3).integers(0, 256, size=(height, width, 3), dtype=np.uint8)

    model = llama_cpp.Llama(model_path=str(lm), n_ctx=512, verbose=False, n_threads=2)
    params = mt.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 2, False
    ctx = mt.mtmd_init_from_file(str(mmproj).encode(), model.model, params)
    assert ctx
    try:
        bitmap = mt.mtmd_bitmap_init(width, height, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
        chunks = mt.mtmd_input_chunks_init()
        prompt = b"x <__media__>"
        text = mt.mtmd_input_text()
        text.text, text.text_len, text.add_special, text.parse_special = prompt, len(prompt), False, True
        assert mt.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mt.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        image = [mt.mtmd_input_chunks_get(chunks, i) for i in range(mt.mtmd_input_chunks_size(chunks))]
        image = [c for c in image if mt.mtmd_input_chunk_get_type(c) == 1][0]
        n_tokens = mt.mtmd_input_chunk_get_n_tokens(image)
        assert n_tokens == 77, "llama.cpp resized the image"
        assert mt.mtmd_encode_chunk(ctx, image) == 0
        theirs = np.ctypeslib.as_array(mt.mtmd_get_output_embd(ctx), shape=(n_tokens, 256)).astype(np.float64).copy()
        mt.mtmd_input_chunks_free(chunks)
        mt.mtmd_bitmap_free(bitmap)
    finally:
        mt.mtmd_free(ctx)

    ours = pshard_encode(mmproj, reference_patches(normalize(pixels)), height // 14, width // 14)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=0.01 * theirs.std())
