"""The integer route's aligned weight words as one 4-byte load (CUDA: a 32-bit load) instead of 4 byte loads OR-ed
together, and its 16-bit fields as 16-bit loads: a TIR rewrite of the DEQUANT and factor blocks that int8.py marks
WORD_LOAD, applied by the GEMV schedule (gemv.py) before it schedules. Where a DEQUANT block's 4 words of each
group lie at 16 consecutive 16-byte-aligned bytes (Q4_K's, Q5_K's quants), it marks the block WORD_VEC and the
GEMV loads the group as one 128-bit vector. Its own module so that gemv.py and int8.py do not import each
other."""
from __future__ import annotations

from tvm import tirx

from nextn.schedules.loops import static_extent as static


def _byte_terms(e, dtype="uint32"):
    """[(load, shift)] of an OR tree of `Cast(dtype, uint8 load) << shift` terms (Block.u32's form for uint32,
    Block.u16's for uint16), or None."""
    from tvm.ir import Op
    from tvm.ir.expr import Call, TensorLoad   # TensorLoad: what tirx.BufferLoad builds
    from tvm.ir.prim.expr import BitwiseOr, Cast, LShift

    if isinstance(e, BitwiseOr):
        a, b = _byte_terms(e.a, dtype), _byte_terms(e.b, dtype)
        return None if a is None or b is None else a + b
    shift = 0
    if isinstance(e, LShift) and isinstance(e.b, tirx.IntImm):
        e, shift = e.a, int(e.b.value)
    if not (isinstance(e, Cast) and str(e.ty) == dtype):
        return None
    v = e.value
    if isinstance(v, TensorLoad) and str(v.ty) == "uint8":
        return [(v, shift)]
    # an int8 table's byte (int8.py _grid_word): Cast(uint32, reinterpret(uint8, int8 load))
    if isinstance(v, Call) and v.op.same_as(Op.get("tirx.reinterpret")) and str(v.ty) == "uint8" \
            and isinstance(v.args[0], TensorLoad) and str(v.args[0].ty) == "int8":
        return [(v.args[0], shift)]
    return None


def _as_word(e, analyzer, views):
    """`e` as one load of a uint32 view of the buffer where it is Block.u32 of 4 consecutive bytes of one buffer
    (bytes i at shift 8i) at an offset the analyzer proves a multiple of 4 in rows of whole words; as two
    16-bit loads where the offset is even in rows of an even size; Block.u16 at an even offset as one 16-bit load;
    else `e`. The 16-bit and 32-bit loads read `views[buffer, dtype]`, a uint16 / uint32 view of the buffer made
    here."""
    dtype = str(e.ty)
    n = {"uint32": 4, "uint16": 2}.get(dtype)
    terms = _byte_terms(e, dtype) if n else None
    if terms is None or len(terms) != n or sorted(s for _l, s in terms) != list(range(0, 8 * n, 8)):
        return e
    loads = [ld for ld, _s in sorted(terms, key=lambda t: t[1])]
    first = loads[0]
    for i, ld in enumerate(loads):
        same = ld.source.same_as(first.source) and all(
            analyzer.can_prove_equal(a, b) for a, b in zip(ld.indices[:-1], first.indices[:-1]))
        if not same or not analyzer.can_prove_equal(ld.indices[-1] - first.indices[-1], i):
            return e
    last = first.indices[-1]
    row = int(first.source.shape[-1])

    def view(dtype, at):   # the element of a `dtype` view of the buffer at byte `at` (a multiple of its size)
        src, size = first.source, {"uint16": 2, "uint32": 4}[dtype]
        if (src, dtype) not in views:
            views[src, dtype] = tirx.decl_buffer([*src.shape[:-1], row // size], dtype,
                                                 name=f"{src.name}_u{8 * size}", data=src.data)
        return tirx.BufferLoad(views[src, dtype], [*first.indices[:-1], tirx.floordiv(at, size)])

    def half(at):   # 2 bytes through a uint16 view of the buffer (a uchar2 vector load nvcc splits into bytes)
        return view("uint16", at)

    even = row % 2 == 0 and analyzer.can_prove_equal(tirx.floormod(last, 2), 0)
    # a 16-bit field (Block.u16: a block's float16 factor) at an even offset in rows of an even size: one load
    if n == 2:
        return half(last) if even else e
    # 4-byte aligned: rows of whole words and a word offset in the row (the buffer's base: a device allocation)
    if row % 4 == 0 and analyzer.can_prove_equal(tirx.floormod(last, 4), 0):
        return view("uint32", last)
    # 2-byte aligned (blocks of an even size: Q8_0's 34, Q4_0's 18, Q6_K's 210 ...): two 16-bit loads, as llama.cpp's
    # get_int_b2 reads them
    if even:
        return half(last).astype("uint32") | (half(last + 2).astype("uint32") << tirx.const(16, "uint32"))
    return e


def _groups_of_4(blk, views) -> bool:
    """Whether every weight load of DEQUANT or HEAD block `blk` (32-bit words, the last iter var the word index w)
    reads a uint32 view (`views`), words 4g .. 4g + 3 of each group g at 4 consecutive elements from an element index
    that is a multiple of 4 in rows of a multiple of 4 words: then the group's words are one 16-byte-aligned 128-bit
    load (device allocations are 256-byte aligned)."""
    import tvm_ffi
    from tvm.ir import Range
    from tvm.ir.expr import TensorLoad
    from tvm.sym import Analyzer

    w = blk.iter_vars[-1]
    n = static(w.dom.extent)
    if str(blk.writes[0].source.dtype) not in ("int32", "uint32") or n is None or n % 4:
        return False
    weight = [b for (src, _dt), v in views.items() for b in (src, v)]
    words = [v for (_src, dt), v in views.items() if dt == "uint32"]
    loads = []
    tvm_ffi.structural_walk(blk.body, (TensorLoad, loads.append), order="post")
    loads = [ld for ld in loads if any(ld.source.same_as(b) for b in weight)]
    if not loads or not all(any(ld.source.same_as(v) for v in words) and int(ld.source.shape[-1]) % 4 == 0
                            for ld in loads):
        return False
    g, j = tirx.Var("g", str(w.var.ty)), tirx.Var("j", str(w.var.ty))
    analyzer = Analyzer()
    analyzer.bind(g, Range(0, n // 4))
    analyzer.bind(j, Range(0, 4))

    def at(e, word):   # index e at word index `word`
        return tvm_ffi.structural_map(e, (tirx.Var, lambda v: word if v.same_as(w.var) else v))

    for ld in loads:
        first = at(ld.indices[-1], g * 4)
        if not (analyzer.can_prove_equal(at(ld.indices[-1], g * 4 + j) - first, j)
                and analyzer.can_prove_equal(tirx.floormod(first, 4), 0)):
            return False
    return True


def word_loads(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with the weight words of its WORD_LOAD blocks (DEQUANT, and the factors' SCALE / MIN) read as loads of
    a uint32 view (CUDA: one 32-bit load, `((uint*)w)[i]`) or a uint16 view (`((ushort*)w)[i]`), declared in the
    block, instead of bytes OR-ed together: the same value, at the alignment the analyzer proves; a DEQUANT or HEAD
    block whose groups of 4 words are 16-byte-aligned fields (`_groups_of_4`) also marked WORD_VEC. Other blocks,
    and every other expression, unchanged."""
    import tvm_ffi
    from tvm.s_tir import SBlock
    from tvm.sym import Analyzer

    from .te import WORD_LOAD, WORD_VEC

    analyzer = Analyzer()

    def on_block(blk):
        if WORD_LOAD not in blk.annotations:
            return blk
        from tvm.ir.prim.expr import BitwiseOr

        views = {}
        blk = tvm_ffi.structural_map(blk, (BitwiseOr, lambda e: _as_word(e, analyzer, views)))
        if not views:
            return blk
        decls = [tirx.DeclBuffer(v, data=src.data) for (src, _dt), v in views.items()]
        notes = dict(blk.annotations)
        if _groups_of_4(blk, views):
            notes[WORD_VEC] = 4
        return SBlock(blk.iter_vars, blk.reads, blk.writes, blk.name_hint, tirx.SeqStmt([*decls, blk.body]),
                      blk.init, blk.alloc_buffers, blk.match_buffers, notes)

    return tvm_ffi.structural_map(func, (SBlock, on_block))
