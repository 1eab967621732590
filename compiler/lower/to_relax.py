"""IR Graph → one Relax function (an entry point), node by node through TE.

Signature of every entry point (the runtime relies on this order, recorded in the manifest):
    (*inputs in graph order, n_kv: Shape([L]), *states, *weight buffers)
where a block-quantized weight contributes its format's buffers (e.g. Q8_0: qs, d). States (KV caches) are updated in place with
`call_tir_inplace`; outputs are returned as a tuple in graph output order.
"""
from __future__ import annotations

from tvm import relax, tirx
from tvm.script import tirx as T

from nextn.compiler.ir import Graph, rope

from . import dsa_kernels, te_ops


@T.prim_func(private=True, s_tir=True)
def set_rows_kernel(var_cache: T.handle, var_rows: T.handle, var_pos: T.handle):
    """ggml set_rows: cache[pos[t], :, :] = rows[t, :, :] (in place: the KV store)."""
    T.func_attr({"tirx.noalias": True})
    c, h, d, t = T.int64(), T.int64(), T.int64(), T.int64()
    cache = T.match_buffer(var_cache, (c, h, d), "float32")
    rows = T.match_buffer(var_rows, (t, h, d), "float32")
    pos = T.match_buffer(var_pos, (t,), "int32")
    for i, j, k in T.grid(t, h, d):
        with T.sblock("set_rows"):
            vi, vj, vk = T.axis.remap("SSS", [i, j, k])
            cache[T.Cast("int64", pos[vi]), vj, vk] = rows[vi, vj, vk]


def weight_buffers(kind: str, shape) -> list[tuple[str, str, tuple]]:
    """(suffix, dtype, shape) of the buffers a weight of `kind` and logical `shape` occupies."""
    if kind == "f32":
        return [("", "float32", tuple(shape))]
    from nextn.common.quant import FORMATS

    return FORMATS[kind].buffers(tuple(shape))


def weight_params(graph: Graph, weight_kinds: dict[str, str]) -> list[tuple[str, str, tuple]]:
    """(buffer name, dtype, shape) for every weight buffer of `graph`, in signature order."""
    out = []
    for name, node in graph.weights.items():
        for suffix, dtype, shape in weight_buffers(weight_kinds[name], node.shape):
            out.append((name + suffix, dtype, shape))
    return out


def to_relax(bb: relax.BlockBuilder, graph: Graph, weight_kinds: dict[str, str], set_rows_gv,
             static: dict[str, int] | None = None, split_kernels: bool = False) -> None:
    """Emit `graph` as a Relax function; `static` fixes symbols (e.g. {"T": 1} for the one-row decode step)."""
    sym = {d: tirx.Var(d, "int64") for d in ("T", "R", "L", "C")}
    for d, v in (static or {}).items():
        sym[d] = tirx.IntImm("int64", v)

    def shape(s):
        return [sym[d] if isinstance(d, str) else d for d in s]

    params, env = [], {}
    for name, n in graph.inputs.items():
        v = relax.Var(name, relax.TensorType(shape(n.shape), n.dtype))
        params.append(v)
        env[n.id] = v
    n_kv = relax.Var("n_kv", relax.ShapeType([sym["L"]]))
    params.append(n_kv)
    for name, n in graph.states.items():
        v = relax.Var(name.replace(".", "_"), relax.TensorType(shape(n.shape), n.dtype))
        params.append(v)
        env[n.id] = v
    for name, n in graph.weights.items():
        kind = weight_kinds[name]
        vs = []
        for suffix, dtype, shape in weight_buffers(kind, n.shape):
            v = relax.Var((name + suffix).replace(".", "_"), relax.TensorType(shape, dtype))
            params.append(v)
            vs.append(v)
        env[n.id] = (kind, vs, tuple(n.shape))

    with bb.function(graph.name, params):
        with bb.dataflow():
            for n in graph.live_nodes():
                if n.op in ("input", "state", "weight"):
                    continue
                args = [env[i.id] for i in n.inputs]
                env[n.id] = _emit(bb, n, args, sym, set_rows_gv, split_kernels)
            outs = [env[o.id] for o in graph.outputs.values()]
            gv = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(gv)


def _flatten(args):
    """Expand quantized weights (kind, [vars]) into positional TE args + a rebuild function."""
    flat, spec = [], []
    for a in args:
        if isinstance(a, tuple):
            spec.append((a[0], len(a[1]), a[2]))
            flat.extend(a[1])
        else:
            spec.append((None, 1, None))
            flat.append(a)

    def rebuild(tes):
        out, i = [], 0
        for kind, cnt, shape in spec:
            if kind is None or kind == "f32":
                out.append(tes[i])
            else:
                out.append(te_ops.QWeight(kind, tes[i:i + cnt], shape))
            i += cnt
        return out

    return flat, rebuild


# Ops whose single-PrimFunc form keeps scratch tensors inside the kernel (te_ops: attention's [T, H, L] scores,
# the indexer's per-head scores, top-k's ranks). GPU targets get them as separate kernels with the scratch as
# Relax tensors: planned statically (a kernel-internal buffer would be a workspace allocated at each call,
# inside a CUDA graph capture too) and each kernel a shape the GPU schedule rules know.
SPLIT_OPS = ("flash_attn_ext", "flash_attn_ext_mla", "lightning_indexer", "argsort_top_k")


def _emit_split(bb, n, args, sym):
    """`n` (op in SPLIT_OPS) as separate kernels."""
    op, at, L = n.op, n.attrs, sym["L"]
    if op == "argsort_top_k":
        rank = bb.emit_te(te_ops.topk_rank, args[0], primfunc_name_hint="topk_rank")
        return bb.emit_te(lambda r: te_ops.topk_select(r, at["k"]), rank, primfunc_name_hint="argsort_top_k")
    if op == "lightning_indexer":
        q, k, w, pos = args
        s = bb.emit_te(te_ops.index_qk, q, k, L, primfunc_name_hint="index_qk")
        return bb.emit_te(te_ops.index_score, s, w, pos, primfunc_name_hint="index_score")
    if op == "flash_attn_ext":
        q, k, v, pos = args
        mask = []
    else:   # flash_attn_ext_mla: the latent cache is K and (its first n_v columns) V
        q, k, pos, *mask = args
        v = k
    s = bb.emit_te(te_ops.attn_scores, q, k, L, primfunc_name_hint="attn_scores")
    p = bb.emit_te(lambda s_, pos_, *m: te_ops.soft_max(s_, pos_, at["scale"], *m), s, pos, *mask,
                   primfunc_name_hint="soft_max")
    return bb.emit_te(lambda p_, v_: te_ops.attn_pv(p_, v_, at.get("n_v") or v_.shape[2]), p, v,
                      primfunc_name_hint="attn_pv")


def _emit(bb, n, args, sym, set_rows_gv, split_kernels: bool = False):
    op, at = n.op, n.attrs
    if split_kernels and op in SPLIT_OPS:
        return _emit_split(bb, n, args, sym)
    if op == "reshape":
        return bb.emit(relax.op.reshape(args[0], [sym[d] if isinstance(d, str) else d for d in n.shape]))
    if op == "set_rows":
        cache = args[0]
        return bb.emit(relax.op.call_tir_inplace(set_rows_gv, relax.Tuple(args), [0], cache.ty))
    if op in dsa_kernels.TIR_OPS:
        return dsa_kernels.emit(bb, n, args, sym)
    flat, rebuild = _flatten(args)
    fn = getattr(te_ops, op)
    extra = {
        "rms_norm": lambda: (at["eps"],),
        "scale": lambda: (at["s"],),
        "view": lambda: (at["axis"], at["start"], at["length"]),
        "concat": lambda: (at["axis"],),
        "rope_ext": lambda: (at["n_rot"], at["mode"], *(at[k] for k in rope.PARAMS)),
        "flash_attn_ext": lambda: (at["scale"],),
        "clamp": lambda: (at["lo"], at["hi"]),
        "argsort_top_k": lambda: (at["k"],),
        "norm": lambda: (at["eps"],),
        "flash_attn_ext_mla": lambda: (at["scale"], at["n_v"]),
    }.get(op, lambda: ())()
    # Symbolic sizes go through emit_te's args so that the PrimFunc gets them as parameters.
    prim = [sym["L"]] if op in ("flash_attn_ext", "flash_attn_ext_mla", "lightning_indexer", "index_mask_load") else []
    nf = len(flat)
    return bb.emit_te(lambda *tes: fn(*rebuild(list(tes[:nf])), *tes[nf:], *extra), *flat, *prim,
                      primfunc_name_hint=op)


def build_module(graphs: list[Graph], weight_kinds: dict[str, str], static: dict[str, dict] | None = None,
                 split_kernels: bool = False):
    """An IRModule with one Relax function per graph (entry point); `static[graph.name]` fixes symbols.
    `split_kernels` (GPU targets): SPLIT_OPS as separate kernels (`_emit_split`)."""
    bb = relax.BlockBuilder()
    set_rows_gv = bb.add_func(set_rows_kernel, "set_rows")
    for g in graphs:
        to_relax(bb, g, weight_kinds, set_rows_gv, (static or {}).get(g.name), split_kernels)
    return bb.get()
