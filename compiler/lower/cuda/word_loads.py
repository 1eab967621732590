"""The integer route's aligned weight words as one 4-byte load (CUDA: a 32-bit load) instead of 4 byte loads OR-ed
together: a TIR rewrite of DEQUANT blocks that int8.py marks WORD_LOAD (`Fmt.aligned`, `Fmt.tables`), applied by the
GEMV schedule (gemv.py) before it schedules. Its own module so that gemv.py and int8.py do not import each other."""
from __future__ import annotations

from tvm import tirx


def _byte_terms(e):
    """[(load, shift)] of an OR tree of `Cast(uint32, uint8 load) << shift` terms (Block.u32's form), or None."""
    from tvm.ir import Op
    from tvm.ir.expr import Call, TensorLoad   # TensorLoad: what tirx.BufferLoad builds
    from tvm.ir.prim.expr import BitwiseOr, Cast, LShift

    if isinstance(e, BitwiseOr):
        a, b = _byte_terms(e.a), _byte_terms(e.b)
        return None if a is None or b is None else a + b
    shift = 0
    if isinstance(e, LShift) and isinstance(e.b, tirx.IntImm):
        e, shift = e.a, int(e.b.value)
    if not (isinstance(e, Cast) and str(e.ty) == "uint32"):
        return None
    v = e.value
    if isinstance(v, TensorLoad) and str(v.ty) == "uint8":
        return [(v, shift)]
    # an int8 table's byte (int8.py _grid_word): Cast(uint32, reinterpret(uint8, int8 load))
    if isinstance(v, Call) and v.op.same_as(Op.get("tirx.reinterpret")) and str(v.ty) == "uint8" \
            and isinstance(v.args[0], TensorLoad) and str(v.args[0].ty) == "int8":
        return [(v.args[0], shift)]
    return None


def _as_word(e, analyzer):
    """`e` as one 4-byte vector load reinterpreted as uint32 where it is Block.u32 of 4 consecutive bytes of one
    buffer (bytes i at shift 8i) at an offset the analyzer proves a multiple of 4 in rows of whole words, else
    `e`."""
    terms = _byte_terms(e)
    if terms is None or len(terms) != 4 or sorted(s for _l, s in terms) != [0, 8, 16, 24]:
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

    def vec(at, n, dtype):
        ramp = tirx.Ramp(at, tirx.const(1, str(last.ty)), n)
        return tirx.reinterpret(dtype, tirx.BufferLoad(first.source, [*first.indices[:-1], ramp]))

    # 4-byte aligned: rows of whole words and a word offset in the row (the buffer's base: a device allocation)
    if row % 4 == 0 and analyzer.can_prove_equal(tirx.floormod(last, 4), 0):
        return vec(last, 4, "uint32")
    # 2-byte aligned (blocks of an even size: Q8_0's 34, Q4_0's 18, Q6_K's 210 ...): two 16-bit loads, as llama.cpp's
    # get_int_b2 reads them
    if row % 2 == 0 and analyzer.can_prove_equal(tirx.floormod(last, 2), 0):
        lo = vec(last, 2, "uint16").astype("uint32")
        return lo | (vec(last + 2, 2, "uint16").astype("uint32") << tirx.const(16, "uint32"))
    return e


def word_loads(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with the weight words of its WORD_LOAD DEQUANT blocks (`Fmt.aligned`) read as 4-byte vector loads
    (CUDA: one 32-bit load, `*(uchar4*)`) instead of 4 byte loads OR-ed together: the same value, given the
    4-byte alignment the annotation states. Other blocks, and every other expression, unchanged."""
    import tvm_ffi
    from tvm.s_tir import SBlock
    from tvm.sym import Analyzer

    from .te import WORD_LOAD

    analyzer = Analyzer()

    def on_block(blk):
        if WORD_LOAD not in blk.annotations:
            return blk
        from tvm.ir.prim.expr import BitwiseOr

        return tvm_ffi.structural_map(blk, (BitwiseOr, lambda e: _as_word(e, analyzer)))

    return tvm_ffi.structural_map(func, (SBlock, on_block))
