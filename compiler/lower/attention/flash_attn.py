"""Attention as online-softmax ("flash") kernels: no [T, H, L] score tensor anywhere, on the CPU or a GPU.

Semantics: the IR's `flash_attn_ext` / `flash_attn_ext_mla` (ir/graph.py, restated in ir/interpret.py): query
row t of head h attends to the cells c < L with c <= pos[t] (and, with a mask, weight exp(mask[t, c]): the DSA
selection is 0 / -inf), GQA head h reads KV head h // (H / Hkv); MLA reads one latent head as K and its first
n_v columns as V. A row with no cell left gets 0 (ggml's flash_attn_ext: S == 0 -> 0).

Arithmetic, identical in every kernel of a target and for every row count (the property that keeps speculation
on ≡ off byte for byte: a row's result depends on its own position and the cells only, never on T, L or on which
form ran it). Cells are cut at absolute positions into chunks of CHUNK cells and tiles of TILE cells (`gpu_tile` on
GPUs, whose kernels are thus not bit-equal to the CPU's, only to each other). Per
(row, head) and chunk: for each tile, scores s_j = (q·k_j, summed over d in order) * scale (+ mask), then one
online-softmax step (mt = max(m, max_j s_j); alpha = exp(m - mt); p_j = exp(s_j - mt); l = l alpha + sum_j p_j;
acc = acc alpha + sum_j p_j v_j, j in order) gives the chunk's partial (m, l, acc); the chunks' partials are then
merged in chunk order (M = max(m, m_c); l = l e^(m-M) + l_c e^(m_c-M); acc likewise) and acc / l is the output.
A -inf max makes its exp factor 0. Cells after a row's last causal cell add exact zeros, so processing them or
not (tiles and chunks past it) changes no bit. exp is one float32 polynomial (`fexp`) in every kernel.

Forms (emitted by attention/__init__.py):
- fused: one kernel, each task keeps the running merge state (prefill and NextN rows: large T);
- split: a partial kernel, one task per chunk (and group of rows), writes every chunk's (m, l, acc) to a
  [T, H, NC, .] tensor, then
  a merge kernel combines them in chunk order: L-parallel, for the one-row steps and verify at long context
  (flash-decoding); its intermediates are Relax tensors, so no kernel allocates device memory.
Each form exists for the CPU (tasks over T.parallel, heads of a KV group as vector lanes) and for GPUs (a thread
block per task, shared-memory tiles); the GPU kernels can also be built for the CPU with serial threads
(`emulate=True`), which is how their arithmetic is tested without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from . import kv_access

F32 = "float32"
NEG_INF = -float("inf")
CHUNK = 256          # cells per chunk: unit of the split over L and of the merge order (absolute positions)
TILE = 16            # cells per tile: one softmax rescale per tile
MAX_LANES = 16       # CPU: query heads sharing one KV head processed together (vector lanes)

# exp(x), x <= 0, as a float32 polynomial (the Cephes expf scheme): x = n ln2 + r with n = floor(x log2 e + 1/2),
# exp(r) = 1 + r + r^2 P(r), times 2^n in the exponent bits; x < -87.33 gives 0. Max error ~2 ulp, and
# vectorizable (libm's expf is a scalar call per element on the CPU).
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_EXP_MIN = -87.33654


def fexp(x, select: bool = False):
    """exp(x) by the polynomial above; `select`: the x < _EXP_MIN case as a Select (see exp_factor)."""
    c = lambda v: tirx.const(v, F32)   # noqa: E731
    pick = tirx.Select if select else tirx.if_then_else
    xv, xc, n, r = (tirx.Var(name, F32) for name in ("fexp_x", "fexp_xc", "fexp_n", "fexp_r"))
    p = c(_EXP_P[0])
    for k in _EXP_P[1:]:
        p = p * r + c(k)
    two_n = tirx.reinterpret(F32, tirx.shift_left(tirx.Cast("int32", n) + 127, 23))
    y = pick(xv < c(_EXP_MIN), c(0.0), (p * r * r + r + c(1.0)) * two_n)
    return tirx.Let(xv, x, tirx.Let(xc, tirx.max(xv, c(_EXP_MIN)), tirx.Let(
        n, tirx.floor(xc * c(_LOG2E) + c(0.5)), tirx.Let(r, xc - n * c(_LN2_HI) - n * c(_LN2_LO), y))))


def exp_factor(m, mt, select: bool = False):
    """exp(m - mt), 0 when m is -inf (no cell yet: nothing to rescale). `select`: as a Select (both sides evaluated,
    the unused one may be NaN; same value), which TVM vectorizes as one masked blend, where the lazy if_then_else
    makes a loop of 16 lanes scalar code (measured faster for one vector of lanes, slower for 48: cpu_kernel)."""
    pick = tirx.Select if select else tirx.if_then_else
    return pick(m == tirx.const(NEG_INF, F32), tirx.const(0.0, F32), fexp(m - mt, select))


@dataclass(frozen=True)
class AttnShape:
    """Static shape of one attention op: q [T, H, Dk]; K cache [C, Hkv, Dk] of KV type k_type; V cache
    [C, Hkv, Dv] of v_type, or (`v_from_k`, MLA) the first Dv columns of K; `mask`: an additive [T, L] input."""
    H: int
    Hkv: int
    Dk: int
    Dv: int
    scale: float
    k_type: str = "f32"
    v_type: str = "f32"
    v_from_k: bool = False
    mask: bool = False

    @property
    def group(self) -> int:
        return self.H // self.Hkv

    @property
    def lanes(self) -> int:
        """Heads per task: the largest divisor of the GQA group that is <= MAX_LANES."""
        return max(d for d in range(1, min(self.group, MAX_LANES) + 1) if self.group % d == 0)

    def tag(self) -> str:
        return (f"h{self.H}_{self.Hkv}_d{self.Dk}_{self.Dv}_{self.k_type}_{'k' if self.v_from_k else self.v_type}"
                f"{'_mask' if self.mask else ''}")


def _stage_macro(kv_type: str, D: int):
    """T.macro: dst[j, 0:D] = float32 row (cell, kh) of a cache of `kv_type` (vectorized per 32-value block)."""
    if kv_type == "q8_0":
        @T.macro
        def stage(dst, j, buf, cell, kh):
            for b in range(D // 32):
                for e in T.vectorized(32):
                    dst[j, b * 32 + e] = kv_access.q8_0_quant(buf, cell, kh, b * 32 + e) * \
                        kv_access.q8_0_scale(buf, cell, kh, b)
        return stage

    @T.macro
    def stage(dst, j, buf, cell, kh):
        for d in T.vectorized(D):
            dst[j, d] = T.Cast(F32, buf[cell, kh, d])
    return stage


def _storage(a: AttnShape):
    """(K dtype, K width, V dtype, V width) of the cache buffers (MLA: the V argument is the K cache itself)."""
    kdt, vdt = kv_access.storage_dtype(a.k_type), kv_access.storage_dtype(a.v_type)
    kw, vw = kv_access.storage_width(a.k_type, a.Dk), kv_access.storage_width(a.v_type, a.Dv)
    return (kdt, kw, kdt, kw) if a.v_from_k else (kdt, kw, vdt, vw)


def _entry(a: AttnShape, split: bool, body):
    """The PrimFunc around kernel `body` (a T.macro): (q, k, v, pos, mask, L) -> out [T, H, Dv], or (split) the
    chunk partials (acc [T, H, NC, Dv], (m, l) [T, H, NC, 2]). Without a mask the mask argument is a [1, 1] dummy."""
    H, Hkv, Dk, Dv, CH = a.H, a.Hkv, a.Dk, a.Dv, CHUNK
    kdt, kw, vdt, vw = _storage(a)
    MW = (1, 1)
    has_mask = a.mask

    if split:
        @T.prim_func(private=True, s_tir=True)
        def flash_attn_partial(var_q: T.handle, var_k: T.handle, var_v: T.handle, var_pos: T.handle,
                               var_mask: T.handle, L: T.int64, var_o: T.handle, var_ml: T.handle):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            t, c = T.int64(), T.int64()
            q = T.match_buffer(var_q, (t, H, Dk), F32)
            k = T.match_buffer(var_k, (c, Hkv, kw), kdt)
            v = T.match_buffer(var_v, (c, Hkv, vw), vdt)
            pos = T.match_buffer(var_pos, (t,), "int32")
            mask = T.match_buffer(var_mask, (t, L) if has_mask else MW, F32)
            o = T.match_buffer(var_o, (t, H, (L + CH - 1) // CH, Dv), F32)
            ml = T.match_buffer(var_ml, (t, H, (L + CH - 1) // CH, 2), F32)
            body(q, k, v, pos, mask, o, ml, L, t, c)
        return flash_attn_partial

    @T.prim_func(private=True, s_tir=True)
    def flash_attn(var_q: T.handle, var_k: T.handle, var_v: T.handle, var_pos: T.handle, var_mask: T.handle,
                   L: T.int64, var_o: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        t, c = T.int64(), T.int64()
        q = T.match_buffer(var_q, (t, H, Dk), F32)
        k = T.match_buffer(var_k, (c, Hkv, kw), kdt)
        v = T.match_buffer(var_v, (c, Hkv, vw), vdt)
        pos = T.match_buffer(var_pos, (t,), "int32")
        mask = T.match_buffer(var_mask, (t, L) if has_mask else MW, F32)
        o = T.match_buffer(var_o, (t, H, Dv), F32)
        body(q, k, v, pos, mask, o, o, L, t, c)
    return flash_attn


def cpu_rows_per_task(a: AttnShape, split: bool, one_row: bool = False) -> int:
    """Rows per CPU task: (rows x heads) vector lanes filled up to a multiple of 16 and at least 32 (the heads of a
    GQA group share each staged K / V tile, so do the rows); 1 for the split form of a one-row entry (`one_row`:
    decode, draft). A split verify of several rows thus stages each chunk's K / V once for all its rows, not once
    per row (GLM-4.5-Air shape, f16, one thread, CPU time, loaded machine: L 8192, 2 / 3 / 4 rows 35 / 44 / 65 ->
    31 / 26 / 38 ms; L 32768, 161 / 213 / 239 -> 136 / 111 / 105 ms). A lane count that is not a multiple of 16
    (2 rows x 12 heads) ran 6x slower."""
    if split and one_row:
        return 1
    for rb in range(1, 17):
        if rb * a.lanes % VEC == 0 and rb * a.lanes >= 2 * VEC:
            return rb
    return max(1, 2 * VEC // a.lanes)


VEC = 16   # CPU vector lanes per chunk of the (row, head) lane axis: one accumulator register per tile cell


def padded_lanes(n: int) -> int:
    """Lanes the CPU kernel's softmax runs on for n (row, head) lanes: n itself where it fills whole vectors (a
    multiple of VEC, or 1, 2, 4, 8), else n rounded up to a multiple of VEC. A lane count such as 12 (one decode row
    of GLM-4.5-Air's 96 / 8 heads) is otherwise split by LLVM into scalar code (the exp polynomial per lane);
    padding lanes hold no cell, so they add exact zeros to nothing and change no real lane's bits."""
    return n if n % VEC == 0 or n in (1, 2, 4, 8) else -(-n // VEC) * VEC


def cpu_kernel(a: AttnShape, split: bool, rows_per_task: int | None = None):
    """CPU kernel. split=False (fused): out [T, H, Dv]; split=True (partial): pacc [T, H, NC, Dv] and
    pml [T, H, NC, 2] (m, l) of every chunk c < NC with c * CHUNK < the row's causal cell count.
    Tasks: (rows_per_task rows) x (KV head) x (group of `lanes` heads) [x chunk]. The task's (row, head) pairs
    are vector lanes (lane = row * lanes + head), processed VEC at a time over a tile staged (dequantized) once;
    every lane's arithmetic is the scalar recurrence of the module docstring, so grouping changes no bit."""
    H, Hkv, Dk, Dv, G = a.H, a.Hkv, a.Dk, a.Dv, a.lanes
    g, NG = a.group, a.group // a.lanes
    RB = rows_per_task or (1 if split else cpu_rows_per_task(a, split))
    NL = RB * G                                    # lanes per task
    NP = padded_lanes(NL)                          # ... padded to whole vectors: the lanes the softmax runs on
    VW = min(NP, VEC)                              # lanes per vector chunk
    # one vector of lanes (a decode row): Selects and an int32 cell bound make the softmax vector code (0.66-0.70x
    # the time at 8K / 32K, bench/attn_depth.py); with 48 lanes (prefill, verify) they ran 1.15x slower: kept lazy
    sel = NP <= VEC
    pick = T.Select if sel else T.if_then_else
    NLT = "int32" if sel else "int64"
    TL, CH = TILE, CHUNK
    _kdt, kw, _vdt, vw = _storage(a)
    stage_k = _stage_macro(a.k_type, Dk)
    stage_v = _stage_macro(a.v_type, Dv)
    scale, has_mask, v_from_k = float(a.scale), a.mask, a.v_from_k
    VT = Dk if v_from_k else Dv   # width of the staged V tile (MLA: V is the K tile)

    @T.macro
    def body(q, k, v, pos, mask, o, ml, L, t, c):
        NC = (L + CH - 1) // CH
        NT = (t + RB - 1) // RB * Hkv * NG * (NC if split else 1)
        for task in T.parallel(NT):
            with T.sblock("flash_attn"):
                vtask = T.axis.spatial(NT, task)
                if has_mask:
                    T.reads(q[0:t, 0:H, 0:Dk], k[0:c, 0:Hkv, 0:kw], v[0:c, 0:Hkv, 0:vw], pos[0:t], mask[0:t, 0:L])
                else:
                    T.reads(q[0:t, 0:H, 0:Dk], k[0:c, 0:Hkv, 0:kw], v[0:c, 0:Hkv, 0:vw], pos[0:t])
                if split:
                    T.writes(o[0:t, 0:H, 0:NC, 0:Dv], ml[0:t, 0:H, 0:NC, 0:2])
                else:
                    T.writes(o[0:t, 0:H, 0:Dv])
                qT = T.alloc_buffer((Dk, NP), F32, scope="local")
                kt = T.alloc_buffer((TL, Dk), F32, scope="local")
                vt = T.alloc_buffer((TL, VT), F32, scope="local")
                s = T.alloc_buffer((TL, NP), F32, scope="local")
                mk = T.alloc_buffer((TL, NP), F32, scope="local")        # the tile's mask per lane
                st = T.alloc_buffer((7, NP), F32, scope="local")         # m, l, mc, lc, mt, alpha, beta
                accc = T.alloc_buffer((NL, Dv), F32, scope="local")
                nl = T.alloc_buffer((NP,), NLT, scope="local")           # causal cells per lane (its row's)
                nr = T.alloc_buffer((RB + 1,), "int64", scope="local")   # causal cells per row; [RB] = max
                ch_lo = T.alloc_buffer((2,), "int64", scope="local")     # chunk range
                rest = vtask // NC if split else vtask
                t0 = rest // (Hkv * NG) * RB
                kh = rest // NG % Hkv
                h0 = kh * g + rest % NG * G
                nr[RB] = T.int64(0)
                for r in range(RB):
                    nr[r] = T.if_then_else(t0 + r < t, T.min(T.Cast("int64", pos[T.min(t0 + r, t - 1)]) + 1, L),
                                           T.int64(0))
                    nr[RB] = T.max(nr[RB], nr[r])
                for r, hg in T.grid(RB, G):
                    nl[r * G + hg] = T.Cast(NLT, nr[r])
                for r, d, hg in T.grid(RB, Dk, G):
                    qT[d, r * G + hg] = q[T.min(t0 + r, t - 1), h0 + hg, d]
                for ln in range(NL, NP):    # padding lanes: no cell (scores -inf, p 0), never written out
                    nl[ln] = T.Cast(NLT, 0)
                    for d in range(Dk):
                        qT[d, ln] = T.float32(0)
                    for j in range(TL):
                        mk[j, ln] = T.float32(0)
                if split:
                    ch_lo[0] = vtask % NC
                    ch_lo[1] = T.if_then_else(ch_lo[0] * CH < nr[RB], ch_lo[0] + 1, ch_lo[0])
                else:
                    ch_lo[0] = T.int64(0)
                    ch_lo[1] = (nr[RB] + CH - 1) // CH
                    for ln in T.vectorized(NP):
                        st[0, ln] = T.float32(NEG_INF)
                        st[1, ln] = T.float32(0)
                    for r in range(RB):
                        if t0 + r < t:
                            for hg in range(G):
                                for d in T.vectorized(Dv):
                                    o[t0 + r, h0 + hg, d] = T.float32(0)
                for ch in range(ch_lo[0], ch_lo[1]):
                    for ln in T.vectorized(NP):
                        st[2, ln] = T.float32(NEG_INF)
                        st[3, ln] = T.float32(0)
                    for ln in range(NL):
                        for d in T.vectorized(Dv):
                            accc[ln, d] = T.float32(0)
                    for tile in range((T.min(nr[RB] - ch * CH, T.int64(CH)) + TL - 1) // TL):
                        for j in range(TL):
                            stage_k(kt, j, k, T.min(ch * CH + tile * TL + j, nr[RB] - 1), kh)
                            if not v_from_k:
                                stage_v(vt, j, v, T.min(ch * CH + tile * TL + j, nr[RB] - 1), kh)
                        if has_mask:
                            for j, r, hg in T.grid(TL, RB, G):
                                mk[j, r * G + hg] = mask[T.min(t0 + r, t - 1), T.min(ch * CH + tile * TL + j, L - 1)]
                        for lc in range(NP // VW):
                            for j in T.unroll(TL):
                                for lv in T.vectorized(VW):
                                    s[j, lc * VW + lv] = T.float32(0)
                            for d in range(Dk):
                                for j in T.unroll(TL):
                                    for lv in T.vectorized(VW):
                                        s[j, lc * VW + lv] = s[j, lc * VW + lv] + qT[d, lc * VW + lv] * kt[j, d]
                        for j in T.unroll(TL):
                            for ln in T.vectorized(NP):
                                if has_mask:
                                    s[j, ln] = pick(T.Cast(NLT, ch * CH + tile * TL + j) < nl[ln],
                                                  s[j, ln] * T.float32(scale) + mk[j, ln], T.float32(NEG_INF))
                                else:
                                    s[j, ln] = pick(T.Cast(NLT, ch * CH + tile * TL + j) < nl[ln],
                                                  s[j, ln] * T.float32(scale), T.float32(NEG_INF))
                        for ln in T.vectorized(NP):
                            st[4, ln] = st[2, ln]
                        for j in T.unroll(TL):
                            for ln in T.vectorized(NP):
                                st[4, ln] = T.max(st[4, ln], s[j, ln])
                        for ln in T.vectorized(NP):
                            st[5, ln] = exp_factor(st[2, ln], st[4, ln], sel)
                            st[2, ln] = st[4, ln]
                        for j in T.unroll(TL):
                            for ln in T.vectorized(NP):
                                s[j, ln] = exp_factor(s[j, ln], st[4, ln], sel)
                        for ln in T.vectorized(NP):
                            st[3, ln] = st[3, ln] * st[5, ln]
                        for j in T.unroll(TL):
                            for ln in T.vectorized(NP):
                                st[3, ln] = st[3, ln] + s[j, ln]
                        for ln in range(NL):
                            for d in T.vectorized(Dv):
                                accc[ln, d] = accc[ln, d] * st[5, ln]
                            for j in T.unroll(TL):
                                for d in T.vectorized(Dv):
                                    if v_from_k:
                                        accc[ln, d] = accc[ln, d] + s[j, ln] * kt[j, d]
                                    else:
                                        accc[ln, d] = accc[ln, d] + s[j, ln] * vt[j, d]
                    if split:
                        for r in range(RB):
                            if t0 + r < t:
                                for hg in range(G):
                                    ml[t0 + r, h0 + hg, ch, 0] = st[2, r * G + hg]
                                    ml[t0 + r, h0 + hg, ch, 1] = st[3, r * G + hg]
                                    for d in T.vectorized(Dv):
                                        o[t0 + r, h0 + hg, ch, d] = accc[r * G + hg, d]
                    else:
                        for ln in T.vectorized(NP):
                            st[4, ln] = T.max(st[0, ln], st[2, ln])
                            st[5, ln] = exp_factor(st[0, ln], st[4, ln], sel)
                            st[6, ln] = exp_factor(st[2, ln], st[4, ln], sel)
                            st[0, ln] = st[4, ln]
                            st[1, ln] = st[1, ln] * st[5, ln] + st[3, ln] * st[6, ln]
                        for r in range(RB):
                            if t0 + r < t:
                                for hg in range(G):
                                    for d in T.vectorized(Dv):
                                        o[t0 + r, h0 + hg, d] = o[t0 + r, h0 + hg, d] * st[5, r * G + hg] + \
                                            accc[r * G + hg, d] * st[6, r * G + hg]
                if not split:
                    for r in range(RB):
                        if t0 + r < t:
                            for hg in range(G):
                                for d in T.vectorized(Dv):
                                    o[t0 + r, h0 + hg, d] = pick(
                                        st[1, r * G + hg] == T.float32(0), T.float32(0),
                                        o[t0 + r, h0 + hg, d] / st[1, r * G + hg])

    return _entry(a, split, body)


def _merge_entry(a: AttnShape, outer, task_body):
    """The merge PrimFunc: (pacc [T, H, NC, Dv], pml [T, H, NC, 2], pos, L) -> out [T, H, Dv], one task per
    (row, head) over `outer` (a loop kind), its body the T.macro `task_body(pacc, pml, pos, o, L, vt)`."""
    H, Dv, CH = a.H, a.Dv, CHUNK

    @T.prim_func(private=True, s_tir=True)
    def flash_merge(var_pacc: T.handle, var_pml: T.handle, var_pos: T.handle, L: T.int64, var_o: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        t = T.int64()
        pacc = T.match_buffer(var_pacc, (t, H, (L + CH - 1) // CH, Dv), F32)
        pml = T.match_buffer(var_pml, (t, H, (L + CH - 1) // CH, 2), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        o = T.match_buffer(var_o, (t, H, Dv), F32)
        for task in outer(t * H):
            with T.sblock("flash_merge"):
                vt = T.axis.spatial(t * H, task)
                T.reads(pacc[vt // H, vt % H, 0:(L + CH - 1) // CH, 0:Dv], pml[vt // H, vt % H, 0:(L + CH - 1) // CH, 0:2],
                        pos[vt // H])
                T.writes(o[vt // H, vt % H, 0:Dv])
                task_body(pacc, pml, pos, o, L, vt)

    return flash_merge


def cpu_merge_kernel(a: AttnShape):
    """out[t, h] from the split partials: merge the chunks c < ceil(n_t / CHUNK) in order, then acc / l."""
    H, Dv, CH = a.H, a.Dv, CHUNK

    @T.macro
    def task(pacc, pml, pos, o, L, vt):
        st = T.alloc_buffer((5,), F32, scope="local")   # m, l, M, alpha, beta
        ti = vt // H
        hi = vt % H
        st[0] = T.float32(NEG_INF)
        st[1] = T.float32(0)
        for d in T.vectorized(Dv):
            o[ti, hi, d] = T.float32(0)
        for ch in range((T.min(T.Cast("int64", pos[ti]) + 1, L) + CH - 1) // CH):
            st[2] = T.max(st[0], pml[ti, hi, ch, 0])
            st[3] = exp_factor(st[0], st[2], True)
            st[4] = exp_factor(pml[ti, hi, ch, 0], st[2], True)
            st[0] = st[2]
            st[1] = st[1] * st[3] + pml[ti, hi, ch, 1] * st[4]
            for d in T.vectorized(Dv):
                o[ti, hi, d] = o[ti, hi, d] * st[3] + pacc[ti, hi, ch, d] * st[4]
        for d in T.vectorized(Dv):
            o[ti, hi, d] = T.Select(st[1] == T.float32(0), T.float32(0), o[ti, hi, d] / st[1])

    return _merge_entry(a, lambda n: T.parallel(n), task)


# -- GPU kernels -------------------------------------------------------------------------------------------------
GPU_THREADS = 128
# Cells per tile (shared-memory K / V tiles of TILE x D float32): a task walks its cells tile after tile, each a few
# barrier-separated phases whose latency, not bandwidth, bounds a decode step (the first H200 run: 28 µs per layer at
# a 64-token context with tiles of 8, docs/gpu.md), so the largest of GPU_TILES whose K and V tiles fit
# GPU_TILE_BYTES: 32 cells at D = 128, 16 for MLA's 576-column latent rows (V is their first columns: no V tile).
GPU_TILES = (32, 16, 8)
GPU_TILE_BYTES = 40 << 10   # of the 48 KB of shared memory a block may declare statically
GPU_MAX_LANES = 8


def gpu_tile(a: "AttnShape") -> int:
    """Cells per tile of `a`'s GPU kernels (every form of a shape the same: decode, verify and prefill rows agree)."""
    row_bytes = 4 * (a.Dk + (0 if a.v_from_k else a.Dv))
    return next((t for t in GPU_TILES if t * row_bytes <= GPU_TILE_BYTES), GPU_TILES[-1])


def _binders(emulate: bool):
    """(block loop, thread loop, shared scope): GPU bindings, or (emulate) the same kernel with a parallel block
    loop and serial threads for the CPU. The kernels keep every per-thread value inside one thread-loop body and
    pass values between phases through shared buffers only, so serial threads compute exactly what GPU threads do."""
    if emulate:
        return (lambda n: T.parallel(n)), (lambda n: T.serial(n)), "global"
    return (lambda n: T.thread_binding(n, thread="blockIdx.x")), \
        (lambda n: T.thread_binding(n, thread="threadIdx.x")), "shared"


def gpu_lanes(a: AttnShape) -> int:
    return max(d for d in range(1, min(a.group, GPU_MAX_LANES) + 1) if a.group % d == 0)


def gpu_kernel(a: AttnShape, split: bool, emulate: bool = False):
    """GPU form of `cpu_kernel` (same signature and arithmetic per (row, head)): one thread block per task
    (row, KV head, group of `gpu_lanes` heads [, chunk]); per tile the block stages K (and V) in shared memory,
    then threads compute one score each (sequential over d), one thread per head updates the softmax state,
    and threads over (head, value column) accumulate P·V (sequential over the tile's cells)."""
    H, Hkv, Dk, Dv = a.H, a.Hkv, a.Dk, a.Dv
    G = gpu_lanes(a)
    g, NG = a.group, a.group // G
    TL, CH, NTH = gpu_tile(a), CHUNK, GPU_THREADS
    _kdt, kw, _vdt, vw = _storage(a)
    scale, has_mask, v_from_k = float(a.scale), a.mask, a.v_from_k
    k_type, v_type = a.k_type, a.v_type
    VW = Dk if v_from_k else Dv
    blk, thr, shared = _binders(emulate)
    NS = TL * G            # scores per tile
    NKS, NVS = TL * Dk, TL * VW
    NPV = G * Dv
    EPT = (NPV + NTH - 1) // NTH   # P·V outputs per thread
    AR = NTH if emulate else 1     # rows of the accumulator buffer (see `accr`)

    @T.macro
    def body(q, k, v, pos, mask, o, ml, L, t, c):
        for task in blk(t * Hkv * NG * (((L + CH - 1) // CH) if split else 1)):
            with T.sblock("flash_attn"):
                vtask = T.axis.spatial(t * Hkv * NG * (((L + CH - 1) // CH) if split else 1), task)
                if has_mask:
                    T.reads(q[0:t, 0:H, 0:Dk], k[0:c, 0:Hkv, 0:kw], v[0:c, 0:Hkv, 0:vw], pos[0:t], mask[0:t, 0:L])
                else:
                    T.reads(q[0:t, 0:H, 0:Dk], k[0:c, 0:Hkv, 0:kw], v[0:c, 0:Hkv, 0:vw], pos[0:t])
                if split:
                    T.writes(o[0:t, 0:H, 0:(L + CH - 1) // CH, 0:Dv], ml[0:t, 0:H, 0:(L + CH - 1) // CH, 0:2])
                else:
                    T.writes(o[0:t, 0:H, 0:Dv])
                kt = T.alloc_buffer((TL, Dk), F32, scope=shared)
                vt = T.alloc_buffer((TL, VW), F32, scope=shared)
                s = T.alloc_buffer((TL, G), F32, scope=shared)         # scores
                pr = T.alloc_buffer((TL, G), F32, scope=shared)        # probabilities
                # per-head softmax state, one buffer per quantity (the barrier planner reasons per buffer and index)
                gm = T.alloc_buffer((G,), F32, scope=shared)     # running max (fused) ...
                gl = T.alloc_buffer((G,), F32, scope=shared)     # ... and sum
                gmc = T.alloc_buffer((G,), F32, scope=shared)    # this chunk's max and sum
                glc = T.alloc_buffer((G,), F32, scope=shared)
                gal = T.alloc_buffer((G,), F32, scope=shared)    # rescale factors of the last step
                gbe = T.alloc_buffer((G,), F32, scope=shared)
                sl = T.alloc_buffer((4,), F32, scope="local")
                # thread tx's P·V accumulators: its own registers on a GPU (row 0), a row per thread when the threads
                # run one after another (emulate): a [NTH, EPT] local buffer indexed by threadIdx was a per-thread
                # array of NTH x EPT floats in local memory
                accr = T.alloc_buffer((AR, EPT), F32, scope="local")
                tmp = T.alloc_buffer((1,), F32, scope="local")
                rest = vtask // ((L + CH - 1) // CH) if split else vtask
                row = rest // (Hkv * NG)
                kh = rest // NG % Hkv
                h0 = kh * g + rest % NG * G
                n = T.min(T.Cast("int64", pos[row]) + 1, L)
                if not split:
                    for tx in thr(NTH):
                        for e in range((NPV + NTH - 1) // NTH):
                            if e * NTH + tx < NPV:
                                o[row, h0 + (e * NTH + tx) // Dv, (e * NTH + tx) % Dv] = T.float32(0)
                        if tx < G:
                            gm[tx] = T.float32(NEG_INF)
                            gl[tx] = T.float32(0)
                for ch in range(vtask % ((L + CH - 1) // CH) if split else 0,
                                T.min(vtask % ((L + CH - 1) // CH) + 1, (n + CH - 1) // CH) if split else (n + CH - 1) // CH):
                    for tx in thr(NTH):
                        for e in range((NPV + NTH - 1) // NTH):
                            accr[tx % AR, e] = T.float32(0)
                        if tx < G:
                            gmc[tx] = T.float32(NEG_INF)
                            glc[tx] = T.float32(0)
                    for tile in range((T.min(n - ch * CH, T.int64(CH)) + TL - 1) // TL):
                        for tx in thr(NTH):
                            for e in range((NKS + NTH - 1) // NTH):
                                if e * NTH + tx < NKS:
                                    kt[(e * NTH + tx) // Dk, (e * NTH + tx) % Dk] = kv_access.element(
                                        k, k_type, T.min(ch * CH + tile * TL + (e * NTH + tx) // Dk, n - 1), kh,
                                        (e * NTH + tx) % Dk)
                            if not v_from_k:
                                for e in range((NVS + NTH - 1) // NTH):
                                    if e * NTH + tx < NVS:
                                        vt[(e * NTH + tx) // Dv, (e * NTH + tx) % Dv] = kv_access.element(
                                            v, v_type, T.min(ch * CH + tile * TL + (e * NTH + tx) // Dv, n - 1), kh,
                                            (e * NTH + tx) % Dv)
                        for tx in thr(NTH):
                            for e in range((NS + NTH - 1) // NTH):
                                if e * NTH + tx < NS:
                                    tmp[0] = T.float32(0)
                                    for d in range(Dk):
                                        tmp[0] = tmp[0] + q[row, h0 + (e * NTH + tx) % G, d] * kt[(e * NTH + tx) // G, d]
                                    if has_mask:
                                        s[(e * NTH + tx) // G, (e * NTH + tx) % G] = T.if_then_else(
                                            ch * CH + tile * TL + (e * NTH + tx) // G < n,
                                            tmp[0] * T.float32(scale) + mask[row, T.min(ch * CH + tile * TL + (e * NTH + tx) // G, L - 1)],
                                            T.float32(NEG_INF))
                                    else:
                                        s[(e * NTH + tx) // G, (e * NTH + tx) % G] = T.if_then_else(
                                            ch * CH + tile * TL + (e * NTH + tx) // G < n, tmp[0] * T.float32(scale),
                                            T.float32(NEG_INF))
                        for tx in thr(NTH):
                            if tx < G:   # one thread per head: its softmax state, in registers within the phase
                                sl[0] = gmc[tx]
                                for j in range(TL):
                                    sl[0] = T.max(sl[0], s[j, tx])
                                sl[1] = exp_factor(gmc[tx], sl[0])
                                sl[2] = glc[tx] * sl[1]
                                for j in range(TL):
                                    sl[3] = exp_factor(s[j, tx], sl[0])
                                    pr[j, tx] = sl[3]
                                    sl[2] = sl[2] + sl[3]
                                gmc[tx] = sl[0]
                                glc[tx] = sl[2]
                                gal[tx] = sl[1]
                        for tx in thr(NTH):
                            for e in range((NPV + NTH - 1) // NTH):
                                if e * NTH + tx < NPV:
                                    tmp[0] = accr[tx % AR, e] * gal[(e * NTH + tx) // Dv]
                                    for j in range(TL):
                                        if v_from_k:
                                            tmp[0] = tmp[0] + pr[j, (e * NTH + tx) // Dv] * kt[j, (e * NTH + tx) % Dv]
                                        else:
                                            tmp[0] = tmp[0] + pr[j, (e * NTH + tx) // Dv] * vt[j, (e * NTH + tx) % Dv]
                                    accr[tx % AR, e] = tmp[0]
                    if split:
                        for tx in thr(NTH):
                            for e in range((NPV + NTH - 1) // NTH):
                                if e * NTH + tx < NPV:
                                    o[row, h0 + (e * NTH + tx) // Dv, ch, (e * NTH + tx) % Dv] = accr[tx % AR, e]
                            if tx < G:
                                ml[row, h0 + tx, ch, 0] = gmc[tx]
                                ml[row, h0 + tx, ch, 1] = glc[tx]
                    else:
                        for tx in thr(NTH):
                            if tx < G:
                                sl[0] = T.max(gm[tx], gmc[tx])
                                sl[1] = exp_factor(gm[tx], sl[0])
                                sl[2] = exp_factor(gmc[tx], sl[0])
                                gl[tx] = gl[tx] * sl[1] + glc[tx] * sl[2]
                                gm[tx] = sl[0]
                                gal[tx] = sl[1]
                                gbe[tx] = sl[2]
                        for tx in thr(NTH):
                            for e in range((NPV + NTH - 1) // NTH):
                                if e * NTH + tx < NPV:
                                    o[row, h0 + (e * NTH + tx) // Dv, (e * NTH + tx) % Dv] = \
                                        o[row, h0 + (e * NTH + tx) // Dv, (e * NTH + tx) % Dv] * gal[(e * NTH + tx) // Dv] + \
                                        accr[tx % AR, e] * gbe[(e * NTH + tx) // Dv]
                if not split:
                    for tx in thr(NTH):
                        for e in range((NPV + NTH - 1) // NTH):
                            if e * NTH + tx < NPV:
                                o[row, h0 + (e * NTH + tx) // Dv, (e * NTH + tx) % Dv] = T.if_then_else(
                                    gl[(e * NTH + tx) // Dv] == T.float32(0), T.float32(0),
                                    o[row, h0 + (e * NTH + tx) // Dv, (e * NTH + tx) % Dv] / gl[(e * NTH + tx) // Dv])

    return _entry(a, split, body)


def gpu_merge_kernel(a: AttnShape, emulate: bool = False):
    """GPU form of `cpu_merge_kernel`: a block per (row, head), a thread per value column; every thread repeats
    the (m, l) recurrence (same arithmetic) so no value crosses threads."""
    H, Dv, CH, NTH = a.H, a.Dv, CHUNK, GPU_THREADS
    blk, thr, _shared = _binders(emulate)

    @T.macro
    def task(pacc, pml, pos, o, L, vt):
        st = T.alloc_buffer((6,), F32, scope="local")   # m, l, M, alpha, beta, acc
        for tx in thr(NTH):
            for e in range((Dv + NTH - 1) // NTH):
                if e * NTH + tx < Dv:
                    st[0] = T.float32(NEG_INF)
                    st[1] = T.float32(0)
                    st[5] = T.float32(0)
                    for ch in range((T.min(T.Cast("int64", pos[vt // H]) + 1, L) + CH - 1) // CH):
                        st[2] = T.max(st[0], pml[vt // H, vt % H, ch, 0])
                        st[3] = exp_factor(st[0], st[2])
                        st[4] = exp_factor(pml[vt // H, vt % H, ch, 0], st[2])
                        st[0] = st[2]
                        st[1] = st[1] * st[3] + pml[vt // H, vt % H, ch, 1] * st[4]
                        st[5] = st[5] * st[3] + pacc[vt // H, vt % H, ch, e * NTH + tx] * st[4]
                    o[vt // H, vt % H, e * NTH + tx] = T.if_then_else(st[1] == T.float32(0), T.float32(0),
                                                                      st[5] / st[1])

    return _merge_entry(a, blk, task)
