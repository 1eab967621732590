"""Per-kernel time of the x86 matmul kernels that a model's verify / prefill entries run (symbolic row count) at
GLM-4.5-Air widths, for R activation rows: steady state (one untimed call, then the best of --repeat passes over
enough weight copies to come from memory), with GMAC/s and the ratio to one row. Random weights (quant_gemv's
random_raw); the routed gate + up experts give each row 8 distinct experts of 128, as distinct draft tokens route.

    TVM_NUM_THREADS=1 python bench/x86_rows.py [--rows 1,2,3,4,8] [--cases lm_head,ffn_up,...] [--repeat 5]
                                               [--tile N] [--group R] [--w-rows W] [--prefetch-level L]
                                               [--prefetch-kb KB] [--fit-kb KB] [--width 32 --no-vnni] [--mcpu CPU]
                                               [--against REV | --against-fit-kb KB]

Knobs: each implementation's default for the kernel (`default_knobs`, as compile picks them), then the flags.

The *_l3 cases (4096 x 4096, 9-18 MB) with `--stream-mb 1` stay in the 32 MB L3: the kernel's arithmetic rate
per thread, which bounds a decode step where memory is faster (TVM_NUM_THREADS=1).

"matmul_id_slots": the routed down experts (one activation row per (row, slot), one weight).

--against REV: the same kernels as built by git revision REV's compiler/lower/x86 (imported from a copy in a
temporary folder), timed in turn with this tree's in each pass, and the ratio REV / this tree. A noisy VM's speed
drifts by 1.5x between runs minutes apart; in one interleaved run both kernels see the same drift.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from quant_gemv import random_raw

CASES = {   # name: (GGUF type, op, N, K, experts)
    "lm_head": ("Q6_K", "matmul", 151552, 4096, 0),
    "q6k_l3": ("Q6_K", "matmul", 4096, 4096, 0),      # 13 MB: in L3 with --stream-mb 1 (the kernel's compute rate)
    "q4k_l3": ("Q4_K", "matmul", 4096, 4096, 0),
    "q5k_l3": ("Q5_K", "matmul", 4096, 4096, 0),
    "q8_0_l3": ("Q8_0", "matmul", 4096, 4096, 0),
    "iq4xs_l3": ("IQ4_XS", "matmul", 4096, 4096, 0),
    "iq4nl_l3": ("IQ4_NL", "matmul", 4096, 4096, 0),
    "exps_down_l3": ("Q8_0", "matmul_id_slots", 1024, 1408, 8),  # 8 experts of 1024 x 1408: 12 MB, the L3 rate
    "q8_0_k1408_l3": ("Q8_0", "matmul", 8192, 1408, 0),   # the down experts' row length, dense: 12 MB
    "q8_0_k1408": ("Q8_0", "matmul", 32768, 1408, 0),     # as many bytes as 8 down experts, one weight
    "ffn_up": ("Q4_K", "matmul", 10944, 4096, 0),
    "attn_q": ("Q4_K", "matmul", 12288, 4096, 0),
    "attn_o": ("Q4_K", "matmul", 4096, 12288, 0),
    "exps_gate_up": ("Q4_K", "matmul_id", 1408, 4096, 128),
    "ffn_down": ("Q8_0", "matmul", 4096, 10944, 0),
    "exps_down": ("Q8_0", "matmul_id_slots", 4096, 1408, 128),
    # glm45air-1-IQ4_XS.gguf (llama-quantize IQ4_XS: IQ4_NL where a row of 1408 does not fit 256-blocks)
    "iq4xs_attn_q": ("IQ4_XS", "matmul", 12288, 4096, 0),
    "iq4xs_attn_o": ("IQ4_XS", "matmul", 4096, 12288, 0),
    "iq4xs_ffn_up": ("IQ4_XS", "matmul", 10944, 4096, 0),
    "iq4xs_exps_gate_up": ("IQ4_XS", "matmul_id", 1408, 4096, 128),
    "iq4nl_ffn_down": ("IQ4_NL", "matmul", 4096, 10944, 0),
    "iq4nl_exps_down": ("IQ4_NL", "matmul_id_slots", 4096, 1408, 128),
    # synth_realwidth.py --expert-type T: the routed gate / up experts in a codebook format (the down experts' rows
    # of 1408 are not 256-blocks: Q8_0), and one dense 4096 x 4096 in L3 (the decode arithmetic rate)
    "iq2xxs_exps_gate_up": ("IQ2_XXS", "matmul_id", 1408, 4096, 128),
    "iq1s_exps_gate_up": ("IQ1_S", "matmul_id", 1408, 4096, 128),
    "iq3xxs_exps_gate_up": ("IQ3_XXS", "matmul_id", 1408, 4096, 128),
    "iq2xs_exps_gate_up": ("IQ2_XS", "matmul_id", 1408, 4096, 128),
    "iq2s_exps_gate_up": ("IQ2_S", "matmul_id", 1408, 4096, 128),
    "iq3s_exps_gate_up": ("IQ3_S", "matmul_id", 1408, 4096, 128),
    "iq1m_exps_gate_up": ("IQ1_M", "matmul_id", 1408, 4096, 128),
    "iq2xxs_l3": ("IQ2_XXS", "matmul", 4096, 4096, 0),
}


def x86_at(rev: str):
    """The package compiler/lower/x86 as it is at git revision `rev` (copied to a temporary folder, imported as
    x86_at_rev; its absolute imports are this tree's)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = ["git", "-C", root]
    d = os.path.join(tempfile.mkdtemp(prefix="x86_rows_"), "x86_at_rev")
    os.makedirs(d)
    for f in subprocess.check_output(git + ["ls-tree", "--name-only", rev, "compiler/lower/x86/"], text=True).split():
        with open(os.path.join(d, os.path.basename(f)), "w") as out:
            out.write(subprocess.check_output(git + ["show", f"{rev}:{f}"], text=True))
    sys.path.insert(0, os.path.dirname(d))
    return importlib.import_module("x86_at_rev")


def main():
    import tvm

    from nextn.common.quant import by_ggml_type
    from nextn.compiler.lower import x86
    from nextn.compiler.target import make_target

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,3,4")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stream-mb", type=int, default=160, help="weight copies cycled per timing (MB)")
    ap.add_argument("--tile", type=int, default=None, help="Knobs.tile_n (default: the compiler's)")
    ap.add_argument("--group", type=int, default=None, help="Knobs.row_group")
    ap.add_argument("--w-rows", type=int, default=None, help="Knobs.w_rows")
    ap.add_argument("--prefetch-level", type=int, default=None, choices=(1, 2), help="Knobs.prefetch_level")
    ap.add_argument("--prefetch-kb", type=int, default=None, help="Knobs.prefetch_kb (0: no prefetch)")
    ap.add_argument("--width", type=int, default=None, choices=(32, 64),
                    help="vector bytes (default: this CPU's widest); 32 on an AVX-512 CPU stands in for AVX2")
    ap.add_argument("--no-vnni", action="store_true", help="the kernels of a CPU without VNNI")
    ap.add_argument("--mcpu", help="build for this LLVM CPU instead of the host (e.g. znver2: AVX2 only, what "
                                   "an AVX2 machine's compile emits; it must run on this one)")
    ap.add_argument("--fit-kb", type=int, default=None, help="Knobs.fit_kb")
    versus = ap.add_mutually_exclusive_group()
    versus.add_argument("--against", metavar="REV", help="also time git revision REV's kernels, interleaved")
    versus.add_argument("--against-fit-kb", type=int, metavar="KB",
                        help="also time this tree's kernels with Knobs.fit_kb = KB, interleaved")
    a = ap.parse_args()
    # (module, knobs over the flags'): the one compared against (named `label`) first, this tree's with the flags'
    # knobs last
    label, impls = None, [(x86, {})]
    if a.against:
        label, impls = a.against, [(x86_at(a.against), {})] + impls
    elif a.against_fit_kb:
        label, impls = f"fit_kb {a.against_fit_kb}", [(x86, {"fit_kb": a.against_fit_kb})] + impls
    tgt = tvm.target.Target({"kind": "llvm", "mcpu": a.mcpu}) if a.mcpu else make_target("llvm")
    width = min(x86.vector_width(tgt), a.width or 64)
    vnni = x86.has_vnni(tgt, width) and not a.no_vnni
    kw = {k: v for k, v in (("tile_n", a.tile), ("row_group", a.group), ("w_rows", a.w_rows),
                            ("prefetch_level", a.prefetch_level), ("fit_kb", a.fit_kb)) if v}
    if a.prefetch_kb is not None:
        kw["prefetch_kb"] = a.prefetch_kb
    rng = np.random.default_rng(0)
    rows = [int(r) for r in a.rows.split(",")]
    for name in a.cases.split(","):
        ttype, op, N, K, X = CASES[name]
        fmt = by_ggml_type(ttype)
        fns = []
        for m, over in impls:   # each implementation's default knobs for the kernel (as compile picks), then the flags
            spec = m.KernelSpec(op if op == "matmul" else "matmul_id", fmt.kind, N, K, None, X, 8 if X else 0,
                                op != "matmul_id_slots", 2 if op == "matmul_id" else 1)
            l1d = (m.l1d_kb(tgt),) if hasattr(m, "l1d_kb") else ()   # an older tree's takes no L1 size
            knobs = dataclasses.replace(m.default_knobs(spec, width, *l1d), **{**kw, **over})
            vnni = x86.has_vnni(tgt, knobs.width) and not a.no_vnni    # a format's default may be narrower
            if op == "matmul":
                f = m.matmul(fmt.kind, N, K, None, knobs, vnni=vnni)
            else:
                f = m.matmul_id(fmt.kind, X, N, K, 8, op == "matmul_id", 2 if op == "matmul_id" else 1, None, knobs,
                                vnni=vnni)
            fns.append(tvm.compile(tvm.IRModule({"main": f}), target=tgt).mod["main"])
        if op == "matmul":
            packed = fmt.pack(random_raw(ttype, N, K, rng), (N, K))[0]
            n_w, macs = 1, N * K
        else:
            packed = fmt.pack(random_raw(ttype, X * N, K, rng), (X * N, K))[0].reshape(X, N, -1)
            n_w = 2 if op == "matmul_id" else 1
            macs = 8 * n_w * N * K
        copies = max(1, -(-(a.stream_mb << 20) // packed.nbytes))
        ws = [tvm.runtime.tensor(packed) for _ in range(copies * n_w)]
        times = []     # [R][impl]
        for R in rows:
            x = rng.standard_normal((R * (8 if op == "matmul_id_slots" else 1), K)).astype(np.float32)
            acts = [tvm.runtime.tensor(v) for v in x86.activation_rows(fmt.kind, x)]
            if op == "matmul":
                y = tvm.runtime.empty((R, N), "float32")
                calls = [lambda i, fn=fn: fn(ws[i], *acts, y) for fn in fns]
            else:
                ids = np.stack([rng.choice(X, 8, replace=False) for _ in range(R)]).astype(np.int32)
                ids, ys = tvm.runtime.tensor(ids), [tvm.runtime.empty((R, 8, N), "float32") for _ in range(n_w)]
                calls = [lambda i, fn=fn: fn(*ws[n_w * i:n_w * (i + 1)], *acts, ids, *ys) for fn in fns]
            for call in calls:
                call(0)
            best = [float("inf")] * len(calls)
            for _ in range(a.repeat):
                for j, call in enumerate(calls):     # in turn: both kernels see the machine's drift
                    t0 = time.perf_counter()
                    for i in range(copies):
                        call(i)
                    best[j] = min(best[j], (time.perf_counter() - t0) / copies)
            times.append(best)
        shape = f"{N}x{K}" + (f" X{X}" if X else "")
        if label:
            print(f"{name:12s} {ttype:5s} {shape:16s} " + "  ".join(
                f"R{R}: {label} {t[0] * 1e3:7.3f} / this {t[1] * 1e3:7.3f} ms ({t[0] / t[1]:.2f}x)"
                for R, t in zip(rows, times)), flush=True)
            continue
        print(f"{name:12s} {ttype:5s} {shape:16s} " + "  ".join(
            f"R{R}: {t[0] * 1e3:8.3f} ms ({t[0] / times[0][0]:.2f}x, {R * macs / t[0] / 1e9:4.0f} GMAC/s)"
            for R, t in zip(rows, times)), flush=True)


if __name__ == "__main__":
    main()
