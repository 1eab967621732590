"""GGUF layouts: trunk-only (spec off; draft-mtp refused clearly) and trunk-only + MTP-only draft."""
import json
import os
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


def _tensors_read(monkeypatch, load):
    """(tensor names read, GGUF paths opened) while `load()` runs: the GGUF reader instrumented."""
    from nextn.common.gguf import GGUFFile

    read, opened = [], []
    orig_load, orig_init, orig_open = GGUFFile.load, GGUFFile.__init__, GGUFFile.open.__func__

    def counting_load(self, name, quantized=True):
        read.append(name)
        return orig_load(self, name, quantized)

    def counting_init(self, path):
        opened.append(os.path.basename(os.fspath(path)))
        orig_init(self, path)

    def counting_open(cls, path):       # GGUFFile.open: a file parsed earlier in this process is not parsed again
        name = os.path.basename(os.fspath(path))
        n = len(opened)
        f = orig_open(cls, path)
        if len(opened) == n:
            opened.append(name)
        return f

    monkeypatch.setattr(GGUFFile, "load", counting_load)
    monkeypatch.setattr(GGUFFile, "__init__", counting_init)
    monkeypatch.setattr(GGUFFile, "open", classmethod(counting_open))
    model = load()
    monkeypatch.undo()
    return model, read, opened


def _nextn_block(path) -> str:
    """`blk.{n_layer}.`: the NextN block's tensor prefix, read from the GGUF with gguf-py."""
    import gguf

    f = gguf.GGUFReader(str(path)).fields
    n_all = int(f["glm4moe.block_count"].contents())
    n_nextn = int(f["glm4moe.nextn_predict_layers"].contents()) if "glm4moe.nextn_predict_layers" in f else 0
    return f"blk.{n_all - n_nextn}."


def test_mtp_weights_not_read_when_spec_off(compiled, monkeypatch):
    """With speculation off no NextN tensor is read (the reader counts what it is asked for); with it on they are,
    each tensor once. The split pair with spec off does not even open the MTP-only draft file."""
    bundle = G4 / "tiny-glm4moe-Q8_0.gguf"
    art = compiled("q8", bundle)
    block = _nextn_block(bundle)
    m, off, _ = _tensors_read(monkeypatch, lambda: rt.load(art, spec=False))
    assert not m.has_mtp and off and len(off) == len(set(off))
    assert not [t for t in off if t.startswith(block)]
    m, on, _ = _tensors_read(monkeypatch, lambda: rt.load(art, spec=True))
    assert m.has_mtp and len(on) == len(set(on))
    nextn = {t for t in on if t.startswith(block)}
    assert nextn and set(on) - nextn == set(off)   # spec on reads the trunk's tensors plus the NextN block
    assert m.loaded.weight_bytes > rt.load(art, spec=False).loaded.weight_bytes
    pair = compiled("pair", G4 / "tiny-glm4moe-trunk-Q8_0.gguf", G4 / "mtp-tiny-glm4moe-Q8_0.gguf")
    m, off, opened = _tensors_read(monkeypatch, lambda: rt.load(pair, spec=False))
    assert not m.has_mtp and opened == ["tiny-glm4moe-trunk-Q8_0.gguf"]
    assert not [t for t in off if t.startswith(block)]


@pytest.mark.e2e
def test_mtp_only_file_as_model_is_refused():
    with pytest.raises(NextnError, match="MTP-only"):
        rt.load(str(G4 / "mtp-tiny-glm4moe-Q8_0.gguf"))
