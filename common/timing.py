"""Timing helpers: decode speed, the share of decode time spent outside compiled code, a wall-clock timer."""
from __future__ import annotations

import time


def tokens_per_s(n_tokens: int, seconds: float) -> float:
    """Tokens per second of a decode phase; 0 for a phase that took no time."""
    return n_tokens / seconds if seconds > 0 else 0.0


def python_share(vm_s: dict, seconds: float) -> float:
    """Share of `seconds` (a decode phase) spent outside the compiled entry points, whose seconds are the values
    of `vm_s`: the Python loop, argument conversion, host copies. In [0, 1]; 0 for a phase that took no time."""
    return max(0.0, 1.0 - sum(vm_s.values()) / seconds) if seconds > 0 else 0.0


def time_call(f, reps: int = 1) -> float:
    """Min wall seconds of `reps` calls of f() (the call must finish its device work before it returns)."""
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return min(ts)


def round_robin(calls: dict, rounds: int) -> dict:
    """{key: [wall seconds of each round]} of `rounds` rounds, each calling every f of `calls` ({key: f}) once, in
    order: interleaved, so that a burst of load on a shared machine hits every call alike (each call must finish
    its device work before it returns)."""
    out = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            out[k].append(time_call(f))
    return out
