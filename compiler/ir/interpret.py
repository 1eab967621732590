"""A small numpy interpreter of the IR: the executable specification every compiled kernel is tested against.

Float32 throughout (as the fixtures' references), except the softmax/rms reductions, which numpy
accumulates pairwise. States (KV caches) are float32 numpy arrays updated in place by `set_rows`, which stores
each row rounded to the cache's KV type (`nextn.common.kv_types`): the values a compiled cache holds.
"""
from __future__ import annotations

import numpy as np

from nextn.common.kv_types import KV_TYPES

from . import rope
from .graph import Graph
from .ops import check_impls, registry

INTERP: dict = {}   # op name -> fn(node, args, run): the node's value from its inputs' (`Run`: the call's context)
interp = registry(INTERP, "IR interpreter (compiler/ir/interpret.py)")


def _leaf(n):
    """The state an in-place op's first input chain starts from."""
    while n.op != "state":
        n = n.inputs[0]
    return n


def _rope(x, pos, n_rot, mode, freq_base, **scaling):
    """rope_ext (see .rope for the YaRN terms); angles in float64, rotation in float32."""
    half = n_rot // 2
    ang = pos.astype(np.float64)[:, None] * rope.pair_freqs(n_rot, freq_base, **scaling)[None, :]   # [T, half]
    m = rope.magnitude(**scaling)
    cos = (np.cos(ang) * m).astype(np.float32)[:, None, :]
    sin = (np.sin(ang) * m).astype(np.float32)[:, None, :]
    out = x.copy()
    if mode == "neox":   # pairs (i, i + n_rot/2)
        lo, hi = slice(0, half), slice(half, n_rot)
    else:                # "norm": adjacent pairs (2i, 2i+1)
        lo, hi = slice(0, n_rot, 2), slice(1, n_rot, 2)
    x0, x1 = x[..., lo], x[..., hi]
    out[..., lo] = x0 * cos - x1 * sin
    out[..., hi] = x0 * sin + x1 * cos
    return out


def _attn(q, k, v, pos, n_kv, scale):
    T, H, D = q.shape
    Hkv = k.shape[1]
    g = H // Hkv
    kk = k[:n_kv].astype(np.float32)
    vv = v[:n_kv].astype(np.float32)
    out = np.empty((T, H, v.shape[2]), np.float32)
    cells = np.arange(n_kv)
    for h in range(H):
        s = q[:, h, :] @ kk[:, h // g, :].T * np.float32(scale)     # [T, n_kv]
        s = np.where(cells[None, :] <= pos[:, None], s, -np.inf)
        out[:, h, :] = _softmax(s) @ vv[:, h // g, :]
    return out


def _softmax(s):
    """Row softmax of masked scores; a row without a finite score gives zeros (ggml flash_attn_ext: S = 0 -> 0)."""
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, np.float32(0)))
    z = p.sum(axis=1, keepdims=True)
    return p / np.where(z > 0, z, np.float32(1))


def _attn_mla(q, kv, pos, mask, n_kv, scale, n_v):
    """MLA over the one-head latent cache: K = kv[:, 0, :], V = kv[:, 0, :n_v]; every query head reads it."""
    kk = kv[:n_kv, 0, :].astype(np.float32)
    cells = np.arange(n_kv)
    out = np.empty((q.shape[0], q.shape[1], n_v), np.float32)
    for h in range(q.shape[1]):
        s = q[:, h, :] @ kk.T * np.float32(scale)                  # [T, n_kv]
        if mask is not None:
            s = s + mask
        s = np.where(cells[None, :] <= pos[:, None], s, -np.inf)
        out[:, h, :] = _softmax(s) @ kk[:, :n_v]
    return out


def _lightning_indexer(q, k, w, pos, n_kv, kpool=1):
    n = n_kv // kpool                                              # cells, or complete pools of kpool cells
    kk = k[:n, 0, :]
    s = np.einsum("thd,sd->ths", q, kk)                            # [T, Hi, n]
    score = np.einsum("ths,th->ts", np.maximum(s, np.float32(0)), w)
    last = (np.arange(n) + 1) * kpool - 1                          # the last cell of each key / pool
    return np.where(last[None, :] <= pos[:, None], score, -np.inf).astype(np.float32)


def _top_k_mask(score, pos, k, kpool=1):
    T, L = score.shape
    out = np.zeros((T, L), np.float32)
    for t in range(T):
        n = min((int(pos[t]) + 1) // kpool, L)
        if n <= k:
            continue                                                # every causal cell is selected
        order = np.argsort(-score[t, :n], kind="stable")            # ties: lower index first (-0.0 == 0.0)
        row = np.full(L, -np.inf, np.float32)
        row[order[:k]] = 0.0
        out[t] = row
    return out


def _kpool_expand(pool_mask, pos, n_kv, kpool, tail):
    cells = np.arange(n_kv)
    pool = cells // kpool
    complete = pool[None, :] < ((pos + 1) // kpool)[:, None]       # [T, L]
    picked = pool_mask[:, np.minimum(pool, pool_mask.shape[1] - 1)]
    return np.where(complete, picked, np.float32(0.0 if tail else -np.inf)).astype(np.float32)


def _kpool_store(pooled, ik, ig, ape, pos):
    kp = ape.shape[0]
    for t in range(len(pos)):
        if (int(pos[t]) + 1) % kp:
            continue
        p = int(pos[t]) // kp
        z = ig[kp * p:kp * p + kp, 0, :] + ape                     # [kpool, D]
        e = np.exp(z - z.max(axis=0, keepdims=True))
        pooled[p, 0, :] = ((e / e.sum(axis=0, keepdims=True)) * ik[kp * p:kp * p + kp, 0, :]).sum(axis=0)
    return pooled


def _rs_initial(state, pos, rs):
    """The state before row 0: zeros at a sequence start (pos[0] == 0), else the committed plane."""
    return np.zeros(state.shape[1:], np.float32) if int(pos[0]) == 0 else state[int(rs[0])].copy()


def _rs_keep(state, rs, T, t, value):
    """Keep the state after row t (if it is one of the kept rows) in its plane (graph.py: slot T-1-t)."""
    P = state.shape[0]
    if t >= T - max(1, min(T, P - 1)):
        state[(int(rs[0]) + 1 + T - 1 - t) % P] = value


def _ssm_conv(x, w, state, pos, rs):
    T, K = x.shape[0], w.shape[1]
    sx = np.concatenate([_rs_initial(state, pos, rs), x])          # [K-1+T, Ch]
    y = np.zeros_like(x)
    for j in range(K):
        y += sx[j:j + T] * w[:, j]
    for t in range(T):
        _rs_keep(state, rs, T, t, sx[t + 1:t + K])
    return y


def _gated_delta_net(q, k, v, g, beta, state, pos, rs, chunk):
    """The recurrence (chunk 0) or the chunked form (chunk > 0): graph.py states both."""
    T = q.shape[0]
    S = _rs_initial(state, pos, rs)                                # [H, Dk, Dv]
    o = np.empty(v.shape, np.float32)
    if chunk == 0:
        for t in range(T):
            S = S * np.exp(g[t])[:, :, None]
            delta = beta[t][:, None] * (v[t] - np.einsum("hij,hi->hj", S, k[t]))
            S = S + k[t][:, :, None] * delta[:, None, :]
            o[t] = np.einsum("hij,hi->hj", S, q[t])
            _rs_keep(state, rs, T, t, S)
        return o
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(c0 + chunk, T))
        n = sl.stop - c0
        gam = np.cumsum(g[sl], axis=0)                             # [n, H, Dk] decay since the chunk start
        diff = gam[:, None] - gam[None, :]                         # [t, r, H, Dk]: gamma_t - gamma_r
        r_lt_t = np.tri(n, k=-1, dtype=bool)[:, :, None, None]
        r_le_t = np.tri(n, dtype=bool)[:, :, None, None]
        kk, qq, vv, bb = k[sl], q[sl], v[sl], beta[sl]
        E_lt = np.where(r_lt_t, np.exp(np.where(r_lt_t, diff, 0.0)), 0.0).astype(np.float32)
        E_le = np.where(r_le_t, np.exp(np.where(r_le_t, diff, 0.0)), 0.0).astype(np.float32)
        A = np.einsum("trhi,thi,rhi->htr", E_lt, kk, kk) * bb.T[:, :, None]            # [H, t, r]
        Bm = np.einsum("trhi,thi,rhi->htr", E_le, qq, kk)
        eg = np.exp(gam)                                                                # [n, H, Dk]
        rhs = bb[:, :, None] * (vv - np.einsum("thi,hij->thj", kk * eg, S))            # [n, H, Dv]
        delta = np.empty_like(rhs)
        for t in range(n):                                         # (I + A) delta = rhs, A strictly lower
            delta[t] = rhs[t] - np.einsum("hr,rhj->hj", A[:, t, :t], delta[:t])
        o[sl] = np.einsum("thi,hij->thj", qq * eg, S) + np.einsum("htr,rhj->thj", Bm, delta)
        decay_to_end = np.exp(gam[-1][None] - gam)                                      # [n, H, Dk]
        S = np.exp(gam[-1])[:, :, None] * S + np.einsum("rhi,rhj->hij", kk * decay_to_end, delta)
    _rs_keep(state, rs, 1, 0, S)                                   # the chunked form keeps slot 0 only
    return o


def _dsv4_hc_comb(c, eps, iters):
    e = np.exp(c - c.max(axis=-1, keepdims=True))
    c = e / e.sum(axis=-1, keepdims=True) + np.float32(eps)        # softmax over dst, + eps
    c = c / (c.sum(axis=-2, keepdims=True) + np.float32(eps))      # normalise over src
    for _ in range(iters - 1):
        c = c / (c.sum(axis=-1, keepdims=True) + np.float32(eps))
        c = c / (c.sum(axis=-2, keepdims=True) + np.float32(eps))
    return c


def _top_k(x, k):
    order = np.argsort(-x, axis=-1, kind="stable")
    return order[..., :k].astype(np.int32)


def _quantized_matmul(row_format, op, w, x, ids=None):
    """mul_mat / mul_mat_id on int8-quantized activation rows of `row_format` (see `run`), in float64, then
    float32. A mul_mat of per-head weights w [H, N, K] (glm-dsa's attn_k_b / attn_v_b) takes rows [..., H, K], head
    h's rows through w[h], as the float path below; each row of K is quantized on its own, as the CPU does."""
    from nextn.common.quant import activation

    xq = activation.round_trip(x, row_format)
    w = w.astype(np.float64)
    if op == "mul_mat":
        if w.ndim == 3:
            return np.einsum("...bk,bnk->...bn", xq, w).astype(np.float32)
        return (xq @ w.T).astype(np.float32)
    T, k = ids.shape
    xs = xq if xq.ndim == 3 else np.broadcast_to(xq[:, None, :], (T, k, xq.shape[-1]))
    return np.einsum("tjk,tjnk->tjn", xs, w[ids]).astype(np.float32)


class Run:
    """What an op's implementation may read besides its node and inputs: the call's KV length and options (`run`)."""

    def __init__(self, n_kv, keep_kv: bool, q8: dict):
        self.n_kv, self.keep_kv, self.q8 = n_kv, keep_kv, q8


@interp("get_rows")
def _(n, a, cx):
    t, ids = a
    return t[ids] if t.ndim == 2 else np.stack([t[b][ids[b]] for b in range(t.shape[0])])


@interp("rms_norm")
def _(n, a, cx):
    x = a[0]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(n.attrs["eps"]))


@interp("mul")
def _(n, a, cx):
    return a[0] * a[1]


@interp("add")
def _(n, a, cx):
    return a[0] + a[1]


@interp("div")
def _(n, a, cx):
    return a[0] / a[1]


@interp("scale")
def _(n, a, cx):
    r = a[0] * np.float32(n.attrs["s"])
    if "b" in n.attrs:
        r = r + np.float32(n.attrs["b"])
    return r


def _q8_format(n, cx):
    """The activation row format of a mul_mat / mul_mat_id whose weight takes quantized rows (`run`), else None."""
    w = n.inputs[0]
    return cx.q8[w.name] if w.op == "weight" and w.name in cx.q8 else None


@interp("mul_mat")
def _(n, a, cx):
    if _q8_format(n, cx) is not None:
        return _quantized_matmul(_q8_format(n, cx), n.op, *a)
    return a[1] @ a[0].T if a[0].ndim == 2 else np.einsum("...bk,bnk->...bn", a[1], a[0])


@interp("mul_mat_id")
def _(n, a, cx):
    if _q8_format(n, cx) is not None:
        return _quantized_matmul(_q8_format(n, cx), n.op, *a)
    w, x, ids = a
    T, k = ids.shape
    xs = x if x.ndim == 3 else np.broadcast_to(x[:, None, :], (T, k, x.shape[-1]))
    return np.einsum("tjk,tjnk->tjn", xs, w[ids])


@interp("reshape")
def _(n, a, cx):
    return a[0].reshape([d if isinstance(d, int) else -1 for d in n.shape])


@interp("view")
def _(n, a, cx):
    ax, s, ln = n.attrs["axis"], n.attrs["start"], n.attrs["length"]
    return np.take(a[0], np.arange(s, s + ln), axis=ax)


@interp("concat")
def _(n, a, cx):
    return np.concatenate(a, axis=n.attrs["axis"])


@interp("rope_ext")
def _(n, a, cx):
    return _rope(a[0], a[1], **n.attrs)


@interp("set_rows")
def _(n, a, cx):
    cache, rows, pos = a
    if not cx.keep_kv:
        cache[pos] = KV_TYPES[_leaf(n.inputs[0]).attrs.get("kv_type", "f32")].round(rows)
    return cache


@interp("flash_attn_ext")
def _(n, a, cx):
    q, k, v, pos = a
    return _attn(q, k, v, pos, int(cx.n_kv), n.attrs["scale"])


@interp("sigmoid")
def _(n, a, cx):
    return (1.0 / (1.0 + np.exp(-a[0]))).astype(np.float32)


@interp("swiglu")
def _(n, a, cx):
    g, u = a
    return (g / (1.0 + np.exp(-g))) * u


@interp("clamp")
def _(n, a, cx):
    return np.clip(a[0], n.attrs["lo"], n.attrs["hi"])


@interp("sum_rows")
def _(n, a, cx):
    return a[0].sum(axis=-1, keepdims=True)


@interp("argsort_top_k")
def _(n, a, cx):
    return _top_k(a[0], n.attrs["k"])


@interp("argmax")
def _(n, a, cx):
    return np.argmax(a[0], axis=-1).astype(np.int32)


@interp("norm")
def _(n, a, cx):
    x = a[0]
    xc = x - np.mean(x, axis=-1, keepdims=True)
    return xc / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + np.float32(n.attrs["eps"]))


@interp("flash_attn_ext_mla")
def _(n, a, cx):
    q, kv, pos = a[:3]
    return _attn_mla(q, kv, pos, a[3] if len(a) > 3 else None, int(cx.n_kv), n.attrs["scale"], n.attrs["n_v"])


@interp("lightning_indexer")
def _(n, a, cx):
    return _lightning_indexer(*a, int(cx.n_kv), n.attrs.get("kpool", 1))


@interp("top_k_mask")
def _(n, a, cx):
    return _top_k_mask(a[0], a[1], n.attrs["k"], n.attrs.get("kpool", 1))


@interp("index_mask_store")
def _(n, a, cx):
    state, mask, pos = a
    last = int(pos[-1]) + 1
    state[:last] = mask[-1, :last]
    state[last:] = n.attrs.get("after", 0.0)
    return state


@interp("silu")
def _(n, a, cx):
    return a[0] / (1.0 + np.exp(-a[0]))


@interp("softplus")
def _(n, a, cx):
    return np.logaddexp(np.float32(0), a[0])


@interp("ssm_conv")
def _(n, a, cx):
    return _ssm_conv(*a)


@interp("gated_delta_net")
def _(n, a, cx):
    return _gated_delta_net(*a, n.attrs["chunk"])


@interp("dsv4_hc_comb")
def _(n, a, cx):
    return _dsv4_hc_comb(a[0], n.attrs["eps"], n.attrs["iters"])


@interp("kpool_store")
def _(n, a, cx):
    return _kpool_store(*a)


@interp("kpool_expand")
def _(n, a, cx):
    return _kpool_expand(a[0], a[1], int(cx.n_kv), n.attrs["kpool"], n.attrs["tail"])


@interp("index_mask_load")
def _(n, a, cx):
    return a[0][None, :int(cx.n_kv)].copy()


check_impls(INTERP, "IR interpreter (compiler/ir/interpret.py)")


def run(graph: Graph, inputs: dict, weights, states: dict, n_kv: int | None = None, keep_kv: bool = False,
        quantized_activations=frozenset()) -> dict:
    """Execute `graph`. `weights` maps GGUF name → float32 array (or a callable name → array);
    `states` maps state name → numpy array (mutated in place). Returns {output name: array}.
    `keep_kv`: the KV caches already hold this call's rows (written by another run, e.g. a compiled one) and
    `set_rows` leaves them: rounding a row to f16 / q8_0 is discontinuous, so two implementations whose rows differ
    in the last bit may store values one rounding step apart; with the same cache contents they must agree.
    `quantized_activations`: weights whose `mul_mat` / `mul_mat_id` multiply int8-quantized activation rows,
    {name: row format} as an artifact's buffer plan marks them ("activation": "q8" or "q8_0"; a set of names means
    "q8"): x is replaced by what its quantized rows stand for (nextn.common.quant.activation) and the product is
    taken in float64."""
    get_w = weights if callable(weights) else weights.__getitem__
    q8 = dict(quantized_activations) if hasattr(quantized_activations, "items") else \
        dict.fromkeys(quantized_activations, "q8")
    cx = Run(n_kv, keep_kv, q8)
    env: dict[int, np.ndarray] = {}
    for n in graph.live_nodes():
        if n.op == "input":
            r = np.asarray(inputs[n.name])
        elif n.op == "weight":
            r = get_w(n.name)
        elif n.op == "state":
            r = states[n.name]
        else:
            r = INTERP[n.op](n, [env[i.id] for i in n.inputs], cx)
        env[n.id] = r.astype(np.float32, copy=False) if n.dtype == "float32" and r.dtype != np.float32 else r
    return {k: env[v.id] for k, v in graph.outputs.items()}
