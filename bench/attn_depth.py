"""The CPU attention kernels alone at depth, against their bytes and FLOPs (issue 34 item 5, issue 37 item 8): a
decode step (the split form, one row, flash-decoding: partial + merge) after D cells, and a prefill chunk (the
fused form) of T rows at positions D - T .. D - 1, on one attention layer of a given shape (default GLM-4.5-Air:
96 query / 8 KV heads x 128, scale 128^-0.5), with the KV types the engine supports.

    TVM_NUM_THREADS=2 python bench/attn_depth.py [--decode 8192,32768] [--prefill 16384] [--rows 512]
                                                 [--kv f16,q8_0] [--repeat 5] [--baseline-ref main] [--json F]

Per case: ms per call (the best of --repeat, after one untimed call), and what bounds it: a decode reads every
cell's K and V once per KV head (bytes = D x Hkv x (row bytes of K + row bytes of V)), shown as GB/s; a prefill
chunk multiplies q k^T and p v over the causal cells (FLOPs = 2 x 2 x H x Dk x sum over rows of its cells, Dk =
Dv here), shown as GFLOP/s. `--baseline-ref REF`: the same cases with flash_attn.py as it is at git REF (loaded
beside this tree's, same kv_access), interleaved call by call, outputs compared bit for bit, and the ratio
this tree ÷ REF. Random q and KV (the kernels' work does not depend on the values). Times are wall time of the
kernel call; on a shared machine run under the heavy lock (`flock "$(python bench/realwidth_files.py --lock)"`).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def load_flash_attn(ref: str | None):
    """This tree's flash_attn module, or (ref) flash_attn.py at git `ref`, imported as a sibling module so that its
    relative import of kv_access resolves to this tree's."""
    from nextn.compiler.lower.attention import flash_attn
    if ref is None:
        return flash_attn
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = subprocess.run(["git", "-C", root, "show", f"{ref}:compiler/lower/attention/flash_attn.py"],
                         check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="attn_depth_"), "flash_attn_ref.py")
    with open(path, "w") as f:
        f.write(src)
    name = "nextn.compiler.lower.attention._flash_attn_ref"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class Case:
    """One kernel call of module `fa` (decode: split, one row; prefill: fused, `rows` rows) over `L` cells."""

    def __init__(self, fa, a, kind: str, L: int, rows: int, data):
        import tvm
        self.fa, self.kind, self.L = fa, kind, L
        q, kst, vst = data
        T_ = 1 if kind == "decode" else rows
        self.pos = np.arange(L - T_, L, dtype=np.int32)
        from nextn.compiler.target import host_llvm
        target = tvm.target.Target(host_llvm())
        if kind == "decode":
            funcs = {"p": fa.cpu_kernel(a, True, fa.cpu_rows_per_task(a, True, one_row=True)),
                     "m": fa.cpu_merge_kernel(a)}
        else:
            funcs = {"f": fa.cpu_kernel(a, False)}
        self.ex = tvm.compile(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()}),
                              target=target)
        dev = [tvm.runtime.tensor(np.ascontiguousarray(x)) for x in (q[:T_], kst, vst, self.pos)]
        self.args = dev + [tvm.runtime.tensor(np.zeros((1, 1), np.float32)), L]
        self.o = tvm.runtime.empty((T_, a.H, a.Dv), "float32")
        if kind == "decode":
            nc = -(-L // fa.CHUNK)
            self.pacc = tvm.runtime.empty((T_, a.H, nc, a.Dv), "float32")
            self.pml = tvm.runtime.empty((T_, a.H, nc, 2), "float32")

    def __call__(self):
        if self.kind == "decode":
            self.ex["p"](*self.args, self.pacc, self.pml)
            self.ex["m"](self.pacc, self.pml, self.args[3], self.L, self.o)
        else:
            self.ex["f"](*self.args, self.o)
        return self.o


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", default="96,8,128", help="H,Hkv,D (query heads, KV heads, head width)")
    p.add_argument("--decode", default="8192,32768", help="depths of the decode step ('' for none)")
    p.add_argument("--prefill", default="16384", help="depths at which a prefill chunk ends ('' for none)")
    p.add_argument("--rows", type=int, default=512, help="rows of the prefill chunk")
    p.add_argument("--kv", default="f16,q8_0", help="KV types (K and V alike)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--baseline-ref", default=None, help="git ref whose flash_attn.py to compare against")
    p.add_argument("--json")
    a = p.parse_args(argv)
    from nextn.common.kv_types import KV_TYPES

    H, Hkv, D = map(int, a.heads.split(","))
    mods = {"this": load_flash_attn(None)}
    if a.baseline_ref:
        mods[a.baseline_ref] = load_flash_attn(a.baseline_ref)
    cases = [("decode", int(x)) for x in a.decode.split(",") if x] + \
            [("prefill", int(x)) for x in a.prefill.split(",") if x]
    rng = np.random.default_rng(0)
    rows = []
    print(f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', '(all)')}, H {H} / Hkv {Hkv} x {D}", file=sys.stderr)
    print("| kv | step | D | " + " | ".join(f"{n} ms" for n in mods) + " | bound | rate (this) |"
          + (f" this ÷ {a.baseline_ref} |" if a.baseline_ref else ""))
    print("|---" * (5 + len(mods) + bool(a.baseline_ref)) + "|")
    for kv in a.kv.split(","):
        kt = KV_TYPES[kv]
        for kind, L in cases:
            q = rng.standard_normal((a.rows if kind == "prefill" else 1, H, D)).astype(np.float32)
            x = rng.standard_normal((L, Hkv, D)).astype(np.float32)
            data = (q, kt.encode(x), kt.encode(x[..., ::-1].copy()))
            run = {}
            for name, fa in mods.items():
                shape = fa.AttnShape(H, Hkv, D, D, D ** -0.5, kv, kv)
                run[name] = Case(fa, shape, kind, L, a.rows, data)
            best = {n: float("inf") for n in run}
            outs = {n: c().numpy().copy() for n, c in run.items()}
            same = all(np.array_equal(o, outs["this"]) for o in outs.values())
            for _ in range(a.repeat):
                for n, c in run.items():
                    t = time.perf_counter()
                    c()
                    best[n] = min(best[n], (time.perf_counter() - t) * 1e3)
            if kind == "decode":
                nbytes = L * Hkv * (kt.storage_shape((D,))[0] * np.dtype(kt.storage_dtype).itemsize) * 2
                rate, bound = nbytes / best["this"] / 1e6, f"{nbytes / 1e6:.0f} MB"
                unit = "GB/s"
            else:
                cells = float(np.sum(run["this"].pos.astype(np.int64) + 1))
                flops = 4.0 * H * D * cells
                rate, bound = flops / best["this"] / 1e6, f"{flops / 1e9:.0f} GFLOP"
                unit = "GFLOP/s"
            ratio = f" {best['this'] / best[a.baseline_ref]:.2f}{'' if same else ' (bits differ)'} |" \
                if a.baseline_ref else ""
            print(f"| {kv} | {kind}{'' if kind == 'decode' else f' {a.rows} rows'} | {L} | "
                  + " | ".join(f"{best[n]:.1f}" for n in run) + f" | {bound} | {rate:.1f} {unit} |" + ratio,
                  flush=True)
            rows.append({"kv": kv, "step": kind, "depth": L, "rows": 1 if kind == "decode" else a.rows,
                         "ms": best, "rate": rate, "unit": unit, "same_bits": same})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
