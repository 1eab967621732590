"""Every compiled entry point against the numpy IR interpreter (the executable specification).

Run on the Q8_0 bundle, so the in-kernel Q8_0 dequantization is checked too: the interpreter gets the
weights dequantized by gguf-py, the kernels read the packed blocks.
"""
import numpy as np
import pytest

from conftest import G4, reference, rel_err

from nextn.compiler.compile import build_graphs
from nextn.compiler.ir import interpret
from nextn.compiler.loader.model_files import ModelFiles

PROMPT = next(p for p in reference()["prompts"] if p["kind"] == "code-short")["prompt_ids"]


@pytest.fixture(scope="module")
def setup(q8_model):
    mf = ModelFiles(G4 / "tiny-glm4moe-Q8_0.gguf", load_mtp=True)
    cache = {}

    def weights(name):
        if name not in cache:
            cache[name] = mf.load(name, quantized=False).arrays[0]
        return cache[name]

    return q8_model.engine, build_graphs(mf, with_mtp=True), weights


def _zero_states(graph, n_ctx):
    return {n: np.zeros((n_ctx, *s.shape[1:]), np.float32) for n, s in graph.states.items()}


def test_prefill_then_verify(setup):
    eng, graphs, w = setup
    ids = np.asarray(PROMPT, np.int32)
    T = len(ids)
    st = _zero_states(graphs["prefill"], eng.n_ctx)
    want = interpret.run(graphs["prefill"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32),
                                             "out_ids": np.array([T - 1], np.int32)}, w, st, n_kv=T)
    h, last, am = eng.prefill(ids, 0)
    assert rel_err(h, want["hidden"]) < 1e-5
    assert rel_err(last, want["logits"][0]) < 1e-5 and am == want["argmax"][0]
    for name in ("k.0", "v.3"):   # the KV store wrote the same cells
        np.testing.assert_allclose(eng.states[name].numpy()[:T], st[name][:T], rtol=0, atol=1e-5)
    # verify of 3 rows continuing the same KV
    rows = np.array([am, 17, 99], np.int32)
    want = interpret.run(graphs["verify"], {"tokens": rows, "pos": np.arange(T, T + 3, dtype=np.int32)}, w, st, n_kv=T + 3)
    h, lg, am3 = eng.verify(rows, T)
    assert rel_err(lg.numpy(), want["logits"]) < 1e-5
    assert (am3 == want["argmax"]).all()


def test_mtp_rows_then_draft(setup):
    eng, graphs, w = setup
    ids = np.asarray(PROMPT, np.int32)
    T = len(ids)
    rng = np.random.default_rng(0)
    h_prev = rng.standard_normal((T, 256)).astype(np.float32)
    st = _zero_states(graphs["mtp_rows"], eng.n_ctx)
    want = interpret.run(graphs["mtp_rows"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32), "h_prev": h_prev,
                                              "out_ids": np.array([T - 1], np.int32)}, w, st, n_kv=T)
    got = eng.mtp_rows(ids, h_prev, 0)
    assert rel_err(got, want["h_nextn"]) < 1e-5
    want = interpret.run(graphs["mtp_draft"], {"tokens": ids[:1], "pos": np.array([T], np.int32),
                                               "h_prev": got[-1:]}, w, st, n_kv=T + 1)
    h, lg, am = eng.mtp_draft(ids[:1], got[-1:], T)
    assert rel_err(h, want["h_nextn"]) < 1e-5
    assert rel_err(lg.numpy(), want["logits"]) < 1e-5 and am[0] == want["argmax"][0]


def test_q8_close_to_bf16_reference(q8_model):
    """Q8_0 weights: same argmax as the BF16 reference on most positions (fixture README: loosely)."""
    from conftest import reference_logits

    npz = reference_logits()
    got = q8_model.logits(PROMPT)
    same = (got.argmax(1) == npz["code-short/trunk_logits"].argmax(1)).mean()
    assert same >= 0.8
