"""The kernel of mHC's `dsv4_hc_comb` (ir/ops.py states its semantics; ir/interpret.py is the reference it is tested
against): the Sinkhorn normalisation, one token per thread on a register [S, S] matrix (unfused it would be 40
reduction kernels per sublayer). CPU and GPU forms in one PrimFunc (nextn.compiler.lower: GPU_THREADS).
"""
from __future__ import annotations

from tvm.script import tirx as T

from .. import GPU_THREADS

F32 = "float32"


def hc_comb_kernel(s_: int, eps: float, iters: int, gpu: bool = False):
    """dsv4_hc_comb over [T, S, S] float32 (ir/ops.py states it): one token per task / thread, its [S, S] matrix in
    registers through the softmax and the `iters` Sinkhorn normalisations."""
    S, NT, GPU = s_, GPU_THREADS, gpu

    @T.macro
    def body(c, out, vt):
        m = T.alloc_buffer((S, S), F32, scope="local")
        acc = T.alloc_buffer((1,), F32, scope="local")
        for a in range(S):                                   # softmax over dst + eps
            acc[0] = c[vt, a, 0]
            for b in range(1, S):
                acc[0] = T.max(acc[0], c[vt, a, b])
            for b in range(S):
                m[a, b] = T.exp(c[vt, a, b] - acc[0])
            acc[0] = T.float32(0)
            for b in range(S):
                acc[0] = acc[0] + m[a, b]
            for b in range(S):
                m[a, b] = m[a, b] / acc[0] + T.float32(eps)
        for it in range(iters):
            if it > 0:                                       # normalise over dst
                for a in range(S):
                    acc[0] = T.float32(0)
                    for b in range(S):
                        acc[0] = acc[0] + m[a, b]
                    for b in range(S):
                        m[a, b] = m[a, b] / (acc[0] + T.float32(eps))
            for b in range(S):                               # normalise over src
                acc[0] = T.float32(0)
                for a in range(S):
                    acc[0] = acc[0] + m[a, b]
                for a in range(S):
                    m[a, b] = m[a, b] / (acc[0] + T.float32(eps))
        for a, b in T.grid(S, S):
            out[vt, a, b] = m[a, b]

    @T.prim_func(private=True, s_tir=True)
    def dsv4_hc_comb(var_c: T.handle, var_out: T.handle):
        T.func_attr({"tirx.noalias": True})
        t = T.int64()
        c = T.match_buffer(var_c, (t, S, S), F32)
        out = T.match_buffer(var_out, (t, S, S), F32)
        if GPU:
            for bx in T.thread_binding((t + NT - 1) // NT, thread="blockIdx.x"):
                for tx in T.thread_binding(NT, thread="threadIdx.x"):
                    with T.sblock("dsv4_hc_comb"):
                        vt = T.axis.spatial(t, bx * NT + tx)
                        T.where(bx * NT + tx < t)
                        T.reads(c[vt, 0:S, 0:S])
                        T.writes(out[vt, 0:S, 0:S])
                        body(c, out, vt)
        else:
            for tt in T.parallel(t):
                with T.sblock("dsv4_hc_comb"):
                    vt = T.axis.spatial(t, tt)
                    T.reads(c[vt, 0:S, 0:S])
                    T.writes(out[vt, 0:S, 0:S])
                    body(c, out, vt)

    return dsv4_hc_comb.with_attr("tirx.is_scheduled", True) if GPU else dsv4_hc_comb
