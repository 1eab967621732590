"""The prologue every x86 matmul kernel shares: its knobs, the kernel being built (`Kern`), the argument shapes of
a weight and of its activation rows, typed views of the weight bytes, and the software prefetch of the weight
stream. The loop nest is tiles.py; the per-format row loops are kquant.py, lanes.py and floats.py."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from .formats import format_of
from .vec import const


@dataclass(frozen=True)
class Knobs:
    """What `nextn tune` searches. width: vector bytes (32 AVX2, 64 AVX-512BW); tile_n: weight rows per work
    item; row_group: activation rows sharing one decode of a weight row's blocks (the rows left over go in smaller
    groups, `group_sizes`); unroll: blocks per step (float path); prefetch_kb: KB ahead of the weight bytes
    being read that each block prefetches (0: none; `prefetch`); w_rows: weight rows of a tile in one
    register block, each activation vector load serving all of them (the row functions that take several,
    tiles.w_rows; the others run one); prefetch_level: the cache level the prefetch fills, 1 (L1, prefetcht0)
    or 2 (L2, prefetcht1: `prefetch` says why it is the default). The defaults are the best measured on GLM
    widths (row_group 8: 8 rows' accumulators and the decoded block fit the 32 zmm registers)."""
    width: int = 32
    tile_n: int = 16
    row_group: int = 8
    unroll: int = 2
    prefetch_kb: int = 16
    w_rows: int = field(default=1, metadata={"choices": (1, 2)})
    prefetch_level: int = field(default=2, metadata={"choices": (1, 2)})


class Kern:
    """The kernel being built: its buffers, byte views of the weight, and knobs (what format code reads)."""


def _format(kind, exact: bool = False):
    return format_of(kind, exact)


def _new(kind: str, K: int, knobs: Knobs, vnni: bool = False, exact: bool = False):
    fmt = _format(kind, exact)
    if K % fmt.block:
        raise ValueError(f"{kind}: K={K} is not a multiple of the block ({fmt.block})")
    k = Kern()
    k.kind, k.width, k.unroll, k.vnni, k.w_rows = kind, knobs.width, knobs.unroll, vnni, knobs.w_rows
    k.acts, k.prefetch, k.prefetch_level = fmt.acts, knobs.prefetch_kb * 1024, knobs.prefetch_level
    k.unit_bytes = getattr(fmt, "unit_bytes", 256)     # activation bytes per 256 values of a row (tiles._units_in)
    k.n_blocks = K // fmt.block
    k.row_bytes = k.n_blocks * fmt.type_size
    return fmt, k


def weight_arg(kind: str, lead: tuple, K: int) -> tuple[tuple, str]:
    """(shape, dtype) of the weight argument: block bytes per row, or a plain float tensor's elements."""
    fmt = _format(kind)
    if hasattr(fmt, "arg_dtype"):
        return (*lead, K), fmt.arg_dtype
    return (*lead, K // fmt.block * fmt.type_size), "uint8"


def act_layout(kind: str, exact: bool = False) -> str:
    """How a `kind` kernel takes its activation rows: the row format (`acts`: "q8", "q8_0", "f32"), or a layout
    of it ("q8_q4k": the "q8" values in Q4_K's nibble order, formats.Q4K; "q8_iq4xs": in IQ4_XS's order,
    formats.IQ4XS; "q8_0_g8": the "q8_0" values in groups of 8 blocks in that order, formats.IQ4NLInt)."""
    fmt = _format(kind, exact)
    return getattr(fmt, "layout", fmt.acts)


def act_args(kind: str, rows, K: int, exact: bool = False) -> list[tuple[str, tuple, str]]:
    """[(name, shape, dtype)] of a kernel's activation arguments: the "q8" row (int8 values, f32 scale per 256,
    i16 sums per 16) for the super-block integer formats (for Q4_K / Q5_K in their nibble order), in IQ4_XS's
    order with i32 lane offsets per 16 for IQ4_XS, the "q8_0" row (int8 values, f32 scale per 32) for the
    32-block ones (for IQ4_NL / MXFP4 in groups of 8 blocks, with each lane's scale and offset per group), the
    float32 row otherwise (`exact`: the float path where a kind has both)."""
    acts = act_layout(kind, exact)
    if acts == "q8_iq4xs":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 256), "float32"), ("xc", (rows, K // 16), "int32")]
    if acts == "q8_0_g8":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 32), "float32"), ("xl", (rows, K // 256 * 16), "float32"),
                ("xc", (rows, K // 256 * 16), "int32")]
    if acts in ("q8", "q8_q4k"):
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 256), "float32"), ("xs", (rows, K // 16), "int16")]
    if acts == "q8_0":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 32), "float32")]
    return [("x", (rows, K), "float32")]


def bind_acts(k, kind, rows, K):
    for name, shape, dtype in act_args(kind, rows, K, k.acts == "f32"):
        setattr(k, name, T.arg(name, T.buffer(shape, dtype, align=32)))


def views(k, data, nbytes):
    """Typed views of the weight bytes (f16 scales, u32 words, ...) over the same pointer."""
    k.w8 = T.decl_buffer((nbytes,), "int8", data=data)
    k.w16 = T.decl_buffer((nbytes // 2,), "float16", data=data)
    k.w16u = T.decl_buffer((nbytes // 2,), "uint16", data=data)
    k.w32 = T.decl_buffer((nbytes // 4,), "uint32", data=data)
    k.w32f = T.decl_buffer((nbytes // 4,), "float32", data=data)


def concat(vs):
    return vs[0] if len(vs) == 1 else tirx.Shuffle(vs, list(range(sum(v.ty.dtype.lanes for v in vs))))


# LLVM's prefetch locality per Knobs.prefetch_level: 3 = prefetcht0 (into L1), 2 = prefetcht1 (into L2)
PREFETCH_LOCALITY = {1: 3, 2: 2}


def prefetch(k, n, off, nbytes, ahead=None):
    """Software prefetch of the weight bytes `ahead` (default `k.prefetch`) ahead of row n's bytes
    [off, off + nbytes), one per 64-byte line, into the cache level `k.prefetch_level` (Knobs.prefetch_level).
    The rows of a thread's tiles are one contiguous stream; with the hardware prefetcher alone a one-row kernel
    read it at ~0.7 of the machine's read bandwidth (Zen 4, bench/quant_gemv.py), with 16 KB ahead at about the
    read bandwidth. Into L2 by default: the weight is read once, and 16 KB of it brought into a 32 KB L1 evicts
    the activation rows every weight row reads again (Zen 4 with AVX-512, bench/x86_rows.py against prefetcht0:
    Q8_0 4096x10944 one row 1.2-1.7x, the Q6_K lm head at 4 rows 1.4-1.5x). Prefetches past the end of the
    weight do not fault."""
    if not k.prefetch:
        return
    base = n * k.row_bytes + off + (k.prefetch if ahead is None else ahead)
    locality = const(PREFETCH_LOCALITY[k.prefetch_level], "int32")
    for o in range(0, nbytes, 64):
        T.evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", tirx.address_of(k.w8[base + o]),
                                         const(0, "int32"), locality, const(1, "int32")))


@contextmanager
def kernel(name: str, kind: str, lead: tuple, K: int, rows, knobs: Knobs, vnni: bool, exact: bool,
           weights=("w",)):
    """The prologue of every x86 matmul kernel: the format and `Kern`, the PrimFunc named `name`, the row count
    Tr (`rows`, or a symbolic T), and the weight arguments `weights` of shape `lead` + the row's bytes (or
    elements). Yields (fmt, k, Tr, [weight args]); the caller binds the other arguments and writes the body
    inside, and finds the PrimFunc in k.func after the block. k.n_tiles: tiles of `tile_n` rows of the last
    `lead` dimension."""
    fmt, k = _new(kind, K, knobs, vnni, exact)
    k.n_tiles = -(-lead[-1] // knobs.tile_n)
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True, "tirx.is_scheduled": True})
            Tr = tirx.Var("T", "int64") if rows is None else rows
            shape, dtype = weight_arg(kind, lead, K)
            yield fmt, k, Tr, [T.arg(w, T.buffer(shape, dtype, align=32)) for w in weights]
    k.func = ib.get()
