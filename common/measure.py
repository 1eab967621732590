"""Timing one kernel on random inputs, as `nextn tune` does on this machine and `nextn tuning measure` does where
the device is (runtime only), and the files of the offline tuning flow between the two machines:

    DIR/candidates.json   written by `nextn tune --offline DIR` (compiler/tune/offline.py): per workload its
                          hash, IR, argument specs, the default library and each candidate library (file, sha256)
    DIR/results.json      written by `nextn tuning measure DIR` (runtime/measure.py): seconds per library file
"""
from __future__ import annotations

import numpy as np

CANDIDATES = "candidates.json"
RESULTS = "results.json"
# Seconds a tuning candidate may take to build, and to run, in meta_schedule's workers (`nextn tune
# --build-timeout`): meta_schedule's own 30 s fails every candidate on a busy machine.
BUILD_TIMEOUT_S = 600.0


def random_args(specs, dev, seed: int = 0) -> list:
    """Device tensors for `specs` ([{shape, dtype}]): integers in {0, 1} (quant codes, indices stay in range),
    floats ~ N(0, 0.1²)."""
    import tvm

    rng = np.random.default_rng(seed)
    out = []
    for a in specs:
        arr = (rng.integers(0, 2, a["shape"]) if a["dtype"].startswith("int") else
               rng.standard_normal(a["shape"]) * 0.1).astype(a["dtype"])
        out.append(tvm.runtime.tensor(arr, dev))
    return out


def time_main(mod, args, dev, number: int = 20) -> float:
    """Seconds per call of `mod["main"](*args)`: the best of 3 repeats of `number` calls (TVM's time_evaluator,
    which synchronises the device around each repeat)."""
    fe = mod.time_evaluator("main", dev, number=number, repeat=3)
    return float(min(fe(*args).results))


def cpu_flags() -> set[str] | None:
    """The first CPU's `flags` of /proc/cpuinfo (what the kernel reports the CPU can run: a VM's masked features are
    absent), or None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows: recorded with each tuning record."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def copy_bandwidth(dev, nbytes: int, reps: int = 10) -> float:
    """Copy bandwidth of device `dev` (a TVM device) in bytes/s: one `nbytes` buffer copied into another, bytes read
    plus bytes written (2 × nbytes per copy), best of `reps` after one untimed copy. The HBM floor's denominator
    (bench/device_check.py) and the GEMV benches' reference (bench/quant_gemv.py)."""
    import time

    import tvm

    a = tvm.runtime.empty((nbytes,), "uint8", dev)
    b = tvm.runtime.empty((nbytes,), "uint8", dev)
    b.copyfrom(a)
    dev.sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        b.copyfrom(a)
        dev.sync()
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best
