"""pshard's GGUF reader against the PyPI gguf package's reader, on the default model and on the
valid files of the test corpus: every metadata key with its type and value, every tensor."""
import glob
import os

import gguf
import numpy as np
import pytest

from conftest import ROOT, run_pshard

GTYPE = {gguf.GGUFValueType.UINT8: "uint8", gguf.GGUFValueType.INT8: "int8", gguf.GGUFValueType.UINT16: "uint16",
         gguf.GGUFValueType.INT16: "int16", gguf.GGUFValueType.UINT32: "uint32", gguf.GGUFValueType.INT32: "int32",
         gguf.GGUFValueType.FLOAT32: "float32", gguf.GGUFValueType.BOOL: "bool", gguf.GGUFValueType.STRING: "string",
         gguf.GGUFValueType.ARRAY: "array", gguf.GGUFValueType.UINT64: "uint64", gguf.GGUFValueType.INT64: "int64",
         gguf.GGUFValueType.FLOAT64: "float64"}


def section(lines, header):
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    out = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        out.append(line[2:])
    return out


def expected_value(field):
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        etype = gguf.GGUFValueType(int(field.parts[3][0]))  # also for empty arrays
        items = field.contents()
        text = "[%s; %d]" % (GTYPE[etype], len(items))
        for item in items[:4]:
            if etype == gguf.GGUFValueType.STRING:
                text += " " + escape(item, 40)
            elif etype in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
                text += " %s" % fmt_float(item)
            else:
                text += " %d" % int(item)
        return text
    value = field.contents()
    if vtype == gguf.GGUFValueType.STRING:
        return escape(value, 120)
    if vtype == gguf.GGUFValueType.BOOL:
        return "true" if value else "false"
    if vtype in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
        return fmt_float(value)
    return str(int(value))


def fmt_float(x):
    return "%.9g" % float(np.float32(x) if isinstance(x, np.float32) else x)


def escape(s, limit):
    """The C side prints string bytes as they are, escaping newline, quote, backslash and
    control bytes, and cuts at `limit` bytes (noting the full length)."""
    raw = s.encode("utf-8", "surrogateescape")
    out = bytearray()
    for c in raw[:limit]:
        if c == 10:
            out += b"\\n"
        elif c in (34, 92):
            out += b"\\" + bytes([c])
        elif c < 32:
            out += b"\\x%02x" % c
        else:
            out.append(c)
    text = '"%s"' % out.decode("utf-8", "replace")
    if len(raw) > limit:
        text += "...(%d bytes)" % len(raw)
    return text


def compare(path):
    proc = run_pshard("info", path, "--metadata", "--tensors", "--no-shards", check=False)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr
    reader = gguf.GGUFReader(path)
    meta = section(lines, "metadata")
    fields = [f for name, f in reader.fields.items() if not name.startswith("GGUF.")]
    assert len(meta) == len(fields)
    for line, field in zip(meta, fields):
        key, rest = line.split(": ", 1)
        vtype, value = rest.split(" = ", 1)
        assert key == field.name
        assert vtype == GTYPE[field.types[0]]
        expect = expected_value(field)
        assert value == expect, key
    tensors = section(lines, "tensor list")
    assert len(tensors) == len(reader.tensors)
    for line, t in zip(tensors, reader.tensors):
        name, ttype, rest = line.split(" ", 2)
        shape, offset, nbytes = rest.rsplit(" ", 2)
        assert name == t.name
        assert ttype == t.tensor_type.name
        assert shape == "[" + ", ".join(str(int(d)) for d in t.shape) + "]"
        assert int(nbytes) == t.n_bytes
        assert int(offset) + reader.data_offset == t.data_offset
    return proc


def test_default_model_matches_gguf_package(default_model):
    proc = compare(default_model)
    assert proc.returncode == 0
    assert "architecture  llama" in proc.stdout
    assert "layers        30" in proc.stdout


@pytest.mark.parametrize("name", ["valid_v3_all_types.gguf", "valid_v2.gguf", "valid_align64.gguf"])
def test_corpus_matches_gguf_package(name):
    compare(os.path.join(ROOT, "tests", "data", "gguf", name))


def test_malformed_files_fail_cleanly():
    listing = os.path.join(ROOT, "tests", "data", "gguf", "malformed.tsv")
    for line in open(listing):
        if line.startswith("#"):
            continue
        name, expect = line.rstrip("\n").split("\t")
        proc = run_pshard("info", os.path.join(ROOT, "tests", "data", "gguf", name), check=False)
        assert proc.returncode == 1, name
        assert expect in proc.stderr, (name, proc.stderr)
        assert "Sanitizer" not in proc.stderr and proc.stdout == ""
