"""Split GGUFs (llama.cpp's gguf-split layout, written here by gguf-py's own split writer): `run`, `compile` and
`bench` given the first shard load every shard and decode exactly as the unsplit file; a missing, renamed or
foreign shard, or a later shard given as the model, is one line naming the file."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import badgguf
from conftest import G4

SRC = G4 / "tiny-glm4moe-Q8_0.gguf"


def nextn(*args, cache):
    env = {**os.environ, "NEXTN_CACHE": str(cache)}
    r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", *map(str, args)], capture_output=True, text=True,
                       env=env)
    return r.returncode, r.stdout, r.stderr


def one_line_error(rc, err, *needles):
    lines = err.strip().splitlines()
    assert rc == 1 and "Traceback" not in err and len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    first = badgguf.copy_gguf(SRC, d / "tiny.gguf", split_max_tensors=40)
    paths = sorted(d.glob("tiny-*-of-*.gguf"))
    assert [p.name for p in paths] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)] and first == paths[0]
    return paths


@pytest.fixture(scope="module")
def split_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("split-cache")


def test_shards_hold_every_tensor_once(shards):
    from nextn.common.gguf import GGUFFile

    whole, split = GGUFFile(SRC), GGUFFile(shards[0])
    assert split.paths == [str(p) for p in shards] and split.size == sum(p.stat().st_size for p in shards)
    assert set(split.tensors) == set(whole.tensors)
    assert {split.path_of(n) for n in split.tensors} == {str(p) for p in shards}
    for name in whole.tensors:
        assert np.array_equal(split.tensors[name].data, whole.tensors[name].data), name
    assert {k: v for k, v in split.fields.items() if not k.startswith("split.")} == whole.fields


def test_run_and_bench_read_all_shards(shards, split_cache, compiled, tmp_path):
    text = "def main():\n    "
    rc, out, err = nextn("run", shards[0], "-p", text, "-n", "12", "--spec-type", "draft-mtp", "--json",
                         cache=split_cache)
    assert rc == 0, err
    got = json.loads(out)
    # the unsplit file compiled as `run` compiles a GGUF (f16 KV, q8_0 activation rows): the same artifact but for
    # the file layout, so the same tokens (another KV type or matmul path could flip a near tie)
    rc, out, err = nextn("run", compiled("q8-f16kv", SRC, kv="f16"), "-p", text, "-n", "12", "--spec-type", "none",
                         "--json", cache=split_cache)
    assert rc == 0, err
    assert got["tokens"] == json.loads(out)["tokens"] and got["stats"]["drafted"] > 0
    m = json.load(open(next((split_cache / "artifacts").glob("*/manifest.json"))))
    assert [s["file"] for s in m["model_files"][0]["shards"]] == [p.name for p in shards]
    assert m["model_files"][0]["size"] == sum(p.stat().st_size for p in shards)

    # bench, on the cached artifact of the split model (the same load path as run and serve)
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"kind": "code", "text": text}]))
    rc, _, err = nextn("bench", shards[0], "--prompts", prompts, "-n", "2", "--repeat", "1", "--no-plot",
                       "-o", tmp_path / "r.json", cache=split_cache)
    assert rc == 0, err
    rep = json.load(open(tmp_path / "r.json"))
    rows = [r for mode in rep["modes"].values() for r in mode["rows"]]
    assert len(rows) == 2 and all(r[c]["same_as_off"] for r in rows for c in rep["configs"])
    assert rows[0]["off"]["ids"] == got["tokens"][:2]


@pytest.mark.slow
def test_compile_first_shard(shards, tmp_path):
    rc, _, err = nextn("compile", shards[0], "-o", tmp_path / "art", "--verify-model", cache=tmp_path / "c")
    assert rc == 0, err
    m = json.load(open(tmp_path / "art" / "manifest.json"))
    import hashlib

    assert [s["sha256"] for s in m["model_files"][0]["shards"]] == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in shards]
    for p in shards:   # printed as sha256sum prints it
        assert f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p}" in err


def test_missing_shard(shards, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    for p in shards[:2]:
        shutil.copy(p, d / p.name)
    rc, _, err = nextn("run", d / shards[0].name, "-p", "x", cache=tmp_path / "c")
    one_line_error(rc, err, "tiny-00003-of-00003.gguf", "no such file", "shard 3 of 3")
    assert not (tmp_path / "c" / "artifacts").exists()


def test_later_shard_given(shards, tmp_path):
    rc, _, err = nextn("run", shards[1], "-p", "x", cache=tmp_path / "c")
    one_line_error(rc, err, "tiny-00002-of-00003.gguf", "first shard", "tiny-00001-of-00003.gguf")


@pytest.mark.slow
def test_mismatched_shards(shards, tmp_path):
    # a shard of another split of the same model (4 shards): its split.count says so
    other = tmp_path / "other"
    other.mkdir()
    badgguf.copy_gguf(SRC, other / "o.gguf", split_max_tensors=30)
    d = tmp_path / "m"
    d.mkdir()
    for p in shards:
        shutil.copy(p, d / p.name)
    shutil.copy(other / "o-00002-of-00004.gguf", d / shards[1].name)
    rc, _, err = nextn("run", d / shards[0].name, "-p", "x", cache=tmp_path / "c")
    one_line_error(rc, err, "tiny-00002-of-00003.gguf", "split.count = 4", "expected 1 and 3")

    # the right split.no / split.count but another model's tensors (the trunk-only file split alike)
    trunk = tmp_path / "trunk"
    trunk.mkdir()
    badgguf.copy_gguf(G4 / "tiny-glm4moe-trunk-Q8_0.gguf", trunk / "t.gguf", split_max_tensors=25)   # 74 tensors
    shutil.copy(trunk / "t-00003-of-00003.gguf", d / shards[2].name)
    shutil.copy(shards[1], d / shards[1].name)
    rc, _, err = nextn("run", d / shards[0].name, "-p", "x", cache=tmp_path / "c")
    one_line_error(rc, err, "tiny-00003-of-00003.gguf", "is also in", "another split")

    # a shard with its keys right but tensors missing: split.tensors.count disagrees
    import gguf

    last = [t.name for t in gguf.GGUFReader(shards[2]).tensors]
    badgguf.copy_gguf(shards[2], d / shards[2].name, only=set(last[:-3]))
    rc, _, err = nextn("run", d / shards[0].name, "-p", "x", cache=tmp_path / "c")
    one_line_error(rc, err, "tiny-00001-of-00003.gguf", "'split.tensors.count' = 97", f"hold {97 - 3} tensors")


@pytest.mark.slow
def test_split_name_must_follow_gguf_split(shards, tmp_path):
    renamed = tmp_path / "model.gguf"
    shutil.copy(shards[0], renamed)
    rc, _, err = nextn("run", renamed, "-p", "x", cache=tmp_path / "c")
    one_line_error(rc, err, "model.gguf", "-00001-of-00003.gguf")
