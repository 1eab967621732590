"""The runtime bundle and the staged device check, run on this CPU the way a GPU machine runs them.

A bundle for this interpreter (bench/bundle.py, host "here") holding the BF16 fixture's llvm artifact runs in a fresh
`python -I -S`: nothing from this interpreter's site-packages, only what the bundle carries, which has no
libtvm_compiler.so and no nextn.compiler. Its device check in CPU mode runs every stage, and the reference stage
reproduces the fixture's reference.json (logits, greedy ids, acceptance counts). A bundle built for another
interpreter or machine stops with one line; a failing stage is reported and the stages after it still run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, G4, REPO, reference

sys.path.insert(0, str(REPO / "bench"))

import bundle as bundle_builder  # noqa: E402
import device_check  # noqa: E402
import device_refs  # noqa: E402
import device_timing  # noqa: E402

STAGES = ["environment", "plugin", "open", "load_module", "vm_init", "weights", "kv", "prefill", "decode_graphs",
          "entry_timings", "reference glm4moe-BF16", "speed", "realwidth"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, compiled):
    art = compiled("bf16", G4 / "tiny-glm4moe-BF16.gguf")
    q8 = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    out = tmp_path_factory.mktemp("bundle") / "b"
    plan = bundle_builder.build(str(out), host="here", device="cpu", checks=["glm4moe-BF16"],
                                realwidth={"name": "tiny Q8_0", "model": str(G4 / "tiny-glm4moe-Q8_0.gguf"),
                                           "artifact": q8},
                                prebuilt={"glm4moe-BF16": art}, copy_models=False)
    return out, plan


def run_bundle(b, *args, timeout=900):
    """run.py of bundle dir `b` in a fresh interpreter that sees no site-packages (-I -S)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-I", "-S", str(b / "run.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def with_plan(b, tmp_path, edit, name="edited"):
    """A bundle sharing b's files whose bundle.json is edited by `edit(plan)`."""
    d = tmp_path / name
    d.mkdir()
    for f in os.listdir(b):
        if f != "bundle.json":
            os.symlink(b / f, d / f)
    plan = json.loads((b / "bundle.json").read_text())
    edit(plan)
    (d / "bundle.json").write_text(json.dumps(plan))
    return d


def test_bundle_carries_the_runtime_only(bundle):
    b, plan = bundle
    files = [os.path.join(d, f) for d, _, fs in os.walk(b / "site") for f in fs]
    assert not [f for f in files if "libtvm_compiler" in f]
    assert sorted(os.listdir(b / "site" / "nextn")) == ["common", "runtime"]
    assert plan["host"]["python"] == "%d.%d" % sys.version_info[:2] and plan["needs"] == {}
    assert {"tvm", "tvm_ffi", "gguf", "numpy", "tokenizers"} <= set(plan["carries"])
    assert bundle_builder.missing_inputs(str(b)) == []


def elf_section_names(path) -> set:
    """The section names of 64-bit little-endian ELF file `path`, read from its section header table (ELF spec,
    e_shoff / e_shentsize / e_shnum / e_shstrndx), independently of binutils."""
    import struct

    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    return {data[strtab + h[0]:data.index(b"\0", strtab + h[0])].decode() for h in headers}


def test_bundle_libraries_are_stripped_and_still_vouched_for(bundle):
    """strip_libraries: no static symbol table left in a bundled artifact's library (what the 64 MiB carry limit
    needed), each manifest's sha256 / size are the stripped file's (read_manifest refuses anything else), and the
    dynamic symbols the runtime looks functions up by are still there."""
    from nextn.common.manifest import read_manifest

    b, _ = bundle
    libs = sorted((b / "art").glob("**/*.so"))
    assert libs
    for lib in libs:
        names = elf_section_names(lib)
        assert ".dynsym" in names and ".symtab" not in names, lib
    for man in sorted((b / "art").glob("*/manifest.json")):
        for rec in read_manifest(str(man.parent))["libraries"]:
            assert rec["size"] == os.path.getsize(man.parent / rec["file"])


def test_missing_inputs_names_each_stage_and_path(tmp_path):
    """bench/bundle.py `missing_inputs` on a bundle whose check lacks its model, its artifact's library and its
    expectations, and whose `int8 kernels` stage lacks both files: exactly those, by stage; nothing once they exist."""
    d = tmp_path
    for sub in ("site", "art/a", "refs/f"):
        (d / sub).mkdir(parents=True)
    for m in ["run.py", *bundle_builder.BUNDLED_BENCH]:
        (d / m).write_text("")
    (d / "art/a/manifest.json").write_text(json.dumps({"libraries": [{"file": "model_cuda.so"}]}))
    plan = {"checks": [{"name": "x", "model": "models/x.gguf", "reference": "refs/f", "artifact": "art/a",
                        "expect": "refs/e"}], "int8_kernels": {"dir": "art/int8", "library": "l.so", "cases": "c.npz"}}
    (d / "bundle.json").write_text(json.dumps(plan))
    want = ["reference x: models/x.gguf", "reference x: art/a/model_cuda.so", "reference x: refs/e.json",
            "reference x: refs/e.npz", "int8 kernels: art/int8/l.so", "int8 kernels: art/int8/c.npz"]
    assert bundle_builder.missing_inputs(str(d)) == want
    (d / "models").mkdir()
    (d / "art/int8").mkdir()
    for f in ("models/x.gguf", "art/a/model_cuda.so", "refs/e.json", "refs/e.npz", "art/int8/l.so", "art/int8/c.npz"):
        (d / f).write_text("")
    assert bundle_builder.missing_inputs(str(d)) == []


def test_device_check_cpu_mode_in_a_runtime_only_interpreter(bundle, tmp_path):
    b, _plan = bundle
    out = tmp_path / "out"
    r = run_bundle(b, "device-check", "--device", "cpu", "--quick", "--out", str(out))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    res = json.loads((out / "device_check.json").read_text())
    assert [s["stage"] for s in res["stages"]] == STAGES
    assert [s["status"] for s in res["stages"]] == ["ok"] * len(STAGES)
    assert r.stdout.rstrip().endswith(f"{len(STAGES)}/{len(STAGES)} stages ok")
    # what ran: the bundle's own packages, no TVM compiler library, no nextn.compiler module
    env = res["environment"]
    for mod in ("numpy", "tvm", "tvm_ffi", "tokenizers"):
        assert str(b / "site") in env["modules"][mod], env["modules"][mod]
    assert res["runtime_only"] == {"libtvm_compiler_mapped": False, "compiler_modules": []}
    # the fixture's references, reproduced: logits, every row of code-short, greedy ids, acceptance counts
    checks = {c["check"]: c for c in res["references"]["glm4moe-BF16"]}
    assert all(c["ok"] for c in checks.values())
    for kind in device_check.QUICK_KINDS:
        assert f"{kind} greedy ids" in checks and f"{kind} n_max=3 (rounds, drafted, accepted)" in checks
    assert {"code-short trunk_logits", "code-short trunk_hidden", "code-short mtp_logits"} <= set(checks)
    st = {s["stage"]: s.get("result", {}) for s in res["stages"]}
    assert st["decode_graphs"]["bit_exact"] and st["decode_graphs"]["steps"] == device_check.BUCKET_STEPS
    assert st["decode_graphs"]["few_row_steps"] == [f"{e} {k1} rows" for k1 in device_check.SPEC_VERIFY_ROWS
                                                    for e in ("verify", "mtp_draft")]
    assert st["weights"]["bytes"] > 0 and st["kv"]["bytes"] > 0
    assert st["prefill"]["matches_reference"] and st["prefill"]["rel_err"] < device_refs.LOGIT_TOL
    assert [x["config"] for x in res["speed"]["rows"]] == ["off", "n_max=1", "n_max=2", "n_max=3", "auto"]
    assert all(x["same_as_off"] and x["tok_s"] > 0 for x in res["speed"]["rows"])
    assert {x["entry"] for x in res["entry_timings"]} == {"prefill", "verify", "decode", "mtp_rows", "draft"}
    assert {x["entry"] for x in res["realwidth"]["rows"] if "of_floor" in x} == {"decode", "verify", "draft"}


@pytest.mark.slow
def test_runtime_only_reproduces_every_reference_prompt(bundle, tmp_path):
    """Every prompt of reference.json, the 2220-token one included, through the bundle's runtime only."""
    b, _plan = bundle
    out = tmp_path / "out"
    r = run_bundle(b, "device-check", "--device", "cpu", "--only", "reference", "--out", str(out))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    res = json.loads((out / "device_check.json").read_text())
    checks = res["references"]["glm4moe-BF16"]
    kinds = {p["kind"] for p in reference()["prompts"]}
    assert {c["check"].split()[0] for c in checks} == kinds and all(c["ok"] for c in checks)


@pytest.mark.parametrize("field, value, says", [
    ("python", "3.99", "Python 3.99"),
    ("soabi", "cpython-399-x86_64-linux-gnu", "cpython-399"),
    ("machine", "riscv64", "a riscv64 machine"),
    ("glibc", "99.0", "glibc >= 99.0"),
])
def test_other_host_stops_with_one_line(bundle, tmp_path, field, value, says):
    b, _plan = bundle
    d = with_plan(b, tmp_path, lambda p: p["host"].__setitem__(field, value))
    r = run_bundle(d, "device-check", "--device", "cpu", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "rebuild" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def test_missing_host_package_stops_with_one_line(bundle, tmp_path):
    b, _plan = bundle
    d = with_plan(b, tmp_path, lambda p: p.__setitem__("needs", {"nextn_no_such_module": "nextn-no-such>=1.0"}))
    r = run_bundle(d, "device-check", "--device", "cpu", "--out", str(tmp_path / "out"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "nextn-no-such>=1.0" in lines[0], r.stderr


def test_a_failing_stage_is_reported_and_the_next_stages_run(bundle, tmp_path):
    """The no-graph artifact is missing and a second model's GGUF is not the one it was compiled from: those two
    stages fail with their errors, every other stage still runs and passes, the exit status says so."""
    b, plan = bundle

    def edit(p):
        main = next(c for c in p["checks"] if c["role"] == "main")
        p["checks"].append(dict(main, role="nograph", name="missing", artifact="art/no-such-artifact"))
        p["checks"].append(dict(main, role=None, name="wrong-gguf", model=str(G4 / "tiny-glm4moe-Q4_K_M.gguf")))

    d = with_plan(b, tmp_path, edit)
    out = tmp_path / "out"
    r = run_bundle(d, "device-check", "--device", "cpu", "--quick", "--out", str(out),
                   "--only", "plugin,open,load_module,vm_init,weights,kv,prefill,decode_graphs,entry_timings,"
                             "reference wrong-gguf,speed")
    assert r.returncode == 1
    res = json.loads((out / "device_check.json").read_text())
    status = {s["stage"]: s for s in res["stages"]}
    assert status["decode_graphs"]["status"] == "FAIL" and "no-such-artifact" in status["decode_graphs"]["error"]
    assert status["reference wrong-gguf"]["status"] == "FAIL"
    assert "tiny-glm4moe-Q4_K_M.gguf" in status["reference wrong-gguf"]["error"]
    assert [s for s, v in status.items() if v["status"] != "ok"] == ["decode_graphs", "reference wrong-gguf"]
    assert "entry_timings" in status and "speed" in status          # the stages after the failures ran
    assert "    FAIL" in r.stdout and "no-such-artifact" in r.stdout
    assert "traceback" in status["decode_graphs"]


def test_a_failing_load_step_skips_what_needs_it(bundle, tmp_path):
    b, _plan = bundle

    def edit(p):
        next(c for c in p["checks"] if c["role"] == "main")["model"] = str(tmp_path / "gone.gguf")

    d = with_plan(b, tmp_path, edit)
    out = tmp_path / "out"
    r = run_bundle(d, "device-check", "--device", "cpu", "--quick", "--out", str(out), "--only",
                   "environment,plugin,open,load_module,weights,prefill,realwidth")
    res = json.loads((out / "device_check.json").read_text())
    status = {s["stage"]: s["status"] for s in res["stages"]}
    assert r.returncode == 1 and status == {"environment": "ok", "plugin": "ok", "open": "FAIL", "load_module": "skip",
                                            "vm_init": "skip", "weights": "skip", "kv": "skip", "prefill": "skip",
                                            "realwidth": "ok"}   # --only adds what the named stages need
    assert "gone.gguf" in res["stages"][2]["error"]


def test_quantized_expectations_catch_a_difference(compiled, tmp_path):
    """A quantized model is held to its own CPU outputs (recorded when the bundle is built): they reproduce
    themselves, and one changed token or logit is caught by name."""
    import nextn.runtime as rt

    m = rt.load(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), ctx_size=4096)
    path = str(tmp_path / "expect")
    device_refs.record_expectations(m, str(G4), path, kinds=["code-short"])
    want = device_refs.expect_want(path, None)
    got = device_refs.model_outputs(m, want, rows=False)
    checks = device_refs.compare(got, want, exact_acceptance=True)
    assert len(checks) == 1 + 1 + 3 + 3 and all(c["ok"] for c in checks)   # logits, ids, spec ≡ off, counts
    want["code-short"]["greedy_ids"][5] += 1
    want["code-short"]["last_logits"] = want["code-short"]["last_logits"] * 1.001
    bad = [c["check"] for c in device_refs.compare(got, want, exact_acceptance=True) if not c["ok"]]
    assert bad == ["code-short last logits", "code-short greedy ids"]


def test_step_bytes_counts_active_experts_and_one_embedding_row(compiled):
    from nextn.runtime.artifact import load_artifact

    man = load_artifact(compiled("bf16", G4 / "tiny-glm4moe-BF16.gguf")).manifest
    hp = man["hparams"]
    plan = {b["buffer"]: b for b in man["buffer_plan"]["weights"]}
    names = man["entry_points"]["decode"]["weights"]
    routed = sum(plan[n]["nbytes"] for n in names if "_exps" in plan[n]["tensor"])
    embd = sum(plan[n]["nbytes"] for n in names if plan[n]["tensor"] == "token_embd.weight")
    rest = sum(plan[n]["nbytes"] for n in names) - routed - embd
    want = rest + routed * hp["n_expert_used"] / hp["n_expert"] + embd / hp["n_vocab"]
    assert routed > 0 and embd > 0 and device_timing.step_bytes(man, "decode") == int(want)


def test_device_writes_in_bounded_chunks(monkeypatch):
    """Device.write / empty move UPLOAD_CHUNK bytes per copy; odd sizes and dtypes land byte for byte, a read-only
    memory map is read in place, and a new buffer reads as zeros."""
    import tvm

    from nextn.runtime import device as device_mod

    monkeypatch.setattr(device_mod, "UPLOAD_CHUNK", 1000)

    class Art:
        path, manifest = "art", {"target": {"kind": "llvm"}}

    dev = device_mod.Device(Art(), "cpu")
    rng = np.random.default_rng(0)
    updates = []

    class Bar:
        def update(self, n):
            updates.append(n)

    for a in (rng.standard_normal((37, 29)).astype(np.float32), rng.integers(0, 255, 4099, dtype=np.uint8),
              rng.integers(0, 65535, (3, 701), dtype=np.uint16)):
        t = tvm.runtime.empty(a.shape, str(a.dtype), dev.dev)
        updates.clear()
        dev.write(t, a, Bar())
        assert np.array_equal(t.numpy(), a) and sum(updates) == a.nbytes and max(updates) <= 1000
        assert len(updates) == -(-a.nbytes // 1000)
    z = dev.empty((3, 1001), "float32")
    assert z.numpy().shape == (3, 1001) and not z.numpy().any()


def test_memmap_view_uploads_without_a_host_copy(tmp_path):
    """A tensor read from the map goes to the device without a host copy of it (numpy reports its allocations to
    tracemalloc: the peak stays far below the tensor's size)."""
    import tracemalloc

    import tvm

    from nextn.runtime import device as device_mod

    a = np.arange(2 << 20, dtype=np.float32)            # 8 MiB
    a.tofile(tmp_path / "w.bin")
    mm = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="r").reshape(1024, -1)

    class Art:
        path, manifest = "art", {"target": {"kind": "llvm"}}

    dev = device_mod.Device(Art(), "cpu")
    t = tvm.runtime.empty(mm.shape, "float32", dev.dev)
    tracemalloc.start()
    dev.write(t, mm)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < a.nbytes // 16, peak
    assert np.array_equal(t.numpy().reshape(-1), a)


def test_staged_load_steps_run_in_order(compiled):
    from nextn.common.errors import NextnError
    from nextn.runtime.artifact import load_artifact
    from nextn.runtime.model import LoadedModel

    m = LoadedModel(load_artifact(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")), 256, staged=True)
    with pytest.raises(NextnError, match="load step weights needs vm_init first"):
        m.load_weights()
    with pytest.raises(NextnError, match="load step kv needs weights first"):
        m.new_sequence()
    m.load_module()
    m.vm_init()
    m.load_weights()
    seq = m.new_sequence()
    assert list(m.load_info) == ["load_module", "vm_init", "weights", "kv"]
    assert m.load_info["weights"]["bytes"] == m.weight_bytes and m.load_info["kv"]["bytes"] == seq.kv_bytes
    _h, _last, am = seq.prefill(np.asarray(reference()["prompts"][2]["prompt_ids"], np.int32), 0)
    assert am >= 0


def test_bundle_tar_keeps_links(tmp_path):
    """The bundle travels as one .tar.xz whose folder is gpu_bundle/ (what device_check.sh unpacks) whatever the
    directory it was built in; the link to the repository's copy of a GGUF survives it."""
    d = tmp_path / "some_dir"
    (d / "models").mkdir(parents=True)
    (d / "bundle.json").write_text("{}")
    os.symlink("../../../artifacts/tiny-glm4moe-Q8_0.gguf", d / "models" / "q8.gguf")
    tar = bundle_builder.make_tar(str(d))
    shutil.rmtree(d)
    import tarfile

    with tarfile.open(tar) as t:
        names = {m.name: m for m in t.getmembers()}
    assert names["gpu_bundle/models/q8.gguf"].issym()
    assert names["gpu_bundle/models/q8.gguf"].linkname == "../../../artifacts/tiny-glm4moe-Q8_0.gguf"


def test_cuda_mode_without_a_gpu_says_why(bundle, tmp_path):
    """On a machine without an NVIDIA driver (this one), --device cuda:0 does not die silently: the environment
    stage reports what it found, the plugin stage fails naming the missing driver library, every stage that needs
    the GPU says so, and the partial JSON is there."""
    b, _plan = bundle
    out = tmp_path / "out"
    r = run_bundle(b, "device-check", "--device", "cuda:0", "--out", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr
    res = json.loads((out / "device_check.json").read_text())
    status = {s["stage"]: s for s in res["stages"]}
    assert status["environment"]["status"] == "ok" and "nvidia_smi" in res["environment"]
    assert status["plugin"]["status"] == "FAIL" and "libcuda.so.1" in status["plugin"]["error"]
    assert all("cuda_last_error" in s for s in res["stages"])
    assert all(s["status"] == "skip" for n, s in status.items() if n not in ("environment", "plugin"))
    assert "cudaGetLastError" in r.stdout and "needs plugin" in r.stdout


def test_realwidth_generates_its_gguf_and_checks_the_bytes(bundle, tmp_path):
    """The real-width stage makes its GGUF where it runs, with the bundle's generator in a child interpreter that
    gets the bundle's gguf and numpy (the parent runs under -I -S), and refuses bytes other than the artifact's.
    The generator here writes the tiny Q8_0 fixture (the real one writes 4.4 GB)."""
    import hashlib

    b, _plan = bundle
    src = G4 / "tiny-glm4moe-Q8_0.gguf"
    (tmp_path / "tools").mkdir()
    gen = tmp_path / "tools" / "gen.py"
    gen.write_text("import os, shutil, sys\nimport gguf, numpy  # the generator's imports\n"
                   "shutil.copy(os.path.join(os.environ['FIXTURES'], 'tiny-glm4moe', 'tiny-glm4moe-Q8_0.gguf'), sys.argv[2])\n")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    for want, ok in ((sha, True), ("0" * 64, False)):
        def edit(p, want=want):
            p["realwidth"] = {"name": "gen", "preset": "tiny", "n_moe": 1, "file": "gen.gguf", "size": src.stat().st_size,
                              "sha256": want, "artifact": "art/realwidth", "synth": str(gen), "fixtures": str(G4.parent)}

        d = with_plan(b, tmp_path, edit, name=f"b-{ok}")
        out, gen_dir = tmp_path / f"out-{ok}", tmp_path / f"gen-{ok}"
        r = run_bundle(d, "device-check", "--device", "cpu", "--quick", "--only", "realwidth", "--out", str(out),
                       "--realwidth-dir", str(gen_dir))
        st = json.loads((out / "device_check.json").read_text())["stages"][-1]
        assert st["stage"] == "realwidth" and (st["status"] == "ok") == ok, r.stdout[-3000:]
        assert (gen_dir / "gen.gguf").read_bytes() == src.read_bytes()
        if ok:
            assert st["result"]["generate_s"] > 0 and st["result"]["decode_of_floor"] > 0
        else:
            assert "sha256" in st["error"] and "is not the 0000000000000000" in st["error"]


def test_gpu_expectations_are_the_float_activation_run_with_margins(compiled):
    """Quantized models on a GPU are judged against their `--exact-matmul` CPU run (float activations, as the CUDA
    kernels): that run reproduces itself at GPU_TOL, the numpy interpreter on gguf-py-dequantized weights (another
    summation order) lies within GPU_TOL of it, and the default build (int8 activation rows, what the first H200 run
    was compared with) is a different computation the check calls red."""
    import nextn.runtime as rt
    from conftest import graphs_and_dequantized
    from nextn.compiler.ir import interpret

    q8 = G4 / "tiny-glm4moe-Q8_0.gguf"
    exact = rt.load(compiled("q8-exact", q8, exact_matmul=True), ctx_size=4096)
    q8act = rt.load(compiled("q8", q8), ctx_size=4096)
    want = device_refs.fixture_want(str(G4), ["code-short"])
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        device_refs.record_expectations(exact, str(G4), f"{d}/expect", kinds=["code-short"])
        want = device_refs.expect_want(f"{d}/expect", None)
    w = want["code-short"]
    assert set(w["spec_margin"]) == {"1", "2", "3"}
    assert 0 < w["greedy_margin"] <= w["last_margin"] and all(0 < m <= 1 for m in w["spec_margin"].values())
    tol = device_refs.GPU_TOL
    same = device_refs.compare(device_refs.model_outputs(exact, want, rows=False), want, True, tol=tol)
    assert len(same) == 8 and all(c["ok"] and not c.get("undecided") for c in same)
    # the interpreter (numpy's order) against the recorded logits: well inside the tolerance
    graphs, weights = graphs_and_dequantized(q8)
    ids = np.asarray(w["prompt_ids"], np.int32)
    T = len(ids)
    from nextn.compiler.ir.reference import prefill_inputs, zero_states

    out = interpret.run(graphs["prefill"], prefill_inputs(graphs["prefill"], ids), weights,
                        zero_states(graphs["prefill"], T), n_kv=T)
    assert device_refs.rel_err(out["logits"][0], w["last_logits"]) < tol / 5
    # int8 activations: another computation, red at GPU_TOL (3.7e-3 here, as on the H200)
    red = device_refs.compare(device_refs.model_outputs(q8act, want, rows=False), want, True, tol=tol)
    logits = next(c for c in red if c["check"] == "code-short last logits")
    assert not logits["ok"] and float(logits["detail"].split()[1].rstrip(",")) > 100 * tol


def test_near_tie_is_reported_not_failed():
    """A greedy-id or acceptance difference fails when the expectation's smallest top-2 gap exceeds 2 x tol (then
    no deviation within tol can move an argmax), and is reported as undecided when it does not."""
    v = np.zeros(8, np.float32)
    v[:3] = [10.0, 9.99995, 1.0]                        # top-2 gap 5e-5 / 10 = 5e-6
    assert abs(device_refs.top2_gap(v) - 5e-6) < 1e-7
    want = {"p": {"last_logits": v, "argmax": 0, "greedy_ids": [1, 2, 3], "spec": {"1": [3, 3, 2]},
                  "last_margin": 5e-6, "greedy_margin": 1e-3, "spec_margin": {"1": 5e-6}}}
    got = {"p": {"last_logits": v + 1e-6, "argmax": 0, "greedy_ids": [1, 2, 4], "spec": {"1": [3, 3, 1]},
                 "spec_equal": {"1": True}}}
    res = {c["check"]: c for c in device_refs.compare(got, want, True, tol=1e-5)}
    assert res["p last logits"]["ok"]
    assert not res["p greedy ids"]["ok"]                           # gap 1e-3 > 2e-5: a real difference
    counts = res["p n_max=1 (rounds, drafted, accepted)"]
    assert counts["ok"] and counts["undecided"] and "near-tie" in counts["detail"]
    # without margins (the fixtures' own references) every difference fails
    for k in ("last_margin", "greedy_margin", "spec_margin"):
        del want["p"][k]
    assert [c["ok"] for c in device_refs.compare(got, want, True, tol=1e-5)] == [True, False, True, False]


def test_bundle_plans_quantized_checks_at_the_gpu_tolerance(compiled, tmp_path, monkeypatch):
    """A quantized check's plan entry points at expectations recorded from the --exact-matmul artifact
    (refs/expect-exact-NAME) and carries its tolerance; the device check reads it. Which GGUFs also get the int8
    check ("NAME-int8" on CUDA bundles: every CPU-int8 format on the CUDA integer route): the Q8_0 and Q4_K_M
    fixtures and the quants/ ones (MXFP4, IQ4_XS, IQ2_S, IQ3_XXS, IQ3_S are on the route too: every integer kind of
    the CPU is)."""
    recorded = []
    monkeypatch.setattr(bundle_builder, "record_cpu_expectations",
                        lambda src, fixture, path, art=None, exact=True: recorded.append((path, art, exact)) or
                        open(path + ".json", "w").write("{}"))
    exact = compiled("q8-exact", G4 / "tiny-glm4moe-Q8_0.gguf", exact_matmul=True)
    plan = bundle_builder.build(str(tmp_path / "b"), host="here", device="cpu", checks=["glm4moe-Q8_0"],
                                realwidth=None, prebuilt={"glm4moe-Q8_0": exact}, copy_models=False,
                                cpu_artifacts={"glm4moe-Q8_0": exact})
    (c,) = plan["checks"]
    assert c["expect"] == "refs/expect-exact-glm4moe-Q8_0" and c["tol"] == device_refs.GPU_TOL
    assert recorded == [(str(tmp_path / "b" / c["expect"]), exact, True)]
    assert device_refs.tolerance(c) == device_refs.GPU_TOL and device_refs.tolerance({}) == device_refs.LOGIT_TOL
    assert [bundle_builder.gpu_route(str(G4 / f"tiny-glm4moe-{q}.gguf")) for q in ("Q8_0", "Q4_K_M")] == ["int8"] * 2
    quants = {p.name: bundle_builder.gpu_route(str(p)) for p in (FIXTURES / "quants").glob("*.gguf")}
    assert quants == {"tiny-glm4moe-IQ2_M.gguf": "int8", "tiny-glm4moe-IQ3_XXS.gguf": "int8",
                      "tiny-glm4moe-MXFP4_MOE.gguf": "int8"}, quants


def test_predictable_realwidth_stage_reports_floor_fractions_and_speculation(bundle, tmp_path):
    """The `realwidth NAME` stage of a predictable real-width file (here a tiny stand-in: the Q8_0 fixture): decode,
    verify of 2 / 3 / 4 rows and a draft step as fractions of the copy-bandwidth floor and in decodes, then spec off,
    n_max 1..3 and auto tok/s with acceptance, every config's tokens equal to spec off."""
    b, _plan = bundle

    def edit(p):
        p["realwidth_spec"] = [{"name": "tiny", "model": str(G4 / "tiny-glm4moe-Q8_0.gguf"),
                                "artifact": p["realwidth"]["artifact"]}]

    d = with_plan(b, tmp_path, edit)
    out = tmp_path / "out"
    r = run_bundle(d, "device-check", "--device", "cpu", "--quick", "--only", "realwidth tiny", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    res = json.loads((out / "device_check.json").read_text())
    assert [s["stage"] for s in res["stages"]] == ["plugin", "realwidth tiny"]
    rep = res["realwidth_spec"]["tiny"]
    assert [(x["entry"], x["rows"]) for x in rep["rows"]] == [("decode", 1), ("verify", 2), ("verify", 3),
                                                              ("verify", 4), ("draft", 1)]
    assert all(x["of_floor"] > 0 and x["floor_ms"] > 0 for x in rep["rows"]) and rep["rows"][0]["decodes"] == 1
    assert [x["config"] for x in rep["speed"]] == ["off", "n_max=1", "n_max=2", "n_max=3", "auto"]
    assert all(x["same_as_off"] and x["tok_s"] > 0 for x in rep["speed"])
    assert all(0 <= x["acceptance"] <= 1 for x in rep["speed"][1:])
    assert "realwidth tiny" in r.stdout and "acceptance" in r.stdout


def test_realwidth_stage_times_the_reduced_draft_head(bundle, tmp_path, compiled):
    """With an artifact compiled with --spec-draft-vocab (as the bundle's real-width ones are), the `realwidth NAME`
    stage times a draft step with each head (`draft`, `draft_vocab`), the reduced one against its own smaller floor,
    and runs speculation with the full head: the acceptance of the same artifact loaded with --spec-draft-vocab 0."""
    import nextn.runtime as rt

    b, _plan = bundle
    bf16 = G4 / "tiny-glm4moe-BF16.gguf"
    dv = compiled("dv2048-glm4moe", bf16, draft_vocab=2048)   # tests/test_draft_vocab.py's artifact
    d = with_plan(b, tmp_path, lambda p: p.update(realwidth_spec=[{"name": "dv", "model": str(bf16), "artifact": dv}]))
    out = tmp_path / "out"
    r = run_bundle(d, "device-check", "--device", "cpu", "--quick", "--only", "realwidth dv", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rep = json.loads((out / "device_check.json").read_text())["realwidth_spec"]["dv"]
    rows = {x["entry"]: x for x in rep["rows"]}
    assert [(x["entry"], x["rows"]) for x in rep["rows"]][-2:] == [("draft", 1), ("draft_vocab", 1)]
    # the reduced head reads 2048 of the 8192 head rows: a smaller floor, both timed
    assert 0 < rows["draft_vocab"]["floor_ms"] < rows["draft"]["floor_ms"] and rows["draft_vocab"]["median_ms"] > 0
    full = rt.load(dv, ctx_size=4096, draft_vocab=0)
    for x in rep["speed"][1:4]:
        want = full.generate("Hello", 16, spec_type="draft-mtp", n_max=int(x["config"][-1]), ignore_eos=True)
        assert x["same_as_off"] and x["acceptance"] == want.stats.acceptance, (x, want.stats)


def test_an_optional_row_that_fails_is_recorded_not_raised():
    """`timed_entry`: the reduced-head draft row (device_timing.OPTIONAL, new on a device) that raises becomes a row
    with its error, so the stage keeps what it measured; any other row's error still fails the stage."""
    class Seq:
        vm_seconds = {"draft_vocab": 0.0, "draft": 0.0}

    def boom():
        raise RuntimeError("CUDA: an illegal memory access")

    row = device_timing.timed_entry(Seq(), "draft_vocab", boom, 2)
    assert row == {"entry": "draft_vocab", "error": "RuntimeError: CUDA: an illegal memory access"}
    with pytest.raises(RuntimeError):
        device_timing.timed_entry(Seq(), "draft", boom, 2)
    ok = device_timing.timed_entry(Seq(), "draft_vocab", lambda: None, 3)
    assert ok["entry"] == "draft_vocab" and ok["reps"] == 3 and ok["median_ms"] == 0.0


@pytest.mark.parametrize("types", [pytest.param("fast", id="one-per-family"),
                                   pytest.param("all", id="every-format", marks=pytest.mark.slow)])
def test_int8_kernels_stage_checks_the_integer_kernels_alone(bundle, tmp_path, types):
    """The `int8 kernels` stage (bench/int8_cases.py; here the llvm build of the same definitions): per integer-route
    format and row count the rows quantized by the kernel (and their sums of 16 quants) equal the CPU's bit for bit
    and the product the x86 kernel's within GPU_TOL; a case whose expected product is off by 1e-3, or one of whose
    sums is off by one, fails the stage. The fast tier takes one
    format per kernel family (block32 Q8_0, K-quant Q4_K, table IQ4_XS, codebook IQ2_XXS), the slow one all."""
    import int8_cases

    b, _plan = bundle
    art = tmp_path / "int8"
    types = int8_cases.TYPES if types == "all" else ("Q8_0", "Q4_K", "IQ4_XS", "IQ2_XXS")
    spec = int8_cases.build(str(art), "llvm", types=types)
    d = with_plan(b, tmp_path, lambda p: p.update(int8_kernels=dict(spec, dir=str(art))))
    out = tmp_path / "out"
    r = run_bundle(d, "device-check", "--device", "cpu", "--only", "int8 kernels", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    res = json.loads((out / "device_check.json").read_text())
    assert [s["stage"] for s in res["stages"]] == ["plugin", "int8 kernels"]
    cases = res["int8_kernels"]
    assert len(cases) == len(types) * len(int8_cases.ROWS)
    assert all(c["rows_bit_exact"] and c["rel_err"] < device_refs.GPU_TOL for c in cases.values()), cases
    # the same stage with one expected product moved by 1e-3 of its scale: red
    z = dict(np.load(art / "cases.npz"))
    y = z["Q4_K/4/y"]
    y[1, 2] += 1e-3 * np.abs(y).max()
    bad = tmp_path / "int8bad"
    shutil.copytree(art, bad)
    np.savez_compressed(bad / "cases.npz", **z)
    d2 = with_plan(b, tmp_path, lambda p: p.update(int8_kernels=dict(spec, dir=str(bad))), name="bad")
    r = run_bundle(d2, "device-check", "--device", "cpu", "--only", "int8 kernels", "--out", str(tmp_path / "o2"))
    assert r.returncode != 0 and "Q4_K T=4" in r.stdout, r.stdout[-3000:]
    # and with one expected sum of 16 quants off by one: red too
    z = dict(np.load(art / "cases.npz"))
    z["Q8_0/9/xs"][3, 1] += 1
    bad = tmp_path / "int8bad_sum"
    shutil.copytree(art, bad)
    np.savez_compressed(bad / "cases.npz", **z)
    d3 = with_plan(b, tmp_path, lambda p: p.update(int8_kernels=dict(spec, dir=str(bad))), name="bad_sum")
    r = run_bundle(d3, "device-check", "--device", "cpu", "--only", "int8 kernels", "--out", str(tmp_path / "o3"))
    assert r.returncode != 0 and "Q8_0 T=9" in r.stdout and "DIFFER" in r.stdout, r.stdout[-3000:]
