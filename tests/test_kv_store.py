"""The KV store kernels (compiler/lower/attention/kv_access.py `store_kernel`): a layer's K and V in one kernel.

- The pair kernel (pair=True), built for llvm, stores into both caches exactly what the one-cache kernel stores into
  each (every KV type: f32, f16, bf16, q8_0), and touches no other cell.
- Its place in the model's CUDA graphs: tests/test_gpu_launches.py; the "gpu-emulated" build takes the same pairs,
  so test_kv_bucket.py's split-form tests run every arch through it.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

from nextn.common.kv_types import KV_TYPES, numpy_dtype
from nextn.compiler.lower.attention import kv_access

H, D, C = 2, 64, 9


def _build(kv, pair):
    f = kv_access.store_kernel(kv, H, D, gpu=False, pair=pair).with_attr("global_symbol", "f")
    return tvm.compile(tvm.IRModule({"f": f}), target="llvm")["f"]


def _cache(kv, rng):
    t = KV_TYPES[kv]
    shape = (C, H, t.storage_shape((D,))[0])
    dt = numpy_dtype(t.storage_dtype)
    return rng.integers(0, 255, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)


@pytest.mark.e2e   # builds kernels (llvm)
@pytest.mark.parametrize("kv", ["f32", "f16", "bf16", "q8_0"])
def test_pair_stores_what_two_single_stores_store(kv):
    rng = np.random.default_rng(len(kv))
    rows = [rng.standard_normal((3, H, D)).astype(np.float32) for _ in range(2)]
    rows[1][1, 0, :32] = 0.0   # a zero block (q8_0: d = 0)
    pos = np.array([4, 0, 7], np.int32)
    caches = [_cache(kv, rng) for _ in range(2)]
    single, pair = _build(kv, False), _build(kv, True)
    want = []
    for c, r in zip(caches, rows):
        t = tvm.runtime.tensor(c)
        single(t, tvm.runtime.tensor(r), tvm.runtime.tensor(pos))
        want.append(t.numpy())
    a, b = tvm.runtime.tensor(caches[0]), tvm.runtime.tensor(caches[1])
    pair(a, b, tvm.runtime.tensor(rows[0]), tvm.runtime.tensor(rows[1]), tvm.runtime.tensor(pos))
    for got, w, before in zip((a.numpy(), b.numpy()), want, caches):
        assert got.tobytes() == w.tobytes()
        kept = np.setdiff1d(np.arange(C), pos)
        assert got[kept].tobytes() == np.asarray(before)[kept].tobytes()   # the other cells untouched
