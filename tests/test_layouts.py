"""GGUF layouts: trunk-only (spec off; draft-mtp refused clearly) and trunk-only + MTP-only draft."""
import json
import subprocess
import sys

import pytest

from conftest import G4, reference

import nextn.runtime as rt
from nextn.common.errors import NextnError

P = next(p for p in reference()["prompts"] if p["kind"] == "docs-api")


def test_trunk_only_runs_without_speculation(compiled, q8_model):
    m = rt.load(compiled("trunk", G4 / "tiny-glm4moe-trunk-Q8_0.gguf"), spec=False)
    assert not m.has_mtp
    r = m.generate(P["prompt_ids"], 24, spec_type="none", ignore_eos=True)
    # the trunk-only file holds the same Q8_0 trunk tensors as the bundle
    assert r.ids == q8_model.generate(P["prompt_ids"], 24, spec_type="none", ignore_eos=True).ids
    with pytest.raises(NextnError, match="NextN"):
        m.generate(P["prompt_ids"], 4, spec_type="draft-mtp")


def test_trunk_only_refuses_draft_mtp_cli(compiled):
    art = compiled("trunk", G4 / "tiny-glm4moe-trunk-Q8_0.gguf")
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", art, "-p", "x", "-n", "2",
                        "--spec-type", "draft-mtp"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "trunk-only" in r.stderr and "--model-draft" in r.stderr


def test_trunk_plus_mtp_draft_equals_bundle(compiled, q8_model):
    art = compiled("pair", G4 / "tiny-glm4moe-trunk-Q8_0.gguf", G4 / "mtp-tiny-glm4moe-Q8_0.gguf")
    man = json.load(open(f"{art}/manifest.json"))
    assert [f["role"] for f in man["model_files"]] == ["model", "draft"]
    m = rt.load(art)
    assert m.has_mtp
    for n_max in (1, 3):
        got = m.generate(P["prompt_ids"], 32, n_max=n_max, ignore_eos=True)
        want = q8_model.generate(P["prompt_ids"], 32, n_max=n_max, ignore_eos=True)
        assert got.ids == want.ids
        counters = ("rounds", "drafted", "accepted", "acceptance", "mean_len", "per_pos")
        assert {k: got.stats.to_json()[k] for k in counters} == {k: want.stats.to_json()[k] for k in counters}
        assert got.stats.drafted > 0


def test_mtp_weights_not_read_when_spec_off(compiled):
    m = rt.load(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), spec=False)
    assert not m.has_mtp
    plan = m.engine.artifact.manifest["buffer_plan"]
    assert m.engine.weight_bytes == plan["trunk_weight_bytes"] < plan["weight_bytes"]
    assert not any(k.startswith("nextn.") for k in m.engine.states)


def test_mtp_only_file_as_model_is_refused():
    with pytest.raises(NextnError, match="MTP-only"):
        rt.load(str(G4 / "mtp-tiny-glm4moe-Q8_0.gguf"))
