"""`mul_mat` / `mul_mat_id` (ggml semantics, as `te_ops`) with the weight's dequantization as its own stage.

    mul_mat     deq[(B,) n, k] = w(n, k);        y[..., n] = sum_k x[..., k] · deq[(b,) n, k]
    mul_mat_id  deq[t, j, n, k] = w(ids[t, j], n, k);   y[t, j, n] = sum_k x[t, (j,) k] · deq[t, j, n, k]

w(…) is the format's float32 element expression (nextn.compiler.quant, gguf-py's dequantization bit for bit) or
the float32 weight itself. The separate stage is what lets the GPU schedule (`gemv.py`) place the weight read:
it computes `deq` for one lane's few elements into registers once per tile of activation rows, and the row loop
reads the registers; unscheduled, the function is the plain definition (tests/test_cuda_kernels.py builds it for
llvm against float64 numpy). Block names: DEQUANT for the stage, MATMUL for the reduction, SCALE / MIN for the
K-quants' sub-block factors.
"""
from __future__ import annotations

from tvm import te

from ..te_ops import _elem

DEQUANT, MATMUL, SCALE, MIN = "dequant", "gemv", "wscale", "wmin"


# K-quants whose scale is per sub-block (32 or 16 weights): kind -> sub-block size
_SUBBLOCK = {"q4_k": 32, "q5_k": 32, "q6_k": 16}


def _dequant(w, lead, weight_lead):
    """The DEQUANT stage over (*lead, N, K): weight element (*weight_lead(*l), n, k). For the K-quants the
    float16 x 6- or 8-bit sub-block factors are stages of their own (SCALE, MIN: one value per lead, n and
    sub-block), so a schedule computes them once per sub-block instead of once per element; the element is then
    scale * q (- min), the same float32 operations in the same order as the format's element expression."""
    *_, N, K = w.shape
    kind = getattr(w, "kind", None)
    if kind not in _SUBBLOCK:
        return te.compute((*lead, N, K), lambda *i: _elem(w, *weight_lead(*i[:-2]), i[-2], i[-1]), name=DEQUANT)
    from nextn.compiler.quant import k_quants
    from nextn.compiler.quant.te import Block, f32

    sub = _SUBBLOCK[kind]
    size = 210 if kind == "q6_k" else k_quants.Q45K[kind][0]

    def block(i, k):   # i = (*lead, n)
        return Block(w.tensors[0], (*weight_lead(*i[:-1]), i[-1], k), 256, size)

    shape = (*lead, N, K // sub)
    if kind == "q6_k":
        scale = te.compute(shape, lambda *i: (lambda b: b.f16(208) * f32(b.i8(192 + b.e // 16)))(
            block(i[:-1], i[-1] * sub)), name=SCALE)
        return te.compute((*lead, N, K), lambda *i: scale[(*i[:-1], i[-1] // sub)] * f32(
            k_quants.q6k_quant(block(i[:-1], i[-1]))), name=DEQUANT)

    def factor(i, which):
        b = block(i[:-1], i[-1] * sub)
        sc, mn = k_quants.scale_min(b, b.e // 32)
        return b.f16(0) * sc if which == 0 else b.f16(2) * mn

    scale = te.compute(shape, lambda *i: factor(i, 0), name=SCALE)
    low = te.compute(shape, lambda *i: factor(i, 1), name=MIN)
    return te.compute((*lead, N, K), lambda *i: scale[(*i[:-1], i[-1] // sub)] * f32(
        k_quants.q45k_quant(block(i[:-1], i[-1]), kind)) - low[(*i[:-1], i[-1] // sub)], name=DEQUANT)


def mul_mat(w, x):
    """float32 [..., N] = x [..., K] · w [N, K]ᵀ, or per head for w [B, N, K] and x [..., B, K] (ggml_mul_mat)."""
    if len(w.shape) == 3:
        B, N, K = w.shape
        deq = _dequant(w, (B,), lambda b: (b,))
        k = te.reduce_axis((0, K), name="k")
        return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * deq[i[-2], i[-1], k], axis=k),
                          name=MATMUL)
    N, K = w.shape
    deq = _dequant(w, (), lambda: ())
    k = te.reduce_axis((0, K), name="k")
    return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * deq[i[-1], k], axis=k), name=MATMUL)


def mul_mat_id(w, x, ids):
    """float32 [T, n_used, N]: row t's slot j through expert ids[t, j] of w [X, N, K]; x [T, K] (shared by the
    slots) or [T, n_used, K] (ggml_mul_mat_id)."""
    _X, N, K = w.shape
    T, kk = ids.shape
    deq = _dequant(w, (T, kk), lambda t, j: (ids[t, j].astype("int64"),))
    r = te.reduce_axis((0, K), name="k")
    if len(x.shape) == 2:
        return te.compute((T, kk, N), lambda t, j, n: te.sum(x[t, r] * deq[t, j, n, r], axis=r), name=MATMUL)
    return te.compute((T, kk, N), lambda t, j, n: te.sum(x[t, j, r] * deq[t, j, n, r], axis=r), name=MATMUL)


TE_OPS = {"mul_mat": mul_mat, "mul_mat_id": mul_mat_id}
