"""The package builds as a wheel holding every module of common/, compiler/, runtime/, schedules/ under `nextn.`."""
import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_contains_every_module(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("nextn-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"nextn/{p.relative_to(REPO).as_posix()}" for top in ("common", "compiler", "runtime", "schedules")
            for p in (REPO / top).rglob("*.py")}
    assert want <= names, sorted(want - names)
    assert any(n.endswith("entry_points.txt") for n in names)
    ep = next(n for n in names if n.endswith("entry_points.txt"))
    assert "nextn = nextn.runtime.cli:main" in zipfile.ZipFile(wheel).read(ep).decode()
