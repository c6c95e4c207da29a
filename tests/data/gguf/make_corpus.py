#!/usr/bin/env python3
"""Writes the GGUF test corpus: valid files covering every metadata type, v2/v3, split models
and a custom alignment, and malformed files each with the error text the reader must give.
The files are committed; rerun this script to regenerate them (it is deterministic)."""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
              U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(vtype, v):
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        etype, items = v
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(value(etype, x) for x in items)
    return struct.pack(SCALAR_FMT[vtype], v)


def kv(key, vtype, v):
    return gstr(key) + struct.pack("<I", vtype) + value(vtype, v)


def tensor_info(name, dims, ttype, offset):
    return gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ttype, offset)


def build(kvs, tensors, version=3, alignment=32, data=None, n_kv=None, n_tensors=None, magic=b"GGUF"):
    """tensors: list of (name, dims, type, offset, nbytes). data: bytes of the data section."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = b"".join(kv(*k) for k in kvs) + b"".join(tensor_info(n, d, t, o) for n, d, t, o, _ in tensors)
    out = head + body
    pad = (-len(out)) % alignment
    out += b"\0" * pad
    if data is None:
        size = max([o + nb for _, _, _, o, nb in tensors] + [0])
        data = bytes((i * 7 + 3) & 0xFF for i in range(size))
    return out + data


def f32_tensor(name, n, offset):
    return (name, [n], 0, offset, 4 * n)


BASE_KVS = [("general.architecture", STR, "llama"), ("general.name", STR, "corpus")]
BASE_TENSORS = [f32_tensor("a.weight", 8, 0), ("b.weight", [32, 2], 2, 32, 36)]  # F32 then Q4_0


def all_types_kvs():
    return BASE_KVS + [
        ("t.u8", U8, 200), ("t.i8", I8, -100), ("t.u16", U16, 60000), ("t.i16", I16, -30000),
        ("t.u32", U32, 4000000000), ("t.i32", I32, -2000000000), ("t.f32", F32, 1.5), ("t.bool", BOOL, 1),
        ("t.str", STR, "héllo wörld"), ("t.u64", U64, 2**63 + 5), ("t.i64", I64, -2**62), ("t.f64", F64, 2.25),
        ("t.arr_i32", ARR, (I32, [1, -2, 3])), ("t.arr_f32", ARR, (F32, [0.5, 1.5])),
        ("t.arr_str", ARR, (STR, ["a", "", "ccc"])), ("t.arr_bool", ARR, (BOOL, [1, 0])),
        ("t.arr_empty", ARR, (U8, [])), ("t.arr_u64", ARR, (U64, [2**40])),
    ]


def valid_files():
    files = {
        "valid_v3_all_types.gguf": build(all_types_kvs(), BASE_TENSORS),
        "valid_v2.gguf": build(BASE_KVS, BASE_TENSORS, version=2),
        "valid_align64.gguf": build(BASE_KVS + [("general.alignment", U32, 64)],
                                    [f32_tensor("a.weight", 8, 0), f32_tensor("b.weight", 4, 64)], alignment=64),
        "valid_no_tensors.gguf": build(BASE_KVS, []),
    }
    for part in range(3):
        kvs = (BASE_KVS if part == 0 else []) + [("split.no", U16, part), ("split.count", U16, 3)]
        files["valid_split-%05d-of-00003.gguf" % (part + 1)] = build(kvs, [f32_tensor("p%d.weight" % part, 4, 0)])
    return files


def malformed_files():
    """name -> (bytes, expected error text)."""
    good = build(BASE_KVS, BASE_TENSORS)
    big = 2**62
    cases = {
        "bad_magic": (b"GGUX" + good[4:], "bad magic"),
        "empty": (b"", "empty"),
        "version1": (build(BASE_KVS, BASE_TENSORS, version=1), "version 1"),
        "version99": (build(BASE_KVS, BASE_TENSORS, version=99), "unknown GGUF version 99"),
        "truncated_header": (good[:12], "truncated"),
        "truncated_kv": (good[:40], "truncated"),
        "truncated_data": (good[:-10], "outside the file"),
        "huge_kv_count": (build(BASE_KVS, BASE_TENSORS, n_kv=big), "metadata count"),
        "huge_tensor_count": (build(BASE_KVS, BASE_TENSORS, n_tensors=2**64 - 1), "tensor count"),
        "kv_count_too_high": (build(BASE_KVS, [], n_kv=5), "metadata key"),
        "huge_key": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**63) + b"\0" * 64, "bytes long"),
        "huge_string": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("k") + struct.pack("<IQ", STR, 2**63) + b"\0" * 64,
                        "truncated"),
        "huge_array": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("k") + struct.pack("<IIQ", ARR, U64, 2**61) + b"\0" * 64,
                       "truncated"),
        "huge_string_array": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("k") + struct.pack("<IIQ", ARR, STR, 2**60) +
                              b"\0" * 64, "truncated"),
        "unknown_value_type": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("k") + struct.pack("<I", 99) + b"\0" * 16,
                               "unknown value type 99"),
        "unknown_array_type": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("k") + struct.pack("<IIQ", ARR, 77, 1) +
                               b"\0" * 16, "unknown value type 77"),
        "nested_array": (build(BASE_KVS + [("k", ARR, (ARR, []))], []), "array of arrays"),
        "bad_bool": (build(BASE_KVS + [("k", BOOL, 2)], []), "bool"),
        "empty_key": (build(BASE_KVS + [("", U32, 1)], []), "empty metadata key"),
        "duplicate_key": (build(BASE_KVS + [("general.name", STR, "again")], []), "appears more than once"),
        "duplicate_tensor": (build(BASE_KVS, [f32_tensor("a.weight", 8, 0), f32_tensor("a.weight", 8, 32)]),
                             "appears more than once"),
        "unknown_tensor_type": (build(BASE_KVS, [("a.weight", [8], 4, 0, 32)]), "unknown type id 4"),
        "unknown_tensor_type_big": (build(BASE_KVS, [("a.weight", [8], 1000, 0, 32)]), "unknown type id 1000"),
        "misaligned_offset": (build(BASE_KVS, [f32_tensor("a.weight", 8, 4)]), "not a multiple of the alignment"),
        "offset_out_of_bounds": (build(BASE_KVS, [f32_tensor("a.weight", 8, 0)], data=b"\0" * 32)[:-32] +
                                 b"\0" * 8, "outside the file"),
        "offset_huge": (build(BASE_KVS, [("a.weight", [8], 0, 2**64 - 32, 0)], data=b"\0" * 32), "outside the file"),
        "zero_dims": (build(BASE_KVS, [("a.weight", [], 0, 0, 0)], data=b"\0" * 32), "dimensions"),
        "five_dims": (build(BASE_KVS, [("a.weight", [1, 1, 1, 1, 1], 0, 0, 4)]), "dimensions"),
        "zero_dim": (build(BASE_KVS, [("a.weight", [8, 0], 0, 0, 0)], data=b"\0" * 32), "absurd dimension"),
        "absurd_dim": (build(BASE_KVS, [("a.weight", [2**62], 0, 0, 0)], data=b"\0" * 32), "absurd dimension"),
        "elem_overflow": (build(BASE_KVS, [("a.weight", [2**30, 2**30, 2**30], 0, 0, 0)], data=b"\0" * 32),
                          "too many elements"),
        "bad_block_row": (build(BASE_KVS, [("a.weight", [33], 2, 0, 18)]), "not a multiple of its block size"),
        "alignment_zero": (build(BASE_KVS + [("general.alignment", U32, 0)], []), "general.alignment"),
        "alignment_three": (build(BASE_KVS + [("general.alignment", U32, 3)], []), "general.alignment"),
        "alignment_four": (build(BASE_KVS + [("general.alignment", U32, 4)], [], alignment=4), "general.alignment"),
        "alignment_wrong_type": (build(BASE_KVS + [("general.alignment", STR, "32")], []), "general.alignment"),
        "empty_tensor_name": (build(BASE_KVS, [f32_tensor("", 8, 0)]), "empty name"),
        "missing_part-00001-of-00002.gguf": (build(BASE_KVS + [("split.count", U16, 2)], []),
                                             "missing_part-00002-of-00002.gguf: cannot open"),
        "split_count_mismatch-00001-of-00001.gguf": (build(BASE_KVS + [("split.count", U16, 4)], []), "split.count"),
    }
    return cases


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    for name, data in valid_files().items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    lines = []
    for name, (data, expect) in sorted(malformed_files().items()):
        fname = name if name.endswith(".gguf") else "bad_" + name + ".gguf"
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(data)
        lines.append("%s\t%s\n" % (fname, expect))
    with open(os.path.join(out_dir, "malformed.tsv"), "w") as f:
        f.write("# file\terror text the reader must report (the message must also name the file)\n")
        f.writelines(lines)


if __name__ == "__main__":
    main()
