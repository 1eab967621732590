"""Hand-written TIR kernels of the DSA lightning indexer's IR ops (glm-dsa; GLM-5.3-Flash's pooled indexer) that TE
cannot express cheaply.

- `top_k_mask`: the per-row top-k of the lightning-indexer score as an additive mask. A TE rank count is
  O(L^2) per row (too slow at L ~ 2k); instead each row finds its k-th largest score exactly by bisection on
  the order-preserving integer key of the float (32 counting passes), then selects every score above it and
  the lowest-index ties equal to it: the same selection as a stable descending argsort (`ir/interpret.py`).
  Rows whose causal cell count is <= k select every cell without any pass.
- `index_mask_store`: keeps the last row's selection in the NextN state for index sharing (in place).
- `lightning_indexer`: the index score, over the cells or (GLM-5.3-Flash) over pools of cells.
- `kpool_store`: pools the indexer keys of every pool a row completes (in place), reading the indexer rows in
  their KV type (-ctk); the pooled keys are float32. CPU and GPU forms in one PrimFunc (nextn.compiler.lower:
  GPU_THREADS).
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .. import GPU_THREADS
from ..attention import kv_access
from ..attention.flash_attn import _binders, _stage_macro

F32 = "float32"


KEY_NEG_INF = -2139095041   # order key of -inf: bits 0xff800000 ^ 0x7fffffff as int32


def _top_k_mask_kernel(k: int, kpool: int = 1):
    """Exact per-row top-k by bisection over the float32 order keys (int32: the bits, with the sign-magnitude
    negatives flipped; -0.0 ties with 0.0). #(key >= m) is counted as #(x >= float(m)): one float compare per
    cell, no per-row key buffer (CUDA kernels cannot allocate global scratch). float(m) is exact for every m
    the counts need: m is clamped up to key(-inf) (every x has key >= it), m above key(+inf) is a NaN that no x
    reaches, and the only m with no float of its own (-1, raw -0.0) compares as >= -0.0, i.e. key >= 0.
    `kpool` > 1: the scores are per pool of kpool cells, (pos + 1) // kpool of them causal (ir/graph.py)."""
    K, KP = k, kpool

    def key_float(m):
        m32 = tirx.Cast("int32", tirx.max(m, tirx.const(KEY_NEG_INF, "int64")))
        return tirx.reinterpret("float32", tirx.if_then_else(
            m32 >= 0, m32, tirx.bitwise_xor(m32, tirx.const(2147483647, "int32"))))

    @T.prim_func(private=True, s_tir=True)
    def top_k_mask(var_score: T.handle, var_pos: T.handle, var_mask: T.handle):
        T.func_attr({"tirx.noalias": True})
        t, l = T.int64(), T.int64()
        score = T.match_buffer(var_score, (t, l), "float32")
        pos = T.match_buffer(var_pos, (t,), "int32")
        mask = T.match_buffer(var_mask, (t, l), "float32")
        for r in T.parallel(t):
            with T.sblock("top_k_mask"):
                vr = T.axis.spatial(t, r)
                T.reads(score[vr, 0:l], pos[vr])
                T.writes(mask[vr, 0:l])
                acc = T.alloc_buffer((3,), "int64", scope="local")   # lo, hi, count
                thr = T.alloc_buffer((1,), "float32", scope="local")
                n = T.min((T.Cast("int64", pos[vr]) + T.int64(1)) // KP, l)
                if n <= T.int64(K):
                    for s in range(l):
                        mask[vr, s] = T.float32(0)
                else:
                    # invariant: #(key >= lo) >= K > #(key >= hi); 32 halvings of 2^32 leave lo = the K-th largest key
                    acc[0] = T.int64(-2147483648)
                    acc[1] = T.int64(2147483648)
                    for _it in range(32):
                        acc[2] = T.int64(0)
                        thr[0] = key_float(T.floordiv(acc[0] + acc[1], T.int64(2)))
                        for s in range(n):
                            if score[vr, s] >= thr[0]:
                                acc[2] = acc[2] + T.int64(1)
                        if acc[2] >= T.int64(K):
                            acc[0] = T.floordiv(acc[0] + acc[1], T.int64(2))
                        else:
                            acc[1] = T.floordiv(acc[0] + acc[1], T.int64(2))
                    # lo is the key of an element, so its float is exact and == / > match the keys' order
                    thr[0] = key_float(acc[0])
                    acc[2] = T.int64(0)
                    for s in range(n):
                        if score[vr, s] > thr[0]:
                            acc[2] = acc[2] + T.int64(1)
                    for s in range(l):   # ties at the threshold: lowest cell index first
                        if s < n and (score[vr, s] > thr[0] or (score[vr, s] == thr[0] and acc[2] < T.int64(K))):
                            mask[vr, s] = T.float32(0)
                            if score[vr, s] == thr[0]:
                                acc[2] = acc[2] + T.int64(1)
                        else:
                            mask[vr, s] = T.float32(-float("inf"))

    return top_k_mask


def _index_mask_store_kernel(after: float = 0.0):
    AFTER = after

    @T.prim_func(private=True, s_tir=True)
    def index_mask_store(var_state: T.handle, var_mask: T.handle, var_pos: T.handle):
        """state[s] = mask[T-1, s] for s <= pos[T-1] (< L), `after` (0: selected) for later cells (in place)."""
        T.func_attr({"tirx.noalias": True})
        c, t, l = T.int64(), T.int64(), T.int64()
        state = T.match_buffer(var_state, (c,), "float32")
        mask = T.match_buffer(var_mask, (t, l), "float32")
        pos = T.match_buffer(var_pos, (t,), "int32")
        for s in range(c):
            with T.sblock("index_mask_store"):
                vs = T.axis.spatial(c, s)
                state[vs] = T.if_then_else(vs <= T.min(T.Cast("int64", pos[t - T.int64(1)]), l - T.int64(1)),
                                           mask[t - T.int64(1), T.min(vs, l - T.int64(1))], T.float32(AFTER))

    return index_mask_store


index_mask_store_kernel = _index_mask_store_kernel()


INDEX_CHUNK = 256   # cells per task of the index-score kernels
INDEX_TILE = 8      # cells per register tile (CPU)
INDEX_THREADS = 128


def lightning_indexer_kernel(Hi: int, D: int, k_type: str = "f32", gpu: bool = False, emulate: bool = False,
                             kpool: int = 1):
    """DSA index score out [T, L] (ir/graph.py `lightning_indexer`): out[t, c] = sum_h relu(q[t, h]·k[c]) * w[t, h]
    on the causal cells c <= pos[t], -inf on the others; the key cache k [C, 1, D] is of KV type `k_type`.
    `kpool` > 1: k holds one pooled key per pool of kpool cells and out is [T, L // kpool], pool p causal for row t
    when (p + 1) * kpool - 1 <= pos[t] (GLM-5.3-Flash's k-pool indexer).
    Per-head scores are reduced as they are produced (no [T, Hi, L] anywhere): a task is (row, chunk of cells);
    each cell's score sums d in order for every head, then the heads in order. CPU: heads as vector lanes over a
    register tile of cells. GPU (`gpu`, or `emulate` for its CPU twin): a block per task, a thread per cell."""
    kdt, kw = kv_access.storage_dtype(k_type), kv_access.storage_width(k_type, D)
    CH, TL, NTH, KP = INDEX_CHUNK, INDEX_TILE, INDEX_THREADS, int(kpool)
    NEG = -float("inf")

    stage = _stage_macro(k_type, D)
    blk, thr, _shared = _binders(emulate)

    @T.macro
    def cpu_body(q, k, w, pos, out, L, t, c):
        for task in T.parallel(t * ((L // KP + CH - 1) // CH)):
            with T.sblock("lightning_indexer"):
                vt = T.axis.spatial(t * ((L // KP + CH - 1) // CH), task)
                T.reads(q[0:t, 0:Hi, 0:D], k[0:c, 0:1, 0:kw], w[0:t, 0:Hi], pos[0:t])
                T.writes(out[0:t, 0:L // KP])
                qT = T.alloc_buffer((D, Hi), "float32", scope="local")
                kt = T.alloc_buffer((TL, D), "float32", scope="local")
                s = T.alloc_buffer((TL, Hi), "float32", scope="local")
                acc = T.alloc_buffer((1,), "float32", scope="local")
                row = vt // ((L // KP + CH - 1) // CH)
                c0 = vt % ((L // KP + CH - 1) // CH) * CH
                n = T.min((T.Cast("int64", pos[row]) + 1) // KP, L // KP)
                for d, h in T.grid(D, Hi):
                    qT[d, h] = q[row, h, d]
                for tile in range((T.min(L // KP - c0, T.int64(CH)) + TL - 1) // TL):
                    if c0 + tile * TL < n:
                        for j in range(TL):
                            stage(kt, j, k, T.min(c0 + tile * TL + j, n - 1), 0)
                        for j in T.unroll(TL):
                            for h in T.vectorized(Hi):
                                s[j, h] = T.float32(0)
                        for d in range(D):
                            for j in T.unroll(TL):
                                for h in T.vectorized(Hi):
                                    s[j, h] = s[j, h] + qT[d, h] * kt[j, d]
                    for j in range(TL):
                        if c0 + tile * TL + j < n:
                            acc[0] = T.float32(0)
                            for h in range(Hi):
                                acc[0] = acc[0] + T.max(s[j, h], T.float32(0)) * w[row, h]
                            out[row, c0 + tile * TL + j] = acc[0]
                        elif c0 + tile * TL + j < L // KP:
                            out[row, c0 + tile * TL + j] = T.float32(NEG)

    @T.macro
    def gpu_body(q, k, w, pos, out, L, t, c):
        for task in blk(t * ((L // KP + CH - 1) // CH)):
            with T.sblock("lightning_indexer"):
                vt = T.axis.spatial(t * ((L // KP + CH - 1) // CH), task)
                T.reads(q[0:t, 0:Hi, 0:D], k[0:c, 0:1, 0:kw], w[0:t, 0:Hi], pos[0:t])
                T.writes(out[0:t, 0:L // KP])
                acc = T.alloc_buffer((Hi + 1,), "float32", scope="local")   # per-head dot products, then the sum
                row = vt // ((L // KP + CH - 1) // CH)
                c0 = vt % ((L // KP + CH - 1) // CH) * CH
                n = T.min((T.Cast("int64", pos[row]) + 1) // KP, L // KP)
                for tx in thr(NTH):
                    for e in range(CH // NTH):
                        if c0 + e * NTH + tx < n:
                            for h in range(Hi):
                                acc[h] = T.float32(0)
                            for d in range(D):   # d outer: each key element is read once, for every head
                                for h in range(Hi):
                                    acc[h] = acc[h] + q[row, h, d] * kv_access.element(k, k_type, c0 + e * NTH + tx, 0, d)
                            acc[Hi] = T.float32(0)
                            for h in range(Hi):
                                acc[Hi] = acc[Hi] + T.max(acc[h], T.float32(0)) * w[row, h]
                            out[row, c0 + e * NTH + tx] = acc[Hi]
                        elif c0 + e * NTH + tx < L // KP:
                            out[row, c0 + e * NTH + tx] = T.float32(NEG)

    body = gpu_body if (gpu or emulate) else cpu_body

    @T.prim_func(private=True, s_tir=True)
    def lightning_indexer(var_q: T.handle, var_k: T.handle, var_w: T.handle, var_pos: T.handle,
                          L: T.int64, var_out: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        t, c = T.int64(), T.int64()
        q = T.match_buffer(var_q, (t, Hi, D), "float32")
        k = T.match_buffer(var_k, (c, 1, kw), kdt)
        w = T.match_buffer(var_w, (t, Hi), "float32")
        pos = T.match_buffer(var_pos, (t,), "int32")
        out = T.match_buffer(var_out, (t, L // KP), "float32")
        body(q, k, w, pos, out, L, t, c)
    return lightning_indexer


def kpool_store_kernel(kp_: int, d_: int, k_type: str = "f32", gpu: bool = False):
    """kpool_store (ir/ops.py): pools the indexer keys of every pool a row completes, in place, one (row, channel)
    per task / thread. `ik` / `ig` are KV caches of type `k_type` (read through kv_access); `pooled` is float32."""
    KP, D, NT, GPU = kp_, d_, GPU_THREADS, gpu
    kdt, kw = kv_access.storage_dtype(k_type), kv_access.storage_width(k_type, d_)

    def ikv(buf, c, d):
        return kv_access.element(buf, k_type, c, 0, d)

    @T.macro
    def body(pooled, ik, ig, ape, pos, vt, vd):
        acc = T.alloc_buffer((3,), F32, scope="local")   # max, sum of exp, weighted sum
        p0 = T.Cast("int64", pos[vt]) // KP * KP
        if T.floormod(T.Cast("int64", pos[vt]) + T.int64(1), KP) == T.int64(0):
            acc[0] = ikv(ig, p0, vd) + ape[0, vd]
            for j in range(1, KP):
                acc[0] = T.max(acc[0], ikv(ig, p0 + j, vd) + ape[j, vd])
            acc[1] = T.float32(0)
            acc[2] = T.float32(0)
            for j in range(KP):
                e = T.exp(ikv(ig, p0 + j, vd) + ape[j, vd] - acc[0])
                acc[1] = acc[1] + e
                acc[2] = acc[2] + e * ikv(ik, p0 + j, vd)
            pooled[p0 // KP, 0, vd] = acc[2] / acc[1]

    @T.prim_func(private=True, s_tir=True)
    def kpool_store(var_pooled: T.handle, var_ik: T.handle, var_ig: T.handle, var_ape: T.handle, var_pos: T.handle):
        T.func_attr({"tirx.noalias": True})
        cp, c, t = T.int64(), T.int64(), T.int64()
        pooled = T.match_buffer(var_pooled, (cp, 1, D), F32)
        ik = T.match_buffer(var_ik, (c, 1, kw), kdt)
        ig = T.match_buffer(var_ig, (c, 1, kw), kdt)
        ape = T.match_buffer(var_ape, (KP, D), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        if GPU:
            for bx in T.thread_binding((t * D + NT - 1) // NT, thread="blockIdx.x"):
                for tx in T.thread_binding(NT, thread="threadIdx.x"):
                    with T.sblock("kpool_store"):
                        vt = T.axis.spatial(t, (bx * NT + tx) // D)
                        vd = T.axis.spatial(D, (bx * NT + tx) % D)
                        T.where(bx * NT + tx < t * D)
                        T.reads(ik[0:c, 0, 0:kw], ig[0:c, 0, 0:kw], ape[0:KP, vd], pos[vt])
                        T.writes(pooled[0:cp, 0, vd])
                        body(pooled, ik, ig, ape, pos, vt, vd)
        else:
            for td in T.parallel(t * D):
                with T.sblock("kpool_store"):
                    vt = T.axis.spatial(t, td // D)
                    vd = T.axis.spatial(D, td % D)
                    T.reads(ik[0:c, 0, 0:kw], ig[0:c, 0, 0:kw], ape[0:KP, vd], pos[vt])
                    T.writes(pooled[0:cp, 0, vd])
                    body(pooled, ik, ig, ape, pos, vt, vd)

    return kpool_store.with_attr("tirx.is_scheduled", True) if GPU else kpool_store
