"""Hostile GGUFs (issue 11 item 9): 520 seeded mutations of a fixture (tests/hostile.py: truncation, magic,
version, counts, string and array lengths, value and tensor types, shapes, offsets, alignment, huge values, byte
flips) each end in a NextnError of one line naming the file, or a clean load: no other exception, no case over
10 s, no allocation above 1 GB (the worker runs under RLIMIT_AS = its size + 1 GB), nothing written to the cache.
A few go through the CLI (one line on stderr, no traceback, no cache entry), and one mutant that stays valid
compiles and runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import badgguf
from conftest import G4

pytestmark = pytest.mark.slow   # hostile GGUFs through the CLI (a compile each)

SRC = G4 / "tiny-glm4moe-Q4_K_M.gguf"     # Q4_K, Q6_K, Q5_0/Q8_0 and F32 tensors
WORKER = Path(__file__).with_name("hostile.py")
N_CASES = 520


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """The fixture with an explicit `general.alignment` = 32 (u32, its default): a key the mutations can hit."""
    import gguf

    return badgguf.copy_gguf(SRC, tmp_path_factory.mktemp("src") / "aligned.gguf",
                             {"general.alignment": (32, gguf.GGUFValueType.UINT32)})


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, src):
    d = tmp_path_factory.mktemp("hostile")
    cache = d / "cache"
    env = {**os.environ, "NEXTN_CACHE": str(cache)}
    cmd = [sys.executable, str(WORKER), str(src), "11", str(N_CASES), str(d)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        out, rc, err = r.stdout, r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:      # a hang in C code that SIGALRM could not interrupt
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, err = "timeout after 300 s", ""
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    rows = [x for x in lines if "case" in x]
    assert rc == 0, f"worker {rc} after case {rows[-1]['label'] if rows else None}: {err[-2000:]}"
    cap = lines[0]
    assert cap["capped"] and cap["cap_bytes"] - cap["held_bytes"] == 1 << 30, cap
    return rows, cache


def test_every_mutation_is_one_line_error_or_clean(outcomes):
    rows, cache = outcomes
    assert len(rows) >= 500
    for r in rows:
        assert r["outcome"] in ("ok", "error"), (r["label"], r["message"])
        assert r["seconds"] < 10, (r["label"], r["seconds"])
        if r["outcome"] == "error":
            msg = r["message"]
            assert "\n" not in msg and len(msg) < 600 and msg.startswith(r["path"] + ":"), (r["label"], msg)
    errors = [r for r in rows if r["outcome"] == "error"]
    assert len(errors) > 0.8 * len(rows)           # most mutations are refused at parse time
    assert any(r["outcome"] == "ok" for r in rows if r["label"].startswith("data byte"))
    align = [r for r in rows if r["label"].startswith("general.alignment")]
    pow2 = {str(1 << i) for i in range(32)}
    assert len(align) >= 10 and all(r["outcome"] == "error" for r in align if r["label"].split()[-1] not in pow2)
    assert any(r["outcome"] == "error" for r in align if r["label"].split()[-1] in pow2 - {"32"})
    assert not cache.exists() or not any(cache.rglob("*"))


def _cli(*args, cache):
    env = {**os.environ, "NEXTN_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "nextn.runtime.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def test_cli_refusals_and_one_valid_mutant(outcomes, src, tmp_path):
    import hostile

    rows, _ = outcomes
    cache = tmp_path / "cache"
    data = src.read_bytes()
    edits = dict(hostile.cases(str(src), 11, N_CASES))
    # one refused case of each kind of mutation, through `nextn run` (compile-and-cache) and `nextn compile`
    seen, picked = set(), []
    for r in rows:
        kind = r["label"].split(" ")[0]
        if r["outcome"] == "error" and kind not in seen:
            seen.add(kind)
            picked.append(r)
    assert len(picked) >= 8
    for i, r in enumerate(picked[:8]):
        f = tmp_path / f"bad{i}.gguf"
        f.write_bytes(hostile.apply(data, edits[r["label"]]))
        p = _cli("run", f, "-p", "x", "-n", "1", cache=cache) if i % 2 else _cli("compile", f, "-o", tmp_path / "o",
                                                                                    cache=cache)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and "Traceback" not in p.stderr and len(lines) == 1, (r["label"], p.stderr)
        assert str(f) in lines[0]
    assert not (cache / "artifacts").exists() and not (tmp_path / "o" / "manifest.json").exists()

    # a header mutation that leaves the file valid compiles and runs (one compile)
    ok = next(r for r in rows if r["outcome"] == "ok" and r["label"].startswith("glm4moe.expert_weights_scale"))
    f = tmp_path / "valid.gguf"
    f.write_bytes(hostile.apply(data, edits[ok["label"]]))
    p = _cli("run", f, "-p", "def main():", "-n", "4", "--json", cache=cache)
    assert p.returncode == 0, (ok["label"], p.stderr)
    assert len(json.loads(p.stdout)["tokens"]) == 4


def test_alignment_values(tmp_path):
    """general.alignment other than a u32 power of two is refused; a valid other alignment loads."""
    import gguf

    from nextn.common.errors import NextnError
    from nextn.common.gguf import GGUFFile

    V = gguf.GGUFValueType
    good = badgguf.copy_gguf(SRC, tmp_path / "a64.gguf", {"general.alignment": (64, V.UINT32)})
    f = GGUFFile(good)
    assert f.shards[0].header.alignment == 64 and all(t.data_offset % 64 == 0 for t in f.tensors.values())
    for value, vtype, why in [(0, V.UINT32, "power of two"), (48, V.UINT32, "power of two"),
                              (64, V.UINT64, r"expected 4 \(u32\)")]:
        bad = tmp_path / f"a{value}-{vtype.name}.gguf"
        data = bytearray(good.read_bytes())
        key = b"general.alignment"
        i = data.find(key) + len(key)
        assert int.from_bytes(data[i:i + 4], "little") == V.UINT32
        if vtype == V.UINT32:
            data[i + 4:i + 8] = value.to_bytes(4, "little")
        else:
            data[i:i + 4] = int(V.UINT64).to_bytes(4, "little")   # the u32 64 followed by the next key's bytes
        bad.write_bytes(bytes(data))
        with pytest.raises(NextnError, match=why) as e:
            GGUFFile(bad)
        assert str(bad) in str(e.value)
