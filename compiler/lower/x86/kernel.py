"""The prologue every x86 matmul kernel shares: its knobs, what a format declares (`Format`) and what its family's
row loop offers the loop nest (`RowPath`), the kernel being built (`Kern`), the argument shapes of a weight and of
its activation rows, typed views of the weight bytes, the format's tables, and the software prefetch of the weight
stream. The loop nest is tiles.py; the formats and row loops, one module per path family: kquant.py (Q2_K ..
Q6_K), lanes.py (IQ4_XS), block32.py (Q8_0, Q4_0, IQ4_NL, MXFP4 on "q8_0" rows), codebook.py (IQ1_S .. IQ3_S),
floats.py (the float path); formats.py names them by GGUF kind."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from .vec import const, hsum_pairwise, ramp


@dataclass(frozen=True)
class Knobs:
    """What `nextn tune` searches. width: vector bytes (32 AVX2, 64 AVX-512BW); tile_n: weight rows per work
    item; row_group: activation rows sharing one decode of a weight row's blocks (the rows left over go in smaller
    groups, `group_sizes`); unroll: blocks per step (float path); prefetch_kb: KB ahead of the weight bytes
    being read that each block prefetches (0: none; `prefetch`); w_rows: weight rows of a tile in one
    register block, each activation vector load serving all of them (the row functions that take several,
    tiles.w_rows; the others run one); prefetch_level: the cache level the prefetch fills, 1 (L1, prefetcht0)
    or 2 (L2, prefetcht1: `prefetch` says why it is the default); fit_kb: the activation KB a row group reads K
    whole within, past it K goes in chunks (tiles.py: the L1 data cache the rows stay in; x86.default_knobs sets
    the target's, `l1d_kb`). The defaults are the best measured on GLM widths (row_group 8: 8 rows'
    accumulators and the decoded block fit the 32 zmm registers)."""
    width: int = 32
    tile_n: int = 16
    row_group: int = 8
    unroll: int = 2
    prefetch_kb: int = 16
    w_rows: int = field(default=1, metadata={"choices": (1, 2)})
    prefetch_level: int = field(default=2, metadata={"choices": (1, 2)})
    fit_kb: int = field(default=32, metadata={"choices": (32, 48, 64)})


class Format:
    """What every x86 format declares (no attribute of a format is guessed by hasattr): `path`, the row loop of
    its family (`RowPath`: kquant.py, lanes.py, block32.py, codebook.py, floats.py); `block` weights per block of
    `type_size` bytes; `acts`, the activation row format ("q8", "q8_0", "f32": nextn.common.quant.activation) and
    `layout`, the order the kernel takes it in (formats.act_layout); `unit_bytes`, a row's activation bytes per
    unit of K (tiles._units_in); `arg_dtype`, the weight argument's dtype ("uint8": the GGUF block bytes, else
    the tensor's own elements); `constants()`, the tables the kernel declares, [(name, dtype, values)]
    (`declare_tables`)."""
    path: "RowPath"
    block: int
    type_size: int
    acts: str
    unit_bytes = 256
    arg_dtype = "uint8"

    @property
    def layout(self) -> str:
        return self.acts

    def constants(self) -> list:
        return []


class RowPath:
    """The row loop of a family of formats (one module each), the only thing tiles.py asks of a format.

    multi_row: its row functions take a register block of Knobs.w_rows weight rows; w_rows_dense: the default
    w_rows of its dense row-count kernels at 64 bytes (the routed experts' take 2 where `multi_row`,
    x86.default_knobs); max_width: the widest vectors (bytes) its default knobs take (x86.default_knobs: the
    target's width up to this); bit_knobs: the Knobs fields that change a row's bits (x86.bit_knobs); unit_blocks: the
    blocks of a unit of K a row group goes through in chunks (tiles._int_tile_chunked), 0: K whole always.
    `acc_lanes`: the float lanes of each accumulator of a (weight row, activation row); `tile_terms`: what the
    activation rows of a group share across a tile's weight rows (None); `rows`: a row group against weight rows
    `ns`, K whole (tiles._rows); the `chunk_*` functions: the same in chunks of K (tiles._int_tile_chunked)."""
    multi_row = False
    w_rows_dense = 1
    max_width = 64
    bit_knobs: tuple = ("width",)
    unit_blocks = 1

    def acc_lanes(self, kern, fmt) -> list[int]:
        raise NotImplementedError

    def tile_terms(self, kern, fmt, rows):
        return None

    def rows(self, kern, fmt, ns, rows, outs, terms):
        raise NotImplementedError

    def chunk_accs(self, kern, fmt, tile_n, n_rows) -> list:
        """The accumulators of a tile's rows against a row group (zeroed by `chunk_zero`)."""
        return [T.decl_buffer((tile_n * n_rows * self.acc_lanes(kern, fmt)[0],), "float32")]

    def chunk_zero(self, kern, fmt, accs, nn, n_rows):
        n_acc = self.acc_lanes(kern, fmt)[0]
        for r in range(n_rows):
            T.buffer_store(accs[0], const(0.0, "float32", n_acc), [ramp((nn * n_rows + r) * n_acc, n_acc)])

    def chunk_pass(self, kern, fmt, nns, ns, rows, accs, chunk, terms, ahead):
        """Weight rows `ns` (tile rows `nns`) against activation rows `rows` over the units `chunk` of K."""
        raise NotImplementedError

    def chunk_finish(self, kern, fmt, per_block, rows, accs):
        """What a row group adds after its chunks (per_block(body(nns, ns)): the tile's rows in register blocks)."""

    def chunk_out(self, kern, fmt, accs, nn, r, n_rows):
        """The result of tile row nn and the group's row r."""
        n_acc = self.acc_lanes(kern, fmt)[0]
        return hsum_pairwise(accs[0][ramp((nn * n_rows + r) * n_acc, n_acc)], n_acc)


class SumPath(RowPath):
    """A path whose `row_loop(kern, fmt, ns, rows, accs, blocks=None)` adds into one accumulator of
    `acc_lanes(..)[0]` lanes per (weight row ns[j], activation row rows[r]), accs[j][r] = (float32 buffer, lane
    offset), over the blocks `blocks` ((first, end); all by default); y = its lanes summed pairwise."""

    def row_loop(self, kern, fmt, ns, rows, accs, blocks=None):
        raise NotImplementedError

    def rows(self, kern, fmt, ns, rows, outs, terms):
        lanes = self.acc_lanes(kern, fmt)
        accs = zeroed_accs(ns, rows, lanes)
        self.row_loop(kern, fmt, ns, rows, [[(acc[0], 0) for acc in per] for per in accs])
        for per, o in zip(accs, outs):
            for acc, out in zip(per, o):
                T.buffer_store(kern.y, hsum_pairwise(acc[0][ramp(0, lanes[0])], lanes[0]), out)

    def chunk_pass(self, kern, fmt, nns, ns, rows, accs, chunk, terms, ahead):
        n_acc = self.acc_lanes(kern, fmt)[0]
        self.row_loop(kern, fmt, ns, rows, [[(accs[0], (nn * len(rows) + r) * n_acc) for r in range(len(rows))]
                                            for nn in nns], chunk)


@dataclass(slots=True)
class Kern:
    """The kernel being built, what the row loops read: its knobs (`width` .. `prefetch_level`; `prefetch` and
    `fit_bytes` in bytes), the format's `acts`, the weight's `n_blocks` per row of `row_bytes`, `unit_bytes`
    (Format), `n_tiles` work items per weight, the weight buffer `w` [rows, row_bytes] and its typed views
    (`views`), the activation arguments (`bind_acts`: x, or xq, xd and xs / xc / xl), the output `y`, the format's
    `tables` (`declare_tables`) and, once built, the PrimFunc `func`."""
    kind: str = ""
    width: int = 32
    unroll: int = 2
    vnni: bool = False
    w_rows: int = 1
    acts: str = "f32"
    prefetch: int = 0
    prefetch_level: int = 2
    fit_bytes: int = 32 << 10
    unit_bytes: int = 256
    n_blocks: int = 0
    row_bytes: int = 0
    n_tiles: int = 0
    w: object = None
    w8: object = None
    w16: object = None
    w16u: object = None
    w32: object = None
    w32f: object = None
    x: object = None
    xq: object = None
    xd: object = None
    xs: object = None
    xc: object = None
    xl: object = None
    y: object = None
    tables: dict = field(default_factory=dict)
    func: object = None


def _new(fmt: Format, kind: str, K: int, knobs: Knobs, vnni: bool) -> Kern:
    if K % fmt.block:
        raise ValueError(f"{kind}: K={K} is not a multiple of the block ({fmt.block})")
    n_blocks = K // fmt.block
    return Kern(kind=kind, width=knobs.width, unroll=knobs.unroll, vnni=vnni, w_rows=knobs.w_rows, acts=fmt.acts,
                prefetch=knobs.prefetch_kb * 1024, prefetch_level=knobs.prefetch_level, fit_bytes=knobs.fit_kb << 10,
                unit_bytes=fmt.unit_bytes,
                n_blocks=n_blocks, row_bytes=n_blocks * fmt.type_size)


def weight_arg(fmt: Format, lead: tuple, K: int) -> tuple[tuple, str]:
    """(shape, dtype) of the weight argument: block bytes per row, or a plain float tensor's elements."""
    if fmt.arg_dtype != "uint8":
        return (*lead, K), fmt.arg_dtype
    return (*lead, K // fmt.block * fmt.type_size), "uint8"


def layout_args(layout: str, rows, K: int) -> list[tuple[str, tuple, str]]:
    """[(name, shape, dtype)] of the activation arguments of a row `layout` (formats.act_args)."""
    if layout == "q8_iq4xs":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 256), "float32"), ("xc", (rows, K // 16), "int32")]
    if layout == "q8_0_g8":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 32), "float32"), ("xl", (rows, K // 256 * 16), "float32"),
                ("xc", (rows, K // 256 * 16), "int32")]
    if layout in ("q8", "q8_q4k"):
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 256), "float32"), ("xs", (rows, K // 16), "int16")]
    if layout == "q8_0":
        return [("xq", (rows, K), "int8"), ("xd", (rows, K // 32), "float32")]
    return [("x", (rows, K), "float32")]


def bind_acts(kern: Kern, fmt: Format, rows, K: int) -> None:
    for name, shape, dtype in layout_args(fmt.layout, rows, K):
        setattr(kern, name, T.arg(name, T.buffer(shape, dtype, align=32)))


def declare_tables(kern: Kern, fmt: Format) -> None:
    """The format's tables (`Format.constants`) as stack buffers kern.tables[NAME], written once per call (before
    the parallel loop) from constant vectors of 8 words."""
    for name, dtype, values in fmt.constants():
        buf = T.decl_buffer((len(values),), dtype)
        for i in range(0, len(values), 8):
            T.buffer_store(buf, tirx.Shuffle([const(v, dtype) for v in values[i:i + 8]], list(range(8))),
                           [ramp(i, 8)])
        kern.tables[name] = buf


def zeroed_accs(ns, rows, lanes) -> list:
    """accs[j][r]: the zeroed float32 accumulators (one per entry of `lanes`) of weight row ns[j] and activation
    row rows[r] (tiles._rows)."""
    accs = []
    for _n in ns:
        per = []
        for _ in rows:
            acc = [T.decl_buffer((n_l,), "float32") for n_l in lanes]
            for a, n_l in zip(acc, lanes):
                T.buffer_store(a, const(0.0, "float32", n_l), [ramp(0, n_l)])
            per.append(acc)
        accs.append(per)
    return accs


def views(kern, data, nbytes):
    """Typed views of the weight bytes (f16 scales, u32 words, ...) over the same pointer."""
    kern.w8 = T.decl_buffer((nbytes,), "int8", data=data)
    kern.w16 = T.decl_buffer((nbytes // 2,), "float16", data=data)
    kern.w16u = T.decl_buffer((nbytes // 2,), "uint16", data=data)
    kern.w32 = T.decl_buffer((nbytes // 4,), "uint32", data=data)
    kern.w32f = T.decl_buffer((nbytes // 4,), "float32", data=data)


def concat(vs):
    return vs[0] if len(vs) == 1 else tirx.Shuffle(vs, list(range(sum(v.ty.dtype.lanes for v in vs))))


# LLVM's prefetch locality per Knobs.prefetch_level: 3 = prefetcht0 (into L1), 2 = prefetcht1 (into L2)
PREFETCH_LOCALITY = {1: 3, 2: 2}


def prefetch(kern, n, off, nbytes, ahead=None):
    """Software prefetch of the weight bytes `ahead` (default `kern.prefetch`) ahead of row n's bytes
    [off, off + nbytes), one per 64-byte line, into the cache level `kern.prefetch_level` (Knobs.prefetch_level).
    The rows of a thread's tiles are one contiguous stream, which the hardware prefetcher alone reads well below
    the machine's read bandwidth and 16 KB ahead at about it (bench/quant_gemv.py). Into L2 by default: the weight
    is read once, and 16 KB of it brought into a 32 KB L1 evicts the activation rows every weight row reads again
    (bench/x86_rows.py against prefetcht0; docs/performance.md, "the weight prefetch into L2"). Prefetches past the
    end of the weight do not fault."""
    if not kern.prefetch:
        return
    base = n * kern.row_bytes + off + (kern.prefetch if ahead is None else ahead)
    locality = const(PREFETCH_LOCALITY[kern.prefetch_level], "int32")
    for o in range(0, nbytes, 64):
        T.evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", tirx.address_of(kern.w8[base + o]),
                                         const(0, "int32"), locality, const(1, "int32")))


@contextmanager
def kernel(name: str, fmt: Format, kind: str, lead: tuple, K: int, rows, knobs: Knobs, vnni: bool, weights=("w",)):
    """The prologue of every x86 matmul kernel of format `fmt` (formats.format_of(kind, exact)): the `Kern`, the
    PrimFunc named `name`, the row count Tr (`rows`, or a symbolic T), and the weight arguments `weights` of
    shape `lead` + the row's bytes (or elements). Yields (kern, Tr, [weight args]); the caller binds the other
    arguments and writes the body inside, and finds the PrimFunc in kern.func after the block. kern.n_tiles:
    tiles of `tile_n` rows of the last `lead` dimension."""
    kern = _new(fmt, kind, K, knobs, vnni)
    kern.n_tiles = -(-lead[-1] // knobs.tile_n)
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True, "tirx.is_scheduled": True})
            Tr = tirx.Var("T", "int64") if rows is None else rows
            shape, dtype = weight_arg(fmt, lead, K)
            yield kern, Tr, [T.arg(w, T.buffer(shape, dtype, align=32)) for w in weights]
    kern.func = ib.get()
