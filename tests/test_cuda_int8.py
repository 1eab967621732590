"""The integer route of the GPU matmuls (compiler/lower/cuda/int8.py), checked without a GPU.

- The activation quantizer (`int8.quantize_rows`) built for llvm gives the CPU's rows bit for bit: the int8 quants
  and float32 scales of `nextn.common.quant.activation` ("q8_0" blocks of 32 for Q8_0, "q8" blocks of 256 for the
  K-quants), T = 1, 2, 4, 9 rows, a zero block and ties included.
- The integer matmul definitions (mul_mat with a symbolic T padded to row tiles, mul_mat_id with x shared or one row
  per slot, the grouped mul_mat_id of verify / prefill) built for llvm (`dp4a=False`: the same int32 sums as
  `__dp4a`) against float64 numpy of the quantized-activation product (x' = d · q times the gguf-py-dequantized
  weight), within 1e-5 of max |y|: every term is exact up to one float32 rounding of the scaled word sum, so the
  error is the float32 summation's (test_quant.activations keeps the rows away from cancellation).
- The same definition against the x86 CPU kernel (compiler/lower/x86, the default llvm artifact's matmul) on the
  same bytes and rows: both compute sum_k w_k x'_k exactly up to float32 summation order (the CPU sums whole
  blocks in int32 and scales once per block, here each 4-quant word is scaled), so they agree within 1e-5 of max |y|
  (measured here: a few 1e-7), where float activations differ by ~1e-2 (the first H200 run).
- The CUDA sm_90 build of the scheduled kernels: the GEMV schedule takes them (4 warps over weight rows, row tiles
  of 4), the CUDA source calls `__dp4a` and the quantizer `__fdiv_rn` (nvcc's --use_fast_math `/` is approximate),
  the weight is loaded once per row tile.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from nextn.common.compare import rel_err
from nextn.common.quant import activation, by_ggml_type
from nextn.compiler.lower import cuda
from nextn.compiler.lower.cuda import gemv, int8, word_loads
from nextn.compiler.target import make_target
from nextn.schedules.gpu_bound import extent_at, launches
from test_cuda_kernels import _cuda_source, _data, _groups64, _ids, _module, _run, _weight
from test_quant import activations

pytestmark = pytest.mark.e2e   # builds CUDA kernels with nvcc

I64 = "int64"
N, X, USED, XG = 37, 3, 2, 5
INT = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "MXFP4",
       "NVFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]
ALIGNED = [t for t in INT if int8.FORMATS[by_ggml_type(t).kind].aligned]   # weight words as 32-bit loads
CODEBOOK = [t for t in INT if int8.FORMATS[by_ggml_type(t).kind].tables]   # grid words as 32-bit loads
# weight words as two 16-bit loads: blocks of an even size, words at even offsets (Q8_0 34 B, Q4_0 18, Q6_K 210 ...)
PAIRS = [t for t in INT if t not in ALIGNED + CODEBOOK and by_ggml_type(t).type_size % 2 == 0]
# blocks of a multiple of 16 bytes (144, 176) whose quant (and Q5_K's high-bit) words of each group of 16 quants are
# 16 consecutive bytes at a 16-byte-aligned offset: a group's words as one 128-bit load
GROUPS16 = ["Q4_K", "Q5_K"]
_W_GROUP = "*(uint4*)(((uint*)w_ptr) + "


def _kind(ttype):
    return by_ggml_type(ttype).kind


def _k(ttype):
    """Not whole warp steps of 512 quants: 11 blocks of 32 for the 32-value formats, 5 of 64 for NVFP4, 3
    super-blocks for the 256-value ones."""
    return {32: 11 * 32, 64: 5 * 64}.get(by_ggml_type(ttype).block, 3 * 256)


def _block(ttype):
    return int8.row_block(_kind(ttype))


def _cpu_rows(x, B):
    """(q int8, d float32) of the CPU's numpy statement."""
    if B == 32:
        return activation.quantize_q8_0(x)
    q, d, _ = activation.quantize(x)
    return q, d


def _x(T, K, seed, w64=None):
    rng = np.random.default_rng(seed)
    if w64 is None:
        return rng.standard_normal((T, K)).astype(np.float32)
    return activations(rng, [[w64]] * T)


def _quantizer(K, B, sums=False):
    T = te.var("T", I64)
    x = te.placeholder([T, tirx.IntImm(I64, K)], "float32", name="x")
    return tvm.compile(_module({"q": te.create_prim_func([x, *int8.quantize_rows(x, B, sums=sums)])}),
                       target="llvm")


def _quantize(lib, x, B, sums=False):
    """(xq, xd), and with `sums` xs: the rows of `_quantizer(K, B, sums)`."""
    T, K = x.shape
    out = [tvm.runtime.empty((T, K // 4), "int32"), tvm.runtime.empty((T, K // B), "float32")]
    if sums:
        out.append(tvm.runtime.empty((T, K // 16), "int32"))
    lib["q"](tvm.runtime.tensor(np.ascontiguousarray(x)), *out)
    return tuple(o.numpy() for o in out)


@pytest.mark.parametrize("B,K", [(32, 352), (256, 768)])
@pytest.mark.parametrize("T", [1, 2, 4, 9])
def test_quantizer_gives_the_cpu_rows(B, K, T):
    lib = _quantizer(K, B)
    x = _x(T, K, T)
    x[0, B:2 * B] = 0.0                                   # a zero block: d = 0, q = 0
    x[-1, 0] = 1.0
    x[-1, 1:B] = np.float32(0.5) / np.float32(127)        # x * 127 / amax = 0.5 exactly: a tie, to even (0)
    x[-1, 2] = np.float32(1.5) / np.float32(127)          # 1.5: to even (2)
    xq, xd = _quantize(lib, x, B)
    q, d = _cpu_rows(x, B)
    assert np.array_equal(xq.view(np.int8).reshape(T, K), q)
    assert np.array_equal(xd.view(np.uint32), d.view(np.uint32))
    assert q[-1, 1] == 0 and q[-1, 2] == 2


_NORMAL_MIN = np.float32(2.0 ** -126)   # the smallest normal float32; below it -ftz flushes to (signed) zero


def _ftz(v):
    v = np.asarray(v, np.float32)
    return np.where(np.abs(v) < _NORMAL_MIN, np.copysign(np.float32(0), v), v).astype(np.float32)


def _fast_math_rows(x, B, threshold=True):
    """(q int8, d float32) of rows x as the sm_90 quantizer computes them under nvcc's --use_fast_math, op by op in
    numpy with each op's flushing (the PTX, checked in test_quantizer_sm90_zeroes_tiny_blocks_before_dividing:
    abs.ftz, max.ftz, setp.lt.ftz against AMAX_MIN, div.rn.ftz for d and 127 / amax, setp.leu.ftz, mul.ftz, then
    cvt.rni (half to even) and cvt.rzi.s32 of an integer value); `threshold` False: without the AMAX_MIN test."""
    T, K = x.shape
    xb = x.reshape(T, K // B, B)
    amax = _ftz(np.abs(_ftz(xb)).max(-1))
    if threshold:
        amax = np.where(amax < activation.AMAX_MIN, np.float32(0), amax).astype(np.float32)
    d = _ftz(amax / np.float32(127))
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(amax <= 0, np.float32(0), _ftz(np.float32(127) / amax)).astype(np.float32)
        p = _ftz(_ftz(xb) * inv[..., None])
    return np.rint(p).astype(np.int8).reshape(T, K), d


def _tiny_blocks(B, seed):
    """Rows of 256 values whose blocks of B sit at the edges of AMAX_MIN = 2^-118: amax exactly 2^-118 (one value
    negative, subnormals and the q = 1 boundary amax / 254 beside it), one float32 step below and above it, 1e-36
    (d = amax / 127 subnormal: -ftz would flush it), 1e-37 (127 / amax overflows to inf), a subnormal amax, the
    smallest normal, 1e-30 with subnormal values, an ordinary block with subnormal and zero values, a zero block."""
    rng = np.random.default_rng(seed)
    lo = activation.AMAX_MIN
    sub = np.float32(2.0 ** -126) * np.float32(0.75)       # a subnormal
    rows = []
    for amax in (lo, -lo, np.nextafter(lo, np.float32(0)), np.nextafter(lo, np.float32(1)), np.float32(1e-36),
                 np.float32(1e-37), np.float32(1e-40), _NORMAL_MIN, np.float32(1e-30), np.float32(1.0), None):
        row = np.zeros(256, np.float32)
        if amax is not None:
            for b in range(0, 256, B):
                v = (rng.uniform(-1, 1, B) * np.abs(amax)).astype(np.float32)
                v[rng.integers(1, B, 4)] = [sub, -sub, np.float32(1e-45), 0.0]
                v[B - 1] = np.float32(abs(amax)) / np.float32(254)      # x * 127 / amax = 0.5: to even, 0
                v[B - 2] = np.nextafter(np.float32(abs(amax)) / np.float32(254), np.float32(1))   # just past: 1
                v[0] = amax
                row[b:b + B] = v
        rows.append(row)
    return np.stack(rows)


@pytest.mark.parametrize("B", [32, 256])
def test_tiny_blocks_quantize_alike_with_and_without_flush_to_zero(B):
    """Blocks whose amax is below activation.AMAX_MIN = 2^-118 quantize as zero blocks (d = 0, q = 0) on every path:
    the numpy statement, the x86 kernel and the GPU definition built for llvm give the same rows bit for bit, and
    so does a model of the sm_90 quantizer under --use_fast_math (subnormal inputs and results flushed at every
    op); from 2^-118 up every value it computes that can change q or d is normal, so flushing changes nothing.
    Without the threshold the fast-math d of a block of amax 1e-36 would be 0 where the CPU's is subnormal."""
    from nextn.compiler.lower import x86

    x = _tiny_blocks(B, B)
    T, K = x.shape
    q, d = _cpu_rows(x, B)
    n_blocks = K // B
    below = np.abs(x).reshape(T, n_blocks, B).max(-1) < activation.AMAX_MIN
    assert below[2:3].all() and below[6:7].all() and not below[[0, 1, 3, 9]].any()   # the edges as meant
    assert (d[below] == 0).all() and (q.reshape(T, n_blocks, B)[below] == 0).all()
    kept = ~below & (d > 0)
    assert kept[0].all() and (q[0].reshape(n_blocks, B)[:, [0, B - 2, B - 1]] == [127, 1, 0]).all()
    xq, xd = _quantize(_quantizer(K, B), x, B)
    for name, (gq, gd) in (("fast-math model", _fast_math_rows(x, B)),
                           ("llvm definition", (xq.view(np.int8).reshape(T, K), xd))):
        assert np.array_equal(gq, q) and np.array_equal(gd.view(np.uint32), d.view(np.uint32)), name
    fmt = "q8" if B == 256 else "q8_0"
    fn = tvm.compile(tvm.IRModule({"main": x86.quantize_rows(K, row_format=fmt)}), target=make_target("llvm"))
    want = activation.quantize(x) if B == 256 else (q, d)
    got = [tvm.runtime.empty(w.shape, str(w.dtype)) for w in want]
    fn.mod["main"](tvm.runtime.tensor(x), *got)
    for g, w in zip(got, want):
        assert np.array_equal(g.numpy(), w), fmt
    # why the threshold: a block of amax 1e-36 has d = amax / 127 ~ 7.9e-39, subnormal (kept on the CPU before)
    _q, d_ftz = _fast_math_rows(x[4:5], B, threshold=False)
    cpu_d = np.abs(x[4]).reshape(n_blocks, B).max(-1) / np.float32(127)
    assert (cpu_d > 0).all() and (d_ftz == 0).all()


def _int_funcs(ttype, K):
    """llvm PrimFuncs of the integer definitions over quantized rows: mul_mat (symbolic T), mul_mat_id (x shared;
    one row per slot), the grouped mul_mat_id (both x layouts) and `expert_groups`."""
    B = _block(ttype)
    T = te.var("T", I64)
    bufs, w = _weight(ttype, (N, K), "w")
    ebufs, ew = _weight(ttype, (X, N, K), "e")
    gbufs, gw = _weight(ttype, (XG, N, K), "g")

    def rows(lead, name):
        return (te.placeholder([*lead, tirx.IntImm(I64, K // 4)], "int32", name=name + "q"),
                te.placeholder([*lead, tirx.IntImm(I64, K // B)], "float32", name=name + "d"))

    xq, xd = rows([T], "x")
    x3q, x3d = rows([T, tirx.IntImm(I64, USED)], "x3")
    ids = te.placeholder([T, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = cuda.expert_groups(ids, cuda.expert_leaders(ids))
    out = {"mul_mat": te.create_prim_func([xq, xd, *bufs, int8.mul_mat(w, xq, xd, dp4a=False)]),
           "mul_mat_id": te.create_prim_func([xq, xd, ids, *ebufs, int8.mul_mat_id(ew, xq, xd, ids, dp4a=False)]),
           "mul_mat_id3": te.create_prim_func([x3q, x3d, ids, *ebufs,
                                               int8.mul_mat_id(ew, x3q, x3d, ids, dp4a=False)])}
    for name, (q, d) in (("grouped", (xq, xd)), ("grouped3", (x3q, x3d))):
        y = cuda.expert_gather(int8.mul_mat_id_grouped(gw, q, d, ids, groups, dp4a=False), groups)
        out[name] = te.create_prim_func([q, d, ids, *gbufs, y])
    return out


@pytest.fixture(scope="module", params=INT)
def definition(request):
    ttype = request.param
    K = _k(ttype)
    lib = tvm.compile(_module(_int_funcs(ttype, K)), target="llvm")
    return ttype, K, lib, _quantizer(K, _block(ttype)), _data(ttype, (N, K), 1), _data(ttype, (X, N, K), 2), \
        _data(ttype, (XG, N, K), 3)


def _x_prime(x, B):
    """What the quantized rows stand for (float64)."""
    return activation.round_trip(x, "q8_0" if B == 32 else "q8")


@pytest.mark.parametrize("T", [1, 2, 4, 9])
def test_int8_mul_mat_against_float64(definition, T):
    ttype, K, lib, qlib, (packed, w), _e, _g = definition
    B = _block(ttype)
    x = _x(T, K, 10 + T, w.astype(np.float64))
    got = _run(lib, "mul_mat", (T, N), *_quantize(qlib, x, B), *packed)
    assert rel_err(got, _x_prime(x, B) @ w.astype(np.float64).T) < 1e-5, ttype


def _check_id(lib, qlib, names, ids, packed, ew, seed, ttype):
    T, K, B = len(ids), ew.shape[-1], _block(ttype)
    w64 = ew.astype(np.float64)
    rng = np.random.default_rng(seed)
    x = activations(rng, [[w64[e] for e in ids[t]] for t in range(T)])
    x3 = activations(rng, [[w64[e]] for e in ids.reshape(-1)]).reshape(T, USED, K)
    want = np.einsum("tk,tjnk->tjn", _x_prime(x, B), w64[ids])
    want3 = np.einsum("tjk,tjnk->tjn", _x_prime(x3, B), w64[ids])
    q3, d3 = _quantize(qlib, x3.reshape(T * USED, K), B)
    got = _run(lib, names[0], (T, USED, N), *_quantize(qlib, x, B), ids, *packed)
    got3 = _run(lib, names[1], (T, USED, N), q3.reshape(T, USED, -1), d3.reshape(T, USED, -1), ids, *packed)
    assert rel_err(got.reshape(-1, N), want.reshape(-1, N)) < 1e-5, ttype
    assert rel_err(got3.reshape(-1, N), want3.reshape(-1, N)) < 1e-5, ttype


@pytest.mark.parametrize("T", [1, 2, 4, 9])
def test_int8_mul_mat_id_against_float64(definition, T):
    ttype, _K, lib, qlib, _w, (epacked, ew), _g = definition
    rng = np.random.default_rng(20 + T)
    ids = np.stack([rng.permutation(X)[:USED] for _ in range(T)]).astype(np.int32)
    _check_id(lib, qlib, ("mul_mat_id", "mul_mat_id3"), ids, epacked, ew, 30 + T, ttype)


@pytest.mark.parametrize("T", [1, 2, 4, 9])
@pytest.mark.parametrize("repeat", [False, True])
def test_int8_grouped_mul_mat_id_against_float64(definition, T, repeat):
    ttype, _K, lib, qlib, _w, _e, (gpacked, gw) = definition
    ids = _ids(T, 40 + T, repeat)
    assert _groups64(ids).shape == (T, USED, cuda.GROUP_ROWS + 1)
    _check_id(lib, qlib, ("grouped", "grouped3"), ids, gpacked, gw, 60 + T, ttype)


def _sum_funcs(ttype, K):
    """llvm PrimFuncs: the quantizer with sums, and mul_mat (symbolic T), mul_mat_id and the gathered grouped
    mul_mat_id (both x layouts each) with and without them ("_s")."""
    B, T = _block(ttype), te.var("T", I64)
    bufs, w = _weight(ttype, (N, K), "w")
    ebufs, ew = _weight(ttype, (XG, N, K), "e")
    x = te.placeholder([T, tirx.IntImm(I64, K)], "float32", name="x")
    ids = te.placeholder([T, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = cuda.expert_groups(ids, cuda.expert_leaders(ids))
    out = {"quantize": te.create_prim_func([x, *int8.quantize_rows(x, B, sums=True)])}
    for layout, lead in (("", [T]), ("3", [T, tirx.IntImm(I64, USED)])):
        q = te.placeholder([*lead, tirx.IntImm(I64, K // 4)], "int32", name="xq")
        d = te.placeholder([*lead, tirx.IntImm(I64, K // B)], "float32", name="xd")
        xs = te.placeholder([*lead, tirx.IntImm(I64, K // int8.SUM_QUANTS)], "int32", name="xs")
        for sfx, kw in (("", {}), ("_s", {"xs": xs})):
            if not layout:
                out["mul_mat" + sfx] = te.create_prim_func([q, d, xs, *bufs, int8.mul_mat(w, q, d, False, **kw)])
            out[f"mul_mat_id{layout}{sfx}"] = te.create_prim_func(
                [q, d, xs, ids, *ebufs, int8.mul_mat_id(ew, q, d, ids, False, **kw)])
            y = cuda.expert_gather(int8.mul_mat_id_grouped(ew, q, d, ids, groups, False, **kw), groups)
            out[f"grouped{layout}{sfx}"] = te.create_prim_func([q, d, xs, ids, *ebufs, y])
    return out


@pytest.mark.parametrize("ttype", ["Q4_K", "Q4_1", "Q8_0"] + [pytest.param(t, marks=pytest.mark.slow)
                                                              for t in ("Q5_K", "Q2_K", "IQ1_S", "IQ1_M")])
def test_int8_sums_change_no_bit(ttype):
    """`quantize_rows(sums=True)` writes each 16 quants' sum (numpy's sums of the CPU's quants, and of its own
    words' bytes), and the matmuls that take it (the min term's Σ dot4(1111, xq) read as those sums: Q4_K, Q5_K,
    Q4_1, Q2_K, IQ1_S; neither IQ1_M, whose groups of 2 words keep the dp4a, nor Q8_0, which has no min term, reads
    them) give the outputs of the ones without it bit for bit, built for llvm: mul_mat over a symbolic T, mul_mat_id
    and the grouped mul_mat_id (both x layouts, repeated experts)."""
    K, T, B = _k(ttype), 6, _block(ttype)
    funcs = _sum_funcs(ttype, K)
    reads = ttype not in ("IQ1_M", "Q8_0")   # a min term, in groups of whole sums
    for name, f in funcs.items():
        assert ("xs[" in f.script()) == (name.endswith("_s") and reads), (ttype, name)
    lib = tvm.compile(_module(funcs), target="llvm")
    packed, w = _data(ttype, (N, K), 1)
    epacked, _ew = _data(ttype, (XG, N, K), 2)
    x = _x(T, K, 3, w.astype(np.float64))
    xq, xd, xs = (tvm.runtime.empty(sh, dt) for sh, dt in (((T, K // 4), "int32"), ((T, K // B), "float32"),
                                                            ((T, K // 16), "int32")))
    lib["quantize"](tvm.runtime.tensor(x), xq, xd, xs)
    q, d, xs = xq.numpy(), xd.numpy(), xs.numpy()
    cq, cd = _cpu_rows(x, B)
    assert np.array_equal(q.view(np.int8).reshape(T, K), cq.reshape(T, K)) and np.array_equal(d, cd)
    want = cq.reshape(T, K // 16, 16).astype(np.int64).sum(-1)
    assert np.array_equal(xs, want) and np.abs(xs).max() > 16, ttype
    q3, d3, s3 = (np.ascontiguousarray(np.repeat(a[:, None], USED, 1)) for a in (q, d, xs))
    ids = _ids(T, 9, True)
    for name, shape, args in (("mul_mat", (T, N), (q, d, xs, *packed)),
                              ("mul_mat_id", (T, USED, N), (q, d, xs, ids, *epacked)),
                              ("mul_mat_id3", (T, USED, N), (q3, d3, s3, ids, *epacked)),
                              ("grouped", (T, USED, N), (q, d, xs, ids, *epacked)),
                              ("grouped3", (T, USED, N), (q3, d3, s3, ids, *epacked))):
        a, b = _run(lib, name, shape, *args), _run(lib, name + "_s", shape, *args)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)) and np.abs(a).max() > 0, (ttype, name)


@pytest.mark.parametrize("ttype", INT)
def test_int8_definition_equals_the_x86_kernel(ttype):
    """The CUDA definition and the CPU's x86 integer kernel (what the default llvm artifact runs) on the same bytes
    and float rows, T = 9 (two row groups of the CPU kernel and a tail): within 1e-5 of max |y| (module
    docstring: the same exact products, float32 sums in another order)."""
    from nextn.compiler.lower import x86
    from nextn.compiler.target import make_target as mt

    if x86.vector_width(mt("llvm")) is None:
        pytest.fail("this CPU has no AVX2: the x86 kernels do not build")
    kind, K, T = _kind(ttype), _k(ttype), 9
    if by_ggml_type(ttype).block == 256:
        K = 512      # the x86 super-block kernels' steps
    raw, w = _raw(ttype, K)
    x = _x(T, K, 5, w.astype(np.float64))
    cpu = tvm.compile(tvm.IRModule({"main": x86.matmul(kind, N, K)}), target=mt("llvm")).mod["main"]
    acts = x86.activation_rows(kind, x)
    y_cpu = tvm.runtime.tensor(np.zeros((T, N), np.float32))
    cpu(tvm.runtime.tensor(raw), *[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in acts], y_cpu)
    lib = tvm.compile(_module(_int_funcs(ttype, K)), target="llvm")
    packed = list(by_ggml_type(ttype).pack(raw, (N, K)))
    y = _run(lib, "mul_mat", (T, N), *_quantize(_quantizer(K, _block(ttype)), x, _block(ttype)), *packed)
    y_cpu = y_cpu.numpy()
    assert rel_err(y, y_cpu) < 1e-5, ttype
    # and both are the quantized-activation product, not the float one
    x64 = x.astype(np.float64) @ w.astype(np.float64).T
    assert rel_err(y_cpu, x64) > 1e-4 and rel_err(y, x64) > 1e-4


def _raw(ttype, K):
    from test_quant import dequant, random_raw

    raw = random_raw(ttype, (N, K), 7)
    return raw, dequant(ttype, raw)


def _scheduled(func):
    tgt = make_target("cuda", ["sm_90"])
    sch = (int8.schedule_quantize if "act_amax" in func.script() else cuda.schedule)(func, tgt)
    assert sch is not None
    return sch.mod["main"].with_attr("tirx.is_scheduled", True), tgt


# a weight word of an even block as two 16-bit loads (word_loads.py), printed by TVM's CUDA codegen
_WORD_OF_PAIRS = (r"\(\(uint\)\(\(ushort\*\)w_ptr\)\[[^;]*\]\) \| "
                  r"\(\(\(uint\)\(\(ushort\*\)w_ptr\)\[[^;]*<< \(uint\)16\)")


def _cuda_funcs(ttype, K, rows):
    B = _block(ttype)
    T = te.var("T", I64) if rows is None else tirx.IntImm(I64, rows)
    bufs, w = _weight(ttype, (N, K), "w")
    x = te.placeholder([T, tirx.IntImm(I64, K)], "float32", name="x")
    xq = te.placeholder([T, tirx.IntImm(I64, K // 4)], "int32", name="xq")
    xd = te.placeholder([T, tirx.IntImm(I64, K // B)], "float32", name="xd")
    xs = te.placeholder([T, tirx.IntImm(I64, K // 16)], "int32", name="xs")
    return {"quantize": te.create_prim_func([x, *int8.quantize_rows(x, B, cuda=True, sums=True)]),
            "mul_mat": te.create_prim_func([xq, xd, xs, *bufs, int8.mul_mat(w, xq, xd, xs=xs)])}


def test_group_words_take_whole_sub_blocks_in_whole_warp_steps():
    """int8.group_words: a lane's step takes a sub-block of 32 quants (8 words) where K is whole warp steps of 8
    words per lane (K = 4096: GLM-4.5-Air's n_embd) or not of 4 either (K = 352, 1408: predicated steps either way);
    4 words where only steps of 4 are whole (K = 1536: GLM-4.6's n_ff_exp; 512); never more than a sub-block (Q6_K,
    Q2_K, NVFP4: 16 quants; IQ1_M: 8)."""
    for K, G in ((4096, 8), (1024, 8), (352, 8), (1408, 8), (1536, 4), (512, 4)):
        assert int8.group_words("q8_0", K) == G and int8.group_words("q4_k", K) == G, K
    for kind, G in (("q6_k", 4), ("q2_k", 4), ("nvfp4", 4), ("iq1_m", 2)):
        assert int8.group_words(kind, 4096) == G, kind


@pytest.mark.parametrize("ttype,K", [(t, K) for t in INT for K in (
    (512, 1024) if by_ggml_type(t).block == 256 else (_k(t),))])
def test_int8_kernels_build_for_sm90_with_dp4a(ttype, K):
    """sm_90: the quantizer (a warp per activation block: ceil(T·K/B / 4) blocks of 4 warps, a shuffle max,
    __fdiv_rn) and the GEMV (ceil(N / 4) blocks of 4 warps, ceil(T / 4) row tiles) build; the GEMV's source calls
    __dp4a, loads the weight words of the aligned formats as 32-bit words and the activation words as 128-bit quads
    (whole warp steps only), and holds as many weight loads for a symbolic T as for one row (the weight read once per
    row tile); the quantizer also stores each 16 quants' sum and the formats with a min term read it. The K-quants
    at K = 512 (whole warp steps of 4 words per lane, not of 8) and 1024 (of 8), the others at K = `_k` (partial
    steps)."""
    from nextn.schedules.gpu import _lowering_problem

    G = int8.group_words(_kind(ttype), K)
    xload = "*(int4*)(xq_ptr + " if G % 4 == 0 else "*(int2*)(xq_ptr + "
    srcs = {}
    for rows in (None, 1):
        fs = {}
        for name, f in _cuda_funcs(ttype, K, rows).items():
            fs[name], tgt = _scheduled(f)
            assert _lowering_problem(fs[name]) is None, (ttype, name)
        (lq,) = launches(fs["quantize"])
        assert lq["block"] == ["32", str(int8.QUANT_WARPS), "1"], lq
        for T in (1, 3, 9):
            want = math.ceil((1 if rows == 1 else T) * K // _block(ttype) / int8.QUANT_WARPS)
            assert extent_at(lq["grid"][0], T) == want, lq
        (ln,) = launches(fs["mul_mat"])
        assert ln["grid"][0] == str(math.ceil(N / gemv.WARPS)) and ln["block"] == ["32", str(gemv.WARPS), "1"]
        for T in (1, 3, 9):
            assert extent_at(ln["grid"][1], T) == (1 if rows == 1 else math.ceil(T / gemv.TILE_ROWS)), ln
        srcs[rows] = _cuda_source(fs, tgt)
    for rows, src in srcs.items():
        gemv_src = src[src.index("mul_mat_kernel("):]
        quant_src = src[src.index("quantize_kernel("):]
        assert "__dp4a(" in gemv_src and "__fdiv_rn(" in quant_src and "__shfl_down_sync(" in quant_src
        # the quantizer stores the sums of 16 quants; the min term reads them (2 per step of 8 words, a 64-bit
        # load where the rows are a padded tile of whole steps) and no dp4a with 0x01010101 is left, except for
        # IQ1_M's steps of 2 words
        assert "act_s_ptr[" in quant_src
        low = int8.FORMATS[_kind(ttype)].low is not None
        assert ("xs_ptr" in gemv_src) == (low and G % 4 == 0), ttype
        assert ("__dp4a(16843009" in gemv_src) == (low and G % 4 != 0), ttype
        if low and G == 8 and rows is None:
            assert ("*(int2*)(xs_ptr + " in gemv_src) == (K % (gemv.LANES * 4 * G) == 0), ttype
        assert "(float)" in gemv_src   # the word sums scaled in float
        # the aligned formats' weight words as 32-bit loads (word_loads.word_loads), Q4_K's and Q5_K's a group's 4
        # as one 128-bit load and no word alone, the others' as bytes; the codebook formats' grid words as 32-bit
        # loads of the table buffer (global memory, read-only cache), no byte of the grid read alone
        assert ("((uint*)w_ptr)[" in gemv_src) == (ttype in ALIGNED and ttype not in GROUPS16), ttype
        assert (_W_GROUP in gemv_src) == (ttype in GROUPS16), ttype
        if ttype not in CODEBOOK:   # (theirs read 16-bit fields of even blocks too)
            assert bool(re.search(_WORD_OF_PAIRS, gemv_src)) == (ttype in PAIRS), ttype
        # a block's float16 factors (d, dmin) at even offsets as one 16-bit load each, never two bytes put together
        # (MXFP4's and NVFP4's scales are bytes); Q4_K's and Q5_K's with their scale bytes: the block's first 16
        # bytes as one 128-bit load into registers, and no weight byte or 16-bit field read alone
        if ttype in GROUPS16:
            assert "*(uint4*)(whead_local_ptr + 0) = " + _W_GROUP in gemv_src, ttype
            assert not re.search(r"\bw_ptr\[|\(ushort\*\)w_ptr", gemv_src), ttype
        elif by_ggml_type(ttype).type_size % 2 == 0 and ttype not in ("MXFP4", "NVFP4"):
            assert "((ushort)w_ptr" not in gemv_src and re.search(r"\(ushort\*\)w_ptr(_\d)?\)\[", gemv_src), ttype
        grid_words = len(re.findall(r"\(\(uint\*\)w_grid_ptr\)\[", gemv_src))
        assert (grid_words > 0) == (ttype in CODEBOOK) and "w_grid_ptr[" not in gemv_src, (ttype, grid_words)
        # the activation words: a lane's 8 or 4 words of a step (IQ1_M: 2) as 128-bit (64-bit) loads per row (a
        # predicated register tile for a symbolic T) where K is whole warp steps (1024 or 512 quants; 256), else
        # scalar loads
        whole = K % (gemv.LANES * 4 * G) == 0
        assert (xload in gemv_src) == whole and ("xq_ptr[" in gemv_src) != whole, (ttype, K)
    # a symbolic T: each row's vector load of the padded tile unpredicated, from row min(t, T - 1) (a padded row
    # reads the last row: no read past T, and no branch per load)
    lines = srcs[None][srcs[None].index("mul_mat_kernel("):].splitlines()
    at = [i for i, line in enumerate(lines) if xload in line]
    assert all("(T - (int64_t)1)) * " in lines[i] and " < T) {" not in lines[i - 1] for i in at), ttype
    w_loads = [len(re.findall(r"\bw_ptr\[|\(\(u(?:short|int)\*\)w_ptr\)[\[ ]", s[s.index("mul_mat_kernel("):]))
               for s in srcs.values()]
    assert w_loads[0] == w_loads[1] > 0, w_loads


SHARED = ["Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K"]   # the formats whose word groups share weight bytes


@pytest.mark.parametrize("K", [512, 1024, 1536, 2048, 4096, 8192])
@pytest.mark.parametrize("ttype", SHARED + ["Q8_0"])
def test_group_order_is_a_permutation_of_each_body(ttype, K):
    """int8.group_order: for the formats of int8.SHARED where a GEMV body is U > 1 warp steps, a permutation of the
    row's word groups that keeps each body's groups in that body and gives a lane (j % 32) U consecutive groups of
    one weight block; row order (None) for one step per body and for the other formats."""
    kind = _kind(ttype)
    G = int8.group_words(kind, K)
    n = K // (4 * G)
    order = int8.group_order(kind, K)
    steps = n // gemv.LANES if n % gemv.LANES == 0 else None
    U = gemv.unroll(steps, True) if steps else 1
    assert (order is None) == (U == 1 or ttype not in SHARED), (ttype, K)
    if order is None:
        return
    per_block = by_ggml_type(ttype).block // (4 * G)
    g = [order(j) for j in range(n)]
    assert sorted(g) == list(range(n)), (ttype, K)
    body = gemv.LANES * U
    for j0 in range(0, n, body):
        assert {g[j] // body for j in range(j0, j0 + body)} == {j0 // body}
        for lane in range(gemv.LANES):
            mine = [g[j0 + u * gemv.LANES + lane] for u in range(U)]
            assert mine == list(range(mine[0], mine[0] + U)) and len({x // per_block for x in mine}) == 1, mine


@pytest.mark.parametrize("ttype", SHARED)
def test_group_order_changes_only_the_float_order(ttype, monkeypatch):
    """At K = 4096 (bodies of 4 warp steps: the order applies) the integer definitions on llvm (mul_mat of a
    symbolic T, mul_mat_id, the grouped one) are within 1e-5 of the same definitions in row order, and not equal to
    them: the same exact int32 sums, the float32 terms summed in another order (the tolerance of
    `test_int8_definition_equals_the_x86_kernel`); mul_mat within 1e-5 of the float64 product of the quantized rows
    either way."""
    K, T = 4096, 3
    B = _block(ttype)
    assert int8.group_order(_kind(ttype), K) is not None
    packed, w = _data(ttype, (N, K), 1)
    epacked, _ew = _data(ttype, (X, N, K), 2)
    gpacked, _gw = _data(ttype, (XG, N, K), 3)
    x = _x(T, K, 21, w.astype(np.float64))
    rows = _quantize(_quantizer(K, B), x, B)
    rng = np.random.default_rng(22)
    ids = np.stack([rng.permutation(X)[:USED] for _ in range(T)]).astype(np.int32)
    gids = _ids(T, 23, False)

    def run():
        lib = tvm.compile(_module(_int_funcs(ttype, K)), target="llvm")
        return (_run(lib, "mul_mat", (T, N), *rows, *packed),
                _run(lib, "mul_mat_id", (T, USED, N), *rows, ids, *epacked),
                _run(lib, "grouped", (T, USED, N), *rows, gids, *gpacked))

    ordered = run()
    monkeypatch.setattr(int8, "group_order", lambda kind, K: None)
    plain = run()
    want = _x_prime(x, B) @ w.astype(np.float64).T
    assert rel_err(ordered[0], want) < 1e-5 and rel_err(plain[0], want) < 1e-5, ttype
    for a, b in zip(ordered, plain):
        assert rel_err(a, b) < 1e-5 and not np.array_equal(a, b), ttype


@pytest.mark.parametrize("ttype", SHARED)
def test_group_order_keeps_register_tiles(ttype):
    """In group order (K = 4096) the sm_90 kernels of every form (mul_mat of a symbolic T, the one-row mul_mat_id,
    the grouped mul_mat_id, each with the sums of 16 quants) keep a lane's weight words, activation words and factors
    as small register tiles: no local array of more than 64 elements (an index TVM cannot narrow makes it a whole
    row: the groups 8 / U apart tried for Q6_K gave `dequant_local[1024]` in the grouped kernel)."""
    K, B, T, one = 4096, _block(ttype), te.var("T", I64), tirx.IntImm(I64, 1)
    assert int8.group_order(_kind(ttype), K) is not None

    def rows(lead):
        return [te.placeholder([*lead, tirx.IntImm(I64, K // d)], dt, name=n)
                for n, d, dt in (("xq", 4, "int32"), ("xd", B, "float32"), ("xs", 16, "int32"))]

    bufs, w = _weight(ttype, (64, K), "w")
    ebufs, ew = _weight(ttype, (XG, 64, K), "e")
    xq, xd, xs = rows([T])
    oq, od, os_ = rows([one])
    ids = te.placeholder([T, tirx.IntImm(I64, USED)], "int32", name="ids")
    ids1 = te.placeholder([one, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = te.placeholder([T, tirx.IntImm(I64, USED), tirx.IntImm(I64, cuda.GROUP_ROWS + 1)], "int32",
                            name="groups")
    funcs = {"mul_mat": [xq, xd, xs, *bufs, int8.mul_mat(w, xq, xd, xs=xs)],
             "mul_mat_id": [oq, od, os_, ids1, *ebufs, int8.mul_mat_id(ew, oq, od, ids1, xs=os_)],
             "grouped": [xq, xd, xs, ids, groups, *ebufs, int8.mul_mat_id_grouped(ew, xq, xd, ids, groups, xs=xs)]}
    for name, args in funcs.items():
        g, tgt = _scheduled(te.create_prim_func(args))
        src = _cuda_source({"k": g}, tgt)
        sizes = {m.group(1): int(m.group(2)) for m in re.finditer(r"alignas\(64\) \w+ (\w+)\[(\d+)\]", src)}
        assert sizes and max(sizes.values()) <= 64, (ttype, name, sizes)


@pytest.mark.parametrize("ttype", SHARED)
def test_group_order_loads_shared_bytes_once(ttype, monkeypatch):
    """The sm_90 PTX of the one-row GEMV over one unrolled body (K = 32 lanes x 4 steps x G words: no loop): with
    the group order nvcc loads the words that a lane's groups share once, so the kernel holds at most 3/4 of the
    global loads of row order (Q4_K: the qs words of a pair of sub-blocks and the block head; Q6_K: the qh words of
    groups q and q + 2)."""
    from tvm.support import nvcc

    from nextn.compiler.gpu_build import build_scope

    G = int8.group_words(_kind(ttype), 4096)
    K = gemv.LANES * gemv.UNROLL * 4 * G
    assert int8.group_words(_kind(ttype), K) == G and int8.group_order(_kind(ttype), K) is not None

    def loads():
        B, one = _block(ttype), tirx.IntImm(I64, 1)
        bufs, w = _weight(ttype, (64, K), "w")   # whole blocks of 4 rows (N = 37 would test each row per step)
        xq = te.placeholder([one, tirx.IntImm(I64, K // 4)], "int32", name="xq")
        xd = te.placeholder([one, tirx.IntImm(I64, K // B)], "float32", name="xd")
        xs = te.placeholder([one, tirx.IntImm(I64, K // 16)], "int32", name="xs")
        g, tgt = _scheduled(te.create_prim_func([xq, xd, xs, *bufs, int8.mul_mat(w, xq, xd, xs=xs)]))
        src = _cuda_source({"k": g}, tgt)
        with build_scope("cuda", ["sm_90"]), tgt:
            ptx = nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc").decode()
        return len(re.findall(r"\bld\.global\.", ptx))

    ordered = loads()
    monkeypatch.setattr(int8, "group_order", lambda kind, K: None)
    plain = loads()
    assert ordered <= 0.75 * plain, (ttype, ordered, plain)


@pytest.mark.parametrize("ttype", ALIGNED + [pytest.param(t, marks=pytest.mark.slow) for t in CODEBOOK + PAIRS])
def test_word_loads_read_the_same_words(ttype):
    """`word_loads.word_loads` (what the GEMV schedule applies first) turns the 4 byte loads of each weight word of
    aligned formats (Q4_1, NVFP4, IQ4_XS, Q2_K, Q4_K: one field, 4-byte-aligned offsets in blocks of a multiple of
    4 bytes), and of each grid word of the codebook formats (IQ2_XXS ... IQ1_M: 4 bytes at byte 0 or 4 of an entry
    of 4 or 8; IQ1's int8 table included), into one load of a uint32 view, and those of blocks of an even size (Q8_0,
    Q4_0, Q5_0, IQ4_NL, Q3_K, Q6_K) into two 2-byte loads (a uint16 view of the buffer), in mul_mat, mul_mat_id (x
    shared; one row per slot) and
    the grouped mul_mat_id (both layouts; repeated experts, so some pairs lead no group and load nothing); the
    rewritten definitions built for llvm give
    the same outputs bit for bit. The rewrite only fires where the analyzer proves the offset's alignment (below)."""
    K = _k(ttype)
    funcs = _int_funcs(ttype, K)
    words = {n: word_loads.word_loads(f) for n, f in funcs.items()}
    for name in ("mul_mat", "mul_mat_id", "mul_mat_id3", "grouped", "grouped3"):
        wide = "_u32[" if ttype in ALIGNED + CODEBOOK else "_u16["   # 32-bit views; 16-bit views
        assert wide in words[name].script() and wide not in funcs[name].script(), name
    plain, vec = (tvm.compile(_module(fs), target="llvm") for fs in (funcs, words))
    B, T = _block(ttype), 5
    (packed, w), (epacked, _ew) = _data(ttype, (N, K), 1), _data(ttype, (X, N, K), 2)
    gpacked, _gw = _data(ttype, (XG, N, K), 3)
    x = _x(T, K, 3, w.astype(np.float64))
    q, d = _quantize(_quantizer(K, B), x, B)
    ids = np.stack([np.random.default_rng(4).permutation(X)[:USED] for _ in range(T)]).astype(np.int32)
    gids = _ids(T, 6, False)
    gids[1] = gids[0]   # a repeated pair of experts: pairs that lead no group (their words are never loaded)
    q3, d3 = np.repeat(q[:, None], USED, 1), np.repeat(d[:, None], USED, 1)
    for name, shape, args in (("mul_mat", (T, N), (q, d, *packed)), ("mul_mat_id", (T, USED, N), (q, d, ids, *epacked)),
                              ("mul_mat_id3", (T, USED, N), (q3, d3, ids, *epacked)),
                              ("grouped", (T, USED, N), (q, d, gids, *gpacked)),
                              ("grouped3", (T, USED, N), (q3, d3, gids, *gpacked))):
        a, b = _run(plain, name, shape, *args), _run(vec, name, shape, *args)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)) and np.abs(a).max() > 0, name


_E_LOADS = {"bytes": r"\be_ptr\[", "u16 pairs": r"\(\(ushort\*\)e_ptr\)\[", "u32 words": r"\(\(uint\*\)e_ptr\)\[",
            "u128 groups": r"\*\(uint4\*\)\(\(\(uint\*\)e_ptr\) \+ "}


@pytest.mark.parametrize("ttype", ["Q4_K"] + [pytest.param(t, marks=pytest.mark.slow) for t in ("Q8_0", "IQ2_XXS")])
def test_grouped_kernel_loads_weight_words_under_the_leader_branch(ttype):
    """sm_90: the grouped integer mul_mat_id (the routed experts of verify / prefill) reads the expert's bytes as the
    ungrouped mul_mat_id does: in their CUDA sources the same number of byte loads, 16-bit pair loads and 32-bit word
    loads of the expert buffer (Q4_K: its qs as words; Q8_0, IQ2_XXS: pairs), and in the grouped
    kernel every one of them inside the block-uniform leader test (a pair that leads no group loads nothing), one
    test around the block's whole body and none per load (gemv._leaders_only)."""
    from test_cuda_kernels import _loads_outside_leader_branch, _one_leader_test

    K = 512 if by_ggml_type(ttype).block == 256 else _k(ttype)
    B, W, T = _block(ttype), cuda.GROUP_ROWS, te.var("T", I64)
    ebufs, ew = _weight(ttype, (XG, N, K), "e")
    xq = te.placeholder([T, tirx.IntImm(I64, K // 4)], "int32", name="xq")
    xd = te.placeholder([T, tirx.IntImm(I64, K // B)], "float32", name="xd")
    ids = te.placeholder([T, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = te.placeholder([T, tirx.IntImm(I64, USED), tirx.IntImm(I64, W + 1)], "int32", name="groups")
    fs = {"grouped": te.create_prim_func([xq, xd, ids, groups, *ebufs,
                                          int8.mul_mat_id_grouped(ew, xq, xd, ids, groups)]),
          "mul_mat_id": te.create_prim_func([xq, xd, ids, *ebufs, int8.mul_mat_id(ew, xq, xd, ids)])}
    scheduled = {n: _scheduled(f)[0] for n, f in fs.items()}
    src = _cuda_source(scheduled, make_target("cuda", ["sm_90"]))
    grouped = src[src.index("grouped_kernel(", src.index("grouped_kernel(") + 1):]
    grouped = grouped[:grouped.index("\n}\n") + 3]
    ungrouped = src[src.index("mul_mat_id_kernel(", src.index("mul_mat_id_kernel(") + 1):]
    ungrouped = ungrouped[:ungrouped.index("\n}\n") + 3]
    counts = [{k: len(re.findall(r, body)) for k, r in _E_LOADS.items()} for body in (grouped, ungrouped)]
    assert counts[0] == counts[1], (ttype, counts)
    assert counts[0]["u16 pairs"] + counts[0]["u32 words"] + counts[0]["u128 groups"] > 0, (ttype, counts)
    assert _loads_outside_leader_branch(grouped) == 0 and _one_leader_test(grouped), ttype


def _grouped_int8(ttype, K, layout, dp4a=True):
    """The integer grouped mul_mat_id over a symbolic T (x shared: "x"; one row per slot: "x3"); `dp4a` False for
    llvm."""
    B, W, T = _block(ttype), cuda.GROUP_ROWS, te.var("T", I64)
    ebufs, ew = _weight(ttype, (XG, N, K), "e")
    lead = [T] if layout == "x" else [T, tirx.IntImm(I64, USED)]
    xq = te.placeholder([*lead, tirx.IntImm(I64, K // 4)], "int32", name="xq")
    xd = te.placeholder([*lead, tirx.IntImm(I64, K // B)], "float32", name="xd")
    ids = te.placeholder([T, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = te.placeholder([T, tirx.IntImm(I64, USED), tirx.IntImm(I64, W + 1)], "int32", name="groups")
    return te.create_prim_func([xq, xd, ids, groups, *ebufs, int8.mul_mat_id_grouped(ew, xq, xd, ids, groups, dp4a)])


@pytest.mark.parametrize("ttype,K", [("Q4_K", 512), ("Q8_0", 352), pytest.param("Q8_0", 1024, marks=pytest.mark.slow),
                                     pytest.param("Q6_K", 512, marks=pytest.mark.slow)])
def test_grouped_kernel_loads_member_words_as_int4(ttype, K):
    """sm_90, the grouped integer mul_mat_id (symbolic T, both x layouts): where K is whole warp steps (a multiple
    of 512 quants), a lane's 4 activation words of a step are one 128-bit load per member row (the XQ_GROUP stage
    as a register tile, gemv.py), GROUP_ROWS x K / 512 of them, each directly under its own member test
    `if (0 <= groups_ptr[e])` with the row taken from that same entry e (a row that is no member loads nothing), and
    no scalar activation load is left; a K of partial steps keeps the scalar loads (the stage inlined); the group
    entries (member rows, leader test) come from one register copy per thread."""
    from test_cuda_kernels import _loads_outside_leader_branch

    tgt = make_target("cuda", ["sm_90"])
    for layout in ("x", "x3"):
        src = _cuda_source({"grouped": _scheduled(_grouped_int8(ttype, K, layout))[0]}, tgt)
        body = src[src.index("grouped_kernel(", src.index("grouped_kernel(") + 1):]
        body = body[:body.index("\n}\n") + 3]
        lines = body.splitlines()
        at = [i for i, line in enumerate(lines) if "*(int4*)(xq_ptr + " in line]
        if K % 512:
            assert not at and "xq_ptr[" in body, (ttype, K, layout)
            continue
        assert len(at) == cuda.GROUP_ROWS * (K // 512) and "xq_ptr[" not in body, (ttype, K, layout, len(at))
        for i in at:
            test = re.fullmatch(r"\s*if \(0 <= (groups_(?:local_)?ptr\[.*\])\) \{", lines[i - 1])
            assert test and f"(int64_t){test.group(1)}" in lines[i], (ttype, layout, lines[i - 1], lines[i])
        assert _loads_outside_leader_branch(body) == 0, (ttype, layout)
        # the group entries read once per thread into registers (gemv._group_entries_once), not once per step;
        # besides, the block's leader test (gemv._leaders_only)
        assert body.count("groups_ptr[") == 2 and "groups_local_ptr[" in body, (ttype, layout)


@pytest.mark.parametrize("ttype", ["Q4_K", "Q8_0"] + [pytest.param(t, marks=pytest.mark.slow)
                                                      for t in ("Q6_K", "IQ2_XXS", "MXFP4", "IQ1_M")])
def test_grouped_member_words_stage_changes_no_bit(ttype):
    """The grouped integer mul_mat_id reads its member rows' activation words through a stage of their own
    (XQ_GROUP, which the GEMV keeps as its register tile of 128-bit loads). Built for llvm, both x layouts, distinct
    and repeated experts (pairs that lead no group, windows past T): with the stage, with it inlined, and gathered
    (expert_gather), it gives the ungrouped mul_mat_id's outputs bit for bit (each sum adds the same terms in the same
    order; the ungrouped kernel reads xq directly)."""
    from tvm import s_tir

    from nextn.compiler.lower.cuda.te import XQ_GROUP

    K, T, B = _k(ttype), 6, _block(ttype)
    Tv = te.var("T", I64)
    ebufs, ew = _weight(ttype, (XG, N, K), "e")
    ids = te.placeholder([Tv, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = cuda.expert_groups(ids, cuda.expert_leaders(ids))
    funcs = {}
    for layout, lead in (("x", [Tv]), ("x3", [Tv, tirx.IntImm(I64, USED)])):
        xq = te.placeholder([*lead, tirx.IntImm(I64, K // 4)], "int32", name="xq")
        xd = te.placeholder([*lead, tirx.IntImm(I64, K // B)], "float32", name="xd")
        y = cuda.expert_gather(int8.mul_mat_id_grouped(ew, xq, xd, ids, groups, dp4a=False), groups)
        f = te.create_prim_func([xq, xd, ids, *ebufs, y])
        sch = s_tir.Schedule(f)
        sch.compute_inline(sch.get_sblock(XQ_GROUP))
        assert XQ_GROUP in f.script() and XQ_GROUP not in sch.mod["main"].script()
        funcs[layout], funcs[layout + "_inlined"] = f, sch.mod["main"]
        funcs[layout + "_ungrouped"] = te.create_prim_func([xq, xd, ids, *ebufs,
                                                            int8.mul_mat_id(ew, xq, xd, ids, dp4a=False)])
    lib = tvm.compile(_module(funcs), target="llvm")
    epacked, ew64 = _data(ttype, (XG, N, K), 3)
    x = _x(T, K, 8, ew64[0].astype(np.float64))
    q, d = _quantize(_quantizer(K, B), x, B)
    q3, d3 = (np.ascontiguousarray(np.repeat(a[:, None], USED, 1)) for a in (q, d))
    for repeat in (False, True):
        ids_ = _ids(T, 9, repeat)
        for layout, (xq_, xd_) in (("x", (q, d)), ("x3", (q3, d3))):
            a, b, c = (_run(lib, layout + sfx, (T, USED, N), xq_, xd_, ids_, *epacked)
                       for sfx in ("", "_inlined", "_ungrouped"))
            assert np.array_equal(a.view(np.uint32), c.view(np.uint32)) and np.abs(a).max() > 0, (layout, repeat)
            assert np.array_equal(b.view(np.uint32), c.view(np.uint32)), (layout, repeat)


def test_signed_codebooks_have_no_zero_byte():
    """int8._signed negates a grid byte g as (g ^ 0xFF) + 1 inside a 32-bit word, which carries into the next byte
    for g = 0: every entry of the signed codebooks (gguf-py's tables, what the `.grid` buffers hold) is in 1 .. 127,
    and the unsigned ones are exactly the formats without sign fields (IQ1_S / IQ1_M)."""
    from nextn.common.quant import FORMATS

    assert set(int8.SIGNED_GRID) | {"iq1_s", "iq1_m"} == {k for k, f in int8.FORMATS.items() if f.tables}
    for kind in int8.SIGNED_GRID:
        grid = dict(FORMATS[kind].tables())[".grid"]
        assert grid.dtype == np.uint8 and grid.min() >= 1 and grid.max() <= 127, kind


def test_signed_word_negates_bytes_by_bit():
    """int8._signed on every 4-byte pattern of sign bits and grid bytes 1, 8, 43, 62, 127 against numpy's per-byte
    negation, built for llvm."""
    g = np.array([[1, 8, 43, 127], [62, 1, 127, 8]], np.uint8)
    gw = g.view("<u4").reshape(-1)
    signs = np.arange(256, dtype=np.uint8)
    G = te.placeholder([tirx.IntImm(I64, len(gw))], "uint32", name="g")
    S = te.placeholder([tirx.IntImm(I64, 256)], "uint8", name="s")
    out = []
    for bit0 in (0, 4):
        out.append(te.compute((len(gw), 256), lambda i, j: int8._signed(G[i], S[j], bit0), name=f"y{bit0}"))
    f = tvm.compile(_module({"f": te.create_prim_func([G, S, *out])}), target="llvm")["f"]
    got = [tvm.runtime.empty((len(gw), 256), "int32") for _ in out]
    f(tvm.runtime.tensor(gw), tvm.runtime.tensor(signs), *got)
    for bit0, y in zip((0, 4), got):
        neg = (signs[None, :, None] >> (bit0 + np.arange(4))[None, None, :]) & 1
        want = np.where(neg == 1, -g.astype(np.int8)[:, None, :], g.astype(np.int8)[:, None, :])
        assert np.array_equal(y.numpy().view(np.int8).reshape(len(gw), 256, 4), want), bit0


@pytest.mark.parametrize("table", ["iq4", "e2m1x2"])
def test_byte_perm_lookup_gives_the_table(table):
    """int8._lut16 (the 16-entry table formats' words, IQ4_NL / IQ4_XS / MXFP4 / NVFP4) on every 16-bit pattern of
    the low and of the high half-word (so every nibble value at every position), low (shift 0) and high (shift 4)
    nibbles, built for llvm (`byte_perm`'s shifts and selects, what CUDA's prmt computes for selector nibbles 0..7):
    numpy's table[nibble] per byte, bit for bit."""
    from nextn.compiler.quant import iq4, mxfp4

    tab = np.array(iq4.KVALUES if table == "iq4" else mxfp4.E2M1X2, np.int8)
    half = np.arange(1 << 16, dtype=np.uint32)
    rng = np.random.default_rng(5)
    u = np.concatenate([half | (rng.permutation(half) << np.uint32(16)),
                        (half << np.uint32(16)) | rng.permutation(half)])
    U = te.placeholder([tirx.IntImm(I64, len(u))], "uint32", name="u")
    out = [te.compute((len(u),), lambda i: int8._lut16(U[i], tab, tirx.const(sh, "int32"), False), name=f"y{sh}")
           for sh in (0, 4)]
    f = tvm.compile(_module({"f": te.create_prim_func([U, *out])}), target="llvm")["f"]
    got = [tvm.runtime.empty((len(u),), "uint32") for _ in out]
    f(tvm.runtime.tensor(u), *got)
    for sh, y in zip((0, 4), got):
        nib = (u[:, None] >> (8 * np.arange(4) + sh).astype(np.uint32)) & 15
        assert np.array_equal(y.numpy().view(np.int8).reshape(-1, 4), tab[nib]), sh


@pytest.mark.parametrize("ttype", ["IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4"])
def test_table_formats_look_up_with_prmt_on_sm90(ttype):
    """The sm_90 GEMV of the 16-entry table formats looks its quants up with `__byte_perm` (PTX prmt.b32, five per
    word pair in the loop body's steady state: at least one per word) and keeps no 64-bit table constant or shift
    (the select-and-shift lookup's)."""
    from tvm.support import nvcc

    from nextn.compiler.gpu_build import build_scope

    fs = _cuda_funcs(ttype, 4096, 1)
    g, tgt = _scheduled(fs["mul_mat"])
    src = _cuda_source({"mul_mat": g}, tgt)
    assert "__byte_perm(" in src and "(int64_t)" not in src[src.index("mul_mat_kernel("):], ttype
    with build_scope("cuda", ["sm_90"]), tgt:
        ptx = nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc").decode()
    words = 4096 // 4 // gemv.LANES   # a lane's words of the row
    assert len(re.findall(r"\bprmt\.b32\b", ptx)) >= words and not re.search(r"\b(shl|shr)\.b64\b", ptx), ttype


def test_word_loads_need_a_provably_aligned_offset():
    """The same Block.u32 read, annotated WORD_LOAD: at byte 4 + 4i of 36-byte blocks it becomes one load of a
    uint32 view, at byte 2 + 4i of 34-byte blocks (Q8_0's qs) two 2-byte loads of a uint16 view, at byte 1 + 4i of
    17-byte blocks (MXFP4's) it stays 4 byte loads; all read the little-endian words numpy reads."""
    from nextn.compiler.lower.cuda.te import WORD_LOAD
    from nextn.compiler.quant.te import Block

    for size, at, words, halves in ((34, 2, 0, 2), (36, 4, 1, 0), (17, 1, 0, 0)):
        raw = te.placeholder([tirx.IntImm(I64, 3), tirx.IntImm(I64, 4 * size)], "uint8", name="raw")
        # word j: block j // 4, bytes at + 4 (j % 4) .. + 3 of it
        y = te.compute((3, 16), lambda n, j: Block(raw, (n, j * 8), 32, size).u32(at + (j * 8) % 32 // 2),
                       name="y", attrs={WORD_LOAD: 1})
        f = te.create_prim_func([raw, y])
        g = word_loads.word_loads(f)
        assert g.script().count("raw_u32[") == words and g.script().count("raw_u16[") == halves, size
        data = np.random.default_rng(size).integers(0, 256, (3, 4 * size), dtype=np.uint8)
        offs = np.array([j // 4 * size + at + 4 * (j % 4) for j in range(16)])
        want = np.stack([data[:, o:o + 4].copy().view("<u4")[:, 0] for o in offs], 1)
        for fn in (f, g):
            got = tvm.runtime.empty((3, 16), "uint32")
            tvm.compile(_module({"f": fn}), target="llvm")["f"](tvm.runtime.tensor(data), got)
            assert np.array_equal(got.numpy(), want), size


def test_word_vec_needs_16_byte_aligned_groups():
    """word_loads marks a WORD_LOAD block of int32 words WORD_VEC (a group's 4 words one 128-bit load in the GEMV)
    only where words 4g .. 4g + 3 are 16 consecutive bytes at a 16-byte-aligned offset: blocks of 144 bytes with the
    words at byte 16 (Q4_K's qs) and of 32 at byte 0 yes; at byte 20, or in blocks of 36 bytes, no. The marked
    definitions built for llvm read numpy's words."""
    from nextn.compiler.lower.cuda.te import WORD_LOAD, WORD_VEC
    from nextn.compiler.quant.te import Block

    for size, at, vec in ((144, 16, True), (32, 0, True), (144, 20, False), (36, 0, False)):
        raw = te.placeholder([tirx.IntImm(I64, 3), tirx.IntImm(I64, 4 * size)], "uint8", name="raw")
        # word w: block w // 4, bytes at + 4 (w % 4) .. + 3 of it
        y = te.compute((3, 16), lambda n, w: tirx.reinterpret("int32", Block(raw, (n, w * 4), 16, size).u32(
            at + (w * 4) % 16)), name="y", attrs={WORD_LOAD: 1})
        g = word_loads.word_loads(te.create_prim_func([raw, y]))
        assert (WORD_VEC in g.script()) == vec and "raw_u32[" in g.script(), (size, at)
        data = np.random.default_rng(size + at).integers(0, 256, (3, 4 * size), dtype=np.uint8)
        offs = np.array([w // 4 * size + at + 4 * (w % 4) for w in range(16)])
        want = np.stack([data[:, o:o + 4].copy().view("<i4")[:, 0] for o in offs], 1)
        got = tvm.runtime.empty((3, 16), "int32")
        tvm.compile(_module({"f": g}), target="llvm")["f"](tvm.runtime.tensor(data), got)
        assert np.array_equal(got.numpy(), want), (size, at)


def test_quantizer_sm90_zeroes_tiny_blocks_before_dividing():
    """The sm_90 quantizer's source tests amax against AMAX_MIN (2^-118, printed 0x1p-118f) before each division,
    which takes the tested value, never amax itself; its PTX under TVM's nvcc flags (--use_fast_math) is the op
    sequence `_fast_math_rows` models: abs.ftz, max.ftz, setp.lt.ftz against 0f04800000 (2^-118), div.rn.ftz (d
    and 127 / amax), mul.ftz, cvt.rni without ftz."""
    from tvm.support import nvcc

    from nextn.compiler.gpu_build import build_scope

    T = te.var("T", I64)
    x = te.placeholder([T, tirx.IntImm(I64, 256)], "float32", name="x")
    f, tgt = _scheduled(te.create_prim_func([x, *int8.quantize_rows(x, 32, cuda=True)]))
    src = _cuda_source({"quantize": f}, tgt)
    body = src[src.index("quantize_kernel(", src.index("quantize_kernel(") + 1):]
    assert float(activation.AMAX_MIN) == float.fromhex("0x1p-118")
    assert body.count("act_amax_local_ptr[0] < 0x1p-118f") >= 2 and "__fdiv_rn(act_amax" not in body
    assert body.count("__fdiv_rn(") >= 2
    with build_scope("cuda", ["sm_90"]), tgt:
        ptx = nvcc.compile_cuda(src, target_format="ptx", arch="sm_90", compiler="nvcc").decode()
    k = ptx[ptx.index(".entry quantize_kernel"):]
    ops = lambda op: len(re.findall(rf"^\s+{re.escape(op)}\s", k, re.M))   # noqa: E731
    assert re.search(r"setp\.lt\.ftz\.f32\s+%p\d+, %f\d+, 0f04800000;", k), k
    assert ops("div.rn.ftz.f32") == 2 and ops("div.rn.f32") == 0 and ops("div.approx.ftz.f32") == 0
    assert ops("abs.ftz.f32") >= 1 and ops("max.ftz.f32") >= 1 and ops("mul.ftz.f32") == 4
    assert ops("cvt.rni.f32.f32") == 4


def test_rocm_quantizer_divides_correctly_rounded():
    """ROCm's quantizer keeps plain `/` (`int8._div`): TVM compiles ROCm kernels through LLVM's AMDGPU backend (no
    hipcc, no fast-math flags), which lowers an f32 fdiv without afn / arcp / !fpmath to the correctly rounded
    sequence (v_div_scale, v_rcp, Newton steps as FMAs, v_div_fmas, v_div_fixup) and nearbyint to v_rndne_f32 (round
    half to even): the gfx942 code object holds one v_div_fixup_f32 per division (d = amax / 127, 127 / amax), no
    bare reciprocal, and a v_rndne_f32 per quant of a lane's word, so q is the CPU's (numpy's x * (127 / amax),
    rounded half to even) as on CUDA with __fdiv_rn."""
    from nextn.compiler.gpu_build import build_scope, rocm_target

    T = te.var("T", I64)
    x = te.placeholder([T, tirx.IntImm(I64, 256)], "float32", name="x")
    tgt = rocm_target("gfx942")
    sch = int8.schedule_quantize(te.create_prim_func([x, *int8.quantize_rows(x, 32)]), tgt)
    with build_scope("rocm", ["gfx942"]), tgt:
        lib = tvm.compile(_module({"q": sch.mod["main"].with_attr("tirx.is_scheduled", True)}), target=tgt)
    asm = "\n".join(m.inspect_source("asm") for m in lib.mod.imports)
    count = lambda op: len(re.findall(rf"\b{op}(_e32|_e64)?\s", asm))   # noqa: E731
    assert count("v_div_fixup_f32") == count("v_rcp_f32") == count("v_div_fmas_f32") == 2, asm[:2000]
    assert count("v_rndne_f32") == 4


@pytest.mark.parametrize("ttype,route", [("Q8_0", 32), ("Q4_K", 256), ("Q6_K", 256), ("Q5_K", 256), ("Q4_0", 32),
                                         ("Q4_1", 32), ("Q5_0", 32), ("Q5_1", 32), ("IQ4_NL", 32), ("MXFP4", 32),
                                         ("NVFP4", 32), ("IQ4_XS", 256), ("Q2_K", 256), ("Q3_K", 256), ("IQ2_XXS", 256),
                                         ("IQ3_S", 256), ("BF16", None), ("F16", None), ("IQ1_S", 256),
                                         ("IQ1_M", 256)])
def test_route_by_format_and_exact_matmul(ttype, route):
    """The integer formats take the integer route with the CPU's row block for them ("q8_0" per 32 for the
    32-value block formats and NVFP4, "q8" per 256 for the K-quants, IQ4_XS and the codebook formats); the float
    formats, and every format under --exact-matmul (quantize False), the float one; a K that is not whole blocks of
    both the rows and the weight, the float one too."""
    kind = _kind(ttype)
    assert int8.route(kind, 512, True) == route
    assert int8.route(kind, 512, False) is None
    whole = route == 32 and by_ggml_type(ttype).block == 32
    assert int8.route(kind, 512 + 32, True) == (32 if whole else None)


def _activations(art: str) -> dict:
    import json
    import os

    m = json.load(open(os.path.join(art, "manifest.json")))
    return {w["tensor"]: w["activation"] for w in m["buffer_plan"]["weights"]}


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["Q4_K_M", "Q8_0", "MXFP4_MOE", "IQ2_M"])
def test_cuda_build_quantizes_the_matmuls_the_cpu_quantizes(compiled, quant):
    """The sm_90 build of a fixture marks in its manifest (buffer_plan activation, gpu_kernels) exactly the weights
    whose matmuls the default llvm build quantizes, with the same row formats ("q8" per 256 for the K-quants, IQ4_XS
    and the codebook format IQ2_S, "q8_0" per 32 for Q8_0 and MXFP4): the two default builds compute the
    same products; under --exact-matmul none."""
    import json
    import os

    import gguf

    from conftest import FIXTURES, G4
    from nextn.common.compile_options import CompileOptions

    model = G4 / f"tiny-glm4moe-{quant}.gguf"
    if not model.exists():
        model = FIXTURES / "quants" / f"tiny-glm4moe-{quant}.gguf"
    kinds = {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(model).tensors}
    cpu = _activations(compiled(f"g4-{quant}", model))
    gpu_dir = compiled(f"g4-{quant}-cuda90", model, target="cuda", arches=["sm_90"])
    gpu = _activations(gpu_dir)
    assert any(cpu.values())
    assert gpu == cpu
    assert set(v for v in gpu.values() if v) == {"Q8_0": {"q8_0"}, "MXFP4_MOE": {"q8_0"}, "IQ2_M": {"q8"}}.get(
        quant, {"q8", "q8_0"})
    assert {kinds[t] for t, v in gpu.items() if v} >= ({"iq2_s", "iq4_xs"} if quant == "IQ2_M" else set())
    m = json.load(open(os.path.join(gpu_dir, "manifest.json")))
    gk = m["gpu_kernels"]
    assert (gk["activation_quant"], gk["dot"]) == ("q8", "cuda")
    check_kernel_record(gk["kernels"], model)
    assert any("_mma_" in k for k in gk["kernels"])   # prefill's quantized matmuls on tensor cores (sm_90)
    assert not CompileOptions.from_manifest(m).exact_matmul
    if quant in ("Q4_K_M", "Q8_0"):
        exact = compiled(f"g4-{quant}-cuda90-exact", model, target="cuda", arches=["sm_90"], exact_matmul=True)
        assert not any(_activations(exact).values())
        assert CompileOptions.from_manifest(json.load(open(os.path.join(exact, "manifest.json")))).exact_matmul


def check_kernel_record(kernels: dict, model) -> None:
    """The per-kernel record of a default (integer-route) sm_90 build (manifest `gpu_kernels.kernels`, or
    kernel_report.kernel_summary of the scheduled module): every activation quantizer is `cuda:quantize`, a warp per
    activation block in blocks of 4 warps, passed no weight; every matmul the GEMV's 4 warps per block, but prefill's
    tensor-core tiles (cuda/mma.py, where the build has them: pre-scheduled, blocks of 128 threads); the LM head's
    weight bytes are output.weight's bytes in the GGUF (with its tables for a codebook type), and its launch one
    block per 4 weight rows (N / 4 blocks at T = 1), not one per output element."""
    import gguf

    from nextn.common.quant import FORMATS

    t = {x.name: x for x in gguf.GGUFReader(model).tensors}["output.weight"]
    kind = t.tensor_type.name.lower()
    head = int(t.n_bytes) + (sum(a.nbytes for _s, a in FORMATS[kind].tables()) if kind in FORMATS else 0)
    n_vocab = int(t.shape[-1])
    quant = {k: v for k, v in kernels.items() if v["rule"] == "cuda:quantize"}
    assert quant and all(v["weight_bytes"] == 0 and len(v["launches"]) == 1 and "block 32 × 4 (T=1: " in
                         v["launches"][0] for v in quant.values()), quant
    gemv_ = {k: v for k, v in kernels.items() if "mul_mat" in k and "_mma_" not in k}
    assert gemv_ and all(v["rule"] == "cuda:gemv" and all("block 32 × 4 (T=1: " in ln for ln in v["launches"])
                         for v in gemv_.values()), gemv_
    tiles = {k: v for k, v in kernels.items() if "_mma_" in k}
    assert all(v["rule"] == "pre-scheduled" and all("block 128 (T=1: " in ln for ln in v["launches"])
               for v in tiles.values()), tiles
    heads = [v for v in gemv_.values() if v["weight_bytes"] == head]
    assert heads and all(f"(T=1: {n_vocab // gemv.WARPS} × 128)" in ln for v in heads for ln in v["launches"]), heads


@pytest.mark.slow
def test_kernel_record_of_the_integer_route():
    """kernel_report.kernel_summary (the manifest's `gpu_kernels.kernels`) of the IQ2_M fixture's default sm_90
    module, scheduled without code generation (`check_kernel_record`), and the schedule report's text lines are its
    launch texts."""
    from conftest import FIXTURES
    from nextn.compiler.graphs import SPLIT_L, build_graphs, weight_kinds
    from nextn.compiler.kernel_report import kernel_report, kernel_summary
    from nextn.compiler.loader.model_files import ModelFiles
    from nextn.compiler.lower.pipeline import phases
    from nextn.compiler.lower.to_relax import build_module
    from nextn.schedules.gpu import ScheduleGPU, last_report

    model = FIXTURES / "quants" / "tiny-glm4moe-IQ2_M.gguf"
    mf = ModelFiles(str(model), None, load_mtp=False)
    graphs = build_graphs(mf, mf.has_nextn)
    mod = build_module(list(graphs.values()), weight_kinds(mf, graphs.values()), form="gpu", split_l=SPLIT_L,
                       gpu_int8="cuda")
    tgt = make_target("cuda", ["sm_90"])
    with tgt:
        for _name, passes in phases(tgt, ScheduleGPU(tgt, cuda.RULES))[:3]:
            mod = tvm.transform.Sequential(passes)(mod)
    check_kernel_record(kernel_summary(kernel_report(mod, last_report())), model)
