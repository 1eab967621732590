"""bench/quant_gemv.py's read-bandwidth probe reads every 64-byte line of the weight once, its work items in order
(a ceiling that skipped or repeated bytes would be no ceiling): its per-item lane sums against numpy's."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import quant_gemv  # noqa: E402

pytestmark = pytest.mark.e2e   # builds TVM kernels or runs the CLI in a subprocess


@pytest.mark.parametrize("shape, dtype, items", [((100, 1496), "uint8", 7), ((37, 300), "float16", 3),
                                                 ((64, 1088), "uint8", 4)])
def test_probe_sums_every_line_once(shape, dtype, items):
    import tvm

    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, shape).astype(np.uint8) if dtype == "uint8" else rng.standard_normal(shape).astype(dtype)
    probe, nread = quant_gemv.probe_kernel(shape, dtype, items, prefetch_kb=16)
    out = tvm.runtime.empty((items, 8), "uint64")
    probe(tvm.runtime.tensor(a), out)
    assert nread == a.nbytes // 64 * 64
    lines = a.reshape(-1).view(np.uint8)[:nread].view(np.uint64).reshape(-1, 8)
    n = len(lines)
    want = np.stack([lines[i * n // items:(i + 1) * n // items].sum(0, dtype=np.uint64) for i in range(items)])
    assert np.array_equal(out.numpy(), want)
