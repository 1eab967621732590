"""CPU (llvm) schedules for the fused kernels.

Decode is dominated by matrix-vector products (QKV, O, FFN, experts, lm head) whose reduction runs along the
contiguous K axis of the weight. Each such reduction is split K = ko × 16 and `rfactor`ed on the 16 lanes,
so the inner loop becomes a vector multiply-add over contiguous weight bytes (Q8_0 blocks are 32 wide, so a
16-lane vector never straddles a scale), followed by a 16 → 1 sum. Large outputs (lm head, MoE experts)
are split across threads. Elementwise stages (rope, swiglu, concat, views: every axis spatial) are spread over
the threads by their outer axes when their size is symbolic (prefill, verify) or at least PARALLEL_MIN_ELEMS
(a one-row decode step's small ones stay on the calling thread: a fork-join costs more than they do). Anything
a rule does not fit stays in TE's default loop nest.

Every kernel's buffer parameters are declared 32-byte aligned (`align_params`), not TVM's default 64: weights
are views of the mapped GGUF file, whose tensor data is aligned to `general.alignment` = 32 bytes, and a kernel
that assumed 64 could fault on an aligned 64-byte vector load instead of reporting anything.
"""
from __future__ import annotations

import re

import tvm
from tvm import s_tir, tirx

from nextn.common.quant.format import ALIGNMENT

from .loops import static_extent

LANES = 16
TILE = 64
PARALLEL_MIN_WORK = 1 << 19     # multiply-adds per row above which a kernel is split across threads
PARALLEL_MIN_ELEMS = 1 << 16    # static elementwise stages from this many elements on are split across threads
CHUNK = 1024                    # elements per work item of a one-axis elementwise stage
# The knobs `nextn tune` lets meta_schedule search (schedule_space); the defaults above are used otherwise.
LANE_CHOICES = (8, 16, 32)
TILE_CHOICES = (16, 32, 64, 128, 256)


def _knob(sch, choices, default, sample: bool):
    if not sample:
        return default
    return sch.sample_categorical(candidates=list(choices), probs=[1.0 / len(choices)] * len(choices))


def _iter_kinds(sch, block):
    return [iv.iter_type for iv in sch.get(block).iter_vars]


def schedule_reduction(sch: s_tir.Schedule, block, sample: bool = False) -> bool:
    """rfactor the innermost reduction loop of `block` by LANES and vectorize it. Returns True if applied.
    `sample`: draw the lane count and output tile from the tuning choices (a meta_schedule design space)."""
    kinds = _iter_kinds(sch, block)
    loops = sch.get_loops(block)
    if len(loops) != len(kinds) or kinds[-1] != tirx.IterVar.CommReduce:
        return False
    n_red = sum(1 for k in kinds if k == tirx.IterVar.CommReduce)
    if n_red != 1:
        return False
    k = static_extent(sch.get(loops[-1]).extent)
    if k is None or k % LANES or k < 2 * LANES:
        return False
    lanes = _knob(sch, [c for c in LANE_CHOICES if k % c == 0 and k >= 2 * c], LANES, sample)
    ko, ki = sch.split(loops[-1], factors=[None, lanes])
    rf = sch.rfactor(ki, factor_axis=len(kinds) - 1)
    rf_loops = sch.get_loops(rf)
    # rf block loops: spatial..., ko, ki (ki now spatial and innermost): vectorize it.
    sch.vectorize(rf_loops[-1])
    spatial = rf_loops[:-2]
    if not spatial:
        return True
    n = static_extent(sch.get(spatial[-1]).extent)
    if n is not None and n >= 128 and n * k >= PARALLEL_MIN_WORK:
        # Split the output axis into 64-wide tiles, hoist the tile loop outermost and spread it over threads;
        # rows (T) iterate inside a tile, so the verify pass reuses each weight tile from cache.
        no, _ni = sch.split(spatial[-1], factors=[None, _knob(sch, TILE_CHOICES, TILE, sample)])
        sch.reorder(no, *spatial[:-1])
        sch.parallel(no)
    return True


def schedule_elementwise(sch: s_tir.Schedule, block) -> bool:
    """Spread a stage whose axes are all spatial over the threads: its outer axes fused into one parallel loop
    (a one-axis stage in CHUNK-element pieces), the innermost axis left to run contiguously. Returns True if
    applied."""
    kinds = _iter_kinds(sch, block)
    loops = sch.get_loops(block)
    if not loops or len(loops) != len(kinds) or any(k != tirx.IterVar.DataPar for k in kinds):
        return False
    extents = [static_extent(sch.get(lp).extent) for lp in loops]
    if None not in extents:
        n = 1
        for e in extents:
            n *= e
        if n < PARALLEL_MIN_ELEMS:
            return False
    if len(loops) == 1:
        outer, _inner = sch.split(loops[0], factors=[None, CHUNK])
    else:
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(outer)
    return True


def schedule_space(sch: s_tir.Schedule) -> None:
    """meta_schedule design space (`nextn tune`): this file's schedules with sampled knobs."""
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        try:
            schedule_reduction(sch, b, sample=True)
        except Exception:
            continue


def inline_elementwise_chain(sch: s_tir.Schedule, blocks) -> bool:
    """In a kernel of elementwise stages only (a fused chain: the MoE combine's eight top-k slot adds, say), inline
    each stage whose result its one consumer reads once, so the chain is one pass over its inputs instead of one
    pass and one T-sized temporary buffer per stage (glm45air-1-IQ4_XS prefill of 512 rows: the combine took 130
    ms, most of it writing and reading eight 8 MB temporaries). A stage read twice (rope's cos / sin) is left, so
    nothing is computed twice; each value is the same expression, evaluated in the same order. Returns True if
    any stage was inlined."""
    if len(blocks) < 2 or any(k != tirx.IterVar.DataPar for b in blocks for k in _iter_kinds(sch, b)):
        return False
    changed = False
    for b in blocks[:-1]:
        writes = sch.get(b).writes
        consumers = sch.get_consumers(b)
        if len(writes) != 1 or len(consumers) != 1:
            continue
        name = writes[0].source.name
        if len(re.findall(rf"\b{re.escape(name)}\[", str(sch.get(consumers[0]).body))) != 1:
            continue
        try:
            sch.compute_inline(b)
            changed = True
        except Exception:   # not inlinable (a non-injective read): keep the stage
            continue
    return changed


def schedule_func(func: tirx.PrimFunc) -> tirx.PrimFunc:
    sch = s_tir.Schedule(func)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []
    except Exception:
        return func
    changed = inline_elementwise_chain(sch, blocks)
    if changed:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    for b in blocks:
        try:
            changed |= schedule_reduction(sch, b) or schedule_elementwise(sch, b)
        except Exception:   # a rule that does not fit this block: keep the default nest
            continue
    return sch.mod["main"] if changed else func


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


def align_params(func: tirx.PrimFunc, align: int = ALIGNMENT) -> tirx.PrimFunc:
    """`func` with every buffer parameter declared `align`-byte aligned (where it assumed more)."""
    from tvm.tirx.buffer import is_buffer_var
    from tvm.tirx.transform.common import BufferReplacer

    bmap = {}
    for p in func.params:
        if is_buffer_var(p) and (p.data_alignment <= 0 or p.data_alignment > align):
            t = p.ty
            bmap[p] = tirx.decl_buffer(t.shape, t.dtype, p.name, None, t.strides, t.elem_offset, p.scope(), align,
                                       t.offset_factor)
    return BufferReplacer(bmap)(func) if bmap else func


@tvm.transform.module_pass(opt_level=0, name="nextn.ScheduleCPU")
class ScheduleCPU:
    def transform_module(self, mod, _ctx):
        out = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if not (func.attrs and func.attrs.get("tirx.is_scheduled")):
                func = schedule_func(func.with_attr("global_symbol", gv.name_hint))   # tuned ones stay
            out[gv] = align_params(func)
        for gv, f in out.items():
            mod[gv] = f
        return mod
