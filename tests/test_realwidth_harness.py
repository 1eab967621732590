"""bench/realwidth.py's own logic, without llama.cpp or real-width files: the bytes read per decoded token
(nextn.common.manifest, against an independent count from the GGUF of the tiny Q8_0 fixture, whose buffer plan keeps
the file's bytes), the llama-bench parser, the summary and its table, file selection, the memory guard, and
bench/peer.py. No timings are asserted."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import G4
from nextn.common.manifest import read_bytes_per_row, step_read_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import peer  # noqa: E402
import realwidth as rw  # noqa: E402


def independent_decode_bytes(path: Path) -> float:
    """Bytes per decoded token counted straight from the GGUF: trunk blocks only, 3-D tensors (expert stacks, the
    last ggml dim is the expert) at n_expert_used of n_expert, one row of token_embd, everything else whole."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    n_layer = r.fields[f"{arch}.block_count"].contents() - r.fields[f"{arch}.nextn_predict_layers"].contents()
    used, n_exp = r.fields[f"{arch}.expert_used_count"].contents(), r.fields[f"{arch}.expert_count"].contents()
    total = 0.0
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= n_layer:
            continue
        if len(t.shape) == 3:
            assert int(t.shape[2]) == n_exp
            total += int(t.n_bytes) * used / n_exp
        elif t.name == "token_embd.weight":
            total += int(t.n_bytes) / int(t.shape[1])
        else:
            total += int(t.n_bytes)
    return total


def test_decode_bytes_match_an_independent_count(compiled):
    gguf = G4 / "tiny-glm4moe-Q8_0.gguf"
    manifest = json.loads((Path(compiled("q8", gguf)) / "manifest.json").read_text())
    want = independent_decode_bytes(gguf)
    plan = step_read_bytes(manifest, "decode")
    assert plan["total"] == pytest.approx(want, rel=1e-12)
    assert rw.decode_bytes_from_gguf(rw.gguf_info(str(gguf)))["total"] == pytest.approx(want, rel=1e-12)
    # The routed experts are read in part: less than the whole trunk, more than the trunk without experts.
    assert plan["routed"] > 0 and plan["total"] < manifest["buffer_plan"]["trunk_weight_bytes"]


def test_read_bytes_per_row_by_hand():
    tensors = [("token_embd.weight", 1000), ("blk.0.ffn_up_exps.weight", 800), ("blk.0.ffn_down_exps.weight", 400),
               ("blk.0.attn_q.weight", 50), ("output.weight", 300)]
    b = read_bytes_per_row(tensors, n_expert=8, n_expert_used=2, n_vocab=10)
    assert (b["token_embd_row"], b["routed"], b["dense"], b["lm_head"], b["total"]) == (100, 300, 50, 300, 750)
    tied = read_bytes_per_row(tensors[:-1], n_expert=8, n_expert_used=2, n_vocab=10)   # lm head = token_embd
    assert (tied["lm_head"], tied["total"]) == (1000, 100 + 300 + 50 + 1000)


def test_parse_llama_bench_jsonl():
    common = {"build_commit": "abc", "build_number": 1, "n_threads": 2, "model_size": 4423062304}
    text = "\n".join(["load_backend: noise", json.dumps({**common, "n_prompt": 512, "n_gen": 0, "avg_ts": 61.5}),
                      json.dumps({**common, "n_prompt": 0, "n_gen": 32, "avg_ts": 24.25})])
    got = rw.parse_llama_bench(text)
    assert (got["pp"], got["tg"], got["n_prompt"], got["n_gen"], got["n_threads"]) == (61.5, 24.25, 512, 32, 2)


def _nextn(tg, pp, ms):
    return {"status": "ok", "decode_tok_s": tg, "prefill_tok_s": pp, "ms": ms,
            "plan_bytes_per_token": {"total": 1.1e9}}


def test_summary_and_table():
    ms1 = {"verify_1": 400.0, "verify_2": 440.0, "verify_3": 900.0, "verify_4": 1000.0, "draft": 200.0}
    ms2 = {k: v * 1.5 for k, v in ms1.items()}
    ok_file = {"name": "a.gguf", "bytes_per_token": {"gguf": {"total": 1e9}}, "rounds": [
        {"bandwidth": {"read_GBps": 20.0}, "nextn": _nextn(1.5, 10.0, ms2), "llama": {"status": "ok", "tg": 6.0, "pp": 40.0}},
        {"bandwidth": {"read_GBps": 25.0}, "nextn": _nextn(2.0, 8.0, ms1), "llama": {"status": "ok", "tg": 8.0, "pp": 35.0}}]}
    s = rw.summarize(ok_file)
    assert (s["nextn_tg"], s["llama_tg"], s["nextn_pp"], s["llama_pp"], s["read_GBps"]) == (2.0, 8.0, 10.0, 40.0, 25.0)
    assert s["tg_ratio"] == pytest.approx(0.25) and s["pp_ratio"] == pytest.approx(0.25)
    assert s["nextn_GBps"] == pytest.approx(2.2) and s["llama_GBps"] == pytest.approx(8.0)
    assert s["llama_bw_fraction"] == pytest.approx(8.0 / 25.0)
    assert s["verify_x_decode"] == pytest.approx({"2": 1.1, "3": 2.25, "4": 2.5})
    assert s["draft_x_decode"] == pytest.approx(0.5)

    killed = {"name": "b.gguf", "bytes_per_token": {"gguf": {"total": 2e9}}, "rounds": [
        {"bandwidth": {"read_GBps": 22.0}, "nextn": {"status": "killed: anonymous memory 12.3 GB > budget 12.0 GB"},
         "llama": {"status": "ok", "tg": 4.0, "pp": 20.0}}]}
    sk = rw.summarize(killed)
    assert sk["nextn_status"].startswith("killed") and sk["llama_status"] == "ok" and sk["tg_ratio"] is None
    ok_file["summary"], killed["summary"] = s, sk
    ok_file["first_token"] = {"nextn": {"status": "ok", "wall_s": 30.0, "peak_rss": 6e9},
                              "llama": {"status": "ok", "wall_s": 10.0, "peak_rss": 5e9}}
    report = {"files": [ok_file, killed], "n_prompt": 512, "n_gen": 32, "threads": 2, "repeat": 2, "loaded": True,
              "machine": {"cpu": "cpu", "physical_cores": 2, "loadavg": (1.0, 1.0, 1.0)}}
    table = rw.format_table(report)
    lines = table.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = dict(zip(head, [c.strip() for c in lines[2].strip("|").split("|")]))
    assert head[-4:] == ["tg nextn/llama", "pp nextn/llama", "nextn/read BW", "llama/read BW"]   # ratios last
    assert (row["tg nextn/llama"], row["llama GB/s"], row["verify 2/3/4 rows ÷ decode"]) == ("0.25", "8.0", "1.10 / 2.25 / 2.50")
    row_b = dict(zip(head, [c.strip() for c in lines[3].strip("|").split("|")]))
    assert (row_b["nextn tg"], row_b["llama tg"], row_b["tg nextn/llama"]) == ("–", "4.00", "–")
    assert "| a.gguf | 30.0 | 6.00 | 10.0 | 5.00 | 3.00 | 1.20 |" in table
    assert any(x.startswith("- b.gguf: nextn: killed") for x in lines)
    assert rw.format_table(json.loads(json.dumps(report))) == table    # a saved report renders the same table


def test_a_file_over_the_memory_budget_is_not_loaded_again():
    killed = {"status": "killed: anonymous memory 12.2 GB > budget 12.0 GB"}
    entry = {"rounds": [{"nextn": {"status": "exit 1: some error"}}, {"nextn": killed}]}
    assert rw.over_budget(entry) == killed["status"]
    assert rw.over_budget({"rounds": [{"nextn": {"status": "ok"}}, {"nextn": {"status": "exit 1: x"}}]}) is None


def test_resolve_files_takes_the_known_files_that_exist_smallest_first(tmp_path):
    for name, size in (("glm45air-3.gguf", 30), ("glm45air-1.gguf", 10), ("glm52-1.gguf", 20), ("other.gguf", 1)):
        (tmp_path / name).write_bytes(b"x" * size)
    got = [os.path.basename(p) for p in rw.resolve_files([], str(tmp_path))]
    assert got == ["glm45air-1.gguf", "glm52-1.gguf", "glm45air-3.gguf"]
    assert [os.path.basename(p) for p in rw.resolve_files(["other.gguf"], str(tmp_path))] == ["other.gguf"]
    with pytest.raises(SystemExit, match="nope.gguf"):
        rw.resolve_files(["nope.gguf"], str(tmp_path))


def test_run_watched_kills_a_process_over_its_memory_budget():
    hog = "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    res = rw.run_watched([sys.executable, "-c", hog], budget_bytes=150e6)
    assert res["killed"] and "budget" in res["killed"] and res["rc"] != 0
    assert res["peak_anon"] > 150e6
    fine = rw.run_watched([sys.executable, "-c", "print('RESULT 1')"], budget_bytes=150e6)
    assert (fine["rc"], fine["killed"], fine["stdout"].strip()) == (0, None, "RESULT 1")


def test_peer_tool_says_how_to_build_when_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXTN_PEER_DIR", str(tmp_path))
    with pytest.raises(peer.PeerMissing, match="peer_llamacpp.sh"):
        peer.peer_tool("llama-bench")
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "llama-bench"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert peer.peer_tool("llama-bench") == str(exe)
    assert peer.peer_tools() == {"llama-bench": str(exe)}
