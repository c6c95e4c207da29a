"""pshard's tokenizer against tokenizers no one here wrote.

Byte-level BPE: the default model's vocabulary and merges, read from its GGUF with the `gguf`
package, are loaded into HF `tokenizers` with SmolLM2's pre-tokenizer (from its tokenizer.json:
Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false, use_regex=true)]);
pshard reads the same GGUF through src/gguf. Every text under tests/data/tok, whole and line by
line, with and without special-token parsing, must give the same ids.

SentencePiece: a small BPE model with byte fallback is trained on the same texts with the
`sentencepiece` package; its pieces, scores and types go to pshard through tok_create, and
pshard must encode and decode as sentencepiece does.

Needs: gguf, tokenizers, sentencepiece (PyPI) and libpshard.so in PSHARD_BUILD_DIR."""
import ctypes
import glob
import os

import pytest

from conftest import BUILD, ROOT

TEXT_DIR = os.path.join(ROOT, "tests", "data", "tok")
ADD_SPECIAL, PARSE_SPECIAL = 1, 2
DECODE_SPECIAL, DECODE_STRIP_SPACE = 1, 2
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_BYTE = 1, 2, 3, 6


class VocabDesc(ctypes.Structure):
    """struct tok_vocab_desc (src/tok/tok.h)."""
    _fields_ = [("kind", ctypes.c_int), ("n_tokens", ctypes.c_uint32),
                ("tokens", ctypes.POINTER(ctypes.c_char_p)), ("token_lens", ctypes.POINTER(ctypes.c_uint32)),
                ("scores", ctypes.POINTER(ctypes.c_float)), ("token_types", ctypes.POINTER(ctypes.c_int32)),
                ("n_merges", ctypes.c_uint32), ("merges", ctypes.POINTER(ctypes.c_char_p)),
                ("merge_lens", ctypes.POINTER(ctypes.c_uint32)), ("pre", ctypes.c_char_p),
                ("bos_id", ctypes.c_int32), ("eos_id", ctypes.c_int32), ("eot_id", ctypes.c_int32),
                ("eom_id", ctypes.c_int32), ("unk_id", ctypes.c_int32), ("pad_id", ctypes.c_int32),
                ("add_bos", ctypes.c_bool), ("add_eos", ctypes.c_bool), ("add_space_prefix", ctypes.c_bool)]


class Lib:
    """The tokenizer's C entry points in libpshard.so."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        lib.pshard_last_error.restype = ctypes.c_char_p
        lib.tok_load_gguf_path.argtypes = [ctypes.c_char_p, ctypes.POINTER(vp)]
        lib.tok_create.argtypes = [ctypes.POINTER(VocabDesc), ctypes.POINTER(vp)]
        lib.tok_free.argtypes = [vp]
        lib.tok_encode_into.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_int, ctypes.POINTER(ctypes.c_int32), sz,
                                        ctypes.POINTER(sz)]
        lib.tok_decode_into.argtypes = [vp, ctypes.POINTER(ctypes.c_int32), sz, ctypes.c_int, ctypes.c_char_p, sz,
                                        ctypes.POINTER(sz)]
        lib.tok_decoder_create.argtypes = [vp, ctypes.c_int, ctypes.POINTER(vp)]
        lib.tok_decoder_free.argtypes = [vp]
        lib.tok_decoder_push.argtypes = [vp, ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(sz)]
        lib.tok_decoder_flush.argtypes = [vp, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(sz)]
        for name in ("tok_bos", "tok_eos", "tok_eot", "tok_unk", "tok_pad"):
            getattr(lib, name).argtypes = [vp]
            getattr(lib, name).restype = ctypes.c_int32
        for name in ("tok_add_bos", "tok_add_eos"):
            getattr(lib, name).argtypes = [vp]
            getattr(lib, name).restype = ctypes.c_bool
        lib.tok_n_tokens.argtypes = [vp]
        lib.tok_n_tokens.restype = ctypes.c_uint32
        lib.tok_pre_name.argtypes = [vp]
        lib.tok_pre_name.restype = ctypes.c_char_p
        self.lib = lib

    def check(self, status, what):
        assert status == 0, "%s failed (%d): %s" % (what, status, self.lib.pshard_last_error().decode())


class Tok:
    def __init__(self, lib, handle):
        self.lib, self.c, self.h = lib, lib.lib, handle

    def encode(self, text, flags=0):
        data = text.encode("utf-8") if isinstance(text, str) else text
        cap = len(data) + 8  # never more than a token per byte, plus BOS/EOS
        out, n = (ctypes.c_int32 * cap)(), ctypes.c_size_t()
        self.lib.check(self.c.tok_encode_into(self.h, data, len(data), flags, out, cap, ctypes.byref(n)), "encode")
        return list(out[:n.value])

    def decode(self, ids, flags=0):
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        cap = 8 * len(ids) + 16
        buf, n = ctypes.create_string_buffer(cap), ctypes.c_size_t()
        self.lib.check(self.c.tok_decode_into(self.h, arr, len(ids), flags, buf, cap, ctypes.byref(n)), "decode")
        return buf.raw[:n.value]

    def stream(self, ids, flags=0):
        """The chunks a streaming decoder emits, one per token, then the flush."""
        dec = ctypes.c_void_p()
        self.lib.check(self.c.tok_decoder_create(self.h, flags, ctypes.byref(dec)), "decoder_create")
        text, n, chunks = ctypes.c_char_p(), ctypes.c_size_t(), []
        try:
            for i in ids:
                self.lib.check(self.c.tok_decoder_push(dec, i, ctypes.byref(text), ctypes.byref(n)), "push")
                chunks.append(ctypes.string_at(text, n.value))
            self.lib.check(self.c.tok_decoder_flush(dec, ctypes.byref(text), ctypes.byref(n)), "flush")
            chunks.append(ctypes.string_at(text, n.value))
        finally:
            self.c.tok_decoder_free(dec)
        return chunks


@pytest.fixture(scope="session")
def lib():
    path = os.path.join(BUILD, "libpshard.so")
    assert os.path.exists(path), "build libpshard.so first (PSHARD_BUILD_DIR=%s)" % BUILD
    return Lib(path)


def texts():
    """(name, text) for every file under tests/data/tok, whole and each line."""
    files = sorted(glob.glob(os.path.join(TEXT_DIR, "*.txt")))
    assert len(files) >= 9, "the tokenizer text set is missing"
    cases = []
    for f in files:
        with open(f, encoding="utf-8", newline="") as fh:
            text = fh.read()
        name = os.path.basename(f)
        cases.append((name, text))
        cases += [("%s:%d" % (name, i + 1), line) for i, line in enumerate(text.split("\n")) if line]
    return cases


TEXTS = texts()

# ---- byte-level BPE: the default model against HF tokenizers


@pytest.fixture(scope="session")
def gguf_vocab(default_model):
    from gguf import GGUFReader
    reader = GGUFReader(default_model)
    fields = reader.fields
    return {
        "tokens": fields["tokenizer.ggml.tokens"].contents(),
        "types": fields["tokenizer.ggml.token_type"].contents(),
        "merges": fields["tokenizer.ggml.merges"].contents(),
        "pre": fields["tokenizer.ggml.pre"].contents(),
        "bos": fields["tokenizer.ggml.bos_token_id"].contents(),
        "eos": fields["tokenizer.ggml.eos_token_id"].contents(),
        "unk": fields["tokenizer.ggml.unknown_token_id"].contents(),
        "pad": fields["tokenizer.ggml.padding_token_id"].contents(),
        "add_bos": fields["tokenizer.ggml.add_bos_token"].contents(),
    }


@pytest.fixture(scope="session")
def hf(gguf_vocab):
    """(plain, with special tokens) HF tokenizers built from the GGUF's vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    assert gguf_vocab["pre"] == "smollm"
    vocab = {t: i for i, t in enumerate(gguf_vocab["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in gguf_vocab["merges"]]
    plain = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    plain.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    plain.decoder = decoders.ByteLevel()
    special = Tokenizer.from_str(plain.to_str())
    controls = [t for t, ty in zip(gguf_vocab["tokens"], gguf_vocab["types"]) if ty == TYPE_CONTROL]
    assert "<|im_start|>" in controls
    special.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
    return plain, special


@pytest.fixture(scope="session")
def model_tok(lib, default_model):
    handle = ctypes.c_void_p()
    lib.check(lib.lib.tok_load_gguf_path(default_model.encode(), ctypes.byref(handle)), "tok_load_gguf_path")
    yield Tok(lib, handle)
    lib.lib.tok_free(handle)


def test_metadata_matches_gguf(model_tok, gguf_vocab):
    c, h = model_tok.c, model_tok.h
    assert c.tok_n_tokens(h) == len(gguf_vocab["tokens"])
    assert c.tok_pre_name(h) == b"smollm"
    assert (c.tok_bos(h), c.tok_eos(h), c.tok_unk(h), c.tok_pad(h)) == (
        gguf_vocab["bos"], gguf_vocab["eos"], gguf_vocab["unk"], gguf_vocab["pad"])
    assert c.tok_eot(h) == -1  # the file has no tokenizer.ggml.eot_token_id
    assert c.tok_add_bos(h) is False and c.tok_add_bos(h) == gguf_vocab["add_bos"]
    assert c.tok_add_eos(h) is False
    # add_bos is off, so ADD_SPECIAL changes nothing for this model.
    assert model_tok.encode("Hello", ADD_SPECIAL) == model_tok.encode("Hello")


@pytest.mark.parametrize("name,text", TEXTS, ids=[n for n, _ in TEXTS])
def test_bpe_matches_hf(model_tok, hf, name, text):
    plain, special = hf
    assert model_tok.encode(text) == plain.encode(text, add_special_tokens=False).ids
    assert model_tok.encode(text, PARSE_SPECIAL) == special.encode(text, add_special_tokens=False).ids


def test_bpe_special_tokens_parsed(model_tok):
    ids = model_tok.encode("<|im_start|>user\nHi<|im_end|>", PARSE_SPECIAL)
    assert ids[0] == 1 and ids[-1] == 2  # <|im_start|>, <|im_end|>
    assert 1 not in model_tok.encode("<|im_start|>user")  # plain text without parse_special


@pytest.mark.parametrize("name,text", TEXTS, ids=[n for n, _ in TEXTS])
def test_bpe_decode_round_trip(model_tok, hf, name, text):
    ids = model_tok.encode(text, PARSE_SPECIAL)
    assert model_tok.decode(ids, DECODE_SPECIAL) == text.encode("utf-8")
    assert model_tok.decode(ids, DECODE_SPECIAL).decode("utf-8") == hf[1].decode(ids, skip_special_tokens=False)
    chunks = model_tok.stream(ids, DECODE_SPECIAL)
    for chunk in chunks:
        chunk.decode("utf-8")  # every chunk holds whole characters only
    assert b"".join(chunks) == text.encode("utf-8")


@pytest.mark.parametrize("raw", [b"abc\xff", b"\xe2\x82", b"caf\xc3", b"\xf0\x9f\x99 x", b"\xed\xa0\x80z",
                                 b"\xc0\xaf", b"ok \x80\x80 ok", bytes(range(256))])
def test_invalid_utf8_encodes_as_replacement(model_tok, hf, raw):
    """Invalid bytes are encoded as U+FFFD, as Python's errors="replace" decoding makes them."""
    fixed = raw.decode("utf-8", errors="replace")
    assert model_tok.encode(raw) == hf[0].encode(fixed, add_special_tokens=False).ids


# ---- SentencePiece: a model trained here against the sentencepiece package


@pytest.fixture(scope="session")
def spm(tmp_path_factory):
    import sentencepiece as sp
    folder = tmp_path_factory.mktemp("spm")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(t for _, t in TEXTS) * 3, encoding="utf-8")
    sp.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "m"), model_type="bpe", vocab_size=600,
        hard_vocab_limit=False, byte_fallback=True, character_coverage=0.98,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        split_digits=True, num_threads=1, minloglevel=2)
    return sp.SentencePieceProcessor(model_file=str(folder / "m.model"))


@pytest.fixture(scope="session")
def spm_tok(lib, spm):
    n = spm.get_piece_size()
    pieces = [spm.id_to_piece(i).encode("utf-8") for i in range(n)]
    types = [TYPE_UNKNOWN if spm.is_unknown(i) else TYPE_CONTROL if spm.is_control(i) else
             TYPE_BYTE if spm.is_byte(i) else 5 if spm.is_unused(i) else TYPE_NORMAL for i in range(n)]
    assert types.count(TYPE_BYTE) == 256
    keep = [(ctypes.c_char_p * n)(*pieces), (ctypes.c_float * n)(*[spm.get_score(i) for i in range(n)]),
            (ctypes.c_int32 * n)(*types)]
    desc = VocabDesc(kind=1, n_tokens=n, tokens=keep[0], scores=keep[1], token_types=keep[2],
                     bos_id=spm.bos_id(), eos_id=spm.eos_id(), eot_id=-1, eom_id=-1, unk_id=spm.unk_id(),
                     pad_id=-1, add_bos=True, add_eos=False, add_space_prefix=True)
    handle = ctypes.c_void_p()
    lib.check(lib.lib.tok_create(ctypes.byref(desc), ctypes.byref(handle)), "tok_create")
    yield Tok(lib, handle)
    lib.lib.tok_free(handle)


@pytest.mark.parametrize("name,text", TEXTS, ids=[n for n, _ in TEXTS])
def test_spm_matches_sentencepiece(spm_tok, spm, name, text):
    want = spm.encode(text)
    assert spm_tok.encode(text) == want
    assert spm_tok.encode(text, ADD_SPECIAL) == [spm.bos_id()] + want
    ids = spm_tok.encode(text, ADD_SPECIAL)
    assert spm_tok.decode(ids, DECODE_STRIP_SPACE).decode("utf-8") == spm.decode(want) == text


def test_spm_uses_byte_fallback(spm_tok, spm):
    text = "emoji 🪿 and ǅ"  # characters the trained model does not cover
    ids = spm_tok.encode(text)
    assert ids == spm.encode(text)
    assert any(spm.is_byte(i) for i in ids)
    chunks = spm_tok.stream(ids, DECODE_STRIP_SPACE)
    assert b"".join(chunks).decode("utf-8") == text
    assert b"" in chunks  # the goose's first bytes waited for the rest


def test_spm_space_prefix_after_control_token(spm_tok, spm):
    """Text after a control token gets its own "▁" prefix (llama.cpp and legacy HF Llama)."""
    eos = spm.id_to_piece(spm.eos_id())
    text = "Hello world" + eos + "again"
    want = spm.encode("Hello world") + [spm.eos_id()] + spm.encode("again")
    assert spm_tok.encode(text, PARSE_SPECIAL) == want
    assert spm.eos_id() not in spm_tok.encode(text)
