"""The MoE router's top-k selection (ggml argsort_top_k of the biased probabilities) as one kernel for the GPU forms.

`te_ops.argsort_top_k` defines it by rank counting: rank(e) = #{e' : x[e'] > x[e] or (x[e'] == x[e] and e' < e)},
ids[j] = the e of rank j. As TE that is two reductions, and the GPU forms ran the routing after the router's matmul
as four kernels: the rank (with the bias add fused), the selection, the selected probabilities (get_rows) and their
sum (sum_rows). Here one thread block per row and one thread per expert: each thread counts its expert's rank in a
register and, when it is below k, writes its index and its unbiased probability to that slot; the bias add
(`exp_probs_b`) is read in the same kernel, and one thread then sums the slots in slot order. Over finite values the
ranks are a permutation, so every slot gets exactly the expert the rank-select pair selects. A launch is ~2-3 us on
an H200 whatever it computes (issue 33's per-kernel table, docs/gpu.md), three fewer per MoE layer and step.

Slots start at 0 and are written after a barrier, so a NaN row (ranks may collide or skip) still gives expert ids in
range, where the rank-select pair summed colliding indices. The "gpu-emulated" form runs the same loops serially on
llvm (tests/test_topk.py checks it against the IR interpreter's stable argsort).
"""
from __future__ import annotations

from tvm.script import tirx as T

from .attention.flash_attn import _binders

F32 = "float32"
MAX_EXPERTS = 1024   # threads per block


def topk_ids_kernel(X: int, k: int, gpu: bool):
    """PrimFunc (x float32 [T, X], bias float32 [X] -> ids int32 [T, k], w float32 [T, k, 1], wsum float32 [T, 1]):
    ids[t] = argsort_top_k(x[t] + bias, k); w[t, j, 0] = x[t, ids[t, j]] (ggml get_rows of the unbiased values,
    glm_base.moe's routing weights); wsum[t, 0] = the sum of w[t, :, 0] in slot order (ggml sum_rows).
    `gpu`: a block per row, a thread per expert; else serial loops (the "gpu-emulated" form)."""
    assert 0 < k <= X <= MAX_EXPERTS, (X, k)
    attrs = {"tirx.noalias": True, "tirx.is_scheduled": True}
    outer, inner, _scope = _binders(emulate=not gpu)   # emulated: rows in parallel, threads serial

    @T.prim_func(private=True, s_tir=True)
    def topk_ids(var_x: T.handle, var_b: T.handle, var_ids: T.handle, var_w: T.handle, var_wsum: T.handle):
        T.func_attr(attrs)
        t = T.int64()
        x = T.match_buffer(var_x, (t, X), F32)
        b = T.match_buffer(var_b, (X,), F32)
        ids = T.match_buffer(var_ids, (t, k), "int32")
        w = T.match_buffer(var_w, (t, k, 1), F32)
        wsum = T.match_buffer(var_wsum, (t, 1), F32)
        for r in outer(t):
            for e in inner(X):
                with T.sblock("topk_init"):
                    vr, ve = T.axis.remap("SS", [r, e])
                    T.reads()
                    T.writes(ids[vr, 0:k], w[vr, 0:k, 0])
                    if ve < k:
                        ids[vr, ve] = 0
                        w[vr, ve, 0] = T.float32(0)
            if gpu:
                T.evaluate(T.tvm_storage_sync("shared"))   # every slot's 0 written before any index is
            for e in inner(X):
                with T.sblock("topk_ids"):
                    vr, ve = T.axis.remap("SS", [r, e])
                    T.reads(x[vr, 0:X], b[0:X])
                    T.writes(ids[vr, 0:k], w[vr, 0:k, 0])
                    acc = T.alloc_buffer((2,), F32, scope="local")   # this expert's biased value, another's
                    rank = T.alloc_buffer((1,), "int32", scope="local")
                    acc[0] = x[vr, ve] + b[ve]
                    rank[0] = 0
                    for s in range(X):
                        acc[1] = x[vr, s] + b[s]
                        rank[0] = rank[0] + T.if_then_else(T.Or(acc[1] > acc[0], T.And(acc[1] == acc[0], s < ve)),
                                                           1, 0)
                    if rank[0] < k:
                        ids[vr, rank[0]] = T.Cast("int32", ve)
                        w[vr, rank[0], 0] = x[vr, ve]
            if gpu:
                T.evaluate(T.tvm_storage_sync("shared"))   # every slot's weight written before the sum
            for e in inner(X):
                with T.sblock("topk_sum"):
                    vr, ve = T.axis.remap("SS", [r, e])
                    T.reads(w[vr, 0:k, 0])
                    T.writes(wsum[vr, 0])
                    tot = T.alloc_buffer((1,), F32, scope="local")
                    if ve == 0:
                        tot[0] = T.float32(0)
                        for j in range(k):
                            tot[0] = tot[0] + w[vr, j, 0]
                        wsum[vr, 0] = tot[0]
    return topk_ids
