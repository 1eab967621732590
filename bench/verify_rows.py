"""What a verify of T rows costs in the x86 kernels against what its bytes cost (issue 34 item 2), at GLM-4.5-Air
shapes: each kernel's time at T rows ÷ the one-row decode kernel's, next to bytes(T) ÷ bytes(1).

    TVM_NUM_THREADS=1 python bench/verify_rows.py [--cases exps_gate_up,exps_down,attn_o,ffn_down,lm_head]
        [--rows 1,2,3,4] [--distinct 8,16,32] [--repeat 7] [--stream-mb 400] [--knobs w_rows=2,tile_n=8]
        [--against REV] [--variant fit_kb=64 ...]

The decode kernel is the one-row kernel a model's decode entry runs (KernelSpec rows=1), the verify kernel the
symbolic-row one its verify / prefill entries run (rows=None), each with `default_knobs` as compile picks them
(--knobs overrides the verify kernel's). Routed experts (`matmul_id`, 128 experts, top-8): T rows whose 8 experts
each are drawn from D distinct ones (row t takes E[(8t + j) % D], so D = 8 is every row on the same 8 experts, D =
8T all disjoint), fresh experts each call (the pool of 128 is 0.8 GB: the selected ones come from memory); bytes(T)
÷ bytes(1) = D ÷ 8, so rows at fixed D show what a row costs beyond its bytes and D at fixed T what an expert
costs. Dense weights are cycled through --stream-mb of copies (this CPU's L3 may be large). Random weights
(quant_gemv's random_raw).

Timing: CPU time of the process (`time.process_time`: with one TVM thread, the kernel's thread; time the machine's
other jobs take from it is not counted), per call averaged over the copies, the minimum over --repeat rounds in
which every configuration runs in turn (interleaved: they see the same drift). --against REV: also the kernels of
git revision REV's compiler/lower/x86 (bench/x86_rows.py's x86_at), interleaved, and the ratio REV ÷ this tree.
--variant KNOBS (repeatable): also this tree's verify kernel with these knob overrides on top of --knobs (e.g.
fit_kb=96: K whole where a row group's activations pass the L1; x_chunk_kb=N, not a knob, sets
tiles.X_CHUNK_BYTES for that kernel), interleaved, and the ratio of the first kernel (REV's, else this tree's) ÷ each.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from quant_gemv import random_raw
from x86_rows import x86_at

CASES = {   # name: (GGUF type, op, N, K, experts, GGUF tensor)
    "exps_gate_up": ("Q4_K", "matmul_id", 1408, 4096, 128, "ffn_gate_exps + ffn_up_exps (one pass)"),
    "exps_down": ("Q8_0", "matmul_id_slots", 4096, 1408, 128, "ffn_down_exps"),
    "attn_o": ("Q4_K", "matmul", 4096, 12288, 0, "attn_output"),
    "ffn_down": ("Q8_0", "matmul", 4096, 10944, 0, "ffn_down (dense layer)"),
    "lm_head": ("Q6_K", "matmul", 151552, 4096, 0, "output (lm head)"),
}
N_USED = 8


def expert_ids(rng, X: int, T: int, D: int) -> np.ndarray:
    """int32 [T, 8]: row t's experts E[(8t + j) % D] of D distinct experts E drawn from X."""
    E = rng.choice(X, D, replace=False)
    return np.array([[E[(N_USED * t + j) % D] for j in range(N_USED)] for t in range(T)], dtype=np.int32)


def build(m, tgt, width, vnni, ttype, op, N, K, X, rows, kw):
    """The compiled kernel of implementation `m` (an x86 package) for `rows` (1 or None), default knobs + kw."""
    import tvm

    from nextn.common.quant import by_ggml_type

    kind = by_ggml_type(ttype).kind
    n_w = 2 if op == "matmul_id" else 1
    spec = m.KernelSpec(op if op == "matmul" else "matmul_id", kind, N, K, rows, X, N_USED if X else 0,
                        op != "matmul_id_slots", n_w)
    # compile's defaults for the target (an older tree's default_knobs may not take the L1 size)
    l1d = (m.l1d_kb(tgt),) if hasattr(m, "l1d_kb") else ()
    kw = dict(kw)
    chunk_kb = kw.pop("x_chunk_kb", None)
    knobs = dataclasses.replace(m.default_knobs(spec, width, *l1d), **kw)
    saved = m.tiles.X_CHUNK_BYTES
    if chunk_kb is not None:    # not a knob: the module constant, for this build only
        m.tiles.X_CHUNK_BYTES = chunk_kb << 10
    try:
        f = spec.build(knobs, vnni)
    finally:
        m.tiles.X_CHUNK_BYTES = saved
    return tvm.compile(tvm.IRModule({"main": f}), target=tgt).mod["main"], knobs


def main():
    import tvm

    from nextn.common.quant import by_ggml_type
    from nextn.compiler.lower import x86
    from nextn.compiler.target import make_target

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rows", default="1,2,3,4")
    ap.add_argument("--distinct", default="8,12,16,24,32", help="distinct experts per call (routed experts)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--stream-mb", type=int, default=400)
    ap.add_argument("--knobs", default="", help="verify kernel knob overrides, e.g. w_rows=2,tile_n=8")
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--variant", action="append", default=[], metavar="KNOBS",
                    help="another verify kernel of this tree with these knob overrides (repeatable)")
    a = ap.parse_args()
    def parse(knobs):
        return {k: int(v) for k, v in (p.split("=") for p in knobs.split(",") if p)}

    kw = parse(a.knobs)
    impls = ([(a.against, x86_at(a.against), kw)] if a.against else []) + [("this", x86, kw)] \
        + [(f"this[{v}]", x86, {**kw, **parse(v)}) for v in a.variant]
    tgt = make_target("llvm")
    width = x86.vector_width(tgt)
    vnni = x86.has_vnni(tgt, width)
    rng = np.random.default_rng(0)
    rows = [int(r) for r in a.rows.split(",")]
    print(f"width {width}, vnni {vnni}, CPU time, min of {a.repeat} interleaved rounds")
    for name in a.cases.split(","):
        ttype, op, N, K, X, tensor = CASES[name]
        fmt = by_ggml_type(ttype)
        n_w = 2 if op == "matmul_id" else 1
        kernels = []    # (impl label, decode fn, verify fn)
        for label, m, kw_m in impls:
            dec, _ = build(m, tgt, width, vnni, ttype, op, N, K, X, 1, {})
            ver, knobs = build(m, tgt, width, vnni, ttype, op, N, K, X, None, kw_m)
            kernels.append((label, dec, ver))
            print(f"{name} ({tensor}, {ttype} {N}x{K}{f' X{X}' if X else ''}) {label}: verify knobs {knobs}")
        if X:
            packed = fmt.pack(random_raw(ttype, X * N, K, rng), (X * N, K))[0].reshape(X, N, -1)
            ws = [tvm.runtime.tensor(packed) for _ in range(n_w)]
            copies = 16
        else:
            packed = fmt.pack(random_raw(ttype, N, K, rng), (N, K))[0]
            copies = max(1, -(-(a.stream_mb << 20) // packed.nbytes))
            ws = [tvm.runtime.tensor(packed) for _ in range(copies)]
        del packed
        configs = []    # (T, D, which kernel, impl index, call(i))
        for R in rows:
            x = rng.standard_normal((R * (N_USED if op == "matmul_id_slots" else 1), K)).astype(np.float32)
            acts = [tvm.runtime.tensor(v) for v in x86.activation_rows(fmt.kind, x)]
            Ds = [d for d in (int(v) for v in a.distinct.split(",")) if N_USED <= d <= N_USED * R] if X else [0]
            for D in Ds:
                if X:
                    ids = [tvm.runtime.tensor(expert_ids(rng, X, R, D)) for _ in range(copies)]
                    ys = [tvm.runtime.empty((R, N_USED, N), "float32") for _ in range(n_w)]
                for k, (_label, dec, ver) in enumerate(kernels):
                    for which, fn in (("decode", dec), ("verify", ver)) if R == 1 else (("verify", ver),):
                        if X:
                            call = lambda i, fn=fn, acts=acts, ids=ids, ys=ys: fn(*ws, *acts, ids[i], *ys)
                        else:
                            y = tvm.runtime.empty((R, N), "float32")
                            call = lambda i, fn=fn, acts=acts, y=y: fn(ws[i], *acts, y)
                        configs.append((R, D, which, k, call))
        for c in configs:
            c[4](0)
        best = [float("inf")] * len(configs)
        for _ in range(a.repeat):
            for j, c in enumerate(configs):
                t0 = time.process_time()
                for i in range(copies):
                    c[4](i)
                best[j] = min(best[j], (time.process_time() - t0) / copies)
        dec_ms = {k: best[j] * 1e3 for j, c in enumerate(configs) if c[2] == "decode" for k in [c[3]]}
        print("| kernel | T | distinct experts | " + " | ".join(
            f"{lab} ms | {lab} ÷ decode" for lab, _, _ in kernels) + " | bytes(T) ÷ bytes(1) |"
              + "".join(f" {kernels[0][0]} ÷ {lab} |" for lab, _, _ in kernels[1:]))
        by = {}
        for j, c in enumerate(configs):
            by.setdefault((c[0], c[1], c[2]), {})[c[3]] = best[j] * 1e3
        for (R, D, which), per in by.items():
            cells = " | ".join(f"{per[k]:.2f} | {per[k] / dec_ms[k]:.2f}" for k in range(len(kernels)))
            ratio = "".join(f" {per[0] / per[k]:.2f} |" for k in range(1, len(kernels)))
            print(f"| {name} {which} | {R} | {D if X else '-'} | {cells} | {D / N_USED if X else 1:.2f} |{ratio}",
                  flush=True)
        del ws


if __name__ == "__main__":
    main()
