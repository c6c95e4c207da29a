"""gguf-synth end to end: the files it writes, read back by the PyPI `gguf` package and the
`tokenizers` library (references nobody here wrote), against shape definitions written out
again here, independently of the C table."""
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

BUILD_DIR = os.environ.get("PSHARD_BUILD_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"))
SYNTH = os.path.join(BUILD_DIR, "gguf-synth")

# The shapes as llama.cpp's files of the real models have them (see docs/gguf-synth.md).
SHAPES = {
    "tiny-llama": dict(arch="llama", n_layer=4, d=256, ff=512, n_head=8, n_kv=4, head_dim=32,
                       n_expert=0, n_used=0, ff_exp=0, vocab=1536, ctx=2048, rope=10000.0,
                       eps=1e-5, mat="Q8_0", exp="Q8_0", pre="gpt-2", size=None),
    "tiny-moe": dict(arch="qwen3moe", n_layer=4, d=256, ff=512, n_head=8, n_kv=4, head_dim=64,
                     n_expert=8, n_used=2, ff_exp=128, vocab=1536, ctx=2048, rope=1e6, eps=1e-6,
                     mat="Q8_0", exp="Q8_0", pre="qwen2", size=None),
    "qwen30b": dict(arch="qwen3moe", n_layer=48, d=2048, ff=6144, n_head=32, n_kv=4,
                    head_dim=128, n_expert=128, n_used=8, ff_exp=768, vocab=151936, ctx=40960,
                    rope=1e6, eps=1e-6, mat="Q4_0", exp="Q4_0", pre="qwen2", size=17.2e9),
    "llama8b": dict(arch="llama", n_layer=32, d=4096, ff=14336, n_head=32, n_kv=8, head_dim=128,
                    n_expert=0, n_used=0, ff_exp=0, vocab=128256, ctx=131072, rope=500000.0,
                    eps=1e-5, mat="F16", exp="F16", pre="gpt-2", size=16.1e9),
    "qwen235b": dict(arch="qwen3moe", n_layer=94, d=4096, ff=12288, n_head=64, n_kv=4,
                     head_dim=128, n_expert=128, n_used=8, ff_exp=1536, vocab=151936, ctx=40960,
                     rope=1e6, eps=1e-6, mat="Q4_K", exp="Q2_K", pre="qwen2", size=79e9),
    "minitron8b": dict(arch="llama", n_layer=40, d=4096, ff=11520, n_head=32, n_kv=8,
                       head_dim=128, n_expert=0, n_used=0, ff_exp=0, vocab=131072, ctx=8192,
                       rope=1e6, eps=1e-5, mat="F16", exp="F16", pre="gpt-2", size=16.8e9),
    "minitron4b": dict(arch="llama", n_layer=32, d=3072, ff=9216, n_head=32, n_kv=8,
                       head_dim=128, n_expert=0, n_used=0, ff_exp=0, vocab=128256, ctx=131072,
                       rope=500000.0, eps=1e-5, mat="F16", exp="F16", pre="gpt-2", size=9.0e9),
}

BLOCK = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20),
         "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q2_K": (256, 84),
         "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}


def fit(type_name, row):
    """The type a row of `row` elements gets: llama-quantize's fallbacks for short rows."""
    if row % BLOCK[type_name][0] == 0:
        return type_name
    fallback = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
    nxt = fallback.get(type_name, "F16")
    return nxt if row % BLOCK[nxt][0] == 0 else "F16"


def expected_tensors(s, n_layer, tied=False):
    """name -> (shape in ggml order, type name, stddev or None for norms)."""
    d, q, kv = s["d"], s["n_head"] * s["head_dim"], s["n_kv"] * s["head_dim"]
    t = {"token_embd.weight": ((d, s["vocab"]), s["mat"]), "output_norm.weight": ((d,), "F32")}
    if not tied:
        t["output.weight"] = ((d, s["vocab"]), s["mat"])
    for i in range(n_layer):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = ((d,), "F32")
        t[b + "attn_q.weight"] = ((d, q), s["mat"])
        t[b + "attn_k.weight"] = ((d, kv), s["mat"])
        t[b + "attn_v.weight"] = ((d, kv), s["mat"])
        t[b + "attn_output.weight"] = ((q, d), s["mat"])
        t[b + "ffn_norm.weight"] = ((d,), "F32")
        if s["n_expert"]:
            e, f = s["n_expert"], s["ff_exp"]
            t[b + "attn_q_norm.weight"] = ((s["head_dim"],), "F32")
            t[b + "attn_k_norm.weight"] = ((s["head_dim"],), "F32")
            t[b + "ffn_gate_inp.weight"] = ((d, e), "F32")
            t[b + "ffn_gate_exps.weight"] = ((d, f, e), s["exp"])
            t[b + "ffn_up_exps.weight"] = ((d, f, e), s["exp"])
            t[b + "ffn_down_exps.weight"] = ((f, d, e), s["exp"])
        else:
            t[b + "ffn_gate.weight"] = ((d, s["ff"]), s["mat"])
            t[b + "ffn_up.weight"] = ((d, s["ff"]), s["mat"])
            t[b + "ffn_down.weight"] = ((s["ff"], d), s["mat"])
    return {name: (shape, fit(ty, shape[0]) if len(shape) > 1 else ty) for name, (shape, ty) in t.items()}


def tensor_bytes(shape, type_name):
    elems, nbytes = BLOCK[type_name]
    n = int(np.prod(shape))
    return n // elems * nbytes


def run(*args, check=True, cwd=None):
    if not os.path.exists(SYNTH):
        pytest.fail(f"{SYNTH} not built (set PSHARD_BUILD_DIR)")
    proc = subprocess.run([SYNTH, *args], capture_output=True, text=True, timeout=600, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"gguf-synth {' '.join(args)} failed:\n{proc.stderr}")
    return proc


@pytest.fixture
def out_dir(tmp_path):
    """Where the files go: /dev/shm when it has room (these files run to gigabytes and a
    shared disk is slow), else pytest's tmp_path."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 8e9:
        d = Path(tempfile.mkdtemp(prefix="gguf-synth-test-", dir=shm))
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path


def synth(directory, shape, *args, name=None):
    path = directory / (name or f"{shape}.gguf")
    run("--shape", shape, "-o", str(path), "--quiet", *args)
    return path


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def target_std(name, row_len, n_layer, tied=False):
    """The standard deviation gguf-synth draws a weight matrix with (docs/gguf-synth.md): unit
    token embeddings (untied), residual-branch outputs at 1/sqrt(row * 2 * layers), the rest at
    1/sqrt(row)."""
    if name == "token_embd.weight" and not tied:
        return 1.0
    if name.endswith(("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight")):
        return 1.0 / np.sqrt(row_len * 2 * n_layer)
    return 1.0 / np.sqrt(row_len)


def sample_values(t, max_rows=64):
    """Dequantize a few rows of a tensor (all of a small one)."""
    data = t.data
    rows = data.reshape(-1, data.shape[-1])
    n = rows.shape[0]
    pick = rows if n <= max_rows else rows[np.linspace(0, n - 1, max_rows).astype(int)]
    return gguf.quants.dequantize(np.ascontiguousarray(pick), t.tensor_type).astype(np.float64)


CASES = [("tiny-llama", None), ("tiny-moe", None), ("qwen30b", 2), ("llama8b", 2), ("qwen235b", 2)]


@pytest.mark.parametrize("shape,layers", CASES, ids=[c[0] for c in CASES])
def test_shape_reads_back(out_dir, shape, layers):
    s = SHAPES[shape]
    n_layer = layers or s["n_layer"]
    path = synth(out_dir, shape, *(["--layers", str(layers)] if layers else []))
    r = gguf.GGUFReader(str(path))
    arch = s["arch"]

    assert field(r, "general.architecture") == arch
    assert field(r, "general.alignment") == 32
    assert field(r, f"{arch}.block_count") == n_layer
    assert field(r, f"{arch}.embedding_length") == s["d"]
    assert field(r, f"{arch}.feed_forward_length") == s["ff"]
    assert field(r, f"{arch}.context_length") == s["ctx"]
    assert field(r, f"{arch}.attention.head_count") == s["n_head"]
    assert field(r, f"{arch}.attention.head_count_kv") == s["n_kv"]
    assert field(r, f"{arch}.attention.key_length") == s["head_dim"]
    assert field(r, f"{arch}.attention.value_length") == s["head_dim"]
    assert field(r, f"{arch}.rope.freq_base") == pytest.approx(s["rope"])
    assert field(r, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(s["eps"])
    if arch == "llama":
        assert field(r, f"{arch}.rope.dimension_count") == s["head_dim"]
    if s["n_expert"]:
        assert field(r, f"{arch}.expert_count") == s["n_expert"]
        assert field(r, f"{arch}.expert_used_count") == s["n_used"]
        assert field(r, f"{arch}.expert_feed_forward_length") == s["ff_exp"]
        assert field(r, f"{arch}.expert_weights_norm") is True
    # general.file_type names the type that holds most of the bytes.
    ftype = {"Q8_0": 7, "Q4_0": 2, "F16": 1, "Q4_K": 15, "Q2_K": 10}
    main_type = s["exp"] if s["n_expert"] else s["mat"]
    assert field(r, "general.file_type") == ftype[main_type]
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == s["pre"]
    types = np.array(field(r, "tokenizer.ggml.token_type"))
    n_merges = len(r.fields["tokenizer.ggml.merges"].data)
    assert len(types) == s["vocab"]
    assert (types == 3).sum() == 3  # <|endoftext|>, <|im_start|>, <|im_end|>
    assert (types == 1).sum() >= 256 + n_merges // 2  # bytes and merge results
    assert (types == 5).sum() == s["vocab"] - (types != 5).sum()  # the rest: unused fillers
    if s["vocab"] > 100000:
        assert (types == 5).sum() > s["vocab"] - 2000

    want = expected_tensors(s, n_layer)
    got = {t.name: t for t in r.tensors}
    assert sorted(got) == sorted(want)
    offsets = []
    for name, (shape_want, type_want) in want.items():
        t = got[name]
        assert tuple(int(x) for x in t.shape) == shape_want, name
        assert t.tensor_type.name == type_want, name
        assert t.n_bytes == tensor_bytes(shape_want, type_want), name
        assert t.data_offset % 32 == 0, name
        offsets.append((t.data_offset, t.n_bytes))
    offsets.sort()
    for (a, n), (b, _) in zip(offsets, offsets[1:]):
        assert a + n <= b
    assert offsets[-1][0] + offsets[-1][1] <= os.path.getsize(path)

    for name, t in got.items():
        v = sample_values(t)
        assert np.isfinite(v).all(), name
        if "norm" in name:  # RMS-norm gains: near 1
            assert abs(v.mean() - 1.0) < 0.05 and 0.01 < v.std() < 0.1, (name, v.mean(), v.std())
        else:  # weights: mean 0, the standard deviation target_std gives
            target = target_std(name, int(t.shape[0]), n_layer)
            assert abs(v.std() / target - 1.0) < 0.15, (name, v.std(), target)
            assert abs(v.mean()) < 0.1 * target, (name, v.mean(), target)


def test_full_sizes_from_list():
    """--list totals match the per-tensor arithmetic here and the sizes BENCH.md quotes."""
    out = run("--list").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    for shape, s in SHAPES.items():
        total = 0
        for shape_dims, type_name in expected_tensors(s, s["n_layer"]).values():
            total += (tensor_bytes(shape_dims, type_name) + 31) // 32 * 32
        assert int(rows[shape][-1]) == total, shape
        if s["size"]:
            assert abs(total / s["size"] - 1.0) < 0.01, (shape, total)


ALL_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
             "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_every_type_dequantizes_sanely(out_dir, type_name):
    path = synth(out_dir, "tiny-moe", "--type", type_name, "--layers", "1")
    r = gguf.GGUFReader(str(path))
    want = expected_tensors(dict(SHAPES["tiny-moe"], mat=type_name, exp=type_name), 1)
    for t in r.tensors:
        assert t.tensor_type.name == want[t.name][1], t.name
        if "norm" in t.name:
            continue
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        target = target_std(t.name, int(t.shape[0]), 1)
        assert np.isfinite(v).all(), t.name
        assert abs(v.std() / target - 1.0) < 0.1, (t.name, v.std(), target)
        assert abs(v.mean()) < 0.05 * target, (t.name, v.mean())
        # Random, not constant: many distinct values in every tensor.
        assert len(np.unique(v[:4096])) > 8, t.name


def test_expert_type_and_tied(out_dir):
    path = synth(out_dir, "tiny-moe", "--expert-type", "Q4_1", "--tied", "--layers", "1")
    r = gguf.GGUFReader(str(path))
    names = {t.name: t.tensor_type.name for t in r.tensors}
    assert "output.weight" not in names
    assert names["blk.0.ffn_up_exps.weight"] == "Q4_1"
    assert names["blk.0.attn_q.weight"] == "Q8_0"


def test_deterministic_and_thread_independent(out_dir):
    # Expert tensors of qwen30b span many 4 MiB chunks, so threads really do interleave.
    args = ["--layers", "1", "--vocab", "2048"]
    a = synth(out_dir, "qwen30b", *args, "--threads", "1", name="a.gguf")
    b = synth(out_dir, "qwen30b", *args, "--threads", "2", name="b.gguf")
    c = synth(out_dir, "qwen30b", *args, "--threads", "7", name="c.gguf")
    # The file system decides between mapping and pwrite(); both must give the same bytes.
    m = synth(out_dir, "qwen30b", *args, "--mmap", name="m.gguf")
    p = synth(out_dir, "qwen30b", *args, "--no-mmap", name="p.gguf")
    assert sha256(a) == sha256(b) == sha256(c) == sha256(m) == sha256(p)
    d = synth(out_dir, "qwen30b", *args, "--seed", "2", name="d.gguf")
    assert sha256(d) != sha256(a)
    e = synth(out_dir, "tiny-llama", name="e.gguf")
    f = synth(out_dir, "tiny-llama", name="f.gguf")
    assert sha256(e) == sha256(f)


def test_vocab_is_valid_and_works_in_tokenizers(out_dir):
    tokenizers = pytest.importorskip("tokenizers")
    path = synth(out_dir, "tiny-moe", "--layers", "1")
    r = gguf.GGUFReader(str(path))
    tokens = list(field(r, "tokenizer.ggml.tokens"))
    types = list(field(r, "tokenizer.ggml.token_type"))
    merges = list(field(r, "tokenizer.ggml.merges"))
    assert len(tokens) == len(types) == 1536
    assert len(set(tokens)) == len(tokens)
    assert len(merges) > 1000

    # The 256 byte tokens in GPT-2's byte-to-unicode order.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    byte_chars = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in byte_chars:
            byte_chars[b] = chr(256 + n)
            n += 1
    assert tokens[:256] == sorted(byte_chars.values())
    assert all(t == 1 for t in types[:256])

    index = {t: i for i, t in enumerate(tokens)}
    for m in merges:
        left, right = m.split(" ")
        assert left in index and right in index and left + right in index, m
        assert types[index[left + right]] == 1

    specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    for s in specials:
        assert types[index[s]] == 3, s
    assert all(t in (1, 3, 5) for t in types)
    assert all(types[i] == 5 for i, t in enumerate(tokens) if t.startswith("[PAD"))
    assert tokens[field(r, "tokenizer.ggml.bos_token_id")] == "<|endoftext|>"
    assert tokens[field(r, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    template = field(r, "tokenizer.chat_template")
    assert "<|im_start|>" in template and "add_generation_prompt" in template

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=index, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(sorted(specials))
    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "Hello world! This is a test of the tokenizer, with numbers 1234 and symbols #$%.",
        "héllo wörld ✓ 日本語 🙂",
        "\n\n  indented\tline\r\n",
        "\x00\x01 control bytes \x7f",
    ]
    for text in texts:
        enc = tok.encode(text)
        assert tok.decode(enc.ids) == text, text
    english = tok.encode(texts[0]).ids
    assert len(english) < len(texts[0].encode()) / 3  # the merges do real work
    chat = tok.encode("<|im_start|>user\nHello<|im_end|>").ids
    assert chat[0] == index["<|im_start|>"] and chat[-1] == index["<|im_end|>"]


@pytest.mark.parametrize("n_vocab", [259, 260, 300, 5000])
def test_small_and_odd_vocab_sizes(out_dir, n_vocab):
    path = synth(out_dir, "tiny-llama", "--layers", "1", "--vocab", str(n_vocab))
    r = gguf.GGUFReader(str(path))
    tokens = list(field(r, "tokenizer.ggml.tokens"))
    assert len(tokens) == len(set(tokens)) == n_vocab
    assert {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}["token_embd.weight"] == (256, n_vocab)
    index = {t: i for i, t in enumerate(tokens)}
    for m in field(r, "tokenizer.ggml.merges"):
        left, right = m.split(" ")
        assert left in index and right in index and left + right in index


def test_list_and_dry_run():
    out = run("--list").stdout
    for shape in SHAPES:
        assert shape in out
    dry = run("--shape", "tiny-moe", "--dry-run").stdout
    assert "blk.3.ffn_down_exps.weight" in dry and "[128, 256, 8]" in dry


def test_header_only(tmp_path):
    """--header-only: the same header as the full file (the gguf package reads every tensor's
    name, shape and offset alike), the file its full size, the data a hole of zeros."""
    full = synth(tmp_path, "tiny-moe", name="full.gguf")
    head = synth(tmp_path, "tiny-moe", "--header-only", name="head.gguf")
    assert head.stat().st_size == full.stat().st_size
    assert head.stat().st_blocks * 512 < full.stat().st_size // 4  # a hole takes no space
    a, b = gguf.GGUFReader(str(full)), gguf.GGUFReader(str(head))
    assert [(t.name, list(t.shape), t.data_offset) for t in a.tensors] == \
        [(t.name, list(t.shape), t.data_offset) for t in b.tensors]
    data_start = min(t.data_offset for t in b.tensors)
    assert full.read_bytes()[:data_start] == head.read_bytes()[:data_start]
    assert not any(b.tensors[-1].data.tobytes())


@pytest.mark.parametrize("args,message", [
    (["--shape", "nope", "-o", "x.gguf"], "unknown shape"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--bogus"], "unknown option"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--type", "Q9_9"], "unknown or unsupported type"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--type", "IQ2_XXS"], "unknown or unsupported type"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--layers", "0"], "not a number in range"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--layers", "abc"], "not a number in range"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--threads", "-3"], "not a number in range"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--vocab", "10"], "not a number in range"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--seed", "x1"], "not a non-negative integer"),
    (["--shape", "tiny-llama", "-o", "x.gguf", "--expert-type", "Q4_0"], "has no experts"),
    (["--shape", "tiny-llama", "-o"], "needs a value"),
    (["--shape", "tiny-llama"], "-o PATH is required"),
    (["-o", "x.gguf"], "--shape is required"),
    (["--shape", "tiny-llama", "-o", "/nonexistent-dir/x.gguf"], "cannot create"),
])
def test_bad_options(tmp_path, args, message):
    proc = run(*args, check=False, cwd=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "x.gguf")
