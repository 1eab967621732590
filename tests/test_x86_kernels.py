"""The x86 matmul kernels (compiler/lower/x86) against float64 numpy on gguf-py-dequantized weights.

Shapes are chosen off the kernels' tiles (N not a multiple of the weight tile, row counts not a multiple of the
row group, experts chosen by several rows) and every weight sits at a 32-byte but not 64-byte aligned address,
as a tensor view of a GGUF file may. Integer-path kinds multiply the activation row as quantized by the numpy
statement (`nextn.common.quant.activation`: "q8" rows per 256 for the super-block kinds, "q8_0" rows per 32 for
Q8_0, Q4_0 .. Q5_1, IQ4_NL, MXFP4 and NVFP4), which the quantizer kernels must reproduce bit for bit; the
32-block kinds and NVFP4 are also checked on their float path (--exact-matmul). K is chosen off the 32-block
kernels' steps (13 blocks: full steps of 4 or 8 blocks, then single blocks).
"""
import dataclasses

import gguf
import numpy as np
import pytest
import tvm

from nextn.common.quant import activation
from nextn.compiler.compile import make_target
from nextn.compiler.lower import x86

TARGET = make_target("llvm")
WIDTH = x86.vector_width(TARGET)
pytestmark = pytest.mark.skipif(WIDTH is None, reason="this CPU has no AVX2")   # CI's and this machine's have it
WIDTHS = sorted({32, WIDTH}) if WIDTH else []
F16_FIELDS = {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0],
              "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0], "MXFP4": [],
              "IQ2_XXS": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ2_S": [0], "IQ2_XS": [0], "IQ1_S": [0],
              "IQ1_M": [], "NVFP4": []}     # IQ1_M: its d is the top nibbles of the scale words (random_weight)
RNG = np.random.default_rng(0)


def misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` at an address that is 32 mod 64 (GGUF aligns tensor data to 32 bytes only)."""
    buf = np.empty(a.nbytes + 128, np.uint8)
    off = (-buf.ctypes.data) % 64 + 32
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == 32
    return out


def random_weight(kind: str, lead: tuple, N: int, K: int):
    """(kernel argument, float64 dequantized [*lead, N, K]) for a random weight of `kind`."""
    if kind in ("f16", "bf16", "f32"):
        w = RNG.standard_normal((*lead, N, K)).astype(np.float32)
        if kind == "bf16":
            bits = (w.view(np.uint32) >> 16).astype(np.uint16)
            return misaligned(bits), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        a = w.astype(np.float16 if kind == "f16" else np.float32)
        return misaligned(a), a.astype(np.float64)
    gt = gguf.GGMLQuantizationType[kind.upper()]
    blk, size = gguf.GGML_QUANT_SIZES[gt]
    raw = RNG.integers(0, 256, (int(np.prod(lead, dtype=int)) * N * K // blk, size), dtype=np.uint8)
    for off in F16_FIELDS[kind.upper()]:
        raw[:, off:off + 2] = (RNG.random(len(raw)) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if kind == "iq1_m":   # d f16 = the top nibbles of the four scale words (bytes 48..55)
        d = (RNG.random(len(raw)) * 0.01).astype(np.float16).view(np.uint16)
        sw = raw[:, 48:56].copy().view(np.uint16) & 0x0FFF
        sw |= ((d[:, None] >> (4 * np.arange(4, dtype=np.uint16))) & 0xF) << 12
        raw[:, 48:56] = sw.view(np.uint8)
    if kind == "mxfp4":   # exponent byte e: scale 2^(e - 128), finite products; the subnormal scales e = 0, 1 too
        raw[:, 0] = RNG.integers(110, 135, len(raw))
        raw[:2, 0] = [0, 1]
    if kind == "nvfp4":   # ue4m3 scale bytes: ordinary ones, and the zero codes 0, 0x7F and subnormals 1, 7 too
        raw[:, :4] = RNG.integers(40, 80, (len(raw), 4))
        raw[0, :4] = [0, 0x7F, 1, 7]
    raw = raw.reshape(*lead, N, K // blk * size)
    want = gguf.quants.dequantize(raw.reshape(-1, raw.shape[-1]), gt).astype(np.float64).reshape(*lead, N, K)
    return misaligned(raw), want


def activations(kind: str, x: np.ndarray, exact: bool = False):
    """(kernel activation arguments, the float64 rows they stand for)."""
    acts = x86.activation_rows(kind, x, exact)
    if len(acts) == 1:
        return acts, x.astype(np.float64)
    q = acts[0]
    layout = x86.act_layout(kind, exact)
    order = {"q8_iq4xs": activation.IQ4XS_ORDER, "q8_0_g8": activation.IQ4XS_ORDER,
             "q8_q4k": activation.Q4K_ORDER}.get(layout)
    if order is not None:   # back to element order: q[..., order] per 256 is the layout
        g = q.shape[-1] // 256
        q = q.copy()
        blocks = q[..., :256 * g].reshape(*q.shape[:-1], g, 256)
        nat = np.empty_like(blocks)
        nat[..., order] = blocks
        q[..., :256 * g] = nat.reshape(*q.shape[:-1], 256 * g)
    return acts, activation.dequantize_blocks(q, acts[1])


def build(func):
    return tvm.compile(tvm.IRModule({"main": func}), target=TARGET).mod["main"]


def run(fn, *args, outs):
    # weights go in as they are (32-byte aligned views); anything else in TVM's own (64-byte aligned) memory
    ts = [a if a.ctypes.data % 64 == 32 else tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args]
    res = [tvm.runtime.tensor(np.zeros(s, np.float32)) for s in outs]
    fn(*ts, *res)
    return [r.numpy() for r in res]


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def k_of(kind: str, exact: bool) -> int:
    if kind == "nvfp4":   # whole 64-weight blocks: 6 float-path blocks of 32
        return 192
    return 96 if exact else 512 if x86.format_of(kind).block == 256 else 416


# (kind, float path): the integer path of every integer kind, the float path of every float kind
PATHS = [(kind, False) for kind in sorted(x86.INT_KINDS)] + [(kind, True) for kind in sorted(x86.FLOAT_KINDS)]
PATH_IDS = [f"{k}-{'float' if e else 'int'}" for k, e in PATHS]


@pytest.mark.e2e
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind,exact", PATHS, ids=PATH_IDS)
def test_matmul(kind, exact, width):
    N, K = 100, k_of(kind, exact)             # N not a multiple of the weight tile (16)
    w, wf = random_weight(kind, (), N, K)
    knobs = x86.Knobs(width=width, tile_n=16, row_group=4)
    fn = build(x86.matmul(kind, N, K, knobs=knobs, exact=exact))
    one = build(x86.matmul(kind, N, K, rows=1, knobs=knobs, exact=exact))   # the one-row kernel of the decode step
    x = RNG.standard_normal((6, K)).astype(np.float32)         # a group of 4 rows, then 2 on their own
    acts, xf = activations(kind, x, exact)
    (y,) = run(fn, w, *acts, outs=[(6, N)])
    assert rel(y, xf @ wf.T) < 1e-5
    for t in range(6):                                         # every row equals its own one-row call, bitwise
        (y1,) = run(one, w, *[a[t:t + 1] for a in acts], outs=[(1, N)])
        assert np.array_equal(y1[0].view(np.uint32), y[t].view(np.uint32)), t


@pytest.mark.parametrize("shared_x", [True, False], ids=["shared-x", "per-slot-x"])
@pytest.mark.parametrize("kind,exact", [p for p in PATHS if p[0] not in ("f32", "bf16")],
                         ids=[i for p, i in zip(PATHS, PATH_IDS) if p[0] not in ("f32", "bf16")])
@pytest.mark.e2e
def test_matmul_id(kind, exact, shared_x):
    X, N, K, U, T = 16, 72, k_of(kind, exact), 4, 5
    (w0, wf0), (w1, wf1) = random_weight(kind, (X,), N, K), random_weight(kind, (X,), N, K)
    ids = np.stack([RNG.permutation(X)[:U] for _ in range(T)]).astype(np.int32)
    ids[3] = ids[0][::-1]                      # experts chosen by several rows, in other slots
    ids[4, :2] = ids[1, :2]
    x = RNG.standard_normal((T if shared_x else T * U, K)).astype(np.float32)
    acts, xf = activations(kind, x, exact)
    knobs = x86.Knobs(width=WIDTH, tile_n=16, row_group=2)
    fn = build(x86.matmul_id(kind, X, N, K, U, shared_x, n_weights=2, knobs=knobs, exact=exact))
    y0, y1 = run(fn, w0, w1, *acts, ids, outs=[(T, U, N)] * 2)
    for y, wf in ((y0, wf0), (y1, wf1)):
        want = np.stack([[wf[ids[t, j]] @ xf[t if shared_x else t * U + j] for j in range(U)] for t in range(T)])
        assert rel(y, want) < 1e-5
    one = build(x86.matmul_id(kind, X, N, K, U, shared_x, n_weights=2, rows=1, knobs=knobs, exact=exact))
    for t in range(T):                         # each row alone gives the same bits as in the batch
        rows = slice(t, t + 1) if shared_x else slice(t * U, (t + 1) * U)
        a0, a1 = run(one, w0, w1, *[a[rows] for a in acts], ids[t:t + 1], outs=[(1, U, N)] * 2)
        assert np.array_equal(a0[0].view(np.uint32), y0[t].view(np.uint32))
        assert np.array_equal(a1[0].view(np.uint32), y1[t].view(np.uint32))


@pytest.mark.parametrize("kind,exact", [("q3_k", False), ("q4_k", False), ("q6_k", False), ("iq4_xs", False),
                                        ("q8_0", False), ("q8_0", True), ("f16", True), ("iq2_xxs", False),
                                        ("nvfp4", False)],
                         ids=["q3_k-int", "q4_k-int", "q6_k-int", "iq4_xs-int", "q8_0-int", "q8_0-float", "f16-float",
                              "iq2_xxs-int", "nvfp4-int"])
@pytest.mark.e2e
def test_every_tuned_knob_keeps_the_row_bits(kind, exact):
    """`nextn tune` searches the decode (one-row) and verify (row-count) kernels of a weight apart, so no knob it
    may set can change a row's bits (speculation stays lossless): every value of every knob of the search space
    (compiler/tune/knobs.space, one knob at a time off the default), in both kernels, gives each row the default
    one-row kernel's bits. The knobs that would (x86.bit_knobs: width, the float path's unroll) are not in it."""
    from nextn.compiler.tune import knobs as kn

    N, K, R = 37, k_of(kind, exact) + (256 if x86.format_of(kind, exact).block == 32 else 0), 5
    w, _ = random_weight(kind, (), N, K)
    x = RNG.standard_normal((R, K)).astype(np.float32)
    acts, _ = activations(kind, x, exact)

    def rows_of(spec, knobs):
        fn = build(spec.build(knobs, x86.has_vnni(TARGET, knobs.width)))
        if spec.rows is None:
            return run(fn, w, *acts, outs=[(R, N)])[0]
        return np.concatenate([run(fn, w, *[a[t:t + 1] for a in acts], outs=[(1, N)])[0] for t in range(R)])

    one = x86.KernelSpec("matmul", kind, N, K, 1, exact=exact)
    want = rows_of(one, x86.default_knobs(one, WIDTH)).view(np.uint32)
    tried = 0
    for spec in (one, x86.KernelSpec("matmul", kind, N, K, None, exact=exact)):
        default = x86.default_knobs(spec, WIDTH)
        for field, values in kn.space(spec, WIDTH).items():
            for v in values:
                if v != getattr(default, field) or spec.rows is None and field == "width":
                    knobs = dataclasses.replace(default, **{field: v})
                    assert np.array_equal(rows_of(spec, knobs).view(np.uint32), want), (spec.key, field, v)
                    tried += 1
    assert tried >= 5


NO_VNNI = tvm.target.Target({"kind": "llvm", "mcpu": str(TARGET.attrs["mcpu"]),
                              "mattr": [*map(str, TARGET.attrs.get("mattr", [])), "-avx512vnni", "-avxvnni"]})
VNNI_WIDTHS = [w for w in WIDTHS if x86.has_vnni(TARGET, w)]


@pytest.mark.e2e
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", sorted(x86.INT_KINDS))
def test_int_row_groups_and_vnni(kind, width):
    """15 rows through a row group of 8 (then 4 and 3: rows in pairs and one alone on VNNI; N off the tile; K in
    chunks for the 8): against numpy,
    every row bitwise equal to its one-row call, and the same bits from a target without VNNI (no vpdpwssd /
    vpdpbusd)."""
    # K: 17 blocks of 256, past L1 for the group of 8 (tiles: chunks of 8, 8, 1); for the 32-block kinds 3 blocks
    # after the groups of 8 too (IQ4_NL / MXFP4: chunked groups, then single blocks)
    N, K, R = 37, 256 * 17 + (96 if x86.format_of(kind).block == 32 else 0), 15
    w, wf = random_weight(kind, (), N, K)
    knobs = x86.Knobs(width=width, tile_n=8, row_group=8)
    x = RNG.standard_normal((R, K)).astype(np.float32)
    acts, xf = activations(kind, x)
    vnni = x86.has_vnni(TARGET, width)
    (y,) = run(build(x86.matmul(kind, N, K, knobs=knobs, vnni=vnni)), w, *acts, outs=[(R, N)])
    assert rel(y, xf @ wf.T) < 1e-5
    one = build(x86.matmul(kind, N, K, rows=1, knobs=knobs, vnni=vnni))
    for t in range(R):
        (y1,) = run(one, w, *[a[t:t + 1] for a in acts], outs=[(1, N)])
        assert np.array_equal(y1[0].view(np.uint32), y[t].view(np.uint32)), t
    plain = tvm.compile(tvm.IRModule({"main": x86.matmul(kind, N, K, knobs=knobs)}), target=NO_VNNI).mod["main"]
    (y2,) = run(plain, w, *acts, outs=[(R, N)])
    assert np.array_equal(y2.view(np.uint32), y.view(np.uint32))


@pytest.mark.e2e
@pytest.mark.parametrize("kind,units", [("q8_0", 40), ("q4_k", 72)])
def test_fit_kb_reads_k_whole_or_in_chunks_with_the_same_bits(kind, units):
    """Knobs.fit_kb: 2 rows whose int8 activations pass 32 KB and fit 48 KB go through K in chunks of 16 KB at
    fit_kb 32 and K whole at 48 (tiles.py); N = 37 off the tile, the weight at 32 mod 64 bytes (a GGUF view), Q8_0
    with 3 blocks after its groups of 8: against numpy, and both rows bitwise equal to the one-row decode kernel's
    (which reads K whole) at either value."""
    fmt = x86.format_of(kind)
    K = 256 * units + (96 if fmt.block == 32 else 0)
    assert 32 << 10 < 2 * units * fmt.unit_bytes <= 48 << 10     # the two paths, not one
    N, R = 37, 2
    w, wf = random_weight(kind, (), N, K)
    vnni = x86.has_vnni(TARGET, WIDTH)
    acts, xf = activations(kind, RNG.standard_normal((R, K)).astype(np.float32))
    one = build(x86.matmul(kind, N, K, rows=1, knobs=x86.Knobs(width=WIDTH), vnni=vnni))
    want = np.concatenate([run(one, w, *[a[t:t + 1] for a in acts], outs=[(1, N)])[0] for t in range(R)])
    assert rel(want, xf @ wf.T) < 1e-5
    for fit in (32, 48):
        knobs = x86.Knobs(width=WIDTH, fit_kb=fit)
        (y,) = run(build(x86.matmul(kind, N, K, knobs=knobs, vnni=vnni)), w, *acts, outs=[(R, N)])
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), fit


def test_fit_kb_default_is_the_targets_l1():
    """x86.default_knobs' fit_kb is the target CPU's L1 data cache (x86.l1d_kb, by LLVM CPU name): 48 KB on
    Sapphire / Emerald Rapids and Zen 5, 32 KB on Zen 4, Skylake-X and a target that names no CPU; twice that at
    32-byte width (AVX2)."""
    def cpu(mcpu):
        return tvm.target.Target({"kind": "llvm", "mcpu": mcpu})

    assert [x86.l1d_kb(cpu(c)) for c in ("sapphirerapids", "emeraldrapids", "znver5", "znver4", "skylake-avx512")] \
        == [48, 48, 48, 32, 32]
    assert x86.l1d_kb(tvm.target.Target("llvm")) == 32 and x86.l1d_kb(None) == 32
    spec = x86.KernelSpec("matmul", "q8_0", 4096, 10944, None)
    assert x86.default_knobs(spec, 64, x86.l1d_kb(cpu("emeraldrapids"))).fit_kb == 48
    assert x86.default_knobs(spec, 64).fit_kb == 32
    assert x86.default_knobs(spec, 32).fit_kb == 64 and x86.default_knobs(spec, 32, 48).fit_kb == 96


LANE_KINDS = sorted(k for k in x86.INT_KINDS if x86.format_of(k).path.multi_row)   # IQ4_XS, the K-quants, Q8_0, ..


@pytest.mark.e2e
@pytest.mark.parametrize("w_rows,tile_n", [(2, 8), (4, 6)], ids=["w2-tile8", "w4-tile6"])
@pytest.mark.parametrize("kind", LANE_KINDS)
def test_weight_row_blocks(kind, w_rows, tile_n):
    """Weight rows in register blocks (Knobs.w_rows; IQ4_XS, the K-quants, the grouped 32-block formats): N = 37 off
    the tile and the block (the last tile's rows one at a time; tile_n 6 leaves 2 rows a block of 4 does not cover),
    15 rows (groups of 8, 4, 3: the K-quants' 3 as a pair and a cross pair), K in chunks for the 8 and whole for the
    others, and a routed-experts kernel: against numpy, and every row bitwise equal to the one-row kernel without
    blocks (the decode step's)."""
    N, K, R = 37, 256 * 17 + (96 if x86.format_of(kind).block == 32 else 0), 15
    w, wf = random_weight(kind, (), N, K)
    vnni = x86.has_vnni(TARGET, WIDTH)
    knobs = x86.Knobs(width=WIDTH, tile_n=tile_n, row_group=8, w_rows=w_rows)
    x = RNG.standard_normal((R, K)).astype(np.float32)
    acts, xf = activations(kind, x)
    (y,) = run(build(x86.matmul(kind, N, K, knobs=knobs, vnni=vnni)), w, *acts, outs=[(R, N)])
    assert rel(y, xf @ wf.T) < 1e-5
    one = build(x86.matmul(kind, N, K, rows=1, knobs=x86.Knobs(width=WIDTH), vnni=vnni))
    for t in range(R):
        (y1,) = run(one, w, *[a[t:t + 1] for a in acts], outs=[(1, N)])
        assert np.array_equal(y1[0].view(np.uint32), y[t].view(np.uint32)), t
    X, U, T = 4, 2, 5
    K = 416 if x86.format_of(kind).block == 32 else 512
    we, wef = random_weight(kind, (X,), N, K)
    ids = np.array([[0, 1], [1, 3], [3, 0], [1, 2], [0, 1]], np.int32)
    acts, xf = activations(kind, RNG.standard_normal((T, K)).astype(np.float32))
    fn = build(x86.matmul_id(kind, X, N, K, U, True, knobs=knobs, vnni=vnni))
    (y,) = run(fn, we, *acts, ids, outs=[(T, U, N)])
    assert rel(y, np.stack([[wef[ids[t, j]] @ xf[t] for j in range(U)] for t in range(T)])) < 1e-5
    one = build(x86.matmul_id(kind, X, N, K, U, True, rows=1, knobs=x86.Knobs(width=WIDTH), vnni=vnni))
    for t in range(T):
        (y1,) = run(one, we, *[a[t:t + 1] for a in acts], ids[t:t + 1], outs=[(1, U, N)])
        assert np.array_equal(y1[0].view(np.uint32), y[t].view(np.uint32)), t


@pytest.mark.e2e
@pytest.mark.parametrize("kind,exact", PATHS, ids=PATH_IDS)
def test_verify_rows(kind, exact):
    """A verify of 1..8 rows (n_max up to 7) through the row-count kernel with the knobs compile gives it
    (x86.default_knobs: row_group 8, so each count is one row group, tiles.group_sizes; the K-quants' and IQ4_XS's
    two weight rows per register block at 64 bytes with an odd row as a cross pair, kquant.kquant_rows), N = 37 off
    the tile and off the block: against float64 numpy, and every row bitwise equal to the one-row decode kernel's
    (lossless speculation), K whole and, at fit_kb 32, K long enough that the larger groups of the integer paths
    go through it in chunks (the 256-blocks from 8 rows, Q8_0 .. MXFP4 and NVFP4 from 5, tiles._int_tile_chunked)."""
    N = 37
    fmt = x86.format_of(kind, exact)
    vnni = x86.has_vnni(TARGET, WIDTH)
    long_k = 6400 if fmt.block == 64 else 256 * 17 + (96 if fmt.block == 32 else 0)   # NVFP4: 100 blocks of 64
    for K in (k_of(kind, exact),) + ((long_k,) if fmt.acts != "f32" else ()):
        w, wf = random_weight(kind, (), N, K)
        spec = x86.KernelSpec("matmul", kind, N, K, None, exact=exact)
        knobs = dataclasses.replace(x86.default_knobs(spec, WIDTH), fit_kb=32)
        assert knobs.row_group >= 8
        ver = build(spec.build(knobs, x86.has_vnni(TARGET, knobs.width)))
        one = x86.KernelSpec("matmul", kind, N, K, 1, exact=exact)
        knobs1 = x86.default_knobs(one, WIDTH)
        dec = build(one.build(knobs1, x86.has_vnni(TARGET, knobs1.width)))
        for R in range(1, 9):
            acts, xf = activations(kind, RNG.standard_normal((R, K)).astype(np.float32), exact)
            (y,) = run(ver, w, *acts, outs=[(R, N)])
            assert rel(y, xf @ wf.T) < 1e-5, (K, R)
            for t in range(R):
                (y1,) = run(dec, w, *[a[t:t + 1] for a in acts], outs=[(1, N)])
                assert np.array_equal(y1[0].view(np.uint32), y[t].view(np.uint32)), (K, R, t)


def test_group_sizes_take_a_verify_in_one_group():
    """tiles.group_sizes: every row count up to 8 (a verify at n_max 1..7) is one group of the default row_group,
    so each weight block is decoded once per call; larger counts go in groups of 8, then one group of the rest;
    a smaller row_group (a tuning log's 2 or 4) keeps its own size as the largest."""
    from nextn.compiler.lower.x86.tiles import group_sizes

    def split(T, group):        # the loop nest of tiles.tile: greedy, largest first
        out = []
        for size in group_sizes(group):
            out += [size] * (T // size)
            T %= size
        assert T == 0
        return out

    assert [split(T, x86.Knobs().row_group) for T in range(1, 9)] == [[T] for T in range(1, 9)]
    assert split(13, 8) == [8, 5] and split(24, 8) == [8, 8, 8]
    assert split(7, 4) == [4, 3] and split(5, 2) == [2, 2, 1] and group_sizes(1) == [1]


def _dot_kernel(width, scaled, vnni, n):
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script import builder as T

    from nextn.compiler.lower.x86 import vec

    L = width // 4
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("dot")
            T.func_attr({"global_symbol": "dot", "tirx.noalias": True})
            w = T.arg("w", T.buffer((n * width,), "uint8"))
            x = T.arg("x", T.buffer((n * width,), "int8"))
            sc = T.arg("sc", T.buffer((n * width // 2,), "int16"))
            y = T.arg("y", T.buffer((L,), "int32"))
            acc = None
            for i in range(n):
                acc = vec.dot_u8s8(acc, w[vec.ramp(i * width, width)], x[vec.ramp(i * width, width)], width,
                                   sc[vec.ramp(i * width // 2, width // 2)] if scaled else None, vnni)
            T.buffer_store(y, acc, [vec.ramp(0, L)])
    return build(ib.get())


@pytest.mark.e2e
@pytest.mark.parametrize("scaled", [True, False], ids=["scaled", "plain"])
@pytest.mark.parametrize("width,vnni", [(w, False) for w in WIDTHS] + [(w, True) for w in VNNI_WIDTHS])
def test_dot_u8s8_matches_numpy(width, vnni, scaled):
    """The integer multiply-accumulate primitive, lane by lane, at the extremes its callers allow (|pair| < 2^15)."""
    n = 3
    w = RNG.integers(0, 128, n * width, dtype=np.uint8)
    x = RNG.integers(-127, 128, n * width).astype(np.int8)
    w[:8], x[:8] = 127, -127                                  # the largest pairs: 2 * 127 * 127 < 2^15
    sc = RNG.integers(-64, 64, n * width // 2).astype(np.int16)
    fn = _dot_kernel(width, scaled, vnni, n)
    got = tvm.runtime.empty((width // 4,), "int32")
    fn(*[tvm.runtime.tensor(a) for a in (w, x, sc)], got)
    prod = w.astype(np.int64) * x.astype(np.int64)
    pairs = prod.reshape(n, width // 2, 2).sum(-1)
    if scaled:
        pairs = pairs * sc.reshape(n, width // 2)
    want = pairs.reshape(n, width // 4, 2).sum(-1).sum(0)
    assert np.array_equal(got.numpy(), want)


def _quantizer_rows(K: int, block: int) -> np.ndarray:
    """5 activation rows of K values with the quantizer's edge cases in their first `block` (one scale's values)."""
    x = RNG.standard_normal((5, K)).astype(np.float32)
    x[1, :block] = 0.0                                            # a block of zeros: d = 0, q = 0
    x[2, 7] = 1e4                                                 # one large value in a block
    b = np.abs(x[3, :block]).max()
    x[3, :block] = np.round(x[3, :block] / b * 127 * 2) / 2 * b / 127   # many values at exact halves after scaling
    return x


@pytest.mark.e2e
def test_quantizer_matches_the_numpy_statement():
    K = 1024
    x = _quantizer_rows(K, 256)
    fn = build(x86.quantize_rows(K))
    got = [tvm.runtime.empty(s, d) for s, d in [((5, K), "int8"), ((5, K // 256), "float32"), ((5, K // 16), "int16")]]
    fn(tvm.runtime.tensor(x), *got)
    for g, w in zip(got, activation.quantize(x)):
        assert np.array_equal(g.numpy(), w)


def _compiled_quantizer_gives(x, row_format, want):
    """The compiled quantizer of `row_format` (x86.quantize_rows) on rows x gives the arrays `want` exactly."""
    fn = build(x86.quantize_rows(x.shape[1], row_format=row_format))
    got = [tvm.runtime.empty(w.shape, str(w.dtype)) for w in want]
    fn(tvm.runtime.tensor(x), *got)
    for g, w in zip(got, want):
        assert np.array_equal(g.numpy(), w)


@pytest.mark.e2e
def test_iq4xs_quantizer_matches_the_numpy_statement():
    """IQ4_XS's rows ("q8_iq4xs"): the "q8" values in IQ4XS_ORDER and the lane offsets xc, against the kernel and
    against a loop over the statement; each int32 lane of a block's four vectors holds one sub-block."""
    K = 768
    x = RNG.standard_normal((4, K)).astype(np.float32)
    x[1, :256] = 0.0
    x[2, 300] = 1e4
    want = activation.quantize_iq4xs(x)
    _compiled_quantizer_gives(x, "q8_iq4xs", want)
    q, d, _ = activation.quantize(x)
    assert np.array_equal(want[1], d)
    order = activation.IQ4XS_ORDER
    for t in range(4):
        for b in range(K // 256):
            blk = q[t, 256 * b:256 * b + 256]
            for p in range(256):
                assert want[0][t, 256 * b + p] == blk[order[p]]
            for lane in range(16):
                pos = [64 * c + 4 * lane + e for c in range(4) for e in range(4)]
                assert {int(order[p]) // 32 for p in pos} == {lane // 4 + 4 * (lane % 4 // 2)}
                assert want[2][t, 16 * b + lane] == -128 * sum(int(blk[order[p]]) for p in pos)


@pytest.mark.e2e
def test_q4k_quantizer_matches_the_numpy_statement():
    """Q4_K / Q5_K's rows ("q8_q4k"): the "q8" values with each 128's sub-blocks of 32 in the order 0, 2, 1, 3 and
    the sums over 16 in element order, against the kernel and against the statement written out by hand."""
    K = 768
    x = RNG.standard_normal((3, K)).astype(np.float32)
    x[1, 256:512] = 0.0
    want = activation.quantize_q4k(x)
    _compiled_quantizer_gives(x, "q8_q4k", want)
    q, d, xs = activation.quantize(x)
    assert np.array_equal(want[1], d) and np.array_equal(want[2], xs)
    for b in range(K // 256):
        for h in range(2):
            at = 256 * b + 128 * h
            for r, sub in enumerate((0, 2, 1, 3)):
                assert np.array_equal(want[0][:, at + 32 * r:at + 32 * r + 32], q[:, at + 32 * sub:at + 32 * sub + 32])


@pytest.mark.e2e
def test_q8_0_g8_quantizer_matches_the_numpy_statement():
    """IQ4_NL / MXFP4's rows ("q8_0_g8"): full groups of 8 blocks in IQ4XS_ORDER with each lane's d and offset,
    the blocks after them as "q8_0" has them; against the kernel and against a loop over the statement."""
    K = 32 * 21                                                   # 2 groups of 8 blocks, then 5 blocks
    x = RNG.standard_normal((3, K)).astype(np.float32)
    x[1, 32:64] = 0.0
    fn = build(x86.quantize_rows(K, row_format="q8_0_g8"))
    got = [tvm.runtime.empty(s, d) for s, d in [((3, K), "int8"), ((3, K // 32), "float32"), ((3, 32), "float32"),
                                                 ((3, 32), "int32")]]
    fn(tvm.runtime.tensor(x), *got)
    want = activation.quantize_q8_0_g8(x)
    for g, w in zip(got, want):
        assert np.array_equal(g.numpy(), w)
    q, d = activation.quantize_q8_0(x)
    order = activation.IQ4XS_ORDER
    assert np.array_equal(want[1], d) and np.array_equal(want[0][:, 512:], q[:, 512:])
    for t in range(3):
        for g in range(2):
            for p in range(256):
                assert want[0][t, 256 * g + p] == q[t, 256 * g + order[p]]
            for lane in range(16):
                b = lane // 4 + 4 * (lane % 4 // 2)
                pos = [256 * g + 64 * c + 4 * lane + e for c in range(4) for e in range(4)]
                assert want[2][t, 16 * g + lane] == d[t, 8 * g + b]
                assert want[3][t, 16 * g + lane] == -128 * sum(int(want[0][t, p]) for p in pos)


@pytest.mark.e2e
def test_q8_0_quantizer_matches_the_numpy_statement():
    K = 32 * 13
    x = _quantizer_rows(K, 32)
    fn = build(x86.quantize_rows_q8_0(K))
    got = [tvm.runtime.empty(s, d) for s, d in [((5, K), "int8"), ((5, K // 32), "float32")]]
    fn(tvm.runtime.tensor(x), *got)
    want = activation.quantize_q8_0(x)
    for g, w in zip(got, want):
        assert np.array_equal(g.numpy(), w)
    # the statement itself: per 32 values, q = round-half-even(x * 127 / amax) and d = amax / 127
    blk = x[3, :32]
    amax = np.float32(np.abs(blk).max())
    assert want[1][3, 0] == amax / np.float32(127)
    assert np.array_equal(want[0][3, :32], np.rint(blk * (np.float32(127) / amax)).astype(np.int8))
    assert (want[0][1, :32] == 0).all() and want[1][1, 0] == 0


@pytest.mark.e2e
@pytest.mark.parametrize("kind,exact", PATHS, ids=PATH_IDS)
def test_matmul_heads(kind, exact):
    """Per-head weights (absorbed MLA's attn_k_b / attn_v_b: w [H, N, K], x [T, H, K] -> [T, H, N]) against
    float64 numpy on the rows the kernel was given; each row alone (the decode step's static one-row kernel)
    gives the batch's bits."""
    H, N, K, Tn = 3, 40, k_of(kind, exact), 6          # N off the tile, T = a group of 4 + 2
    w, wf = random_weight(kind, (H,), N, K)
    x = RNG.standard_normal((Tn * H, K)).astype(np.float32)      # row t * H + h is x[t, h]
    acts, xf = activations(kind, x, exact)
    knobs = x86.Knobs(width=WIDTH, tile_n=16, row_group=4)
    (y,) = run(build(x86.matmul_heads(kind, H, N, K, knobs=knobs, exact=exact)), w, *acts, outs=[(Tn, H, N)])
    assert rel(y, np.einsum("hnk,thk->thn", wf, xf.reshape(Tn, H, K))) < 1e-5
    one = build(x86.matmul_heads(kind, H, N, K, rows=1, knobs=knobs, exact=exact))
    for t in range(Tn):
        (y1,) = run(one, w, *[a[t * H:(t + 1) * H] for a in acts], outs=[(1, H, N)])
        assert np.array_equal(y1[0].view(np.uint32), y[t].view(np.uint32)), t


@pytest.mark.parametrize("kind,acts,layout,k_off", [("q2_k", "q8", "q8", 480), ("q3_k", "q8", "q8", 480),
                                                   ("q4_0", "q8_0", "q8_0_g8", 200), ("q4_1", "q8_0", "q8_0_g8", 200),
                                                   ("q5_0", "q8_0", "q8_0_g8", 200), ("q5_1", "q8_0", "q8_0_g8", 200)])
def test_q2_k_q3_k_legacy_take_int8_rows_unless_exact_matmul(kind, acts, layout, k_off):
    """Q2_K and Q3_K matmuls (dense and routed) go to the x86 K-quant kernels on "q8" rows in element order, Q4_0,
    Q4_1, Q5_0 and Q5_1's to the 32-block kernels on "q8_0" rows (in groups of 8 blocks: "q8_0_g8"), when the
    artifact quantizes activations (their manifest "activation" is nextn.common.quant's); under --exact-matmul
    they keep the TE element path (float32 activations), and so does a K the blocks do not divide."""
    from nextn.common.quant import FORMATS
    from nextn.compiler.ir import Graph
    from nextn.compiler.lower.x86.emit import X86Lowering

    g = Graph("t")
    mm = g.mul_mat(g.weight("w", (64, 512)), g.input("x", ("T", 512), "float32"))
    mid = g.mul_mat_id(g.weight("we", (4, 64, 512)), g.input("xe", ("T", 512), "float32"),
                       g.input("ids", ("T", 2), "int32"))
    assert X86Lowering(WIDTH).handles(mm, kind) and X86Lowering(WIDTH).handles(mid, kind)
    assert not X86Lowering(WIDTH, quantize_activations=False).handles(mm, kind)
    assert not X86Lowering(WIDTH, quantize_activations=False).handles(mid, kind)
    off = g.mul_mat(g.weight("w2", (64, k_off)), g.input("x2", ("T", k_off), "float32"))    # K off the block
    assert not X86Lowering(WIDTH).handles(off, kind)
    assert x86.KernelSpec("matmul", kind, 64, 512).acts == acts == FORMATS[kind].activation
    assert x86.act_layout(kind) == layout


def test_nvfp4_takes_q8_0_rows_unless_exact_matmul():
    """NVFP4 matmuls (dense and routed) go to the integer kernel on "q8_0" rows in element order (x86/nvfp4.py; the
    manifest's "activation" is nextn.common.quant's) when the artifact quantizes activations, to the float kernel
    (float32 rows) under --exact-matmul."""
    from nextn.common.quant import FORMATS
    from nextn.compiler.ir import Graph
    from nextn.compiler.lower.x86.emit import X86Lowering

    g = Graph("t")
    mm = g.mul_mat(g.weight("w", (64, 512)), g.input("x", ("T", 512), "float32"))
    mid = g.mul_mat_id(g.weight("we", (4, 64, 512)), g.input("xe", ("T", 512), "float32"),
                       g.input("ids", ("T", 2), "int32"))
    for low, exact in ((X86Lowering(WIDTH), False), (X86Lowering(WIDTH, quantize_activations=False), True)):
        assert low.handles(mm, "nvfp4") and low.handles(mid, "nvfp4") and low._exact("nvfp4", 512) == exact
    assert x86.KernelSpec("matmul", "nvfp4", 64, 512).acts == "q8_0" == FORMATS["nvfp4"].activation
    assert x86.act_layout("nvfp4") == "q8_0" and x86.act_layout("nvfp4", exact=True) == "f32"
    assert x86.KernelSpec("matmul", "nvfp4", 64, 512, exact=True).acts == "f32"


def test_matmul_heads_routing_and_key():
    """A 3-D mul_mat weight with x [T, H, K] goes to the per-head kernel; other x ranks and integer kinds whose K
    the blocks do not divide keep the TE element path."""
    from nextn.compiler.ir import Graph
    from nextn.compiler.lower.x86.emit import X86Lowering

    g = Graph("t")
    w = g.weight("w", (4, 64, 96))
    low = X86Lowering(WIDTH)
    assert low.handles(g.mul_mat(w, g.input("x", ("T", 4, 96), "float32")), "q8_0")
    assert not low.handles(g.mul_mat(w, g.input("x4", (2, "T", 4, 96), "float32")), "q8_0")   # other ranks
    assert not low.handles(g.mul_mat(w, g.input("xq", ("T", 4, 96), "float32")), "q4_k")      # K not a 256 block
    spec = x86.KernelSpec("matmul_heads", "q4_k", 40, 512, None, X=3)
    assert spec.key == "x86.matmul_heads:q4_k/q8:N40:K512:rowsT:H3"
    assert spec.weight_bytes() == 3 * 40 * 2 * 144


@pytest.mark.e2e
def test_prefetch_level():
    """Knobs.prefetch_level picks the prefetch instruction (1: prefetcht0 into L1, 2: prefetcht1 into L2) and
    nothing else: the same bits either way; the default puts it in L2, for the routed experts with one activation
    row per slot too (x86.default_knobs)."""
    N, K, R = 37, 416, 3
    w, wf = random_weight("q8_0", (), N, K)
    acts, xf = activations("q8_0", RNG.standard_normal((R, K)).astype(np.float32))
    ys = {}
    for level, insn in ((1, "prefetcht0"), (2, "prefetcht1")):
        knobs = x86.Knobs(width=WIDTH, prefetch_level=level)
        lib = tvm.compile(tvm.IRModule({"main": x86.matmul("q8_0", N, K, knobs=knobs)}), target=TARGET)
        asm = lib.mod.inspect_source("asm")
        other = "prefetcht1" if level == 1 else "prefetcht0"
        assert insn in asm and other not in asm
        (ys[level],) = run(lib.mod["main"], w, *acts, outs=[(R, N)])
    assert rel(ys[2], xf @ wf.T) < 1e-5
    assert np.array_equal(ys[1].view(np.uint32), ys[2].view(np.uint32))
    spec = lambda shared: x86.KernelSpec("matmul_id", "q8_0", N, K, None, 4, 2, shared)   # noqa: E731
    assert x86.default_knobs(spec(False), WIDTH).prefetch_level == 2
    assert x86.default_knobs(spec(True), WIDTH).prefetch_level == 2
    assert x86.default_knobs(x86.KernelSpec("matmul", "q4_k", N, 512), WIDTH).prefetch_level == 2
