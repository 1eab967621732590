"""The codebook formats on the x86 integer path (compiler/lower/x86/codebook.py: IQ2_XXS): what the kernels in
tests/test_x86_kernels.py check for every integer kind (against float64 numpy on gguf-py-dequantized weights at a
32-byte-aligned view, N off the tile, rows bit-identical whatever the row count, with and without VNNI), plus what
is particular to them: the kernel's constant tables against gguf-py's codebook and the ksigns rule, the same bits
at 32- and 64-byte width, and --exact-matmul keeping their float activations (the TE element path)."""
import gguf
import numpy as np
import pytest

from test_x86_kernels import RNG, TARGET, WIDTH, activations, build, random_weight, rel, run

from nextn.compiler.lower import x86
from nextn.compiler.lower.x86 import codebook

pytestmark = [pytest.mark.skipif(WIDTH is None, reason="this CPU has no AVX2"), pytest.mark.e2e]   # builds kernels
KINDS = sorted(codebook.CODEBOOK_FORMATS)


@pytest.mark.parametrize("kind", KINDS)
def test_tables_are_gguf_py_codebook_and_sign_rule(kind):
    """The kernel constants: grid word i's bytes are gguf-py's grid row i (IQ1: 8 (g + 1), no sign table); a sign
    pattern has byte j = -1 exactly where weight j of its group of 8 is negative: for a 7-bit index i
    (ksigns_iq2xs) bit j of i for j < 7 and for j = 7 the parity of i (the count of minus signs is even), for a
    sign byte b (IQ2_S, IQ3_S) bit j of b."""
    fmt = x86.format_of(kind)
    tables = {name: (dtype, values) for name, dtype, values in fmt.constants()}
    dtype, grid = tables["grid"]
    cls = getattr(gguf.quants, kind.upper())
    cls.init_grid()
    want = cls.grid.reshape(len(grid), -1)
    if kind.startswith("iq1"):     # -1 / 0 / 1 as 8 (g + 1): codebook.IQ1S
        assert set(np.unique(want)) == {-1, 0, 1} and set(tables) == {"grid"}
        want = 8 * (want + 1)
    assert np.array_equal(np.array(grid, dtype).view(np.uint8).reshape(want.shape), want.astype(np.uint8))
    if kind.startswith("iq1"):
        return
    name = "signs" if "signs" in tables else "bits"
    pat = np.array(tables[name][1], np.uint64).view(np.int8).reshape(-1, 8)
    assert len(pat) == (128 if name == "signs" else 256)
    for i in range(len(pat)):
        neg = [(i >> j) & 1 for j in range(7)] + [bin(i).count("1") & 1 if name == "signs" else i >> 7]
        assert list(pat[i]) == [-1 if b else 1 for b in neg], i


@pytest.mark.parametrize("kind", KINDS)
def test_same_bits_at_both_widths(kind):
    """One int32 x 8 per block and row at either vector width (two sub-blocks per 64-byte vector, halves added):
    the 32-byte (AVX2) and 64-byte (AVX-512) kernels give the same bits, at 1 and 7 rows, K in chunks."""
    N, K, R = 45, 256 * 17, 7
    w, wf = random_weight(kind, (), N, K)
    acts, xf = activations(kind, RNG.standard_normal((R, K)).astype(np.float32))
    ys = []
    for width in (32, 64):
        knobs = x86.Knobs(width=width, tile_n=16, row_group=8)
        vnni = x86.has_vnni(TARGET, width)
        (y,) = run(build(x86.matmul(kind, N, K, knobs=knobs, vnni=vnni)), w, *acts, outs=[(R, N)])
        (y1,) = run(build(x86.matmul(kind, N, K, rows=1, knobs=knobs, vnni=vnni)), w, *[a[:1] for a in acts],
                    outs=[(1, N)])
        assert rel(y, xf @ wf.T) < 1e-5
        assert np.array_equal(y1[0].view(np.uint32), y[0].view(np.uint32))
        ys.append(y)
    assert np.array_equal(ys[0].view(np.uint32), ys[1].view(np.uint32))


if WIDTH != 64:   # collected only where both widths run (AVX-512BW), as test_x86_kernels.py's 64-byte cases
    del test_same_bits_at_both_widths


@pytest.mark.parametrize("kind", KINDS)
def test_exact_matmul_keeps_float_activations(kind):
    """With quantized activations a codebook matmul goes to the x86 kernel on "q8" rows; under --exact-matmul
    (no quantized activations) it is not taken (the TE element path, float32 activations), as before."""
    from nextn.compiler.ir import Graph
    from nextn.compiler.lower.x86.emit import X86Lowering

    g = Graph("t")
    mm = g.mul_mat(g.weight("w", (64, 512)), g.input("x", ("T", 512), "float32"))
    mid = g.mul_mat_id(g.weight("we", (4, 64, 512)), g.input("xe", ("T", 512), "float32"),
                       g.input("ids", ("T", 2), "int32"))
    assert X86Lowering(WIDTH).handles(mm, kind) and X86Lowering(WIDTH).handles(mid, kind)
    assert not X86Lowering(WIDTH, quantize_activations=False).handles(mm, kind)
    assert not X86Lowering(WIDTH, quantize_activations=False).handles(mid, kind)
    assert x86.KernelSpec("matmul", kind, 64, 512).acts == "q8" and x86.act_layout(kind) == "q8"
    assert not X86Lowering(WIDTH).handles(g.mul_mat(g.weight("w2", (64, 480)), g.input("x2", ("T", 480), "float32")),
                                          kind)    # K not a multiple of 256
