"""The GGUF matmul kernels for GPUs (compiler/lower/cuda), checked without a GPU.

- The compute definitions (`cuda.mul_mat`, `cuda.mul_mat_id`: dequantization as its own stage), unscheduled and
  built for llvm, against a float64 numpy product on gguf-py-dequantized weights: T = 1, 3, 8 rows, N = 37 weight
  rows (not a multiple of the 4 rows of a thread block), K not a multiple of the 256 elements of a warp step where
  the block size allows, within 1e-5 relative (as tests/test_quant.py holds the CPU kernels).
- The GEMV schedule (`cuda.schedule`: TVM schedule primitives only, so it keeps those semantics) lowers and
  builds for CUDA sm_90 for every format, with the launch shape it means (a warp per weight row, 4 per block;
  blockIdx.y = ceil(T / 8) row tiles, or the (row, slot) pairs of mul_mat_id), and its CUDA source reads the weight
  once per 8-row tile: the dynamic-T kernel holds exactly as many weight loads as the one-row kernel, and 8 times
  the activation loads; float weights and the one-row kernels' activations are read with 128-bit loads.
- Whole fixtures: every matmul PrimFunc of tiny glm4moe (Q8_0, Q4_K_M, BF16) is taken by "cuda:gemv" in the
  schedule report, and Q8_0 / Q4_K_M compile for sm_90.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from conftest import G4
from nextn.common.compare import rel_err
from nextn.common.quant import by_ggml_type
from nextn.compiler.lower import cuda
from nextn.compiler.lower.cuda import gemv
from nextn.compiler.target import make_target
from nextn.schedules.gpu_bound import extent_at, launches
from test_quant import TYPES, activations, dequant, random_raw

pytestmark = pytest.mark.e2e   # builds CUDA kernels with nvcc

I64 = "int64"
N, X, USED = 37, 3, 2
# the formats of issue 33's first list, then the rest of the supported block formats (schedule and build only)
FIRST = ["Q8_0", "BF16", "F16", "F32", "Q4_K", "Q6_K", "Q5_K", "Q4_0", "MXFP4"]


def _k(ttype: str) -> int:
    """K of the test weights: 11 blocks of 32 (352, not a multiple of 256) or 3 super-blocks of 256; 100 for F32."""
    if ttype == "F32":
        return 100
    return 11 * 32 if by_ggml_type(ttype).block == 32 else 3 * 256


def _weight(ttype: str, shape, prefix: str):
    """(TE placeholders, what cuda.mul_mat takes) for a `ttype` weight of logical `shape`."""
    from nextn.compiler.lower.te_ops import QWeight

    if ttype == "F32":
        w = te.placeholder([tirx.IntImm(I64, s) for s in shape], "float32", name=prefix)
        return [w], w
    kind = by_ggml_type(ttype).kind
    from nextn.common.quant import FORMATS

    bufs = [te.placeholder([tirx.IntImm(I64, int(s)) for s in bs], dt, name=prefix + sfx.replace(".", "_"))
            for sfx, dt, bs in FORMATS[kind].buffers(tuple(shape))]
    return bufs, QWeight(kind, bufs, tuple(shape))


def _data(ttype: str, shape, seed: int):
    """(buffers as the loader packs them, float32 dequantized weight)."""
    if ttype == "F32":
        w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        return [w], w
    raw = random_raw(ttype, shape, seed)
    return list(by_ggml_type(ttype).pack(raw, shape)), dequant(ttype, raw)


def _funcs(ttype: str, K: int, rows=None):
    """PrimFuncs of the compute definitions: mul_mat (rows: a static row count, or None for a symbolic T),
    mul_mat_id with x shared by the slots and with one x row per slot."""
    T = te.var("T", I64) if rows is None else tirx.IntImm(I64, rows)
    bufs, w = _weight(ttype, (N, K), "w")
    ebufs, ew = _weight(ttype, (X, N, K), "e")
    x = te.placeholder([T, tirx.IntImm(I64, K)], "float32", name="x")
    x3 = te.placeholder([T, tirx.IntImm(I64, USED), tirx.IntImm(I64, K)], "float32", name="x3")
    ids = te.placeholder([T, tirx.IntImm(I64, USED)], "int32", name="ids")
    return {"mul_mat": te.create_prim_func([x, *bufs, cuda.mul_mat(w, x)]),
            "mul_mat_id": te.create_prim_func([x, ids, *ebufs, cuda.mul_mat_id(ew, x, ids)]),
            "mul_mat_id3": te.create_prim_func([x3, ids, *ebufs, cuda.mul_mat_id(ew, x3, ids)])}


def _module(funcs):
    return tvm.IRModule({tvm.ir.GlobalVar(n): f.with_attr("global_symbol", n) for n, f in funcs.items()})


def _run(lib, name, out_shape, *args):
    out = tvm.runtime.empty(out_shape, "float32")
    lib[name](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args], out)
    return out.numpy()


@pytest.fixture(scope="module", params=FIRST)
def definition(request):
    """(ttype, llvm library of the unscheduled definitions, K, packed weight, its float32 values, packed experts,
    theirs)."""
    ttype = request.param
    K = _k(ttype)
    lib = tvm.compile(_module(_funcs(ttype, K)), target="llvm")
    packed, w = _data(ttype, (N, K), 1)
    epacked, ew = _data(ttype, (X, N, K), 2)
    return ttype, lib, K, packed, w, epacked, ew


@pytest.mark.parametrize("T", [1, 3, 8])
def test_definition_mul_mat_against_float64(definition, T):
    ttype, lib, K, packed, w, _, _ = definition
    w64 = w.astype(np.float64)
    x = activations(np.random.default_rng(T), [[w64]] * T)
    got = _run(lib, "mul_mat", (T, N), x, *packed)
    assert rel_err(got, x.astype(np.float64) @ w64.T) < 1e-5, ttype


@pytest.mark.parametrize("T", [1, 3, 8])
def test_definition_mul_mat_id_against_float64(definition, T):
    ttype, lib, _K, _, _, epacked, ew = definition
    rng = np.random.default_rng(20 + T)
    ids = np.stack([rng.permutation(X)[:USED] for _ in range(T)]).astype(np.int32)
    _check_mul_mat_id(lib, ("mul_mat_id", "mul_mat_id3"), ids, epacked, ew, rng, ttype)


def _check_mul_mat_id(lib, names, ids, epacked, ew, rng, ttype) -> None:
    """lib's mul_mat_id functions `names` (x shared by the slots; one x row per slot) against float64 numpy."""
    T, K = len(ids), ew.shape[-1]
    w64 = ew.astype(np.float64)
    x = activations(rng, [[w64[e] for e in ids[t]] for t in range(T)])
    x3 = activations(rng, [[w64[e]] for e in ids.reshape(-1)]).reshape(T, USED, K)
    want = np.einsum("tk,tjnk->tjn", x.astype(np.float64), w64[ids])
    want3 = np.einsum("tjk,tjnk->tjn", x3.astype(np.float64), w64[ids])
    got = _run(lib, names[0], (T, USED, N), x, ids, *epacked)
    got3 = _run(lib, names[1], (T, USED, N), x3, ids, *epacked)
    assert rel_err(got.reshape(-1, N), want.reshape(-1, N)) < 1e-5, ttype
    assert rel_err(got3.reshape(-1, N), want3.reshape(-1, N)) < 1e-5, ttype


def _scheduled(ttype: str, rows=None, K: int | None = None):
    tgt = make_target("cuda", ["sm_90"])
    out = {}
    for name, f in _funcs(ttype, K or _k(ttype), rows).items():
        sch = cuda.schedule(f, tgt)
        assert sch is not None, (ttype, name)
        out[name] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    return out, tgt


def _cuda_source(funcs, tgt) -> str:
    from nextn.compiler.gpu_build import build_scope

    with build_scope("cuda", ["sm_90"]), tgt:
        lib = tvm.compile(_module(funcs), target=tgt)
    return "\n".join(m.inspect_source() for m in lib.mod.imports)


@pytest.mark.parametrize("ttype", FIRST + [t for t in TYPES if t not in FIRST])
def test_schedule_builds_for_sm90_with_its_launch_shape(ttype):
    """Every format: the schedule takes the three definitions, nothing it leaves fails to lower, CUDA sm_90 code
    is generated; launch shape: ceil(N / 4) blocks of 4 warps over the weight rows, blockIdx.y = ceil(T / 8) row
    tiles (mul_mat) or T x n_used (row, slot) pairs (mul_mat_id)."""
    from nextn.schedules.gpu import _lowering_problem

    funcs, tgt = _scheduled(ttype)
    for name, f in funcs.items():
        assert _lowering_problem(f) is None, (ttype, name)
        (ln,) = launches(f)
        assert ln["grid"][0] == str(math.ceil(N / gemv.WARPS)) and ln["block"] == [str(gemv.LANES), str(gemv.WARPS),
                                                                                   "1"], ln
        for T in (1, 3, 8, 9, 512):
            want = math.ceil(T / gemv.TILE_ROWS) if name == "mul_mat" else T * USED
            assert extent_at(ln["grid"][1], T) == want, (ttype, name, T, ln)
    assert "__global__" in _cuda_source(funcs, tgt)


@pytest.mark.parametrize("ttype", ["Q8_0", "Q4_K", "Q6_K", "BF16", "F16", "F32"])
def test_weight_read_once_per_row_tile(ttype):
    """In the generated CUDA source, the dynamic-T mul_mat kernel (8-row tiles) loads the weight exactly as often
    as the one-row decode kernel, and loads activations 8 times as often: the weight is read once for all the rows
    of a tile. With K a multiple of a warp step (32 lanes x 8 elements), float weights and the one-row kernel's
    activations are read with 128-bit loads."""
    K = 512
    dyn, tgt = _scheduled(ttype, K=K)
    one, _ = _scheduled(ttype, rows=1, K=K)
    src_dyn = _cuda_source({"mul_mat": dyn["mul_mat"]}, tgt)
    src_one = _cuda_source({"mul_mat": one["mul_mat"]}, tgt)
    w_loads = [len(re.findall(r"\bw_ptr\b", s)) for s in (src_dyn, src_one)]
    # activation elements loaded: scalar loads, and float4 loads of 4 (the one-row kernel's)
    x_elems = [len(re.findall(r"\bx_ptr\[", s)) + 4 * len(re.findall(r"\(float4\*\)\(x_ptr \+", s))
               for s in (src_dyn, src_one)]
    assert w_loads[0] == w_loads[1] > 2, w_loads                       # > 2: more than the two declarations
    assert x_elems[0] == gemv.TILE_ROWS * x_elems[1] > 0, x_elems
    assert "(float4*)(x_ptr +" in src_one
    if ttype in ("BF16", "F16", "F32"):
        assert re.search(r"= \*\((?:float4|uint4)\*\)\(w_ptr \+", src_dyn), ttype


def _report(model) -> dict:
    import contextlib
    import io

    from nextn.compiler import schedule_report

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        schedule_report.main([str(model), "--target", "cuda", "--arch", "sm_90", "--json"])
    return {k: r["rule"] for k, r in json.loads(buf.getvalue()).items()}   # the kernel report: name -> its rule


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M", "BF16"])
def test_fixture_matmuls_take_the_gemv_rule(quant):
    rep = _report(G4 / f"tiny-glm4moe-{quant}.gguf")
    mats = {k: v for k, v in rep.items() if "mul_mat" in k and "_mma_" not in k}
    assert len(mats) >= 10 and set(mats.values()) == {"cuda:gemv"}, mats
    assert "mul_mat_id" in mats and any(k.startswith("fused_") for k in mats)   # routed experts, fused tails
    # prefill's quantized matmuls on tensor cores (cuda/mma.py: hand-written, so pre-scheduled); BF16 has none
    tiles = {k: v for k, v in rep.items() if "_mma_" in k}
    assert set(tiles.values()) == ({"pre-scheduled"} if quant != "BF16" else set()), tiles
    assert quant == "BF16" or any(k.startswith("mul_mat_id_mma_") for k in tiles)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M"])
def test_fixture_compiles_for_sm90(compiled, quant):
    from nextn.common.device_code import device_code

    d = compiled(f"g4-{quant}-cuda90", G4 / f"tiny-glm4moe-{quant}.gguf", target="cuda", arches=["sm_90"])
    info = device_code(f"{d}/model_cuda.so")
    assert info["cuda_sass"] == ["sm_90"] and not info["cuda_source"]


# -- mul_mat_id with rows grouped per expert (verify / prefill) ---------------------------------------------------
XG = 5   # experts of the grouped tests (USED = 2 of them per row)


def _grouped_funcs(ttype: str, K: int):
    """The grouped mul_mat_id's three definitions as one llvm PrimFunc each way (x shared by the slots; one x row per
    slot), and `expert_groups` alone; T symbolic."""
    T = te.var("T", I64)
    ebufs, ew = _weight(ttype, (XG, N, K), "e")
    x = te.placeholder([T, tirx.IntImm(I64, K)], "float32", name="x")
    x3 = te.placeholder([T, tirx.IntImm(I64, USED), tirx.IntImm(I64, K)], "float32", name="x3")
    ids = te.placeholder([T, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = cuda.expert_groups(ids, cuda.expert_leaders(ids))
    out = {"groups": te.create_prim_func([ids, groups])}
    for name, xx in (("grouped", x), ("grouped3", x3)):
        y = cuda.expert_gather(cuda.mul_mat_id_grouped(ew, xx, ids, groups), groups)
        out[name] = te.create_prim_func([xx, ids, *ebufs, y])
    return out


def _ids(T: int, seed: int, repeat: bool) -> np.ndarray:
    """T rows of USED distinct experts of XG; `repeat`: every row the same two experts (all rows share them)."""
    rng = np.random.default_rng(seed)
    if repeat:
        return np.tile(np.array([[3, 1]], np.int32), (T, 1))
    return np.stack([rng.permutation(XG)[:USED] for _ in range(T)]).astype(np.int32)


def _groups64(ids: np.ndarray) -> np.ndarray:
    """expert_groups' contract, naively: [t, j, W] the first pair of t's window with the same expert; a leader's
    [t, j, r] the pair of window row r with it (or -1)."""
    T, kk = ids.shape
    W = cuda.GROUP_ROWS
    g = np.full((T, kk, W + 1), -1, np.int64)
    for t in range(T):
        for j in range(kk):
            rows = range(t // W * W, min(t // W * W + W, T))
            pairs = [r * kk + s for r in rows for s in range(kk) if ids[r, s] == ids[t, j]]
            g[t, j, W] = min(pairs)
            if g[t, j, W] == t * kk + j:
                for r in rows:
                    g[t, j, r % W] = next((r * kk + s for s in range(kk) if ids[r, s] == ids[t, j]), -1)
    return g


@pytest.fixture(scope="module", params=["Q8_0", "Q4_K", "Q6_K", "BF16"])
def grouped(request):
    ttype = request.param
    K = _k(ttype)
    lib = tvm.compile(_module(_grouped_funcs(ttype, K)), target="llvm")
    return ttype, lib, K, *_data(ttype, (XG, N, K), 3)


@pytest.mark.parametrize("T", [1, 2, 4, 9])
@pytest.mark.parametrize("repeat", [False, True])
def test_definition_grouped_mul_mat_id_against_float64(grouped, T, repeat):
    """The grouped definition (groups, per-group products, gather) equals mul_mat_id in float64 numpy for T rows of
    distinct experts or all rows choosing the same two (one group per expert and window), windows cut at T."""
    ttype, lib, _K, epacked, ew = grouped
    ids = _ids(T, 40 + T, repeat)
    groups = tvm.runtime.empty((T, USED, cuda.GROUP_ROWS + 1), "int32")
    lib["groups"](tvm.runtime.tensor(ids), groups)
    assert (groups.numpy() == _groups64(ids)).all(), (ids, groups.numpy())
    _check_mul_mat_id(lib, ("grouped", "grouped3"), ids, epacked, ew, np.random.default_rng(60 + T), ttype)


@pytest.mark.parametrize("T", [1, 4, 9])
def test_gather_sum_and_gather_swiglu_are_the_gather_then_the_graph_ops(T):
    """The verify / prefill MoE tails in one kernel each (gpu_forms `_slot_sum`, `_gather_swiglu`):
    `expert_gather_sum` equals the gathered rows times their routing weights summed in slot order in float32 numpy
    ((p0 + p1) + p2) + p3, the graph's views and adds), and swiglu of two gathers equals te_ops.swiglu of the gathered
    rows, bit for bit (4 of 8 experts per row, windows of GROUP_ROWS rows cut at T)."""
    from nextn.compiler.lower import te_ops

    kk, X, W, NN = 4, 8, cuda.GROUP_ROWS, 24
    Tv = te.var("T", I64)
    y = te.placeholder([Tv, tirx.IntImm(I64, kk), tirx.IntImm(I64, W), tirx.IntImm(I64, NN)], "float32", name="y")
    y2 = te.placeholder(y.shape, "float32", name="y2")
    g = te.placeholder([Tv, tirx.IntImm(I64, kk), tirx.IntImm(I64, W + 1)], "int32", name="g")
    w = te.placeholder([Tv, tirx.IntImm(I64, kk), tirx.IntImm(I64, 1)], "float32", name="w")
    ga = te.placeholder([Tv, tirx.IntImm(I64, kk), tirx.IntImm(I64, NN)], "float32", name="ga")
    gb = te.placeholder(ga.shape, "float32", name="gb")
    lib = tvm.compile(_module({
        "gather": te.create_prim_func([y, g, cuda.expert_gather(y, g)]),
        "sum": te.create_prim_func([y, g, w, cuda.expert_gather_sum(y, g, w)]),
        "fused": te.create_prim_func([y, y2, g, te_ops.swiglu(cuda.expert_gather(y, g), cuda.expert_gather(y2, g))]),
        "swiglu": te.create_prim_func([ga, gb, te_ops.swiglu(ga, gb)])}), target="llvm")
    rng = np.random.default_rng(T)
    ids = np.stack([rng.permutation(X)[:kk] for _ in range(T)]).astype(np.int32)
    groups = _groups64(ids).astype(np.int32)
    ys = [rng.standard_normal((T, kk, W, NN)).astype(np.float32) for _ in range(2)]
    wt = rng.uniform(0.05, 0.5, (T, kk, 1)).astype(np.float32)
    rows = _run(lib, "gather", (T, kk, NN), ys[0], groups)
    want = rows[:, 0] * wt[:, 0]
    for j in range(1, kk):
        want = want + rows[:, j] * wt[:, j]
    assert want.dtype == np.float32
    assert _run(lib, "sum", (T, NN), ys[0], groups, wt).tobytes() == want.tobytes()
    rows2 = _run(lib, "gather", (T, kk, NN), ys[1], groups)
    assert _run(lib, "fused", (T, kk, NN), ys[0], ys[1], groups).tobytes() == \
        _run(lib, "swiglu", (T, kk, NN), rows, rows2).tobytes()


@pytest.mark.parametrize("T", [1, 4, 9])
def test_grouped_weight_reads_per_expert(T):
    """How often a verify reads each expert: the grouped kernel loads weight bytes only in the blocks of group
    leaders (`expert_groups` on llvm against the naive count: one leader per distinct expert and 4-row window;
    all rows choosing the same 2 experts read 2 experts per window instead of 2 x rows), and in its CUDA source
    every weight load sits under the block-uniform leader test, one for the whole block; the launch is the
    ungrouped one (ceil(N / 4)
    x T·n_used blocks of 4 warps), so a one-row step launches what it did."""
    lib = tvm.compile(_module({"groups": _grouped_funcs("Q8_0", _k("Q8_0"))["groups"]}), target="llvm")
    W = cuda.GROUP_ROWS
    for repeat in (False, True):
        ids = _ids(T, 70 + T, repeat)
        g = tvm.runtime.empty((T, USED, W + 1), "int32")
        lib["groups"](tvm.runtime.tensor(ids), g)
        g = g.numpy()
        leaders = sum(int(g[t, j, t % W] >= 0) for t in range(T) for j in range(USED))
        distinct = sum(len(set(ids[w:w + W].reshape(-1))) for w in range(0, T, W))
        assert leaders == distinct, (ids, g)
        if repeat:
            assert leaders == USED * math.ceil(T / W) < T * USED or T == 1
    # the scheduled grouped matmul: its launch, and weight loads only under the leader test
    Tv = te.var("T", I64)
    K = 512
    ebufs, ew = _weight("Q4_K", (XG, N, K), "e")
    x = te.placeholder([Tv, tirx.IntImm(I64, K)], "float32", name="x")
    ids_p = te.placeholder([Tv, tirx.IntImm(I64, USED)], "int32", name="ids")
    groups = te.placeholder([Tv, tirx.IntImm(I64, USED), tirx.IntImm(I64, W + 1)], "int32", name="groups")
    f = te.create_prim_func([x, ids_p, groups, *ebufs, cuda.mul_mat_id_grouped(ew, x, ids_p, groups)])
    tgt = make_target("cuda", ["sm_90"])
    sch = cuda.schedule(f, tgt)
    assert sch is not None
    fs = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    (ln,) = launches(fs)
    assert ln["grid"][0] == str(math.ceil(N / gemv.WARPS)) and extent_at(ln["grid"][1], T) == T * USED, ln
    src = _cuda_source({"grouped": fs}, tgt)
    body = src[src.index("grouped_kernel(", src.index("grouped_kernel(") + 1):]
    assert _loads_outside_leader_branch(body) == 0 and "e_ptr[" in body and _one_leader_test(body)


# a weight load: a byte `e_ptr[`, a vector `(e_ptr + `, or through word_loads.py's uint16 / uint32 views
_E_LOAD = r"\be_ptr\[|\(e_ptr \+ |\(\(u(?:short|int)\*\)e_ptr\)[\[ ]"


def _load_scopes(src: str) -> list[list[str]]:
    """Per weight load (`_E_LOAD`) of a CUDA kernel body, the conditions of the `if` scopes around it, outermost
    first (scopes followed by their braces, line by line: TVM's codegen opens and closes one per line)."""
    stack, out = [], []
    for line in src.splitlines():
        if re.search(_E_LOAD, line):
            out.append([c for c in stack if c])
        for m in re.finditer(r"[{}]", line):
            if m.group() == "{":
                test = re.search(r"if \((.*)\) $", line[:m.start()])
                stack.append(test.group(1) if test else "")
            elif stack:
                stack.pop()
        if not stack and line.startswith("}"):
            break
    return out


def _one_leader_test(src: str) -> bool:
    """Whether every weight load of a grouped kernel body sits under one and the same test of the group entries,
    the thread block's leader test on the entries in memory (gemv._leaders_only), and no test of a register copy
    of them (no branch per load; tests of the weight row's bound may enclose some)."""
    tests = [[c for c in cs if "groups" in c] for cs in _load_scopes(src)]
    return bool(tests) and all(len(c) == 1 and re.fullmatch(r"0 <= groups_ptr\[.*\]", c[0]) for c in tests) \
        and len({c[0] for c in tests}) == 1


def _loads_outside_leader_branch(src: str) -> int:
    """Weight loads (`_E_LOAD`) of a CUDA kernel body that no enclosing `if (0 <= groups[...])` scope guards (the
    group entries read from `groups_ptr` or their register copy `groups_local_ptr`, gemv._group_entries_once; scopes
    followed by their braces, line by line: TVM's codegen opens and closes one per line)."""
    stack, outside = [], 0
    for line in src.splitlines():
        if re.search(_E_LOAD, line) and not any(stack):
            outside += 1
        for m in re.finditer(r"[{}]", line):
            if m.group() == "{":
                stack.append(bool(re.search(r"if \(0 <= groups_(?:local_)?ptr\[", line[:m.start()])))
            elif stack:
                stack.pop()
        if not stack and line.startswith("}"):
            break
    return outside


@pytest.mark.parametrize("V", [151552, 8192, 768])
def test_two_pass_argmax_is_the_first_index_of_the_maximum(V):
    """The GPU forms' argmax (gpu_forms.SPLIT_OPS: per-chunk argmax, then the first chunk with the largest maximum)
    gives the one-pass argmax's index (te_ops.argmax, the CPU's), built for llvm, and where a row has a finite
    maximum np.argmax's, the first of equal maxima: ties within a chunk, across chunks (the later chunk's copy at a
    lower offset), at the last column, a row of one value, a NaN before the maximum; a row of -inf has no
    candidate in either (-1)."""
    from nextn.compiler.lower import te_ops

    ch = te_ops.argmax_chunk(V)
    assert V % ch == 0 and V // ch >= 2
    R = 7
    x = te.placeholder((R, V), "float32", name="x")
    part = te_ops.argmax(te.compute((R, V // ch, ch), lambda r, c, j: x[r, c * ch + j], name="xc"))
    funcs = {"two": te.create_prim_func([x, te_ops.argmax_of_chunks(x, part, ch)]),
             "one": te.create_prim_func([x, te_ops.argmax(x)])}
    lib = tvm.compile(_module(funcs), target="llvm")
    rng = np.random.default_rng(V)
    a = rng.standard_normal((R, V)).astype(np.float32)
    a[0, [(V // ch - 1) * ch + 5, ch + 7, ch + 9]] = 50.0   # across chunks: chunk 1 wins, its first copy
    a[1, [2 * ch - 1, 2 * ch, 5]] = 60.0               # a chunk boundary and the first chunk
    a[2, V - 1] = 70.0                                 # the last column
    a[3] = 1.5                                         # all equal: index 0
    a[4] = -np.inf                                     # all -inf: index 0
    a[5, [V // 2 + 1, V // 2 + 3]] = 80.0              # a tie inside one chunk
    a[6, 0], a[6, ch + 1] = np.nan, 90.0               # NaN is never the maximum
    got = {}
    for name in funcs:
        got[name] = tvm.runtime.tensor(np.zeros(R, np.int32))
        lib[name](tvm.runtime.tensor(a), got[name])
    two, one = got["two"].numpy().tolist(), got["one"].numpy().tolist()
    assert two == one
    want = np.argmax(np.nan_to_num(a, nan=-np.inf), axis=-1).tolist()
    assert two[:4] + two[5:] == want[:4] + want[5:] and two[4] == -1
