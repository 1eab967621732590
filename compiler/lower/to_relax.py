"""IR Graph → one Relax function (an entry point), node by node through TE.

Signature of every entry point (the runtime relies on this order, recorded in the manifest):
    (*inputs in graph order, n_kv: Shape([L]), states: Tuple[state buffers], weights: Tuple[weight buffers])
where a weight contributes its format's buffers (manifest `entry_points.*.weights`, in tuple order) and a KV cache
its type's storage (nextn.common.kv_types). States and weights are bound once, as MLC-LLM passes its params: the
runtime builds the two tuples at load (an ffi Array each) and every call passes them as two arguments instead of
one per buffer (a 46-layer GLM has ~800 weight buffers); the VM unpacks them in C++. States are updated in place
with `call_tir_inplace`; outputs are returned as a tuple in graph output order. The KV store, attention, the DSA
indexer, mHC and the KDA ops are hand-written kernels (attention/, indexer/, mhc/, recurrent/); the rest goes through
TE. The GPU forms first try their own kernels for some ops and patterns (gpu_forms.py).

Each IR op (compiler/ir/ops.py) has one lowering, registered with `@lower(op)` as fn(bb, node, args, cx)
(registry.py; `Cx`: the symbols, kernels and attention form of the call): the families' ops by their folders, the TE
ops here; the module checks at import that every op of the table has one.
"""
from __future__ import annotations

from tvm import relax, te, tirx

from nextn.compiler.ir import Graph, rope
from nextn.compiler.ir.ops import check_impls

from . import attention, cuda, gpu_forms, indexer, mhc, recurrent, te_ops   # noqa: F401 (the families register their ops)
from .registry import LOWER, WHERE, Cx, dim_expr, lower


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


def to_relax(bb: relax.BlockBuilder, graph: Graph, weight_kinds: dict[str, str], kernels: "attention.Kernels",
             static: dict[str, int] | None = None, split_l: bool = False, x86=None, many_rows: bool = False) -> None:
    """Emit `graph` as a Relax function; `static` fixes symbols (e.g. {"T": 1} for the one-row decode step);
    `split_l`: attention split over L (flash-decoding) rather than fused; `x86`: an x86.emit.X86Lowering taking the
    matmuls it handles (CPU targets with AVX2); `many_rows`: the entry's calls carry many rows (graphs.MANY_ROWS),
    whose GPU matmuls take tensor-core tiles where the target has them (`kernels.mma`)."""
    sym = {d: tirx.Var(d, "int64") for d in ("T", "H", "R", "L", "C", "P")}
    for d, v in (static or {}).items():
        sym[d] = tirx.IntImm("int64", v)

    def shape(s):
        return [dim_expr(d, sym) for d in s]

    params, env = [], {}
    for name, n in graph.inputs.items():
        v = relax.Var(name, relax.TensorType(shape(n.shape), n.dtype))
        params.append(v)
        env[n.id] = v
    n_kv = relax.Var("n_kv", relax.ShapeType([sym["L"]]))
    params.append(n_kv)
    state_types = []
    for n in graph.states.values():
        dtype, st_shape = attention.state_storage(n, shape)
        state_types.append(relax.TensorType(st_shape, dtype))
    weight_types = [relax.TensorType(s, dt) for _b, dt, s in weight_params(graph, weight_kinds)]
    states = relax.Var("states", relax.TupleType(state_types))
    weights = relax.Var("weights", relax.TupleType(weight_types))
    params += [states, weights]

    def unpack(bb):
        """Bind each state and weight buffer to a name (TupleGetItem of the two bundled parameters)."""
        for i, (name, n) in enumerate(graph.states.items()):
            env[n.id] = bb.emit(relax.TupleGetItem(states, i), name_hint=name.replace(".", "_"))
        i = 0
        for name, n in graph.weights.items():
            kind = weight_kinds[name]
            vs = []
            for suffix, _dtype, _shape in weight_buffers(kind, n.shape):
                vs.append(bb.emit(relax.TupleGetItem(weights, i), name_hint=(name + suffix).replace(".", "_")))
                i += 1
            env[n.id] = (kind, vs, tuple(n.shape))

    if x86 is not None:
        x86.plan(graph, weight_kinds)

    def x86_takes(n):
        w = n.inputs[0] if n.inputs else None
        return x86 is not None and w is not None and w.op == "weight" and x86.handles(n, weight_kinds[w.name])

    uses = {}   # node id -> the live nodes that read it
    for n in graph.live_nodes():
        for i in n.inputs:
            uses.setdefault(i.id, []).append(n)

    with bb.function(graph.name, params):
        with bb.dataflow():
            unpack(bb)
            for n in graph.live_nodes():
                if n.op in ("input", "state", "weight"):
                    continue
                if x86_takes(n):
                    env[n.id] = x86.emit(bb, n, env, sym)
                    continue
                args = [env[i.id] for i in n.inputs]
                env[n.id] = _emit(bb, n, args, Cx(sym, kernels, split_l, many_rows), env, uses)
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


def _emit(bb, n, args, cx: Cx, env: dict, uses: dict):
    if cx.kernels.gpu:   # the GPU forms' own kernels for some ops and patterns (gpu_forms.py)
        hit = gpu_forms.emit(bb, n, args, cx.sym, cx.kernels, env, uses)
        if hit is not None:
            return hit
    return LOWER[n.op](bb, n, args, cx)


@lower("reshape")
def _(bb, n, args, cx):
    x = args[0]
    if isinstance(x, tuple):   # a weight (kind, buffers, shape): float weights reshape as themselves
        assert x[0] == "f32", f"reshape of a {x[0]} weight"
        x = x[1][0]
    return bb.emit(relax.op.reshape(x, [dim_expr(d, cx.sym) for d in n.shape]))


@lower("kpool_expand")
def _(bb, n, args, cx):
    at, L = n.attrs, cx.sym["L"]
    return bb.emit_te(lambda m, p: te_ops.kpool_expand(m, p, L, at["kpool"], at["tail"]), *args,
                      primfunc_name_hint="kpool_expand")


def _te(bb, n, args, extra=(), prim=(), fn=None, attrs=None):
    """`n` as its te_ops function of the same name (or `fn`): fn(*inputs, *prim, *extra); quantized weights as
    QWeights. Symbolic sizes (`prim`) go through emit_te's args so that the PrimFunc gets them as parameters;
    `attrs`: the PrimFunc's attributes (given at its creation, so that equal functions are still one)."""
    flat, rebuild = _flatten(args)
    fn = fn or getattr(te_ops, n.op)
    nf = len(flat)
    return bb.emit_te(lambda *tes: fn(*rebuild(list(tes[:nf])), *tes[nf:], *extra), *flat, *prim,
                      primfunc_name_hint=n.op, **({"primfunc_attrs": attrs} if attrs else {}))


@lower("get_rows", "mul", "add", "div", "sigmoid", "swiglu", "sum_rows", "argmax", "silu", "softplus")
def _(bb, n, args, cx):
    return _te(bb, n, args)


@lower("mul_mat", "mul_mat_id")
def _(bb, n, args, cx):
    gpu = cx.kernels.gpu and not cx.kernels.emulate   # CUDA / ROCm: dequantization as a stage (lower/cuda/gemv.py)
    w = args[0]
    # the integer route: GPU forms unless --exact-matmul, the "gpu-emulated" one too (its definitions on llvm)
    B = cuda.int8.route(w[0], int(w[2][-1]), True) if cx.kernels.gpu and cx.kernels.gpu_int8 is not None \
        and isinstance(w, tuple) else None
    if B is not None and n.op == "mul_mat" and len(w[2]) == 3 and (len(n.inputs[1].shape) != 3 or
                                                                   n.inputs[1].shape[1] != w[2][0]):
        B = None   # per-head weights on other row shapes: float, as the CPU's x86.emit handles()
    if B is not None:   # the integer route (lower/cuda/int8.py): the rows quantized once, shared by gate and up
        cx.kernels.int8_weights[n.inputs[0].name] = "q8_0" if B == 32 else "q8"
        args = [w, *gpu_forms.quantized_rows(bb, args[1], B, cx.kernels), *args[2:]]
        if _takes_mma(n, w, cx):
            return (_mul_mat_mma if n.op == "mul_mat" else _mul_mat_id_mma)(bb, n, args, cx, B)
    if (gpu or B is not None) and n.op == "mul_mat_id" and not _static_one(dim_expr(n.inputs[2].shape[0], cx.sym)):
        return _mul_mat_id_grouped(bb, n, args, cx, B is not None)
    # kOutEWiseFusable, so that FuseOps puts the element-wise consumers (SwiGLU, bias and residual adds) into the
    # GEMV's per-warp tail (cuda/gemv.py). TVM's AnnotateTIROpPattern calls opaque: a one-row GPU mul_mat_id of
    # per-token rows x [T, K] (the routed gate and up: the indirect expert read), and a GPU mul_mat of a symbolic row
    # count (its rows padded to whole tiles by a clamped read, cuda/te.py `padded_rows`). Unfused, each tail would be
    # a kernel of its own per layer and step (a launch: ~2-3 us on an H200, issue 33's per-kernel table, against ~40
    # us of weight bytes per MoE layer at GLM-4.5-Air widths). Not the routed down projection (rows [T, n_used, K]):
    # its consumers sum over the slots, which a warp of one slot cannot.
    fusable = gpu and n.op == "mul_mat_id" and len(n.inputs[1].shape) == 2 or (gpu or B is not None) and \
        n.op == "mul_mat" and not isinstance(dim_expr(n.inputs[1].shape[0], cx.sym), int | tirx.IntImm)
    attrs = {"op_pattern": 4} if fusable else None
    if B is not None:   # args: w, xq, xd, xs(, ids)
        dp4a = cx.kernels.gpu_int8 == "cuda"
        f = cuda.int8.mul_mat if n.op == "mul_mat" else cuda.int8.mul_mat_id
        return _te(bb, n, args, fn=lambda w, xq, xd, xs, *ids: f(w, xq, xd, *ids, dp4a=dp4a, xs=xs), attrs=attrs)
    return _te(bb, n, args, fn=cuda.TE_OPS.get(n.op) if gpu else None, attrs=attrs)


def _takes_mma(n, w, cx) -> bool:
    """Whether quantized matmul `n` (weight w: (kind, buffers, shape)) takes tensor-core tiles (cuda/mma.py): an
    entry of many rows, a target with int8 mma.sync (or its emulation), and the prompt's rows: `mul_mat` of a 2-D
    weight by rows [T, K], or `mul_mat_id` of experts [X, N, K] for ids [T, n_used] (rows [T, K] or
    [T, n_used, K]). Not the head's `out_ids` rows [R, K] (a prefill asks for one: the GEMV reads the weight once
    for it at the memory's speed, where a 64-row tile would decode it for 63 rows that do not exist)."""
    if not (cx.many_rows and cx.kernels.mma and cuda.mma.fits(w[0], int(w[2][-1]))):
        return False
    if n.op == "mul_mat":
        return len(w[2]) == 2 and len(n.inputs[1].shape) == 2 and n.inputs[1].shape[0] == "T"
    return len(w[2]) == 3 and n.inputs[2].shape[0] == "T"


def _mul_mat_mma(bb, n, args, cx, B: int):
    """`n` as cuda/mma.py's tensor-core kernel over the rows quantized once (xq, xd, xs), the weight's buffers (the
    codebook formats' tables too) first; one PrimFunc per weight format and shape. Its element-wise consumers stay
    kernels of their own (prefill: a launch per op and layer is small beside the rows' products)."""
    (kind, bufs, (N, K)), xq, xd, xs = args
    gv = cx.kernels.get(f"mul_mat_mma_{kind}_{N}x{K}_q{B}", lambda: cuda.mma.mul_mat_kernel(
        kind, int(N), int(K), B, cx.kernels.gpu_int8 == "cuda", not cx.kernels.emulate))
    T = dim_expr(n.inputs[1].shape[0], cx.sym)
    return bb.emit(relax.call_tir(gv, relax.Tuple([*bufs, xq, xd, xs]), relax.TensorType([T, int(N)], "float32")))


def _mul_mat_id_mma(bb, n, args, cx, B: int):
    """The routed experts of `n` as cuda/mma.py's tensor-core tiles, one expert's (row, slot) pairs per tile: the
    pairs sorted by expert once per ids tensor (`expert_tiles`: a layer's gate, up and down share them), rows per
    pair viewed as [T · n_used, ...], the products [T · n_used, N] viewed back as [T, n_used, N]."""
    (kind, bufs, (X, N, K)), xq, xd, xs, ids = args
    T, kk = dim_expr(n.inputs[2].shape[0], cx.sym), int(n.inputs[2].shape[1])
    gpu, mma = not cx.kernels.emulate, cuda.mma
    key = ("expert_tiles", ids)
    if key not in cx.kernels.memo:
        gv = cx.kernels.get(f"expert_tiles_{X}", lambda: mma.expert_tiles_kernel(int(X), gpu))
        flat = bb.emit(relax.op.reshape(ids, [T * kk]))
        out = bb.emit(relax.call_tir(gv, relax.Tuple([flat]), [
            relax.TensorType([T * kk], "int32"), relax.TensorType([(T * kk + mma.BM - 1) // mma.BM + int(X), 3],
                                                                  "int32")]))
        cx.kernels.memo[key] = [bb.emit(relax.TupleGetItem(out, i)) for i in range(2)]
    order, tiles = cx.kernels.memo[key]
    per_pair = len(n.inputs[1].shape) == 3   # the down projection: a row per (row, slot)
    if per_pair:
        xq, xd, xs = (bb.emit(relax.op.reshape(v, [T * kk, int(v.ty.shape[-1])])) for v in (xq, xd, xs))
    div = 1 if per_pair else kk
    gv = cx.kernels.get(f"mul_mat_id_mma_{kind}_{X}x{N}x{K}_q{B}_d{div}", lambda: mma.mul_mat_id_kernel(
        kind, int(X), int(N), int(K), B, div, cx.kernels.gpu_int8 == "cuda", gpu))
    y = bb.emit(relax.call_tir(gv, relax.Tuple([*bufs, xq, xd, xs, order, tiles]),
                               relax.TensorType([T * kk, int(N)], "float32")))
    return bb.emit(relax.op.reshape(y, [T, kk, int(N)]))


def _static_one(dim) -> bool:
    return isinstance(dim, int | tirx.IntImm) and int(dim) == 1


def _mul_mat_id_grouped(bb, n, args, cx, quantized: bool = False):
    """GPU mul_mat_id of several rows (verify, prefill): each expert read once per window of rows that chose it
    (lower/cuda/te.py `mul_mat_id_grouped`). The groups are computed once per ids tensor (a layer's gate, up and
    down share them); the products go through a Relax tensor to the gather, which is kOutEWiseFusable so that FuseOps
    fuses the element-wise tail after it (SwiGLU, the routing weights) but not the reduction before it (that would
    leave the products in a workspace allocated at each call: SPLIT_OPS). The one-row decode and draft steps keep
    `cuda.mul_mat_id` (one block per slot: nothing to group)."""
    w, *x, ids = args   # x: the float rows, or (quantized) xq, xd, xs
    groups = cx.kernels.memo.get(ids)
    if groups is None:
        leaders = bb.emit_te(cuda.expert_leaders, ids, primfunc_name_hint="expert_leaders")
        groups = bb.emit_te(cuda.expert_groups, ids, leaders, primfunc_name_hint="expert_groups")
        cx.kernels.memo[ids] = groups
    dp4a = cx.kernels.gpu_int8 == "cuda"
    fn = (lambda w, xq, xd, xs, ids, groups: cuda.int8.mul_mat_id_grouped(w, xq, xd, ids, groups, dp4a=dp4a, xs=xs)) \
        if quantized else cuda.mul_mat_id_grouped
    y = _te(bb, n, [w, *x, ids, groups], fn=fn)
    T = dim_expr(n.inputs[2].shape[0], cx.sym)
    kk, N, W = int(n.inputs[2].shape[1]), int(n.shape[-1]), cuda.GROUP_ROWS

    def gather():
        t, (k64, w64, n64) = te.var("T", "int64"), (tirx.IntImm("int64", v) for v in (kk, W, N))
        ys = te.placeholder([t, k64, w64, n64], "float32", name="y")
        gs = te.placeholder([t, k64, tirx.IntImm("int64", W + 1)], "int32", name="groups")
        return te.create_prim_func([ys, gs, cuda.expert_gather(ys, gs)]).with_attr("op_pattern", 4)  # OutEWiseFusable

    gv = cx.kernels.get(f"expert_gather_{kk}x{N}", gather)
    return bb.emit(relax.call_tir(gv, relax.Tuple([y, groups]), relax.TensorType([T, kk, N], "float32")))


@lower("rms_norm", "norm")
def _(bb, n, args, cx):
    return _te(bb, n, args, (n.attrs["eps"],))


@lower("scale")
def _(bb, n, args, cx):
    return _te(bb, n, args, (n.attrs["s"], n.attrs.get("b", 0.0)))


@lower("view")
def _(bb, n, args, cx):
    return _te(bb, n, args, (n.attrs["axis"], n.attrs["start"], n.attrs["length"]))


@lower("concat")
def _(bb, n, args, cx):
    return _te(bb, n, args, (n.attrs["axis"],))


@lower("rope_ext")
def _(bb, n, args, cx):
    at = n.attrs
    return _te(bb, n, args, (at["n_rot"], at["mode"], *(at[k] for k in rope.PARAMS)))


@lower("clamp")
def _(bb, n, args, cx):
    return _te(bb, n, args, (n.attrs["lo"], n.attrs["hi"]))


@lower("argsort_top_k")
def _(bb, n, args, cx):
    return _te(bb, n, args, (n.attrs["k"],))


@lower("index_mask_load")
def _(bb, n, args, cx):
    return _te(bb, n, args, prim=(cx.sym["L"],))


check_impls(LOWER, WHERE)


def build_module(graphs: list[Graph], weight_kinds: dict[str, str], static: dict[str, dict] | None = None,
                 form: str = "cpu", split_l=(), x86=None, gpu_int8: str | None = None,
                 int8_weights: dict | None = None, mma: bool = False, many_rows=()):
    """An IRModule with one Relax function per graph (entry point); `static[graph.name]` fixes symbols.
    `form` (attention.FORMS): "cpu", "gpu" (GPU targets: also gpu_forms: SPLIT_OPS as separate kernels, the fused patterns), or "gpu-emulated"
    (the GPU form built for llvm, to test its arithmetic). `split_l`: names of the entry points whose attention
    is split over L (graphs.SPLIT_L). `x86`: see `to_relax`. `gpu_int8` (the "gpu" form): the integer route of
    the GPU matmuls (lower/cuda/int8.py) with "cuda" (`__dp4a`, `__fdiv_rn`) or "plain" int32 arithmetic; None:
    float activations (--exact-matmul). `int8_weights`: filled with {weight name: activation row format ("q8_0",
    "q8")} of the matmuls that took the integer route. `mma`: the integer route's matmuls of the `many_rows` entry
    points (graphs.MANY_ROWS) as tensor-core tiles (lower/cuda/mma.py: CUDA sm_80+, or its emulation)."""
    bb = relax.BlockBuilder()
    kernels = attention.Kernels(bb, form)
    kernels.gpu_int8, kernels.int8_weights = gpu_int8, int8_weights if int8_weights is not None else {}
    kernels.mma = mma and gpu_int8 is not None
    for g in graphs:
        to_relax(bb, g, weight_kinds, kernels, (static or {}).get(g.name), g.name in split_l, x86, g.name in many_rows)
    return bb.get()
