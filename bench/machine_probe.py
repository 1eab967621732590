"""The machine a real-width bench runs on: its read bandwidth (the tables' denominator), CPU, memory (/proc), and
which nextn checkout is measured. Linux only (/proc)."""
from __future__ import annotations

import os
import platform
import subprocess
import time

import numpy as np

from nextn.runtime.threads import physical_cores

HERE = os.path.dirname(os.path.abspath(__file__))
GB = 1e9

def stream_bandwidth(threads: int, read_mb: int = 512, copy_mb: int = 256, reps: int = 5) -> dict:
    """GB/s of a multi-threaded read (sum) and of a single-threaded copy (read + write bytes), best of `reps`."""
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(read_mb * (1 << 20) // 4, np.float32)
    parts = np.array_split(a, threads)
    best_read = 0.0
    with ThreadPoolExecutor(threads) as ex:
        for _ in range(reps):
            t = time.perf_counter()
            list(ex.map(np.sum, parts))
            best_read = max(best_read, a.nbytes / (time.perf_counter() - t))
    del a, parts
    src = np.ones(copy_mb * (1 << 20) // 4, np.float32)
    dst = np.empty_like(src)
    best_copy = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        best_copy = max(best_copy, 2 * src.nbytes / (time.perf_counter() - t))
    return {"read_GBps": best_read / GB, "copy_GBps": best_copy / GB, "threads": threads}


def machine() -> dict:
    from nextn.common.measure import cpu_name

    mem = meminfo()
    return {"cpu": cpu_name(), "physical_cores": physical_cores(), "logical_cpus": os.cpu_count(),
            "cpu_flags": simd_flags(), "mem_total_GB": mem.get("MemTotal", 0) / GB, "loadavg": os.getloadavg(),
            "host": platform.node(), "nextn_commit": nextn_commit()}


def simd_flags() -> list[str]:
    """The SIMD flags that decide which kernels both engines can use (/proc/cpuinfo)."""
    want = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16")
    from nextn.common.measure import cpu_flags

    have = cpu_flags() or set()
    return [x for x in want if x in have]


def nextn_commit() -> str | None:
    """`git describe` of the checkout this script runs from (which nextn was measured)."""
    try:
        r = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True, text=True,
                           timeout=30)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    return out


def proc_mem(pid: int) -> dict:
    """VmRSS / RssAnon / VmHWM bytes of a process (empty when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out
