"""The `int8 kernels` device-check stage's inputs, built here (bench/bundle.py): the GPU integer-route kernels alone
(compiler/lower/cuda/int8.py: `quantize_rows` with its sums of 16 quants and the dynamic-T `mul_mat` GEMV that
reads them, scheduled as a model build schedules them) for every format on the route (`TYPES`) in one library, and per format random weights, activation
rows and what the CPU computes from them: the int8 rows of `nextn.common.quant.activation` (and numpy's sums of
each 16 of their quants) and the x86 kernel's product
(compiler/lower/x86, the default llvm artifact's matmul). On the device the kernels get the same float rows, so no
upstream rounding can move a quantization step: the rows must come out bit for bit and the products within
device_refs.GPU_TOL (float32 summation order only; tests/test_cuda_int8.py holds the definitions to the same on
llvm). Needs the compiler: never bundled.
"""
from __future__ import annotations

import os

import numpy as np

TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "NVFP4", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
         "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
N = 96                                    # weight rows: not a multiple of a thread block's 4 ... and 3 blocks of 32
ROWS = (1, 4, 9)                          # decode, a verify of 4 rows, two row tiles and one row
# float16 scale fields (ggml-common.h block_*): set to small positive values; every other byte random
F16_AT = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0], "IQ4_XS": [0],
          "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ2_XXS": [0], "IQ2_XS": [0],
          "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0]}
E8M0_AT = {"MXFP4": 0}                    # the e8m0 exponent byte: 2^(e - 128) kept near 2^-5 .. 2^1


def _k(ttype: str) -> int:
    """Row length: 13 blocks of 32 (not whole warp steps of 256 quants), 7 of 64 (NVFP4), 2 super-blocks."""
    import gguf

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]][0]
    return {32: 13 * 32, 64: 7 * 64}.get(block, 512)


K = {t: _k(t) for t in TYPES}


def _raw(ttype: str, rng) -> np.ndarray:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]]
    raw = rng.integers(0, 256, (N * K[ttype] // block, size), dtype=np.uint8)
    for off in F16_AT.get(ttype, []):
        raw[:, off:off + 2] = (rng.random(len(raw)) * 0.01 + 1e-3).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if ttype in E8M0_AT:
        raw[:, E8M0_AT[ttype]] = rng.integers(123, 130, len(raw))
    if ttype == "IQ1_M":   # the float16 d is the top nibbles of the 4 scale words at bytes 48 .. 55
        d = (rng.random(len(raw)) * 0.01 + 1e-3).astype(np.float16).view(np.uint16)
        for i in range(4):
            hi = 49 + 2 * i
            raw[:, hi] = (raw[:, hi] & 0x0F) | (((d >> (4 * i)) & 0xF) << 4).astype(np.uint8)
    return raw.reshape(N, K[ttype] // block * size)


def _functions(ttype: str, target, dp4a: bool, cuda: bool) -> dict:
    from tvm import te, tirx

    from nextn.common.quant import FORMATS, by_ggml_type
    from nextn.compiler.lower import cuda as gpu
    from nextn.compiler.lower.cuda import int8
    from nextn.compiler.lower.te_ops import QWeight

    kind = by_ggml_type(ttype).kind
    k, B = K[ttype], int8.row_block(kind)
    i64 = lambda v: tirx.IntImm("int64", v)   # noqa: E731
    T = te.var("T", "int64")
    bufs = [te.placeholder([i64(int(s)) for s in shape], dt, name="w" + sfx.replace(".", "_"))
            for sfx, dt, shape in FORMATS[kind].buffers((N, k))]
    w = QWeight(kind, bufs, (N, k))
    x = te.placeholder([T, i64(k)], "float32", name="x")
    xq = te.placeholder([T, i64(k // 4)], "int32", name="xq")
    xd = te.placeholder([T, i64(k // B)], "float32", name="xd")
    xs = te.placeholder([T, i64(k // int8.SUM_QUANTS)], "int32", name="xs")
    funcs = {f"quantize_{ttype}": te.create_prim_func([x, *int8.quantize_rows(x, B, cuda, sums=True)]),
             f"mul_mat_{ttype}": te.create_prim_func([xq, xd, xs, *bufs, int8.mul_mat(w, xq, xd, dp4a, xs=xs)])}
    if target.kind.name != "cuda":
        return funcs
    out = {}
    for name, f in funcs.items():
        sch = (int8.schedule_quantize if name.startswith("quantize") else gpu.schedule)(f, target)
        out[name] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    return out


def build(out_dir: str, target_name: str, arches=None, seed: int = 0, types=TYPES) -> dict:
    """Write `out_dir`/int8_kernels.so and cases.npz for the formats `types` (default: every format on the route);
    returns the plan's `int8_kernels` entry (paths relative to `out_dir`'s parent's parent, the bundle:
    art/int8/...)."""
    import tvm

    from nextn.common.quant import activation, by_ggml_type
    from nextn.compiler.gpu_build import build_scope
    from nextn.compiler.lower import x86
    from nextn.compiler.lower.cuda import int8
    from nextn.compiler.lower.cuda.int8 import has_dot4
    from nextn.compiler.target import make_target

    os.makedirs(out_dir, exist_ok=True)
    tgt = make_target(target_name, arches or None)
    cuda = target_name == "cuda"
    funcs = {}
    for t in types:
        funcs |= _functions(t, tgt, has_dot4(tgt), cuda)
    mod = tvm.IRModule({tvm.ir.GlobalVar(n): f.with_attr("global_symbol", n) for n, f in funcs.items()})
    with build_scope(target_name, list(arches or [])) if cuda else _null(), tgt:
        lib = tvm.compile(mod, target=tgt)
    lib.export_library(os.path.join(out_dir, "int8_kernels.so"))
    cpu = make_target("llvm")
    rng = np.random.default_rng(seed)
    data = {}
    for t in types:
        kind = by_ggml_type(t).kind
        raw = _raw(t, rng)
        kern = tvm.compile(tvm.IRModule({"main": x86.matmul(kind, N, K[t])}), target=cpu).mod["main"]
        for i, b in enumerate(by_ggml_type(t).pack(raw, (N, K[t]))):
            data[f"{t}/w{i}"] = np.ascontiguousarray(b)
        for T in ROWS:
            x = rng.standard_normal((T, K[t])).astype(np.float32)
            x[0, :32] = 0.0   # a zero block
            q, d = activation.quantize_q8_0(x) if int8.row_block(kind) == 32 else activation.quantize(x)[:2]
            y = tvm.runtime.tensor(np.zeros((T, N), np.float32))
            kern(tvm.runtime.tensor(raw), *[tvm.runtime.tensor(np.ascontiguousarray(a))
                                            for a in x86.activation_rows(kind, x)], y)
            xs = q.reshape(T, -1, int8.SUM_QUANTS).astype(np.int32).sum(-1, dtype=np.int32)
            data |= {f"{t}/{T}/x": x, f"{t}/{T}/xq": np.ascontiguousarray(q).view(np.int32), f"{t}/{T}/xd": d,
                     f"{t}/{T}/xs": xs, f"{t}/{T}/y": y.numpy()}
    np.savez_compressed(os.path.join(out_dir, "cases.npz"), **data)
    return {"library": "int8_kernels.so", "cases": "cases.npz", "types": list(types), "rows": list(ROWS), "N": N,
            "K": dict(K)}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False
