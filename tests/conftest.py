"""Shared fixtures: the trained tiny models in ../shared/fixtures and artifacts compiled from them once per session."""
from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from nextn.common.compare import rel_err
# the interpreter's side of a comparison; tests import these names from here
from nextn.compiler.ir.reference import dequantized, graphs_and_dequantized, zero_states  # noqa: F401

FIXTURES = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures"
# Logits / hidden against the BF16 references: max |got - want| per row within 1e-4 of the row's max |want|
# (the fixtures' README, "tolerances we hold ourselves to"; the README's Status section states the same).
REF_TOL = 1e-4
G4 = FIXTURES / "tiny-glm4moe"
REPO = Path(__file__).resolve().parents[1]


def reference(model_dir: Path = G4) -> dict:
    return json.loads((model_dir / "reference.json").read_text())


def reference_logits(model_dir: Path = G4):
    return np.load(model_dir / "reference_logits.npz")


def quantized_activations(engine) -> dict[str, str]:
    """Weights whose matmuls take int8 activation rows in this engine's artifact, with their row format ("q8",
    "q8_0"): the interpreter's argument."""
    return {b["tensor"]: b["activation"] for b in engine.artifact.manifest["buffer_plan"]["weights"]
            if b.get("activation")}


def exact_sequence(compiled, name: str, model: Path):
    """The --exact-matmul build of `model` (float activations, checked), loaded: what matches the interpreter."""
    import nextn.runtime as rt

    exact = rt.load(compiled(name, model, exact_matmul=True), ctx_size=4096)
    assert not quantized_activations(exact.loaded)
    return exact.sequence


def check_trunk_vs_ir(seq, graphs, w, ids, rows: int):
    """Compiled `prefill` over `ids`, then `verify` of `rows` rows continuing its KV, against the interpreter
    (1e-5 relative, argmax equal). Returns the interpreter's KV states."""
    from nextn.compiler.ir import interpret

    T = len(ids)
    st = zero_states(graphs["prefill"], seq.n_ctx, seq.model.rs_planes)

    def rs():   # recurrent states (glm5next): the engine's committed plane, which the call reads
        return {"rs_plane": np.array([seq.rs_plane], np.int32)} if "rs_plane" in graphs["prefill"].inputs else {}

    h1, last1, am1 = seq.prefill(ids, 0, last_only=True)   # plain decoding's prefill: its last row, the same bits
    want = interpret.run(graphs["prefill"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32),
                                             "hidden_ids": np.arange(T, dtype=np.int32),
                                             "out_ids": np.array([T - 1], np.int32), **rs()}, w, st, n_kv=T)
    h, last, am = seq.prefill(ids, 0)
    assert rel_err(h, want["hidden"]) < 1e-5
    assert rel_err(last, want["logits"][0]) < 1e-5 and am == want["argmax"][0]
    assert h1.shape == (1, h.shape[1]) and (h1 == h[-1:]).all() and (last1 == last).all() and am1 == am
    verify_rows = np.array([am, 17, 99, 5][:rows], np.int32)
    want = interpret.run(graphs["verify"], {"tokens": verify_rows, "pos": np.arange(T, T + rows, dtype=np.int32),
                                            **rs()}, w, st, n_kv=T + rows)
    _h, lg, amv = seq.verify(verify_rows, T)
    assert rel_err(lg.numpy(), want["logits"]) < 1e-5
    assert (amv == want["argmax"]).all()
    return st


def check_mtp_vs_ir(seq, graphs, w, ids):
    """Compiled `mtp_rows` (teacher-forced, random h_prev) then one `mtp_draft` step, against the interpreter."""
    from nextn.compiler.ir import interpret

    T = len(ids)
    h_prev = np.random.default_rng(0).standard_normal((T, seq.model.hparams["n_embd"])).astype(np.float32)
    st = zero_states([graphs["mtp_rows"], graphs["mtp_draft"]], seq.n_ctx)   # glm-dsa's draft has one more state
    want = interpret.run(graphs["mtp_rows"], {"tokens": ids, "pos": np.arange(T, dtype=np.int32), "h_prev": h_prev,
                                              "out_ids": np.array([T - 1], np.int32)}, w, st, n_kv=T)
    got = seq.mtp_rows(ids, h_prev, 0)
    assert rel_err(got, want["h_nextn"]) < 1e-5
    want = interpret.run(graphs["mtp_draft"], {"tokens": ids[:1], "pos": np.array([T], np.int32),
                                               "h_prev": got[-1:], "out_ids": np.array([0], np.int32)},
                           w, st, n_kv=T + 1)
    h, lg, am = seq.mtp_draft(ids[:1], got[-1:], T)
    assert rel_err(h, want["h_nextn"]) < 1e-5
    assert rel_err(lg.numpy(), want["logits"]) < 1e-5 and am[0] == want["argmax"][0]


def check_logits(model, model_dir: Path, kind: str) -> None:
    """Trunk logits, trunk hidden (post output_norm) and teacher-forced NextN logits of prompt `kind` against the
    fixture's reference_logits.npz (REF_TOL of each row's max |logit|)."""
    npz = reference_logits(model_dir)
    ids = next(p for p in reference(model_dir)["prompts"] if p["kind"] == kind)["prompt_ids"]
    assert rel_err(model.logits(ids), npz[f"{kind}/trunk_logits"]) < REF_TOL
    assert rel_err(model.sequence.hidden(ids), npz[f"{kind}/trunk_hidden"]) < REF_TOL
    assert rel_err(model.mtp_logits(ids), npz[f"{kind}/mtp_logits"]) < REF_TOL


def record_rounds(model, monkeypatch) -> list:
    """Record each round of `model.generate` as [drafted ids, accepted] from the engine's verify / commit calls
    (accepted counts emitted tokens only, as SpecStats: a finish rule may cut a round)."""
    seq, log = model.sequence, []
    verify, commit = seq.verify, seq.commit

    def v(tokens, pos0):
        h, lg, am = verify(tokens, pos0)
        drafts = [int(t) for t in tokens[1:]]
        log.append([drafts, next((i for i, d in enumerate(drafts) if int(am[i]) != d), len(drafts))])
        return h, lg, am

    def c(n):
        if log and n <= log[-1][1]:
            log[-1][1] = n
        return commit(n)

    monkeypatch.setattr(seq, "verify", v)
    monkeypatch.setattr(seq, "commit", c)
    return log


def check_greedy_and_speculative(model, p: dict, monkeypatch=None, spec_key: str = "spec") -> None:
    """Reference prompt `p`: greedy continuation equals the reference, and draft-mtp at each n_max of `p[spec_key]`
    emits the same tokens with the reference's acceptance counts (and, given `monkeypatch` and a reference with
    `rounds`, the same drafted ids and accepted count in every round)."""
    plain = model.generate(p["prompt_ids"], p["n_predict"], spec_type="none", ignore_eos=True)
    assert plain.ids == p["greedy_ids"]
    assert plain.text == p["greedy_text"]
    assert plain.stats.rounds == 0
    for n_max, want in sorted(p[spec_key].items()):
        log = record_rounds(model, monkeypatch) if monkeypatch is not None and "rounds" in want else None
        r = model.generate(p["prompt_ids"], p["n_predict"], spec_type="draft-mtp", n_max=int(n_max), ignore_eos=True)
        if log is not None:
            monkeypatch.undo()
        assert r.ids == plain.ids, f"n_max={n_max}: speculative output differs from plain decoding"
        assert (r.stats.rounds, r.stats.drafted, r.stats.accepted) == (want["steps"], want["drafted"], want["accepted"])
        assert r.stats.mean_len == pytest.approx(want["mean_len"])
        assert r.stats.per_pos == pytest.approx(want["per_pos"])
        assert r.stats.acceptance == pytest.approx(want["rate"])
        if log is not None:
            assert [x for x in log if x[0]] == want["rounds"]


def check_split_layout(pair, bundle, trunk_only, p: dict) -> None:
    """The split layout (llama.cpp's converter --no-mtp / --mtp): trunk-only GGUF + MTP-only draft (`pair`) speculates
    exactly as the bundle (same tokens, rounds, drafts, acceptances at n_max 1 and 3); the trunk-only GGUF alone
    decodes plainly as the bundle does."""
    assert pair.has_mtp and not trunk_only.has_mtp
    for n_max in (1, 3):
        got = pair.generate(p["prompt_ids"], 24, n_max=n_max, ignore_eos=True)
        want = bundle.generate(p["prompt_ids"], 24, n_max=n_max, ignore_eos=True)
        assert got.ids == want.ids and got.stats.drafted > 0
        assert (got.stats.rounds, got.stats.drafted, got.stats.accepted) == \
            (want.stats.rounds, want.stats.drafted, want.stats.accepted)
    assert trunk_only.generate(p["prompt_ids"], 8, spec_type="none", ignore_eos=True).ids == \
        bundle.generate(p["prompt_ids"], 8, spec_type="none", ignore_eos=True).ids


# The fast tier (`pytest -m "not slow"`) compiles these artifacts only, as (model file, MTP-only draft file,
# CompileOptions.key()): each arch's BF16 build (the fixtures' references), and glm4moe's Q8_0 with and without
# --exact-matmul (most runtime, CLI and server tests). A compile is the fast tier's main cost (about a minute each on
# the 2-core machine, cold), so an end-to-end test that needs any other artifact is `slow` (SLOW_E2E); `compiled`
# fails an unmarked one and says so.
FAST_ARTIFACTS = {
    ("tiny-glm4moe-BF16.gguf", None, "llvm-kv_f32_f32"),
    ("tiny-glm4moe-Q8_0.gguf", None, "llvm-kv_f32_f32"),
    ("tiny-glm4moe-Q8_0.gguf", None, "llvm-kv_f32_f32-exact"),
    ("tiny-glm-dsa-BF16.gguf", None, "llvm-kv_f32_f32"),
    ("tiny-glm5next-BF16.gguf", None, "llvm-kv_f32_f32"),
}
# End-to-end tests on other artifacts, or that compile outside `compiled` (a CLI subprocess, entry.compiled_artifact):
# "file" (all its end-to-end tests) or "file::test" (every parametrization) -> what it compiles. CI runs them all.
SLOW_E2E = {
    "test_budget.py::test_a_smaller_kv_type_that_fits": "glm4moe Q8_0 with -ctk/-ctv f16",
    "test_cuda_mma.py::test_calls_of_few_rows_take_the_gemv_copy": "glm4moe Q8_0 and quants/ IQ3_XXS, GPU kernel form",
    "test_cuda_kernels.py::test_fixture_compiles_for_sm90": "glm4moe Q8_0 / Q4_K_M for sm_90",
    "test_device_check.py::test_realwidth_stage_times_the_reduced_draft_head": "glm4moe BF16, --spec-draft-vocab 2048",
    "test_draft_vocab.py": "glm4moe BF16 with --spec-draft-vocab 2048",
    "test_glm5next.py::test_q8_compiled_vs_ir_every_entry_point": "glm5next Q8_0 --exact-matmul",
    "test_glm5next.py::test_trunk_only_plus_mtp_only_pair_equals_bundle": "glm5next Q8_0, its trunk-only + MTP pair",
    "test_glm_dsa.py::test_yarn_gguf_config_and_compiled_vs_ir": "a YaRN glm-dsa Q8_0",
    "test_glm_dsa.py::test_yarn_gguf_speculative_equals_plain": "a YaRN glm-dsa Q8_0, glm-dsa Q8_0",
    "test_glm_dsa.py::test_mtp_dense_attention_equals_indexer_when_short": "glm-dsa BF16 --mtp-dense-attention",
    "test_glm_dsa.py::test_q8_0_compiled_vs_ir": "glm-dsa Q8_0 --exact-matmul",
    "test_glm_dsa.py::test_trunk_only_plus_mtp_only_pair_equals_bundle": "glm-dsa Q8_0, its trunk-only + MTP pair",
    "test_kv_bucket.py::test_kv_bucket_and_fixed_inputs_are_bit_exact[glm-dsa]": "glm-dsa Q8_0",
    "test_kv_bucket.py::test_kv_bucket_and_fixed_inputs_are_bit_exact[glm5next]": "glm5next Q8_0",
    "test_kv_bucket.py::test_split_kernels_form": "each arch's Q8_0 with the GPU kernel form",
    "test_kv_bucket.py::test_split_kernels_integer_route": "each arch's Q8_0 with the GPU kernel form, int8 rows",
    "test_kv_types.py": "each arch's BF16 at each KV cache type; the CLI test through entry.compiled_artifact",
    "test_layouts.py::test_trunk_only_runs_without_speculation": "glm4moe's trunk-only Q8_0",
    "test_layouts.py::test_trunk_only_refuses_draft_mtp_cli": "glm4moe's trunk-only Q8_0",
    "test_layouts.py::test_trunk_plus_mtp_draft_equals_bundle": "glm4moe's trunk-only + MTP pair",
    "test_layouts.py::test_mtp_weights_not_read_when_spec_off": "glm4moe's trunk-only + MTP pair",
    "test_nvfp4.py": "glm-dsa NVFP4",
    "test_quant_e2e.py": "glm4moe / glm-dsa Q4_K_M",
    "test_quant_lowbit_e2e.py": "glm4moe IQ3_XXS and MXFP4_MOE",
    "test_server_session.py::test_glm_dsa_reuse_equals_cold_start": "glm-dsa Q8_0",
    "test_split_gguf.py": "glm4moe Q8_0 with f16 KV, and `nextn run` of a split GGUF (a CLI compile)",
    # on fast artifacts, but long (the measured fast tier's largest, README "Test tiers")
    "test_quant.py::test_gpu_kernels_build": "every kernel for CUDA and ROCm",
    "test_x86_kernels.py::test_every_tuned_knob_keeps_the_row_bits": "every tuning knob's kernel",
    "test_glm5next.py::test_cli_index_share_flag": "`nextn run` subprocesses of glm5next",
}
# Tests swept over the reference prompts that keep one prompt in the fast tier (the others are slow).
FAST_PARAMS = {"test_glm5next.py::test_index_share_off_matches_reference": "code-short"}
# Kernel tests swept over every weight format (their first parameter): in the fast tier, one format per x86 / GPU
# kernel path (block32 Q8_0, K-quant Q4_K, IQ4_XS, the codebook IQ2_XXS, float BF16; the same four on the GPU integer
# route); the other formats are slow.
FORMAT_SWEEP_FILES = ("test_x86_kernels.py", "test_x86_iq.py", "test_cuda_kernels.py", "test_cuda_int8.py",
                      "test_cuda_mma.py", "test_quant.py")
FAST_FORMATS = ("q8_0", "q4_k", "iq4_xs", "iq2_xxs", "bf16")
_SLOW_NODES: set[str] = set()   # node ids marked slow, for `compiled`'s check


def _slow_format(item) -> bool:
    """An end-to-end test of FORMAT_SWEEP_FILES whose first parameter names a ggml type outside FAST_FORMATS."""
    import gguf

    if item.path.name not in FORMAT_SWEEP_FILES or "[" not in item.nodeid:
        return False
    first = item.nodeid.rsplit("[", 1)[1].split("-", 1)[0].rstrip("]").lower()
    return first in {t.name.lower() for t in gguf.GGMLQuantizationType} and first not in FAST_FORMATS


def _slow_e2e(item) -> bool:
    f = item.path.name
    base = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else ""
    func, _, param = base.partition("[")
    if f"{f}::{func}" in FAST_PARAMS and param.rstrip("]") != FAST_PARAMS[f"{f}::{func}"]:
        return True
    return f in SLOW_E2E or f"{f}::{base}" in SLOW_E2E or f"{f}::{func}" in SLOW_E2E


def pytest_collection_modifyitems(config, items):
    """The tiers (pyproject.toml markers): a test that takes the `compiled` fixture, directly or through another
    fixture, or is marked `e2e` (it compiles some other way) is end-to-end; `slow` ones are slow (marked so, or an
    end-to-end test in SLOW_E2E); every other test is `unit`: no compile, seconds for all of them (`pytest -m unit`).
    """
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "compiled" in names and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("e2e") is not None and (_slow_e2e(item) or _slow_format(item)):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") is not None:
            _SLOW_NODES.add(item.nodeid)
        if item.get_closest_marker("e2e") is None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _unit_tests_build_nothing(request, monkeypatch):
    """A `unit` test that builds a kernel or compiles a model fails and says to mark it `e2e`: the tier stays seconds."""
    if request.node.get_closest_marker("unit") is None:
        return
    import tvm

    import nextn.compiler.compile
    import nextn.compiler.entry

    def refuse(*_a, **_k):
        raise AssertionError(f"{request.node.nodeid} builds a kernel or a model: mark it @pytest.mark.e2e")

    for mod, name in ((tvm, "compile"), (tvm.relax, "build"), (tvm.tirx, "build"),
                      (nextn.compiler.compile, "compile_model"), (nextn.compiler.entry, "compile_model")):
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, refuse)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    os.environ["NEXTN_CACHE"] = str(tmp_path_factory.mktemp("nextn-cache"))


def artifact_cache_dir() -> Path | None:
    """Where the suite keeps compiled test artifacts across runs: `$NEXTN_TEST_CACHE`, default
    ~/.cache/nextn-test; an empty value (what .ci/run sets) compiles every artifact afresh into the session's
    temporary folder."""
    d = os.environ.get("NEXTN_TEST_CACHE")
    if d == "":
        return None
    return Path(d or Path.home() / ".cache" / "nextn-test")


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """compiled(name, model, draft=None, kv="f32", **CompileOptions fields) → artifact dir, compiled once per
    session and kept in `artifact_cache_dir()` across sessions under the options' `cache_key` (bound to the files'
    paths: the artifact is loaded by its directory); `kv`: the KV cache type of both caches (f32 by default: the
    fixtures' references are float32 with no KV rounding). Every compile of the suite goes through here."""
    import shutil

    from nextn.common.manifest import MANIFEST
    from nextn.compiler.compile import compile_model
    from nextn.common.compile_options import CompileOptions

    done: dict[str, str] = {}
    root = artifact_cache_dir()

    def build(out: str, model, draft, options):
        compile_model(str(model), out, options, draft=str(draft) if draft else None, log=lambda *_: None)

    def get(name: str, model: Path, draft: Path | None = None, kv: str = "f32", **fields) -> str:
        if name in done:
            _log_request(name, model, draft, None, 0.0)
            return done[name]
        options = CompileOptions(cache_type_k=kv, cache_type_v=kv, **fields)
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        art = (Path(model).name, Path(draft).name if draft else None, options.key())
        if art not in FAST_ARTIFACTS and test and test not in _SLOW_NODES:
            pytest.fail(f"{test} needs artifact {art}, outside the fast tier's FAST_ARTIFACTS: add it to SLOW_E2E "
                        f"(tests/conftest.py) or mark it @pytest.mark.slow", pytrace=False)
        t0, built = time.perf_counter(), False
        if root is None:
            out = str(tmp_path_factory.mktemp(f"art-{name}"))
            build(out, model, draft, options)
        else:
            out = str(root / options.cache_key(model, draft, at_path=True))
            if not os.path.isfile(os.path.join(out, MANIFEST)):
                root.mkdir(parents=True, exist_ok=True)
                with open(f"{out}.lock", "w") as lock:
                    # two xdist workers asking one key: the second waits for the first's build rather than compiling
                    # it again beside it (on 2 cores that would halve the speed of both for nothing)
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if not os.path.isfile(os.path.join(out, MANIFEST)):
                        part = f"{out}.part-{os.getpid()}"   # a build cut short leaves no artifact behind
                        shutil.rmtree(part, ignore_errors=True)
                        build(part, model, draft, options)
                        shutil.rmtree(out, ignore_errors=True)
                        os.rename(part, out)
                        built = True
        done[name] = out
        _log_request(name, model, draft, built or root is None, time.perf_counter() - t0)
        return out

    return get


def _log_request(name: str, model, draft, built: bool | None, seconds: float) -> None:
    """With `$NEXTN_TEST_ARTIFACT_LOG` set: append one JSON line per `compiled(...)` request (the test asking,
    the artifact's name and files, whether this request compiled it (None: already this session's), the seconds
    it took): which artifacts a tier needs and what they cost (README, Tests)."""
    path = os.environ.get("NEXTN_TEST_ARTIFACT_LOG")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    rec = {"test": test, "name": name, "model": os.path.basename(str(model)),
           "draft": os.path.basename(str(draft)) if draft else None, "built": built, "s": round(seconds, 2),
           "pid": os.getpid()}
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


@pytest.fixture(scope="session")
def bf16_model(compiled):
    import nextn.runtime as rt

    return rt.load(compiled("bf16", G4 / "tiny-glm4moe-BF16.gguf"), ctx_size=4096)


@pytest.fixture(scope="session")
def q8_model(compiled):
    import nextn.runtime as rt

    return rt.load(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), ctx_size=4096)


# TVM's native plugins (the CUDA/ROCm build plugins some tests load, meta_schedule's worker pools) can crash in
# their static destructors while the interpreter shuts down, after every test has run and the summary is printed.
# End the process with pytest's own exit status instead of running those destructors; failures still fail.
_EXIT_STATUS = None


def pytest_sessionfinish(session, exitstatus):
    global _EXIT_STATUS
    _EXIT_STATUS = int(exitstatus)


def pytest_unconfigure(config):
    if _EXIT_STATUS is not None and os.environ.get("NEXTN_TEST_NORMAL_EXIT") != "1":
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS)
