"""The decode / verify GEMV schedule of `te.py`'s matmuls on GPUs: a warp per output (weight) row, the weight
read once for a tile of up to TILE_ROWS activation rows.

For y[..., n] = sum_k x[..., k] · deq[(b,) n, k] (and the routed-expert form) the schedule builds, with TVM
schedule primitives only (pad_einsum, split, reorder, rfactor, bind, compute_at, compute_inline,
reverse_compute_at, cache_read, set_scope, unroll, vectorize: they keep the function's semantics, so the
unscheduled definition is what tests check):

    blockIdx.x   WARPS weight rows n                       (ceil(N / WARPS) blocks of WARPS x 32 threads)
    blockIdx.y   row tiles of TILE_ROWS activation rows    (ceil(T / TILE_ROWS); mul_mat_id: the T x n_used
                 (and the head b of per-head weights)       (row, slot) pairs, each through its own expert)
    threadIdx.y  the warp's weight row n
    threadIdx.x  the lane: VEC consecutive k per step, 32 x VEC per warp step (coalesced), UNROLL steps unrolled
      acc[TILE_ROWS] = 0                                    (registers; T padded to whole tiles, padded rows
      per step: factors of the lane's sub-block (K-quants)   read row T - 1 and are not stored)
                deq[VEC] = the lane's VEC weight elements   (from memory once per row tile)
                xs[TILE_ROWS][VEC] = activations            (float4 loads where K allows)
                acc[r] += xs[r][v] · deq[v]
      warp-shuffle sum of each acc[r], then the fused element-wise tail (bias add, SwiGLU, residual adds ...)

The decode and draft steps (T = 1, static) get a one-row tile; verify of k + 1 <= TILE_ROWS rows one tile, so
the weight is read once per call; longer row counts (prefill) read it ceil(T / TILE_ROWS) times, in parallel
blocks. VEC is 4 for float32 weights, else 8: 16 bytes of a float weight (one 128-bit load per lane and step when
K is a multiple of 32 x VEC), or 8 consecutive elements of one block (Q8_0's qs bytes, a K-quant's 8 nibbles of
one sub-block), read as bytes. Reference for the structure: llama.cpp ggml-cuda mmvq.cu (a warp per row, up to 8
activation columns per pass).

The integer route (int8.py) takes the same schedule: its DEQUANT stage is int32 words of 4 quants and its
reduction runs over groups of G words (int8.group_words: 8, or 4, 2 for smaller sub-blocks), so k counts groups,
one per lane and step (32 quants of one sub-block, summed by chained dp4a; for the K-quants in int8.group_order's
order, which gives a lane the groups of one block that share bytes in one unrolled body), the weight's float
factors (SCALE, MIN) are read by the reduction and computed once per step, and a symbolic T comes padded to whole
tiles by the definition (XQ_PAD: kept as the register tile, so that a lane's activation words per row and step are
128-bit loads).
"""
from __future__ import annotations

import re

import tvm_ffi
from tvm import tirx

from nextn.schedules.loops import static_extent

from .te import (DEQUANT, GROUPED, HEAD, MATMUL, MIN, SCALE, TILE_ROWS, WORD_VEC, X_PAD, XQ_GROUP, XQ_PAD, XS_GROUP,
                 XS_PAD)

WARPS = 4        # weight rows per thread block (one warp each)
LANES = 32
_VEC_BYTES = 16
UNROLL = 4       # warp steps (32 x VEC elements of k) per unrolled loop body


def unroll(steps: int, exact: bool) -> int:
    """Warp steps per unrolled loop body: UNROLL, or the largest of 2, 1 that divides whole steps."""
    return UNROLL if not exact else next(u for u in (UNROLL, 2, 1) if steps % u == 0)


def _vec(dtype: str, K: int) -> tuple[int, bool]:
    """(elements per lane and step, whether that step divides K) for a weight buffer of `dtype`."""
    width = _VEC_BYTES // 4 if dtype == "float32" else 8
    if K % width:
        width = next(v for v in (4, 2, 1) if K % v == 0)
    return width, K % (LANES * width) == 0


def _named(sch, blocks, name):
    """The blocks called `name` (or `name`_1 ...: FuseTIR's renaming)."""
    return [b for b in blocks if re.fullmatch(rf"{name}(_\d+)?", sch.get(b).name_hint)]


def _index(sch, blocks, blk) -> int:
    return next(i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(blk)))


def _words(sch, blk):
    """The innermost loop of `blk`'s words (after compute_at): one 128-bit load per 4 where word_loads.py proved
    each 4 of them one 16-byte-aligned field (WORD_VEC), else unrolled."""
    words = sch.get_loops(blk)[-1]
    n = static_extent(sch.get(words).extent)
    if WORD_VEC in sch.get(blk).annotations and n is not None and n % 4 == 0:
        quads, words = sch.split(words, [None, 4])
        sch.unroll(quads)
        sch.vectorize(words)
    else:
        sch.unroll(words)


def _is_group_entries(buf) -> bool:
    """Whether `buf` is a grouped mul_mat_id's group entries (te.expert_groups: int32 [T, n_used, GROUP_ROWS + 1])."""
    from .te import GROUP_ROWS

    return str(buf.dtype) == "int32" and len(buf.shape) == 3 and static_extent(buf.shape[-1]) == GROUP_ROWS + 1


def _group_entries_once(sch, kx) -> None:
    """The grouped mul_mat_id's group entries (te.expert_groups: int32 [T, n_used, GROUP_ROWS + 1], its members'
    rows and the leader test), which every step's loads index (weight, activation words, their sums, scales), read
    into registers once per thread at `kx` (the lane) instead of once per step: a cached copy for all its readers."""
    from tvm.s_tir import SBlock

    names = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (SBlock, lambda b: names.append(b.name_hint)), order="post")
    blocks = [sch.get_sblock(n) for n in names if n != "root"]
    readers, buf = [], None
    for b in blocks:
        for r in sch.get(b).reads:
            src = r.source
            if _is_group_entries(src) and (buf is None or src.same_as(buf)):
                buf = src
                readers.append(b)
                break
    if not readers:
        return
    i = next(k for k, r in enumerate(sch.get(readers[0]).reads) if r.source.same_as(buf))
    cached = sch.cache_read(readers[0], i, "local", consumer_blocks=readers)
    sch.compute_at(cached, kx, preserve_unit_loops=True)


def _leaders_only(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The scheduled grouped mul_mat_id `func` with the body of each thread block (a (row, slot) pair, blockIdx.y)
    under one test of the pair's leadership (te.expert_groups: groups[t, s, t % GROUP_ROWS] >= 0), which is uniform
    over the block: a pair that leads no group runs nothing and leaves its entries unwritten (`expert_gather` reads
    the leaders' only; the definitions compute them as 0, there being no members), and the weight loads of a leader
    need no test of their own, so nvcc keeps their common address arithmetic once instead of once per load."""
    from tvm.s_tir import SBlock

    from .te import GROUP_ROWS

    found = []

    def on_block(b):
        found.extend(r.source for r in b.reads if r.source.scope() == "global" and _is_group_entries(r.source))

    tvm_ffi.structural_walk(func.body, (SBlock, on_block))
    groups = found[0]
    kk = groups.shape[1]

    def on_for(loop):
        if loop.kind != tirx.ForKind.THREAD_BINDING or loop.thread_binding.thread_tag != "blockIdx.y":
            return loop
        t = tirx.floordiv(loop.loop_var, kk)
        lead = tirx.BufferLoad(groups, [t, tirx.floormod(loop.loop_var, kk), tirx.floormod(t, GROUP_ROWS)])
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                        tirx.IfThenElse(lead >= tirx.const(0, "int32"), loop.body, None), loop.thread_binding,
                        loop.annotations)

    return tvm_ffi.structural_map(func, (tirx.For, on_for))


def schedule(func: tirx.PrimFunc, target):
    """The GEMV schedule of a (fused) PrimFunc holding one `te.py` matmul, or None when `func` is not one."""
    from tvm import s_tir

    from .word_loads import word_loads

    sch = s_tir.Schedule(word_loads(func))   # the integer route's aligned weight words as 32-bit loads
    try:
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:
        return None
    deqs, mms = _named(sch, blocks, DEQUANT), _named(sch, blocks, MATMUL) + _named(sch, blocks, GROUPED)
    if len(deqs) != 1 or len(mms) != 1:
        return None
    deq, mm = deqs[0], mms[0]
    i_mm = _index(sch, blocks, mm)
    # the K-quants' sub-block factors (te.SCALE, te.MIN), read by the dequantization; on the integer route
    # (int8.py) the weight's factors, read by the reduction
    stages = list(sch.get_producers(deq))
    stages += [b for b in _named(sch, blocks, SCALE) + _named(sch, blocks, MIN)
               if not any(sch.get(b).same_as(sch.get(s)) for s in stages)]
    integer = str(sch.get(deq).writes[0].source.dtype) == "int32"   # int8.py: 4 quants per word
    heads = _named(sch, blocks, HEAD)   # the factors' block heads (int8.py, Q4_K / Q5_K)
    weight_side = [sch.get(b) for b in (deq, *stages, *heads)]
    # the activations padded to whole row tiles (te.padded_rows, symbolic T: float rows or the integer route's
    # words) or gathered for a group's member rows (int8.mul_mat_id_grouped): a register tile below when its loads
    # can be vectors
    xq_pads = _named(sch, blocks[:i_mm], XQ_PAD) + _named(sch, blocks[:i_mm], XQ_GROUP) if integer else \
        _named(sch, blocks[:i_mm], X_PAD)
    # and their sums of 16 quants (int8.quantize_rows(sums=True)), padded or gathered alike
    xs_pads = _named(sch, blocks[:i_mm], XS_PAD) + _named(sch, blocks[:i_mm], XS_GROUP) if integer else []
    keep = weight_side + [sch.get(b) for b in xq_pads + xs_pads]
    # element-wise producers of the activations (SwiGLU, a division): into the reads (chosen before inlining
    # changes the block nodes)
    for b in [b for b in blocks[:i_mm] if not any(sch.get(b).same_as(w) for w in keep)]:
        sch.compute_inline(b)
    tail = blocks[i_mm + 1:]
    node = sch.get(mm)
    kinds = [iv.iter_type for iv in node.iter_vars]
    if kinds[-1] != tirx.IterVar.CommReduce or any(k != tirx.IterVar.DataPar for k in kinds[:-1]) or len(kinds) < 2:
        return None
    loops = sch.get_loops(mm)
    if len(loops) != len(kinds):
        return None
    K = static_extent(sch.get(loops[-1]).extent)
    N = static_extent(sch.get(loops[-2]).extent)
    if K is None or N is None:
        return None
    # weight-side axes: those the dequantized weight is indexed by; the others are activation rows
    deq_buf = sch.get(deq).writes[0].source
    used = set()
    for region in node.reads:
        if region.source.same_as(deq_buf):
            for r in region.region:
                tvm_ffi.structural_walk(r.min, (tirx.Var, used.add), order="post")
    ivars = [iv.var for iv in node.iter_vars[:-1]]
    row_axes = [i for i, v in enumerate(ivars) if not any(v.same_as(u) for u in used)]
    if len(row_axes) > 1 or (row_axes and row_axes[0] == len(ivars) - 1):
        return None
    tile, rows = 1, None
    if row_axes:
        rows = static_extent(sch.get(loops[row_axes[0]]).extent)
        tile = TILE_ROWS if rows is None else min(TILE_ROWS, rows)
    rows_static = not row_axes or rows is not None
    x_pads = []
    if tile > 1 and rows is None and not integer and not xq_pads:
        # te.mul_mat and int8.mul_mat pad a symbolic T in their definitions (te.padded_rows); a float matmul that
        # comes unpadded (no current form) is padded here to whole tiles, so that the accumulators are a static
        # [tile] register array (a split of a symbolic extent would size them by T): its padded rows read x as 0
        sch.pad_einsum(mm, [tile if i in row_axes else 1 for i in range(len(kinds))])
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        for b in blocks:
            name = sch.get(b).name_hint
            if not name.endswith("_pad") or sch.get(b).same_as(sch.get(mm)):
                continue
            if not sch.get_producers(b):        # x padded with zero rows: a register tile below (x_pads)
                x_pads.append(b)
            elif sch.get_consumers(b):          # the copy out of the padded sums, before a tail: read in place
                sch.compute_inline(b)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        tail = blocks[_index(sch, blocks, mm) + 1:]
        loops = sch.get_loops(mm)
    for b in tail[:-1]:   # an element-wise chain (residual adds ...): one block, so no row-indexed scratch
        sch.compute_inline(b)
    tail = tail[-1:]
    dtypes = {str(r.source.dtype) for r in sch.get(deq).reads} - {"int32"}
    vec, exact_steps = _vec(dtypes.pop() if len(dtypes) == 1 else "uint8", K)
    x_words = vec   # activation elements a lane reads per step
    if integer:   # K counts word groups (int8.group_words: up to 32 quants of one sub-block): one per lane and step
        vec, x_words = 1, int(deq_buf.shape[-1]) // K
        exact_steps = K % LANES == 0
    x_pads += xq_pads
    # a float4 of float rows; on the integer route the lane's 4 words of a step (one 128-bit load, 16-byte aligned:
    # a row is K/4 words and K a multiple of 512 for whole steps), 2 for IQ1_M's groups
    x_vec = 4 if x_words % 4 == 0 else 2
    if not (exact_steps and x_words % x_vec == 0 and len(x_pads) == 1):
        for b in x_pads + xs_pads:   # read in place, each load predicated
            sch.compute_inline(b)
        x_pads = xs_pads = []

    no, ny = sch.split(loops[-2], [None, WARPS])
    ko, kx, kv = sch.split(loops[-1], [None, LANES, vec])
    outer, ri = [], None
    for i, lp in enumerate(loops[:-2]):
        if i in row_axes:
            ro, ri = sch.split(lp, [None, tile])
            outer.append(ro)
        else:
            outer.append(lp)
    sch.reorder(no, *outer, ny, kx, ko, kv, *([ri] if ri is not None else []))
    rf = sch.rfactor(kx, 0)
    rl = sch.get_loops(rf)
    no, outer, (ny, kx, ko, kv) = rl[0], rl[1:1 + len(outer)], rl[1 + len(outer):5 + len(outer)]
    ri = rl[-1] if ri is not None else None
    sch.bind(no, "blockIdx.x")
    if outer:
        sch.bind(sch.fuse(*outer) if len(outer) > 1 else outer[0], "blockIdx.y")
    sch.bind(ny, "threadIdx.y")
    sch.bind(kx, "threadIdx.x")
    sch.set_scope(rf, 0, "local")
    # UNROLL warp steps in straight-line code: their weight loads are independent, so more bytes are in flight
    # (a K that is not whole steps is predicated already: the unrolled body may take the predicate too)
    steps = -(-K // (LANES * vec))
    ko_o, ko = sch.split(ko, [None, unroll(steps, exact_steps)])
    sch.compute_at(deq, ko, preserve_unit_loops=True)
    sch.set_scope(deq, 0, "local")
    _words(sch, deq)
    for st in stages:   # a lane's elements of a step lie in one sub-block: its factor once per step, not per element
        sch.compute_at(st, ko, preserve_unit_loops=True)
        sch.set_scope(st, 0, "local")
    for hd in heads:    # the head of the factors' block, once per step
        sch.compute_at(hd, ko, preserve_unit_loops=True)
        sch.set_scope(hd, 0, "local")
        _words(sch, hd)
    reads = [r.source for r in sch.get(deq).reads]
    wide = [i for i, b in enumerate(reads) if str(b.dtype) in ("float32", "float16", "uint16") and len(b.shape) >= 2]
    # a float weight: the lane's 16 bytes as one 128-bit load, then widened (not through a gathered expert index:
    # the region of an indirect read has no bounds to cache)
    if exact_steps and len(wide) == 1 and len(reads) == 1:
        wl = sch.cache_read(deq, wide[0], "local")
        sch.compute_at(wl, ko, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(wl)[-1])
    # the activations of a static row count (the decode and draft steps; the routed experts' (row, slot) pairs) as
    # vector loads too (float4; the integer route: its int32 words, not the block scales xd or the weight's factors;
    # not the grouped kernel's rows, read through the group index: no bounded region); a padded row tile below
    # (the integer route: its words, [..., K/4] like the weight's, not their sums of 16 quants)
    acts = [i for i, r in enumerate(sch.get(rf).reads) if not any(r.source.same_as(b) for b in (
        sch.get(rf).writes[0].source, sch.get(deq).writes[0].source))
        and (not integer or (str(r.source.dtype) == "int32" and int(r.source.shape[-1]) == int(deq_buf.shape[-1])))]
    if exact_steps and rows_static and len(acts) == 1 and x_words % x_vec == 0 and not _named(sch, [mm], GROUPED):
        xl = sch.cache_read(rf, acts[0], "local")
        sch.compute_at(xl, ko, preserve_unit_loops=True)
        v_o, v4 = sch.split(sch.get_loops(xl)[-1], [None, x_vec])
        sch.vectorize(v4)
        sch.unroll(v_o)
    # the padded (gathered) row tile's activations: vector loads under one row predicate each; their sums (a lane's
    # x_words / 4 of a step) as pairs where even
    for xp, width in [(b, x_vec) for b in x_pads] + [(b, 2 if x_words % 8 == 0 else 1) for b in xs_pads]:
        sch.compute_at(xp, ko, preserve_unit_loops=True)
        sch.set_scope(xp, 0, "local")
        *_, xr, xk = sch.get_loops(xp)
        v_o, v4 = sch.split(xk, [None, width])
        if width > 1:
            sch.vectorize(v4)
        sch.unroll(v_o)
        sch.unroll(xr)
    if _named(sch, [mm], GROUPED):
        _group_entries_once(sch, kx)
    sch.decompose_reduction(rf, ko_o)
    sch.unroll(ko)
    sch.unroll(kv)
    if ri is not None:
        sch.unroll(ri)
    # the cross-lane sum: one warp-shuffle reduction per activation row of the tile
    sch.reverse_compute_at(mm, ny, preserve_unit_loops=True)
    wl = sch.get_loops(mm)
    base = 3 if outer else 2   # the loops down to ny: blockIdx.x, blockIdx.y (when there is one), threadIdx.y
    lane, *rest = wl[base:]
    if rest:
        sch.reorder(*rest, lane)
    sch.bind(lane, "threadIdx.x")
    # the element-wise tail (padding copy, bias add, SwiGLU ...) per warp; its inputs from the reduction stay in
    # registers (every lane holds the warp's sum), only the function's outputs are stored
    params = list(func.params)
    for b in [mm, *tail]:
        if not any(sch.get(b).writes[0].source.same_as(p) for p in params):
            sch.set_scope(b, 0, "local")
    for b in tail:
        sch.reverse_compute_at(b, ny, preserve_unit_loops=True)
    if _named(sch, [mm], GROUPED):
        return s_tir.Schedule(_leaders_only(sch.mod["main"]))
    return sch

