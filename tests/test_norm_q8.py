"""The GPU forms' RMS norm + activation quantizer kernel (compiler/lower/cuda/norm_q8.py): one kernel where the
integer route had two (the norm with its weight, then quantize_q8).

- The "gpu-emulated" build (the same loops, serial threads, llvm): y against float64 numpy of rms_norm(x) * w
  (ggml_rms_norm then ggml_mul) within float32 rounding, (xq, xd) bit for bit the CPU's activation rows of that
  y (nextn.common.quant.activation: "q8_0" blocks of 32, "q8" blocks of 256), zero blocks and rounding ties
  included, and xs numpy's sums of each 16 of those quants, at the fixtures' width and at GLM-4.5-Air's /
  GLM-5.2's (4096, 6144), T = 1, 3.
- The CUDA build (sm_90, nvcc): one kernel, a block of norm_q8.THREADS threads per row, the quantizer's divisions
  correctly rounded (`__fdiv_rn`: --use_fast_math's `/` would move q across rounding boundaries).
- Its place in the model's CUDA graphs: tests/test_gpu_launches.py.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

from nextn.common.quant import activation
from nextn.compiler.lower.cuda import norm_q8

EPS = 1e-5


def _emulated(K, B):
    f = norm_q8.rms_norm_q8_kernel(K, B, EPS, cuda=False, gpu=False).with_attr("global_symbol", "f")
    return tvm.compile(tvm.IRModule({"f": f}), target="llvm")["f"]


def _run(fn, x, w, B):
    T, K = x.shape
    outs = [tvm.runtime.empty((T, K), "float32"), tvm.runtime.empty((T, K // 4), "int32"),
            tvm.runtime.empty((T, K // B), "float32"), tvm.runtime.empty((T, K // 16), "int32")]
    fn(tvm.runtime.tensor(x), tvm.runtime.tensor(w), *outs)
    return [o.numpy() for o in outs]


@pytest.mark.e2e   # builds a kernel (llvm)
@pytest.mark.parametrize("K,B", [(256, 32), (256, 256), (4096, 32), (4096, 256), (6144, 256)])
@pytest.mark.parametrize("T", [1, 3])
def test_emulated_kernel_is_the_norm_then_the_cpu_rows(K, B, T):
    rng = np.random.default_rng(K + B + T)
    x = (rng.standard_normal((T, K)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, K).astype(np.float32)
    w[B:2 * B] = 0.0   # a zero block of y where there are two: d = 0, q = 0
    y, xq, xd, xs = _run(_emulated(K, B), x, w, B)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + EPS) * w
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-6)
    q, d = activation.quantize_q8_0(y) if B == 32 else activation.quantize(y)[:2]
    assert np.array_equal(xq.view(np.int8).reshape(T, K), q)
    assert np.array_equal(xd.view(np.uint32), d.view(np.uint32))
    assert (d[:, 0] > 0).all() and (K == B or (d[:, 1] == 0).all())
    sums = q.reshape(T, K // 16, 16).astype(np.int64).sum(-1)
    assert np.array_equal(xs, sums) and np.abs(sums).max() > 16


@pytest.mark.e2e
def test_emulated_kernel_rounds_ties_to_even():
    K, B = 256, 32
    x = np.zeros((1, K), np.float32)
    x[0, :] = 1e-3
    x[0, 0] = 1.0   # block 0: y ~ x / rms, and y * 127 / amax lands near halves on some values below
    w = np.ones(K, np.float32)
    y, xq, xd, xs = _run(_emulated(K, B), x, w, B)
    q, d = activation.quantize_q8_0(y)
    assert np.array_equal(xs, q.reshape(1, K // 16, 16).astype(np.int64).sum(-1))
    assert np.array_equal(xq.view(np.int8).reshape(1, K), q)
    assert np.array_equal(xd.view(np.uint32), d.view(np.uint32))


@pytest.mark.e2e
def test_cuda_kernel_one_block_per_row_divisions_rounded():
    from nextn.compiler.gpu_build import build_scope
    from nextn.compiler.target import make_target
    from nextn.schedules.gpu_bound import launches, unbound_accesses

    f = norm_q8.rms_norm_q8_kernel(4096, 32, EPS, cuda=True, gpu=True).with_attr("global_symbol", "f")
    assert not unbound_accesses(f)
    (ln,) = launches(f)
    assert [str(g) for g in ln["grid"][:1]] == ["t"] and [str(b) for b in ln["block"][:1]] == [str(norm_q8.THREADS)]
    tgt = make_target("cuda", ["sm_90"])
    with build_scope("cuda", ["sm_90"]), tgt:
        src = tvm.compile(tvm.IRModule({"f": f}), target=tgt).mod.imports[0].inspect_source()
    assert len(set(re.findall(r"__global__ .*? (\w+)\(", src))) == 1
    assert src.count("__fdiv_rn") == 2   # d = amax / 127 and 127 / amax
    # the tree's steps, the word maxima, the segments, the blocks: each phase after a barrier
    assert src.count("__syncthreads()") >= 5, src
