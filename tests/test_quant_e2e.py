"""End to end on the mixed-type Q4_K_M fixture (Q4_K, Q5_K, Q6_K, Q8_0 and F32 tensors in one GGUF).

The compiled model reads the GGUF blocks; the numpy IR interpreter gets the same tensors dequantized by gguf-py.
Built with `--exact-matmul` (float activations everywhere) the two agree within float32 rounding. The default
build quantizes the activation rows of its K-quant matmuls to int8 (as ggml-cpu does; the kernels themselves are
checked exactly in test_x86_kernels.py): the interpreter then does the same, but quantization is a step
function, so a float32 rounding difference upstream can move one quantized value by one step, and the rows that
depend on it differ by ~1e-2 (measured: up to 2.3e-2 relative on the code prompts, most rows within 1e-5 until
the first such step); that comparison asserts argmax agreement and a bound a wrong kernel would break.
Against the BF16 reference the quantized model agrees loosely (fixture README). Greedy speculation is lossless
on it, and the weights stay quantized in memory.
"""
import collections

import gguf
import numpy as np
import pytest

from conftest import (FIXTURES, G4, check_mtp_vs_ir, check_trunk_vs_ir, exact_sequence, graphs_and_dequantized,
                      quantized_activations, reference, reference_logits, zero_states)

import nextn.runtime as rt

Q4KM = G4 / "tiny-glm4moe-Q4_K_M.gguf"
PROMPTS = {p["kind"]: p["prompt_ids"] for p in reference()["prompts"]}
# Model-level checks on every registered arch's Q4_K_M fixture (glm-dsa's and glm5next's also mix in Q5_0: glm-dsa's
# K = 64 / 128 in single blocks, glm5next's routed down experts K = 256, a full group of 8 blocks)
ARCHS = {"glm4moe": G4, "glm-dsa": FIXTURES / "tiny-glm-dsa", "glm5next": FIXTURES / "tiny-glm5next"}


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
def graphs_and_weights():
    return graphs_and_dequantized(Q4KM)


@pytest.fixture(scope="module")
def setup(compiled, graphs_and_weights):
    """The --exact-matmul build (float activations), the graphs and the dequantized weights."""
    return (exact_sequence(compiled, "q4km-exact", Q4KM), *graphs_and_weights)


def test_fixture_mixes_types(q4km_model):
    types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(Q4KM)).tensors)
    assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "F32"} <= set(types)
    kinds = {b["kind"] for b in q4km_model.loaded.artifact.manifest["buffer_plan"]["weights"]}
    assert {"q4_k", "q5_k", "q6_k", "q8_0", "f32"} <= kinds


def test_weights_stay_quantized(arch_model):
    """Runtime weight buffers are within 5 % of the GGUF's tensor data (no float copy of the model)."""
    _d, path, m = arch_model
    gguf_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)
    assert m.loaded.has_mtp   # every tensor of the bundle is loaded
    ratio = m.loaded.weight_bytes / gguf_bytes
    print(f"{path.name}: weight buffers {m.loaded.weight_bytes} B, GGUF tensor data {gguf_bytes} B, ratio {ratio:.4f}")
    assert abs(ratio - 1) < 0.05, ratio


def test_trunk_against_interpreter(setup):
    eng, graphs, w = setup
    check_trunk_vs_ir(eng, graphs, w, np.asarray(PROMPTS["code-short"], np.int32), rows=4)   # verify of k+1 = 4 rows


def test_mtp_against_interpreter(setup):
    eng, graphs, w = setup
    check_mtp_vs_ir(eng, graphs, w, np.asarray(PROMPTS["code-short"], np.int32))


def test_default_build_follows_the_quantized_activation_semantics(q4km_model, graphs_and_weights):
    """The default build against the interpreter with the same int8 activation rows (see the module docstring)."""
    from nextn.compiler.ir import interpret

    graphs, w = graphs_and_weights
    q8 = quantized_activations(q4km_model.loaded)
    assert q8 and all(n.startswith(("blk.", "output")) for n in q8)
    for kind in ("code-short", "docs-heading"):
        ids = np.asarray(PROMPTS[kind], np.int32)
        want = interpret.run(graphs["verify"], {"tokens": ids, "pos": np.arange(len(ids), dtype=np.int32)}, w,
                             zero_states(graphs["verify"], 4096), n_kv=len(ids), quantized_activations=q8)["logits"]
        got = q4km_model.logits(ids)
        rows = np.abs(got - want).max(1) / np.abs(want).max(1)
        assert rows.max() < 5e-2 and np.median(rows) < 1e-2, (kind, rows.max(), np.median(rows))
        assert (got.argmax(1) == want.argmax(1)).mean() >= 0.97, kind


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
