"""The integer route's aligned weight words as one 4-byte load (CUDA: a 32-bit load) instead of 4 byte loads OR-ed
together, and its 16-bit fields as 16-bit loads: a TIR rewrite of the DEQUANT and factor blocks that int8.py marks
WORD_LOAD, applied by the GEMV schedule (gemv.py) before it schedules. Its own module so that gemv.py and int8.py
do not import each other."""
from __future__ import annotations

from tvm import tirx


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
    """`e` as one 4-byte vector load reinterpreted as uint32 where it is Block.u32 of 4 consecutive bytes of one
    buffer (bytes i at shift 8i) at an offset the analyzer proves a multiple of 4 in rows of whole words; as two
    16-bit loads where the offset is even in rows of an even size; Block.u16 at an even offset as one 16-bit load;
    else `e`. The 16-bit loads read `views[buffer]`, a uint16 view of the buffer made here."""
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

    def word(at):   # 4 bytes as one 32-bit vector load
        return tirx.reinterpret("uint32", tirx.BufferLoad(first.source, [*first.indices[:-1], tirx.Ramp(
            at, tirx.const(1, str(last.ty)), 4)]))

    def half(at):   # 2 bytes through a uint16 view of the buffer (a uchar2 vector load nvcc splits into bytes)
        src = first.source
        if src not in views:
            views[src] = tirx.decl_buffer([*src.shape[:-1], row // 2], "uint16", name=f"{src.name}_u16",
                                          data=src.data)
        return tirx.BufferLoad(views[src], [*first.indices[:-1], tirx.floordiv(at, 2)])

    even = row % 2 == 0 and analyzer.can_prove_equal(tirx.floormod(last, 2), 0)
    # a 16-bit field (Block.u16: a block's float16 factor) at an even offset in rows of an even size: one load
    if n == 2:
        return half(last) if even else e
    # 4-byte aligned: rows of whole words and a word offset in the row (the buffer's base: a device allocation)
    if row % 4 == 0 and analyzer.can_prove_equal(tirx.floormod(last, 4), 0):
        return word(last)
    # 2-byte aligned (blocks of an even size: Q8_0's 34, Q4_0's 18, Q6_K's 210 ...): two 16-bit loads, as llama.cpp's
    # get_int_b2 reads them
    if even:
        return half(last).astype("uint32") | (half(last + 2).astype("uint32") << tirx.const(16, "uint32"))
    return e


def word_loads(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with the weight words of its WORD_LOAD blocks (DEQUANT, and the factors' SCALE / MIN) read as 4-byte
    vector loads (CUDA: one 32-bit load, `*(uint*)`) or 16-bit loads of a uint16 view (`((ushort*)w)[i]`, declared
    in the block) instead of bytes OR-ed together: the same value, at the alignment the analyzer proves. Other
    blocks, and every other expression, unchanged."""
    import tvm_ffi
    from tvm.s_tir import SBlock
    from tvm.sym import Analyzer

    from .te import WORD_LOAD

    analyzer = Analyzer()

    def on_block(blk):
        if WORD_LOAD not in blk.annotations:
            return blk
        from tvm.ir.prim.expr import BitwiseOr

        views = {}
        blk = tvm_ffi.structural_map(blk, (BitwiseOr, lambda e: _as_word(e, analyzer, views)))
        if not views:
            return blk
        decls = [tirx.DeclBuffer(v, data=src.data) for src, v in views.items()]
        return SBlock(blk.iter_vars, blk.reads, blk.writes, blk.name_hint, tirx.SeqStmt([*decls, blk.body]),
                      blk.init, blk.alloc_buffers, blk.match_buffers, blk.annotations)

    return tvm_ffi.structural_map(func, (SBlock, on_block))
