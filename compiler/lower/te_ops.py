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
    if len(ids.shape) == 1:
        E = table.shape[-1]
        return te.compute((ids.shape[0], E), lambda t, e: _elem(table, ids[t].astype("int64"), e), name="get_rows")
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


def scale(x, s):
    return te.compute(x.shape, lambda *i: x[i] * tirx.const(s, F32), name="scale")


def mul_mat(w, x):
    if len(w.shape) == 3:   # batched over heads: w[B,N,K] x[...,B,K] -> [...,B,N]
        _B, N, K = w.shape
        k = te.reduce_axis((0, K), name="k")
        return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * _elem(w, i[-2], i[-1], k), axis=k),
                          name="mul_mat")
    N, K = w.shape
    k = te.reduce_axis((0, K), name="k")
    return te.compute((*x.shape[:-1], N), lambda *i: te.sum(x[(*i[:-1], k)] * _elem(w, i[-1], k), axis=k), name="mul_mat")


def mul_mat_id(w, x, ids):
    X, N, K = w.shape
    T, kk = ids.shape
    r = te.reduce_axis((0, K), name="k")
    if len(x.shape) == 2:
        def f(t, j, n):
            return te.sum(x[t, r] * _elem(w, ids[t, j].astype("int64"), n, r), axis=r)
    else:
        def f(t, j, n):
            return te.sum(x[t, j, r] * _elem(w, ids[t, j].astype("int64"), n, r), axis=r)
    return te.compute((T, kk, N), f, name="mul_mat_id")


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


def rope_ext(x, pos, n_rot, mode, freq_base, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0,
             beta_slow=1.0, n_ctx_orig=0):
    half = n_rot // 2
    log_base = math.log(freq_base)
    mscale = rope.magnitude(freq_scale, ext_factor, attn_factor)
    if ext_factor != 0.0:
        low, high = rope.corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)

    def angle(t, i):
        f64 = i.astype("float64")
        inv = te.exp(tirx.const(-2.0 * log_base / n_rot, "float64") * f64)
        if ext_factor != 0.0:   # YaRN ramp between interpolated (freq_scale) and extrapolated frequencies
            y = (f64 - tirx.const(low, "float64")) / tirx.const(max(0.001, high - low), "float64")
            y = tirx.max(tirx.const(0.0, "float64"), tirx.min(tirx.const(1.0, "float64"), y))
            mix = tirx.const(ext_factor, "float64") * (tirx.const(1.0, "float64") - y)
            inv = inv * (tirx.const(freq_scale, "float64") * (tirx.const(1.0, "float64") - mix) + mix)
        elif freq_scale != 1.0:
            inv = inv * tirx.const(freq_scale, "float64")
        return pos[t].astype("float64") * inv

    def cos_sin(a):
        c, s = te.cos(a), te.sin(a)
        if mscale != 1.0:
            c, s = c * tirx.const(mscale, "float64"), s * tirx.const(mscale, "float64")
        return c.astype(F32), s.astype(F32)

    if mode == "neox":
        def f(t, h, d):
            j = tirx.if_then_else(d < half, d, d - half)
            c, s = cos_sin(angle(t, j))
            lo = x[t, h, d] * c - x[t, h, d + half] * s
            hi = x[t, h, d - half] * s + x[t, h, d] * c
            return tirx.if_then_else(d < half, lo, tirx.if_then_else(d < n_rot, hi, x[t, h, d]))
    else:  # "norm": adjacent pairs (2i, 2i+1)
        def f(t, h, d):
            c, s = cos_sin(angle(t, d // 2))
            even = x[t, h, d] * c - x[t, h, d + 1] * s
            odd = x[t, h, d - 1] * s + x[t, h, d] * c
            return tirx.if_then_else(d < n_rot, tirx.if_then_else(d % 2 == 0, even, odd), x[t, h, d])
    return te.compute(x.shape, f, name="rope_ext")


def flash_attn_ext(q, k, v, pos, n_kv, scale_):
    """Attention of T query rows over KV cells [0, n_kv) with the causal mask cell <= pos[t]."""
    g = q.shape[1] // k.shape[1]
    return _softmax_pv(_masked(attn_scores(q, k, n_kv), pos, scale_), lambda c, h, j: v[c, h // g, j], v.shape[2],
                       "attn")


# -- attention as three kernels (GPU): scores, soft_max, P·V --------------------------------------------------
# The fused forms above keep [T, H, L] scratch inside one PrimFunc; on a GPU that scratch would be a workspace
# allocated at every call (inside a CUDA graph capture too) and each stage a separate launch anyway. Split at
# the Relax level, the [T, H, L] tensors are planned like any other and each kernel is a shape dlight's
# GEMV / reduction rules know (ggml's non-flash path: kq = mul_mat, soft_max_ext, kqv = mul_mat).
def attn_scores(q, k, n_kv):
    """kq [T, H, L] = q[t, h]·k[c, h // (H / Hkv)] (GQA), unscaled and unmasked: one plain reduction, a shape the
    GEMV / matmul rules take."""
    T, H, D = q.shape
    g = H // k.shape[1]
    d = te.reduce_axis((0, D), name="d")
    return te.compute((T, H, n_kv), lambda t, h, c: te.sum(q[t, h, d] * k[c, h // g, d], axis=d), name="attn_qk")


def _masked(s, pos, scale_, mask=None):
    """kq * scale (+ mask[t, c]) on causal cells (c <= pos[t]), -inf elsewhere (ggml_soft_max_ext's inputs)."""
    def f(t, h, c):
        val = s[t, h, c] * tirx.const(scale_, F32)
        if mask is not None:
            val = val + mask[t, c]
        return tirx.if_then_else(c <= pos[t].astype("int64"), val, tirx.const(-math.inf, F32))

    return te.compute(s.shape, f, name="attn_masked")


def soft_max(s, pos, scale_, mask=None):
    """p = softmax over the last axis of kq [T, H, L] scaled and masked as `_masked` (ggml_soft_max_ext)."""
    e, z = _exp_sum(_masked(s, pos, scale_, mask), "soft_max")
    return te.compute(e.shape, lambda t, h, c: e[t, h, c] / z[t, h], name="soft_max")


def attn_pv(p, v, n_v):
    """kqv [T, H, n_v] = sum_c p[t, h, c] * v[c, h // (H / Hv), j] for j < n_v (MLA: v is the latent cache)."""
    T, H, n_kv = p.shape
    g = H // v.shape[1]
    c = te.reduce_axis((0, n_kv), name="c")
    return te.compute((T, H, n_v), lambda t, h, j: te.sum(p[t, h, c] * v[c, h // g, j], axis=c), name="attn_pv")


def _softmax_pv(sm, v_at, n_v, prefix: str):
    """softmax over the cells of masked scores sm [T, H, L] (masked cells -inf), then the weighted sum of V:
    out[t, h, j] = sum_c p[t, h, c] * v_at(c, h, j) (f32; normalised after the sum, as ggml's soft_max + mul_mat)."""
    T, H, n_kv = sm.shape
    e, z = _exp_sum(sm, prefix)
    c3 = te.reduce_axis((0, n_kv), name="c3")
    o = te.compute((T, H, n_v), lambda t, h, j: te.sum(e[t, h, c3] * v_at(c3, h, j), axis=c3), name=f"{prefix}_pv")
    return te.compute((T, H, n_v), lambda t, h, j: o[t, h, j] / z[t, h], name=f"{prefix}_out")


def _exp_sum(sm, prefix: str):
    """(e, z): e = exp(sm - max over cells) [T, H, L] and z = its sum over cells [T, H] (masked cells -inf → 0)."""
    T, H, n_kv = sm.shape
    c1 = te.reduce_axis((0, n_kv), name="c1")
    m = te.compute((T, H), lambda t, h: te.max(sm[t, h, c1], axis=c1), name=f"{prefix}_max")
    e = te.compute((T, H, n_kv), lambda t, h, c: te.exp(sm[t, h, c] - m[t, h]), name=f"{prefix}_exp")
    c2 = te.reduce_axis((0, n_kv), name="c2")
    z = te.compute((T, H), lambda t, h: te.sum(e[t, h, c2], axis=c2), name=f"{prefix}_sum")
    return e, z


def sigmoid(x):
    return te.compute(x.shape, lambda *i: tirx.const(1.0, F32) / (tirx.const(1.0, F32) + te.exp(-x[i])), name="sigmoid")


def swiglu(gt, up):
    return te.compute(gt.shape, lambda *i: gt[i] / (tirx.const(1.0, F32) + te.exp(-gt[i])) * up[i], name="swiglu")


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


def flash_attn_ext_mla(q, kv, pos, *rest):
    """MLA attention over the one-head latent cache kv[C, 1, Dk] (V = kv[..., :n_v]), causal, optional additive
    mask [T, L]. rest = ([mask,] n_kv, scale, n_v)."""
    mask = rest[0] if len(rest) == 4 else None
    n_kv, scale_, n_v = rest[-3:]
    return _softmax_pv(_masked(attn_scores(q, kv, n_kv), pos, scale_, mask), lambda c, h, j: kv[c, 0, j], n_v, "mla")


def lightning_indexer(q, k, w, pos, n_kv):
    """DSA index score [T, L]: sum_h relu(q[t,h]·k[s]) * w[t,h] on causal cells, -inf elsewhere."""
    return index_score(index_qk(q, k, n_kv), w, pos)


def index_qk(q, k, n_kv):
    """[T, Hi, L] = q[t, h]·k[c] (the indexer's one key head); the first kernel of the split indexer."""
    T_, Hi, D = q.shape
    d = te.reduce_axis((0, D), name="d")
    return te.compute((T_, Hi, n_kv), lambda t, h, c: te.sum(q[t, h, d] * k[c, 0, d], axis=d), name="index_qk")


def index_score(s, w, pos):
    """[T, L] = sum_h relu(s[t, h, c]) * w[t, h] on causal cells, -inf elsewhere."""
    T_, Hi, n_kv = s.shape
    h_ = te.reduce_axis((0, Hi), name="h")
    # the causal mask inside the sum (Hi terms of -inf sum to -inf): one reduction block, no epilogue
    return te.compute((T_, n_kv), lambda t, c: te.sum(tirx.if_then_else(
        c <= pos[t].astype("int64"), te.max(s[t, h_, c], tirx.const(0.0, F32)) * w[t, h_], tirx.const(-math.inf, F32)),
        axis=h_), name="lightning_indexer")


def index_mask_load(state, n_kv):
    return te.compute((1, n_kv), lambda _i, c: state[c], name="index_mask_load")
