"""The quant module against the gguf package (gguf-py), which no one here wrote: reference
dequantizers bit for bit on random and edge-case blocks, quantizers byte for byte where gguf-py
implements the same reference algorithm (else by reconstruction error), and dot products
against numpy on the dequantized values."""
import ctypes
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

LIB_PATH = Path(os.environ.get("PSHARD_BUILD_DIR", Path(__file__).resolve().parents[2] / "build")) / "libpshard.so"

# type -> (name of the C kernels, byte offsets of f16 scale fields inside a block)
TYPES = {
    T.F32: ("f32", []),
    T.F16: ("f16", None),  # every element is a half
    T.BF16: ("bf16", None),
    T.Q4_0: ("q4_0", [0]),
    T.Q4_1: ("q4_1", [0, 2]),
    T.Q5_0: ("q5_0", [0]),
    T.Q5_1: ("q5_1", [0, 2]),
    T.Q8_0: ("q8_0", [0]),
    T.Q2_K: ("q2_K", [80, 82]),
    T.Q3_K: ("q3_K", [108]),
    T.Q4_K: ("q4_K", [0, 2]),
    T.Q5_K: ("q5_K", [0, 2]),
    T.Q6_K: ("q6_K", [208]),
}
QUANTIZED = [t for t in TYPES if t not in (T.F32, T.F16, T.BF16)]
IMPL_REF, IMPL_AVX2, IMPL_AVX512 = 0, 1, 2

DequantFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
ActFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
DotFn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


class Kernels(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("act_type", ctypes.c_int),
        ("impl", ctypes.c_int),
        ("block_elems", ctypes.c_uint32),
        ("dequant_row", DequantFn),
        ("quantize_act", ActFn),
        ("vec_dot", DotFn),
    ]


@pytest.fixture(scope="module")
def lib():
    if not LIB_PATH.exists():
        pytest.fail(f"{LIB_PATH} not built (set PSHARD_BUILD_DIR)")
    lib = ctypes.CDLL(str(LIB_PATH))
    lib.quant_kernels_variant.restype = ctypes.POINTER(Kernels)
    lib.quant_kernels_variant.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.quant_act_row_bytes.restype = ctypes.c_size_t
    lib.quant_act_row_bytes.argtypes = [ctypes.POINTER(Kernels), ctypes.c_int64]
    lib.quant_quantize_row.restype = ctypes.c_int
    lib.quant_quantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.quant_dequantize_row.restype = ctypes.c_int
    lib.quant_dequantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def n_elems(qtype, raw: np.ndarray) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    assert raw.size % size == 0
    return raw.size // size * block


def c_dequant(lib, qtype, raw: np.ndarray) -> np.ndarray:
    name = TYPES[qtype][0]
    n = n_elems(qtype, raw)
    out = np.full(n, np.nan, dtype=np.float32)
    getattr(lib, f"quant_dequant_{name}_ref")(ctypes.c_void_p(ptr(raw)), ctypes.c_void_p(ptr(out)), ctypes.c_int64(n))
    # the checked entry point must agree with the named kernel
    out2 = np.full(n, np.nan, dtype=np.float32)
    assert lib.quant_dequantize_row(int(qtype), ptr(raw), ptr(out2), n) == 0
    assert same_bits(out, out2)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as floats, including the sign of zero; nan equals nan."""
    a = a.astype(np.float32)
    b = b.astype(np.float32)
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(both_nan | (a.view(np.uint32) == b.view(np.uint32))))


# ---- building blocks

def finite_halves(rng, count, lo_exp=-24, hi_exp=15) -> np.ndarray:
    """Random finite f16 values across the whole exponent range, both signs."""
    bits = rng.integers(0, 0x7C00, size=count, dtype=np.uint16)  # below the inf/nan exponent
    bits |= (rng.integers(0, 2, size=count, dtype=np.uint16) << 15).astype(np.uint16)
    return bits.view(np.float16)


def random_blocks(rng, qtype, n_blocks) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return rng.standard_normal(n_blocks * block).astype(np.float32).view(np.uint8)
    if qtype == T.F16:
        return finite_halves(rng, n_blocks * block).view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 0x10000, size=n_blocks * block, dtype=np.uint32)
        bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0xBFFF, bits).astype(np.uint16)  # finite
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in TYPES[qtype][1]:
        raw[:, off:off + 2] = finite_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


EDGE_SCALES = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 6.103515625e-05,  # min normal
                        5.960464477539063e-08, -5.960464477539063e-08,  # smallest subnormal
                        3.0517578125e-05, 0.000978, 1e-3, 0.5, 1234.0], dtype=np.float16)


def edge_blocks(qtype) -> np.ndarray:
    """Blocks with every quant byte at its minimum or maximum (and patterns between), paired
    with extreme, subnormal, zero and negative scales; plus all-zero blocks."""
    block, size = GGML_QUANT_SIZES[qtype]
    offs = TYPES[qtype][1]
    fills = [0x00, 0xFF, 0x55, 0xAA, 0x0F, 0xF0, 0x80, 0x7F]
    out = [np.zeros(size, dtype=np.uint8)]
    for fill in fills:
        for i, s in enumerate(EDGE_SCALES):
            b = np.full(size, fill, dtype=np.uint8)
            for k, off in enumerate(offs):
                # pair scales differently for d and m so both extremes meet
                val = EDGE_SCALES[(i + 5 * k) % len(EDGE_SCALES)]
                b[off:off + 2] = np.array([val], dtype=np.float16).view(np.uint8)
            out.append(b)
    return np.concatenate(out)


def float_edge_values(qtype) -> np.ndarray:
    if qtype == T.F32:
        v = np.array([0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38, 1e-45, -1e-45, 1.17549435e-38], dtype=np.float32)
        return v.view(np.uint8)
    if qtype == T.F16:
        bits = np.array([0, 0x8000, 1, 0x8001, 0x3FF, 0x400, 0x7BFF, 0xFBFF, 0x3C00, 0x7C00, 0xFC00], dtype=np.uint16)
        return bits.view(np.uint8)
    bits = np.array([0, 0x8000, 1, 0x8001, 0x7F, 0x80, 0x7F7F, 0xFF7F, 0x3F80, 0x7F80, 0xFF80], dtype=np.uint16)
    return bits.view(np.uint8)


# ---- dequantization

@pytest.mark.parametrize("qtype", list(TYPES), ids=lambda t: t.name)
def test_dequant_random_matches_gguf(lib, qtype):
    rng = np.random.default_rng(1000 + int(qtype))
    raw = random_blocks(rng, qtype, 257)
    ours = c_dequant(lib, qtype, raw)
    theirs = quants.dequantize(raw, qtype).reshape(-1)
    assert same_bits(ours, theirs), f"{qtype.name}: {np.flatnonzero(ours != theirs)[:10]}"
    # the SIMD variants' dequantizers (where this CPU has them) give the same bits
    for impl in (IMPL_AVX2, IMPL_AVX512):
        k = lib.quant_kernels_variant(int(qtype), impl)
        if k:
            out = np.full(ours.size, np.nan, dtype=np.float32)
            k.contents.dequant_row(ptr(raw), ptr(out), ours.size)
            assert same_bits(out, theirs), f"{qtype.name} impl {impl}"


@pytest.mark.parametrize("qtype", list(TYPES), ids=lambda t: t.name)
def test_dequant_edge_blocks_match_gguf(lib, qtype):
    raw = float_edge_values(qtype) if qtype in (T.F32, T.F16, T.BF16) else edge_blocks(qtype)
    ours = c_dequant(lib, qtype, raw)
    theirs = quants.dequantize(raw, qtype).reshape(-1)
    assert same_bits(ours, theirs)
    for impl in (IMPL_AVX2, IMPL_AVX512):
        k = lib.quant_kernels_variant(int(qtype), impl)
        if k:
            out = np.full(ours.size, np.nan, dtype=np.float32)
            k.contents.dequant_row(ptr(raw), ptr(out), ours.size)
            assert same_bits(out, theirs), f"{qtype.name} impl {impl}"


# ---- quantizers

def c_quantize(lib, qtype, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    block, size = GGML_QUANT_SIZES[qtype]
    out = np.zeros(x.size // block * size, dtype=np.uint8)
    status = lib.quant_quantize_row(int(qtype), ptr(x), ptr(out), x.size)
    assert status == 0, f"quantize {qtype.name}: status {status}"
    return out


def quantizer_inputs(rng) -> list[np.ndarray]:
    """Rows of 512: Gaussian at several scales, heavy tails, zeros, constants, exact ties for
    the rounding rules, tiny values with subnormal f16 scales, huge values near the f16 range."""
    g = rng.standard_normal(512).astype(np.float32)
    rows = [g, g * 1e-3, g * 300.0, (rng.standard_t(2, 512)).astype(np.float32),
            np.zeros(512, np.float32), np.full(512, 0.37, np.float32), np.full(512, -2.0, np.float32),
            (np.arange(512) % 17 - 8).astype(np.float32),  # integers: codes land on ties
            (np.arange(512) % 33 - 16).astype(np.float32) * 0.5,
            g * 1e-6, g * 3000.0]
    spiky = g.copy()
    spiky[::37] *= 50
    rows.append(spiky)
    return rows


EXACT_QUANTIZERS = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


@pytest.mark.parametrize("qtype", EXACT_QUANTIZERS, ids=lambda t: t.name)
def test_quantize_matches_gguf_bytes(lib, qtype):
    """These quantizers follow the same reference rule as gguf-py: the bytes must agree."""
    rng = np.random.default_rng(7 + int(qtype))
    for i, x in enumerate(quantizer_inputs(rng)):
        ours = c_quantize(lib, qtype, x)
        theirs = quants.quantize(x.reshape(1, -1), qtype).view(np.uint8).reshape(-1)
        diff = np.flatnonzero(ours != theirs)
        assert diff.size == 0, f"{qtype.name} input {i}: first differing bytes at {diff[:8]}"


def rel_rmse(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2) / np.mean(x.astype(np.float64) ** 2)))


@pytest.mark.parametrize("qtype,baseline,factor,floor", [(T.Q4_K, T.Q4_1, 1.0, 2e-3), (T.Q6_K, T.Q5_1, 0.6, 1e-3)],
                         ids=["Q4_K", "Q6_K"])
def test_k_quantizers_error(lib, qtype, baseline, factor, floor):
    """gguf-py has no K quantizers: ours must round-trip through gguf-py's dequantizer with
    error no worse than gguf-py's own quantizer of a comparable (more bits per weight) legacy
    format: Q4_K (4.5 bpw) vs Q4_1 (5 bpw), Q6_K (6.56 bpw) vs 0.6 x Q5_1 (6 bpw). Rows the
    legacy formats store exactly (constants: Q4_1's offset is the value) only need to be
    within the rounding of the K formats' two-level f16/6-bit scales (`floor`)."""
    rng = np.random.default_rng(99)
    for i, x in enumerate(quantizer_inputs(rng)):
        ours = c_quantize(lib, qtype, x)
        back = quants.dequantize(ours, qtype).reshape(-1)
        assert np.all(np.isfinite(back))
        if not np.any(x):
            assert np.all(back == 0)
            continue
        base = quants.dequantize(quants.quantize(x.reshape(1, -1), baseline), baseline).reshape(-1)
        e_ours, e_base = rel_rmse(x, back), rel_rmse(x, base)
        assert e_ours <= max(factor * e_base, floor), f"{qtype.name} input {i}: {e_ours:.5f} vs {baseline.name} {e_base:.5f}"
        print(f"{qtype.name} input {i}: rel rmse {e_ours:.5f}, gguf-py {baseline.name} {e_base:.5f}")


# ---- activation quantizers: llama.cpp's run-time rule, restated in numpy

def np_act_q8_0(x: np.ndarray, with_sum: bool) -> np.ndarray:
    """Per 32: d = amax / 127, codes = round-half-even(x * (127 / amax)) (the x86 CPU backend's
    rule); Q8_1 adds s = d * sum(codes), both scales as f16."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * iscale).astype(np.int8)
    d = (amax / np.float32(127)).astype(np.float32)
    parts = [d.astype(np.float16).view(np.uint8)]
    if with_sum:
        s = (d * q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32)).astype(np.float32)
        parts.append(s.astype(np.float16).view(np.uint8))
    parts.append(q.view(np.uint8))
    return np.concatenate(parts, axis=1).reshape(-1)


def np_act_q8_K(x: np.ndarray) -> np.ndarray:
    """Per 256: the first element of largest magnitude maps to -127, codes round half to even
    and clip at 127; d = 1 / iscale as f32; bsums = sums of each 16 codes."""
    out = []
    for blk in x.reshape(-1, 256).astype(np.float32):
        j = int(np.argmax(np.abs(blk)))
        if blk[j] == 0:
            out.append(np.zeros(292, np.uint8))
            continue
        iscale = np.float32(-127) / blk[j]
        q = np.minimum(np.rint(blk * iscale), 127).astype(np.int8)
        d = np.array([np.float32(1) / iscale], np.float32)
        bsums = q.reshape(16, 16).astype(np.int16).sum(axis=1).astype(np.int16)
        out.append(np.concatenate([d.view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]))
    return np.concatenate(out)


@pytest.mark.parametrize("name,model", [("q8_0", lambda x: np_act_q8_0(x, False)),
                                        ("q8_1", lambda x: np_act_q8_0(x, True)),
                                        ("q8_K", np_act_q8_K)])
def test_activation_quantizers(lib, name, model):
    rng = np.random.default_rng(5)
    for x in quantizer_inputs(rng):
        x = np.ascontiguousarray(x, np.float32)
        expected = model(x)
        ours = np.zeros_like(expected)
        getattr(lib, f"quant_act_{name}_ref")(ctypes.c_void_p(ptr(x)), ctypes.c_void_p(ptr(ours)), ctypes.c_int64(x.size))
        assert np.array_equal(ours, expected), f"{name}: bytes differ at {np.flatnonzero(ours != expected)[:8]}"


# ---- dot products against numpy on the dequantized rows

def act_to_float(act_type: int, raw: np.ndarray, n: int) -> np.ndarray:
    if act_type in (int(T.F32), int(T.F16), int(T.BF16)):
        return quants.dequantize(raw, T(act_type)).reshape(-1).astype(np.float64)
    if act_type == int(T.Q8_0):
        return quants.dequantize(raw, T.Q8_0).reshape(-1).astype(np.float64)
    if act_type == int(T.Q8_1):
        b = raw.reshape(-1, 36)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        return (d * b[:, 4:].view(np.int8)).reshape(-1)
    assert act_type == int(T.Q8_K)
    b = raw.reshape(-1, 292)
    d = b[:, 0:4].copy().view(np.float32).astype(np.float64)
    return (d * b[:, 4:260].view(np.int8)).reshape(-1)


def q8_1_slack(qtype, w_raw: np.ndarray, act_raw: np.ndarray) -> float:
    """Q8_1 keeps s = d * sum(q) as its own f16: m * s differs from m * d * sum(q) by f16
    rounding (relative 2^-11 each, absolute 2^-25 for subnormal halves)."""
    if qtype not in (T.Q4_1, T.Q5_1):
        return 0.0
    size = GGML_QUANT_SIZES[qtype][1]
    m = np.abs(w_raw.reshape(-1, size)[:, 2:4].copy().view(np.float16).astype(np.float64)).reshape(-1)
    a = act_raw.reshape(-1, 36)
    s = np.abs(a[:, 2:4].copy().view(np.float16).astype(np.float64)).reshape(-1)
    qsum = np.abs(a[:, 4:].view(np.int8).astype(np.int64).sum(axis=1))
    return float(np.sum(m * (s * 2.0 ** -10 + (qsum + 1) * 2.0 ** -24)))


@pytest.mark.parametrize("qtype", list(TYPES), ids=lambda t: t.name)
def test_vec_dot_matches_numpy(lib, qtype):
    rng = np.random.default_rng(2024 + int(qtype))
    block = GGML_QUANT_SIZES[qtype][0]
    ran = 0
    for n_blocks in (1, 7, 16, 43):
        n = n_blocks * max(block, 32) if block > 1 else n_blocks * 37 + 3
        n -= n % block
        if qtype in (T.F32, T.F16, T.BF16):  # random bits would overflow the sums
            raw = quants.quantize(rng.standard_normal(n).astype(np.float32), qtype).view(np.uint8).reshape(-1)
        else:
            raw = random_blocks(rng, qtype, n // block)
        if TYPES[qtype][1]:  # keep scales modest so the sums are well conditioned
            size = GGML_QUANT_SIZES[qtype][1]
            blocks = raw.reshape(-1, size)
            for off in TYPES[qtype][1]:
                blocks[:, off:off + 2] = (rng.uniform(-0.05, 0.05, (blocks.shape[0], 1))
                                          .astype(np.float16).view(np.uint8))
        w = quants.dequantize(raw, qtype).reshape(-1).astype(np.float64)
        x = rng.standard_normal(n).astype(np.float32)
        for impl in (IMPL_REF, IMPL_AVX2, IMPL_AVX512):
            k = lib.quant_kernels_variant(int(qtype), impl)
            if not k:
                assert impl != IMPL_REF
                continue
            k = k.contents
            act = np.zeros(lib.quant_act_row_bytes(ctypes.byref(k), n), np.uint8)
            k.quantize_act(ptr(x), ptr(act), n)
            a = act_to_float(k.act_type, act, n)
            expected = float(np.dot(w, a))
            magnitude = float(np.sum(np.abs(w * a)))
            got = k.vec_dot(n, ptr(raw), ptr(act))
            tol = 2e-5 * magnitude + q8_1_slack(qtype, raw, act) + 1e-30
            assert abs(got - expected) <= tol, f"{qtype.name} impl {impl} n={n}: {got} vs {expected} (tol {tol})"
            ran += 1
    assert ran >= 4
