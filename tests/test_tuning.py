"""Tuning logs: tune a few kernels on llvm, export/import/merge, apply deterministically, refuse hostile logs."""
import copy
import json
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import G4, reference

from nextn.common.errors import NextnError
from nextn.compiler.tune import log as tlog

pytestmark = pytest.mark.slow   # tuning runs and tuned compiles

MODEL = G4 / "tiny-glm4moe-Q8_0.gguf"
PROMPT = next(p for p in reference()["prompts"] if p["kind"] == "docs-heading")["prompt_ids"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    from nextn.compiler.tune.run import tune_model

    d = tmp_path_factory.mktemp("tlog")
    # two small kernels, a handful of trials; keep the found schedules so that applying them changes the kernels
    msgs = []
    book = tune_model(str(MODEL), str(d), trials=4, only=r"^(argmax1|fused_rms_norm3_mul4)$", keep_slower=True, search="generic",
                      progress=False, log=msgs.append)
    return d, book, msgs


def test_tune_writes_a_valid_resumable_log(tuned):
    d, book, msgs = tuned
    assert len(book["records"]) == 2, msgs
    # the summary line of each kernel counts its candidates: built, ran, and why any failed
    for name in ("argmax1", "fused_rms_norm3_mul4"):
        line = next(m for m in msgs if m.strip().startswith(name + ":"))
        assert re.search(r"(\d+) candidate\(s\): (\d+) built, (\d+) ran", line), line
    again = tlog.read(str(d))
    assert again == book
    assert {r["name"] for r in book["records"]} == {"argmax1", "fused_rms_norm3_mul4"}
    assert all(r["target"]["key"].startswith("llvm:") and min(r["run_secs"]) > 0 for r in book["records"])
    # resumable: a second run finds both workloads done and tunes nothing
    from nextn.compiler.tune.run import tune_model

    msgs = []
    tune_model(str(MODEL), str(d), trials=4, only=r"^(argmax1|fused_rms_norm3_mul4)$", keep_slower=True, search="generic",
               progress=False, log=msgs.append)
    assert "2 already in" in msgs[0] and "tuning 0" in msgs[0]


X86_KEY = "x86.matmul:q8_0/q8_0:N256:K256:rows1"   # the tiny model's one-row attention projections (Q8_0)


def test_tune_covers_the_x86_kernels(tmp_path):
    """`nextn tune` searches the hand-written x86 kernels' knobs; the record is applied at compile time and the
    compiled model still decodes the reference's tokens."""
    import nextn.runtime as rt
    from nextn.compiler.compile import compile_model
    from nextn.compiler.lower import x86
    from nextn.common.compile_options import CompileOptions
    from nextn.compiler.target import make_target
    from nextn.compiler.tune.apply import x86_knobs
    from nextn.compiler.tune.run import tune_model

    d = tmp_path / "tlog"
    msgs = []
    book = tune_model(str(MODEL), str(d), only="^" + X86_KEY.replace(".", r"\.") + "$", keep_slower=True,
                      progress=False, log=msgs.append)
    assert tlog.read(str(d)) == book and not book["records"]
    (rec,) = book["x86_knobs"]
    assert rec["key"] == X86_KEY and rec["target"]["key"].startswith("llvm:")
    assert min(rec["run_secs"]) > 0 and min(rec["default_secs"]) > 0
    assert any(X86_KEY in m and "rows 1: default" in m and "best" in m for m in msgs)   # before / after, per kernel
    assert rec["kept"] and rec["rows"] == [1] and rec["rounds"] == 5 and rec["noise"] >= 0
    spec = x86.KernelSpec("matmul", "q8_0", 256, 256, 1)
    assert spec.key == X86_KEY
    assert x86_knobs(str(d), make_target("llvm"))(spec) == x86.Knobs(**rec["knobs"])
    art = compile_model(str(MODEL), str(tmp_path / "art"), CompileOptions(tuning_log=str(d)), log=lambda *_: None)
    p = next(p for p in reference()["prompts"] if p["kind"] == "code-short")
    ids = rt.load(art, spec=False).generate(p["prompt_ids"], 16, spec_type="none", ignore_eos=True).ids
    plain = rt.load(compile_model(str(MODEL), str(tmp_path / "art0"), log=lambda *_: None), spec=False)
    assert ids == plain.generate(p["prompt_ids"], 16, spec_type="none", ignore_eos=True).ids


def test_export_import_merge(tuned, tmp_path):
    d, book, _msgs = tuned
    cli = [sys.executable, "-m", "nextn.runtime.cli", "tuning"]
    assert subprocess.run(cli + ["export", str(d), "-o", str(tmp_path / "x.json")]).returncode == 0
    assert subprocess.run(cli + ["import", str(tmp_path / "x.json"), "-o", str(tmp_path / "imp")]).returncode == 0
    assert tlog.read(str(tmp_path / "imp"))["records"] == tlog.merge([book])["records"]
    # a second log: one record faster, one for another target
    other = copy.deepcopy(book)
    other["records"][0]["run_secs"] = [min(other["records"][0]["run_secs"]) / 2]
    foreign = copy.deepcopy(book["records"][1])
    foreign["target"]["key"] = "cuda:sm_90"
    other["records"].append(foreign)
    tlog.write(other, str(tmp_path / "other"))
    r = subprocess.run(cli + ["merge", str(d), str(tmp_path / "other"), "-o", str(tmp_path / "m")])
    assert r.returncode == 0
    merged = tlog.read(str(tmp_path / "m"))
    assert len(merged["records"]) == 3
    fast = next(x for x in merged["records"] if x["workload_hash"] == book["records"][0]["workload_hash"]
                and x["target"]["key"] == book["records"][0]["target"]["key"])
    assert fast["run_secs"] == other["records"][0]["run_secs"]
    show = subprocess.run(cli + ["show", str(tmp_path / "m")], capture_output=True, text=True)
    assert show.returncode == 0 and "cuda:sm_90" in show.stdout and "argmax1" in show.stdout


def test_apply_is_deterministic_and_keeps_results(tuned, tmp_path, compiled):
    import nextn.runtime as rt
    from nextn.compiler.compile import compile_model
    from nextn.common.compile_options import CompileOptions

    d, _book, _msgs = tuned
    foreign = tlog.read(str(d))
    extra = copy.deepcopy(foreign["records"][0])
    extra["target"]["key"] = "cuda:sm_90"
    foreign["records"].append(extra)
    tlog.write(foreign, str(tmp_path / "withforeign"))
    notes = []
    f32 = {"cache_type_k": "f32", "cache_type_v": "f32"}   # as compiled("q8", ...), the untuned artifact compared
    tuned = CompileOptions(tuning_log=str(d), **f32)
    foreign_log = CompileOptions(tuning_log=str(tmp_path / "withforeign"), **f32)
    a = compile_model(str(MODEL), str(tmp_path / "a"), tuned, log=lambda *_: None)
    b = compile_model(str(MODEL), str(tmp_path / "b"), tuned, log=lambda *_: None)
    c = compile_model(str(MODEL), str(tmp_path / "c"), foreign_log, log=notes.append)
    ma, mb, mc = (json.load(open(f"{x}/manifest.json")) for x in (a, b, c))
    base = json.load(open(f"{compiled('q8', MODEL)}/manifest.json"))
    assert ma["libraries"][0]["sha256"] == mb["libraries"][0]["sha256"]          # same log ⇒ same artifact bytes
    assert ma["libraries"][0]["sha256"] != base["libraries"][0]["sha256"]        # the log changed the schedule
    assert ma["tuning_log"]["kernels_tuned"] == 2 and ma["tuning_log"]["records_other_targets"] == 0
    assert mc["tuning_log"]["kernels_tuned"] == 2 and mc["tuning_log"]["records_other_targets"] == 1
    assert any("ignoring 1 record" in n for n in notes)
    tuned_m, plain_m = rt.load(a), rt.load(compiled("q8", MODEL))
    got, want = tuned_m.logits(PROMPT), plain_m.logits(PROMPT)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert tuned_m.generate(PROMPT, 16, spec_type="none", ignore_eos=True).ids == \
        plain_m.generate(PROMPT, 16, spec_type="none", ignore_eos=True).ids


def _bad(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_hostile_logs_are_refused(tuned, tmp_path):
    d, book, _msgs = tuned
    good = json.loads(json.dumps(book))
    cases = {
        "pickle.json": pickle.dumps({"format": "nextn-tuning-log"}),
        "text.json": b"def f(): pass\n",
        "extra.json": json.dumps({**good, "exec": "import os"}).encode(),
        "format.json": json.dumps({**good, "format": "tvm-db"}).encode(),
    }
    bad_kind = copy.deepcopy(good)
    bad_kind["records"][0]["trace"][0][0][0] = "__import__('os').system"
    cases["kind.json"] = json.dumps(bad_kind).encode()
    bad_field = copy.deepcopy(good)
    bad_field["records"][0]["code"] = "x"
    cases["field.json"] = json.dumps(bad_field).encode()
    bad_secs = copy.deepcopy(good)
    bad_secs["records"][0]["run_secs"] = ["fast"]
    cases["secs.json"] = json.dumps(bad_secs).encode()
    for name, data in cases.items():
        p = _bad(tmp_path, name, data)
        with pytest.raises(NextnError):
            tlog.read(str(p))
        r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "tuning", "import", str(p), "-o",
                            str(tmp_path / "dst")], capture_output=True, text=True)
        assert r.returncode == 1 and "Traceback" not in r.stderr and name in r.stderr, (name, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dst" / "log.json").exists()


def test_offline_flow_llvm_end_to_end(tmp_path):
    """gen (build candidates) → measure (runtime only) → ingest, on llvm where all three can run here; through
    the CLI, as a user runs them on two machines."""
    cli = [sys.executable, "-m", "nextn.runtime.cli"]
    cand = tmp_path / "cand"
    r = subprocess.run(cli + ["tune", str(MODEL), "--offline", str(cand), "--trials", "3",
                              "--only", "^fused_rms_norm3_mul4$"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    book = json.load(open(cand / "candidates.json"))
    assert len(book["workloads"]) == 1 and len(book["workloads"][0]["candidates"]) >= 1
    r = subprocess.run(cli + ["tuning", "measure", str(cand)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.load(open(cand / "results.json"))
    w = book["workloads"][0]
    assert set(res["seconds"]) == {w["default"]["file"]} | {c["file"] for c in w["candidates"]}
    # pretend the machine found a fast candidate: ingest keeps it, keyed to this target
    best = w["candidates"][0]["file"]
    res["seconds"][best] = res["seconds"][w["default"]["file"]] / 2
    json.dump(res, open(cand / "results.json", "w"))
    log_dir = tmp_path / "log"
    r = subprocess.run(cli + ["tuning", "ingest", str(cand), "-o", str(log_dir)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    merged = tlog.read(str(log_dir))
    assert [x["name"] for x in merged["records"]] == ["fused_rms_norm3_mul4"]
    assert merged["records"][0]["target"]["key"] == book["target"]["key"]
    assert merged["records"][0]["run_secs"] == [res["seconds"][best]]
    # a candidate library that no longer matches candidates.json is never loaded
    lib = cand / best
    lib.write_bytes(lib.read_bytes() + b"\0")
    r = subprocess.run(cli + ["tuning", "measure", str(cand)], capture_output=True, text=True)
    assert r.returncode == 1 and "sha256" in r.stderr and "Traceback" not in r.stderr


def test_offline_gen_builds_cuda_candidates_without_a_gpu(tmp_path):
    """`nextn tune --target cuda --offline DIR` builds each candidate with SASS for the arch (no GPU here).
    Run through the CLI: the CUDA build plugin (stub driver) stays out of the test process."""
    from nextn.common.device_code import device_code

    cand = tmp_path / "cuda"
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "tune", str(MODEL), "--target", "cuda", "--arch",
                        "sm_90", "--offline", str(cand), "--trials", "2", "--only", r"^fused_rms_norm\d*_mul\d*$",
                        "--max-kernels", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    book = json.load(open(cand / "candidates.json"))
    assert book["target"]["key"] == "cuda:sm_90"
    w = book["workloads"][0]
    assert w["candidates"]
    for entry in [w["default"]] + w["candidates"]:
        info = device_code(str(cand / entry["file"]))
        assert info["cuda_sass"] == ["sm_90"] and not info["cuda_source"]


def test_tune_says_why_nothing_was_measured(tmp_path):
    """A timeout no candidate can meet: `nextn tune` exits 1 with one line naming the kernel, how many candidates
    failed to build and why, and writes no log (rather than an empty one)."""
    out = tmp_path / "log"
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "tune", str(MODEL), "--trials", "2", "--only",
                        "^argmax1$", "--build-timeout", "0.01", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("nextn: error:") and "argmax1" in err and "failed to build" in err, err
    assert "Timeout, killed after 0.01 seconds" in err and "--build-timeout" in err, err
    assert not (out / "log.json").exists()
