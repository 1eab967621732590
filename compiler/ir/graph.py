"""The nextn graph IR: a DAG of ggml-named ops, built once per model entry point.

Shapes are row-major (numpy order; ggml's `ne` reversed). A dimension is an int or a symbol:
`T` (rows in this call), `R` (output rows), `L` (KV cells attended: n_past + T), `C` (cells of a
position-indexed state: the context size), `P` (planes of a recurrent state, below), or `X//k` for one of them
divided by an int (k-pools: `L//4` pools of 4 cells). Each node's op is one of
`OPS`, with the semantics of the ggml op of the same name (ggml/include/ggml.h), restated here so that
`interpret.py` (numpy) and `nextn.compiler.lower` (TVM) implement the same thing:

- get_rows(a[V,E], ids[T]) -> [T,E];   batched: get_rows(a[B,V,C], ids[B,n]) -> [B,n,C]
- rms_norm(x, eps): x / sqrt(mean(x^2, last axis) + eps)          (no weight: ggml multiplies after)
- mul, add, div(a, b): elementwise with numpy broadcasting;  scale(x, s[, b]): x * s (+ b: ggml_scale_bias)
- mul_mat(w[N,K], x[...,K]) -> [...,N]   (ggml_mul_mat(w, x) = x @ w.T; w may be quantized)
- mul_mat_id(w[X,N,K], x[T,K] | x[T,k,K], ids[T,k]) -> [T,k,N]   (per-row expert matmul)
- reshape(x, shape), view(x, axis, start, length), concat(a, b, axis)
- rope_ext(x[T,H,D], pos[T], n_rot, mode, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow,
  n_ctx_orig): mode "neox" rotates (i, i+n_rot/2), "norm" (2i, 2i+1), i < n_rot/2; dims >= n_rot pass through;
  angle = pos * freq_base^(-2i/n_rot) unless YaRN / linear scaling is set (ir/rope.py states those terms)
- set_rows(cache[C,H,D], rows[T,H,D], pos[T]) -> cache with cache[pos[t]] = rows[t]  (in place: KV store); a KV
  cache (`Graph.kv_state`) keeps rows rounded to its KV type, `nextn.common.kv_types` (f32 / f16 / bf16 / q8_0)
- flash_attn_ext(q[T,H,D], k[C,Hkv,D], v[C,Hkv,D], pos[T], scale) -> [T,H,D]; attends to cells
  s < L with s <= pos[t] (the causal KV mask), GQA head h reads kv head h // (H/Hkv); softmax in f32; a row
  with no cell to attend gets 0 (ggml flash_attn_ext: 1/S taken as 0 when S = 0)
- sigmoid(x), swiglu(g, u) = silu(g) * u, clamp(x, lo, hi), sum_rows(x) -> [..., 1]
- argsort_top_k(x[T,X], k) -> int32 [T,k]: indices of the k largest, descending, ties to the lower index
- argmax(x[R,V]) -> int32 [R]: first index of the maximum
- norm(x, eps): (x - mean) / sqrt(var + eps) over the last axis (ggml_norm: LayerNorm without weight/bias)
- mul_mat(w[B,N,K], x[...,B,K]) -> [...,B,N]: the batched form (ggml broadcasts mul_mat over dim 2), one
  matrix per head, e.g. MLA's absorbed `attn_k_b` / `attn_v_b`
- flash_attn_ext_mla(q[T,H,Dk], kv[C,1,Dk], pos[T], mask[T,L]?, scale, n_v) -> [T,H,n_v]: flash_attn_ext over
  an MLA K-only cache (one latent head, every query head reads it) whose V is the view kv[..., :n_v]; the
  causal mask as flash_attn_ext plus the optional additive mask (0 / -inf: the DSA selection); a row whose
  cells are all masked gets 0
- lightning_indexer(q[T,Hi,D], k[C,1,D], w[T,Hi], pos[T]) -> [T,L]: DSA index score
  sum_h relu(q[t,h]·k[s]) * w[t,h] for cells s <= pos[t], -inf elsewhere (llama.cpp glm-dsa.cpp; DeepSeek-V3.2)
- top_k_mask(score[T,L], pos[T], k) -> [T,L]: 0 on the min(k, pos[t]+1) largest causal scores of row t,
  -inf elsewhere; ties go to the lower cell index. A row with pos[t]+1 <= k selects every causal cell. This is
  ggml top_k(score, min(n_kv, k)) + set_rows into a -inf mask, restricted to the causal cells (the others are
  masked by attention anyway)
- index_mask_store(state[C], mask[T,L], pos[T]) -> state: state[s] = mask[T-1, s] for s <= pos[T-1], 0 (selected)
  for later cells (in place: keeps a draft step's DSA selection for the next steps of the round; by position,
  not by L, so that a call with L rounded up past the last row stores the same thing)
- index_mask_load(state[C]) -> [1,L]: state[:L]

Recurrent states (GLM-5.3-Flash's KDA layers) have shape [P, ...]: P planes, of which the input `rs_plane`
(int32 [1]) names the one holding the committed state (the state before row 0). A call keeps the state after
each of its last min(T, P-1) rows, the state after row t in *slot* s = T-1-t, stored in plane
(rs_plane + 1 + s) mod P (never rs_plane itself); the runtime commits n rows by making slot T-n the new rs_plane
(llama.cpp's per-row state snapshots, `n_rs_seq`, src/llama-memory-recurrent.cpp). With P = 1 a call keeps only
the state after its last row, in place (plain decoding: no rollback). A call whose first row is at position 0
starts a sequence: its initial state is zero, whatever plane rs_plane names.
- silu(x) = x * sigmoid(x);  softplus(x) = log(1 + exp(x))
- ssm_conv(x[T,Ch], w[Ch,K], state[P,K-1,Ch], pos[T], rs_plane[1]) -> [T,Ch]: ggml_ssm_conv over
  concat(history, x): y[t,c] = sum_j w[c,j] * sx[t+j, c], history = the K-1 inputs before row 0 (the state);
  keeps the last K-1 inputs after each row in the planes
- gated_delta_net(q[T,H,Dk], k[T,H,Dk], v[T,H,Dv], g[T,H,Dk], beta[T,H], state[P,H,Dk,Dv], pos[T], rs_plane[1],
  chunk) -> [T,H,Dv]: the gated delta rule (ggml_gated_delta_net; Kimi Delta Attention, arXiv:2510.26692), per
  head, state S[i, j] (key i, value j: transformers' layout, the transpose of ggml's): S = exp(g_t)[:, None] * S
  (decay along the key axis); S += outer(k_t, beta_t (v_t - S^T k_t)); o_t = S^T q_t (q as given: callers
  scale it). chunk 0: the per-token
  recurrence, keeping the state after each of its kept rows; chunk c > 0: the chunked form (WY /
  UT transform over chunks of c rows), keeping only the state after the last row (slot 0). Callers pick c so
  that a chunk's total decay |sum g| stays <= 80 (its kernel factors the pairwise decays)
- dsv4_hc_comb(c[T,S,S], eps, iters) -> [T,S,S]: mHC's Sinkhorn-normalised stream mix (ggml_dsv4_hc_comb after
  its scale/bias), c indexed [src, dst]: softmax over dst + eps, divide by (sum over src + eps), then iters-1
  times {divide by (sum over dst + eps), divide by (sum over src + eps)}
- lightning_indexer(..., kpool) with kpool > 1: k[Cp,1,D] holds pooled keys, one per pool of kpool cells;
  the score is [T, L//kpool] and pool p is causal for row t when its last cell (p+1)*kpool-1 <= pos[t]
- top_k_mask(score[T,L//kpool], pos, k, kpool): over pools, with (pos[t]+1)//kpool causal pools in row t
- kpool_store(pooled[Cp,1,D], ik[C,1,D], ig[C,1,D], ape[kpool,D], pos[T]) -> pooled: for each row t that
  completes a pool ((pos[t]+1) % kpool == 0), p = pos[t]//kpool and, per channel d,
  pooled[p,0,d] = sum_j softmax_j(ig[kpool*p+j, d] + ape[j, d]) * ik[kpool*p+j, d] (in place)
- kpool_expand(pool_mask[T,L//kpool], pos, kpool, tail) -> [T,L]: the cell mask of a pool selection: cell s
  takes its pool's mask when that pool is complete at row t (s//kpool < (pos[t]+1)//kpool), else 0 (`tail`:
  the row's incomplete pool, its most recent cells, is always attended) or -inf
- index_mask_store(..., after): the value stored for the cells after the last row (0 = selected, -inf = not)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from nextn.common.manifest import dim_value, resolve_shape  # noqa: F401  (the manifest records IR shapes)

OPS = frozenset({
    "get_rows", "rms_norm", "mul", "add", "div", "scale", "mul_mat", "mul_mat_id", "reshape", "view",
    "concat", "rope_ext", "set_rows", "flash_attn_ext", "sigmoid", "swiglu", "clamp", "sum_rows",
    "argsort_top_k", "argmax",
    "norm", "flash_attn_ext_mla", "lightning_indexer", "top_k_mask", "index_mask_store", "index_mask_load",
    "silu", "softplus", "ssm_conv", "gated_delta_net", "dsv4_hc_comb", "kpool_store", "kpool_expand",
})
LEAVES = frozenset({"input", "weight", "state"})

Dim = int | str


def div_dim(d: Dim, k: int) -> Dim:
    """`d` divided by k (floor) as a dimension: an int, or the symbol form "X//k"."""
    if k == 1:
        return d
    if isinstance(d, int):
        return d // k
    assert "//" not in d, d
    return f"{d}//{k}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: tuple["Node", ...]
    shape: tuple[Dim, ...]
    dtype: str = "float32"
    attrs: dict = field(default_factory=dict)
    name: str = ""
    id: int = -1

    def __repr__(self) -> str:
        return f"%{self.id}:{self.op}{list(self.shape)}{'' if not self.name else ' ' + self.name}"


def _bcast(a: tuple, b: tuple) -> tuple:
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


class Graph:
    """A graph under construction: leaves (inputs, weights, states) plus ggml-named ops."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: dict[str, Node] = {}
        self.weights: dict[str, Node] = {}
        self.states: dict[str, Node] = {}
        self.outputs: dict[str, Node] = {}

    # -- leaves -----------------------------------------------------------------------------------
    def _add(self, node: Node) -> Node:
        node.id = len(self.nodes)
        self.nodes.append(node)
        return node

    def input(self, name: str, shape, dtype="float32") -> Node:
        n = self._add(Node("input", (), tuple(shape), dtype, name=name))
        self.inputs[name] = n
        return n

    def weight(self, name: str, shape) -> Node:
        """A model tensor by its GGUF name (deduplicated)."""
        if name not in self.weights:
            self.weights[name] = self._add(Node("weight", (), tuple(shape), "float32", name=name))
        return self.weights[name]

    def state(self, name: str, shape) -> Node:
        """A persistent float32 buffer that ops may update in place (e.g. a stored DSA selection)."""
        n = self._add(Node("state", (), tuple(shape), "float32", name=name))
        self.states[name] = n
        return n

    def kv_state(self, name: str, shape, role: str) -> Node:
        """A KV cache [C, H, D]: a state that `set_rows` writes and attention / the indexer read. `role` "k" or "v"
        says which cache type it takes (llama.cpp -ctk / -ctv; keys of an MLA latent cache or of the DSA indexer
        are "k"); `set_kv_types` fixes the types, f32 until then."""
        assert role in ("k", "v"), role
        n = self.state(name, shape)
        n.attrs.update(kv_role=role, kv_type="f32")
        return n

    def set_kv_types(self, type_k: str, type_v: str) -> None:
        """Give every KV cache its type by role. Raises NextnError naming the cache when its rows do not fit the
        type's blocks (q8_0: 32 values)."""
        from nextn.common.kv_types import kv_type

        for name, n in self.states.items():
            role = n.attrs.get("kv_role")
            if role is not None:
                t = kv_type(type_k if role == "k" else type_v, "--cache-type-k" if role == "k" else "--cache-type-v")
                t.check_width(int(n.shape[-1]), f"KV cache '{name}'")
                n.attrs["kv_type"] = t.name

    def kv_types(self) -> dict[str, str]:
        """KV cache name → its KV type."""
        return {name: n.attrs["kv_type"] for name, n in self.states.items() if "kv_type" in n.attrs}

    def output(self, name: str, node: Node) -> None:
        self.outputs[name] = node

    def _op(self, op, inputs, shape, dtype="float32", **attrs) -> Node:
        assert op in OPS, op
        return self._add(Node(op, tuple(inputs), tuple(shape), dtype, attrs))

    # -- ggml ops ---------------------------------------------------------------------------------
    def get_rows(self, a, ids):
        if len(a.shape) == 2:   # an int32 table (the draft vocabulary's ids) gives int32 rows
            return self._op("get_rows", (a, ids), (*ids.shape, a.shape[1]), a.dtype)
        return self._op("get_rows", (a, ids), (a.shape[0], ids.shape[1], a.shape[2]))

    def rms_norm(self, x, eps: float):
        return self._op("rms_norm", (x,), x.shape, eps=float(eps))

    def mul(self, a, b):
        return self._op("mul", (a, b), _bcast(a.shape, b.shape))

    def add(self, a, b):
        return self._op("add", (a, b), _bcast(a.shape, b.shape))

    def div(self, a, b):
        return self._op("div", (a, b), _bcast(a.shape, b.shape))

    def scale(self, x, s: float, b: float = 0.0):
        """ggml_scale (x * s), or ggml_scale_bias (x * s + b) when b != 0."""
        at = {"b": float(b)} if b != 0.0 else {}
        return self._op("scale", (x,), x.shape, s=float(s), **at)

    def mul_mat(self, w, x):
        assert w.shape[-1] == x.shape[-1], (w, x)
        if len(w.shape) == 3:   # batched over heads: w[B,N,K] x[...,B,K]
            assert x.shape[-2] == w.shape[0], (w, x)
        return self._op("mul_mat", (w, x), (*x.shape[:-1], w.shape[-2]))

    def mul_mat_id(self, w, x, ids):
        return self._op("mul_mat_id", (w, x, ids), (ids.shape[0], ids.shape[1], w.shape[1]))

    def reshape(self, x, shape):
        return self._op("reshape", (x,), tuple(shape), x.dtype)

    def view(self, x, axis: int, start: int, length: int):
        shape = list(x.shape)
        shape[axis] = length
        return self._op("view", (x,), shape, x.dtype, axis=axis, start=start, length=length)

    def concat(self, a, b, axis: int):
        shape = list(a.shape)
        shape[axis] = a.shape[axis] + b.shape[axis]
        return self._op("concat", (a, b), shape, axis=axis)

    def rope_ext(self, x, pos, n_rot: int, mode: str, freq_base: float, freq_scale: float = 1.0,
                 ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 n_ctx_orig: int = 0):
        """ggml_rope_ext's parameters, in its order; see `rope.py` for the YaRN terms."""
        return self._op("rope_ext", (x, pos), x.shape, n_rot=n_rot, mode=mode, freq_base=float(freq_base),
                        freq_scale=float(freq_scale), ext_factor=float(ext_factor), attn_factor=float(attn_factor),
                        beta_fast=float(beta_fast), beta_slow=float(beta_slow), n_ctx_orig=int(n_ctx_orig))

    def set_rows(self, cache, rows, pos):
        return self._op("set_rows", (cache, rows, pos), cache.shape)

    def flash_attn_ext(self, q, k, v, pos, scale: float):
        return self._op("flash_attn_ext", (q, k, v, pos), (q.shape[0], q.shape[1], v.shape[2]), scale=float(scale))

    def sigmoid(self, x):
        return self._op("sigmoid", (x,), x.shape)

    def swiglu(self, g, u):
        return self._op("swiglu", (g, u), g.shape)

    def clamp(self, x, lo: float, hi: float):
        return self._op("clamp", (x,), x.shape, lo=float(lo), hi=float(hi))

    def sum_rows(self, x):
        return self._op("sum_rows", (x,), (*x.shape[:-1], 1))

    def argsort_top_k(self, x, k: int):
        return self._op("argsort_top_k", (x,), (*x.shape[:-1], k), "int32", k=k)

    def argmax(self, x):
        return self._op("argmax", (x,), x.shape[:-1], "int32")

    def norm(self, x, eps: float):
        return self._op("norm", (x,), x.shape, eps=float(eps))

    def flash_attn_ext_mla(self, q, kv, pos, mask, scale: float, n_v: int):
        ins = (q, kv, pos) if mask is None else (q, kv, pos, mask)
        return self._op("flash_attn_ext_mla", ins, (q.shape[0], q.shape[1], n_v), scale=float(scale), n_v=int(n_v))

    def lightning_indexer(self, q, k, w, pos, kpool: int = 1):
        at = {"kpool": int(kpool)} if kpool != 1 else {}
        return self._op("lightning_indexer", (q, k, w, pos), (q.shape[0], div_dim("L", kpool)), **at)

    def top_k_mask(self, score, pos, k: int, kpool: int = 1):
        at = {"kpool": int(kpool)} if kpool != 1 else {}
        return self._op("top_k_mask", (score, pos), score.shape, k=int(k), **at)

    def index_mask_store(self, state, mask, pos, after: float = 0.0):
        at = {"after": float(after)} if after != 0.0 else {}
        return self._op("index_mask_store", (state, mask, pos), state.shape, **at)

    def silu(self, x):
        return self._op("silu", (x,), x.shape)

    def softplus(self, x):
        return self._op("softplus", (x,), x.shape)

    def ssm_conv(self, x, w, state, pos, rs_plane):
        assert w.shape == (x.shape[1], state.shape[1] + 1) and state.shape[2] == x.shape[1], (x, w, state)
        return self._op("ssm_conv", (x, w, state, pos, rs_plane), x.shape)

    def gated_delta_net(self, q, k, v, g, beta, state, pos, rs_plane, chunk: int = 0):
        T, H, Dk = q.shape
        assert k.shape == g.shape == q.shape and beta.shape == (T, H) and state.shape[1:] == (H, Dk, v.shape[2])
        return self._op("gated_delta_net", (q, k, v, g, beta, state, pos, rs_plane), v.shape, chunk=int(chunk))

    def dsv4_hc_comb(self, c, eps: float, iters: int):
        return self._op("dsv4_hc_comb", (c,), c.shape, eps=float(eps), iters=int(iters))

    def kpool_store(self, pooled, ik, ig, ape, pos):
        assert ape.shape == (ape.shape[0], ik.shape[2]), ape
        return self._op("kpool_store", (pooled, ik, ig, ape, pos), pooled.shape, kpool=int(ape.shape[0]))

    def kpool_expand(self, pool_mask, pos, kpool: int, tail: bool):
        return self._op("kpool_expand", (pool_mask, pos), (pool_mask.shape[0], "L"), kpool=int(kpool), tail=bool(tail))

    def index_mask_load(self, state):
        return self._op("index_mask_load", (state,), (1, "L"))

    # -- inspection -------------------------------------------------------------------------------
    def live_nodes(self) -> list[Node]:
        """Nodes reachable from the outputs, in topological (creation) order."""
        seen: set[int] = set()
        stack = list(self.outputs.values())
        while stack:
            n = stack.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            stack.extend(n.inputs)
        return [n for n in self.nodes if n.id in seen]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.live_nodes():
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def dump(self) -> str:
        lines = []
        for n in self.live_nodes():
            args = ", ".join(f"%{i.id}" for i in n.inputs)
            attrs = "".join(f" {k}={v}" for k, v in n.attrs.items())
            lines.append(f"%{n.id} = {n.op}({args}){attrs} : {n.dtype}{list(n.shape)} {n.name}")
        for k, v in self.outputs.items():
            lines.append(f"output {k} = %{v.id}")
        return "\n".join(lines)
