"""Prefill's tensor-core matmuls (compiler/lower/cuda/mma.py), checked without a GPU.

- The kernel's "gpu-emulated" build (the same loops with serial threads, its `mma.sync` computed from the PTX
  fragment layouts) on llvm, for every format it takes: against float64 numpy of the quantized-activation product
  on gguf-py-dequantized weights within 1e-5 of max |y| (as tests/test_cuda_int8.py holds the integer definitions),
  and bit for bit against the integer definition `int8.mul_mat` where that sums its groups in k order too (every
  group term is the same float32 expression of the same int32 sums). T = 1, 5, 70 rows and N = 70 weight rows: one
  or two 64-row tiles, a partial weight tile; K in whole stages of 128, 64 or 32 quants, groups of 32 or 16 quants.
- Its CUDA builds (sm_80, sm_90, sm_120): int8 `mma.sync` m16n8k32 (m16n8k16 for groups of 16 quants), 8 per word
  group, fragments in registers (no local memory), blocks of 128 threads over 64 x 64 tiles, the weight's words as
  32-bit or 16-bit loads where aligned.
- The expert sort (`expert_tiles`) against numpy's stable argsort, and the routed-expert tiles against float64
  numpy: experts chosen by more than a tile's 64 pairs, shared rows and a row per pair.
- The runtime's routing: calls of fewer than MIN_ROWS rows take the entry's GEMV copy (glm4moe Q8_0 and the quants/
  IQ3_XXS file, whose codebook matmuls take the tiles with their grid and sign tables).
- Whole fixture: the prefill and mtp_rows entries of tiny glm4moe Q4_K_M / Q8_0 call it for their quantized
  matmuls; verify and decode keep the GEMV (so their rows still agree bit for bit).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from conftest import FIXTURES
from nextn.common.compare import rel_err
from nextn.common.quant import by_ggml_type
from nextn.compiler.lower.cuda import int8, mma
from test_cuda_int8 import INT, _quantize, _quantizer, _x, _x_prime
from test_cuda_kernels import _data, _module, _run, _weight

pytestmark = pytest.mark.e2e   # builds kernels (llvm; CUDA with nvcc)

I64 = "int64"
N = 70
TAKEN = [t for t in INT if mma.fits(by_ggml_type(t).kind, 768 if by_ggml_type(t).block == 256 else 352)]
# (ttype, K): stages of 32 (352 = 11 blocks), 128 (768), 64 (320); Q8_0 at 1536 takes groups of 16 quants
CASES = [(t, 768 if by_ggml_type(t).block == 256 else 320 if t == "NVFP4" else 352) for t in TAKEN] + \
    [("Q8_0", 320), ("Q8_0", 1536)]


def test_taken_formats():
    """Every integer-route format but IQ1_M (its delta per 8 quants: no group of 16 or 32 has one min term)."""
    assert set(INT) - set(TAKEN) == {"IQ1_M"}


def test_has_mma():
    assert mma.has_mma(["sm_80"]) and mma.has_mma(["sm_90a", "sm_120"]) and mma.has_mma(["sm_86", "sm_89"])
    assert not mma.has_mma(["sm_75"]) and not mma.has_mma(["sm_80", "sm_75"]) and not mma.has_mma([])


@pytest.mark.parametrize("ttype,K", CASES)
def test_emulated_kernel_is_the_integer_product(ttype, K):
    kind = by_ggml_type(ttype).kind
    B = int8.row_block(kind)
    T = te.var("T", I64)
    bufs, w = _weight(ttype, (N, K), "w")
    xq = te.placeholder([T, tirx.IntImm(I64, K // 4)], "int32", name="xq")
    xd = te.placeholder([T, tirx.IntImm(I64, K // B)], "float32", name="xd")
    xs = te.placeholder([T, tirx.IntImm(I64, K // 16)], "int32", name="xs")
    lib = tvm.compile(_module({
        "mma": mma.mul_mat_kernel(kind, N, K, B, cuda=False, gpu=False),
        "definition": te.create_prim_func([xq, xd, xs, *bufs, int8.mul_mat(w, xq, xd, dp4a=False, xs=xs)])}),
        target="llvm")
    quantizer = _quantizer(K, B, sums=True)
    packed, wf = _data(ttype, (N, K), 1)
    assert int8.group_order(kind, K) is None   # the definition sums its groups in k order, as the tiles do
    for rows in (1, 5, 70):
        x = _x(rows, K, 20 + rows, wf.astype(np.float64))
        q = _quantize(quantizer, x, B, sums=True)
        y = tvm.runtime.empty((rows, N), "float32")
        lib["mma"](*[tvm.runtime.tensor(a) for a in (*packed, *q)], y)
        got = y.numpy()
        assert rel_err(got, _x_prime(x, B) @ wf.astype(np.float64).T) < 1e-5, (ttype, rows)
        assert np.array_equal(got, _run(lib, "definition", (rows, N), *q, *packed)), (ttype, rows)


def _ptx(ttype, K, arch):
    from tvm.support import nvcc

    from nextn.compiler.gpu_build import build_scope
    from nextn.compiler.target import make_target

    kind = by_ggml_type(ttype).kind
    f = mma.mul_mat_kernel(kind, 4096, K, int8.row_block(kind), cuda=True, gpu=True)
    tgt = make_target("cuda", [arch])
    with build_scope("cuda", [arch]), tgt:
        lib = tvm.compile(_module({"mm": f}), target=tgt)
        src = "\n".join(m.inspect_source() for m in lib.mod.imports)
        return src, nvcc.compile_cuda(src, target_format="ptx", arch=arch, compiler="nvcc").decode()


@pytest.mark.parametrize("ttype,arch,shape", [("Q4_K", "sm_90", "m16n8k32"), ("Q8_0", "sm_80", "m16n8k32"),
                                              ("Q6_K", "sm_90", "m16n8k16"), ("MXFP4", "sm_120", "m16n8k32")])
def test_cuda_build_uses_int8_mma(ttype, arch, shape):
    src, ptx = _ptx(ttype, 4096, arch)
    body = ptx[ptx.index(".entry mm_kernel"):]
    assert len(re.findall(rf"mma\.sync\.aligned\.{shape}\.row\.col\.s32\.s8\.s8\.s32", body)) == mma.MT * mma.NT
    assert not re.search(r"\b(ld|st)\.local", body)          # fragments and accumulators in registers
    assert re.search(r"\.maxntid 128(, 1, 1)?\s", body) and "__launch_bounds__(128)" in src
    assert src.count("__syncthreads()") == 2                 # a stage's tiles written, then read
    # the weight's words as 32-bit loads where aligned (Q4_K's 144-byte blocks), 16-bit pairs where even (Q8_0's 34,
    # Q6_K's 210), bytes otherwise (MXFP4's 17): word_loads.py, as the GEMV reads them
    words, halves = src.count("((uint*)w_ptr)["), src.count("((ushort*)w_ptr)[")
    assert {"Q4_K": words > 0, "Q8_0": words == 0 < halves, "Q6_K": words == 0 < halves,
            "MXFP4": words == halves == 0}[ttype], (words, halves)


@pytest.mark.parametrize("model", ["Q4_K_M", "Q8_0", "IQ3_XXS"])
def test_prefill_entries_take_mma(model):
    """The fixture's GPU module: prefill and mtp_rows call the tensor-core kernels for their quantized matmuls on
    rows [T, K] (IQ3_XXS, quants/: the codebook formats' too, dense and routed); verify, decode and the draft
    entries call none."""
    from tvm import relax

    from nextn.compiler.graphs import MANY_ROWS, SPLIT_L, STATIC, build_graphs, weight_kinds
    from nextn.compiler.loader.model_files import ModelFiles
    from nextn.compiler.lower.to_relax import build_module

    folder = FIXTURES / ("quants" if model.startswith("IQ") else "tiny-glm4moe")
    mf = ModelFiles(folder / f"tiny-glm4moe-{model}.gguf", None, load_mtp=False)
    graphs = build_graphs(mf, mf.has_nextn)
    mod = build_module(list(graphs.values()), weight_kinds(mf, graphs.values()), STATIC, form="gpu",
                       split_l=SPLIT_L, gpu_int8="cuda", mma=True, many_rows=MANY_ROWS)
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def callees(entry):
        return [b.value.args[0].name_hint for blk in mod[entry].body.blocks for b in blk.bindings
                if isinstance(b.value, relax.Call) and b.value.op.same_as(call_tir)]

    for entry in graphs:
        taken = [c for c in callees(entry) if c.startswith("mul_mat_mma_")]
        if entry in MANY_ROWS:
            # q, k, v, output, the dense FFN's gate / up / down, the shared expert's: every 2-D quantized matmul
            assert len(taken) >= 7, (entry, taken)
            if model == "IQ3_XXS" and entry == "prefill":   # (the file's NextN layer is IQ4_XS)
                routed = {c.split("_")[4] for c in callees(entry) if c.startswith("mul_mat_id_mma_")}
                assert {"iq2", "iq3"} <= {c.split("_")[3] for c in taken} and "iq3" in routed, (taken, routed)
        else:
            assert taken == [], entry
    mod_off = build_module(list(graphs.values()), weight_kinds(mf, graphs.values()), STATIC, form="gpu",
                           split_l=SPLIT_L, gpu_int8="cuda", mma=False, many_rows=MANY_ROWS)
    assert not [gv for gv in mod_off.functions if gv.name_hint.startswith("mul_mat_mma_")]


@pytest.mark.parametrize("model", ["Q8_0", "IQ3_XXS"])
def test_calls_of_few_rows_take_the_gemv_copy(compiled, model):
    """The "gpu-emulated" artifact (its prefill and mtp_rows on the tiles, and their `_few` GEMV copies): a prompt
    of fewer than MIN_ROWS rows runs `prefill_few`, a longer one `prefill`; the two compute the same logits up to
    the float32 order of the group terms (1e-5 of max |y|) and the same greedy tokens. IQ3_XXS (quants/): the
    codebook formats' tiles (IQ3_XXS routed experts, IQ2_S, IQ3_S) with their grid and sign tables."""
    import nextn.runtime as rt
    from conftest import reference
    from nextn.compiler.graphs import FEW_SUFFIX

    fixture = FIXTURES / "tiny-glm4moe"
    path = fixture / f"tiny-glm4moe-{model}.gguf" if model == "Q8_0" else \
        FIXTURES / "quants" / f"tiny-glm4moe-{model}.gguf"
    m = rt.load(compiled("glm4moe-split" if model == "Q8_0" else f"glm4moe-{model}-split", path,
                         split_kernels=True), ctx_size=512)
    man = m.loaded.artifact.manifest
    assert man["tensor_core"] == {"min_rows": mma.MIN_ROWS,
                                  "few_rows": {e: e + FEW_SUFFIX for e in ("mtp_rows", "prefill")}}
    model, calls = m.sequence.model, []

    def recorded(name, f):
        return lambda *a: (calls.append(name), f(*a))[1]

    model.fn = {name: recorded(name, f) for name, f in model.fn.items()}
    prompts = {p["kind"]: p["prompt_ids"] for p in reference(fixture)["prompts"]}
    short, long_ = prompts["code-short"], prompts["docs-heading"]
    assert len(short) < mma.MIN_ROWS <= len(long_)
    m.logits(short)
    assert "prefill_few" in calls and "prefill" not in calls
    calls.clear()
    tiles = m.logits(long_)
    assert "prefill" in calls and "prefill_few" not in calls
    model.tensor_core_min_rows = len(long_) + 1        # the same prompt through the GEMV copy
    calls.clear()
    gemv = m.logits(long_)
    assert "prefill_few" in calls and "prefill" not in calls
    assert rel_err(tiles, gemv) < 1e-5 and np.array_equal(tiles.argmax(-1), gemv.argmax(-1))


@pytest.mark.parametrize("X,rows,used", [(128, 512, 8), (160, 37, 8), (256, 300, 8), (96, 1, 8)])
def test_expert_sort_at_real_expert_counts(X, rows, used):
    """`expert_tiles` ("gpu-emulated") at GLM expert counts (GLM-4.5 128, GLM-4.6 160, GLM-5 256; 96: chunks that
    do not fill the block), a 512-row prefill chunk's 4096 pairs down to one row: the order is numpy's stable
    argsort, each expert's tiles cover its pairs in order, BM at a time, and the slots left are (-1, 0, 0)."""
    lib = tvm.compile(_module({"tiles": mma.expert_tiles_kernel(X, gpu=False)}), target="llvm")
    rng = np.random.default_rng(X + rows)
    ids = np.stack([rng.choice(X, used, replace=False) for _ in range(rows)]).astype(np.int32).reshape(-1)
    ids[: len(ids) // 3] = ids[: len(ids) // 3] % 3   # a few experts chosen by many pairs (several tiles each)
    P, ntile = len(ids), -(-len(ids) // mma.BM) + X
    order, tiles = tvm.runtime.empty((P,), "int32"), tvm.runtime.empty((ntile, 3), "int32")
    lib["tiles"](tvm.runtime.tensor(ids), order, tiles)
    o, tl = order.numpy(), tiles.numpy()
    assert np.array_equal(o, np.argsort(ids, kind="stable"))
    counts, start, want = np.bincount(ids, minlength=X), 0, []
    for e in range(X):
        want += [(e, start + i, min(mma.BM, counts[e] - i)) for i in range(0, counts[e], mma.BM)]
        start += counts[e]
    want += [(-1, 0, 0)] * (ntile - len(want))
    assert [tuple(r) for r in tl] == want


@pytest.mark.parametrize("ttype,K,rows,used,per_pair", [("Q4_K", 768, 150, 2, False), ("Q8_0", 352, 40, 3, True),
                                                        ("Q6_K", 768, 9, 2, True), ("MXFP4", 352, 1, 2, False),
                                                        ("IQ2_XXS", 768, 70, 2, False)])
def test_emulated_expert_tiles(ttype, K, rows, used, per_pair):
    """`expert_tiles` + `mul_mat_id_kernel` ("gpu-emulated"): the pairs in numpy's stable argsort order by expert,
    every tile one expert's and at most 64 pairs, and the products against float64 numpy (x' · w[ids]) within 1e-5;
    one expert chosen by most rows (more than one tile at 150 rows)."""
    kind = by_ggml_type(ttype).kind
    B, X = int8.row_block(kind), 4
    lib = tvm.compile(_module({"mm": mma.mul_mat_id_kernel(kind, X, N, K, B, 1 if per_pair else used, False, False),
                               "tiles": mma.expert_tiles_kernel(X, gpu=False)}), target="llvm")
    packed, wf = _data(ttype, (X, N, K), 2)
    rng = np.random.default_rng(rows)
    ids = np.stack([rng.choice(X, used, replace=False) for _ in range(rows)]).astype(np.int32)
    ids[: rows * 3 // 4, 0] = 1
    P = rows * used
    x = _x(P if per_pair else rows, K, 30 + rows, wf[1].astype(np.float64))
    q = _quantize(_quantizer(K, B, sums=True), x, B, sums=True)
    ntile = -(-P // mma.BM) + X
    order, tiles = tvm.runtime.empty((P,), "int32"), tvm.runtime.empty((ntile, 3), "int32")
    lib["tiles"](tvm.runtime.tensor(ids.reshape(-1)), order, tiles)
    o, tl = order.numpy(), tiles.numpy()
    assert np.array_equal(o, np.argsort(ids.reshape(-1), kind="stable"))
    used_tiles = tl[tl[:, 0] >= 0]
    counts = np.bincount(ids.reshape(-1), minlength=X)
    assert len(used_tiles) == sum(-(-c // mma.BM) for c in counts) and (tl[len(used_tiles):, 0] == -1).all()
    for e, start, cnt in used_tiles:
        assert 0 < cnt <= mma.BM and (ids.reshape(-1)[o[start:start + cnt]] == e).all()
    if rows == 150:
        assert (used_tiles[:, 0] == 1).sum() == -(-counts[1] // mma.BM) >= 2
    y = tvm.runtime.empty((P, N), "float32")
    lib["mm"](*[tvm.runtime.tensor(a) for a in (*packed, *q)], order, tiles, y)
    xp, flat = _x_prime(x, B), ids.reshape(-1)
    want = np.stack([xp[p if per_pair else p // used] @ wf[flat[p]].astype(np.float64).T for p in range(P)])
    assert rel_err(y.numpy(), want) < 1e-5, ttype
