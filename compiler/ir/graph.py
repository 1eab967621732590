"""The nextn graph IR: a DAG of ggml-named ops, built once per model entry point.

Shapes are row-major (numpy order; ggml's `ne` reversed). A dimension is an int or a symbol:
`T` (rows in this call), `R` (output rows), `L` (KV cells attended: n_past + T), `C` (cells of a
position-indexed state: the context size), `P` (planes of a recurrent state, below), or `X//k` for one of them
divided by an int (k-pools: `L//4` pools of 4 cells). Each node's op is one of
`OPS`: the op table (ops.py) gives each op's signature, shape rule, attributes and semantics.

Recurrent states (GLM-5.3-Flash's KDA layers) have shape [P, ...]: P planes, of which the input `rs_plane`
(int32 [1]) names the one holding the committed state (the state before row 0). A call keeps the state after
each of its last min(T, P-1) rows, the state after row t in *slot* s = T-1-t, stored in plane
(rs_plane + 1 + s) mod P (never rs_plane itself); the runtime commits n rows by making slot T-n the new rs_plane
(llama.cpp's per-row state snapshots, `n_rs_seq`, src/llama-memory-recurrent.cpp). With P = 1 a call keeps only
the state after its last row, in place (plain decoding: no rollback). A call whose first row is at position 0
starts a sequence: its initial state is zero, whatever plane rs_plane names.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from nextn.common.manifest import div_dim, dim_value, resolve_shape  # noqa: F401  (the shape grammar's home)

from .ops import TABLE

OPS = frozenset(TABLE)
LEAVES = frozenset({"input", "weight", "state"})

Dim = int | str


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

    def _op(self, op, inputs, shape=None, **attrs) -> Node:
        """A node of `op` (ops.TABLE): its shape by the op's rule (`shape`: the builder's, for reshape), its dtype
        by the op's; attributes outside the op's `attrs` are a builder bug."""
        spec = TABLE[op]
        assert set(attrs) <= set(spec.attrs), (op, attrs)
        if shape is None:
            shape = spec.shape([i.shape for i in inputs], attrs)
        dtype = inputs[0].dtype if spec.dtype == "same" else spec.dtype
        return self._add(Node(op, tuple(inputs), tuple(shape), dtype, attrs))

    # -- ggml ops (ops.TABLE states each) ---------------------------------------------------------
    def get_rows(self, a, ids):
        return self._op("get_rows", (a, ids))

    def rms_norm(self, x, eps: float):
        return self._op("rms_norm", (x,), eps=float(eps))

    def mul(self, a, b):
        return self._op("mul", (a, b))

    def add(self, a, b):
        return self._op("add", (a, b))

    def div(self, a, b):
        return self._op("div", (a, b))

    def scale(self, x, s: float, b: float = 0.0):
        """ggml_scale (x * s), or ggml_scale_bias (x * s + b) when b != 0."""
        at = {"b": float(b)} if b != 0.0 else {}
        return self._op("scale", (x,), s=float(s), **at)

    def mul_mat(self, w, x):
        assert w.shape[-1] == x.shape[-1], (w, x)
        if len(w.shape) == 3:   # batched over heads: w[B,N,K] x[...,B,K]
            assert x.shape[-2] == w.shape[0], (w, x)
        return self._op("mul_mat", (w, x))

    def mul_mat_id(self, w, x, ids):
        return self._op("mul_mat_id", (w, x, ids))

    def reshape(self, x, shape):
        return self._op("reshape", (x,), tuple(shape))

    def view(self, x, axis: int, start: int, length: int):
        return self._op("view", (x,), axis=axis, start=start, length=length)

    def concat(self, a, b, axis: int):
        return self._op("concat", (a, b), axis=axis)

    def rope_ext(self, x, pos, n_rot: int, mode: str, freq_base: float, freq_scale: float = 1.0,
                 ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 n_ctx_orig: int = 0):
        """ggml_rope_ext's parameters, in its order; see `rope.py` for the YaRN terms."""
        return self._op("rope_ext", (x, pos), n_rot=n_rot, mode=mode, freq_base=float(freq_base),
                        freq_scale=float(freq_scale), ext_factor=float(ext_factor), attn_factor=float(attn_factor),
                        beta_fast=float(beta_fast), beta_slow=float(beta_slow), n_ctx_orig=int(n_ctx_orig))

    def set_rows(self, cache, rows, pos):
        return self._op("set_rows", (cache, rows, pos))

    def flash_attn_ext(self, q, k, v, pos, scale: float):
        return self._op("flash_attn_ext", (q, k, v, pos), scale=float(scale))

    def sigmoid(self, x):
        return self._op("sigmoid", (x,))

    def swiglu(self, g, u):
        return self._op("swiglu", (g, u))

    def clamp(self, x, lo: float, hi: float):
        return self._op("clamp", (x,), lo=float(lo), hi=float(hi))

    def sum_rows(self, x):
        return self._op("sum_rows", (x,))

    def argsort_top_k(self, x, k: int):
        return self._op("argsort_top_k", (x,), k=k)

    def argmax(self, x):
        return self._op("argmax", (x,))

    def norm(self, x, eps: float):
        return self._op("norm", (x,), eps=float(eps))

    def flash_attn_ext_mla(self, q, kv, pos, mask, scale: float, n_v: int):
        ins = (q, kv, pos) if mask is None else (q, kv, pos, mask)
        return self._op("flash_attn_ext_mla", ins, scale=float(scale), n_v=int(n_v))

    def lightning_indexer(self, q, k, w, pos, kpool: int = 1):
        at = {"kpool": int(kpool)} if kpool != 1 else {}
        return self._op("lightning_indexer", (q, k, w, pos), **at)

    def top_k_mask(self, score, pos, k: int, kpool: int = 1):
        at = {"kpool": int(kpool)} if kpool != 1 else {}
        return self._op("top_k_mask", (score, pos), k=int(k), **at)

    def index_mask_store(self, state, mask, pos, after: float = 0.0):
        at = {"after": float(after)} if after != 0.0 else {}
        return self._op("index_mask_store", (state, mask, pos), **at)

    def silu(self, x):
        return self._op("silu", (x,))

    def softplus(self, x):
        return self._op("softplus", (x,))

    def ssm_conv(self, x, w, state, pos, rs_plane):
        assert w.shape == (x.shape[1], state.shape[1] + 1) and state.shape[2] == x.shape[1], (x, w, state)
        return self._op("ssm_conv", (x, w, state, pos, rs_plane))

    def gated_delta_net(self, q, k, v, g, beta, state, pos, rs_plane, chunk: int = 0):
        T, H, Dk = q.shape
        assert k.shape == g.shape == q.shape and beta.shape == (T, H) and state.shape[1:] == (H, Dk, v.shape[2])
        return self._op("gated_delta_net", (q, k, v, g, beta, state, pos, rs_plane), chunk=int(chunk))

    def dsv4_hc_comb(self, c, eps: float, iters: int):
        return self._op("dsv4_hc_comb", (c,), eps=float(eps), iters=int(iters))

    def kpool_store(self, pooled, ik, ig, ape, pos):
        assert ape.shape == (ape.shape[0], ik.shape[2]), ape
        return self._op("kpool_store", (pooled, ik, ig, ape, pos), kpool=int(ape.shape[0]))

    def kpool_expand(self, pool_mask, pos, kpool: int, tail: bool):
        return self._op("kpool_expand", (pool_mask, pos), kpool=int(kpool), tail=bool(tail))

    def index_mask_load(self, state):
        return self._op("index_mask_load", (state,))

    # -- rewriting --------------------------------------------------------------------------------
    def splice_after(self, node: Node, build) -> Node:
        """Insert after `node` the nodes that `build(node)` creates and make every consumer of `node` (and every
        output that is `node`) read the node `build` returns instead. The new nodes are moved right after `node` in
        creation order (ids renumbered), so that the order stays topological; they may read `node`, leaves and
        nodes created before `node`."""
        start = len(self.nodes)
        new = build(node)
        added = self.nodes[start:]
        for n in self.nodes[:start]:
            if any(i is node for i in n.inputs):
                n.inputs = tuple(new if i is node else i for i in n.inputs)
        for k, v in self.outputs.items():
            if v is node:
                self.outputs[k] = new
        del self.nodes[start:]
        at = self.nodes.index(node) + 1
        self.nodes[at:at] = added
        for i, n in enumerate(self.nodes):
            n.id = i
        return new

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
