"""The GPU forms' own kernels for some IR ops and patterns ("gpu" and "gpu-emulated": attention.Kernels.gpu), tried
before an op's registered lowering (to_relax._emit): each function below takes its node (or a pattern around it) or
returns None, and the op is then lowered as on the CPU. Why each exists, in short: a scratch tensor a CUDA graph could
not keep (SPLIT_OPS), or kernels that were each a launch of ~2-3 us on an H200 whatever they computed (issue 33's
per-kernel table, docs/gpu.md), now one kernel:

    argsort_top_k, argmax           _emit_split: the routing in one kernel (topk.py), argmax in two passes
    get_rows / sum_rows             _routing_weights: the routing kernel's weights and their sum
    mul(rms_norm(x), w)             _norm_q8: with the integer route's int8 rows (cuda/norm_q8.py)
    rope_ext of q and k             _rope_pair: with their per-head norms (rope_pair.py)
    set_rows of K and V             _set_rows_pair: one store kernel (attention/kv_access.py)
    swiglu of grouped gate / up     _gather_swiglu: both gathers and SwiGLU in one kernel (verify, prefill)
    the slot sum of grouped down    _slot_sum: gather, routing weights and slot-order sum in one (verify, prefill)

A pattern's other nodes find their value in `kernels.memo` (keyed by Node objects or Relax vars, never node ids,
which restart in each graph of the module) and what they replaced is dead code that DeadCodeElimination removes.
"""
from __future__ import annotations

import zlib

import numpy as np
from tvm import relax, te, tirx

from nextn.compiler.ir import rope

from . import attention, cuda, rope_pair, te_ops, topk
from .cuda import norm_q8
from .registry import dim_expr


def emit(bb, n, args, sym, kernels, env: dict, uses: dict):
    """The Relax value of IR node `n` from a GPU form's own kernel, or None (then its registered lowering).
    `env`: node id -> Relax value so far; `uses`: node id -> the live nodes reading it."""
    if kernels.gpu_int8 and n.op == "mul":
        hit = _norm_q8(bb, n, sym, kernels, env, uses)
        if hit is not None:
            return hit
    if ("slot_sum", n) in kernels.memo:
        return kernels.memo.pop(("slot_sum", n))
    if n.op == "mul" and len(n.shape) == 3:
        _slot_sum(bb, n, sym, kernels, env, uses)   # the sum, for the chain's last node; `n` itself as usual
    if n.op == "swiglu" and len(n.shape) == 3:
        hit = _gather_swiglu(bb, n, sym, kernels, env, uses)
        if hit is not None:
            return hit
    if n.op == "rope_ext":
        hit = kernels.memo.pop(("rope_pair", n), None)
        return hit if hit is not None else _rope_pair(bb, n, sym, kernels, env, uses)
    if n.op == "set_rows":
        hit = kernels.memo.pop(("kv_pair", n), None)
        return hit if hit is not None else _set_rows_pair(bb, n, kernels, env, uses)
    if n.op in SPLIT_OPS:
        return _emit_split(bb, n, args, sym, kernels, env)
    if n.op in ("get_rows", "sum_rows"):
        return _routing_weights(n, kernels)
    return None


# Ops whose TE form keeps a scratch tensor inside the kernel (top-k's ranks), which would be a workspace allocated at
# each call, inside a CUDA graph capture too: GPU forms emit them otherwise. argsort_top_k as one hand-written kernel
# whose ranks stay in registers (lower/topk.py; past topk.MAX_EXPERTS as rank + select with the ranks a Relax
# tensor). Attention and the index score need no such care: their kernels (attention/) keep everything in
# registers / shared memory.
# argmax over a vocabulary row: one thread block per row is the natural GPU schedule and the slowest (43 µs for
# 151552 logits in the first H200 run's per-kernel table, docs/gpu.md), so GPU forms take it in two passes
# (`te_ops.argmax_of_chunks`).
SPLIT_OPS = ("argsort_top_k", "argmax")


def _emit_split(bb, n, args, sym, kernels, env):
    """`n` (op in SPLIT_OPS) as separate kernels; argsort_top_k as one kernel of its own (lower/topk.py); None: an
    argmax row too short to split (its registered lowering)."""
    if n.op == "argmax":
        R, V = n.inputs[0].shape
        ch = te_ops.argmax_chunk(int(V))
        if ch is None:
            return None
        xc = bb.emit(relax.op.reshape(args[0], [dim_expr(R, sym), int(V) // ch, ch]))   # a view: no copy
        part = bb.emit_te(te_ops.argmax, xc, primfunc_name_hint="argmax_chunks")        # [R, C] int32
        return bb.emit_te(lambda x, p: te_ops.argmax_of_chunks(x, p, ch), args[0], part, primfunc_name_hint="argmax")
    X, k = int(n.inputs[0].shape[-1]), n.attrs["k"]
    if X > topk.MAX_EXPERTS:
        rank = bb.emit_te(te_ops.topk_rank, args[0], primfunc_name_hint="topk_rank")
        return bb.emit_te(lambda r: te_ops.topk_select(r, k), rank, primfunc_name_hint="argsort_top_k")
    # the router's selection bias (glm_base.moe: probs + exp_probs_b) read by the kernel itself: the add's own
    # binding is then unused and dropped (it was fused into the rank kernel before)
    src = n.inputs[0]
    folded = src.op == "add" and src.inputs[1].op == "weight" and tuple(src.inputs[1].shape) == (X,) \
        and tuple(src.inputs[0].shape[-1:]) == (X,) and isinstance(env.get(src.inputs[1].id), tuple) \
        and env[src.inputs[1].id][0] == "f32"
    # unfolded: a zero bias (x + 0.0 compares as x)
    x, bias = (env[src.inputs[0].id], env[src.inputs[1].id][1][0]) if folded else \
        (args[0], relax.const(np.zeros(X, np.float32)))
    gv = kernels.get(f"topk_ids_{X}_{k}", lambda: topk.topk_ids_kernel(X, k, gpu=not kernels.emulate))
    T = dim_expr(n.inputs[0].shape[0], sym)
    out = bb.emit(relax.call_tir(gv, relax.Tuple([x, bias]), [relax.TensorType([T, k], "int32"),
                                                               relax.TensorType([T, k, 1], "float32"),
                                                               relax.TensorType([T, 1], "float32")]))
    ids, w, wsum = (bb.emit(relax.TupleGetItem(out, i)) for i in range(3))
    if folded:   # the kernel read the unbiased values: its weights are get_rows'
        kernels.memo[("topk_w", src.inputs[0], n)] = (w, wsum)
    return ids


def _routing_weights(n, kernels):
    """The topk kernel's outputs that stand for `n` (lower/topk.py: GPU forms), or None: get_rows of the unbiased
    router values, reshaped to [T, X, 1], at the selected ids -> its w; sum_rows of that w reshaped to [T, k] -> its
    wsum (then the get_rows and sum_rows kernels are not emitted)."""
    if n.op == "get_rows":
        table, ids = n.inputs
        if table.op == "reshape" and len(table.shape) == 3 and int(table.shape[-1]) == 1:
            hit = kernels.memo.get(("topk_w", table.inputs[0], ids))
            if hit is not None:
                kernels.memo[("topk_sum", n)] = hit[1]
                return hit[0]
    elif n.op == "sum_rows":
        src = n.inputs[0]
        if src.op == "reshape" and len(src.shape) == 2:
            return kernels.memo.get(("topk_sum", src.inputs[0]))
    return None


def _norm_q8(bb, n, sym, kernels, env, uses):
    """`n` = mul(rms_norm(x), w) [T, K] (a norm and its weight) as one kernel with the int8 rows of its result
    (lower/cuda/norm_q8.py), when integer-route matmuls read it (GPU form, `gpu_int8`); their quantizer then finds the
    rows in `kernels.memo` (`quantized_rows`) and the separate rms_norm binding is dead code. Rows in blocks of the
    B most of those matmuls take (K-quants 256, the 32-value formats 32); a matmul of the other B quantizes y itself.
    None where the pattern does not hold."""
    hit = _weighted_norm(n, env) if len(n.shape) == 2 else None
    if hit is None:
        return None
    x, wt, eps = hit
    wv = env[wt.id]
    K = int(n.shape[-1])
    blocks = sorted(B for c in uses.get(n.id, ()) if c.op in ("mul_mat", "mul_mat_id") and c.inputs[1] is n
                    and c.inputs[0].op == "weight" and isinstance(env.get(c.inputs[0].id), tuple)
                    for B in [cuda.int8.route(env[c.inputs[0].id][0], K, True)] if B is not None)
    if not blocks:
        return None
    B = max(blocks, key=blocks.count)
    if not norm_q8.fits(K, B):
        return None
    gv = kernels.get(f"rms_norm_q8_{K}_{B}_{int(np.float32(eps).view(np.uint32)):08x}",
                     lambda: norm_q8.rms_norm_q8_kernel(K, B, eps, kernels.gpu_int8 == "cuda",
                                                        gpu=not kernels.emulate))
    T = dim_expr(n.shape[0], sym)
    out = bb.emit(relax.call_tir(gv, relax.Tuple([env[x.id], wv[1][0]]),
                                 [relax.TensorType([T, K], "float32"), relax.TensorType([T, K // 4], "int32"),
                                  relax.TensorType([T, K // B], "float32"), relax.TensorType([T, K // 16], "int32")]))
    y, *rows = (bb.emit(relax.TupleGetItem(out, i)) for i in range(4))
    kernels.memo[("int8", y, B)] = rows
    return y


def _set_rows_pair(bb, n, kernels, env, uses):
    """`n` (set_rows) and another set_rows at the same positions into a cache of the same type and shape (a layer's K
    and V: glm4moe's graph stores them one after the other) as one kernel (kv_access.store_kernel pair=True; GPU
    forms: a launch fewer per layer and step); the other's result waits in `kernels.memo` for its own turn. Only
    when the other's rows are already computed and its cache is read by nothing else, so emitting its store here
    moves no read of that cache. None otherwise."""
    cache, rows, pos = n.inputs
    kv, shape = attention.kv_type_of(cache), tuple(rows.shape)
    for m in uses.get(pos.id, ()):
        if m is n or m.op != "set_rows" or m.inputs[2] is not pos or m.id in env or m.inputs[1].id not in env \
                or m.inputs[0].id not in env or attention.kv_type_of(m.inputs[0]) != kv \
                or tuple(m.inputs[1].shape) != shape or uses.get(m.inputs[0].id) != [m]:
            continue
        _t, H, D = shape
        gv = kernels.get(f"set_rows_pair_{kv}_h{H}_d{D}",
                         lambda: attention.kv_access.store_kernel(kv, int(H), int(D), gpu=not kernels.emulate,
                                                                  pair=True))
        a, b = env[cache.id], env[m.inputs[0].id]
        out = bb.emit(relax.op.call_tir_inplace(gv, relax.Tuple([a, b, env[rows.id], env[m.inputs[1].id],
                                                                 env[pos.id]]), [0, 1], [a.ty, b.ty]))
        kernels.memo[("kv_pair", m)] = bb.emit(relax.TupleGetItem(out, 1))
        return bb.emit(relax.TupleGetItem(out, 0))
    return None


def _weighted_norm(m, env):
    """(x, w node, eps) when IR node m = mul(rms_norm(x), w), w a float weight over the last dimension (a norm and
    its weight: a layer's, or q's / k's per head), else None."""
    if m.op != "mul":
        return None
    norm, wt = m.inputs
    if norm.op != "rms_norm" or wt.op != "weight" or tuple(norm.shape) != tuple(m.shape) \
            or tuple(wt.shape) != tuple(m.shape[-1:]):
        return None
    wv = env.get(wt.id)
    if not (isinstance(wv, tuple) and wv[0] == "f32"):
        return None
    return norm.inputs[0], wt, float(norm.attrs["eps"])


def _rope_source(r, env):
    """(x, norm weight node, eps) of rope node r's input: mul(rms_norm(x), w) (`_weighted_norm`: a per-head norm), or
    (its input, None, None)."""
    return _weighted_norm(r.inputs[0], env) or (r.inputs[0], None, None)


def _rope_pair(bb, n, sym, kernels, env, uses):
    """`n` (rope_ext of [T, Hq, D]) and another rope_ext of the same attributes at the same positions (a layer's q
    and k), with their per-head norms where both have them, as one kernel (lower/rope_pair.py; GPU forms: four
    launches become one); the other's result waits in `kernels.memo` for its own turn, and the norms' separate
    bindings are dead code. Only when the other's input is already computed. None otherwise."""
    pos = n.inputs[1]
    if len(n.shape) != 3:
        return None
    xa, wa, eps = _rope_source(n, env)
    for m in uses.get(pos.id, ()):
        if m is n or m.op != "rope_ext" or m.inputs[1] is not pos or m.id in env or len(m.shape) != 3 \
                or m.attrs != n.attrs or m.shape[-1] != n.shape[-1]:
            continue
        xb, wb, eps_b = _rope_source(m, env)
        if xb.id not in env or eps_b != eps:
            continue
        (_t, Hq, D), Hk = n.shape, m.shape[1]
        if rope_pair.threads(int(D)) > rope_pair.MAX_THREADS:
            return None
        at = n.attrs
        rp = {"n_rot": at["n_rot"], "mode": at["mode"], **{k: at[k] for k in rope.PARAMS}}
        key = "_".join(f"{k}{rp[k]}" for k in sorted(rp)) + f"_{eps}"
        tag = f"{zlib.crc32(key.encode()):08x}"
        gv = kernels.get(f"rope_pair_{Hq}_{Hk}_d{D}_{tag}",
                         lambda: rope_pair.rope_pair_kernel(int(Hq), int(Hk), int(D), rp, eps, gpu=not kernels.emulate))
        ws = [] if wa is None else [env[wa.id][1][0], env[wb.id][1][0]]
        a, b = env[xa.id], env[xb.id]
        out = bb.emit(relax.call_tir(gv, relax.Tuple([a, b, *ws, env[pos.id]]),
                                     [relax.TensorType([dim_expr(d, sym) for d in n.shape], "float32"),
                                      relax.TensorType([dim_expr(d, sym) for d in m.shape], "float32")]))
        kernels.memo[("rope_pair", m)] = bb.emit(relax.TupleGetItem(out, 1))
        return bb.emit(relax.TupleGetItem(out, 0))
    return None


def _slot_chain(m, uses):
    """The last node of `moe`'s slot sum over m [T, k, N] (compiler/models/glm_base/graph.py: reshape(view(m, 1, 0,
    1)), then add(out, reshape(view(m, 1, j, 1))) for j = 1 .. k-1, each link read by the next only), or None."""
    T, k, N = m.shape
    views = uses.get(m.id, ())
    starts = sorted(v.attrs.get("start", -1) for v in views) if all(
        v.op == "view" and v.attrs.get("axis") == 1 and v.attrs.get("length") == 1 for v in views) else None
    if starts != list(range(int(k))):
        return None
    rows = {}
    for v in views:
        r = uses.get(v.id, ())
        if len(r) != 1 or r[0].op != "reshape" or tuple(r[0].shape) != (T, N):
            return None
        rows[v.attrs["start"]] = r[0]
    out = rows[0]
    for j in range(1, int(k)):
        nxt = uses.get(out.id, ())
        if len(nxt) != 1 or nxt[0].op != "add" or nxt[0].inputs != (out, rows[j]) or uses.get(rows[j].id) != [nxt[0]]:
            return None
        out = nxt[0]
    return out


def _slot_sum(bb, n, sym, kernels, env, uses):
    """GPU forms, several rows: `n` = mul(mul_mat_id(down), w) [T, k, N] whose slots `moe` sums by views and adds
    (`_slot_chain`) as one kernel (cuda.expert_gather_sum: the grouped products gathered, weighted and summed in slot
    order) in place of the gather, the product and k slot copies (FuseOps leaves each view a kernel of its own after
    the gather: 8 launches per MoE layer and verify at GLM-4.5-Air's 8 experts per token). The chain's last node finds
    the sum in `kernels.memo`; the gather, the product and the views are then dead code. Nothing (None) otherwise."""
    src, wn = n.inputs
    if src.op != "mul_mat_id" or len(n.shape) != 3 or tuple(wn.shape) != (n.shape[0], n.shape[1], 1):
        return None
    gathered = _gathered(bb, env.get(src.id))
    last = _slot_chain(n, uses) if gathered is not None else None
    if last is None:
        return None
    y, groups = gathered
    kk, N = int(n.shape[1]), int(n.shape[2])

    def make():
        t, (k64, w64, n64) = te.var("T", "int64"), (tirx.IntImm("int64", v) for v in (kk, cuda.GROUP_ROWS, N))
        ys = te.placeholder([t, k64, w64, n64], "float32", name="y")
        gs = te.placeholder([t, k64, tirx.IntImm("int64", cuda.GROUP_ROWS + 1)], "int32", name="groups")
        ws = te.placeholder([t, k64, tirx.IntImm("int64", 1)], "float32", name="w")
        # kInjective: the routing weights' element-wise producers fuse into it
        return te.create_prim_func([ys, gs, ws, cuda.expert_gather_sum(ys, gs, ws)]).with_attr("op_pattern", 2)

    gv = kernels.get(f"expert_gather_sum_{kk}x{N}", make)
    T = dim_expr(n.shape[0], sym)
    kernels.memo[("slot_sum", last)] = bb.emit(relax.call_tir(gv, relax.Tuple([y, groups, env[wn.id]]),
                                                              relax.TensorType([T, N], "float32")))
    return None   # `n` itself as usual (dead once the chain's last node takes the sum)


def _gathered(bb, v):
    """(y, groups) of `v` when it is a grouped mul_mat_id's gather call (`_mul_mat_id_grouped`), else None."""
    b = bb.lookup_binding(v) if isinstance(v, relax.Var) else None
    if isinstance(b, relax.Call) and isinstance(b.args[0], relax.GlobalVar) \
            and b.args[0].name_hint.startswith("expert_gather_") and not b.args[0].name_hint.startswith("expert_gather_sum"):
        return tuple(b.args[1].fields)
    return None


def _gather_swiglu(bb, n, sym, kernels, env, uses):
    """GPU forms, several rows: `n` = swiglu(gate, up) of two grouped mul_mat_ids (the routed experts of verify /
    prefill) as one injective kernel that gathers both and applies SwiGLU (te_ops.swiglu on cuda.expert_gather's
    rows: the same values), where there were two gathers (one with the SwiGLU). The two gathers are dead code then.
    None where the pattern does not hold."""
    gate, up = n.inputs
    if gate.op != "mul_mat_id" or up.op != "mul_mat_id" or uses.get(gate.id) != [n] or uses.get(up.id) != [n]:
        return None
    g, u = _gathered(bb, env.get(gate.id)), _gathered(bb, env.get(up.id))
    if g is None or u is None or not g[1].same_as(u[1]):
        return None
    T, kk, N = n.shape

    def make():
        t, (k64, w64, n64) = te.var("T", "int64"), (tirx.IntImm("int64", int(v)) for v in (kk, cuda.GROUP_ROWS, N))
        yg, yu = (te.placeholder([t, k64, w64, n64], "float32", name=nm) for nm in ("y_gate", "y_up"))
        gs = te.placeholder([t, k64, tirx.IntImm("int64", cuda.GROUP_ROWS + 1)], "int32", name="groups")
        out = te_ops.swiglu(cuda.expert_gather(yg, gs), cuda.expert_gather(yu, gs))
        return te.create_prim_func([yg, yu, gs, out]).with_attr("op_pattern", 2)   # kInjective

    gv = kernels.get(f"expert_gather_swiglu_{kk}x{N}", make)
    return bb.emit(relax.call_tir(gv, relax.Tuple([g[0], u[0], g[1]]),
                                  relax.TensorType([dim_expr(d, sym) for d in n.shape], "float32")))


def quantized_rows(bb, x, B: int, kernels) -> list:
    """[xq, xd, xs]: the int8 activation rows of x in blocks of B and their sums of 16 quants
    (cuda.int8.quantize_rows, sums=True), once per x and B."""
    key = ("int8", x, B)
    if key not in kernels.memo:
        cuda_ = kernels.gpu_int8 == "cuda"
        q = bb.emit_te(lambda t: list(cuda.int8.quantize_rows(t, B, cuda_, sums=True)), x,
                       primfunc_name_hint="quantize_q8")
        kernels.memo[key] = [bb.emit(relax.TupleGetItem(q, i)) for i in range(3)]
    return kernels.memo[key]
