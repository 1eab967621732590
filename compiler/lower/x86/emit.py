"""Lowering `mul_mat` / `mul_mat_id` IR nodes to the x86 kernels (called from `to_relax._emit`).

A node goes to an x86 kernel when its weight is 2-D [N, K] (`mul_mat`), 3-D [H, N, K] with x [T, H, K] (`mul_mat`
per head: absorbed MLA, batched.py) or 3-D [X, N, K] (`mul_mat_id`) of a
kind in `KINDS` whose block divides K; integer kinds also need the artifact to quantize activations
(`quantize_activations`), else they take the float path (Q8_0, IQ4_NL, MXFP4) or keep the TE element expression.
The activation rows of an integer kernel are quantized once per input and row format (the Q, K and V projections
share one quantized row; a "q8" and a "q8_0" matmul on the same input each get theirs), and the gate and up experts of an
MoE layer (two `mul_mat_id` on the same rows and ids with same-kind weights) run as one kernel that reads the
rows once for both.
"""
from __future__ import annotations

from tvm import relax, tirx

from . import FLOAT_KINDS, INT_KINDS, KernelSpec, act_args, default_knobs, has_vnni, l1d_kb, quantize_rows
from .formats import INT_FORMATS


def for_target(tgt, quantize_activations: bool = True, knobs_for=None) -> "X86Lowering | None":
    """The x86 kernels' lowering for an llvm target with AVX2 (else None: TE element expressions throughout).
    `knobs_for`: see X86Lowering (compile passes a tuning log's, `compiler.tune.apply.x86_knobs`)."""
    from . import vector_width

    width = vector_width(tgt)
    return None if width is None else X86Lowering(width, quantize_activations, knobs_for, tgt)


class X86Lowering:
    """State of one build: kernels added so far (by spec), quantized activations (by Relax value), fused groups.
    `width`: vector bytes (`vector_width`); `knobs_for(spec)` → Knobs or None (a tuning log), default `default_knobs`."""

    def __init__(self, width: int, quantize_activations: bool = True, knobs_for=None, target=None):
        self.width = width
        self.target = target        # for has_vnni at each kernel's vector width
        self.quantize_activations = quantize_activations
        self.knobs_for = knobs_for or (lambda spec: None)
        self._gvs: dict[str, relax.GlobalVar] = {}
        self._quantized: dict = {}
        self._done: dict[int, relax.Expr] = {}
        self._groups: dict[int, list] = {}
        self.quantized_weights: dict[str, str] = {}   # weight -> the row format ("q8", "q8_0") of its matmuls
        self.specs: dict[str, KernelSpec] = {}         # every x86 kernel of the build, by key

    # -- which nodes --------------------------------------------------------------------------------------------
    def _int_ok(self, kind: str, K: int) -> bool:
        return self.quantize_activations and kind in INT_KINDS and K % INT_FORMATS[kind].block == 0

    def _kind_ok(self, kind: str, K: int) -> bool:
        return self._int_ok(kind, K) or kind in FLOAT_KINDS and K % 32 == 0

    def _exact(self, kind: str, K: int) -> bool:
        """Float activation rows for this node (--exact-matmul, or a K the integer blocks do not divide)."""
        return not self._int_ok(kind, K)

    def handles(self, n, kind: str | None) -> bool:
        if n.op not in ("mul_mat", "mul_mat_id") or n.inputs[0].op != "weight" or kind is None:
            return False
        w = n.inputs[0].shape
        if n.op == "mul_mat" and len(w) == 3:    # per head (absorbed MLA): x [T, H, K] against w [H, N, K]
            x = n.inputs[1].shape
            if len(x) != 3 or x[1] != w[0]:
                return False
        elif n.op == "mul_mat" and len(w) != 2 or n.op == "mul_mat_id" and len(w) != 3:
            return False
        return all(isinstance(d, int) for d in w) and self._kind_ok(kind, w[-1])

    def plan(self, graph, weight_kinds: dict[str, str]) -> None:
        """Find the fusable groups of `graph`: `mul_mat_id` nodes on the same rows and ids, same weight kind/shape."""
        self._groups, self._done = {}, {}      # node ids are per graph
        groups: dict[tuple, list] = {}
        for n in graph.live_nodes():
            if n.op == "mul_mat_id" and self.handles(n, weight_kinds.get(n.inputs[0].name)):
                w, x, ids = n.inputs
                groups.setdefault((x.id, ids.id, weight_kinds[w.name], w.shape), []).append(n)
        for members in groups.values():
            for m in members:
                self._groups[m.id] = members

    # -- emission -----------------------------------------------------------------------------------------------
    def _kernel(self, bb, spec: KernelSpec) -> relax.GlobalVar:
        knobs = self.knobs_for(spec) or default_knobs(spec, self.width, l1d_kb(self.target))
        key = f"{spec.key}|{knobs}"
        if key not in self._gvs:
            vnni = self.target is not None and has_vnni(self.target, knobs.width)
            f = spec.build(knobs, vnni).with_attr("op_pattern", 8)    # kOpaque: FuseOps must not merge into it
            self._gvs[key] = bb.add_func(f, spec.name)
            self.specs[spec.key] = spec
        return self._gvs[key]

    def _acts(self, bb, spec, x2, rows):
        """The activation arguments of `spec`'s kernel: x itself (float path) or its quantized rows (memoized per
        input and row format)."""
        acts, K = spec.layout, spec.K
        if acts == "f32":
            return [x2]
        key = (x2, K, acts)
        if key not in self._quantized:
            gv = self._gvs.get(f"quantize:{acts}:{K}:{rows}")
            if gv is None:
                tag = {"q8": "q8_k", "q8_q4k": "q8_q4k_", "q8_iq4xs": "q8_iq4xs_", "q8_0": "q8_0_",
                       "q8_0_g8": "q8_0_g8_"}[acts]
                name = f"x86_quantize_{tag}{K}_rows{'t' if rows is None else rows}"
                gv = bb.add_func(quantize_rows(K, rows, name=name, row_format=acts).with_attr("op_pattern", 8), name)
                self._gvs[f"quantize:{acts}:{K}:{rows}"] = gv
            r = x2.ty.shape[0]
            args = act_args(spec.kind, rows, K, spec.exact)
            outs = [relax.TensorType(_sub_rows(shape, r), dtype) for _n, shape, dtype in args]
            q = bb.emit(relax.call_tir(gv, relax.Tuple([x2]), outs))
            self._quantized[key] = [bb.emit(relax.TupleGetItem(q, i)) for i in range(len(args))]
        return self._quantized[key]

    def emit(self, bb, n, env, sym):
        """The Relax value of node `n` (one `handles` accepts); `env`: to_relax's node id → value."""
        if n.id in self._done:
            return self._done.pop(n.id)
        args = [env[i.id] for i in n.inputs]
        if n.op == "mul_mat":
            if len(n.inputs[0].shape) == 3:
                return self._mul_mat_heads(bb, n, args, sym)
            return self._mul_mat(bb, n, args, sym)
        return self._mul_mat_id(bb, n, args, sym, env)

    def _mul_mat(self, bb, n, args, sym):
        (kind, (w, *_tables), _shape), x = _weight(args[0]), args[1]
        N, K = n.inputs[0].shape
        lead = [_dim(d, sym) for d in n.inputs[1].shape[:-1]]
        rows_e = _prod(lead)
        rows = int(rows_e) if isinstance(rows_e, tirx.IntImm) else None
        x2 = x if len(lead) == 1 else bb.emit(relax.op.reshape(x, [rows_e, K]))
        spec = KernelSpec("matmul", kind, N, K, rows, exact=self._exact(kind, K))
        acts = self._acts(bb, spec, x2, rows)
        if spec.acts != "f32":
            self.quantized_weights[n.inputs[0].name] = spec.acts
        gv = self._kernel(bb, spec)
        y = bb.emit(relax.call_tir(gv, relax.Tuple([w, *acts]), relax.TensorType([rows_e, N], "float32")))
        return y if len(lead) == 1 else bb.emit(relax.op.reshape(y, [*lead, N]))

    def _mul_mat_heads(self, bb, n, args, sym):
        (kind, (w, *_tables), _shape), x = _weight(args[0]), args[1]
        H, N, K = n.inputs[0].shape
        T_e = _dim(n.inputs[1].shape[0], sym)
        rows = int(T_e) if isinstance(T_e, tirx.IntImm) else None
        x2 = bb.emit(relax.op.reshape(x, [T_e * H, K]))
        spec = KernelSpec("matmul_heads", kind, N, K, rows, X=H, exact=self._exact(kind, K))
        acts = self._acts(bb, spec, x2, None if rows is None else rows * H)
        if spec.acts != "f32":
            self.quantized_weights[n.inputs[0].name] = spec.acts
        gv = self._kernel(bb, spec)
        return bb.emit(relax.call_tir(gv, relax.Tuple([w, *acts]), relax.TensorType([T_e, H, N], "float32")))

    def _mul_mat_id(self, bb, n, args, sym, env):
        members = self._groups.get(n.id, [n])
        kind = _weight(args[0])[0]
        X, N, K = n.inputs[0].shape
        x, ids = args[1], args[2]
        T_e, U = (_dim(d, sym) for d in n.inputs[2].shape)
        rows = int(T_e) if isinstance(T_e, tirx.IntImm) else None
        shared = len(n.inputs[1].shape) == 2
        x2 = x if shared else bb.emit(relax.op.reshape(x, [T_e * U, K]))
        spec = KernelSpec("matmul_id", kind, N, K, rows, X, int(U), shared, len(members), exact=self._exact(kind, K))
        acts = self._acts(bb, spec, x2, rows if shared else (None if rows is None else rows * int(U)))
        ws = [_weight(env[m.inputs[0].id])[1][0] for m in members]
        if spec.acts != "f32":
            self.quantized_weights.update({m.inputs[0].name: spec.acts for m in members})
        gv = self._kernel(bb, spec)
        y_ty = relax.TensorType([T_e, U, N], "float32")
        call_args = relax.Tuple([*ws, *acts, ids])
        if len(members) == 1:
            outs = [bb.emit(relax.call_tir(gv, call_args, y_ty))]
        else:
            res = bb.emit(relax.call_tir(gv, call_args, [y_ty] * len(members)))
            outs = [bb.emit(relax.TupleGetItem(res, i)) for i in range(len(members))]
        for m, o in zip(members, outs):
            if m.id != n.id:
                self._done[m.id] = o
        return outs[[m.id for m in members].index(n.id)]


def _weight(a):
    """to_relax's value of a weight: (kind, [buffer vars], logical shape)."""
    return a


def _dim(d, sym):
    return sym[d] if isinstance(d, str) else tirx.IntImm("int64", d)


def _prod(dims):
    out = dims[0]
    for d in dims[1:]:
        out = out * d
    return tirx.IntImm("int64", int(out)) if isinstance(out, tirx.IntImm) else out


def _sub_rows(shape, rows):
    return [rows, *shape[1:]]
