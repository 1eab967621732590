"""bench/realwidth.py's own logic, without llama.cpp or real-width files: the bytes read per decoded token
(nextn.common.manifest, against an independent count from the GGUF of the tiny Q8_0 fixture, whose buffer plan keeps
the file's bytes), the llama-bench parser, the summary and its table, file selection, the memory guard, and
bench/peer.py. No timings are asserted."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import G4
from nextn.common.manifest import read_bytes_per_row, step_read_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_report  # noqa: E402
import gguf_bytes  # noqa: E402
import guarded  # noqa: E402
import llama_logs  # noqa: E402
import peer  # noqa: E402
import realwidth as rw  # noqa: E402
import realwidth_table  # noqa: E402


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
    assert gguf_bytes.decode_bytes_from_gguf(gguf_bytes.gguf_info(str(gguf)))["total"] == pytest.approx(want, rel=1e-12)
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
    got = llama_logs.parse_llama_bench(text)
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
    ok_file["rounds"][0]["nextn"]["verify_experts"] = {"distinct": 12.5, "routed": 32, "calls": 2}
    s = realwidth_table.summarize(ok_file)
    assert (s["nextn_tg"], s["llama_tg"], s["nextn_pp"], s["llama_pp"], s["read_GBps"]) == (2.0, 8.0, 10.0, 40.0, 25.0)
    assert s["tg_ratio"] == pytest.approx(0.25) and s["pp_ratio"] == pytest.approx(0.25)
    assert s["nextn_GBps"] == pytest.approx(2.2) and s["llama_GBps"] == pytest.approx(8.0)
    assert s["llama_bw_fraction"] == pytest.approx(8.0 / 25.0)
    assert s["verify_x_decode"] == pytest.approx({"2": 1.1, "3": 2.25, "4": 2.5})
    assert s["draft_x_decode"] == pytest.approx(0.5)
    assert s["tg_ratio_rounds"] == pytest.approx([0.25, 0.25])
    # per round, the two engines' speeds side by side: here 0.5 and 1.5, where the best of each gives 3.0 / 2.0
    drift = {"name": "d.gguf", "bytes_per_token": {"gguf": {"total": 1e9}}, "rounds": [
        {"nextn": _nextn(1.0, 1.0, ms1), "llama": {"status": "ok", "tg": 2.0, "pp": 1.0}},
        {"nextn": _nextn(3.0, 1.0, ms1), "llama": {"status": "ok", "tg": 2.0, "pp": 1.0}},
        {"nextn": {"status": "killed"}, "llama": {"status": "ok", "tg": 9.0, "pp": 1.0}}]}
    sd = realwidth_table.summarize(drift)
    assert sd["tg_ratio_rounds"] == pytest.approx([0.5, 1.5]) and sd["tg_ratio"] == pytest.approx(1.0 / 3.0)

    killed = {"name": "b.gguf", "size": 5e9, "bytes_per_token": {"gguf": {"total": 2e9}}, "rounds": [
        {"bandwidth": {"read_GBps": 22.0}, "nextn": {"status": "killed: anonymous memory 12.3 GB > budget 12.0 GB"},
         "llama": {"status": "ok", "tg": 4.0, "pp": 20.0}}],
        "first_token": {"nextn": {"status": "not run (killed: anonymous memory 12.3 GB in the rounds)"},
                        "llama": {"status": "exit 139: Segmentation fault", "wall_s": 1.0, "peak_rss": 1e9}}}
    sk = realwidth_table.summarize(killed)
    assert sk["nextn_status"].startswith("killed") and sk["llama_status"] == "ok" and sk["tg_ratio"] is None
    assert (sk["nextn_ft_s"], sk["llama_ft_s"], sk["llama_rss_x_file_kv"], sk["ft_ratio"]) == (None, None, None, None)
    # The first-token runs: peak RSS against file + each engine's own KV bytes, nextn's wall over llama.cpp's.
    ok_file["size"] = 4.5e9
    ok_file["first_token"] = {
        "nextn": {"status": "ok", "wall_s": 30.0, "peak_rss": 6e9, "kv": {"bytes": 0.5e9, "type_k": "f16", "type_v": "f16"}},
        "llama": {"status": "ok", "wall_s": 10.0, "peak_rss": 5e9, "kv": {"bytes": 0.25e9, "type_k": "f16", "type_v": "f16"}}}
    s = realwidth_table.summarize(ok_file)
    assert s["nextn_rss_x_file_kv"] == pytest.approx(6e9 / 5e9) and s["llama_rss_x_file_kv"] == pytest.approx(5e9 / 4.75e9)
    assert s["ft_ratio"] == pytest.approx(3.0) and s["nextn_kv_types"] == "f16/f16"
    skipped = {"name": "c.gguf", "size": 13e9, "bytes_per_token": {"gguf": {"total": 1.3e9}}, "rounds": [],
               "skipped": "needs 13.0 GB (file) + 2.0 GB (--headroom-gb) of memory, MemAvailable is 9.0 GB"}
    sc = realwidth_table.summarize(skipped)
    assert sc["nextn_status"].startswith("skipped") and sc["llama_tg"] is None
    ok_file["summary"], killed["summary"], skipped["summary"] = s, sk, sc
    report = {"files": [ok_file, killed, skipped], "n_prompt": 512, "n_gen": 32, "threads": 2, "repeat": 2,
              "loaded": True, "cache_type_k": "f16", "cache_type_v": "f16",
              "machine": {"cpu": "cpu", "physical_cores": 2, "loadavg": (1.0, 1.0, 1.0)}}
    table = realwidth_table.format_table(report)
    lines = table.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = dict(zip(head, [c.strip() for c in lines[2].strip("|").split("|")]))
    assert head[-4:] == ["tg nextn/llama", "pp nextn/llama", "nextn/read BW", "llama/read BW"]   # ratios last
    assert (row["tg nextn/llama"], row["llama GB/s"], row["verify 2/3/4 rows ÷ decode"]) == ("0.25", "8.0", "1.10 / 2.25 / 2.50")
    assert row["tg nextn/llama per round: median (min–max)"] == "0.25 (0.25–0.25)"
    experts = "experts of verify 4: distinct / routed"
    assert row[experts] == "12.5 / 32"
    assert realwidth_table._per_round([0.5, 1.5, 0.9]) == "0.90 (0.50–1.50)"
    row_b = dict(zip(head, [c.strip() for c in lines[3].strip("|").split("|")]))
    assert (row_b["nextn tg"], row_b["llama tg"], row_b["tg nextn/llama"], row_b[experts]) == ("–", "4.00", "–", "–")
    mem = lines.index(next(x for x in lines if x.startswith("| file | file GB")))
    head2 = [c.strip() for c in lines[mem].strip("|").split("|")]
    assert head2[-3:] == ["RSS ÷ (file+KV) nextn / llama", "wall nextn/llama", "tg nextn/llama"]   # ratios last
    assert lines[mem + 2] == ("| a.gguf | 4.50 | 0.50 / 0.25 | f16/f16 / f16/f16 | 6.00 | 5.00 | 30.0 | 10.0 | 2.00 | "
                              "8.00 | 1.20 / 1.05 | 3.00 | 0.25 |")
    assert lines[mem + 3].startswith("| b.gguf | 5.00 | – / – | – / – | – | – | – | – | – | 4.00 | – / – | – | – |")
    assert any(x.startswith("- b.gguf: nextn: killed") for x in lines)
    assert "- b.gguf: first token, llama: exit 139: Segmentation fault" in lines
    assert not any(x.startswith("- b.gguf: first token, nextn") for x in lines)   # "not run" is said in the rounds
    assert any(x.startswith("- c.gguf: skipped: needs 13.0 GB") for x in lines)
    assert "2 thread(s) both engines, KV -ctk f16 -ctv f16" in table
    assert realwidth_table.format_table(json.loads(json.dumps(report))) == table    # a saved report renders the same table


def test_parse_llama_kv_takes_the_last_context_and_sums_its_caches():
    log = "\n".join([
        "0.00.1 I llama_context: constructing llama_context",        # the throw-away context of the memory fit
        "0.00.2 I llama_kv_cache: size =  999.00 MiB (  4096 cells,   4 layers,  1/1 seqs), K (f16):  1.00 MiB, V (f16):  1.00 MiB",
        "0.00.3 I llama_context: constructing llama_context",
        "0.00.4 D llama_kv_cache: layer   4: filtered",
        "0.00.5 I llama_kv_cache: size =    5.00 MiB (  4096 cells,   4 layers,  1/1 seqs), K (q8_0):    5.00 MiB, V (f16):    0.00 MiB",
        "0.00.6 I llama_kv_cache: attn_rot_k = 0, n_embd_head_k_all = 32",
        "0.00.7 I llama_kv_cache: size =    2.50 MiB (  4096 cells,   4 layers,  1/1 seqs), K (q8_0):    2.50 MiB, V (f16):    0.00 MiB"])
    assert llama_logs.parse_llama_kv(log) == {"bytes": 7.5 * (1 << 20), "type_k": "q8_0", "type_v": "f16"}
    assert llama_logs.parse_llama_kv("llama_context: constructing llama_context\nno cache lines") is None


def test_first_token_runs_get_the_same_settings_on_both_sides():
    a = argparse.Namespace(threads=2, ctx=4096, cache_type_k="q8_0", cache_type_v="f16")
    tools = {"llama-completion": "/peer/llama-completion"}
    runs = rw.first_token_cmds("/m.gguf", a, tools, "/venv/bin/nextn", {"threads": True})
    nx, env = runs["nextn"]
    ll, _ = runs["llama"]

    def opt(cmd, flag):
        return cmd[cmd.index(flag) + 1]
    for flag, want in (("-t", "2"), ("-c", "4096"), ("-ctk", "q8_0"), ("-ctv", "f16"), ("-n", "1"), ("-p", rw.PROMPT)):
        assert opt(nx, flag) == opt(ll, flag) == want
    assert env["TVM_NUM_THREADS"] == "2" and "--json" in nx and "-no-cnv" in ll and "-v" in ll
    bare = rw.first_token_cmds("/m.gguf", a, {}, "/venv/bin/nextn", {"threads": False})
    assert list(bare) == ["nextn"]     # no llama-completion built: nextn alone
    assert "-t" not in bare["nextn"][0] and bare["nextn"][1]["TVM_NUM_THREADS"] == "2"   # threads by env alone


def test_memory_check_skips_a_file_that_does_not_fit():
    assert guarded.memory_check(int(12.7e9), 2.0, available=int(15e9)) is None
    why = guarded.memory_check(int(12.7e9), 2.0, available=int(14e9))
    assert why == "needs 12.7 GB (file) + 2.0 GB (--headroom-gb) of memory, MemAvailable is 14.0 GB"


def test_a_file_over_the_memory_budget_is_not_loaded_again():
    killed = {"status": "killed: anonymous memory 12.2 GB > budget 12.0 GB"}
    entry = {"rounds": [{"nextn": {"status": "exit 1: some error"}}, {"nextn": killed}]}
    assert guarded.over_budget(entry) == killed["status"]
    assert guarded.over_budget({"rounds": [{"nextn": {"status": "ok"}}, {"nextn": {"status": "exit 1: x"}}]}) is None


def test_resolve_files_takes_the_known_files_that_exist_smallest_first(tmp_path):
    for name, size in (("glm45air-3.gguf", 30), ("glm45air-1.gguf", 10), ("glm52-1.gguf", 20), ("other.gguf", 1)):
        (tmp_path / name).write_bytes(b"x" * size)
    got = [os.path.basename(p) for p in bench_report.resolve_files([], str(tmp_path), rw.KNOWN)]
    assert got == ["glm45air-1.gguf", "glm52-1.gguf", "glm45air-3.gguf"]
    assert [os.path.basename(p) for p in bench_report.resolve_files(["other.gguf"], str(tmp_path))] == ["other.gguf"]
    with pytest.raises(SystemExit, match="nope.gguf"):
        bench_report.resolve_files(["nope.gguf"], str(tmp_path))


def test_run_watched_kills_a_process_over_its_memory_budget():
    hog = "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    res = guarded.run_watched([sys.executable, "-c", hog], budget_bytes=150e6)
    assert res["killed"] and "budget" in res["killed"] and res["rc"] != 0
    assert res["peak_anon"] > 150e6
    fine = guarded.run_watched([sys.executable, "-c", "print('RESULT 1')"], budget_bytes=150e6)
    assert (fine["rc"], fine["killed"], fine["stdout"].strip()) == (0, None, "RESULT 1")


def test_peak_rss_is_the_childs_own_not_the_spawners():
    big = bytearray(400 << 20)          # raise this process's high-water mark, which a spawned child inherits
    big[::4096] = b"x" * len(big[::4096])
    del big
    small = guarded.run_watched([sys.executable, "-c", "import time; time.sleep(0.6)"], budget_bytes=1e9)
    assert 0 < small["peak_rss"] < 100e6     # (its wait4 ru_maxrss reads > 400 MB on Linux)
    grow = "import time; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.6)"
    assert 200e6 < guarded.run_watched([sys.executable, "-c", grow], budget_bytes=1e9)["peak_rss"] < 400e6


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
    assert peer.peer_version() is None
    (tmp_path / "bin" / ".stamp").write_text("llama-cpp-python==0.3.36 -DGGML_NATIVE=ON\n")
    assert peer.peer_version() == "llama-cpp-python==0.3.36 -DGGML_NATIVE=ON"


def test_kernel_profile_times_each_kernel_of_a_step(q8_model):
    """bench/kernel_profile.py: the VM instrument times the kernels of a verify step (the verify entry's row-count
    matmuls among them), their sum stays within the step's total, and the step's output with the instrument on is
    the output without it (the instrument only watches)."""
    import kernel_profile

    seq = q8_model.sequence
    seq.prefill([1, 2, 3, 4, 5, 6, 7, 8], 0)
    before = seq.verify([9, 10, 11], 8)[1].numpy()
    times = kernel_profile.profile(seq, lambda: seq.verify([9, 10, 11], 8), repeat=2)
    total = times.pop("(step total)")
    assert any(s.startswith("x86_matmul_") and "_rowst" in s for s in times)
    assert 0 < sum(times.values()) <= total
    during = []
    assert np.array_equal(seq.verify([9, 10, 11], 8)[1].numpy(), before)
    times = kernel_profile.profile(seq, lambda: during.append(seq.verify([9, 10, 11], 8)[1].numpy()), repeat=1)
    assert all(np.array_equal(d, before) for d in during) and len(during) == 3


def test_routed_experts_counts_what_a_verify_reads(q8_model):
    """bench/kernel_profile.routed_experts on the tiny MoE fixture: per routed-expert kernel call of a verify of 3
    rows, the rows x n_expert_used ids routed, two calls (gate+up, down) per MoE layer, and how many distinct
    experts the ids name: at least one row's n_expert_used (a row's ids are distinct), at most all of them."""
    import kernel_profile

    seq = q8_model.sequence
    hp = seq.model.hparams
    seq.prefill([1, 2, 3, 4, 5, 6, 7, 8], 0)
    e = kernel_profile.routed_experts(seq, lambda: seq.verify([9, 10, 11], 8))
    n_moe = int(hp["n_layer"]) - int(hp["n_lead_dense"])   # trunk layers (the NextN block is apart)
    assert e["routed"] == 3 * int(hp["n_expert_used"]) and e["calls"] == 2 * n_moe
    assert int(hp["n_expert_used"]) <= e["distinct"] <= e["routed"]



def test_a_file_that_memory_cannot_hold_is_recorded_as_skipped(tmp_path, monkeypatch):
    """Both real-width benches start a file's entry the same way (bench_report.file_entry) and skip it, saying why,
    when MemAvailable cannot hold its pages plus the headroom (guarded.skipped_for_memory)."""
    f = tmp_path / "x.gguf"
    f.write_bytes(b"\0" * 4096)
    entry = bench_report.file_entry(str(f), {"arch": "glm4moe", "n_layer": 2}, bytes_per_token={"gguf": 1})
    assert list(entry) == ["name", "path", "size", "arch", "n_layer", "bytes_per_token", "rounds"]
    assert (entry["name"], entry["size"], entry["rounds"]) == ("x.gguf", 4096, [])
    said = []
    monkeypatch.setattr(guarded, "meminfo", lambda: {"MemAvailable": int(2.5e9)})
    assert not guarded.skipped_for_memory(dict(entry), 2.0, said.append) and not said
    monkeypatch.setattr(guarded, "meminfo", lambda: {"MemAvailable": int(1.5e9)})
    assert guarded.skipped_for_memory(entry, 2.0, said.append)
    assert entry["skipped"] == ("needs 0.0 GB (file) + 2.0 GB (--headroom-gb) of memory, MemAvailable is 1.5 GB")
    assert said == ["x.gguf: skipped: " + entry["skipped"]]


def test_saved_report_is_summarized_again_and_file_notes_say_why_rows_are_missing(tmp_path):
    """bench_report.saved_report (every bench's --table) re-summarizes each saved file with today's `summarize`;
    file_notes: a skipped file has no rows (False, its reason noted), a failed nextn run is noted, an ok one not."""
    files = [{"name": "a.gguf", "rounds": [1, 2]}, {"name": "b.gguf", "rounds": [], "skipped": "no memory"}]
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"files": files, "summary": "stale"}))
    report = bench_report.saved_report(str(path), lambda e: {"n_rounds": len(e["rounds"])})
    assert [e["summary"] for e in report["files"]] == [{"n_rounds": 2}, {"n_rounds": 0}]
    notes = []
    assert bench_report.file_notes(files[0], {"nextn_status": "ok"}, notes) and notes == []
    assert bench_report.file_notes(files[0], {"nextn_status": "killed (rc -9)"}, notes)
    assert not bench_report.file_notes(files[1], {}, notes)
    assert notes == ["- a.gguf: nextn: killed (rc -9)", "- b.gguf: skipped: no memory"]


def test_llama_bench_rows_skip_log_lines():
    """llama_logs.llama_bench_rows: only the jsonl records of llama-bench's output, in order, parsed."""
    text = 'build: 1\n{"n_prompt": 0, "n_gen": 32, "avg_ts": 5.5}\nnoise {\n  {"n_prompt": 512, "n_gen": 0}\n'
    rows = list(llama_logs.llama_bench_rows(text))
    assert rows == [{"n_prompt": 0, "n_gen": 32, "avg_ts": 5.5}, {"n_prompt": 512, "n_gen": 0}]
    assert llama_logs.llama_bench_build({"build_number": 7, "build_commit": "abc"}) == "7 (abc)"


def test_reports_name_no_folder_of_the_machine(tmp_path, monkeypatch):
    """A report records a file under the home folder as ~/..., any other absolute path by its name (reports are kept
    in the repository); and every report kept in bench/reports/ holds no absolute path."""
    import gzip

    from bench_report import shown_path

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert shown_path(str(tmp_path / "home" / ".cache" / "f.gguf")) == "~/.cache/f.gguf"
    assert shown_path(str(tmp_path / "homework" / "f.gguf")) == "f.gguf"
    assert shown_path("/tmp/out/report.json") == "report.json" and shown_path("glm45air-1") == "glm45air-1"

    def strings(x):
        if isinstance(x, dict):
            return [s for v in x.values() for s in strings(v)]
        if isinstance(x, list):
            return [s for v in x for s in strings(v)]
        return [x] if isinstance(x, str) else []

    kept = sorted((Path(__file__).resolve().parents[1] / "bench" / "reports").glob("*.json.gz"))
    assert kept
    for p in kept:
        assert not [s for s in strings(json.load(gzip.open(p))) if s.startswith("/")], p.name
