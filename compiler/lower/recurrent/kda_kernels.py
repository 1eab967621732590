"""Hand-written TIR kernels of GLM-5.3-Flash's KDA ops (ir/ops.py states their semantics; ir/interpret.py is the
reference they are tested against).

`ssm_conv` / `gated_delta_net` read the committed plane of their recurrent state (zeros at a sequence start) and
write the states they keep into the other planes in place, so a verify pass leaves one state per row and the runtime
rolls back by choosing a plane. The state is S[h, i, j] (key i, value j). The recurrence runs a head per CPU task
with the value axis vectorized (columns are independent: the delta rule couples keys, never values), or one value
column S[h, :, j] per GPU thread in registers; the chunked form (prefill on the CPU) runs one head per task, chunk by
chunk: per chunk the strictly lower system (I + A) delta = beta (v - K~ S) by forward substitution, then the outputs
and the state in matrix form (the WY / UT transform of DeltaNet, Yang et al. 2024). GPU targets run the recurrence
for every row count (one column per thread keeps the GPU busy; a head per thread would not).
No kernel allocates memory beyond registers / thread-local arrays of static size (CUDA graphs, gpu_forms.SPLIT_OPS).
CPU and GPU forms in one PrimFunc (nextn.compiler.lower: GPU_THREADS).
"""
from __future__ import annotations

from tvm.script import tirx as T

from .. import GPU_THREADS

F32 = "float32"


def _kept(t, p):
    """Rows whose state a call keeps: its last min(T, P-1), at least the last (P = 1: in place, no rollback)."""
    return T.max(T.min(t, p - 1), T.int64(1))


def _plane(rs, slot, p):
    """Plane of `slot` (ir/graph.py: slot s is stored in plane (rs_plane + 1 + s) mod P)."""
    return T.floormod(T.Cast("int64", rs[0]) + T.int64(1) + slot, p)



def ssm_conv_kernel(ch_: int, k_: int, gpu: bool = False):
    CH, K, NT, GPU = ch_, k_, GPU_THREADS, gpu

    @T.macro
    def body(x, w, state, pos, rs, y, vc, t, p):
        hist = T.alloc_buffer((K - 1,), F32, scope="local")
        acc = T.alloc_buffer((1,), F32, scope="local")
        for j in range(K - 1):
            hist[j] = T.if_then_else(pos[0] == 0, T.float32(0), state[T.Cast("int64", rs[0]), j, vc])
        for i in range(t):
            acc[0] = T.float32(0)
            for j in range(K):   # sx[i + j]: the history for i + j < K-1, else x[i + j - (K-1)]
                acc[0] = acc[0] + w[vc, j] * T.if_then_else(
                    i + j < K - 1, hist[T.min(i + j, T.int64(K - 2))], x[T.max(i + j - (K - 1), T.int64(0)), vc])
            y[i, vc] = acc[0]
        for i in range(t):
            if i >= t - _kept(t, p):   # a kept row: keep the window ending at row i
                for r in range(K - 1):
                    state[_plane(rs, t - 1 - i, p), r, vc] = T.if_then_else(
                        i + 1 + r < K - 1, hist[T.min(i + 1 + r, T.int64(K - 2))],
                        x[T.max(i + 1 + r - (K - 1), T.int64(0)), vc])

    @T.prim_func(private=True, s_tir=True)
    def ssm_conv(var_x: T.handle, var_w: T.handle, var_state: T.handle, var_pos: T.handle, var_rs: T.handle,
                 var_y: T.handle):
        T.func_attr({"tirx.noalias": True})
        t, p = T.int64(), T.int64()
        x = T.match_buffer(var_x, (t, CH), F32)
        w = T.match_buffer(var_w, (CH, K), F32)
        state = T.match_buffer(var_state, (p, K - 1, CH), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        rs = T.match_buffer(var_rs, (1,), "int32")
        y = T.match_buffer(var_y, (t, CH), F32)
        if GPU:
            for bx in T.thread_binding((CH + NT - 1) // NT, thread="blockIdx.x"):
                for tx in T.thread_binding(NT, thread="threadIdx.x"):
                    with T.sblock("ssm_conv"):
                        vc = T.axis.spatial(CH, bx * NT + tx)
                        T.where(bx * NT + tx < CH)
                        T.reads(x[0:t, vc], w[vc, 0:K], state[0:p, 0:K - 1, vc], pos[0], rs[0])
                        T.writes(y[0:t, vc], state[0:p, 0:K - 1, vc])
                        body(x, w, state, pos, rs, y, vc, t, p)
        else:
            for c in T.parallel(CH):
                with T.sblock("ssm_conv"):
                    vc = T.axis.spatial(CH, c)
                    T.reads(x[0:t, vc], w[vc, 0:K], state[0:p, 0:K - 1, vc], pos[0], rs[0])
                    T.writes(y[0:t, vc], state[0:p, 0:K - 1, vc])
                    body(x, w, state, pos, rs, y, vc, t, p)

    return ssm_conv.with_attr("tirx.is_scheduled", True) if GPU else ssm_conv


def _lanes(n: int) -> int:
    """The vector width of a contiguous loop of n values (the CPU schedules' 16 lanes where n allows)."""
    return next(w for w in (16, 8, 4, 2, 1) if n % w == 0)


def _row_plane(rs, r, t, p):
    """The plane that holds the state after row r while a call of t rows runs: its slot's plane for the last P-1
    rows; the first kept row's plane for the rows before them (overwritten in place)."""
    return _plane(rs, t - 1 - T.max(r, t - p + 1), p)


def gdn_recurrent_kernel(h_: int, dv_: int, dk_: int, gpu: bool = False):
    """gated_delta_net, chunk 0, with `eg` = exp(g) precomputed (one exp per key channel, not per column).
    CPU: one head per task, the value axis j (contiguous in S[i, j]) vectorized; the state lives in the planes it
    is kept in (each row reads the previous row's plane). GPU: one value column per thread, in registers."""
    H, DV, DK, NT, L, GPU = h_, dv_, dk_, GPU_THREADS, _lanes(dv_), gpu

    @T.macro
    def column(q, k, v, eg, beta, state, pos, rs, o, vh, vj, t, p):
        s = T.alloc_buffer((DK,), F32, scope="local")
        acc = T.alloc_buffer((2,), F32, scope="local")
        for i in range(DK):
            s[i] = T.if_then_else(pos[0] == 0, T.float32(0), state[T.Cast("int64", rs[0]), vh, i, vj])
        for r in range(t):
            acc[0] = T.float32(0)
            for i in range(DK):
                s[i] = s[i] * eg[r, vh, i]
                acc[0] = acc[0] + s[i] * k[r, vh, i]
            acc[1] = beta[r, vh] * (v[r, vh, vj] - acc[0])          # delta
            acc[0] = T.float32(0)
            for i in range(DK):
                s[i] = s[i] + k[r, vh, i] * acc[1]
                acc[0] = acc[0] + s[i] * q[r, vh, i]
            o[r, vh, vj] = acc[0]
            if r >= t - _kept(t, p):
                for i in range(DK):
                    state[_plane(rs, t - 1 - r, p), vh, i, vj] = s[i]


    @T.prim_func(private=True, s_tir=True)
    def gated_delta_net(var_q: T.handle, var_k: T.handle, var_v: T.handle, var_eg: T.handle, var_beta: T.handle,
                        var_state: T.handle, var_pos: T.handle, var_rs: T.handle, var_o: T.handle):
        T.func_attr({"tirx.noalias": True})
        t, p = T.int64(), T.int64()
        q = T.match_buffer(var_q, (t, H, DK), F32)
        k = T.match_buffer(var_k, (t, H, DK), F32)
        v = T.match_buffer(var_v, (t, H, DV), F32)
        eg = T.match_buffer(var_eg, (t, H, DK), F32)
        beta = T.match_buffer(var_beta, (t, H), F32)
        state = T.match_buffer(var_state, (p, H, DK, DV), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        rs = T.match_buffer(var_rs, (1,), "int32")
        o = T.match_buffer(var_o, (t, H, DV), F32)
        if GPU:
            for bx in T.thread_binding((H * DV + NT - 1) // NT, thread="blockIdx.x"):
                for tx in T.thread_binding(NT, thread="threadIdx.x"):
                    with T.sblock("gated_delta_net"):
                        vh = T.axis.spatial(H, (bx * NT + tx) // DV)
                        vj = T.axis.spatial(DV, (bx * NT + tx) % DV)
                        T.where(bx * NT + tx < H * DV)
                        T.reads(q[0:t, vh, 0:DK], k[0:t, vh, 0:DK], v[0:t, vh, vj], eg[0:t, vh, 0:DK], beta[0:t, vh],
                                state[0:p, vh, 0:DK, vj], pos[0], rs[0])
                        T.writes(o[0:t, vh, vj], state[0:p, vh, 0:DK, vj])
                        column(q, k, v, eg, beta, state, pos, rs, o, vh, vj, t, p)
        else:
            for h in T.parallel(H):
                with T.sblock("gated_delta_net"):
                    vh = T.axis.spatial(H, h)
                    T.reads(q[0:t, vh, 0:DK], k[0:t, vh, 0:DK], v[0:t, vh, 0:DV], eg[0:t, vh, 0:DK], beta[0:t, vh],
                            state[0:p, vh, 0:DK, 0:DV], pos[0], rs[0])
                    T.writes(o[0:t, vh, 0:DV], state[0:p, vh, 0:DK, 0:DV])
                    kv = T.alloc_buffer((DV,), F32, scope="local")
                    d0 = _row_plane(rs, T.int64(0), t, p)
                    src = T.Cast("int64", rs[0])
                    for i, jo in T.grid(DK, DV // L):
                        for jl in T.vectorized(L):
                            state[d0, vh, i, jo * L + jl] = T.if_then_else(pos[0] == 0, T.float32(0),
                                                                           state[src, vh, i, jo * L + jl])
                    for r in range(t):
                        prev = _row_plane(rs, T.max(r, T.int64(1)) - 1, t, p)
                        cur = _row_plane(rs, r, t, p)
                        for jo in range(DV // L):
                            for jl in T.vectorized(L):
                                kv[jo * L + jl] = T.float32(0)
                        for i, jo in T.grid(DK, DV // L):          # decay, and kv = S^T k
                            for jl in T.vectorized(L):
                                state[cur, vh, i, jo * L + jl] = state[prev, vh, i, jo * L + jl] * eg[r, vh, i]
                                kv[jo * L + jl] = kv[jo * L + jl] + state[cur, vh, i, jo * L + jl] * k[r, vh, i]
                        for jo in range(DV // L):
                            for jl in T.vectorized(L):              # kv := delta
                                kv[jo * L + jl] = beta[r, vh] * (v[r, vh, jo * L + jl] - kv[jo * L + jl])
                                o[r, vh, jo * L + jl] = T.float32(0)
                        for i, jo in T.grid(DK, DV // L):          # S += k delta^T, o = S^T q
                            for jl in T.vectorized(L):
                                state[cur, vh, i, jo * L + jl] = state[cur, vh, i, jo * L + jl] + k[r, vh, i] * kv[jo * L + jl]
                                o[r, vh, jo * L + jl] = o[r, vh, jo * L + jl] + state[cur, vh, i, jo * L + jl] * q[r, vh, i]

    return gated_delta_net.with_attr("tirx.is_scheduled", True) if GPU else gated_delta_net


def gdn_chunked_kernel(h_: int, dv_: int, dk_: int, c_: int):
    """gated_delta_net, chunk c: one head per task, the state updated in place in the slot-0 plane (CPU only).
    Within a chunk the pairwise decay exp(gamma_t - gamma_r) is factored as exp(gamma_t) * exp(-gamma_r): one exp
    per (row, key) instead of one per (row, row, key). That needs |gamma| <= 80 inside a chunk (exp(80) and
    exp(-80) are normal float32 numbers), which the graph builder guarantees by the chunk size it picks from the
    gate's lower bound (glm5next/graph.py `kda_chunk`). Reductions over keys use LANES partial sums."""
    H, DV, DK, C, L, LK = h_, dv_, dk_, c_, _lanes(dv_), _lanes(dk_)

    @T.prim_func(private=True, s_tir=True)
    def gated_delta_net_chunked(var_q: T.handle, var_k: T.handle, var_v: T.handle, var_g: T.handle,
                                var_beta: T.handle, var_state: T.handle, var_pos: T.handle, var_rs: T.handle,
                                var_o: T.handle):
        T.func_attr({"tirx.noalias": True})
        t, p = T.int64(), T.int64()
        q = T.match_buffer(var_q, (t, H, DK), F32)
        k = T.match_buffer(var_k, (t, H, DK), F32)
        v = T.match_buffer(var_v, (t, H, DV), F32)
        g = T.match_buffer(var_g, (t, H, DK), F32)
        beta = T.match_buffer(var_beta, (t, H), F32)
        state = T.match_buffer(var_state, (p, H, DK, DV), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        rs = T.match_buffer(var_rs, (1,), "int32")
        o = T.match_buffer(var_o, (t, H, DV), F32)
        for h in T.parallel(H):
            with T.sblock("gated_delta_net_chunked"):
                vh = T.axis.spatial(H, h)
                T.reads(q[0:t, vh, 0:DK], k[0:t, vh, 0:DK], v[0:t, vh, 0:DV], g[0:t, vh, 0:DK], beta[0:t, vh],
                        state[0:p, vh, 0:DK, 0:DV], pos[0], rs[0])
                T.writes(o[0:t, vh, 0:DV], state[0:p, vh, 0:DK, 0:DV])
                gam = T.alloc_buffer((C, DK), F32, scope="local")     # decay since the chunk start (log, then exp)
                qe = T.alloc_buffer((C, DK), F32, scope="local")      # q_t * exp(gamma_t)
                ke = T.alloc_buffer((C, DK), F32, scope="local")      # k_t * exp(gamma_t)
                ki = T.alloc_buffer((C, DK), F32, scope="local")      # k_r * exp(-gamma_r)
                kd = T.alloc_buffer((C, DK), F32, scope="local")      # k_r * exp(gamma_last - gamma_r)
                am = T.alloc_buffer((C, C), F32, scope="local")       # beta_t k_t . D(t, r) k_r, r < t
                bm = T.alloc_buffer((C, C), F32, scope="local")       # q_t . D(t, r) k_r, r <= t
                dl = T.alloc_buffer((C, DV), F32, scope="local")      # delta
                vec = T.alloc_buffer((DV,), F32, scope="local")
                part = T.alloc_buffer((2, LK), F32, scope="local")
                acc = T.alloc_buffer((1,), F32, scope="local")
                dst = _plane(rs, T.int64(0), p)
                src = T.Cast("int64", rs[0])
                for i, jo in T.grid(DK, DV // L):
                    for jl in T.vectorized(L):
                        state[dst, vh, i, jo * L + jl] = T.if_then_else(pos[0] == 0, T.float32(0),
                                                                        state[src, vh, i, jo * L + jl])
                for ci in range((t + C - 1) // C):
                    c0 = ci * C
                    n = T.min(T.int64(C), t - c0)
                    for i in range(DK):
                        acc[0] = T.float32(0)
                        for r in range(n):
                            acc[0] = acc[0] + g[c0 + r, vh, i]
                            gam[r, i] = acc[0]
                    for r, i in T.grid(n, DK):      # gam := exp(gamma): one exp per (row, key)
                        gam[r, i] = T.exp(gam[r, i])
                    for r, i in T.grid(n, DK):
                        qe[r, i] = q[c0 + r, vh, i] * gam[r, i]
                        ke[r, i] = k[c0 + r, vh, i] * gam[r, i]
                        ki[r, i] = k[c0 + r, vh, i] / gam[r, i]
                        kd[r, i] = k[c0 + r, vh, i] * (gam[n - 1, i] / gam[r, i])
                    for tt, r in T.grid(n, n):
                        for il in T.vectorized(LK):
                            part[0, il] = T.float32(0)
                            part[1, il] = T.float32(0)
                        if r <= tt:
                            for io in range(DK // LK):
                                for il in T.vectorized(LK):
                                    part[0, il] = part[0, il] + ke[tt, io * LK + il] * ki[r, io * LK + il]
                                    part[1, il] = part[1, il] + qe[tt, io * LK + il] * ki[r, io * LK + il]
                        am[tt, r] = T.float32(0)
                        bm[tt, r] = T.float32(0)
                        for il in range(LK):
                            am[tt, r] = am[tt, r] + part[0, il]
                            bm[tt, r] = bm[tt, r] + part[1, il]
                        am[tt, r] = T.if_then_else(r < tt, beta[c0 + tt, vh] * am[tt, r], T.float32(0))
                    for tt in range(n):              # forward substitution of (I + A) delta = beta (v - K~ S)
                        for jo in range(DV // L):
                            for jl in T.vectorized(L):
                                vec[jo * L + jl] = T.float32(0)
                        for i, jo in T.grid(DK, DV // L):
                            for jl in T.vectorized(L):
                                vec[jo * L + jl] = vec[jo * L + jl] + ke[tt, i] * state[dst, vh, i, jo * L + jl]
                        for jo in range(DV // L):
                            for jl in T.vectorized(L):
                                dl[tt, jo * L + jl] = beta[c0 + tt, vh] * (v[c0 + tt, vh, jo * L + jl] - vec[jo * L + jl])
                        for r, jo in T.grid(tt, DV // L):
                            for jl in T.vectorized(L):
                                dl[tt, jo * L + jl] = dl[tt, jo * L + jl] - am[tt, r] * dl[r, jo * L + jl]
                    for tt in range(n):              # outputs: Q~ S + B delta (S before this chunk's update)
                        for jo in range(DV // L):
                            for jl in T.vectorized(L):
                                o[c0 + tt, vh, jo * L + jl] = T.float32(0)
                        for i, jo in T.grid(DK, DV // L):
                            for jl in T.vectorized(L):
                                o[c0 + tt, vh, jo * L + jl] = o[c0 + tt, vh, jo * L + jl] + qe[tt, i] * state[dst, vh, i, jo * L + jl]
                        for r, jo in T.grid(tt + 1, DV // L):
                            for jl in T.vectorized(L):
                                o[c0 + tt, vh, jo * L + jl] = o[c0 + tt, vh, jo * L + jl] + bm[tt, r] * dl[r, jo * L + jl]
                    for i in range(DK):              # S = exp(gamma_last) S + sum_r kd_r delta_r^T
                        acc[0] = gam[n - 1, i]
                        for jo in range(DV // L):
                            for jl in T.vectorized(L):
                                state[dst, vh, i, jo * L + jl] = state[dst, vh, i, jo * L + jl] * acc[0]
                        for r, jo in T.grid(n, DV // L):
                            for jl in T.vectorized(L):
                                state[dst, vh, i, jo * L + jl] = state[dst, vh, i, jo * L + jl] + kd[r, i] * dl[r, jo * L + jl]

    return gated_delta_net_chunked
