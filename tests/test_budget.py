"""Memory budget (issue 11 item 6): before allocating, weights + KV + workspace against the available memory; when
it does not fit, one line with the bytes needed and available and a context that would fit. Expected KV bytes
are counted here from the hyper-parameters (layers x K and V x kv heads x head dim x 4 bytes per cell), not from
the code under test; "available" is faked small."""
import subprocess
import sys

import pytest

from conftest import G4

Q8 = G4 / "tiny-glm4moe-Q8_0.gguf"


@pytest.fixture(scope="module")
def art(compiled):
    return compiled("q8", Q8)


def _hp(art):
    import json
    import os

    with open(os.path.join(art, "manifest.json")) as f:
        return json.load(f)


def _kv_per_cell(m, row_bytes=lambda d: 4 * d) -> int:
    """K and V rows of every layer (NextN included) for one cell; `row_bytes(D)`: a head row's bytes (f32: 4 D)."""
    h = m["hparams"]
    layers = h["n_layer"] + (h["n_layer_nextn"] if m["has_mtp"] else 0)
    return layers * 2 * h["n_head_kv"] * row_bytes(h["head_dim"])


def _held(art) -> int:
    """Weight bytes a loaded engine holds outside the GGUF's map (measured: buffer addresses against the map's)."""
    import numpy as np

    import nextn.runtime as rt

    eng = rt.load(art, ctx_size=256).loaded
    m = np.frombuffer(eng.files.main.shards[0].buf, np.uint8)
    lo, hi = m.ctypes.data, m.ctypes.data + m.nbytes
    size = {b["buffer"]: b["nbytes"] for b in eng._plan}
    return sum(size[n] for n, t in eng._weights.items() if not lo <= np.from_dlpack(t).ctypes.data < hi)


def _fake(monkeypatch, avail):
    from nextn.runtime import budget

    monkeypatch.setattr(budget, "available", lambda device: (avail, 64 << 30, "fake MemAvailable"))


def test_too_small_says_needed_available_and_what_fits(art, monkeypatch):
    import nextn.runtime as rt
    from nextn.common.errors import NextnError
    from nextn.runtime.budget import CTX_STEP, workspace_bytes
    from nextn.runtime.sequence import PREFILL_CHUNK

    m = _hp(art)
    per_cell = _kv_per_cell(m)
    fixed = _held(art) + workspace_bytes(m["hparams"], PREFILL_CHUNK)
    avail = fixed + 3000 * per_cell + 17                        # room for 3000 cells: -c 2816 (a multiple of 256)
    _fake(monkeypatch, avail)
    with pytest.raises(NextnError) as e:
        rt.load(art, ctx_size=4096)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(art)
    mapped = m["buffer_plan"]["weight_bytes"] - _held(art)
    assert (f"mapped weights {mapped / (1 << 30):.2f} GiB are file pages, not counted" in msg) == (mapped > 0)
    assert f"needs {fixed + 4096 * per_cell} bytes" in msg and f"{avail} bytes" in msg and "fake MemAvailable" in msg
    fit = 3000 - 3000 % CTX_STEP
    assert f"-c {fit} would fit" in msg
    rt.load(art, ctx_size=fit)                                  # it does
    with pytest.raises(NextnError, match="would fit"):
        rt.load(art, ctx_size=3001)


def test_nothing_fits(art, monkeypatch):
    import nextn.runtime as rt
    from nextn.common.errors import NextnError

    _fake(monkeypatch, 1000)
    with pytest.raises(NextnError, match="nothing fits"):
        rt.load(art, ctx_size=256)


def test_a_server_slot_is_counted_before_it_is_allocated(art, monkeypatch):
    import nextn.runtime as rt
    from nextn.common.errors import NextnError

    m = rt.load(art, ctx_size=512)
    m.sequence                                                   # the first: counted in the load's budget
    _fake(monkeypatch, 511 * _kv_per_cell(_hp(art)))            # one cell short of another 512-cell slot
    with pytest.raises(NextnError, match="another sequence's KV") as e:
        m.loaded.new_sequence()
    assert "-c 256 would fit" in str(e.value)
    _fake(monkeypatch, 512 * _kv_per_cell(_hp(art)))
    m.loaded.new_sequence()


def test_cli_huge_context_is_one_line(art):
    """No fake: a context of 10^9 cells needs TBs of KV; the real check refuses it before any allocation."""
    p = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", art, "-p", "x", "-n", "1", "-c",
                        "1000000000"], capture_output=True, text=True, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    per_cell = _kv_per_cell(_hp(art))
    assert "would fit" in lines[0] and "available (MemAvailable" in lines[0]
    assert f"KV (f32/f32) {10**9 * per_cell / (1 << 30):.2f} GiB" in lines[0]


def test_meminfo(tmp_path):
    from nextn.runtime.budget import _meminfo

    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24684084 kB\nMemFree:  100 kB\nMemAvailable:   21346812 kB\nHugePages_Total: 0\n")
    mi = _meminfo(str(f))
    assert mi["MemTotal"] == 24684084 * 1024 and mi["MemAvailable"] == 21346812 * 1024 and mi["HugePages_Total"] == 0


def test_budget_counts_what_is_allocated(art):
    """The budget's KV bytes (the manifest's per-token accounting) are the bytes the engine then allocates."""
    import nextn.runtime as rt

    m = rt.load(art, ctx_size=777)
    assert m.loaded.budget.kv == m.sequence.kv_bytes == 777 * _kv_per_cell(_hp(art))
    m = rt.load(art, ctx_size=300, spec=False)                  # NextN caches not allocated, not counted
    h = _hp(art)["hparams"]
    assert m.loaded.budget.kv == m.sequence.kv_bytes == 300 * h["n_layer"] * 2 * h["n_head_kv"] * h["head_dim"] * 4


def test_a_smaller_kv_type_that_fits(compiled, monkeypatch):
    """An f16 artifact where f16 KV does not fit at -c 4096 but q8_0 (34 bytes per 32 values) does: the line names
    -ctk q8_0 -ctv q8_0 and the -c that f16 allows."""
    import nextn.runtime as rt
    from nextn.common.errors import NextnError
    from nextn.runtime.budget import CTX_STEP, workspace_bytes
    from nextn.runtime.sequence import PREFILL_CHUNK

    art = compiled("q8-kv-f16", Q8, kv="f16")
    m = _hp(art)
    f16, q8 = _kv_per_cell(m, lambda d: 2 * d), _kv_per_cell(m, lambda d: d // 32 * 34)
    fixed = _held(art) + workspace_bytes(m["hparams"], PREFILL_CHUNK)
    _fake(monkeypatch, fixed + 4096 * q8)
    with pytest.raises(NextnError) as e:
        rt.load(art, ctx_size=4096)
    msg = str(e.value)
    c = 4096 * q8 // f16
    assert "KV (f16/f16)" in msg and f"-c {c - c % CTX_STEP} would fit" in msg
    assert f"-ctk q8_0 -ctv q8_0 at -c 4096 would fit ({4096 * q8 / (1 << 30):.2f} GiB of KV)" in msg
    _fake(monkeypatch, fixed + 4096 * q8 - 1)                   # one byte short: q8_0 no longer fits either
    with pytest.raises(NextnError) as e:
        rt.load(art, ctx_size=4096)
    assert "-ctk" not in str(e.value)


def test_gpu_workspace_counts_the_cuda_graph_storage(art, monkeypatch):
    """On a GPU every weight is in device memory, and the storage the artifact's CUDA graphs allocate once (the
    manifest's cuda_graph.static_bytes) comes on top of a prefill chunk's workspace."""
    from types import SimpleNamespace

    from nextn.runtime import budget
    from nextn.runtime.budget import workspace_bytes

    hp = _hp(art)["hparams"]
    monkeypatch.setattr(budget, "kv_bytes", lambda model, n_ctx: 1000 * n_ctx)
    gpu = SimpleNamespace(device=SimpleNamespace(kind="cuda"), weight_bytes=12345, hparams=hp, prefill_chunk=64,
                          graph_bytes=987654)
    n = budget.need(gpu, 256)
    assert (n.weights, n.weights_mapped, n.kv) == (12345, 0, 256000)
    assert n.workspace == workspace_bytes(hp, 64) + 987654
    assert budget.need(gpu, 256, weights=False).workspace == 0   # another sequence: its KV only
