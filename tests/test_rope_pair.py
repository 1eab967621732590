"""The GPU forms' rope kernel (compiler/lower/rope_pair.py): a layer's q and k, with their per-head RMS norms, in one
kernel where there were four (two norms, two ropes).

- The "gpu-emulated" build (the same loops, serial threads, llvm) against the TE chain the other forms run
  (te_ops.rms_norm, mul, rope_ext built for llvm), NEOX and NORM pairs, a partial rotation (n_rot < D), YaRN on and
  off: bit for bit without the norms (the same rope expressions), and with them on rows whose sums of squares are
  exact in float32 in any order (small integers), so that y is the same bits too; within float32 rounding of
  float64 numpy on random rows.
- The CUDA build (sm_90, nvcc): one kernel, a block per (row, head) of q and k, a thread per dimension.
- Its place in the model's CUDA graphs: tests/test_gpu_launches.py.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from nextn.compiler.lower import rope_pair, te_ops

I64 = "int64"
EPS = 1e-6
PLAIN = dict(n_rot=32, mode="neox", freq_base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
             beta_fast=32.0, beta_slow=1.0, n_ctx_orig=4096)
ROPES = {"neox-partial": dict(PLAIN, n_rot=16),
         "norm": dict(PLAIN, mode="norm"),
         "yarn": dict(PLAIN, freq_scale=0.25, ext_factor=1.0, attn_factor=1.0, n_ctx_orig=1024)}


def _kernel(Hq, Hk, D, rope, eps):
    f = rope_pair.rope_pair_kernel(Hq, Hk, D, rope, eps, gpu=False).with_attr("global_symbol", "f")
    return tvm.compile(tvm.IRModule({"f": f}), target="llvm")["f"]


def _te_chain(H, D, rope, eps):
    """The TE ops the other forms emit for one tensor: rms_norm, mul, rope_ext (or rope_ext alone)."""
    t = te.var("T", I64)
    x = te.placeholder([t, tirx.IntImm(I64, H), tirx.IntImm(I64, D)], "float32", name="x")
    pos = te.placeholder([t], "int32", name="pos")
    par = {k: v for k, v in rope.items() if k not in ("n_rot", "mode")}
    if eps is None:
        out = te_ops.rope_ext(x, pos, rope["n_rot"], rope["mode"], **par)
        f = te.create_prim_func([x, pos, out])
    else:
        w = te.placeholder([tirx.IntImm(I64, D)], "float32", name="w")
        out = te_ops.rope_ext(te_ops.mul(te_ops.rms_norm(x, eps), w), pos, rope["n_rot"], rope["mode"], **par)
        f = te.create_prim_func([x, w, pos, out])
    return tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target="llvm")["main"]


def _run_pair(fn, a, b, wa, wb, pos):
    oa, ob = tvm.runtime.empty(a.shape, "float32"), tvm.runtime.empty(b.shape, "float32")
    ws = [] if wa is None else [tvm.runtime.tensor(wa), tvm.runtime.tensor(wb)]
    fn(tvm.runtime.tensor(a), tvm.runtime.tensor(b), *ws, tvm.runtime.tensor(pos), oa, ob)
    return oa.numpy(), ob.numpy()


def _run_chain(fn, x, w, pos):
    out = tvm.runtime.empty(x.shape, "float32")
    args = [tvm.runtime.tensor(x)] + ([] if w is None else [tvm.runtime.tensor(w)])
    fn(*args, tvm.runtime.tensor(pos), out)
    return out.numpy()


@pytest.mark.e2e   # builds kernels (llvm)
@pytest.mark.parametrize("name", sorted(ROPES))
@pytest.mark.parametrize("norm", [False, True])
def test_emulated_kernel_is_the_te_chain(name, norm):
    rope, (Hq, Hk, D, T) = ROPES[name], (4, 2, 32, 3)
    eps = EPS if norm else None
    rng = np.random.default_rng(len(name) + norm)
    # small integers: every sum of squares is exact in float32, in any order
    a = rng.integers(-8, 9, (T, Hq, D)).astype(np.float32)
    b = rng.integers(-8, 9, (T, Hk, D)).astype(np.float32)
    a[1, 2] = 0.0   # a zero head: y = 0
    wa, wb = (rng.uniform(0.5, 1.5, D).astype(np.float32) for _ in range(2))
    pos = np.array([0, 5, 3000], np.int32)
    oa, ob = _run_pair(_kernel(Hq, Hk, D, rope, eps), a, b, wa if norm else None, wb if norm else None, pos)
    ca, cb = _te_chain(Hq, D, rope, eps), _te_chain(Hk, D, rope, eps)
    assert oa.tobytes() == _run_chain(ca, a, wa if norm else None, pos).tobytes()
    assert ob.tobytes() == _run_chain(cb, b, wb if norm else None, pos).tobytes()


def _numpy_rope(y, pos, rope):
    """float64 rope of y [T, H, D] (compiler/ir/rope.py's definition, YaRN off)."""
    n_rot, D = rope["n_rot"], y.shape[-1]
    inv = rope["freq_base"] ** (-2.0 * np.arange(n_rot // 2) / n_rot)
    ang = pos[:, None].astype(np.float64) * inv
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = y.copy()
    if rope["mode"] == "neox":
        lo, hi = y[..., :n_rot // 2], y[..., n_rot // 2:n_rot]
        out[..., :n_rot // 2], out[..., n_rot // 2:n_rot] = lo * c - hi * s, lo * s + hi * c
    else:
        ev, od = y[..., 0:n_rot:2], y[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = ev * c - od * s, ev * s + od * c
    assert D >= n_rot
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["neox-partial", "norm"])
@pytest.mark.parametrize("D", [32, 128, 96])
def test_emulated_kernel_against_float64(name, D):
    rope, (Hq, Hk, T) = ROPES[name], (3, 1, 2)
    rng = np.random.default_rng(D)
    a, b = (rng.standard_normal((T, h, D)).astype(np.float32) * 4 for h in (Hq, Hk))
    wa, wb = (rng.uniform(0.5, 1.5, D).astype(np.float32) for _ in range(2))
    pos = np.array([7, 129], np.int32)
    oa, ob = _run_pair(_kernel(Hq, Hk, D, rope, EPS), a, b, wa, wb, pos)
    for x, w, o in ((a, wa, oa), (b, wb, ob)):
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + EPS) * w
        np.testing.assert_allclose(o, _numpy_rope(y, pos, rope), rtol=1e-5, atol=1e-5)


@pytest.mark.e2e
def test_cuda_kernel_one_block_per_head():
    from nextn.compiler.gpu_build import build_scope
    from nextn.compiler.target import make_target
    from nextn.schedules.gpu_bound import launches, unbound_accesses

    f = rope_pair.rope_pair_kernel(96, 8, 128, ROPES["neox-partial"], EPS, gpu=True).with_attr("global_symbol", "f")
    assert not unbound_accesses(f)
    (ln,) = launches(f)
    assert ln["grid"] == ["t * 104", "1", "1"] and ln["block"] == ["128", "1", "1"], ln   # (row, head), dims
    tgt = make_target("cuda", ["sm_90"])
    with build_scope("cuda", ["sm_90"]), tgt:
        src = tvm.compile(tvm.IRModule({"f": f}), target=tgt).mod.imports[0].inspect_source()
    assert len(set(re.findall(r"__global__ .*? (\w+)\(", src))) == 1
