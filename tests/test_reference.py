"""End to end against the fixture references (BF16 bundle: the weights exactly as trained).

Expected values are read from ../shared/fixtures/tiny-glm4moe/reference*.{json,npz}; tolerance 1e-4 relative
(max-abs error over the row's max-abs), as the fixture README states.
"""
import numpy as np
import pytest

from conftest import REF_TOL, check_greedy_and_speculative, reference, reference_logits

from nextn.common.compare import rel_err

REF = reference()
PROMPTS = {p["kind"]: p for p in REF["prompts"]}
FULL_KINDS = ["code-short", "docs-heading"]   # kinds with full [T, vocab] logits in the npz


@pytest.mark.parametrize("kind", FULL_KINDS)
def test_trunk_logits_and_hidden(bf16_model, kind):
    npz = reference_logits()
    ids = PROMPTS[kind]["prompt_ids"]
    assert rel_err(bf16_model.logits(ids), npz[f"{kind}/trunk_logits"]) < REF_TOL
    assert rel_err(bf16_model.sequence.hidden(ids), npz[f"{kind}/trunk_hidden"]) < REF_TOL


@pytest.mark.parametrize("kind", FULL_KINDS)
def test_mtp_logits(bf16_model, kind):
    npz = reference_logits()
    got = bf16_model.mtp_logits(PROMPTS[kind]["prompt_ids"])
    assert got.shape == npz[f"{kind}/mtp_logits"].shape
    assert rel_err(got, npz[f"{kind}/mtp_logits"]) < REF_TOL


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_last_logits(bf16_model, kind):
    npz = reference_logits()
    ids = PROMPTS[kind]["prompt_ids"]
    _h, last, am = bf16_model.sequence.prefill(np.asarray(ids, np.int32), 0)
    assert rel_err(last, npz[f"{kind}/last_logits"]) < REF_TOL
    assert am == PROMPTS[kind]["last_logits_argmax"]


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_greedy_and_speculative(bf16_model, kind):
    """Greedy continuation equals the reference; spec on ≡ spec off for n_max 1..3; acceptance counts equal."""
    check_greedy_and_speculative(bf16_model, PROMPTS[kind])
