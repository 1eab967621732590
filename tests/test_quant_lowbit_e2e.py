"""End to end on the low-bit fixtures (../shared/fixtures/quants/: the tiny glm4moe quantized by llama-quantize with
an importance matrix): IQ3_XXS (IQ3_XXS + IQ2_S + IQ3_S, IQ4_XS NextN, Q8_0, Q5_K), MXFP4_MOE (MXFP4 routed experts
+ Q8_0) and, in the slow set, IQ2_M (IQ2_S + IQ3_S, IQ4_XS NextN, Q4_K, Q5_K).

No reference outputs ship for these files (fixture README): the reference is the numpy IR interpreter run greedily
in float32 on the same tensors dequantized by gguf-py, independent of the compiled kernels that read the GGUF
bytes. The `--exact-matmul` build (float activations everywhere) must give equal greedy ids. The default build
(int8 activation rows for the K-quant / IQ4_XS matmuls, "q8_0" rows for Q8_0 and MXFP4, test_quant_e2e.py and
test_compiled_vs_ir.py; "q8" rows for the IQ codebook formats that have x86 kernels, compiler/lower/x86/codebook.py)
must speculate losslessly: greedy draft-mtp equals its plain greedy decoding. Either way the
weights are views of the file's tensor bytes plus the codebooks' small tables.
"""
import collections

import gguf
import numpy as np
import pytest

from conftest import FIXTURES, dequantized, quantized_activations, reference, zero_states

import nextn.runtime as rt
from nextn.common.quant import FORMATS
from nextn.compiler.graphs import build_graphs
from nextn.compiler.ir import interpret
from nextn.compiler.loader.model_files import ModelFiles

QUANTS = FIXTURES / "quants"
# file → the GGUF types of this issue it holds, and whether its default build has int8-activation matmuls
FILES = {"IQ3_XXS": ({"IQ3_XXS", "IQ2_S", "IQ3_S"}, True), "MXFP4_MOE": ({"MXFP4"}, True),
         "IQ2_M": ({"IQ2_S", "IQ3_S"}, True)}
NAMES = [pytest.param("IQ3_XXS"), pytest.param("MXFP4_MOE"), pytest.param("IQ2_M", marks=pytest.mark.slow)]
PROMPTS = {p["kind"]: p["prompt_ids"] for p in reference()["prompts"]}
N_PREDICT = 32


def path_of(name):
    return QUANTS / f"tiny-glm4moe-{name}.gguf"


def build(compiled, name, exact):
    """The runtime model of fixture `name`; the default build where it has no int8-activation matmuls anyway."""
    exact = exact and FILES[name][1]
    return rt.load(compiled(f"lowbit-{name}{'-exact' if exact else ''}", path_of(name), exact_matmul=exact),
                   ctx_size=4096)


@pytest.fixture(scope="module", params=NAMES)
def exact(request, compiled):
    """(fixture name, --exact-matmul runtime model, IR graphs, gguf-py-dequantized weight getter)."""
    name = request.param
    mf = ModelFiles(path_of(name), load_mtp=True)
    return name, build(compiled, name, True), build_graphs(mf, with_mtp=True), dequantized(mf)


@pytest.fixture(scope="module", params=NAMES)
def default(request, compiled):
    return request.param, build(compiled, request.param, False)


def interpreter_greedy(graphs, w, ids, n: int) -> list[int]:
    """Greedy ids after `ids` from the IR interpreter in float32: prefill, then one trunk row per token."""
    ids = np.asarray(ids, np.int32)
    T = len(ids)
    st = zero_states(graphs["prefill"], T + n)
    o = interpret.run(graphs["prefill"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32),
                                          "hidden_ids": np.array([T - 1], np.int32),
                                          "out_ids": np.array([0], np.int32)}, w, st, n_kv=T)
    out = [int(o["argmax"][0])]
    while len(out) < n:
        p = T + len(out) - 1
        o = interpret.run(graphs["verify"], {"tokens": np.array(out[-1:], np.int32), "pos": np.array([p], np.int32)},
                          w, st, n_kv=p + 1)
        out.append(int(o["argmax"][0]))
    return out


def kinds_of(types) -> set[str]:
    return {t.lower() for t in types}


def _address(t) -> int:
    return np.from_dlpack(t).ctypes.data


def test_lowbit_weights_are_views_of_the_file(default):
    """The file holds the low-bit types, the artifact plans them as their own kinds, and every
    weight buffer is a view into the mapped file except the codebook tables: weight bytes = the file's tensor
    bytes + the tables, nothing copied at load."""
    name, m = default
    eng = m.loaded
    tensors = gguf.GGUFReader(str(path_of(name))).tensors
    types = collections.Counter(t.tensor_type.name for t in tensors)
    want, has_q8 = FILES[name]
    assert want <= set(types)
    plan = {b["buffer"]: b for b in eng.artifact.manifest["buffer_plan"]["weights"]}
    kinds = {b["kind"] for b in plan.values()}
    assert kinds_of(want) <= kinds
    q8 = quantized_activations(eng)
    kind_of = {b["tensor"]: b["kind"] for b in plan.values()}
    # each quantized matmul takes its format's activation rows; of this types the matmul weights (all but
    # the token embedding, read by get_rows) whose format has an x86 integer kernel (MXFP4, the codebook formats of
    # compiler/lower/x86/codebook.py) do, the others keep float activations
    assert bool(q8) == has_q8 and all(FORMATS[kind_of[t]].activation == a for t, a in q8.items())
    matmul_w = {t for t, k in kind_of.items() if k in kinds_of(want) and t != "token_embd.weight"}
    assert {t for t in matmul_w if t in q8} == {t for t in matmul_w if FORMATS[kind_of[t]].activation} != set()
    assert eng.has_mtp
    mapped = np.frombuffer(eng.files.main.shards[0].buf, np.uint8)   # the map of the whole (one-shard) file
    lo, hi = mapped.ctypes.data, mapped.ctypes.data + mapped.nbytes
    suffixes = tuple({sfx for f in FORMATS.values() for sfx, _a in f.tables()})
    tables = sorted(n for n in plan if n.endswith(suffixes))
    assert sorted(n for n, t in eng._weights.items() if not lo <= _address(t) < hi) == tables
    assert bool(tables) == (name != "MXFP4_MOE")
    file_bytes = sum(int(t.n_bytes) for t in tensors)
    table_bytes = sum(plan[n]["nbytes"] for n in tables)
    print(f"{name}: weight buffers {eng.weight_bytes} B = GGUF tensor data {file_bytes} B + codebook tables "
          f"{table_bytes} B (ratio {eng.weight_bytes / file_bytes:.5f}); bytes copied at load "
          f"{eng.device.copied_weight_bytes}")
    assert eng.weight_bytes == file_bytes + table_bytes
    assert eng.device.copied_weight_bytes <= table_bytes


@pytest.mark.parametrize("kind", ["code-short", "docs-heading", "one-token"])
def test_greedy_equals_float_reference(exact, kind):
    name, m, graphs, w = exact
    assert not quantized_activations(m.loaded)
    want = interpreter_greedy(graphs, w, PROMPTS[kind], N_PREDICT)
    got = m.generate(PROMPTS[kind], N_PREDICT, spec_type="none", ignore_eos=True).ids
    same = sum(a == b for a, b in zip(got, want))
    print(f"{name} {kind}: greedy ids equal to the float32 reference at {same}/{N_PREDICT} positions")
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(set(PROMPTS) - {"code-short", "docs-heading", "one-token", "long-context"}))
def test_greedy_equals_float_reference_all_prompts(exact, kind):
    test_greedy_equals_float_reference(exact, kind)


@pytest.mark.parametrize("kind", ["code-short", "repetitive"])
def test_greedy_spec_equals_plain(default, kind):
    name, m = default
    ids = PROMPTS[kind]
    plain = m.generate(ids, N_PREDICT, spec_type="none", ignore_eos=True)
    for n_max in (1, 3):
        spec = m.generate(ids, N_PREDICT, spec_type="draft-mtp", n_max=n_max, ignore_eos=True)
        assert spec.ids == plain.ids, n_max
        assert spec.stats.drafted > 0
        print(f"{name} {kind} n_max={n_max}: acceptance {spec.stats.acceptance:.3f} "
              f"({spec.stats.accepted}/{spec.stats.drafted})")
