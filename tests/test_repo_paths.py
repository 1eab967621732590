"""The repository names no folder of the machine it was built on (a user has none), and the real-width files'
folder and lock come from bench/realwidth_files.py's environment-or-cache defaults."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_no_absolute_path_of_this_checkout_in_tracked_files():
    r = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"git ls-files failed: {r.stderr}")
    parent = str(REPO.parent) + "/"     # e.g. the folder holding the checkout and shared/
    hits = []
    for rel in r.stdout.split():
        p = REPO / rel
        if p.suffix in (".gguf", ".npz", ".png") or not p.is_file():
            continue
        text = p.read_text(errors="replace")
        hits += [f"{rel}:{i}" for i, line in enumerate(text.splitlines(), 1) if parent in line]
    assert not hits, f"tracked files name {parent}: {hits[:10]}"


def test_realwidth_files_defaults(monkeypatch, tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    import realwidth_files as rf

    monkeypatch.delenv("NEXTN_REALWIDTH", raising=False)
    monkeypatch.delenv("NEXTN_HEAVY_LOCK", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert rf.realwidth_dir() == str(tmp_path / ".cache" / "nextn-realwidth")
    assert rf.heavy_lock() == str(tmp_path / ".cache" / "nextn-realwidth" / "heavy.lock")
    monkeypatch.setenv("NEXTN_REALWIDTH", str(tmp_path / "rw"))
    assert rf.path_of("glm45air-4-a0.1") == str(tmp_path / "rw" / "glm45air-4-a0.1.gguf")
    assert rf.recipe("glm45air-4-a0.1") == "synth_realwidth.py glm45air glm45air-4-a0.1.gguf 4 --mtp-mix 0.1"
    assert set(rf.SETS["speed"]) == {"glm45air-1", "glm45air-1-IQ4_XS", "glm45air-1-Q8_0", "glm45air-3", "glm52-1"}
    assert len(rf.SETS["spec"]) == 6 * 3     # glm45air 1/4/8 and glm52 1/2/3 MoE layers, ALPHA 0 / 0.1 / 0.2
    assert rf.recipe("glm52-2-a0.1") == "synth_realwidth.py glm52 glm52-2-a0.1.gguf 2 --mtp-mix 0.1"
    with pytest.raises(SystemExit, match="unknown file 'nope'"):
        rf.make("nope")
