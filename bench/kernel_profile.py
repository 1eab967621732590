"""Where a decode step, a verify of T rows, a draft step and a prefill spend their time, per compiled kernel:
the Relax VM's instrument (tvm.runtime.vm.VirtualMachine.set_instrument) times every call of every kernel of an
entry point, steady state (two untimed calls first), the calls of one step summed per kernel symbol.

    TVM_NUM_THREADS=2 python bench/kernel_profile.py F.gguf [--verify 1,4] [--prefill 512] [--draft] [--pos P]
                                                      [--repeat 5] [--top 25] [--json out.json]

One table: a column per step (ms per step, the best of --repeat steps for each kernel with its calls in the
step summed, and the count where it runs more than once, once per layer say; the instrument's own cost, a
Python call per kernel call, is in "(step total)" only), then the ratio of the last verify step to the first
step (to the last step where there is one verify): the kernels that make a verify of 4 rows cost more than one
decode (issue 12) come first. `routed_experts`: the distinct experts a step's routed-expert kernels read.
Kernels are shown by family (`kernel_key`: the one-row entries' `_rows1` matmuls and the verify's `_rowst` ones
are one family, the numbers Relax appends to fused ops dropped), their calls summed, so a decode and a verify
compare kernel by kernel. Random token ids; the GGUF is compiled and cached as `nextn run` does (nextn.runtime.load).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import numpy as np


@contextmanager
def instrumented(seq, instrument):
    """The Relax VM of `seq` calls instrument(func, symbol, before, ret, *args) around every call inside the
    block (it returns 0: VMInstrumentReturnKind.NO_OP), and no instrument after it."""
    seq.model.vm.set_instrument(instrument)
    try:
        yield
    finally:
        seq.model.vm.set_instrument(None)


def profile(seq, call, repeat: int, calls: dict | None = None) -> dict:
    """{kernel symbol: best ms per call of `call`, its calls summed} and "(step total)" (the whole call with the
    instrument on). `calls`: filled with {kernel symbol: calls per step} (a kernel runs once per layer, say)."""
    best: dict = defaultdict(lambda: float("inf"))
    open_at: dict = {}
    count: dict = defaultdict(int)

    def instrument(_func, symbol, before, _ret, *_args):
        if before:
            open_at[symbol] = time.perf_counter()
        else:
            step[symbol] += time.perf_counter() - open_at.pop(symbol)
            count[symbol] += 1
        return 0

    for _ in range(2):
        call()
    with instrumented(seq, instrument):
        for _ in range(repeat):
            step = defaultdict(float)
            t = time.perf_counter()
            call()
            step["(step total)"] = time.perf_counter() - t
            for k, v in step.items():
                best[k] = min(best[k], v * 1e3)
    if calls is not None:
        calls.update({k: v // repeat for k, v in count.items()})
    return dict(best)


def kernel_key(symbol: str) -> str:
    """A kernel's family: its symbol without what differs between the decode and the verify entries, the row-count
    suffix of the x86 matmuls (`_rows1` / `_rowst`) and the numbers Relax appends to fused ops
    (fused_rms_norm3_mul4 -> fused_rms_norm_mul); the shape fields of matmul and attention kernels (n4096, k4096,
    h8_2, ...) are kept. The decode's and a verify's kernels are compared family by family."""
    s = re.sub(r"_rows(1|t)(?=_|$)", "_rows", symbol)
    if s.startswith(("x86_matmul", "flash_attn", "set_rows", "vm.", "(")):
        return s
    return "_".join(re.sub(r"(?<=[a-z])\d+$", "", part) for part in s.split("_"))


def by_family(ms: dict, calls: dict | None = None) -> tuple[dict, dict]:
    """`profile`'s {symbol: ms} (and {symbol: calls}) summed per `kernel_key` family."""
    out, n = defaultdict(float), defaultdict(int)
    for s, v in ms.items():
        out[kernel_key(s)] += v
    for s, c in (calls or {}).items():
        n[kernel_key(s)] += c
    return dict(out), dict(n)


def routed_experts(seq, call) -> dict | None:
    """How many experts one `call` reads per routed-expert kernel call: {"distinct": mean over the calls of the
    distinct expert ids, "routed": rows x n_expert_used, "calls": the calls seen}; None with no routed experts.
    The ids are the last int32 2-D argument, [T, n_used], of each call whose symbol names matmul_id (gate+up
    and down of each MoE layer: one layer's pair counts twice, alike). A verify of k+1 rows reads each distinct
    expert once (matmul_id), so its expert bytes follow "distinct", not "routed"."""
    seen = []

    def instrument(_func, symbol, before, _ret, *args):
        if before and "matmul_id" in symbol:
            ids = [a for a in args if getattr(a, "dtype", None) is not None and str(a.dtype) == "int32"
                   and len(a.shape) == 2]
            if ids:     # the last such: an integer-path kernel's activation lane offsets (xc) come before it
                seen.append(ids[-1].numpy())
        return 0

    with instrumented(seq, instrument):
        call()
    if not seen:
        return None
    return {"distinct": float(np.mean([len(np.unique(i)) for i in seen])), "routed": int(seen[0].size),
            "calls": len(seen)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf")
    p.add_argument("--verify", default="1,4", help="row counts of the verify steps (1: the decode entry)")
    p.add_argument("--prefill", type=int, default=0, help="also a prefill of this many rows (last row's output)")
    p.add_argument("--draft", action="store_true", help="also one draft step (mtp_draft, one row)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--ctx", type=int, default=1024, help="context cells (raised to --pos + the rows it needs)")
    p.add_argument("--pos", type=int, default=8,
                   help="position of every step: the steps attend over the --pos cells before them (at depth: the "
                        "cells hold what the cache holds, the kernels' work does not depend on it) [default: 8]")
    p.add_argument("--json")
    a = p.parse_args(argv)
    import nextn.runtime as rt

    rows = max([a.prefill, 8] + [int(x) for x in a.verify.split(",")])
    m = rt.load(a.gguf, ctx_size=max(a.ctx, a.pos + rows + 16), log=lambda s: print(s, file=sys.stderr))
    seq = m.sequence
    seq.model.wait_populated()
    rng = np.random.default_rng(0)
    V = int(seq.model.hparams["n_vocab"])
    toks = rng.integers(0, V, max(a.prefill, 16)).astype(np.int32)
    hidden, _lg, am = seq.prefill(toks[:8], 0)
    P = max(a.pos, 8)
    steps = {f"verify {T}": (lambda T=T: seq.verify(toks[:T], P)) for T in map(int, a.verify.split(","))}
    if a.draft and seq.model.has_mtp:
        steps["draft"] = lambda: seq.mtp_draft([am], hidden[-1:], P)
    if a.prefill:
        steps[f"prefill {a.prefill}"] = lambda: seq.prefill(toks[:a.prefill], P if a.pos > 8 else 0, last_only=True)
    counts: dict = {}
    cols = {name: profile(seq, f, a.repeat, counts.setdefault(name, {})) for name, f in steps.items()}
    for name in cols:       # the decode's `_rows1` kernels against the verify's `_rowst` ones: by family
        cols[name], counts[name] = by_family(cols[name], counts[name])
    names = list(cols)
    verifies = [n for n in names if n.startswith("verify")]
    base, other = names[0], (verifies[-1] if len(verifies) > 1 else names[-1])
    first, last = cols[base], cols[other]
    syms = sorted({s for c in cols.values() for s in c}, key=lambda s: -(last.get(s, 0) - first.get(s, 0)))
    syms = ["(step total)"] + [s for s in syms if s != "(step total)"]
    ratio_head = f" | {other} ÷ {base}" if len(names) > 1 else ""
    print("| kernel | " + " | ".join(f"{n} ms" for n in names) + ratio_head + " |")
    print("|---" * (len(names) + 1 + (len(names) > 1)) + "|")
    for s in syms[:a.top + 1]:
        vals = [c.get(s) for c in cols.values()]
        ratio = (f" | {last[s] / first[s]:.2f}" if s in first and s in last and first[s] > 0 else " | –") \
            if len(names) > 1 else ""
        n = [counts[name].get(s) for name in names]
        print(f"| {s} | " + " | ".join("–" if v is None else f"{v:.2f}" + (f" ({c}×)" if c and c > 1 else "")
                                        for v, c in zip(vals, n)) + ratio + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ms": cols, "calls": counts}, f, indent=1)


if __name__ == "__main__":
    main()
