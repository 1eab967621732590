"""Every compiled entry point against the numpy IR interpreter (the executable specification).

Run on the Q8_0 bundle, so the in-kernel Q8_0 dequantization is checked too: the interpreter gets the
weights dequantized by gguf-py, the kernels read the packed blocks.
"""
import numpy as np
import pytest

from conftest import G4, check_mtp_vs_ir, check_trunk_vs_ir, dequantized, reference

from nextn.compiler.graphs import build_graphs
from nextn.compiler.loader.model_files import ModelFiles

PROMPT = next(p for p in reference()["prompts"] if p["kind"] == "code-short")["prompt_ids"]


@pytest.fixture(scope="module")
def setup(q8_model):
    mf = ModelFiles(G4 / "tiny-glm4moe-Q8_0.gguf", load_mtp=True)
    return q8_model.engine, build_graphs(mf, with_mtp=True), dequantized(mf)


def test_prefill_then_verify(setup):
    eng, graphs, w = setup
    ids = np.asarray(PROMPT, np.int32)
    st = check_trunk_vs_ir(eng, graphs, w, ids, rows=3)
    for name in ("k.0", "v.3"):   # the KV store wrote the same cells
        np.testing.assert_allclose(eng.states[name].numpy()[:len(ids) + 3], st[name][:len(ids) + 3], rtol=0, atol=1e-5)


def test_mtp_rows_then_draft(setup):
    eng, graphs, w = setup
    check_mtp_vs_ir(eng, graphs, w, np.asarray(PROMPT, np.int32))


def test_q8_close_to_bf16_reference(q8_model):
    """Q8_0 weights: same argmax as the BF16 reference on most positions (fixture README: loosely)."""
    from conftest import reference_logits

    npz = reference_logits()
    got = q8_model.logits(PROMPT)
    same = (got.argmax(1) == npz["code-short/trunk_logits"].argmax(1)).mean()
    assert same >= 0.8
