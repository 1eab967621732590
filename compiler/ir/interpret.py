"""A small numpy interpreter of the IR: the executable specification every compiled kernel is tested against.

Float32 throughout (as the fixtures' references), except the softmax/rms reductions, which numpy
accumulates pairwise. States (KV caches) are numpy arrays updated in place by `set_rows`.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph, Node


def _rope_neox(x, pos, n_rot, base):
    half = n_rot // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]          # [T, half]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    out = x.copy()
    x0, x1 = x[..., :half], x[..., half:n_rot]
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x0 * sin + x1 * cos
    return out


def _rope_norm(x, pos, n_rot, base):
    half = n_rot // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    out = x.copy()
    x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = x0 * cos - x1 * sin
    out[..., 1:n_rot:2] = x0 * sin + x1 * cos
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
        s = s - s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ vv[:, h // g, :]
    return out


def _top_k(x, k):
    order = np.argsort(-x, axis=-1, kind="stable")
    return order[..., :k].astype(np.int32)


def run(graph: Graph, inputs: dict, weights, states: dict, n_kv: int | None = None) -> dict:
    """Execute `graph`. `weights` maps GGUF name → float32 array (or a callable name → array);
    `states` maps state name → numpy array (mutated in place). Returns {output name: array}."""
    get_w = weights if callable(weights) else weights.__getitem__
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
        elif op == "mul_mat":
            r = a[1] @ a[0].T
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
            f = _rope_neox if n.attrs["mode"] == "neox" else _rope_norm
            r = f(a[0], a[1], n.attrs["n_rot"], n.attrs["freq_base"])
        elif op == "set_rows":
            cache, rows, pos = a
            cache[pos] = rows
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
        else:
            raise NotImplementedError(op)
        env[n.id] = r.astype(np.float32, copy=False) if n.dtype == "float32" and r.dtype != np.float32 else r
    return {k: env[v.id] for k, v in graph.outputs.items()}
