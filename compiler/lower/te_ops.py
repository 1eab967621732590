"""TE definitions of the IR's ggml ops (one function per op, same semantics as `ir/interpret.py`).

Weights reach `mul_mat`, `mul_mat_id` and `get_rows` either as one float32 tensor or as the buffers of a
block-quantized format (layout: nextn.common.quant; element expression: nextn.compiler.quant) that the kernel dequantizes while it reads, so the weights
stay quantized in memory. All arithmetic is float32; rope angles are float64 (as the reference).
"""
from __future__ import annotations

import math

from tvm import te, tirx, topi

from nextn.compiler.ir import rope

F32 = "float32"


class QWeight:
    """A quantized weight as the kernels see it: `at(*idx)` is the dequantized float32 element."""

    def __init__(self, kind: str, tensors, logical_shape):
        self.kind = kind
        self.tensors = tuple(tensors)
        self.logical_shape = tuple(logical_shape)

    def at(self, *idx):
        from nextn.compiler.quant import ELEMENTS

        return ELEMENTS[self.kind](self.tensors, idx)

    @property
    def shape(self):
        """Logical shape (the first buffer of every format has the weight's [..., N, K] or [..., N, K/x] form)."""
        return self.logical_shape


def _elem(w, *idx):
    return w.at(*idx) if isinstance(w, QWeight) else w[idx]


def get_rows(table, ids):
    if len(table.shape) == 2:    # ids of any rank [...] -> [..., E]
        E = table.shape[-1]
        return te.compute((*ids.shape, E), lambda *i: _elem(table, ids[i[:-1]].astype("int64"), i[-1]),
                          name="get_rows")
    B, n = ids.shape
    C = table.shape[2]
    return te.compute((B, n, C), lambda b, j, c: table[b, ids[b, j].astype("int64"), c], name="get_rows")


def rms_norm(x, eps):
    n = x.shape[-1]
    k = te.reduce_axis((0, n), name="k")
    ss = te.compute(x.shape[:-1], lambda *i: te.sum(x[(*i, k)] * x[(*i, k)], axis=k), name="rms_ss")
    return te.compute(x.shape, lambda *i: x[i] / te.sqrt(ss[i[:-1]] / tirx.const(float(int(n)), F32) + tirx.const(eps, F32)),
                      name="rms_norm")


def mul(a, b):
    return topi.multiply(a, b)


def add(a, b):
    return topi.add(a, b)


def div(a, b):
    return topi.divide(a, b)


def scale(x, s, b=0.0):
    if b == 0.0:
        return te.compute(x.shape, lambda *i: x[i] * tirx.const(s, F32), name="scale")
    return te.compute(x.shape, lambda *i: x[i] * tirx.const(s, F32) + tirx.const(b, F32), name="scale_bias")


def mul_mat(w, x, weight=None, name="mul_mat"):
    """ggml_mul_mat: float32 [..., N] = x [..., K] · w [N, K]ᵀ, or per head for w [B, N, K] and x [..., B, K].
    `weight(*i)`: the weight element at logical index i instead of w's own (lower/cuda: a dequantization stage)."""
    weight = weight or (lambda *i: _elem(w, *i))
    if len(w.shape) == 3:   # batched over heads: w[B,N,K] x[...,B,K] -> [...,B,N]
        _B, N, K = w.shape
        k = te.reduce_axis((0, K), name="k")
        return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * weight(i[-2], i[-1], k), axis=k),
                          name=name)
    N, K = w.shape
    k = te.reduce_axis((0, K), name="k")
    return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * weight(i[-1], k), axis=k), name=name)


def mul_mat_id(w, x, ids, weight=None, name="mul_mat_id"):
    """ggml_mul_mat_id: float32 [T, n_used, N], row t's slot j through expert ids[t, j] of w [X, N, K]; x [T, K]
    (shared by the slots) or [T, n_used, K]. `weight(t, j, n, k)`: the element slot (t, j) reads instead of w's own
    (lower/cuda: a dequantization stage)."""
    X, N, K = w.shape
    T, kk = ids.shape
    weight = weight or (lambda t, j, n, k: _elem(w, ids[t, j].astype("int64"), n, k))
    r = te.reduce_axis((0, K), name="k")
    if len(x.shape) == 2:
        def f(t, j, n):
            return te.sum(x[t, r] * weight(t, j, n, r), axis=r)
    else:
        def f(t, j, n):
            return te.sum(x[t, j, r] * weight(t, j, n, r), axis=r)
    return te.compute((T, kk, N), f, name=name)


def view(x, axis, start, length):
    shape = list(x.shape)
    shape[axis] = length

    def f(*i):
        i = list(i)
        i[axis] = i[axis] + start
        return x[tuple(i)]

    return te.compute(shape, f, name="view")


def concat(a, b, axis):
    return topi.concatenate([a, b], axis=axis)


def rope_cos_sin(p, i, n_rot, freq_base, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0,
                 beta_slow=1.0, n_ctx_orig=0):
    """(cos, sin) float32 of rope pair i at position p (integer PrimExprs), computed in float64 (compiler/ir/rope.py:
    ggml's rope_yarn, YaRN ramp included). One definition for `rope_ext` and the GPU forms' fused kernel
    (lower/cuda/rope_pair.py), so that both compute the same bits."""
    log_base = math.log(freq_base)
    mscale = rope.magnitude(freq_scale, ext_factor, attn_factor)
    f64 = i.astype("float64")
    inv = te.exp(tirx.const(-2.0 * log_base / n_rot, "float64") * f64)
    if ext_factor != 0.0:   # YaRN ramp between interpolated (freq_scale) and extrapolated frequencies
        low, high = rope.corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)
        y = (f64 - tirx.const(low, "float64")) / tirx.const(max(0.001, high - low), "float64")
        y = tirx.max(tirx.const(0.0, "float64"), tirx.min(tirx.const(1.0, "float64"), y))
        mix = tirx.const(ext_factor, "float64") * (tirx.const(1.0, "float64") - y)
        inv = inv * (tirx.const(freq_scale, "float64") * (tirx.const(1.0, "float64") - mix) + mix)
    elif freq_scale != 1.0:
        inv = inv * tirx.const(freq_scale, "float64")
    a = p.astype("float64") * inv
    c, s = te.cos(a), te.sin(a)
    if mscale != 1.0:
        c, s = c * tirx.const(mscale, "float64"), s * tirx.const(mscale, "float64")
    return c.astype(F32), s.astype(F32)


def rope_pair_index(d, n_rot, mode):
    """The pair whose (cos, sin) element d of a head takes (0 for the dims past n_rot, which rope keeps)."""
    if mode == "neox":
        half = n_rot // 2
        return tirx.if_then_else(d < half, d, tirx.if_then_else(d < n_rot, d - half, 0))
    return tirx.if_then_else(d < n_rot, d // 2, 0)


def rope_element(get, d, c, s, n_rot, mode):
    """Element d of one head after rope: `get(e)` the head's value at dim e, (c, s) the (cos, sin) of pair
    rope_pair_index(d). NEOX pairs (i, i + n_rot/2), NORM adjacent pairs (2i, 2i+1); dims past n_rot kept."""
    if mode == "neox":
        half = n_rot // 2
        lo = get(d) * c - get(d + half) * s
        hi = get(d - half) * s + get(d) * c
        return tirx.if_then_else(d < half, lo, tirx.if_then_else(d < n_rot, hi, get(d)))
    even = get(d) * c - get(d + 1) * s
    odd = get(d - 1) * s + get(d) * c
    return tirx.if_then_else(d < n_rot, tirx.if_then_else(d % 2 == 0, even, odd), get(d))


def rope_ext(x, pos, n_rot, mode, freq_base, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0,
             beta_slow=1.0, n_ctx_orig=0):
    half = n_rot // 2
    par = dict(freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=beta_fast,
               beta_slow=beta_slow, n_ctx_orig=n_ctx_orig)
    # cos and sin once per (row, pair) in their own stage: computed per element they cost three float64
    # transcendentals for each of the T * heads * n_rot values (the same values, so the same bits).
    cos_t = te.compute((x.shape[0], half), lambda t, i: rope_cos_sin(pos[t], i, n_rot, freq_base, **par)[0],
                       name="rope_cos")
    sin_t = te.compute((x.shape[0], half), lambda t, i: rope_cos_sin(pos[t], i, n_rot, freq_base, **par)[1],
                       name="rope_sin")

    def f(t, h, d):
        j = rope_pair_index(d, n_rot, mode)
        return rope_element(lambda e: x[t, h, e], d, cos_t[t, j], sin_t[t, j], n_rot, mode)

    return te.compute(x.shape, f, name="rope_ext")


def sigmoid(x):
    return te.compute(x.shape, lambda *i: tirx.const(1.0, F32) / (tirx.const(1.0, F32) + te.exp(-x[i])), name="sigmoid")


def silu(x):
    return te.compute(x.shape, lambda *i: x[i] / (tirx.const(1.0, F32) + te.exp(-x[i])), name="silu")


def softplus(x):
    """log(1 + exp(x)), as max(x, 0) + log1p(exp(-|x|)) (no overflow)."""
    return te.compute(x.shape, lambda *i: te.max(x[i], tirx.const(0.0, F32)) + te.log(
        tirx.const(1.0, F32) + te.exp(-te.abs(x[i]))), name="softplus")


# SiLU(g) = g / (1 + exp(-g)) with expf kept on its fast path: outside about [-88, 88] it calls out to set
# errno (an overflow, an underflow to 0), several times slower, and the quotient is known there: for g > 87,
# 1 + exp(-g) rounds to 1 (so exp(-87) gives the same bits), and for g < -88 it is below 6e-37 in magnitude
# (taken as g * 0: a zero of g's sign, as g / inf). exp's argument is clamped on both sides because the
# selection below may compute both of its branches.
SILU_EXP_LO, SILU_G_LO = -87.0, -88.0


def swiglu(gt, up):
    def f(*i):
        g = gt[i]
        e = te.exp(te.min(te.max(-g, tirx.const(SILU_EXP_LO, F32)), -tirx.const(SILU_G_LO, F32)))
        silu = g / (tirx.const(1.0, F32) + e)
        return tirx.if_then_else(g < tirx.const(SILU_G_LO, F32), g * tirx.const(0.0, F32), silu) * up[i]
    return te.compute(gt.shape, f, name="swiglu")


def clamp(x, lo, hi):
    def f(*i):
        r = x[i]
        if math.isfinite(lo):
            r = te.max(r, tirx.const(lo, F32))
        if math.isfinite(hi):
            r = te.min(r, tirx.const(hi, F32))
        return r
    return te.compute(x.shape, f, name="clamp")


def sum_rows(x):
    k = te.reduce_axis((0, x.shape[-1]), name="k")
    return te.compute((*x.shape[:-1], 1), lambda *i: te.sum(x[(*i[:-1], k)], axis=k), name="sum_rows")


def argsort_top_k(x, k):
    """Top-k by rank counting: rank(e) = #{e' : x[e'] > x[e] or (x[e'] == x[e] and e' < e)}; O(n^2), fine for n_expert."""
    return topk_select(topk_rank(x), k)


def topk_rank(x):
    """int32 [T, n]: each element's place in the descending order, ties to the lower index."""
    T, n = x.shape
    r = te.reduce_axis((0, n), name="r")
    return te.compute((T, n), lambda t, e: te.sum(tirx.if_then_else(
        tirx.any(x[t, r] > x[t, e], tirx.all(x[t, r] == x[t, e], r < e)), 1, 0), axis=r), name="topk_rank")


def topk_select(rank, k):
    """int32 [T, k]: the index whose rank is j, for j < k."""
    T, n = rank.shape
    s = te.reduce_axis((0, n), name="s")
    return te.compute((T, k), lambda t, j: te.sum(tirx.if_then_else(rank[t, s] == j, s.astype("int32"), 0), axis=s),
                      name="argsort_top_k")


def argmax(x):
    return topi.argmax(x, axis=-1)   # int32, first index of the maximum


ARGMAX_CHUNKS = (1024, 512, 256)   # columns per chunk of the two-pass argmax (GPU forms: gpu_forms.SPLIT_OPS)


def argmax_chunk(V: int) -> int | None:
    """The chunk of a two-pass argmax over rows of V columns: the largest of ARGMAX_CHUNKS that divides V into at
    least two chunks; None: one pass."""
    return next((c for c in ARGMAX_CHUNKS if V % c == 0 and V // c >= 2), None)


def argmax_of_chunks(x, part, ch: int):
    """The second pass of argmax over x [R, C·ch]: `part` [R, C] int32 holds the first index of the maximum within
    each chunk of ch columns (`argmax` of x viewed as [R, C, ch]); the result [R] int32 is the first chunk whose
    maximum is the largest, at its index. That is the first index of the maximum of the whole row, as the one-pass
    `argmax` (ties: the lower index; an earlier chunk holds only lower indices). A chunk without a candidate
    (-1: every value -inf or NaN, which topi's argmax never picks) counts as -inf, and a row without one is -1, as
    in one pass; no index outside the row is read."""
    R, C = part.shape
    best = topi.argmax(te.compute((R, C), lambda r, c: tirx.if_then_else(
        part[r, c] >= 0, x[r, c * ch + tirx.max(part[r, c], 0)], tirx.const(float("-inf"), x.dtype)),
        name="chunk_max"), axis=-1)
    return te.compute((R,), lambda r: tirx.if_then_else(
        best[r] >= 0, best[r] * ch + part[r, tirx.max(best[r], 0)], -1), name="argmax_index")


def norm(x, eps):
    """ggml_norm: (x - mean) / sqrt(var + eps) over the last axis (two passes, as the reference)."""
    n = x.shape[-1]
    inv_n = tirx.const(1.0 / float(int(n)), F32)
    k1 = te.reduce_axis((0, n), name="k1")
    mean = te.compute(x.shape[:-1], lambda *i: te.sum(x[(*i, k1)], axis=k1), name="norm_sum")
    xc = te.compute(x.shape, lambda *i: x[i] - mean[i[:-1]] * inv_n, name="norm_centered")
    k2 = te.reduce_axis((0, n), name="k2")
    var = te.compute(x.shape[:-1], lambda *i: te.sum(xc[(*i, k2)] * xc[(*i, k2)], axis=k2), name="norm_var")
    return te.compute(x.shape, lambda *i: xc[i] / te.sqrt(var[i[:-1]] * inv_n + tirx.const(eps, F32)), name="norm")


def index_mask_load(state, n_kv):
    return te.compute((1, n_kv), lambda _i, c: state[c], name="index_mask_load")


def kpool_expand(pool_mask, pos, n_kv, kpool: int, tail: bool):
    """The cell mask [T, L] of a pool selection (ir/ops.py)."""
    T_ = pool_mask.shape[0]
    n_pool = pool_mask.shape[1]
    fill = tirx.const(0.0 if tail else -float("inf"), F32)

    def f(t, s):
        p = s // kpool
        complete = p < (pos[t].astype("int64") + 1) // kpool
        return tirx.if_then_else(complete, pool_mask[t, tirx.min(p, n_pool - 1)], fill)

    return te.compute((T_, n_kv), f, name="kpool_expand")
