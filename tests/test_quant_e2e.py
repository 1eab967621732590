"""End to end on the mixed-type Q4_K_M fixture (Q4_K, Q5_K, Q6_K, Q8_0 and F32 tensors in one GGUF).

The compiled model reads the packed blocks; the numpy IR interpreter gets the same tensors dequantized by
gguf-py, so the two agree within float32 rounding. Against the BF16 reference the quantized model agrees
loosely (fixture README). Greedy speculation is lossless on it, and the weights stay quantized in memory.
"""
import collections

import gguf
import numpy as np
import pytest

from conftest import FIXTURES, G4, reference, reference_logits, rel_err

import nextn.runtime as rt
from nextn.compiler.compile import build_graphs
from nextn.compiler.ir import interpret
from nextn.compiler.loader.model_files import ModelFiles

Q4KM = G4 / "tiny-glm4moe-Q4_K_M.gguf"
PROMPTS = {p["kind"]: p["prompt_ids"] for p in reference()["prompts"]}
# Model-level checks on every registered arch's Q4_K_M fixture (glm-dsa's also mixes in Q5_0).
ARCHS = {"glm4moe": G4, "glm-dsa": FIXTURES / "tiny-glm-dsa"}


@pytest.fixture(scope="module")
def q4km_model(compiled):
    return rt.load(compiled("q4km", Q4KM), ctx_size=4096)


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_model(request, compiled):
    d = ARCHS[request.param]
    path = d / f"{d.name}-Q4_K_M.gguf"
    if request.param != "glm4moe":
        return d, path, rt.load(compiled(f"q4km-{request.param}", path), ctx_size=4096)
    return d, path, rt.load(compiled("q4km", Q4KM), ctx_size=4096)


@pytest.fixture(scope="module")
def setup(q4km_model):
    mf = ModelFiles(Q4KM, load_mtp=True)
    cache = {}

    def weights(name):
        if name not in cache:
            cache[name] = mf.load(name, quantized=False).arrays[0]
        return cache[name]

    return q4km_model.engine, build_graphs(mf, with_mtp=True), weights


def test_fixture_mixes_types(q4km_model):
    types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(Q4KM)).tensors)
    assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "F32"} <= set(types)
    kinds = {b["kind"] for b in q4km_model.engine.artifact.manifest["buffer_plan"]["weights"]}
    assert {"q4_k", "q5_k", "q6_k", "q8_0", "f32"} <= kinds


def test_weights_stay_quantized(arch_model):
    """Runtime weight buffers are within 5 % of the GGUF's tensor data (no float copy of the model)."""
    _d, path, m = arch_model
    gguf_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)
    assert m.engine.has_mtp   # every tensor of the bundle is loaded
    ratio = m.engine.weight_bytes / gguf_bytes
    print(f"{path.name}: weight buffers {m.engine.weight_bytes} B, GGUF tensor data {gguf_bytes} B, ratio {ratio:.4f}")
    assert abs(ratio - 1) < 0.05, ratio


def test_trunk_against_interpreter(setup):
    eng, graphs, w = setup
    ids = np.asarray(PROMPTS["code-short"], np.int32)
    T = len(ids)
    st = {n: np.zeros((eng.n_ctx, *s.shape[1:]), np.float32) for n, s in graphs["prefill"].states.items()}
    want = interpret.run(graphs["prefill"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32),
                                             "out_ids": np.array([T - 1], np.int32)}, w, st, n_kv=T)
    h, last, am = eng.prefill(ids, 0)
    assert rel_err(h, want["hidden"]) < 1e-5
    assert rel_err(last, want["logits"][0]) < 1e-5 and am == want["argmax"][0]
    rows = np.array([am, 17, 99, 5], np.int32)      # a verify pass of k+1 = 4 rows continuing the KV
    want = interpret.run(graphs["verify"], {"tokens": rows, "pos": np.arange(T, T + 4, dtype=np.int32)}, w, st,
                         n_kv=T + 4)
    _h, lg, am4 = eng.verify(rows, T)
    assert rel_err(lg.numpy(), want["logits"]) < 1e-5
    assert (am4 == want["argmax"]).all()


def test_mtp_against_interpreter(setup):
    eng, graphs, w = setup
    ids = np.asarray(PROMPTS["code-short"], np.int32)
    T = len(ids)
    h_prev = np.random.default_rng(0).standard_normal((T, 256)).astype(np.float32)
    st = {n: np.zeros((eng.n_ctx, *s.shape[1:]), np.float32) for n, s in graphs["mtp_rows"].states.items()}
    want = interpret.run(graphs["mtp_rows"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32), "h_prev": h_prev,
                                              "out_ids": np.array([T - 1], np.int32)}, w, st, n_kv=T)
    got = eng.mtp_rows(ids, h_prev, 0)
    assert rel_err(got, want["h_nextn"]) < 1e-5
    want = interpret.run(graphs["mtp_draft"], {"tokens": ids[:1], "pos": np.array([T], np.int32),
                                               "h_prev": got[-1:]}, w, st, n_kv=T + 1)
    h, lg, am = eng.mtp_draft(ids[:1], got[-1:], T)
    assert rel_err(h, want["h_nextn"]) < 1e-5
    assert rel_err(lg.numpy(), want["logits"]) < 1e-5 and am[0] == want["argmax"][0]


def test_close_to_bf16_reference(arch_model):
    """4-bit weights: the trunk's argmax equals the BF16 reference's on most positions (fixture README: loosely)."""
    d, _path, m = arch_model
    npz = reference_logits(d)
    prompts = {p["kind"]: p["prompt_ids"] for p in reference(d)["prompts"]}
    for kind in ("code-short", "docs-heading"):
        got = m.logits(prompts[kind])
        same = (got.argmax(1) == npz[f"{kind}/trunk_logits"].argmax(1)).mean()
        assert same >= 0.7, (kind, same)


@pytest.mark.parametrize("kind", ["code-short", "repetitive"])
def test_greedy_spec_equals_plain(arch_model, kind):
    d, path, m = arch_model
    ids = {p["kind"]: p["prompt_ids"] for p in reference(d)["prompts"]}[kind]
    plain = m.generate(ids, 32, spec_type="none", ignore_eos=True)
    spec = m.generate(ids, 32, spec_type="draft-mtp", n_max=3, ignore_eos=True)
    assert spec.ids == plain.ids
    assert spec.stats.drafted > 0
    print(f"{path.name} {kind}: draft acceptance = {spec.stats.acceptance:.3f} "
          f"({spec.stats.accepted}/{spec.stats.drafted}), mean len = {spec.stats.mean_len:.2f}")
