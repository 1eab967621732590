"""`mul_mat` / `mul_mat_id` (ggml semantics, as `te_ops`) with the weight's dequantization as its own stage.

    mul_mat     deq[(B,) n, k] = w(n, k);        y[..., n] = sum_k x[..., k] · deq[(b,) n, k]
    mul_mat_id  deq[t, j, n, k] = w(ids[t, j], n, k);   y[t, j, n] = sum_k x[t, (j,) k] · deq[t, j, n, k]

w(…) is the format's float32 element expression (nextn.compiler.quant, gguf-py's dequantization bit for bit) or
the float32 weight itself. The separate stage is what lets the GPU schedule (`gemv.py`) place the weight read:
it computes `deq` for one lane's few elements into registers once per tile of activation rows, and the row loop
reads the registers; unscheduled, the function is the plain definition (tests/test_cuda_kernels.py builds it for
llvm against float64 numpy). Block names: DEQUANT for the stage, MATMUL for the reduction.
"""
from __future__ import annotations

from tvm import te

from ..te_ops import _elem

DEQUANT, MATMUL = "dequant", "gemv"


def mul_mat(w, x):
    """float32 [..., N] = x [..., K] · w [N, K]ᵀ, or per head for w [B, N, K] and x [..., B, K] (ggml_mul_mat)."""
    if len(w.shape) == 3:
        B, N, K = w.shape
        deq = te.compute((B, N, K), lambda b, n, k: _elem(w, b, n, k), name=DEQUANT)
        k = te.reduce_axis((0, K), name="k")
        return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * deq[i[-2], i[-1], k], axis=k),
                          name=MATMUL)
    N, K = w.shape
    deq = te.compute((N, K), lambda n, k: _elem(w, n, k), name=DEQUANT)
    k = te.reduce_axis((0, K), name="k")
    return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * deq[i[-1], k], axis=k), name=MATMUL)


def mul_mat_id(w, x, ids):
    """float32 [T, n_used, N]: row t's slot j through expert ids[t, j] of w [X, N, K]; x [T, K] (shared by the
    slots) or [T, n_used, K] (ggml_mul_mat_id)."""
    _X, N, K = w.shape
    T, kk = ids.shape
    deq = te.compute((T, kk, N, K), lambda t, j, n, k: _elem(w, ids[t, j].astype("int64"), n, k), name=DEQUANT)
    r = te.reduce_axis((0, K), name="k")
    if len(x.shape) == 2:
        return te.compute((T, kk, N), lambda t, j, n: te.sum(x[t, r] * deq[t, j, n, r], axis=r), name=MATMUL)
    return te.compute((T, kk, N), lambda t, j, n: te.sum(x[t, j, r] * deq[t, j, n, r], axis=r), name=MATMUL)


TE_OPS = {"mul_mat": mul_mat, "mul_mat_id": mul_mat_id}
