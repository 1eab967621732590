"""The real-width benches' guarded runner: each measured process (a bench's own `--worker` child, llama.cpp's tools)
runs watched (/proc) and is killed when its anonymous memory passes the budget or the machine runs short; a file
is measured only when memory holds it. What a child measured comes back as one `RESULT {json}` line."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
import time

from machine_probe import GB, meminfo, proc_mem

RESULT = "RESULT "     # the line a --worker child prints its measurements on

def run_watched(cmd, budget_bytes: float, env=None, timeout: float = 3600.0, log=None) -> dict:
    """Run cmd; kill it when its anonymous memory passes budget_bytes or MemAvailable < 1 GB.
    Returns rc, stdout, stderr, wall_s, peak_rss, peak_anon (sampled), killed (reason or None).
    peak_rss is the child's own VmHWM, sampled every 0.1 s (a high-water mark: only growth in the last 0.1 s can be
    missed); wait4's ru_maxrss (`peak_rss_ru`) is only the fallback for a child gone before the first sample,
    because Linux carries the spawning process's high-water mark over the exec (this script's 0.5 GB bandwidth
    arrays would show up as the child's peak)."""
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in p.stdout], daemon=True)
    reader.start()
    peak_anon, peak_hwm, killed, status, ru = 0, 0, None, None, None
    while True:
        pid, st, r = os.wait4(p.pid, os.WNOHANG)
        if pid:
            status, ru = st, r
            break
        mem = proc_mem(p.pid)
        peak_anon = max(peak_anon, mem.get("RssAnon", 0))
        peak_hwm = max(peak_hwm, mem.get("VmHWM", 0))
        avail = meminfo().get("MemAvailable", 1 << 40)
        if killed is None:
            if mem.get("RssAnon", 0) > budget_bytes:
                killed = f"anonymous memory {mem['RssAnon'] / GB:.1f} GB > budget {budget_bytes / GB:.1f} GB"
            elif avail < 1e9:
                killed = f"machine MemAvailable {avail / GB:.2f} GB < 1 GB"
            elif time.perf_counter() - t0 > timeout:
                killed = f"timeout {timeout:.0f} s"
            if killed:
                if log:
                    log(f"  killing {os.path.basename(cmd[0])}: {killed}")
                p.kill()
        time.sleep(0.1)
    reader.join(5)
    p.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    return {"rc": p.returncode, "stdout": b"".join(lines.queue).decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"), "wall_s": time.perf_counter() - t0,
            "peak_rss": peak_hwm or ru.ru_maxrss * 1024, "peak_rss_ru": ru.ru_maxrss * 1024, "peak_anon": peak_anon,
            "killed": killed}


def failure(res: dict) -> str:
    """One line on why a `run_watched` process failed: the kill reason, or its exit status and last stderr line."""
    if res["killed"]:
        return f"killed: {res['killed']}"
    tail = [x for x in res["stderr"].strip().splitlines() if x.strip()][-1:] or ["(no output)"]
    return f"exit {res['rc']}: {tail[0][:300]}"


def memory_check(size: int, headroom_gb: float, available: int | None = None) -> str | None:
    """Why a file of `size` bytes is not measured now (None: it may be): its pages and `headroom_gb` of working
    memory must fit in MemAvailable (which counts the reclaimable page cache, this file's own pages included)."""
    available = meminfo().get("MemAvailable", 0) if available is None else available
    need = size + headroom_gb * GB
    if available >= need:
        return None
    return (f"needs {size / GB:.1f} GB (file) + {headroom_gb:.1f} GB (--headroom-gb) of memory, MemAvailable is "
            f"{available / GB:.1f} GB")


def skipped_for_memory(entry: dict, headroom_gb: float, log) -> bool:
    """Whether the file of report entry `entry` is not measured now (`memory_check`); if so, entry["skipped"] says
    why and `log` is told."""
    skip = memory_check(entry["size"], headroom_gb)
    if skip:
        log(f"{entry['name']}: skipped: {skip}")
        entry["skipped"] = skip
    return bool(skip)


def warm_page_cache(path: str, chunk: int = 64 << 20) -> float:
    """Read the whole file once so that the run after it finds its pages in the page cache; returns seconds."""
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def over_budget(entry: dict) -> str | None:
    """The status of an earlier nextn round of this file that went over the memory budget, if any."""
    return next((x["nextn"]["status"] for x in entry["rounds"] if x["nextn"]["status"].startswith("killed: anon")),
                None)


def thread_env(threads: int) -> dict:
    """This environment with `threads` for TVM's and OpenMP's pools (what both engines get as `-t`)."""
    return dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))


def run_worker(cmd, budget_bytes: float, env=None, log=None) -> dict:
    """A bench's `--worker` child run by `run_watched`: {"status": "ok", **its RESULT line's JSON, "peak_rss",
    "peak_anon", "wall_s"}, or {"status": `failure`, ...} when it failed or printed no RESULT line."""
    res = run_watched(cmd, budget_bytes, env=env, log=log)
    mem = {"peak_rss": res["peak_rss"], "peak_anon": res["peak_anon"], "wall_s": res["wall_s"]}
    line = next((x for x in reversed(res["stdout"].splitlines()) if x.startswith(RESULT)), None)
    if res["rc"] != 0 or line is None:
        return {"status": failure(res), **mem}
    return {"status": "ok", **json.loads(line[len(RESULT):]), **mem}
