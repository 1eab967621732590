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
    float32."""
    from nextn.common.quant import activation

    xq = activation.round_trip(x, row_format)
    w = w.astype(np.float64)
    if op == "mul_mat":
        return (xq @ w.T).astype(np.float32)
    T, k = ids.shape
    xs = xq if xq.ndim == 3 else np.broadcast_to(xq[:, None, :], (T, k, xq.shape[-1]))
    return np.einsum("tjk,tjnk->tjn", xs, w[ids]).astype(np.float32)


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
    env: dict[int, np.ndarray] = {}
    for n in graph.live_nodes():
        a = [env[i.id] for i in n.inputs]
        op = n.op
        if op == "input":
            r = np.asarray(inputs[n.name])
        elif op == "weight":
            r = get_w(n.name)
        elif op == "state":
            r = states[n.name]
        elif op == "get_rows":
            t, ids = a
            r = t[ids] if t.ndim == 2 else np.stack([t[b][ids[b]] for b in range(t.shape[0])])
        elif op == "rms_norm":
            x = a[0]
            r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(n.attrs["eps"]))
        elif op == "mul":
            r = a[0] * a[1]
        elif op == "add":
            r = a[0] + a[1]
        elif op == "div":
            r = a[0] / a[1]
        elif op == "scale":
            r = a[0] * np.float32(n.attrs["s"])
            if "b" in n.attrs:
                r = r + np.float32(n.attrs["b"])
        elif op in ("mul_mat", "mul_mat_id") and n.inputs[0].op == "weight" and n.inputs[0].name in q8:
            r = _quantized_matmul(q8[n.inputs[0].name], op, *a)
        elif op == "mul_mat":
            r = a[1] @ a[0].T if a[0].ndim == 2 else np.einsum("...bk,bnk->...bn", a[1], a[0])
        elif op == "mul_mat_id":
            w, x, ids = a
            T, k = ids.shape
            xs = x if x.ndim == 3 else np.broadcast_to(x[:, None, :], (T, k, x.shape[-1]))
            r = np.einsum("tjk,tjnk->tjn", xs, w[ids])
        elif op == "reshape":
            r = a[0].reshape([d if isinstance(d, int) else -1 for d in n.shape])
        elif op == "view":
            ax, s, ln = n.attrs["axis"], n.attrs["start"], n.attrs["length"]
            r = np.take(a[0], np.arange(s, s + ln), axis=ax)
        elif op == "concat":
            r = np.concatenate(a, axis=n.attrs["axis"])
        elif op == "rope_ext":
            r = _rope(a[0], a[1], **n.attrs)
        elif op == "set_rows":
            cache, rows, pos = a
            if not keep_kv:
                cache[pos] = KV_TYPES[_leaf(n.inputs[0]).attrs.get("kv_type", "f32")].round(rows)
            r = cache
        elif op == "flash_attn_ext":
            q, k, v, pos = a
            r = _attn(q, k, v, pos, int(n_kv), n.attrs["scale"])
        elif op == "sigmoid":
            r = (1.0 / (1.0 + np.exp(-a[0]))).astype(np.float32)
        elif op == "swiglu":
            g, u = a
            r = (g / (1.0 + np.exp(-g))) * u
        elif op == "clamp":
            r = np.clip(a[0], n.attrs["lo"], n.attrs["hi"])
        elif op == "sum_rows":
            r = a[0].sum(axis=-1, keepdims=True)
        elif op == "argsort_top_k":
            r = _top_k(a[0], n.attrs["k"])
        elif op == "argmax":
            r = np.argmax(a[0], axis=-1).astype(np.int32)
        elif op == "norm":
            x = a[0]
            xc = x - np.mean(x, axis=-1, keepdims=True)
            r = xc / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + np.float32(n.attrs["eps"]))
        elif op == "flash_attn_ext_mla":
            q, kv, pos = a[:3]
            r = _attn_mla(q, kv, pos, a[3] if len(a) > 3 else None, int(n_kv), n.attrs["scale"], n.attrs["n_v"])
        elif op == "lightning_indexer":
            r = _lightning_indexer(*a, int(n_kv), n.attrs.get("kpool", 1))
        elif op == "top_k_mask":
            r = _top_k_mask(a[0], a[1], n.attrs["k"], n.attrs.get("kpool", 1))
        elif op == "index_mask_store":
            state, mask, pos = a
            last = int(pos[-1]) + 1
            state[:last] = mask[-1, :last]
            state[last:] = n.attrs.get("after", 0.0)
            r = state
        elif op == "silu":
            r = a[0] / (1.0 + np.exp(-a[0]))
        elif op == "softplus":
            r = np.logaddexp(np.float32(0), a[0])
        elif op == "ssm_conv":
            r = _ssm_conv(*a)
        elif op == "gated_delta_net":
            r = _gated_delta_net(*a, n.attrs["chunk"])
        elif op == "dsv4_hc_comb":
            r = _dsv4_hc_comb(a[0], n.attrs["eps"], n.attrs["iters"])
        elif op == "kpool_store":
            r = _kpool_store(*a)
        elif op == "kpool_expand":
            r = _kpool_expand(a[0], a[1], int(n_kv), n.attrs["kpool"], n.attrs["tail"])
        elif op == "index_mask_load":
            r = a[0][None, :int(n_kv)].copy()
        else:
            raise NotImplementedError(op)
        env[n.id] = r.astype(np.float32, copy=False) if n.dtype == "float32" and r.dtype != np.float32 else r
    return {k: env[v.id] for k, v in graph.outputs.items()}
