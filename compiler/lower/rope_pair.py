"""Rope of a layer's q and k, with their per-head RMS norms, as one kernel for the GPU forms.

GLM's attention computes, per row (llama.cpp src/models/glm4-moe.cpp):

    q = rope_ext(rms_norm(q) * attn_q_norm)      k = rope_ext(rms_norm(k) * attn_k_norm)

(the norms where the model has them: GLM-4.5 / 4.6 / 4.7 do, GLM-4.5-Air does not). As TE that is four kernels
per layer and step (two per-head norms, two ropes), each a launch of ~2-3 us on an H200 whatever it computes (issue
33's per-kernel table, docs/gpu.md). Here one thread block per (row, head) of q and k together and a thread per
dimension:

    1. (norms) ss = sum of x^2 over the head: each thread its square, then a tree over the threads in shared
       memory (a fixed order: the same bits whatever T);
    2. y = x / sqrt(ss / D + eps) * w (te_ops.rms_norm then mul, the same two roundings), or y = x, into shared
       memory;
    3. out = rope of y, cos and sin of the element's pair from te_ops.rope_cos_sin, the element from
       te_ops.rope_element: the expressions te_ops.rope_ext evaluates, so the rope is the TE kernel's.

The "gpu-emulated" form runs the same loops with serial threads on llvm (tests/test_rope_pair.py; the split-form
tests of tests/test_kv_bucket.py run whole models through it).
"""
from __future__ import annotations

from tvm.script import tirx as T

from . import te_ops
from .attention.flash_attn import _binders

F32 = "float32"
MAX_THREADS = 1024


def threads(D: int) -> int:
    """Threads per block: D rounded up to a power of two (the tree of the norm)."""
    return 1 << (D - 1).bit_length()


def rope_pair_kernel(Hq: int, Hk: int, D: int, rope: dict, eps: float | None, gpu: bool):
    """PrimFunc (a f32 [T, Hq, D], b f32 [T, Hk, D], [wa f32 [D], wb f32 [D],] pos int32 [T] -> oa, ob like a, b):
    oa = rope_ext(rms_norm(a, eps) * wa), ob the same of b with wb; without the weights (eps None) oa = rope_ext(a).
    `rope`: rope_ext's attributes (n_rot, mode, then compiler/ir/rope.py PARAMS). `gpu`: a block per (row, head),
    a thread per dimension; else the same loops serially (the "gpu-emulated" form)."""
    NT = threads(D)
    assert NT <= MAX_THREADS, D
    n_rot, mode = rope["n_rot"], rope["mode"]
    par = {k: v for k, v in rope.items() if k not in ("n_rot", "mode")}
    H, STEPS = Hq + Hk, NT.bit_length() - 1
    outer, inner, shared = _binders(emulate=not gpu)
    attrs = {"tirx.noalias": True, "tirx.is_scheduled": True}
    df = T.float32(float(D))

    def src(a, b, row, h, d):   # element d of head h of row `row`, q's heads first
        return T.if_then_else(h < Hq, a[row, T.min(h, Hq - 1), d], b[row, T.max(h - Hq, 0), d])

    def out(yb, pos, row, d):
        j = te_ops.rope_pair_index(d, n_rot, mode)
        c, s = te_ops.rope_cos_sin(pos[row], j, n_rot, **par)
        return te_ops.rope_element(lambda e: yb[T.min(T.max(e, 0), D - 1)], d, c, s, n_rot, mode)

    @T.macro
    def store(a, b, oa, ob, yb, pos, row, h):
        for tx in inner(NT):
            if tx < D:
                if h < Hq:
                    oa[row, h, tx] = out(yb, pos, row, tx)
                else:
                    ob[row, h - Hq, tx] = out(yb, pos, row, tx)

    if eps is None:
        @T.prim_func(private=True, s_tir=True)
        def rope_pair(var_a: T.handle, var_b: T.handle, var_pos: T.handle, var_oa: T.handle, var_ob: T.handle):
            T.func_attr(attrs)
            t = T.int64()
            a = T.match_buffer(var_a, (t, Hq, D), F32)
            b = T.match_buffer(var_b, (t, Hk, D), F32)
            pos = T.match_buffer(var_pos, (t,), "int32")
            oa = T.match_buffer(var_oa, (t, Hq, D), F32)
            ob = T.match_buffer(var_ob, (t, Hk, D), F32)
            for task in outer(t * H):
                with T.sblock("rope_pair"):
                    vt = T.axis.spatial(t * H, task)
                    T.reads(a[vt // H, 0:Hq, 0:D], b[vt // H, 0:Hk, 0:D], pos[vt // H])
                    T.writes(oa[vt // H, 0:Hq, 0:D], ob[vt // H, 0:Hk, 0:D])
                    yb = T.alloc_buffer((D,), F32, scope=shared)
                    for tx in inner(NT):
                        if tx < D:
                            yb[tx] = src(a, b, vt // H, vt % H, tx)
                    store(a, b, oa, ob, yb, pos, vt // H, vt % H)
        return rope_pair

    @T.prim_func(private=True, s_tir=True)
    def rope_pair_norm(var_a: T.handle, var_b: T.handle, var_wa: T.handle, var_wb: T.handle, var_pos: T.handle,
                       var_oa: T.handle, var_ob: T.handle):
        T.func_attr(attrs)
        t = T.int64()
        a = T.match_buffer(var_a, (t, Hq, D), F32)
        b = T.match_buffer(var_b, (t, Hk, D), F32)
        wa = T.match_buffer(var_wa, (D,), F32)
        wb = T.match_buffer(var_wb, (D,), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        oa = T.match_buffer(var_oa, (t, Hq, D), F32)
        ob = T.match_buffer(var_ob, (t, Hk, D), F32)
        for task in outer(t * H):
            with T.sblock("rope_pair_norm"):
                vt = T.axis.spatial(t * H, task)
                T.reads(a[vt // H, 0:Hq, 0:D], b[vt // H, 0:Hk, 0:D], wa[0:D], wb[0:D], pos[vt // H])
                T.writes(oa[vt // H, 0:Hq, 0:D], ob[vt // H, 0:Hk, 0:D])
                part = T.alloc_buffer((NT,), F32, scope=shared)
                yb = T.alloc_buffer((D,), F32, scope=shared)
                for tx in inner(NT):
                    part[tx] = T.if_then_else(tx < D, src(a, b, vt // H, vt % H, tx) * src(a, b, vt // H, vt % H, tx),
                                              T.float32(0))
                for lv in range(STEPS):
                    for tx in inner(NT):
                        if tx < T.shift_right(NT // 2, lv):
                            part[tx] = part[tx] + part[tx + T.shift_right(NT // 2, lv)]
                for tx in inner(NT):
                    if tx < D:
                        yb[tx] = src(a, b, vt // H, vt % H, tx) / T.sqrt(part[0] / df + T.float32(eps)) \
                            * T.if_then_else(vt % H < Hq, wa[tx], wb[tx])
                store(a, b, oa, ob, yb, pos, vt // H, vt % H)
    return rope_pair_norm
