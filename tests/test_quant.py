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
"""
from __future__ import annotations

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
         "IQ2_XXS", "IQ1_S", "F16", "BF16"]
# Byte offsets of the float16 scale fields in one block (ggml/src/ggml-common.h); the rest of a block is random.
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
              "IQ2_XXS": [0], "IQ1_S": [0], "F16": [], "BF16": []}
# Bytes a format adds to the GGUF's: per-tensor lookup tables (nothing is repacked).
TABLE_BYTES = {"IQ2_XXS": 2048 + 128, "IQ1_S": 16384}
EXTREME = np.array([65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14, 0.0, -0.0, 1.0], np.float16)
N, K, X = 67, 512, 4
I64 = "int64"


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
    n_blocks = int(np.prod(shape)) // block
    b = rng.integers(0, 256, (n_blocks, tsize), dtype=np.uint8)
    for off in F16_FIELDS[ttype]:
        d = (rng.standard_normal(n_blocks) * 2.0 ** rng.integers(-12, 2, n_blocks)).astype(np.float16)
        d[:len(EXTREME) * 3:3] = EXTREME                     # extreme / subnormal / zero scales (first rows)
        b[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    b[3::7] = 0                                                # zero blocks (never a whole row: K spans >= 2 blocks)
    raw = b.reshape(*shape[:-1], shape[-1] // block * tsize)
    try:   # the last third of the rows: real data through gguf-py's quantizer, where it has one
        rows = rng.standard_normal((*shape[:-2], shape[-2] // 3, shape[-1])).astype(np.float32)
        raw[..., -rows.shape[-2]:, :] = gguf.quants.quantize(rows, qt)
    except NotImplementedError:
        pass
    return raw


def dequant(ttype, raw):
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ttype]).astype(np.float32)
    assert np.isfinite(w).all()
    return w


def _i64(shape):
    return [tirx.IntImm(I64, int(s)) for s in shape]


def _qweight(kind, shape, prefix):
    bufs = [te.placeholder(_i64(s), dt, name=prefix + sfx.replace(".", "_")) for sfx, dt, s in FORMATS[kind].buffers(shape)]
    return bufs, te_ops.QWeight(kind, bufs, shape)


def build(kind: str):
    """One module with get_rows, mul_mat, mul_mat_id (2-D and 3-D activations), scheduled for this CPU."""
    T, kk = te.var("T", I64), 2
    funcs = {}
    bufs, w = _qweight(kind, (N, K), "w")
    ids = te.placeholder([T], "int32", name="ids")
    funcs["get_rows"] = te.create_prim_func([ids, *bufs, te_ops.get_rows(w, ids)])
    x = te.placeholder([T, tirx.IntImm(I64, K)], "float32", name="x")
    funcs["mul_mat"] = te.create_prim_func([x, *bufs, te_ops.mul_mat(w, x)])
    ebufs, ew = _qweight(kind, (X, N, K), "e")
    eids = te.placeholder([T, tirx.IntImm(I64, kk)], "int32", name="eids")
    funcs["mul_mat_id"] = te.create_prim_func([x, eids, *ebufs, te_ops.mul_mat_id(ew, x, eids)])
    x3 = te.placeholder([T, tirx.IntImm(I64, kk), tirx.IntImm(I64, K)], "float32", name="x3")
    funcs["mul_mat_id3"] = te.create_prim_func([x3, eids, *ebufs, te_ops.mul_mat_id(ew, x3, eids)])
    mod = tvm.IRModule({tvm.ir.GlobalVar(n): f.with_attr("global_symbol", n) for n, f in funcs.items()})
    tgt = make_target("llvm")
    with tgt:
        mod = schedule_pass(tgt)(mod)
        assert "_rf" in mod["mul_mat"].script() and "_rf" in mod["mul_mat_id"].script()   # the scheduled form
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


def test_registry_and_buffer_bytes():
    """Every format is registered and its main buffer is a view of the GGUF's bytes (no copy, nothing repacked),
    plus a codebook for IQ2_XXS / IQ1_S. Each format has both halves: the run-time layout (common.quant) and the
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


@pytest.mark.parametrize("T", [1, 3, 4])
def test_mul_mat(case, T):
    ttype, lib, packed, w, _, _ = case
    x = np.random.default_rng(T).standard_normal((T, K)).astype(np.float32)
    got = run(lib, "mul_mat", (T, N), x, *packed)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert rel_err(got, want) < 1e-5, ttype


@pytest.mark.parametrize("T", [1, 3, 4])
def test_mul_mat_id(case, T):
    ttype, lib, _, _, epacked, ew = case
    rng = np.random.default_rng(10 + T)
    ids = np.stack([rng.permutation(X)[:2] for _ in range(T)]).astype(np.int32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x3 = rng.standard_normal((T, 2, K)).astype(np.float32)
    w64 = ew.astype(np.float64)
    want = np.einsum("tk,tjnk->tjn", x.astype(np.float64), w64[ids])
    want3 = np.einsum("tjk,tjnk->tjn", x3.astype(np.float64), w64[ids])
    got = run(lib, "mul_mat_id", (T, 2, N), x, ids, *epacked)
    got3 = run(lib, "mul_mat_id3", (T, 2, N), x3, ids, *epacked)
    assert rel_err(got.reshape(-1, N), want.reshape(-1, N)) < 1e-5, ttype
    assert rel_err(got3.reshape(-1, N), want3.reshape(-1, N)) < 1e-5, ttype


def test_unsupported_type_names_tensor(tmp_path):
    """A tensor of a type nextn has no kernel for is refused when the file is validated (compile time)."""
    from nextn.common.gguf import GGUFFile

    path = tmp_path / "tq.gguf"
    wr = gguf.GGUFWriter(str(path), "glm4moe")
    qt = gguf.GGMLQuantizationType.TQ2_0
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    wr.add_tensor("blk.0.ffn_up.weight", np.zeros((8, 256 // block * tsize), np.uint8), raw_dtype=qt)
    wr.add_tensor("blk.0.ffn_gate.weight", np.zeros((8, 256), np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    f = GGUFFile(path)
    f.check_tensor("blk.0.ffn_gate.weight", (8, 256))
    with pytest.raises(NextnError, match=r"blk\.0\.ffn_up\.weight.*TQ2_0"):
        f.check_tensor("blk.0.ffn_up.weight", (8, 256))


@pytest.mark.parametrize("target,arch", [("cuda", "sm_90"), ("rocm", "gfx942")])
def test_gpu_kernels_build(target, arch):
    """Every format's GEMV/GEMM, expert and row-gather kernels get a GPU schedule and compile to device code
    (built here without a GPU; their numerics are the same TE expressions checked on the CPU above)."""
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
    tgt = make_target(target, [arch])
    with build_scope(target, [arch]), tgt:
        mod = schedule_pass(tgt)(mod)
        assert set(last_report()) == set(funcs)
        lib = tvm.compile(mod, target=tgt)
    assert all(lib.mod.implements_function(n) for n in funcs)
