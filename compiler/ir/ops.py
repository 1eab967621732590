"""The IR's op table: each op once, with its signature (inputs and the shape rule), attributes and semantics.

An op has the semantics of the ggml op of the same name (ggml/include/ggml.h), restated here so that the numpy
interpreter (`interpret.py`, one `@interp(op)` function per op) and the TVM lowering (`nextn.compiler.lower.to_relax`,
one `@lower(op)` function per op) implement the same thing; both check at import that they cover this table
(`check_impls`). `Graph` (graph.py) builds nodes through the table: a node's shape comes from its op's `shape` rule,
its attributes must be among the op's `attrs`. Shapes and symbols (T, R, L, C, P, "X//k"): see graph.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from nextn.common.manifest import div_dim


@dataclass(frozen=True)
class Op:
    """One IR op. `signature`: inputs [shapes] -> output shape, as text; `shape(input shapes, attrs)`: the output
    shape (None: the builder states it, e.g. reshape's target); `dtype`: the output's ("same": input 0's);
    `attrs`: the attribute names a node may carry (optional ones are left out when they take their default)."""
    name: str
    signature: str
    doc: str
    shape: Callable | None
    attrs: tuple[str, ...] = ()
    dtype: str = "float32"


def bcast(a: tuple, b: tuple) -> tuple:
    """numpy broadcasting of two shapes. Raises ValueError when they do not broadcast."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        else:
            raise ValueError(f"shapes {a} and {b} do not broadcast")
    return tuple(out)


def _same(s, at):
    return s[0]


def _elementwise(s, at):
    return bcast(s[0], s[1])


def _get_rows(s, at):
    return (*s[1], s[0][1]) if len(s[0]) == 2 else (s[0][0], s[1][1], s[0][2])


def _view(s, at):
    shape = list(s[0])
    shape[at["axis"]] = at["length"]
    return shape


def _concat(s, at):
    shape = list(s[0])
    shape[at["axis"]] = s[0][at["axis"]] + s[1][at["axis"]]
    return shape


_ROPE = ("n_rot", "mode", "freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow",
         "n_ctx_orig")

_TABLE = (
    Op("get_rows", "get_rows(a[V,E], ids[...]) -> [...,E];   batched: get_rows(a[B,V,C], ids[B,n]) -> [B,n,C]",
       "the rows ids of a (ids of any rank: a[ids]; per batch b: a[b][ids[b]]); a's dtype (an int32 table, the "
       "draft vocabulary's ids, gives int32 rows)", _get_rows, dtype="same"),
    Op("rms_norm", "rms_norm(x, eps) -> x.shape",
       "x / sqrt(mean(x^2, last axis) + eps)  (no weight: ggml multiplies after)", _same, ("eps",)),
    Op("mul", "mul(a, b) -> broadcast(a, b)", "a * b, elementwise with numpy broadcasting", _elementwise),
    Op("add", "add(a, b) -> broadcast(a, b)", "a + b, elementwise with numpy broadcasting", _elementwise),
    Op("div", "div(a, b) -> broadcast(a, b)", "a / b, elementwise with numpy broadcasting", _elementwise),
    Op("scale", "scale(x, s[, b]) -> x.shape", "x * s (+ b: ggml_scale_bias; attribute b absent when 0)", _same,
       ("s", "b")),
    Op("mul_mat", "mul_mat(w[N,K], x[...,K]) -> [...,N];   batched: mul_mat(w[B,N,K], x[...,B,K]) -> [...,B,N]",
       "ggml_mul_mat(w, x) = x @ w.T; w may be quantized. The batched form (ggml broadcasts mul_mat over dim 2): one "
       "matrix per head, e.g. MLA's absorbed `attn_k_b` / `attn_v_b`",
       lambda s, at: (*s[1][:-1], s[0][-2])),
    Op("mul_mat_id", "mul_mat_id(w[X,N,K], x[T,K] | x[T,k,K], ids[T,k]) -> [T,k,N]",
       "per-row expert matmul: out[t,j] = w[ids[t,j]] @ x[t(,j)]", lambda s, at: (s[2][0], s[2][1], s[0][1])),
    Op("reshape", "reshape(x, shape) -> shape", "x's values in the new shape (row-major)", None, dtype="same"),
    Op("view", "view(x, axis, start, length) -> x.shape with [axis] = length",
       "x[..., start:start+length, ...] along `axis`", _view, ("axis", "start", "length"), "same"),
    Op("concat", "concat(a, b, axis) -> a.shape with [axis] = a[axis] + b[axis]", "a then b along `axis`",
       _concat, ("axis",)),
    Op("rope_ext", "rope_ext(x[T,H,D], pos[T], n_rot, mode, freq_base, freq_scale, ext_factor, attn_factor, "
       "beta_fast, beta_slow, n_ctx_orig) -> [T,H,D]",
       "ggml_rope_ext's parameters in its order: mode \"neox\" rotates (i, i+n_rot/2), \"norm\" (2i, 2i+1), "
       "i < n_rot/2; dims >= n_rot pass through; angle = pos * freq_base^(-2i/n_rot) unless YaRN / linear scaling "
       "is set (ir/rope.py states those terms)", _same, _ROPE),
    Op("set_rows", "set_rows(cache[C,H,D], rows[T,H,D], pos[T]) -> cache",
       "cache with cache[pos[t]] = rows[t]  (in place: KV store); a KV cache (`Graph.kv_state`) keeps rows rounded "
       "to its KV type, `nextn.common.kv_types` (f32 / f16 / bf16 / q8_0)", _same),
    Op("flash_attn_ext", "flash_attn_ext(q[T,H,D], k[C,Hkv,D], v[C,Hkv,Dv], pos[T], scale) -> [T,H,Dv]",
       "attends to cells s < L with s <= pos[t] (the causal KV mask), GQA head h reads kv head h // (H/Hkv); "
       "softmax in f32; a row with no cell to attend gets 0 (ggml flash_attn_ext: 1/S taken as 0 when S = 0)",
       lambda s, at: (s[0][0], s[0][1], s[2][2]), ("scale",)),
    Op("sigmoid", "sigmoid(x) -> x.shape", "1 / (1 + exp(-x))", _same),
    Op("swiglu", "swiglu(g, u) -> g.shape", "silu(g) * u", _same),
    Op("clamp", "clamp(x, lo, hi) -> x.shape", "min(max(x, lo), hi)", _same, ("lo", "hi")),
    Op("sum_rows", "sum_rows(x) -> [..., 1]", "the sum over the last axis", lambda s, at: (*s[0][:-1], 1)),
    Op("argsort_top_k", "argsort_top_k(x[T,X], k) -> int32 [T,k]",
       "indices of the k largest, descending, ties to the lower index", lambda s, at: (*s[0][:-1], at["k"]),
       ("k",), "int32"),
    Op("argmax", "argmax(x[R,V]) -> int32 [R]", "first index of the maximum", lambda s, at: s[0][:-1],
       dtype="int32"),
    Op("norm", "norm(x, eps) -> x.shape",
       "(x - mean) / sqrt(var + eps) over the last axis (ggml_norm: LayerNorm without weight/bias)", _same, ("eps",)),
    Op("flash_attn_ext_mla", "flash_attn_ext_mla(q[T,H,Dk], kv[C,1,Dk], pos[T], mask[T,L]?, scale, n_v) -> [T,H,n_v]",
       "flash_attn_ext over an MLA K-only cache (one latent head, every query head reads it) whose V is the view "
       "kv[..., :n_v]; the causal mask as flash_attn_ext plus the optional additive mask (0 / -inf: the DSA "
       "selection); a row whose cells are all masked gets 0", lambda s, at: (s[0][0], s[0][1], at["n_v"]),
       ("scale", "n_v")),
    Op("lightning_indexer", "lightning_indexer(q[T,Hi,D], k[C,1,D], w[T,Hi], pos[T][, kpool]) -> [T,L//kpool]",
       "DSA index score sum_h relu(q[t,h]·k[s]) * w[t,h] for cells s <= pos[t], -inf elsewhere (llama.cpp "
       "glm-dsa.cpp; DeepSeek-V3.2). With kpool > 1 (attribute absent when 1), k[Cp,1,D] holds pooled keys, one "
       "per pool of kpool cells; the score is [T, L//kpool] and pool p is causal for row t when its last cell "
       "(p+1)*kpool-1 <= pos[t]", lambda s, at: (s[0][0], div_dim("L", at.get("kpool", 1))), ("kpool",)),
    Op("top_k_mask", "top_k_mask(score[T,L//kpool], pos[T], k[, kpool]) -> score.shape",
       "0 on the min(k, pos[t]+1) largest causal scores of row t, -inf elsewhere; ties go to the lower cell index. "
       "A row with pos[t]+1 <= k selects every causal cell. This is ggml top_k(score, min(n_kv, k)) + set_rows into "
       "a -inf mask, restricted to the causal cells (the others are masked by attention anyway). With kpool > 1 "
       "(attribute absent when 1) over pools, with (pos[t]+1)//kpool causal pools in row t", _same, ("k", "kpool")),
    Op("index_mask_store", "index_mask_store(state[C], mask[T,L], pos[T][, after]) -> state",
       "state[s] = mask[T-1, s] for s <= pos[T-1], `after` for later cells (0 = selected, the default and then "
       "absent; -inf = not) (in place: keeps a draft step's DSA selection for the next steps of the round; by "
       "position, not by L, so that a call with L rounded up past the last row stores the same thing)",
       _same, ("after",)),
    Op("index_mask_load", "index_mask_load(state[C]) -> [1,L]", "state[:L]", lambda s, at: (1, "L")),
    Op("silu", "silu(x) -> x.shape", "x * sigmoid(x)", _same),
    Op("softplus", "softplus(x) -> x.shape", "log(1 + exp(x))", _same),
    Op("ssm_conv", "ssm_conv(x[T,Ch], w[Ch,K], state[P,K-1,Ch], pos[T], rs_plane[1]) -> [T,Ch]",
       "ggml_ssm_conv over concat(history, x): y[t,c] = sum_j w[c,j] * sx[t+j, c], history = the K-1 inputs before "
       "row 0 (the state, graph.py: recurrent states); keeps the last K-1 inputs after each row in the planes",
       _same),
    Op("gated_delta_net", "gated_delta_net(q[T,H,Dk], k[T,H,Dk], v[T,H,Dv], g[T,H,Dk], beta[T,H], state[P,H,Dk,Dv], "
       "pos[T], rs_plane[1], chunk) -> [T,H,Dv]",
       "the gated delta rule (ggml_gated_delta_net; Kimi Delta Attention, arXiv:2510.26692), per head, state "
       "S[i, j] (key i, value j: transformers' layout, the transpose of ggml's): S = exp(g_t)[:, None] * S (decay "
       "along the key axis); S += outer(k_t, beta_t (v_t - S^T k_t)); o_t = S^T q_t (q as given: callers scale "
       "it). chunk 0: the per-token recurrence, keeping the state after each of its kept rows (graph.py: recurrent "
       "states); chunk c > 0: the chunked form (WY / UT transform over chunks of c rows), keeping only the state "
       "after the last row (slot 0). Callers pick c so that a chunk's total decay |sum g| stays <= 80 (its kernel "
       "factors the pairwise decays)", lambda s, at: s[2], ("chunk",)),
    Op("dsv4_hc_comb", "dsv4_hc_comb(c[T,S,S], eps, iters) -> [T,S,S]",
       "mHC's Sinkhorn-normalised stream mix (ggml_dsv4_hc_comb after its scale/bias), c indexed [src, dst]: "
       "softmax over dst + eps, divide by (sum over src + eps), then iters-1 times {divide by (sum over dst + eps), "
       "divide by (sum over src + eps)}", _same, ("eps", "iters")),
    Op("kpool_store", "kpool_store(pooled[Cp,1,D], ik[C,1,D], ig[C,1,D], ape[kpool,D], pos[T]) -> pooled",
       "for each row t that completes a pool ((pos[t]+1) % kpool == 0), p = pos[t]//kpool and, per channel d, "
       "pooled[p,0,d] = sum_j softmax_j(ig[kpool*p+j, d] + ape[j, d]) * ik[kpool*p+j, d] (in place)", _same,
       ("kpool",)),
    Op("kpool_expand", "kpool_expand(pool_mask[T,L//kpool], pos[T], kpool, tail) -> [T,L]",
       "the cell mask of a pool selection: cell s takes its pool's mask when that pool is complete at row t "
       "(s//kpool < (pos[t]+1)//kpool), else 0 (`tail`: the row's incomplete pool, its most recent cells, is always "
       "attended) or -inf", lambda s, at: (s[0][0], "L"), ("kpool", "tail")),
)

TABLE: dict[str, Op] = {op.name: op for op in _TABLE}
assert len(TABLE) == len(_TABLE), "an op named twice in the table"


def check_impls(impls, where: str, table=None) -> None:
    """Raise RuntimeError naming the ops of `table` (default: TABLE) without an implementation in `impls` (a mapping
    op name → function) and the names in `impls` that are no op of the table; `where` names the implementations."""
    table = TABLE if table is None else table
    missing, unknown = sorted(set(table) - set(impls)), sorted(set(impls) - set(table))
    if missing or unknown:
        raise RuntimeError(f"{where}: ops without an implementation {missing}, implementations of no op {unknown} "
                           f"(the op table: compiler/ir/ops.py)")


def registry(impls: dict, where: str):
    """A decorator factory registering one implementation per op in `impls`: `@reg("rms_norm")` (several names:
    one function for each). Raises RuntimeError for a name of no op or an op registered twice."""
    def reg(*ops):
        def add(fn):
            for op in ops:
                if op not in TABLE or op in impls:
                    raise RuntimeError(f"{where}: '{op}' is {'registered twice' if op in impls else 'no IR op'}")
                impls[op] = fn
            return fn
        return add
    return reg
