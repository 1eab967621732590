"""bench/spec_realwidth.py's own logic without real-width files: llama.cpp's log parsers and command lines (a fake
peer), the byte counts of a verify and of a draft step (against an independent count from the tiny fixture's GGUF),
the kernel-name matching of the decode and verify entries, the cost split per round, the projection to the real
layer count and the tables; and (slow) one nextn round on the tiny fixture, whose acceptance is checked against a
naive replay of greedy draft-mtp from teacher-forced NextN logits. No timings are asserted."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import G4

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import kernel_profile  # noqa: E402
import bench_report  # noqa: E402
import gguf_bytes  # noqa: E402
import llama_logs  # noqa: E402
import spec_realwidth as sr  # noqa: E402

# the lines llama.cpp prints, in its own formats (common/sampling.cpp common_perf_print; examples/speculative-simple;
# common/speculative.cpp common_speculative_print_stats at -lv 4)
COMPLETION_LOG = """\
common_perf_print:    sampling time =       1.23 ms
common_perf_print: prompt eval time =     250.00 ms /    10 tokens (   25.00 ms per token,    40.00 tokens per second)
common_perf_print:        eval time =    2000.00 ms /    15 runs   (  133.33 ms per token,     7.50 tokens per second)
common_perf_print:       total time =    2260.00 ms /    25 tokens
"""


def speculative_log(decoded: int, seconds: float, drafted: int, accepted: int, per_pos: str) -> str:
    return (f"encoded   10 tokens in    0.250 seconds, speed:   40.000 t/s\n"
            f"decoded {decoded:4d} tokens in {seconds:8.3f} seconds, speed: {decoded / seconds:8.3f} t/s\n\n"
            f"n_draft   = 3\nn_predict = {decoded}\nn_drafted = {drafted}\nn_accept  = {accepted}\n"
            f"accept    = {100 * accepted / drafted:.3f}%\n\ndraft:\n\n"
            f"spec print_stats: statistics        draft-mtp: #calls(b,g,a) =    1     20     20, #gen drafts =     20, "
            f"#acc drafts =    14, #gen tokens =     {drafted}, #acc tokens =    {accepted}, #mean acc len = 1.70, "
            f"#acc rate/pos = ({per_pos})\n")


def test_parse_llama_logs():
    got = llama_logs.parse_completion(COMPLETION_LOG)
    assert got["tok_s"] == pytest.approx(7.5) and got["n_eval"] == 15 and got["prompt_tok_s"] == pytest.approx(40.0)
    assert llama_logs.parse_completion("no perf lines") == {}
    got = llama_logs.parse_speculative(speculative_log(17, 2.0, 20, 14, "0.700"))
    assert (got["decoded"], got["drafted"], got["accepted"], got["per_pos"]) == (17, 20, 14, [0.7])
    assert got["tok_s"] == pytest.approx(8.5) and got["acceptance"] == pytest.approx(0.7)
    assert got["mean_len"] == pytest.approx(1.7)
    three = llama_logs.parse_speculative(speculative_log(30, 3.0, 60, 33, "0.800, 0.550, 0.300"))
    assert three["per_pos"] == [0.8, 0.55, 0.3]
    assert llama_logs.parse_speculative(COMPLETION_LOG) == {}
    plain_log = speculative_log(17, 2.0, 20, 14, "0.700").split("\ndraft:")[0]   # without -lv 4: no per-position
    assert llama_logs.parse_speculative(plain_log)["per_pos"] is None


def test_llama_runs_get_nextns_settings():
    a = argparse.Namespace(threads=2, ctx=4096, cache_type_k="q8_0", cache_type_v="f16", n_gen=128, n_max=[1, 3])
    tools = {"llama-completion": "/peer/llama-completion", "llama-speculative-simple": "/peer/llama-speculative-simple"}
    cmds = sr.llama_cmds("/m.gguf", a, tools)
    assert list(cmds) == ["plain", "n_max=1", "n_max=3"]

    def opt(cmd, flag):
        return cmd[cmd.index(flag) + 1]
    for cmd in cmds.values():
        for flag, want in (("-m", "/m.gguf"), ("-t", "2"), ("-c", "4096"), ("-ctk", "q8_0"), ("-ctv", "f16"),
                           ("-n", "128"), ("-p", bench_report.PROMPT), ("--temp", "0")):
            assert opt(cmd, flag) == want
        assert "--ignore-eos" in cmd
    assert cmds["plain"][0] == "/peer/llama-completion" and "-no-cnv" in cmds["plain"]
    spec = cmds["n_max=3"]
    assert (opt(spec, "--spec-type"), opt(spec, "--spec-draft-n-max"), opt(spec, "-lv")) == ("draft-mtp", "3", "4")
    assert (opt(spec, "-ctkd"), opt(spec, "-ctvd")) == ("q8_0", "f16")     # the MTP context's KV too
    assert list(sr.llama_cmds("/m.gguf", a, {"llama-completion": "/x"})) == ["plain"]


def test_verify_and_draft_bytes():
    dec = {"dense": 200.0, "routed": 80.0, "lm_head": 500.0, "token_embd_row": 2.0, "total": 782.0}
    # 8 used, 12 distinct: the routed bytes grow by 12 / 8, the embedding by one row, the rest once
    assert sr.verify_bytes(dec, 2, 12.0, 8) == pytest.approx(200 + 80 * 1.5 + 500 + 2 * 2)
    assert sr.verify_bytes(dec, 1, 8.0, 8) == dec["total"]
    # one draft step: the NextN block (its 3-D expert stacks at used / n_expert), the lm head, one embedding row
    from gguf import GGUFReader

    path = G4 / "tiny-glm4moe-Q8_0.gguf"
    r = GGUFReader(str(path))
    info = gguf_bytes.gguf_info(str(path))
    want = 0.0
    for t in r.tensors:
        parts = t.name.split(".")
        if t.name == "output.weight":
            want += int(t.n_bytes)
        elif t.name == "token_embd.weight":
            want += int(t.n_bytes) / int(t.shape[1])
        elif parts[0] == "blk" and int(parts[1]) == info["n_layer"]:
            want += int(t.n_bytes) * (info["n_expert_used"] / info["n_expert"] if len(t.shape) == 3 else 1)
    assert sr.draft_bytes(info) == pytest.approx(want, rel=1e-12)
    assert 0 < sr.draft_bytes(info) < gguf_bytes.decode_bytes_from_gguf(info)["total"]


def test_draft_vocab_configs_bytes_ranks_and_merge():
    """--draft-vocab: the reduced-head process runs the speculative configs only, labelled `... dvN`; a draft step
    with N head rows reads N / n_vocab of the head (an independent count from the fixture's tensors); the ranks and
    their coverage of a chain; a reduced-head round's runs fold into the full-head round, checked against plain."""
    assert [c[0] for c in sr.configs([1, 2])] == ["plain", "n_max=1", "n_max=2", "auto"]
    assert sr.configs([1, 2], 4096) == [("plain dv4096", "none", 1), ("n_max=1 dv4096", "draft-mtp", 1),
                                        ("n_max=2 dv4096", "draft-mtp", 2), ("auto dv4096", "draft-mtp", "auto")]
    assert [sr.own_plain(x, ["plain", "plain dv8"]) for x in ("n_max=1 dv8", "auto dv16", "auto")] == [
        "plain dv8", "plain", "plain"]
    assert [sr.label_draft_vocab(x) for x in ("n_max=3 dv16384", "auto dv7", "auto", "plain")] == [16384, 7, 0, 0]
    from gguf import GGUFReader

    path = G4 / "tiny-glm4moe-Q8_0.gguf"
    info = gguf_bytes.gguf_info(str(path))
    head = next(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if t.name == "output.weight")
    V = info["n_vocab"]
    assert sr.draft_bytes(info, 1024) == pytest.approx(sr.draft_bytes(info) - head + head * 1024 / V, rel=1e-12)
    # ranks: the counted ids by frequency, then the merge order; coverage counts positions
    fields = {"tokenizer.ggml.tokens": ["a", "b", "c", "ab", "abc"], "tokenizer.ggml.merges": ["a b", "ab c"]}
    assert sr.vocab_ranks(fields, 5).tolist() == [0, 1, 2, 3, 4]
    assert sr.vocab_ranks(fields, 5, [4, 2, 4]).tolist() == [4, 2, 0, 1, 3]
    assert sr.coverage([4, 2, 4, 1], [4, 2, 0], 2) == 0.75 and sr.coverage([4, 2], [4, 2], 1) == 0.5
    plain = {"tokens": [5, 6, 7]}
    nx = {"status": "ok", "runs": {"plain": plain}, "ms": {"verify_1": 10.0}}
    dv = {"status": "ok", "runs": {"n_max=1 dv8": {"tokens": [5, 6, 7], "same_as_plain": True},
                                   "auto dv8": {"tokens": [5, 6, 8], "same_as_plain": True}},
          "ms": {"draft dv8": 2.0, "verify_1 dv8": 9.0}, "calibrate_s": {"8": 1.5}}
    sr.merge_draft_vocab(nx, dv, 8)
    assert nx["runs"]["n_max=1 dv8"]["same_as_plain"] and not nx["runs"]["auto dv8"]["same_as_plain"]
    assert nx["ms"] == {"verify_1": 10.0, "draft dv8": 2.0, "verify_1 dv8": 9.0} and nx["calibrate_s"] == {"8": 1.5}
    sr.merge_draft_vocab(nx, {"status": "failed: rc 1"}, 16)
    assert nx["draft_vocab_status"] == {"8": "ok", "16": "failed: rc 1"} and "n_max=1 dv16" not in nx["runs"]


def test_kernel_names_and_excess():
    key = kernel_profile.kernel_key
    assert key("x86_matmul_q4_k_f32_n4096_k4096_rows1") == key("x86_matmul_q4_k_f32_n4096_k4096_rowst") == \
        "x86_matmul_q4_k_f32_n4096_k4096_rows"
    assert (key("x86_matmul_id_q4_k_f32_n1408_k4096_rowst_x128_used8_slots_w1")
            == "x86_matmul_id_q4_k_f32_n1408_k4096_rows_x128_used8_slots_w1")
    assert key("fused_rms_norm3_mul4") == key("fused_rms_norm_mul") == "fused_rms_norm_mul"
    assert key("flash_attn_partial_cpu_h8_2_d32_32_f32_f32") == "flash_attn_partial_cpu_h8_2_d32_32_f32_f32"
    assert kernel_profile.by_family({"add1": 1.0, "add2": 2.0, "mul": 0.5}, {"add1": 3, "add2": 1}) == (
        {"add": 3.0, "mul": 0.5}, {"add": 4})
    dec = {"x86_matmul_id_q_rows1": 10.0, "x86_matmul_q_rows1": 4.0, "add3": 0.5, "(step total)": 16.0}
    ver = {"x86_matmul_id_q_rowst": 25.0, "x86_matmul_q_rowst": 5.0, "add": 0.25, "add1": 0.5, "(step total)": 33.0}
    rows = {r["kernel"]: r for r in sr.kernel_excess(dec, ver, expert_ratio=1.5, calls={"add": 2, "add1": 3})}
    ex = rows["x86_matmul_id_q_rows"]
    assert (ex["byte_ratio"], ex["ratio"], ex["excess_ms"]) == (1.5, 2.5, pytest.approx(25 - 15))
    assert rows["x86_matmul_q_rows"]["excess_ms"] == pytest.approx(1.0)
    assert rows["add"]["verify_ms"] == 0.75 and rows["add"]["calls"] == 5 and rows["add"]["excess_ms"] == 0.25
    assert sr.kernel_excess(dec, ver, 1.5)[0]["kernel"] == "(step total)"   # 33 - 16: largest first


def _cell(tokens, rounds, plain, emitted, decode_s, entry, drafted=0, accepted=0, n_max=0):
    return {"tokens": tokens, "emitted": emitted, "decode_s": decode_s, "tok_s": emitted / decode_s,
            "rounds": rounds, "plain_rounds": plain, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else 0.0, "mean_len": 1 + accepted / rounds if rounds else 0,
            "per_pos": [accepted / rounds if rounds else 0.0, 0.0], "per_pos_rate": [0.0, 0.0],
            "drafted_at": [rounds, 0], "depth_switches": [], "entry_s": entry, "spec_draft_n_max": n_max,
            "same_as_plain": True}


def _entry(name, n_layer, scale, dense=200.0, routed=80.0):
    """A file's entry with one nextn round (plain and n_max=1) and one llama.cpp round; times grow with `scale`."""
    plain = _cell([1] * 11, 0, 10, 10, 1.2 * scale, {"decode": 1.0 * scale})
    # n_max=1: 5 rounds, 9 tokens; per round: verify 0.3 s, draft 0.05 s, gap 0.01 s; the rest host
    spec = _cell([1] * 11, 5, 0, 9, 2.0 * scale, {"verify": 1.5 * scale, "draft": 0.25 * scale,
                                                   "mtp_rows": 0.05 * scale, "decode": 0.0}, 5, 4, n_max=1)
    ms = {"verify_1": 100.0 * scale, "verify_2": 150.0 * scale, "verify_calib_2": 110.0 * scale,
          "draft": 30.0, "draft_2": 35.0}
    nextn = {"status": "ok", "runs": {"plain": plain, "n_max=1": spec}, "ms": ms, "n_expert_used": 8,
             "verify_experts": {"1": {"distinct": 8.0, "routed": 8}, "2": {"distinct": 12.0, "routed": 16}},
             "kernels": None}
    llama = {"plain": {"status": "ok", "tok_s": 4.0 / scale}, "n_max=1": {"status": "ok", "tok_s": 3.0 / scale,
             "drafted": 20, "accepted": 15, "acceptance": 0.75, "per_pos": [0.75]}}
    return {"name": name, "arch": "glm4moe", "n_layer": n_layer, "n_expert_used": 8,
            "rounds": [{"nextn": nextn, "llama": llama}],
            "bytes_per_token": {"gguf": {"dense": dense, "routed": routed, "lm_head": 500.0, "token_embd_row": 2.0,
                                         "total": dense + routed + 502.0}, "draft": 391.0}}


def test_summary_split_projection_and_table(monkeypatch):
    monkeypatch.setattr(sr, "VERIFY_ROWS", (1, 2))
    a, b = _entry("glm45air-1-a0.1.gguf", 2, 1.0), _entry("glm45air-4-a0.1.gguf", 5, 2.0, dense=260.0, routed=200.0)
    for e in (a, b):
        e["summary"] = sr.summarize(e)
    s = a["summary"]
    assert s["one_decode_s"] == pytest.approx(0.1)
    sp = s["split"]["n_max=1"]     # per round ÷ 0.1 s: verify 0.3, draft 0.05, gap 0.01, host 0.04
    assert (sp["verify"], sp["draft"], sp["gap"], sp["host"]) == pytest.approx((3.0, 0.5, 0.1, 0.4))
    assert sp["total"] == pytest.approx(4.0) and sp["tokens"] == pytest.approx(1.8)
    assert s["split"]["plain"]["host"] == pytest.approx(0.2)
    # at the bytes' cost: 1.8 tokens per (a verify of 2 rows' bytes + one draft step's) in decodes' bytes
    assert sp["bytes_bound"] == pytest.approx(1.8 / ((782 + 2 + 80 * 0.5) / 782 + 391 / 782))
    assert s["split"]["plain"]["bytes_bound"] == pytest.approx(1.0) and "bytes_bound" not in s["split"].get("auto", {})
    assert sp["free_draft_bound"] == pytest.approx(1.8 / ((782 + 2 + 80 * 0.5) / 782))   # the draft's bytes at 0
    vb = s["verify_bytes"]["2"]
    assert vb["verify_x_decode"] == 1.5 and vb["calib_x_decode"] == pytest.approx(1.1)
    assert vb["bytes_x_decode"] == pytest.approx((782 + 2 + 40) / 782)
    assert s["draft_x_decode"] == pytest.approx(0.3) and s["draft_bytes_x_decode"] == pytest.approx(0.5)
    r = s["ratio"]["n_max=1"]
    # nextn 9 tokens / 2.0 s against llama.cpp's 3.0 tok/s; against nextn plain's 10 / 1.2 s and llama.cpp's 4.0
    assert (r["nextn_llama"], r["nextn_own_plain"], r["llama_own_plain"]) == pytest.approx((1.5, 4.5 * 1.2 / 10, 0.75))
    # the projection: per-layer ms = slope over (2, 100), (5, 200) = 100 / 3 for the decode; (2, 150), (5, 300) = 50
    # for the verify of 2 rows; from the 5-layer file to 46 layers (+41)
    (p,) = sr.projection([a, b])
    assert (p["arch"], p["alpha"], p["layers"], p["L_real"], p["base"]) == ("glm4moe", "0.1", [2, 5], 46,
                                                                             "glm45air-4-a0.1.gguf")
    assert p["per_layer_ms"] == pytest.approx({"1": 100 / 3, "2": 50.0})
    plain_round = 2.4 / 10 + 41 * (100 / 3) / 1e3
    spec_round = 4.0 / 5 + 41 * 50.0 / 1e3
    assert p["configs"]["plain"]["tok_s"] == pytest.approx(1 / plain_round)
    assert p["configs"]["n_max=1"]["tok_s"] == pytest.approx(1.8 / spec_round)
    assert p["configs"]["n_max=1"]["x_plain"] == pytest.approx(1.8 * plain_round / spec_round)
    # bytes at 46 layers: dense 20 and routed 40 per layer (the two files), from b's 260 / 200: 1080 / 1840
    total = 1080 + 1840 + 500 + 2
    assert p["bytes_per_token"] == pytest.approx(total)
    assert p["configs"]["n_max=1"]["bytes_x_decode"] == pytest.approx((total + 2 + 1840 * 0.5) / total)
    assert p["configs"]["n_max=1"]["bytes_bound"] == pytest.approx(1.8 / ((total + 2 + 920) / total + 391 / total))
    assert p["configs"]["n_max=1"]["free_draft_bound"] == pytest.approx(1.8 / ((total + 2 + 920) / total))
    assert sr.projection([a]) == []               # one layer count: no slope, no projection
    report = {"files": [a, b], "machine": {"cpu": "cpu", "physical_cores": 2, "loadavg": (3.0, 0, 0)}, "threads": 2,
              "cache_type_k": "f16", "cache_type_v": "f16", "ctx": 4096, "n_gen": 10, "repeat": 1, "loaded": True}
    table = sr.format_table(report)
    lines = table.splitlines()
    assert any(x.startswith("PROJECTION (not a measurement) to 46 trunk layers") for x in lines)
    head_at = next(i for i, x in enumerate(lines) if x.startswith("| file | config | nextn tok/s"))
    head = [c.strip() for c in lines[head_at].strip("|").split("|")]
    assert head[-2:] == ["nextn ÷ llama", "spec ÷ own plain: nextn / llama"]    # ratios last
    row = dict(zip(head, [c.strip() for c in lines[head_at + 4].strip("|").split("|")]))   # b's plain
    assert (row["file"], row["config"], row["nextn tok/s"], row["llama tok/s"]) == ("glm45air-4-a0.1.gguf", "plain",
                                                                                  "4.17", "2.00")
    row = dict(zip(head, [c.strip() for c in lines[head_at + 3].strip("|").split("|")]))   # a's n_max=1
    assert (row["nextn acceptance (acc/drafted)"], row["nextn acc per pos"], row["same tokens as plain"]) == (
        "0.800 (4/5)", "0.80", "yes")
    assert (row["llama acceptance"], row["llama acc per pos"]) == ("0.750 (15/20)", "0.75")
    assert row["spec ÷ own plain: nextn / llama"] == "0.54 / 0.75"
    assert sr.format_table(json.loads(json.dumps(report))) == table
    # a reduced draft head of 64 rows: its runs and ms folded in (merge_draft_vocab), its bytes in the entry
    c = _entry("glm45air-1-a0.1.gguf", 2, 1.0)
    n = c["rounds"][0]["nextn"]
    dv = dict(n["runs"]["n_max=1"], draft_vocab=64, entry_s={"verify": 1.5, "draft": 0.1, "mtp_rows": 0.05})
    sr.merge_draft_vocab(n, {"status": "ok", "runs": {"n_max=1 dv64": dv},
                             "ms": {"draft dv64": 12.0, "draft_2 dv64": 15.0, "verify_1 dv64": 96.0}}, 64)
    c["bytes_per_token"]["draft_vocab"] = {"64": 141.0}
    c["draft_vocab_source"] = "self"
    s = sr.summarize(c)
    assert s["draft_heads"][0] == {"ms": 30.0, "x_decode": 0.3, "x_decode_2": 0.35, "bytes_x_decode": 391 / 782}
    assert s["draft_heads"][64] == pytest.approx({"ms": 12.0, "x_decode": 0.125, "x_decode_2": 15 / 96,
                                                  "bytes_x_decode": 141 / 782})
    sp = s["split"]["n_max=1 dv64"]     # per round ÷ 0.1 s: verify 0.3, draft 0.02, gap 0.01, host 2.0/5 - 0.33
    assert (sp["draft"], sp["verify"]) == pytest.approx((0.2, 3.0))
    assert sp["bytes_bound"] == pytest.approx(1.8 / ((782 + 2 + 40) / 782 + 141 / 782))
    assert s["nextn"]["n_max=1 dv64"]["draft_vocab"] == 64 and s["nextn"]["n_max=1 dv64"]["same_as_plain"]
    c["summary"] = s
    table = sr.format_table(dict(report, files=[c]))
    assert "| glm45air-1-a0.1.gguf | 64 rows | 12.0 | 0.12 | 0.16 | 0.18 | – |" in table
    assert "| glm45air-1-a0.1.gguf | n_max=1 dv64 | 4.50 | 0.800 (4/5) |" in table


FAKE_PEER = r'''#!{python}
import json, os, sys
argv = sys.argv[1:]
name = os.path.basename(sys.argv[0])
log = os.path.join(os.path.dirname(sys.argv[0]), "calls.jsonl")
with open(log, "a") as f:
    f.write(json.dumps([name] + argv) + "\n")
n = sum(1 for line in open(log) if json.loads(line)[0] == name)
seconds = 4.0 if n <= 2 and name == "llama-speculative-simple" else 2.0   # the first round slower
if name == "llama-completion":
    print({completion!r}, file=sys.stderr)
else:
    k = int(argv[argv.index("--spec-draft-n-max") + 1])
    print("decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s" % (16 + k, seconds, (16 + k) / seconds),
          file=sys.stderr)
    print("n_drafted = %d\nn_accept  = %d" % (10 * k, 5 * k), file=sys.stderr)
    print("statistics draft-mtp: #mean acc len = 1.50, #acc rate/pos = (%s)" % ", ".join(["0.500"] * k),
          file=sys.stderr)
'''


def test_a_run_with_a_fake_peer(tmp_path, monkeypatch, capsys):
    """The whole llama.cpp side of a run (main, --engines llama) against a fake peer that logs its argv: the same
    settings reach every run, rounds are interleaved, the best round counts, the report and table say so."""
    bin_dir = tmp_path / "peer" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("llama-completion", "llama-speculative-simple"):
        exe = bin_dir / tool
        exe.write_text(FAKE_PEER.format(python=sys.executable, completion=COMPLETION_LOG))
        exe.chmod(0o755)
    monkeypatch.setenv("NEXTN_PEER_DIR", str(tmp_path / "peer"))
    out = tmp_path / "r.json"
    gguf = str(G4 / "tiny-glm4moe-Q8_0.gguf")
    sr.main([gguf, "--engines", "llama", "--repeat", "2", "-t", "2", "-c", "512", "-n", "16", "--n-max", "1,2",
             "-ctk", "q8_0", "-o", str(out)])
    calls = [json.loads(x) for x in (bin_dir / "calls.jsonl").read_text().splitlines()]
    assert [c[0] for c in calls] == ["llama-completion", "llama-speculative-simple", "llama-speculative-simple"] * 2
    for c in calls:
        assert c[c.index("-m") + 1] == gguf and c[c.index("-t") + 1] == "2" and c[c.index("-c") + 1] == "512"
        assert c[c.index("-ctk") + 1] == "q8_0" and c[c.index("-n") + 1] == "16"
    report = json.loads(out.read_text())
    s = report["files"][0]["summary"]
    assert s["nextn_status"] == "not run (--engines)"
    assert s["llama"]["plain"]["tok_s"] == pytest.approx(7.5)
    assert s["llama"]["n_max=2"]["tok_s"] == pytest.approx(18 / 2.0)        # the faster (second) round
    assert s["llama"]["n_max=2"]["per_pos"] == [0.5, 0.5] and s["llama"]["n_max=2"]["acceptance"] == 0.5
    assert s["ratio"]["n_max=1"]["llama_own_plain"] == pytest.approx(8.5 / 7.5)
    table = capsys.readouterr().out
    row = "| tiny-glm4moe-Q8_0.gguf | n_max=2 | – | – | – | – | 9.00 | 0.500 (10/20) | 0.50/0.50 | – | – / 1.20 |"
    assert row in table


@pytest.mark.slow
def test_one_nextn_round_on_the_tiny_fixture(q8_model, tmp_path):
    """nextn_measure on the tiny Q8_0 model: every speculative run gives plain's tokens; n_max=1's rounds and
    accepted drafts equal a naive replay of greedy draft-mtp (draft = argmax of the teacher-forced NextN logits
    of the row, accepted when it is the chain's next token); the verify of 1 row reads n_expert_used experts;
    the decode's and the verify's matmul kernels match by kernel_key; the cost split adds up."""
    ref = json.loads((G4 / "reference.json").read_text())["prompts"][0]
    n = 24
    ranks = tmp_path / "ranks.txt"
    res = sr.nextn_measure(q8_model, n, n_max=(1, 2), prompt=ref["prompt_ids"],
                           vocab={"ns": [1024], "source": "self", "write": str(ranks)})
    runs = res["runs"]
    assert list(runs) == ["plain", "n_max=1", "n_max=2", "auto"]
    assert all(c["same_as_plain"] and len(c["tokens"]) == n for c in runs.values())
    ids = list(ref["prompt_ids"])
    chain = ids + runs["plain"]["tokens"]
    draft = q8_model.mtp_logits(chain).argmax(axis=1)   # row p predicts token p+1 from token p and hidden p-1
    p, out, rounds, accepted = len(ids), 1, 0, 0
    while out < n:
        ok = int(draft[p]) == chain[p + 1]
        m = min(1 + ok, n - out)
        rounds, accepted, p, out = rounds + 1, accepted + min(ok, m), p + m, out + m
    one = runs["n_max=1"]
    assert (one["rounds"], one["accepted"], one["drafted"]) == (rounds, accepted, rounds)
    used = int(q8_model.loaded.hparams["n_expert_used"])
    assert res["verify_experts"]["1"]["distinct"] == used and res["verify_experts"]["4"]["routed"] == 4 * used
    k = res["kernels"]["ms"]

    def matmuls(d):
        return {kernel_profile.kernel_key(s) for s in d if "matmul" in s}
    assert matmuls(k["1"]) == matmuls(k["2"]) == matmuls(k["4"]) and len(matmuls(k["1"])) >= 3
    entry = {"name": "tiny", "arch": "glm4moe", "n_layer": 4, "rounds": [{"nextn": {"status": "ok", **res},
                                                                          "llama": {}}],
             "bytes_per_token": {"gguf": gguf_bytes.decode_bytes_from_gguf(gguf_bytes.gguf_info(str(G4 / "tiny-glm4moe-Q8_0.gguf"))),
                                 "draft": 1.0}}
    s = sr.summarize(entry)
    for label, sp in s["split"].items():
        c = runs[label]
        assert sp["total"] * s["one_decode_s"] == pytest.approx(c["decode_s"] / (c["rounds"] + c["plain_rounds"]),
                                                                rel=1e-9) or sp["host"] == 0
    assert s["nextn"]["n_max=2"]["per_pos"] == runs["n_max=2"]["per_pos"][:2]
    # --draft-vocab-file self: the plain chain's ids by frequency (then the merge order) cover it; the merge order
    # covers what its first 1024 ids hold of it
    from nextn.runtime.draft_vocab import read_ranks, tokenizer_ranks

    gen = runs["plain"]["tokens"]
    V = int(q8_model.loaded.hparams["n_vocab"])
    got = read_ranks(str(ranks), V)
    counted = list(ref["prompt_ids"]) + gen
    top = max(set(counted), key=lambda t: (counted.count(t), -counted.index(t)))
    assert int(got[0]) == top and len(got) == V and set(got[:len(set(counted))].tolist()) == set(counted)
    merge = set(tokenizer_ranks(q8_model.loaded.files.main.fields)[:1024].tolist())
    assert res["vocab_coverage"]["self"]["1024"] == 1.0
    assert res["vocab_coverage"]["tokenizer"]["1024"] == pytest.approx(sum(t in merge for t in gen) / len(gen))


def test_the_files_by_name_and_the_default_set(tmp_path):
    """bench_report.resolve_files as this bench uses it: names with or without .gguf, and the predictable set by default."""
    for name, size in (("glm45air-4-a0.1.gguf", 30), ("glm45air-1-a0.1.gguf", 10), ("glm45air-1.gguf", 5)):
        (tmp_path / name).write_bytes(b"x" * size)
    got = bench_report.resolve_files([], str(tmp_path), known=sr.KNOWN)     # the speed set's glm45air-1 is not among them
    assert [os.path.basename(p) for p in got] == ["glm45air-1-a0.1.gguf", "glm45air-4-a0.1.gguf"]
    assert [os.path.basename(p) for p in bench_report.resolve_files(["glm45air-4-a0.1"], str(tmp_path))] == [
        "glm45air-4-a0.1.gguf"]
    with pytest.raises(SystemExit, match="glm52-1-a0"):
        bench_report.resolve_files(["glm52-1-a0"], str(tmp_path))
