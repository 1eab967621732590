"""The GPU forms' MoE top-k kernel (compiler/lower/topk.py): one kernel for argsort_top_k of the biased router
probabilities, where there were two (rank, then select) and the bias add.

- The "gpu-emulated" build (the same loops, serial, llvm) against the IR interpreter's stable argsort
  (compiler/ir/interpret.py `_top_k`: np.argsort(-(x + b), kind="stable")) on rows full of ties, signed zeros
  included, at the widths of the fixtures and of GLM-4.5-Air / GLM-5.2 (128, 160, 256 experts).
- The CUDA build (sm_90, nvcc): one kernel, a block per row and a thread per expert, a barrier between the slots'
  zeros and the indices.
- Its place in the model's CUDA graphs: tests/test_gpu_launches.py.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

from nextn.compiler.ir.interpret import _top_k
from nextn.compiler.lower.topk import topk_ids_kernel


def _run(fn, x, b, k):
    T = len(x)
    outs = [tvm.runtime.empty((T, k), "int32"), tvm.runtime.empty((T, k, 1), "float32"),
            tvm.runtime.empty((T, 1), "float32")]
    fn(tvm.runtime.tensor(x), tvm.runtime.tensor(b), *outs)
    return [o.numpy() for o in outs]


def _emulated(X: int, k: int):
    f = topk_ids_kernel(X, k, gpu=False).with_attr("global_symbol", "topk_ids")
    return tvm.compile(tvm.IRModule({"topk_ids": f}), target="llvm")["topk_ids"]


@pytest.mark.e2e   # builds a kernel (llvm)
@pytest.mark.parametrize("X,k", [(8, 2), (128, 8), (160, 8), (256, 8), (16, 16)])
@pytest.mark.parametrize("T", [1, 5])
def test_emulated_kernel_is_the_stable_argsort(X, k, T):
    rng = np.random.default_rng(X * 10 + T)
    # few distinct values: most rows tie at their top; signed zeros compare equal
    x = rng.choice(np.array([-0.0, 0.0, 0.25, 0.5, 0.75], np.float32), size=(T, X)).astype(np.float32)
    b = rng.choice(np.array([0.0, -0.0, 0.25], np.float32), size=X).astype(np.float32)
    fn = _emulated(X, k)
    y = rng.standard_normal((T, X)).astype(np.float32)   # distinct values
    for v in (x, y):
        ids, w, wsum = _run(fn, v, b, k)
        want = _top_k(v + b, k)
        np.testing.assert_array_equal(ids, want)
        # get_rows of the unbiased values; their sum in slot order (float64: the same up to its last rounding)
        np.testing.assert_array_equal(w[..., 0], np.take_along_axis(v, want, axis=1))
        np.testing.assert_allclose(wsum[:, 0], v[np.arange(T)[:, None], want].astype(np.float64).sum(axis=1),
                                   rtol=1e-6, atol=0)


@pytest.mark.e2e
def test_nan_rows_still_give_experts_in_range():
    x = np.full((2, 8), np.nan, np.float32)
    x[1, 3] = 1.0
    ids, _w, _s = _run(_emulated(8, 4), x, np.zeros(8, np.float32), 4)
    assert ((ids >= 0) & (ids < 8)).all()


@pytest.mark.e2e
def test_cuda_kernel_one_block_per_row_with_a_barrier():
    from nextn.compiler.gpu_build import build_scope
    from nextn.compiler.target import make_target
    from nextn.schedules.gpu_bound import launches, unbound_accesses

    f = topk_ids_kernel(128, 8, gpu=True).with_attr("global_symbol", "topk_ids")
    assert not unbound_accesses(f)
    (ln,) = launches(f)
    assert [str(g) for g in ln["grid"][:1]] == ["t"] and [str(b) for b in ln["block"][:1]] == ["128"]
    tgt = make_target("cuda", ["sm_90"])
    with build_scope("cuda", ["sm_90"]), tgt:
        src = tvm.compile(tvm.IRModule({"topk_ids": f}), target=tgt).mod.imports[0].inspect_source()
    assert len(set(re.findall(r"__global__ .*? (\w+)\(", src))) == 1   # one kernel (declared, then defined)
    assert src.count("__syncthreads()") == 2   # the slots' zeros, then the weights, written before they are read
