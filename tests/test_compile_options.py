"""CompileOptions (common/compile_options.py): the compile-cache key, the JSON form, and the options read back from
manifests. `data/manifest-main-*.json.gz` are manifests written by nextn before CompileOptions existed (commit
848b253; model file paths made relative to the fixtures folder): g4-q8 = tiny-glm4moe-Q8_0 with -ctk/-ctv f32,
dsa-opts = tiny-glm-dsa-Q8_0 with mtp_dense_attention, draft_vocab 1024, exact_matmul, -ctk q8_0 -ctv bf16,
g4-pair = the glm4moe trunk + MTP draft pair with split_kernels (the GPU kernel form on llvm)."""
from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest

from nextn.common.errors import NextnError
from nextn.common.gguf import GGUFFile
from nextn.common.compile_options import CompileOptions

from conftest import FIXTURES, G4

DATA = Path(__file__).parent / "data"
Q8 = G4 / "tiny-glm4moe-Q8_0.gguf"

# Each field set off its default (tuning_log is filled in by the test: it needs a file).
CHANGED = {"target": "cuda", "arches": ("sm_90",), "mtp_dense_attention": True, "cache_type_k": "q8_0",
           "cache_type_v": "bf16", "draft_vocab": 1024, "exact_matmul": True, "split_kernels": True,
           "cuda_graph": False, "tuning_log": None}


def main_manifest(name: str) -> dict:
    with gzip.open(DATA / f"manifest-main-{name}.json.gz", "rt") as f:
        return json.load(f)


def test_fields_are_the_changed_set():
    assert sorted(f.name for f in dataclasses.fields(CompileOptions)) == sorted(CHANGED)


def test_equal_options_equal_keys():
    a = CompileOptions(target="cuda", arches=["sm_80", "sm_90"], cache_type_k=None, draft_vocab=None)
    b = CompileOptions(target="cuda", arches=("sm_80", "sm_90"), cache_type_k="f16", draft_vocab=0)
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    # split_kernels None is the target's default form: the same artifact, the same key
    assert CompileOptions(split_kernels=False).key() == CompileOptions().key()
    assert CompileOptions(target="cuda", split_kernels=True).key() == CompileOptions(target="cuda").key()
    # the --arch spellings parse_arches accepts name the same archs
    assert CompileOptions(target="cuda", arches=["90,80"]).key() == \
        CompileOptions(target="cuda", arches=["sm_90", "sm_80"]).key()


def test_key_changes_with_every_field(tmp_path):
    log = tmp_path / "log.json"
    log.write_text('{"a": 1}')
    changed = dict(CHANGED, tuning_log=str(log))
    keys = {"default": CompileOptions().key()}
    for name, value in changed.items():
        opts = CompileOptions(**{name: value, **({"target": "cuda"} if name == "arches" else {})})
        keys[name] = opts.key()
    assert len(set(keys.values())) == len(keys), keys         # each field gives its own key
    # cuda's arches differ from cuda's default arches: compare with the target alone
    assert keys["arches"] != CompileOptions(target="cuda").key()
    # off-default split on a GPU target (the CPU kernel form) has its own key too
    assert CompileOptions(target="cuda", split_kernels=False).key() != CompileOptions(target="cuda").key()


def test_key_follows_the_tuning_log_content(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "log.json").write_text('{"a": 1}')      # LOG_DIR: its log.json
    (tmp_path / "b.json").write_text('{"a": 1}')
    (tmp_path / "c.json").write_text('{"a": 2}')
    key = {n: CompileOptions(tuning_log=str(tmp_path / n)).key() for n in ("a", "b.json", "c.json")}
    assert key["a"] == key["b.json"] != key["c.json"]
    with pytest.raises(NextnError, match="no such tuning log"):
        CompileOptions(tuning_log=str(tmp_path / "missing.json")).key()


def test_key_format_names_the_options():
    """The readable part of the runtime's cache entries (entry.cache_path) keeps the format it had before
    CompileOptions, so the default entry is spelled as before."""
    assert CompileOptions().key() == "llvm-kv_f16_f16"
    assert CompileOptions(target="cuda", arches=["sm_90"], mtp_dense_attention=True, draft_vocab=2048,
                          cache_type_k="q8_0").key() == "cuda_sm_90-mtp-dense-dv2048-kv_q8_0_f16"
    assert CompileOptions(exact_matmul=True, split_kernels=True).key() == "llvm-kv_f16_f16-exact-split"


def test_bad_options_say_which_flag():
    with pytest.raises(NextnError, match="--cache-type-v q4: expected one of"):
        CompileOptions(cache_type_v="q4").key()
    with pytest.raises(NextnError, match="takes no --arch"):
        CompileOptions(arches=["sm_90"]).key()
    with pytest.raises(NextnError, match="--arch sm_61"):
        CompileOptions(target="cuda", arches=["sm_61"]).key()


def test_cache_key_files(tmp_path):
    copy = tmp_path / "copy.gguf"
    shutil.copy(Q8, copy)
    o = CompileOptions()
    assert o.cache_key(copy) == o.cache_key(Q8)                  # a copy is the same model
    assert o.cache_key(copy, at_path=True) != o.cache_key(Q8, at_path=True)   # unless bound to its path
    assert o.cache_key(Q8) != CompileOptions(exact_matmul=True).cache_key(Q8)
    pair = o.cache_key(G4 / "tiny-glm4moe-trunk-Q8_0.gguf", G4 / "mtp-tiny-glm4moe-Q8_0.gguf")
    assert pair != o.cache_key(G4 / "tiny-glm4moe-trunk-Q8_0.gguf")
    assert o.cache_key(Q8).startswith(GGUFFile.open(str(Q8)).identity()[:16] + "-llvm-kv_f16_f16-")
    with pytest.raises(NextnError):
        o.cache_key(tmp_path / "missing.gguf")


def test_json_round_trip(tmp_path):
    full = CompileOptions(**dict(CHANGED, tuning_log=str(tmp_path / "log.json")))
    for o in (CompileOptions(), full, CompileOptions(target="rocm", arches=["gfx942"], split_kernels=False)):
        d = json.loads(json.dumps(o.to_json()))
        assert CompileOptions.from_json(d) == o
    assert CompileOptions.from_json({}) == CompileOptions()
    with pytest.raises(NextnError, match="unknown field 'exact'"):
        CompileOptions.from_json({"exact": True})
    with pytest.raises(NextnError, match="expected a JSON object"):
        CompileOptions.from_json(["llvm"])


def test_asked_is_what_the_caller_gave():
    """KV types and draft_vocab left None compile as f16 / 0 but are not asked: an artifact directory keeps its own
    (runtime/model.py LoadedModel.open); given, they are asked, even when equal to the default. Equality and the key
    see only the values."""
    unasked, given = CompileOptions(), CompileOptions(cache_type_k="f16", cache_type_v="f16", draft_vocab=0)
    assert unasked == given and unasked.key() == given.key() == "llvm-kv_f16_f16"
    assert (unasked.cache_type_k, unasked.cache_type_v, unasked.draft_vocab) == ("f16", "f16", 0)
    assert [unasked.asked(n) for n in ("cache_type_k", "cache_type_v", "draft_vocab")] == [None, None, None]
    assert [given.asked(n) for n in ("cache_type_k", "cache_type_v", "draft_vocab")] == ["f16", "f16", 0]
    one = CompileOptions(cache_type_k="q8_0", draft_vocab=1024)
    assert (one.asked("cache_type_k"), one.asked("cache_type_v"), one.asked("draft_vocab")) == ("q8_0", None, 1024)
    assert CompileOptions.from_json(one.to_json()).asked("cache_type_v") == "f16"   # JSON holds the values only
    with pytest.raises(ValueError, match="target: not one of"):
        one.asked("target")


def test_load_takes_options_or_keywords_not_both():
    """nextn.runtime.load builds one CompileOptions from its keywords, or takes one whole; both is an error (raised
    before any file is read)."""
    import nextn.runtime as rt

    with pytest.raises(ValueError, match="as `options` or as keywords, not both"):
        rt.load("no-such.gguf", cache_type_k="q8_0", options=CompileOptions())
    with pytest.raises(NextnError):   # keywords at their defaults with `options`: the options are used
        rt.load("no-such.gguf", target="llvm", options=CompileOptions(cache_type_k="q8_0"))


def test_runtime_side_imports_no_compiler_module():
    """Running an artifact needs no compiler (docs/gpu.md: a GPU machine gets common + runtime only): the CLI, the
    Python API and the server, and building CompileOptions with its key, import no nextn.compiler module."""
    import subprocess
    import sys

    code = ("import sys; import nextn.runtime.cli, nextn.runtime.api, nextn.runtime.server, nextn.runtime.model; "
            "from nextn.common.compile_options import CompileOptions; "
            "assert CompileOptions(target='cuda', arches=['90'], cache_type_k='q8_0').key() == "
            "'cuda_sm_90-kv_q8_0_f16'; "
            "print(sorted(m for m in sys.modules "
            "if m.startswith('nextn.compiler') or m.startswith('nextn.schedules')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize("name, want", [
    ("g4-q8", CompileOptions(cache_type_k="f32", cache_type_v="f32")),
    ("dsa-opts", CompileOptions(mtp_dense_attention=True, draft_vocab=1024, exact_matmul=True, cache_type_k="q8_0",
                                cache_type_v="bf16")),
    ("g4-pair", CompileOptions(split_kernels=True)),
])
def test_options_of_a_manifest_written_before_them(name, want):
    assert CompileOptions.from_manifest(main_manifest(name)) == want


def test_options_of_older_manifests():
    """A manifest from before KV types held f32 caches and recorded no `kv_cache`; a CUDA one records its graphs."""
    m = main_manifest("g4-q8")
    del m["kv_cache"]
    assert CompileOptions.from_manifest(m) == CompileOptions(cache_type_k="f32", cache_type_v="f32")
    m = main_manifest("g4-q8")
    m["target"] = {**m["target"], "name": "cuda", "arches": ["sm_90"]}
    m.update(kernel_form="gpu", x86_kernels=None, cuda_graph=None)
    assert CompileOptions.from_manifest(m) == CompileOptions(target="cuda", arches=["sm_90"], cache_type_k="f32",
                                                             cache_type_v="f32", cuda_graph=False)


def _paths(d, pre=""):
    """Every field path of a JSON value (dict keys; list items as [])."""
    if isinstance(d, dict):
        return {p for k, v in d.items() for p in _paths(v, f"{pre}.{k}")} | {pre}
    if isinstance(d, list):
        return {p for v in d for p in _paths(v, f"{pre}[]")} | {pre}
    return {pre}


def test_manifest_written_before_still_loads(compiled, tmp_path):
    """The manifest today's compile writes has the fields, and the options, of the one written before
    CompileOptions for the same model and options; and the runtime loads the earlier manifest (its model paths and
    library hash pointed at this session's files: the library's bytes depend on the build's object addresses,
    compiler/reproducible.py) and decodes what today's artifact decodes."""
    import nextn.runtime as rt

    new_dir = Path(compiled("q8", Q8))
    new = json.loads((new_dir / "manifest.json").read_text())
    old = main_manifest("g4-q8")
    def fields(m):   # x86_kernels is None on a CPU without AVX2
        return {p for p in _paths(m) if not p.startswith(".x86_kernels.")}

    assert fields(new) == fields(old)
    assert CompileOptions.from_manifest(new) == CompileOptions.from_manifest(old)
    assert new["kv_cache"] == old["kv_cache"] and new["options"] == old["options"]
    art = tmp_path / "art"
    shutil.copytree(new_dir, art)
    for f in old["model_files"]:
        f["path"] = f["relpath"] = str(FIXTURES / f["path"])
    old["libraries"] = new["libraries"]
    old["target"] = new["target"]   # the library's target: this CPU's flags (the earlier one was an AVX-512 machine's)
    for name, e in old["entry_points"].items():    # an entry's inputs are its library function's signature: today's
        e["inputs"] = new["entry_points"][name]["inputs"]      # (mtp_draft has taken `out_ids` since 1484a72)
    (art / "manifest.json").write_text(json.dumps(old, indent=1))
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    got = rt.load(str(art), ctx_size=256).generate(ids, 12, n_max=2, ignore_eos=True)
    want = rt.load(str(new_dir), ctx_size=256).generate(ids, 12, n_max=2, ignore_eos=True)
    assert got.ids == want.ids and (got.stats.drafted, got.stats.accepted) == (want.stats.drafted, want.stats.accepted)
