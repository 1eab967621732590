"""Weights dequantized inside the compiled kernels, per format (layout: nextn.common.quant, the GGUF's own bytes;
element expressions: nextn.compiler.quant).

For every format: random blocks (random quant bytes, float16 scale fields set to ordinary, extreme,
subnormal and zero values, whole zero blocks, and gguf-py-quantized real data where gguf-py can quantize; for
F16 / BF16 random values incl. extremes) are packed as the loader packs them (a view of the bytes) and read by
the scheduled CPU kernels built from te_ops:
- get_rows and mul_mat against the identity (every weight passes through the vectorized GEMM kernel) must equal
  `gguf.quants.dequantize` bit for bit;
- mul_mat (T = 1, 3, 4 rows; N = 67, not a multiple of the 64-wide tile) and mul_mat_id (both activation forms)
  agree with a float64 numpy product on the dequantized weights within 1e-5 relative.
For the codebook formats (IQ2_*, IQ3_*, IQ1_*), MXFP4 and NVFP4, blocks built to use every table entry (codebook
index, sign pattern, sub-block scale, delta sign, MXFP4 exponent, NVFP4 ue4m3 scale byte) are read bit-exactly too. The types still refused are
listed in REFUSED and checked to be refused naming the tensor.
"""
from __future__ import annotations

import functools

import gguf
import numpy as np
import pytest
import tvm
from tvm import te, tirx

from nextn.common.compare import rel_err
from nextn.common.errors import NextnError
from nextn.common.quant import FORMATS, by_ggml_type
from nextn.compiler.lower import te_ops
from nextn.compiler.target import make_target
from nextn.schedules import schedule_pass

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "MXFP4", "NVFP4", "F16", "BF16"]
# Byte offsets of the float16 scale fields in one block (ggml/src/ggml-common.h); the rest of a block is random.
# IQ1_M spreads its float16 over the top nibbles of four words, MXFP4 has an 8-bit exponent and NVFP4 four ue4m3
# bytes: see set_scales.
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
              "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
              "IQ1_M": [], "MXFP4": [], "NVFP4": [], "F16": [], "BF16": []}
# Bytes a format adds to the GGUF's: per-tensor lookup tables (codebook grid, sign patterns; nothing is repacked).
TABLE_BYTES = {"IQ2_XXS": 256 * 8 + 128, "IQ2_XS": 512 * 8 + 128, "IQ2_S": 1024 * 8, "IQ3_XXS": 256 * 4 + 128,
               "IQ3_S": 512 * 4, "IQ1_S": 2048 * 8, "IQ1_M": 2048 * 8}
EXTREME = np.array([65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14, 0.0, -0.0, 1.0], np.float16)
N, K, X = 67, 512, 4
I64 = "int64"


def random_blocks(ttype: str, shape, rng) -> np.ndarray:
    """Random bytes uint8 [n_blocks, type_size] for a `ttype` tensor of logical `shape`, scales as set_scales'."""
    block, tsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]]
    b = rng.integers(0, 256, (int(np.prod(shape)) // block, tsize), dtype=np.uint8)
    set_scales(ttype, b, rng)
    return b


def random_raw(ttype: str, shape, seed: int) -> np.ndarray:
    """GGUF bytes `[..., N, K/block*type_size]` of a `ttype` tensor of logical `shape`."""
    qt = gguf.GGMLQuantizationType[ttype]
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(seed)
    if ttype in ("F16", "BF16"):   # finite values over the whole range, exact zeros and extremes
        v = (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 12, shape)).astype(np.float32)
        v.reshape(-1)[:len(EXTREME)] = EXTREME
        if ttype == "F16":
            return v.astype(np.float16).view(np.uint8).reshape(*shape[:-1], shape[-1] * 2)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(*shape[:-1], shape[-1] * 2)
    b = random_blocks(ttype, shape, rng)
    b[3::7] = 0                                                # zero blocks (never a whole row: K spans >= 2 blocks)
    raw = b.reshape(*shape[:-1], shape[-1] // block * tsize)
    try:   # the last third of the rows: real data through gguf-py's quantizer, where it has one
        rows = rng.standard_normal((*shape[:-2], shape[-2] // 3, shape[-1])).astype(np.float32)
        raw[..., -rows.shape[-2]:, :] = gguf.quants.quantize(rows, qt)
    except NotImplementedError:
        pass
    return raw


def set_scales(ttype: str, b: np.ndarray, rng) -> None:
    """Write the block scales of blocks `b` (uint8 [n_blocks, type_size]): each float16 scale field drawn on its
    own, ordinary values and, on the first blocks, extreme / subnormal / zero ones; MXFP4's exponent byte e (scale
    2^(e-128)) over a range whose products stay finite in float32, the subnormal scales 2^-128, 2^-127 among the
    first blocks (every e: test_every_table_entry_bit_exact)."""
    n = len(b)

    def f16():
        d = (rng.standard_normal(n) * 2.0 ** rng.integers(-12, 2, n)).astype(np.float16)
        d[:len(EXTREME) * 3:3] = EXTREME                 # extreme / subnormal / zero scales (first rows)
        return d

    for off in F16_FIELDS[ttype]:
        b[:, off:off + 2] = f16().view(np.uint8).reshape(-1, 2)
    if ttype == "IQ1_M":   # float16 bits 4t..4t+3 are the top nibble of scale word t (bytes 48 + 2t, 49 + 2t)
        d16 = f16().view(np.uint16)
        for t in range(4):
            word = b[:, 48 + 2 * t:50 + 2 * t].copy().view(np.uint16)[:, 0]
            word = (word & 0x0FFF) | (((d16 >> (4 * t)) & 0xF) << 12)
            b[:, 48 + 2 * t:50 + 2 * t] = word.astype(np.uint16).view(np.uint8).reshape(-1, 2)
    if ttype == "MXFP4":
        e = rng.integers(100, 150, n)
        e[:4 * 3:3] = [0, 1, 2, 230]
        b[:, 0] = e
    if ttype == "NVFP4":   # ue4m3 bytes: ordinary scales, and on the first blocks the zero codes 0 and 0x7F (NaN),
        d = rng.integers(40, 80, (n, 4))   # subnormals 1..7, the largest 0x7E, and bit 7 set (0x80, 0xFF, 0xC5)
        d.reshape(-1)[:14 * 5:5] = [0, 0x7F, 1, 2, 3, 7, 8, 0x7E, 0x80, 0x81, 0xFF, 0xC5, 0x38, 0x77]
        b[:, :4] = d


def every_entry_raw(ttype: str, shape, seed: int) -> np.ndarray:
    """GGUF bytes of a `ttype` tensor whose blocks, taken in order, use every entry of the format's tables: every
    codebook (grid) index, every sign-pattern index or sign byte, every sub-block scale value, every delta sign;
    MXFP4: every exponent byte (2^-128 … 2^127, overflowing to ±inf in float32 as in gguf-py) with every 4-bit
    value. Other fields random, scales as set_scales'. Written field by field from ggml-common.h's block layouts,
    independently of nextn's packing."""
    block, tsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]]
    b = random_blocks(ttype, shape, np.random.default_rng(seed))
    n = len(b)

    def put(start, a):
        a = np.ascontiguousarray(a).view(np.uint8).reshape(n, -1)
        b[:, start:start + a.shape[1]] = a

    def count(per_block, period):
        """[n, per_block] counter over every group of the tensor, modulo `period` (the table's size)."""
        return (np.arange(n * per_block).reshape(n, per_block) % period).astype(np.uint32)

    def nibbles(v):   # [n, 2m] 4-bit values → [n, m] bytes, value 2i in the low nibble of byte i
        return (v[:, 0::2] | (v[:, 1::2] << 4)).astype(np.uint8)

    if ttype == "IQ2_XXS":   # per 32: u32 of 4 grid bytes, u32 of 4 × 7-bit sign indices | scale << 28
        g, sg, sc = count(32, 256).reshape(n, 8, 4), count(32, 128).reshape(n, 8, 4), count(8, 16)
        aux0 = g[..., 0] | g[..., 1] << 8 | g[..., 2] << 16 | g[..., 3] << 24
        aux1 = sg[..., 0] | sg[..., 1] << 7 | sg[..., 2] << 14 | sg[..., 3] << 21 | sc << 28
        put(2, np.stack([aux0, aux1], -1).astype(np.uint32))
    elif ttype == "IQ2_XS":   # qs u16 per 8: 9-bit grid index | 7-bit sign index << 9; scales 4 bits per 16
        put(2, (count(32, 512) | count(32, 128) << 9).astype(np.uint16))
        put(66, nibbles(count(16, 16)))
    elif ttype == "IQ2_S":    # qs low 8 index bits, signs byte per 8, qh 2 high bits per 8, scales 4 bits per 16
        g = count(32, 1024)
        put(2, (g & 0xFF).astype(np.uint8))
        put(34, count(32, 256).astype(np.uint8))
        h = (g >> 8).reshape(n, 8, 4)
        put(66, (h[..., 0] | h[..., 1] << 2 | h[..., 2] << 4 | h[..., 3] << 6).astype(np.uint8))
        put(74, nibbles(count(16, 16)))
    elif ttype == "IQ3_XXS":  # qs grid index per 4; per 32: u32 of 4 × 7-bit sign indices | scale << 28
        put(2, count(64, 256).astype(np.uint8))
        sg, sc = count(32, 128).reshape(n, 8, 4), count(8, 16)
        put(66, (sg[..., 0] | sg[..., 1] << 7 | sg[..., 2] << 14 | sg[..., 3] << 21 | sc << 28).astype(np.uint32))
    elif ttype == "IQ3_S":    # qs low 8 index bits per 4, qh 9th bit per 4, signs byte per 8, scales 4 bits per 32
        g = count(64, 512)
        put(2, (g & 0xFF).astype(np.uint8))
        h = (g >> 8).reshape(n, 8, 8)
        put(66, sum(h[..., i] << i for i in range(8)).astype(np.uint8))
        put(74, count(32, 256).astype(np.uint8))
        put(106, nibbles(count(8, 16)))
    elif ttype == "IQ1_S":    # qs low 8 index bits per 8; qh u16 per 32: 4 × 3 high bits, scale << 12, delta << 15
        g = count(32, 2048)
        put(2, (g & 0xFF).astype(np.uint8))
        h = (g >> 8).reshape(n, 8, 4)
        qh = h[..., 0] | h[..., 1] << 3 | h[..., 2] << 6 | h[..., 3] << 9 | count(8, 8) << 12 | (count(8, 16) >> 3) << 15
        put(34, qh.astype(np.uint16))
    elif ttype == "IQ1_M":    # qs low 8 index bits per 8; qh nibble per 8: 3 high bits | delta << 3; scales 3 bits per 16
        g = count(32, 2048)
        put(0, (g & 0xFF).astype(np.uint8))
        put(32, nibbles((g >> 8) | (count(32, 14) // 7 << 3)))
        sc = count(16, 8).reshape(n, 4, 4)
        words = b[:, 48:56].copy().view(np.uint16)
        words = (words & 0xF000) | sc[..., 0] | sc[..., 1] << 3 | sc[..., 2] << 6 | sc[..., 3] << 9
        put(48, words.astype(np.uint16))
    elif ttype == "MXFP4":    # e8m0 exponent byte, 32 × 4-bit values
        b[:, 0] = np.arange(n) % 256
        put(1, nibbles(count(32, 16)))
    elif ttype == "NVFP4":    # 4 ue4m3 bytes (every byte value), per 16: 8 bytes of two 4-bit values (every value)
        put(0, count(4, 256).astype(np.uint8))
        put(4, nibbles(count(64, 16)))
    else:
        raise KeyError(ttype)
    return b.reshape(*shape[:-1], shape[-1] // block * tsize)


def dequant(ttype, raw, finite=True):
    with np.errstate(over="ignore" if not finite else "warn"):
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ttype]).astype(np.float32)
    assert np.isfinite(w).all() or not finite
    return w


def _i64(shape):
    return [tirx.IntImm(I64, int(s)) for s in shape]


def _qweight(kind, shape, prefix):
    bufs = [te.placeholder(_i64(s), dt, name=prefix + sfx.replace(".", "_")) for sfx, dt, s in FORMATS[kind].buffers(shape)]
    return bufs, te_ops.QWeight(kind, bufs, shape)


@functools.lru_cache(maxsize=None)
def build(kind: str, n: int = N, k: int = K, experts: bool = True):
    """One module with get_rows, mul_mat (weight [n, k]) and, with `experts`, mul_mat_id (2-D and 3-D
    activations, experts [X, n, k]), scheduled for this CPU."""
    T, kk = te.var("T", I64), 2
    funcs = {}
    bufs, w = _qweight(kind, (n, k), "w")
    ids = te.placeholder([T], "int32", name="ids")
    funcs["get_rows"] = te.create_prim_func([ids, *bufs, te_ops.get_rows(w, ids)])
    x = te.placeholder([T, tirx.IntImm(I64, k)], "float32", name="x")
    funcs["mul_mat"] = te.create_prim_func([x, *bufs, te_ops.mul_mat(w, x)])
    if not experts:
        return _compile(funcs)
    ebufs, ew = _qweight(kind, (X, n, k), "e")
    eids = te.placeholder([T, tirx.IntImm(I64, kk)], "int32", name="eids")
    funcs["mul_mat_id"] = te.create_prim_func([x, eids, *ebufs, te_ops.mul_mat_id(ew, x, eids)])
    x3 = te.placeholder([T, tirx.IntImm(I64, kk), tirx.IntImm(I64, k)], "float32", name="x3")
    funcs["mul_mat_id3"] = te.create_prim_func([x3, eids, *ebufs, te_ops.mul_mat_id(ew, x3, eids)])
    return _compile(funcs)


def _compile(funcs):
    mod = tvm.IRModule({tvm.ir.GlobalVar(n): f.with_attr("global_symbol", n) for n, f in funcs.items()})
    tgt = make_target("llvm")
    with tgt:
        mod = schedule_pass(tgt)(mod)
        assert all("_rf" in mod[f].script() for f in ("mul_mat", "mul_mat_id") if f in funcs)   # the scheduled form
        return tvm.compile(mod, target=tgt)


def _t(a):
    return tvm.runtime.tensor(np.ascontiguousarray(a))


def run(lib, name, out_shape, *args):
    out = tvm.runtime.empty(out_shape, "float32")
    lib[name](*[_t(a) for a in args], out)
    return out.numpy()


@pytest.fixture(scope="module", params=TYPES)
def case(request):
    ttype = request.param
    fmt = by_ggml_type(ttype)
    raw, eraw = random_raw(ttype, (N, K), 1), random_raw(ttype, (X, N, K), 2)
    return (ttype, build(fmt.kind), fmt.pack(raw, (N, K)), dequant(ttype, raw),
            fmt.pack(eraw, (X, N, K)), dequant(ttype, eraw))


GRID_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "MXFP4", "NVFP4"]


@pytest.mark.e2e
@pytest.mark.parametrize("ttype", GRID_TYPES)
def test_every_table_entry_bit_exact(ttype):
    """Blocks that use every codebook / sign / scale / exponent entry of the format, read by get_rows, equal
    gguf-py's dequantization bit for bit (MXFP4's largest exponents overflow to ±inf in both)."""
    fmt = by_ggml_type(ttype)
    raw = every_entry_raw(ttype, (N, K), 3)
    w = dequant(ttype, raw, finite=False)
    ids = np.arange(N, dtype=np.int32)
    got = run(build(fmt.kind), "get_rows", (N, K), ids, *fmt.pack(raw, (N, K)))
    assert np.array_equal(got.view(np.uint32), w.view(np.uint32)), ttype


def test_registry_and_buffer_bytes():
    """Every format is registered and its main buffer is a view of the GGUF's bytes (no copy, nothing repacked),
    plus the per-tensor codebook (and sign-pattern table) of the IQ grid formats. Each format has both halves: the run-time layout (common.quant) and the
    compile-time element (compiler.quant)."""
    from nextn.compiler.quant import ELEMENTS

    assert set(ELEMENTS) == set(FORMATS) == {by_ggml_type(t).kind for t in TYPES}
    for ttype in TYPES:
        fmt = by_ggml_type(ttype)
        assert fmt is not None and fmt.ggml_type == ttype
        block, tsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]]
        assert fmt.block == block
        for shape in ((N, K), (X, N, K)):
            raw = random_raw(ttype, shape, 0)
            arrays = fmt.pack(raw, shape)
            specs = fmt.buffers(shape)
            assert [(a.dtype.name, a.shape) for a in arrays] == [(dt, tuple(s)) for _, dt, s in specs]
            assert np.shares_memory(arrays[0], raw) and arrays[0].nbytes == raw.nbytes
            assert sum(a.nbytes for a in arrays) == raw.nbytes + TABLE_BYTES.get(ttype, 0)


def misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` at an address 32 mod 64: GGUF aligns tensor data to 32 bytes, the kernels must accept it."""
    buf = np.empty(a.nbytes + 128, np.uint8)
    off = (-buf.ctypes.data) % 64 + 32
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def test_dequantize_bit_exact(case):
    ttype, lib, packed, w, _, _ = case
    ids = np.r_[np.arange(N), [N - 1, 0]].astype(np.int32)     # every row, incl. the last (partial tile) one
    got = run(lib, "get_rows", (len(ids), K), ids, *packed)
    assert np.array_equal(got.view(np.uint32), w[ids].view(np.uint32)), ttype
    out = tvm.runtime.empty((len(ids), K), "float32")          # the weight as a 32- (not 64-) aligned view
    lib["get_rows"](_t(ids), *[misaligned(a) for a in packed], out)
    assert np.array_equal(out.numpy().view(np.uint32), w[ids].view(np.uint32)), ttype
    # the same weights through the vectorized, rfactored GEMM kernel: x = I gives y[t, n] = w[n, t] exactly
    y = run(lib, "mul_mat", (K, N), np.eye(K, dtype=np.float32), *packed)
    assert np.array_equal(y, w.T), ttype


# A float32 sum can be 1e-5 close to float64 only where the dot products do not cancel: random blocks with
# extreme scales (a 65504-scaled super-block dominates its row) now and then give a row whose terms cancel 1000-fold
# (sum |x_k w_nk| / |sum x_k w_nk|), where sequential float32 summation itself is 2e-5 off. Activation rows are
# redrawn until every dot product of their output row cancels at most COND-fold (typical rows: 10-20).
COND = 100


def activations(rng, ws) -> np.ndarray:
    """One float32 activation row per entry of `ws`, each a list of float64 weight matrices [N, K] the row
    multiplies, drawn so that no output row cancels more than COND-fold (see COND)."""
    rows = []
    for mats in ws:
        while True:
            x = rng.standard_normal(mats[0].shape[1]).astype(np.float32)
            x64 = x.astype(np.float64)
            if all(np.abs(w64 @ x64).max() * COND >= (np.abs(w64) @ np.abs(x64)).max() for w64 in mats):
                rows.append(x)
                break
    return np.stack(rows)


@pytest.mark.parametrize("T", [1, 3, 4])
def test_mul_mat(case, T):
    ttype, lib, packed, w, _, _ = case
    w64 = w.astype(np.float64)
    x = activations(np.random.default_rng(T), [[w64]] * T)
    got = run(lib, "mul_mat", (T, N), x, *packed)
    want = x.astype(np.float64) @ w64.T
    assert rel_err(got, want) < 1e-5, ttype


@pytest.mark.parametrize("T", [1, 3, 4])
def test_mul_mat_id(case, T):
    ttype, lib, _, _, epacked, ew = case
    rng = np.random.default_rng(10 + T)
    ids = np.stack([rng.permutation(X)[:2] for _ in range(T)]).astype(np.int32)
    w64 = ew.astype(np.float64)
    x = activations(rng, [[w64[e] for e in ids[t]] for t in range(T)])
    x3 = activations(rng, [[w64[e]] for e in ids.reshape(-1)]).reshape(T, 2, K)
    want = np.einsum("tk,tjnk->tjn", x.astype(np.float64), w64[ids])
    want3 = np.einsum("tjk,tjnk->tjn", x3.astype(np.float64), w64[ids])
    got = run(lib, "mul_mat_id", (T, 2, N), x, ids, *epacked)
    got3 = run(lib, "mul_mat_id3", (T, 2, N), x3, ids, *epacked)
    assert rel_err(got.reshape(-1, N), want.reshape(-1, N)) < 1e-5, ttype
    assert rel_err(got3.reshape(-1, N), want3.reshape(-1, N)) < 1e-5, ttype


@pytest.mark.e2e
@pytest.mark.parametrize("ttype", TYPES)
def test_odd_shape(ttype):
    """A weight of 3 blocks per row (K = 96 or 768: not a multiple of 2 blocks nor of 512) and N = 37 rows (under
    one 64-wide tile): rows bit-exact with gguf-py, a 5-row product within 1e-5 of float64."""
    fmt = by_ggml_type(ttype)
    n, k = 37, 3 * max(fmt.block, 32)
    raw = random_raw(ttype, (n, k), 4)
    w = dequant(ttype, raw)
    lib, packed = build(fmt.kind, n, k, experts=False), fmt.pack(raw, (n, k))
    ids = np.r_[n - 1, np.arange(n)].astype(np.int32)
    got = run(lib, "get_rows", (len(ids), k), ids, *packed)
    assert np.array_equal(got.view(np.uint32), w[ids].view(np.uint32)), ttype
    w64 = w.astype(np.float64)
    x = activations(np.random.default_rng(5), [[w64]] * 5)
    assert rel_err(run(lib, "mul_mat", (5, n), x, *packed), x.astype(np.float64) @ w64.T) < 1e-5, ttype


# GGUF tensor types nextn has no kernel for: ternary TQ1_0 / TQ2_0, Q1_0, the activation-only Q8_1 / Q8_K,
# integer and float64 tensors. Everything else gguf-py knows is read (float types widened, block types packed).
REFUSED = ["TQ1_0", "TQ2_0", "Q1_0", "Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"]


def test_refused_types_are_exactly_the_rest():
    from nextn.common.gguf import FLOAT_TYPES

    supported = set(FLOAT_TYPES) | {f.ggml_type for f in FORMATS.values()}
    assert supported == set(FLOAT_TYPES) | set(TYPES)
    assert supported | set(REFUSED) == {t.name for t in gguf.GGMLQuantizationType}
    assert not supported & set(REFUSED)


@pytest.mark.parametrize("ttype", REFUSED)
def test_unsupported_type_names_tensor(tmp_path, ttype):
    """A tensor of a type nextn has no kernel for is refused when the file is validated (compile time), naming the
    file's tensor and its type; the file's other tensors stay readable."""
    from nextn.common.gguf import GGUFFile

    path = tmp_path / "refused.gguf"
    wr = gguf.GGUFWriter(str(path), "glm4moe")
    qt = gguf.GGMLQuantizationType[ttype]
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    wr.add_tensor("blk.0.ffn_up.weight", np.zeros((8, 256 // block * tsize), np.uint8), raw_dtype=qt)
    wr.add_tensor("blk.0.ffn_gate.weight", np.zeros((8, 256), np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    f = GGUFFile(path)
    f.check_tensor("blk.0.ffn_gate.weight", (8, 256))
    with pytest.raises(NextnError, match=rf"blk\.0\.ffn_up\.weight' has type {ttype}, which nextn does not support"):
        f.check_tensor("blk.0.ffn_up.weight", (8, 256))


@pytest.mark.e2e
@pytest.mark.parametrize("target,arches", [("cuda", ["sm_80", "sm_90", "sm_120"]), ("rocm", ["gfx942"])])
def test_gpu_kernels_build(target, arches, tmp_path):
    """Every format's GEMV/GEMM, expert and row-gather kernels get a GPU schedule and compile to device code for
    every requested arch, read back from the library's bytes (built here without a GPU; their numerics are the same
    TE expressions checked on the CPU above)."""
    from nextn.common.device_code import device_code
    from nextn.compiler.gpu_build import build_scope
    from nextn.schedules.gpu import last_report

    T, funcs = te.var("T", I64), {}
    for ttype in TYPES:
        kind = by_ggml_type(ttype).kind
        bufs, w = _qweight(kind, (N, K), "w")
        ebufs, ew = _qweight(kind, (X, N, K), "e")
        x = te.placeholder([T, tirx.IntImm(I64, K)], "float32", name="x")
        ids = te.placeholder([T], "int32", name="ids")
        eids = te.placeholder([T, tirx.IntImm(I64, 2)], "int32", name="eids")
        funcs[f"mul_mat_{kind}"] = te.create_prim_func([x, *bufs, te_ops.mul_mat(w, x)])
        funcs[f"mul_mat_id_{kind}"] = te.create_prim_func([x, eids, *ebufs, te_ops.mul_mat_id(ew, x, eids)])
        funcs[f"get_rows_{kind}"] = te.create_prim_func([ids, *bufs, te_ops.get_rows(w, ids)])
    mod = tvm.IRModule({tvm.ir.GlobalVar(n): f.with_attr("global_symbol", n) for n, f in funcs.items()})
    tgt = make_target(target, arches)
    with build_scope(target, arches), tgt:
        mod = schedule_pass(tgt)(mod)
        assert set(last_report()) == set(funcs)
        lib = tvm.compile(mod, target=tgt)
    assert all(lib.mod.implements_function(n) for n in funcs)
    lib.export_library(str(tmp_path / "kernels.so"))
    info = device_code(str(tmp_path / "kernels.so"))
    assert (info["cuda_sass"] if target == "cuda" else info["amdgpu"]) == sorted(arches)
    assert not info["cuda_source"]
