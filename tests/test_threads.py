"""-t/--threads (issue 11 item 8): llama.cpp's flag on run, bench and serve; the default counts physical cores as
llama.cpp does (distinct thread-sibling masks); the value reaches TVM's thread pool in the thread that makes the
kernel calls (TVM's runtime.NumThreads, read there)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import G4

Q8 = G4 / "tiny-glm4moe-Q8_0.gguf"


def _fake_sysfs(root, siblings):
    for cpu, mask in enumerate(siblings):
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings").write_text(mask + "\n")
    return str(root)


def test_physical_cores_count_sibling_masks(tmp_path):
    from nextn.runtime.threads import physical_cores

    smt = _fake_sysfs(tmp_path / "smt", ["11", "22", "11", "22", "44", "44", "88", "88"])   # 8 CPUs, 4 cores
    assert physical_cores(smt, cpus=range(8)) == 4
    assert physical_cores(smt, cpus=[0, 2]) == 1        # two siblings of one core (an affinity mask)
    assert physical_cores(smt, cpus=[0, 1, 4]) == 3
    assert physical_cores(str(tmp_path / "none"), cpus=[0, 1, 2]) == 3   # no sysfs: every CPU counts


def test_resolve(monkeypatch):
    from nextn.common.errors import NextnError
    from nextn.runtime import threads

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 5)
    monkeypatch.setattr(threads, "logical_cpus", lambda: 10)
    assert threads.resolve(None) == 5 and threads.resolve(3) == 3
    assert threads.resolve(0) == 10 and threads.resolve(-1) == 10         # llama.cpp: <= 0 → every logical CPU
    monkeypatch.setenv("TVM_NUM_THREADS", "7")
    assert threads.resolve(None) == 7 and threads.resolve(2) == 2
    with pytest.raises(NextnError, match="-t/--threads"):
        threads.resolve("4")


def _sysfs_cores() -> int:
    """Cores as (package, core id) pairs of the CPUs this process may use (another sysfs count than the code's)."""
    pairs = set()
    for c in os.sched_getaffinity(0):
        t = f"/sys/devices/system/cpu/cpu{c}/topology"
        pairs.add((open(f"{t}/physical_package_id").read(), open(f"{t}/core_id").read()))
    return len(pairs)


@pytest.mark.parametrize("flag,want", [(["-t", "1"], 1), (["--threads", "3"], 3), ([], None)])
def test_run_threads_reach_the_runtime(compiled, flag, want):
    art = compiled("q8", Q8)
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    p = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", art, "-p", "def main():", "-n", "4",
                        "--json", *flag], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["threads"] == (want or _sysfs_cores())


def test_bench_threads_reach_the_runtime(compiled, tmp_path):
    art = compiled("q8", Q8)
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"kind": "code", "text": "def main():"}]))
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "bench", art, "--prompts", prompts, "-n", "2",
                        "--repeat", "1", "--no-plot", "-o", out, "-t", "3", "-c", "256"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["threads"] == 3


def test_serve_threads_reach_the_scheduler_thread(compiled, monkeypatch):
    """The engine calls of a server run in its scheduler thread: that thread's pool has -t workers."""
    from nextn.runtime.server import Running, ServeOptions

    monkeypatch.setenv("TVM_NUM_THREADS", "1")        # restored after the test (the server sets it)
    monkeypatch.setenv("TVM_BIND_THREADS", "0")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = []
    run = Running(ServeOptions(model=compiled("q8", Q8), port=port, ctx_size=256, threads=3),
                  log=logs.append).start_background()
    try:
        assert run.loaded.wait(120) and run.error is None, run.error
        assert run.state.scheduler.threads == 3
        assert any("threads: 3" in m for m in logs), logs
    finally:
        run.stop()


def test_one_threads_option():
    """run, bench and serve take the same -t/--threads option."""
    from nextn.runtime.cli import cli

    for name in ("run", "bench", "serve"):
        opt = next(o for o in cli.commands[name].params if o.name == "threads")
        assert opt.opts == ["-t", "--threads"] and opt.type.name == "integer" and opt.default is None
