"""bench/spec_depth.py's own logic without real-width files: llama-bench's jsonl at depth and llama-speculative-simple's
prompt count, the commands both engines get, the D-token prompt files (read back by the file's tokenizer), the
summary's ratios against hand-computed values and the table. No timings are asserted."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gguf
import pytest

from conftest import G4

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import spec_depth as sd  # noqa: E402
from machine_probe import machine  # noqa: E402

from nextn.runtime.tokenizer import Tokenizer  # noqa: E402


def bench_line(depth: int, ts: float, n_gen: int = 32) -> str:
    """One llama-bench `-o jsonl` line of a tg test at depth (the fields spec_depth reads, as llama-bench names
    them)."""
    return json.dumps({"build_commit": "abc", "build_number": 1, "n_threads": 1, "type_k": "f16", "type_v": "f16",
                       "flash_attn": True, "n_prompt": 0, "n_gen": n_gen, "n_depth": depth, "avg_ts": ts})


def test_parse_bench_depths_and_encoded():
    text = "\n".join(["noise", bench_line(8192, 3.5), bench_line(32768, 2.25),
                      json.dumps({"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 99.0})])
    got = sd.parse_bench_depths(text)
    assert set(got) == {"8192", "32768"}            # the pp line is not a tg result
    assert got["8192"]["tg"] == 3.5 and got["32768"]["tg"] == 2.25 and got["32768"]["flash_attn"] is True
    assert sd.parse_encoded("main: ...\nencoded 8192 tokens in   41.000 seconds, speed:  199.8 t/s\n") == 8192
    assert sd.parse_encoded("decoded 32 tokens in 3.0 seconds") is None


def test_commands_and_context():
    a = argparse.Namespace(depth=[8192, 32768], n_gen=32, ctx=32768, threads=1, cache_type_k="q8_0",
                              cache_type_v="f16", n_max=[1, 2])
    assert sd.ctx_for(a.ctx, a.depth, a.n_gen) == 32768 + 32 + 16      # raised: the deepest prompt + -n must fit
    assert sd.ctx_for(40000, [8192], 32) == 40000
    b = sd.bench_cmd("/m.gguf", a, "/peer/llama-bench", 8192)
    assert b[b.index("-d") + 1] == "8192" and b[b.index("-fa") + 1] == "on" and b[b.index("-p") + 1] == "0"
    assert b[b.index("-ctk") + 1] == "q8_0" and b[b.index("-n") + 1] == "32"
    s = sd.spec_cmd("/m.gguf", a, "/peer/llama-speculative-simple", "/tmp/p.txt", 2)
    for flag, want in (("-f", "/tmp/p.txt"), ("-c", str(32768 + 48)), ("-b", str(32768 + 48)), ("-ctkd", "q8_0"),
                       ("-ctvd", "f16"),
                       ("--spec-draft-n-max", "2"), ("--spec-type", "draft-mtp"), ("-fa", "on"), ("-t", "1")):
        assert s[s.index(flag) + 1] == want, flag


def test_depth_ids_and_prompt_files(tmp_path):
    assert sd.depth_ids([5, 6, 7], 7) == [5, 6, 7, 5, 6, 7, 5]
    with pytest.raises(ValueError):
        sd.depth_ids([], 3)
    path = str(G4 / "tiny-glm4moe-Q8_0.gguf")
    files = sd.prompt_files(path, [300, 2048], str(tmp_path))
    fields = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if k.startswith("tokenizer.")}
    tok = Tokenizer.from_gguf_fields(fields)
    for D, p in files.items():
        n = len(tok.encode(Path(p).read_text()))
        assert D <= n <= D + 2, (D, n)     # read back as D tokens (a merge across the cut may add one)


def _cell(tok_s, tokens, drafted=0, accepted=0, same=True):
    return {"tok_s": tok_s, "tokens": tokens, "acceptance": accepted / drafted if drafted else 0.0,
            "accepted": accepted, "drafted": drafted, "rounds": 10, "plain_rounds": 0, "per_pos": [],
            "same_as_plain": same}


def test_summary_ratios_and_table():
    ms = {f"{c}@{p}": v for p, f in ((64, 1.0), (8192, 2.0)) for c, v in
          (("decode", 100 * f), ("verify_2", 130 * f), ("verify_3", 150 * f), ("draft", 40 * f))}
    depth = {"runs": {"plain": _cell(4.0, [1, 2]), "n_max=1": _cell(5.0, [1, 2], 10, 8),
                      "auto": _cell(3.0, [1, 2])}, "ms": ms, "n_cached": 8192 - 256}
    slower = {"runs": {"plain": _cell(3.0, [1, 2]), "n_max=1": _cell(6.0, [1, 2], 10, 8, same=False),
                       "auto": _cell(3.5, [1, 2])}, "ms": {k: v * 2 for k, v in ms.items()}, "n_cached": 7936}
    llama = {"bench": {"depths": {"8192": {"tg": 2.0}}, "status": {"8192": "ok"}},
             "spec": {"8192": {"n_max=1": {"status": "ok", "tok_s": 1.6, "acceptance": 0.75, "accepted": 6,
                                            "drafted": 8, "encoded": 8192}}}}
    entry = {"name": "f.gguf", "rounds": [
        {"nextn": {"status": "ok", "depths": {"8192": depth},
                   "calibrate": {"s": 2.0, "k_max": 2, "verify_s": [0.1, 0.13, 0.15], "draft_s": 0.04,
                                 "row_s": 0.005}}, "llama": llama},
        {"nextn": {"status": "ok", "depths": {"8192": slower}}, "llama": {"bench": {"depths": {}}, "spec": {}}}]}
    s = sd.summarize(entry)["depths"]["8192"]
    assert s["nextn"]["plain"]["tok_s"] == 4.0 and s["nextn"]["n_max=1"]["tok_s"] == 6.0     # best of the rounds
    assert s["nextn"]["n_max=1"]["same_as_plain"] is False            # any round that differed counts
    assert s["ms"]["decode@8192"] == 200.0                            # min of the rounds
    assert s["deep_x_shallow"] == pytest.approx({"decode": 2.0, "verify_2": 2.0, "verify_3": 2.0, "draft": 2.0})
    r = s["ratio"]
    assert r["plain"]["nextn_llama"] == pytest.approx(4.0 / 2.0)      # nextn plain ÷ llama-bench tg at D
    assert r["n_max=1"]["nextn_llama"] == pytest.approx(6.0 / 1.6)
    assert r["n_max=1"]["nextn_own_plain"] == pytest.approx(6.0 / 4.0)
    assert r["n_max=1"]["llama_own_plain"] == pytest.approx(1.6 / 2.0)
    report = {"files": [{**entry, "summary": sd.summarize(entry)}], "machine": machine(), "threads": 1,
              "cache_type_k": "f16", "cache_type_v": "f16", "ctx_used": 32816, "n_gen": 32, "tail": 256,
              "repeat": 2, "loaded": True}
    t = sd.format_table(report)
    assert "| f.gguf | 8192 | n_max=1 | 6.00 | 0.800 (8/10) | NO | 1.60 | 0.750 (6/8) (8192) | 3.75 | 1.50 / 0.80 |" \
        in t
    assert "calibration at load (k_max 2): 2.0 s = 20 decodes" in t


def test_nextn_depth_runs_on_the_runtime(q8_model):
    """spec_depth's nextn side on the tiny Q8_0 fixture (the bench had fallen behind the runtime's API once). The
    whole 512-token prompt is prefilled first, so the 496 cells the bench takes as cached hold that prompt's KV: then
    every configuration's tokens equal that full generation's (a prompt-cache continuation is a cold start's, bit for
    bit), and the entry points are timed at 64 and 512."""
    from nextn.runtime.params import SamplingParams, SpecParams
    from nextn.runtime.speculative import generate

    base = q8_model.tokenizer.encode("The quick brown fox jumps over the lazy dog. ")
    ids = sd.depth_ids(base, 512)
    full = generate(q8_model.sequence, ids, SamplingParams(n_predict=8, ignore_eos=True), SpecParams("none", 1))
    out = sd.nextn_depth(q8_model, 512, 8, [1, 2], 16, 1, base)
    assert set(out["runs"]) == {"plain", "n_max=1", "n_max=2", "auto"} and out["n_cached"] == 496
    assert len(full.tokens) == 8
    for label, c in out["runs"].items():
        assert c["tokens"] == full.tokens and c["same_as_plain"], label
    assert {"decode@64", "decode@512", "verify_2@512", "verify_3@512", "draft@512"} <= set(out["ms"])
