"""RMS norm, its weight and the integer route's activation quantizer as one GPU kernel.

Before each block of GGUF matmuls a layer normalizes its input: `y = rms_norm(x) * w` (ggml_rms_norm then ggml_mul,
llama.cpp src/models/glm4-moe.cpp), and the integer route (int8.py) then quantizes y to int8 rows for the matmuls
that read it (q / k / v after the attention norm; the routed and shared experts after the post-attention norm; the
head after the output norm). As separate kernels that is two launches, and a launch costs ~2-3 us on an H200
whatever it computes (issue 33's per-kernel table, docs/gpu.md); here one block per row does both:

    1. ss = sum of x^2 over the row: each thread a strided partial sum, then a tree over the threads in shared memory
       (a fixed order: the same bits whatever T, so decode, verify and prefill rows agree);
    2. y = x / sqrt(ss / K + eps) * w (te_ops.rms_norm then mul, the same two roundings), stored, and |y| maxima
       per 4-value word (a thread takes groups of 4 words, 16 values);
    3. amax per activation block of B from those maxima (max is exact in any order), d = amax / 127 (int8.quantize_rows);
    4. the words: q = round_half_even(y * (127 / amax)), and each group's sum of 16 q, each thread re-reading the y
       values it stored itself.

xq, xd, xs are `int8.quantize_rows(y, sums=True)` bit for bit (the same expressions on the same y); y is the float
output, for consumers off the integer route (the MoE router's float GEMV). The "gpu-emulated" form runs the same
loops with serial threads on llvm (tests/test_norm_q8.py).
"""
from __future__ import annotations

from tvm.script import tirx as T

from ..attention.flash_attn import _binders
from .int8 import _div

F32, I32 = "float32", "int32"
THREADS = 256      # a power of two: the tree of phase 1
SEGMENT = 8        # words per partial maximum of phase 3 (a block of 256 values: 64 words, 8 segments)
MAX_K = 16384      # the shared word maxima (MAX_K / 4 floats) and the thread's strided loops stay small


def fits(K: int, B: int) -> bool:
    """Whether rows of K values in activation blocks of B take this kernel (else rms_norm, mul, quantize_q8)."""
    return K % B == 0 and B % (4 * SEGMENT) == 0 and K <= MAX_K


def rms_norm_q8_kernel(K: int, B: int, eps: float, cuda: bool, gpu: bool):
    """PrimFunc (x f32 [T, K], w f32 [K] -> y f32 [T, K], xq int32 [T, K/4], xd f32 [T, K/B], xs int32 [T, K/16]):
    y = rms_norm(x, eps) * w, (xq, xd, xs) = int8.quantize_rows(y, B, cuda, sums=True). `cuda`: the quantizer's
    divisions as `__fdiv_rn` (int8._div); `gpu`: a block of THREADS threads per row, else the same loops serially
    (the "gpu-emulated" form)."""
    assert fits(K, B), (K, B)
    from nextn.common.quant.activation import AMAX_MIN

    NT, W, NB, GW = THREADS, K // 4, K // B, K // 16
    NSEG, SPB = W // SEGMENT, B // 4 // SEGMENT    # segments per row, per block
    EK, EG, ES, EB = (-(-n // NT) for n in (K, GW, NSEG, NB))   # strided steps per thread
    STEPS = NT.bit_length() - 1
    outer, inner, shared = _binders(emulate=not gpu)
    attrs = {"tirx.noalias": True, "tirx.is_scheduled": True}
    amin, kf = T.float32(float(AMAX_MIN)), T.float32(float(K))

    @T.prim_func(private=True, s_tir=True)
    def rms_norm_q8(var_x: T.handle, var_w: T.handle, var_y: T.handle, var_q: T.handle, var_d: T.handle,
                    var_s: T.handle):
        T.func_attr(attrs)
        t = T.int64()
        x = T.match_buffer(var_x, (t, K), F32)
        w = T.match_buffer(var_w, (K,), F32)
        y = T.match_buffer(var_y, (t, K), F32)
        xq = T.match_buffer(var_q, (t, W), I32)
        xd = T.match_buffer(var_d, (t, NB), F32)
        xs = T.match_buffer(var_s, (t, GW), I32)
        for r in outer(t):
            with T.sblock("rms_norm_q8"):
                vr = T.axis.spatial(t, r)
                T.reads(x[vr, 0:K], w[0:K])
                T.writes(y[vr, 0:K], xq[vr, 0:W], xd[vr, 0:NB], xs[vr, 0:GW])
                part = T.alloc_buffer((NT,), F32, scope=shared)      # partial sums of squares, then ss in [0]
                wmax = T.alloc_buffer((W,), F32, scope=shared)       # max |y| per word
                smax = T.alloc_buffer((NSEG,), F32, scope=shared)    # ... per segment of SEGMENT words
                bam = T.alloc_buffer((NB,), F32, scope=shared)       # the block's amax, AMAX_MIN applied
                acc = T.alloc_buffer((2,), F32, scope="local")
                wd = T.alloc_buffer((2,), I32, scope="local")   # a word, a group's sum
                for tx in inner(NT):
                    acc[0] = T.float32(0)
                    for e in range(EK):
                        if e * NT + tx < K:
                            acc[0] = acc[0] + x[vr, e * NT + tx] * x[vr, e * NT + tx]
                    part[tx] = acc[0]
                for lv in range(STEPS):
                    for tx in inner(NT):
                        if tx < T.shift_right(NT // 2, lv):
                            part[tx] = part[tx] + part[tx + T.shift_right(NT // 2, lv)]
                for tx in inner(NT):
                    for e in range(EG):
                        if e * NT + tx < GW:
                            for c in range(4):
                                acc[1] = T.float32(0)
                                for i in range(4):
                                    y[vr, (e * NT + tx) * 16 + c * 4 + i] = \
                                        x[vr, (e * NT + tx) * 16 + c * 4 + i] / T.sqrt(part[0] / kf + T.float32(eps)) \
                                        * w[(e * NT + tx) * 16 + c * 4 + i]
                                    acc[1] = T.max(acc[1], T.fabs(y[vr, (e * NT + tx) * 16 + c * 4 + i]))
                                wmax[(e * NT + tx) * 4 + c] = acc[1]
                for tx in inner(NT):
                    for e in range(ES):
                        if e * NT + tx < NSEG:
                            acc[0] = T.float32(0)
                            for i in range(SEGMENT):
                                acc[0] = T.max(acc[0], wmax[(e * NT + tx) * SEGMENT + i])
                            smax[e * NT + tx] = acc[0]
                for tx in inner(NT):
                    for e in range(EB):
                        if e * NT + tx < NB:
                            acc[0] = T.float32(0)
                            for i in range(SPB):
                                acc[0] = T.max(acc[0], smax[(e * NT + tx) * SPB + i])
                            acc[0] = T.Select(acc[0] < amin, T.float32(0), acc[0])
                            bam[e * NT + tx] = acc[0]
                            xd[vr, e * NT + tx] = _div(acc[0], T.float32(127), cuda)
                for tx in inner(NT):
                    for e in range(EG):
                        if e * NT + tx < GW:   # a group's 16 values lie in one block (B >= 32)
                            acc[1] = T.Select(bam[(e * NT + tx) * 16 // B] > T.float32(0),
                                              _div(T.float32(127), bam[(e * NT + tx) * 16 // B], cuda), T.float32(0))
                            wd[1] = 0
                            for c in range(4):
                                wd[0] = 0
                                for i in range(4):
                                    q = T.Cast(I32, T.nearbyint(y[vr, (e * NT + tx) * 16 + c * 4 + i] * acc[1]))
                                    wd[0] = T.bitwise_or(wd[0], T.shift_left(T.bitwise_and(q, 255), 8 * i))
                                    wd[1] = wd[1] + q
                                xq[vr, (e * NT + tx) * 4 + c] = wd[0]
                            xs[vr, e * NT + tx] = wd[1]
    return rms_norm_q8
