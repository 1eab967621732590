"""Prefill's GGUF matmuls on tensor cores: the integer route's products (int8.py) as int8 `mma.sync` tiles.

A prompt's rows multiply every weight once per row; the decode / verify GEMV (gemv.py) reads a weight once per 4 rows
and does the products with dp4a on the CUDA cores. Here a thread block computes a tile of BM rows x BN weight rows
with warp-level int8 MMA (PTX `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`, sm_80+; m16n8k16 for groups of 16
quants), as llama.cpp's ggml-cuda mmq.cuh does for quantized batches:

    per stage of KT quants (KW = KT / 4 words):                       (all BM x BN outputs, 4 warps of 32 x 32)
      shared   xq words [BM, KW], the weight's words [BN, KW] (the format's `Fmt.word`: 4 signed quants each,
               decoded once per tile; the codebook formats' from their grid and sign tables), its factors s, m per
               sub-block, the rows' block scales xd and quant sums
      per word group g (int8.group_words G words: one mma k of 4G quants)
        a warp's C[32, 32] int32 = mma(xq[rows, g], w[cols, g])          (2 x 4 tiles of m16n8, int32: exact)
        acc[r, n] += xd[r, blk(g)] · (s[n, sub(g)] · f32(C[r, n]) - m[n, sub(g)] · f32(sum of xq[r, g]))
    y[r, n] = acc[r, n]   (rows < T and n < N stored; padded rows read row T - 1, padded n row N - 1)

The routed experts (`mul_mat_id_kernel`) take the same tiles over one expert's (row, slot) pairs each, the pairs
sorted by expert once per ids tensor (`expert_tiles_kernel`), so an expert is read once per BM of its pairs.

Each group's float term is the integer definition's (`int8._group_term`: the same int32 sums, the same factors, the
same two products), so a tile computes what `int8.mul_mat` defines, up to the float32 order of the group terms
(here k order per output; the GEMV's lanes sum strided groups, then a warp shuffle): prefill rows differ from decode
rows by float32 rounding only, as they do on the CPU between its batched and one-row kernels.

Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32" / "mma.m16n8k16" with integer type; TVM's
s_tir/tensor_intrin/cuda.py `shared_16x32_to_ldmatrix_32x16_layout` encodes the same): lane = 4 · gid + tig,
    A (16 x 4G row-major, int8): register r holds row gid + 8 · (r % 2), quants 4 · tig .. + 3 of k-half r // 2
    B (4G x 8 "col", i.e. the weight row n = gid): register r holds quants 16 · r + 4 · tig .. + 3
    C (16 x 8 int32): c_i at row gid + 8 · (i // 2), column 2 · tig + i % 2.
The "gpu-emulated" form runs the same loops with serial threads and an `mma` computed from those layouts (each C
element from the A and B registers of the warp's lanes that hold its operands), so the arithmetic and the
fragment indexing are tested on llvm (tests/test_cuda_mma.py); only the instruction itself needs a GPU.
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from nextn.compiler.quant.te import Block

from ..attention.flash_attn import _binders
from .int8 import FORMATS, group_words, sbyte, sm_number

F32, I32 = "float32", "int32"
BM, BN = 64, 64          # rows x weight rows per thread block
WARPS_M, WARPS_N = 2, 2  # 4 warps, each a 32 x 32 tile
MT, NT = 2, 4            # m16 and n8 tiles per warp
NTH = 32 * WARPS_M * WARPS_N
STAGES = (128, 64, 32)   # quants per shared-memory stage: the largest that divides K
PAD = 4                  # words of padding per shared row: a fragment load's 32 lanes hit 32 banks
MIN_ARCH = 80            # mma.sync m16n8k32 / m16n8k16 with s8 operands: sm_80+
# Rows from which a call takes the tiles (fewer: the GEMV copy of its entry, graphs.FEW_SUFFIX). An estimate from
# sm_90 PTX, not a measurement: a Q4_K tile issues ~40 instructions per weight byte whatever its rows (64 padded),
# the GEMV ~6.7 per 4-row tile (docs/gpu.md "Prefill on tensor cores"): even near 24 rows, 32 with a margin.
MIN_ROWS = 32
ATTRS = {"tirx.noalias": True, "tirx.is_scheduled": True}   # hand-written: no schedule rule takes them


def has_mma(arches) -> bool:
    """Whether every CUDA arch of `arches` ("sm_80", "sm_90a" ...) has the int8 mma.sync shapes used here."""
    return bool(arches) and all((sm_number(a) or 0) >= MIN_ARCH for a in arches)


def _stage(kind: str, K: int) -> int | None:
    G = group_words(kind, K)
    return next((kt for kt in STAGES if K % kt == 0 and kt % (4 * G) == 0), None)


def fits(kind: str, K: int) -> bool:
    """Whether a `kind` weight of rows of K quants takes this kernel on the integer route: groups of 8 or 4 words
    (one k32 / k16 mma; not IQ1_M, whose delta is per 8 quants), K whole stages."""
    return kind in FORMATS and group_words(kind, K) in (4, 8) and _stage(kind, K) is not None


class _Raw:
    """A buffer read as Block reads a TE tensor: raw(*index), behind a fixed leading index (an expert) if given."""

    def __init__(self, buf, *lead):
        self.buf, self.lead = buf, lead

    def __call__(self, *idx):
        return self.buf[(*self.lead, *idx)]


def _tiles_kernel(kind: str, N: int, K: int, B: int, cuda: bool, gpu: bool, X: int | None, div: int):
    """The dense (X None) or routed-expert PrimFunc of `mul_mat_kernel` / `mul_mat_id_kernel`."""
    from nextn.common.quant import FORMATS as LAYOUTS

    assert fits(kind, K), (kind, K)
    f, layout = FORMATS[kind], LAYOUTS[kind]
    G = group_words(kind, K)
    KT = _stage(kind, K)
    KW, S = KT // 4, K // KT
    NG = KW // G                     # word groups per stage
    RA, RB = G // 2, G // 4          # A and B registers per m16 / n8 tile (k32: 4, 2; k16: 2, 1)
    SUBS = KT // f.sub               # sub-blocks (factor pairs) per stage
    NXD = max(1, KT // B)            # activation blocks per stage
    per_block = layout.block // f.sub
    has_min = f.low is not None
    shape = "m16n8k32" if G == 8 else "m16n8k16"
    CT = MT * NT * 4                 # C registers (and accumulators) per lane
    AR = 1 if gpu else NTH           # rows of the per-thread buffers that live across thread loops (see flash_attn)
    EW, EF, EX = -(-BM * KW // NTH), -(-BN * SUBS // NTH), -(-BM * max(NXD, NG) // NTH)
    # the codebook formats' tables (`.grid`, `.signs`: parameters after the weight, as the GEMV takes them); two
    # placeholders (1 byte) where a format has fewer, dropped from the signature below
    tabs = [(shape[0], dtype) for _sfx, dtype, shape in layout.buffers((N, K))[1:]]
    TG, TS = (tabs + [(1, "uint8")] * 2)[:2]
    WB = K // layout.block * layout.type_size
    ZERO = tirx.const(0.0, F32)
    blocks, threads, shared = _binders(not gpu)

    def rows(n):   # the grid's y: row tiles (expert tiles)
        return T.thread_binding(n, thread="blockIdx.y") if gpu else T.serial(n)

    def raw(w, e):   # the weight's bytes (of expert e)
        return _Raw(w) if e is None else _Raw(w, e)

    def w_word(w, t, e, n, k):   # the int32 word of 4 quants at element k of weight row n (t: the tables)
        return f.word_of(Block(raw(w, e), (n, k), layout.block, layout.type_size),
                         (None, *(_Raw(v) for v in t[:len(tabs)])), cuda)

    def factor(fn, w, e, n, s):   # the float factor of sub-block s of weight row n
        return fn(Block(raw(w, e), (n, s * f.sub), layout.block, layout.type_size), s % per_block)

    def src(order, base, count, r):   # the activation row of tile row r (padded rows: the last one)
        if order is None:
            return T.min(base + r, count - 1)
        return order[base + T.min(r, count - 1)] // div

    def dst(order, base, r):   # the output row of tile row r
        return base + r if order is None else order[base + r]

    def valid(order, base, count, r):
        return base + r < count if order is None else r < count

    def group_sum(xs, row, k):   # the sum of the 4G quants of row `row` from element k: its sums of 16
        v = xs[row, k // 16]
        for h in range(1, G // 4):
            v = v + xs[row, k // 16 + h]
        return v

    def xd_of(g):   # group g's activation block in the stage's scales
        return g * G * 4 // B if B < KT else 0

    @T.macro
    def emulated_mma(af, bf, cf, tx, mt, nt):
        # C[i] of lane tx: sum over k < 4G of A[row, k] B[k, col], each operand byte from the lane and register
        # that the fragment layout gives it
        for i in range(4):
            cf[0, (mt * NT + nt) * 4 + i] = 0
            for kq in range(4 * G):
                cf[0, (mt * NT + nt) * 4 + i] = cf[0, (mt * NT + nt) * 4 + i] + sbyte(
                    af[tx // 32 * 32 + (tx % 32 // 4 + i // 2 * 8) % 8 * 4 + kq % 16 // 4,
                       mt * RA + i // 2 + 2 * (kq // 16)], kq % 4) * sbyte(
                    bf[tx // 32 * 32 + (tx % 4 * 2 + i % 2) * 4 + kq % 16 // 4, nt * RB + kq // 16], kq % 4)

    @T.macro
    def tile(w, t, xq, xd, xs, y, order, vx, e, base, count, stages):
        # one BM x BN output tile: rows base + r (order None, count = T) or order[base + r], r < count (a tile of
        # an expert's (row, slot) pairs), weight rows vx * BN + c (of expert e); `stages`: S, or 0 for a tile slot
        # no expert filled (a loop bound, not a branch: TVM inserts no barrier inside a condition)
        # the rows' and the weight's quant words, rows of KW + PAD words (flat: TVM compacts a 2-D buffer to the
        # columns read, which would drop the padding)
        sa = T.alloc_buffer((BM * (KW + PAD),), I32, scope=shared)
        sb = T.alloc_buffer((BN * (KW + PAD),), I32, scope=shared)
        ss = T.alloc_buffer((BN, SUBS), F32, scope=shared)         # the weight's factors per sub-block
        sm = T.alloc_buffer((BN, SUBS), F32, scope=shared)
        sd = T.alloc_buffer((BM, NXD), F32, scope=shared)          # the rows' block scales
        sx = T.alloc_buffer((BM, NG), I32, scope=shared)           # ... and quant sums per group
        af = T.alloc_buffer((AR, MT * RA), I32, scope="local")
        bf = T.alloc_buffer((AR, NT * RB), I32, scope="local")
        cf = T.alloc_buffer((1, CT), I32, scope="local")
        acc = T.alloc_buffer((AR, CT), F32, scope="local")
        fr = T.alloc_buffer((1, 2 * NT * 2 + 2 * MT * 2), F32, scope="local")   # a group's factors
        for tx in threads(NTH):
            for i in T.unroll(CT):
                acc[tx % AR, i] = ZERO
        for st in range(stages):
            for tx in threads(NTH):
                for q in T.unroll(EW):
                    if q * NTH + tx < BM * KW:
                        sa[(q * NTH + tx) // KW * (KW + PAD) + (q * NTH + tx) % KW] = xq[
                            src(order, base, count, (q * NTH + tx) // KW), st * KW + (q * NTH + tx) % KW]
                        sb[(q * NTH + tx) // KW * (KW + PAD) + (q * NTH + tx) % KW] = w_word(
                            w, t, e, T.min(vx * BN + (q * NTH + tx) // KW, N - 1), (st * KW + (q * NTH + tx) % KW) * 4)
                for q in T.unroll(EF):
                    if q * NTH + tx < BN * SUBS:
                        ss[(q * NTH + tx) // SUBS, (q * NTH + tx) % SUBS] = factor(
                            f.scale, w, e, T.min(vx * BN + (q * NTH + tx) // SUBS, N - 1),
                            st * SUBS + (q * NTH + tx) % SUBS)
                        if has_min:
                            sm[(q * NTH + tx) // SUBS, (q * NTH + tx) % SUBS] = factor(
                                f.low, w, e, T.min(vx * BN + (q * NTH + tx) // SUBS, N - 1),
                                st * SUBS + (q * NTH + tx) % SUBS)
                for q in T.unroll(EX):
                    if q * NTH + tx < BM * NXD:
                        sd[(q * NTH + tx) // NXD, (q * NTH + tx) % NXD] = xd[
                            src(order, base, count, (q * NTH + tx) // NXD), st * KT // B + (q * NTH + tx) % NXD]
                    if has_min and q * NTH + tx < BM * NG:
                        sx[(q * NTH + tx) // NG, (q * NTH + tx) % NG] = group_sum(
                            xs, src(order, base, count, (q * NTH + tx) // NG), st * KT + (q * NTH + tx) % NG * 4 * G)
            for g in range(NG):
                for tx in threads(NTH):   # the warp's A and B registers of group g
                    for mt in T.unroll(MT):
                        for r in T.unroll(RA):
                            af[tx % AR, mt * RA + r] = sa[
                                (tx // 32 // WARPS_N * 32 + mt * 16 + tx % 32 // 4 + r % 2 * 8) * (KW + PAD)
                                + g * G + r // 2 * 4 + tx % 4]
                    for nt in T.unroll(NT):
                        for r in T.unroll(RB):
                            bf[tx % AR, nt * RB + r] = sb[
                                (tx // 32 % WARPS_N * 32 + nt * 8 + tx % 32 // 4) * (KW + PAD) + g * G + r * 4 + tx % 4]
                for tx in threads(NTH):   # the int32 products, then the group's float terms
                    for mt in T.unroll(MT):
                        for nt in T.unroll(NT):
                            if gpu:
                                T.evaluate(T.ptx_legacy.mma(
                                    shape, "row", "col", "int8", "int8", "int32", af.data, mt * RA,
                                    bf.data, nt * RB, cf.data, (mt * NT + nt) * 4, False, dtype=I32))
                            else:
                                emulated_mma(af, bf, cf, tx, mt, nt)
                    # the lane's 8 columns' factors and 4 rows' scales and sums
                    for nt in T.unroll(NT):
                        for c in T.unroll(2):
                            fr[0, nt * 2 + c] = ss[tx // 32 % WARPS_N * 32 + nt * 8 + tx % 4 * 2 + c,
                                                   g * G * 4 // f.sub]
                            if has_min:
                                fr[0, NT * 2 + nt * 2 + c] = sm[
                                    tx // 32 % WARPS_N * 32 + nt * 8 + tx % 4 * 2 + c, g * G * 4 // f.sub]
                    for mt in T.unroll(MT):
                        for h in T.unroll(2):
                            fr[0, 4 * NT + mt * 2 + h] = sd[
                                tx // 32 // WARPS_N * 32 + mt * 16 + tx % 32 // 4 + h * 8, xd_of(g)]
                            if has_min:
                                fr[0, 4 * NT + 2 * MT + mt * 2 + h] = T.Cast(F32, sx[
                                    tx // 32 // WARPS_N * 32 + mt * 16 + tx % 32 // 4 + h * 8, g])
                    for mt in T.unroll(MT):
                        for nt in T.unroll(NT):
                            for i in T.unroll(4):
                                if has_min:
                                    acc[tx % AR, (mt * NT + nt) * 4 + i] = \
                                        acc[tx % AR, (mt * NT + nt) * 4 + i] + \
                                        fr[0, 4 * NT + mt * 2 + i // 2] * (
                                            fr[0, nt * 2 + i % 2] * T.Cast(F32, cf[0, (mt * NT + nt) * 4 + i]) -
                                            fr[0, NT * 2 + nt * 2 + i % 2] * fr[0, 4 * NT + 2 * MT + mt * 2 + i // 2])
                                else:
                                    acc[tx % AR, (mt * NT + nt) * 4 + i] = \
                                        acc[tx % AR, (mt * NT + nt) * 4 + i] + \
                                        fr[0, 4 * NT + mt * 2 + i // 2] * (
                                            fr[0, nt * 2 + i % 2] * T.Cast(F32, cf[0, (mt * NT + nt) * 4 + i]))
        for tx in threads(NTH):
            for mt in T.unroll(MT):
                for nt in T.unroll(NT):
                    for i in T.unroll(4):
                        if valid(order, base, count, tx // 32 // WARPS_N * 32 + mt * 16 + tx % 32 // 4 + i // 2 * 8) \
                                and vx * BN + tx // 32 % WARPS_N * 32 + nt * 8 + tx % 4 * 2 + i % 2 < N:
                            y[dst(order, base, tx // 32 // WARPS_N * 32 + mt * 16 + tx % 32 // 4 + i // 2 * 8),
                              vx * BN + tx // 32 % WARPS_N * 32 + nt * 8 + tx % 4 * 2 + i % 2] = \
                                acc[tx % AR, (mt * NT + nt) * 4 + i]

    if X is None:
        @T.prim_func(private=True, s_tir=True)
        def mul_mat_mma(var_w: T.handle, var_g: T.handle, var_z: T.handle, var_q: T.handle, var_d: T.handle,
                        var_s: T.handle, var_y: T.handle):
            T.func_attr(ATTRS)
            t = T.int64()
            w = T.match_buffer(var_w, (N, WB), "uint8")
            grid = T.match_buffer(var_g, (TG[0],), TG[1])
            signs = T.match_buffer(var_z, (TS[0],), TS[1])
            xq = T.match_buffer(var_q, (t, K // 4), I32)
            xd = T.match_buffer(var_d, (t, K // B), F32)
            xs = T.match_buffer(var_s, (t, K // 16), I32)
            y = T.match_buffer(var_y, (t, N), F32)
            for bx in blocks((N + BN - 1) // BN):
                for by in rows((t + BM - 1) // BM):
                    with T.sblock("mul_mat_mma"):
                        vx, vy = T.axis.remap("SS", [bx, by])
                        T.reads(w[0:N, 0:WB], xq[0:t, 0:K // 4], xd[0:t, 0:K // B], xs[0:t, 0:K // 16])
                        T.writes(y[0:t, 0:N])
                        tile(w, (grid, signs), xq, xd, xs, y, None, vx, None, vy * BM, t, S)
        return _word_loads(_tables_only(mul_mat_mma, len(tabs)))

    @T.prim_func(private=True, s_tir=True)
    def mul_mat_id_mma(var_w: T.handle, var_g: T.handle, var_z: T.handle, var_q: T.handle, var_d: T.handle,
                       var_s: T.handle, var_o: T.handle, var_t: T.handle, var_y: T.handle):
        T.func_attr(ATTRS)
        r, p, nt = T.int64(), T.int64(), T.int64()
        w = T.match_buffer(var_w, (X, N, WB), "uint8")
        grid = T.match_buffer(var_g, (TG[0],), TG[1])
        signs = T.match_buffer(var_z, (TS[0],), TS[1])
        xq = T.match_buffer(var_q, (r, K // 4), I32)
        xd = T.match_buffer(var_d, (r, K // B), F32)
        xs = T.match_buffer(var_s, (r, K // 16), I32)
        order = T.match_buffer(var_o, (p,), I32)
        tiles = T.match_buffer(var_t, (nt, 3), I32)
        y = T.match_buffer(var_y, (p, N), F32)
        for bx in blocks((N + BN - 1) // BN):
            for by in rows(nt):
                with T.sblock("mul_mat_id_mma"):
                    vx, vy = T.axis.remap("SS", [bx, by])
                    T.reads(w[0:X, 0:N, 0:WB], xq[0:r, 0:K // 4], xd[0:r, 0:K // B], xs[0:r, 0:K // 16],
                            order[0:p], tiles[vy, 0:3])
                    T.writes(y[0:p, 0:N])
                    tile(w, (grid, signs), xq, xd, xs, y, order, vx, tiles[vy, 0], tiles[vy, 1], tiles[vy, 2],
                         T.if_then_else(tiles[vy, 0] >= 0, S, 0))
    return _word_loads(_tables_only(mul_mat_id_mma, len(tabs)))


def _tables_only(func, n: int):
    """`func` without its table placeholders past the format's `n` tables (parameters 1 and 2: grid, signs)."""
    return tirx.PrimFunc([*func.params[:1 + n], *func.params[3:]], func.body, func.ret_type, func.attrs)


def _word_loads(func):
    """`func` with the weight's aligned words read as 32-bit loads and its 16-bit fields as 16-bit loads where the
    offsets allow (word_loads.py, as the GEMV reads them) instead of bytes OR-ed together: the same values. Q4_K's
    load phase per stage (sm_90 PTX, instructions per thread): 536 -> 339."""
    import tvm_ffi
    from tvm.s_tir import SBlock

    from .te import WORD_LOAD
    from .word_loads import word_loads

    def on_block(blk):
        if blk.name_hint not in ("mul_mat_mma", "mul_mat_id_mma"):
            return blk
        return SBlock(blk.iter_vars, blk.reads, blk.writes, blk.name_hint, blk.body, blk.init, blk.alloc_buffers,
                      blk.match_buffers, {**blk.annotations, WORD_LOAD: 1})

    return word_loads(tvm_ffi.structural_map(func, (SBlock, on_block)))


def mul_mat_kernel(kind: str, N: int, K: int, B: int, cuda: bool, gpu: bool):
    """PrimFunc (w uint8 [N, K / block · type_size] (the GGUF rows), the codebook formats' tables (`.grid`, then
    `.signs` where the format has it: nextn.common.quant's buffers), xq int32 [T, K/4], xd f32 [T, K/B], xs int32
    [T, K/16] -> y f32 [T, N]): `int8.mul_mat` of a `kind` weight by the rows `int8.quantize_rows(x, B, sums=True)`,
    as tensor-core tiles. `cuda`: CUDA's intrinsics in the words (byte_perm); `gpu`: thread blocks and
    `mma.sync` (CUDA sm_80+), else the same loops with serial threads and the mma from its fragment layouts."""
    return _tiles_kernel(kind, N, K, B, cuda, gpu, None, 1)


def mul_mat_id_kernel(kind: str, X: int, N: int, K: int, B: int, div: int, cuda: bool, gpu: bool):
    """PrimFunc (w uint8 [X, N, K / block · type_size], its tables as `mul_mat_kernel`'s, xq int32 [R, K/4], xd f32
    [R, K/B], xs int32 [R, K/16], order int32 [P], tiles int32 [NTILE, 3] (`expert_tiles_kernel`) -> y f32 [P, N]):
    the routed experts' `int8.mul_mat_id` of P = T · n_used (row, slot) pairs as tensor-core tiles of one expert's
    pairs each: pair p's activation row is p // div (div = n_used: rows [T, K] shared by the slots; 1: a row per
    pair, [T · n_used, K]), its weight expert ids[p]; y[p] its products (the Relax caller reshapes them to [T, n_used,
    N]). Each expert is read once per tile of BM of its pairs. `cuda`, `gpu` as `mul_mat_kernel`."""
    return _tiles_kernel(kind, N, K, B, cuda, gpu, X, div)


SORT_THREADS = 1024   # one block: a thread per (chunk of the pairs, expert)


def expert_tiles_kernel(X: int, gpu: bool):
    """PrimFunc (ids int32 [P] (a layer's ids [T, kk] viewed flat) -> order int32 [P], tiles int32
    [ceil(P / BM) + X, 3]): the (row, slot) pairs p = t · kk + s sorted by expert ids[p] (stable: by p within an
    expert), and the tiles of `mul_mat_id_kernel`:
    (expert, first position in `order`, pairs in the tile <= BM), one per BM pairs of each chosen expert in expert
    order, then (-1, 0, 0) for the slots left (the grid's bound: ceil(P / BM) + X tiles). One block of
    SORT_THREADS threads, a thread per (chunk, expert) for C = SORT_THREADS // X chunks of the pairs in order:
    each counts its expert in its chunk, a thread per expert turns its C counts into the chunks' offsets within the
    expert, one thread the experts' first positions and first tiles (X steps), then the tile table and, per (chunk,
    expert), the chunk's pairs of the expert written in order. Each thread scans P / C pairs twice (a 512-row
    prefill of 128 experts, 8 per row: 512 instead of 4096 per scan); no atomics, so the order is the same on every
    run (the CPU emulation included). Reference for the scheme: llama.cpp ggml-cuda mmid
    (`ggml_cuda_launch_mm_ids_helper`: the ids sorted per expert before mmq's tiles)."""
    NS = SORT_THREADS
    assert X <= NS, X
    C = NS // X
    blocks, threads, shared = _binders(not gpu)

    def start(p, tx):   # the first pair of thread tx's chunk (chunk tx // X of ceil(p / C) pairs)
        return tx // X * ((p + C - 1) // C)

    def pairs(p, tx):   # ... and its pairs (the last chunks may be short or empty)
        return T.max(T.min((p + C - 1) // C, p - start(p, tx)), 0)

    @T.prim_func(private=True, s_tir=True)
    def expert_tiles(var_ids: T.handle, var_o: T.handle, var_t: T.handle):
        T.func_attr(ATTRS)
        p = T.int64()
        ids = T.match_buffer(var_ids, (p,), I32)
        order = T.match_buffer(var_o, (p,), I32)
        tiles = T.match_buffer(var_t, ((p + BM - 1) // BM + X, 3), I32)
        for b in blocks(1):
            with T.sblock("expert_tiles"):
                T.reads(ids[0:p])
                T.writes(order[0:p], tiles[0:(p + BM - 1) // BM + X, 0:3])
                cnt = T.alloc_buffer((C * X,), I32, scope=shared)     # pairs of expert x in chunk c, at c · X + x
                off = T.alloc_buffer((C * X,), I32, scope=shared)     # ... before chunk c (within the expert)
                tot = T.alloc_buffer((X,), I32, scope=shared)         # pairs of expert x
                first = T.alloc_buffer((X + 1,), I32, scope=shared)    # an expert's first position in `order`
                tile0 = T.alloc_buffer((X + 1,), I32, scope=shared)    # ... and its first tile
                v = T.alloc_buffer((2,), I32, scope="local")
                for tx in threads(NS):   # chunk tx // X, expert tx % X
                    if tx < C * X:
                        v[0] = 0
                        for q in range(pairs(p, tx)):
                            if ids[start(p, tx) + q] == T.Cast(I32, tx % X):
                                v[0] = v[0] + 1
                        cnt[tx] = v[0]
                for tx in threads(NS):   # per expert: its chunks' offsets (into `off`, not `cnt`: no shared read
                    if tx < X:           # after a write inside the loop, where TVM would need a barrier)
                        v[0] = 0
                        for c in range(C):
                            off[c * X + tx] = v[0]
                            v[0] = v[0] + cnt[c * X + tx]
                        tot[tx] = v[0]
                for tx in threads(NS):
                    if tx == 0:   # running sums in registers (the same reason)
                        v[0] = 0
                        v[1] = 0
                        first[0] = 0
                        tile0[0] = 0
                        for x in range(X):
                            v[0] = v[0] + tot[x]
                            v[1] = v[1] + (tot[x] + BM - 1) // BM
                            first[x + 1] = v[0]
                            tile0[x + 1] = v[1]
                for tx in threads(NS):
                    for q in range(((p + BM - 1) // BM + X + NS - 1) // NS):
                        if q * NS + tx < (p + BM - 1) // BM + X:
                            tiles[q * NS + tx, 0] = -1
                            tiles[q * NS + tx, 1] = 0
                            tiles[q * NS + tx, 2] = 0
                            for x in range(X):   # the expert whose tiles hold this one, if any
                                v[0] = tile0[x]   # (shared reads in registers first: TVM's barrier planner
                                v[1] = tile0[x + 1]   # takes none in a condition)
                                if v[0] <= T.Cast(I32, q * NS + tx) and T.Cast(I32, q * NS + tx) < v[1]:
                                    tiles[q * NS + tx, 0] = x
                                    tiles[q * NS + tx, 1] = first[x] + (T.Cast(I32, q * NS + tx) - v[0]) * BM
                                    tiles[q * NS + tx, 2] = T.min(tot[x] - (T.Cast(I32, q * NS + tx) - v[0]) * BM, BM)
                    if tx < C * X:   # the chunk's pairs of the expert, in order
                        v[1] = first[tx % X] + off[tx]
                        for q in range(pairs(p, tx)):
                            if ids[start(p, tx) + q] == T.Cast(I32, tx % X):
                                order[v[1]] = T.Cast(I32, start(p, tx) + q)
                                v[1] = v[1] + 1
    return expert_tiles
