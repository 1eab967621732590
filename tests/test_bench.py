"""`nextn bench` on the fixture prompt set: report structure, lossless flags, greedy ids against the reference,
the PNG, and the one-line error for a bad prompt file. Speed is reported, never asserted."""
import json

import pytest

from conftest import FIXTURES, G4, reference
from nextn.runtime.bench import house_prompts, run_bench
from nextn.runtime.cli import main


@pytest.mark.slow   # a bench harness (every prompt x 5 configs x 2 modes): the slow tier holds benches
def test_bench_report_on_fixture_prompts(compiled, tmp_path):
    art = compiled("bf16", G4 / "tiny-glm4moe-BF16.gguf")
    out = tmp_path / "report.json"
    rep = run_bench(art, str(FIXTURES / "prompts.json"), str(out), n_predict=6, repeat=1, log=lambda s: None)
    assert json.loads(out.read_text())["configs"] == ["off", "n_max=1", "n_max=2", "n_max=3", "auto"]
    assert rep["device"] == "cpu"
    ref = {p["kind"]: p for p in reference()["prompts"]}
    for mode in ("greedy", "sampled"):
        rows = rep["modes"][mode]["rows"]
        assert [r["kind"] for r in rows] == [p["kind"] for p in json.load(open(FIXTURES / "prompts.json"))]
        for r in rows:
            assert all(r[c]["same_as_off"] for c in rep["configs"]), (mode, r["kind"])
            assert r["n_max=3"]["drafted"] > 0 and len(r["n_max=3"]["per_pos_rate"]) == 3
            # per-entry seconds (device-synchronized): plain decoding runs only `decode`, n_max 3 verifies and drafts
            assert {k for k, v in r["off"]["entry_s"].items() if v > 0} == {"decode"}
            assert {"verify", "draft"} <= {k for k, v in r["n_max=3"]["entry_s"].items() if v > 0}
            assert sum(r["n_max=3"]["entry_s"].values()) <= r["n_max=3"]["decode_s"]
            # every prompt fits the 4096-cell context whole (long-context: 2220 tokens), so greedy ids are the
            # reference's; the bench cuts a prompt to its tail only when it would not fit
            assert r["prompt_tokens"] == len(ref[r["kind"]]["prompt_ids"])
            if mode == "greedy":
                assert r["off"]["ids"] == ref[r["kind"]]["greedy_ids"][:6]
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_house_prompts_ship_nine_kinds():
    kinds = [p["kind"] for p in house_prompts()]
    assert len(kinds) == len(set(kinds)) == 9
    fixture_texts = {p["text"] for p in json.load(open(FIXTURES / "prompts.json"))}
    assert not fixture_texts & {p["text"] for p in house_prompts()}


def test_bench_bad_prompt_file(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text('{"kind": "x"}')
    try:
        main(["bench", str(G4 / "tiny-glm4moe-Q8_0.gguf"), "--prompts", str(bad), "-o", str(tmp_path / "r.json")])
    except SystemExit as e:
        assert e.code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and "expected a non-empty JSON list" in err


def test_bench_device_option(compiled, tmp_path, capsys):
    """`nextn bench --device`: a CPU artifact asked to run on a GPU, or an unknown device, is one line."""
    art = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    for device, says in (("cuda:0", "built for llvm"), ("tpu:0", "expected cpu or cuda:N")):
        try:
            main(["bench", art, "--device", device, "-o", str(tmp_path / "r.json"), "--no-plot"])
        except SystemExit as e:
            assert e.code == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and says in err and device in err, err
