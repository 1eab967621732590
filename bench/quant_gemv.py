"""GEMV bandwidth per quantized format: the compiled kernel (dequantizing while it reads) next to numpy's matmul
on the float32-dequantized weights (CPU), or as a fraction of the device's copy bandwidth (GPU).

    python bench/quant_gemv.py [--target llvm|cuda|rocm] [--arch sm_90] [--n 8192] [--k 4096] [--rows 1]
                               [--types Q4_K,Q8_0] [--repeat 20] [--json out.json]

Per format: microseconds per call (best of --repeat runs of the TVM time evaluator) and GB/s of weight bytes
read (the GGUF bytes of the matrix: the memory-bound figure that decode speed follows). On the CPU, numpy's
product on the float32 matrix (GB/s of its float32 bytes) is shown next to it; on a GPU, the device's copy
bandwidth (a device-to-device copy of 1 GiB, counted as bytes read + written) and the kernel's fraction of it.
Weights are random blocks with ordinary float16 scales. The GPU mode needs the GPU: build elsewhere fails fast.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
         "IQ2_XXS", "IQ1_S"]
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
              "IQ2_XXS": [0], "IQ1_S": [0]}


def random_raw(ttype, n, k, rng):
    import gguf

    block, tsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]]
    b = rng.integers(0, 256, (n * k // block, tsize), dtype=np.uint8)
    for off in F16_FIELDS[ttype]:
        b[:, off:off + 2] = (rng.standard_normal(len(b)) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b.reshape(n, k // block * tsize)


def build(kind, n, k, rows, target="llvm", arch=None):
    import tvm
    from tvm import te, tirx

    from nextn.compiler.target import make_target
    from nextn.compiler.lower import te_ops
    from nextn.common.quant import FORMATS
    from nextn.schedules import schedule_pass

    i64 = lambda s: [tirx.IntImm("int64", int(v)) for v in s]  # noqa: E731
    bufs = [te.placeholder(i64(s), dt, name="w" + sfx.replace(".", "_")) for sfx, dt, s in FORMATS[kind].buffers((n, k))]
    x = te.placeholder(i64((rows, k)), "float32", name="x")
    f = te.create_prim_func([x, *bufs, te_ops.mul_mat(te_ops.QWeight(kind, bufs, (n, k)), x)])
    mod = tvm.IRModule({"gemv": f.with_attr("global_symbol", "gemv")})
    if target == "llvm":
        tgt = make_target("llvm")
        with tgt:
            return tvm.compile(schedule_pass(tgt)(mod), target=tgt)
    from nextn.compiler.gpu_build import build_scope

    arches = [arch] if arch else None
    tgt = make_target(target, arches)
    with build_scope(target, arches or [str(tgt.attrs.get("arch", ""))]), tgt:
        return tvm.compile(schedule_pass(tgt)(mod), target=tgt)


def copy_bandwidth(dev, nbytes=1 << 30, repeat=10):
    """GB/s of a device-to-device copy, bytes read + written."""
    import tvm

    a = tvm.runtime.empty((nbytes // 4,), "float32", dev)
    b = tvm.runtime.empty((nbytes // 4,), "float32", dev)
    best = float("inf")
    for _ in range(repeat):
        dev.sync()
        t0 = time.perf_counter()
        b.copyfrom(a)
        dev.sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="llvm", choices=["llvm", "cuda", "rocm"])
    ap.add_argument("--arch", default=None, help="GPU arch (sm_90, gfx942); default: the target's lowest")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=1, help="activation rows (1 = decode GEMV, k+1 = verify)")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import gguf
    import tvm

    from nextn.common.quant import by_ggml_type

    rng = np.random.default_rng(0)
    n, k = args.n, args.k
    x = rng.standard_normal((args.rows, k)).astype(np.float32)
    gpu = args.target != "llvm"
    dev = {"llvm": tvm.cpu, "cuda": tvm.cuda, "rocm": tvm.rocm}[args.target]()
    if gpu and not dev.exist:
        raise SystemExit(f"no {args.target} device here: the GPU mode runs on the GPU machine")
    copy_gbs = copy_bandwidth(dev) if gpu else None
    results = []
    where = f"{args.target} (copy bandwidth {copy_gbs:.0f} GB/s)" if gpu else "this CPU"
    print(f"GEMV {args.rows}x{k} · [{n}x{k}]ᵀ on {where}; GB/s = weight bytes / time")
    last = "fraction of copy" if gpu else "numpy f32 us  numpy GB/s"
    print(f"{'type':8} {'bytes':>10} {'tvm us':>9} {'tvm GB/s':>9}  {last}  {'max rel':>8}")
    for ttype in args.types.split(","):
        fmt = by_ggml_type(ttype)
        raw = random_raw(ttype, n, k, rng)
        packed = [tvm.runtime.tensor(a, dev) for a in fmt.pack(raw, (n, k))]
        lib = build(fmt.kind, n, k, args.rows, args.target, args.arch)
        xt, out = tvm.runtime.tensor(x, dev), tvm.runtime.empty((args.rows, n), "float32", dev)
        ev = lib.mod.time_evaluator("gemv", dev, number=5, repeat=args.repeat)
        t_tvm = min(ev(xt, *packed, out).results)
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ttype]).astype(np.float32)
        t_np = []
        for _ in range(1 if gpu else args.repeat):
            t0 = time.perf_counter()
            y = x @ w.T
            t_np.append(time.perf_counter() - t0)
        t_np = min(t_np)
        err = float(np.abs(out.numpy() - y).max() / np.abs(y).max())
        r = {"type": ttype, "weight_bytes": raw.nbytes, "tvm_us": t_tvm * 1e6, "tvm_gbs": raw.nbytes / t_tvm / 1e9,
             "max_rel": err}
        if gpu:
            r["fraction_of_copy"] = r["tvm_gbs"] / copy_gbs
            tail = f"{r['fraction_of_copy']:>16.2f}"
        else:
            r.update(numpy_us=t_np * 1e6, numpy_gbs=w.nbytes / t_np / 1e9)
            tail = f"{r['numpy_us']:>12.0f} {r['numpy_gbs']:>11.2f}"
        results.append(r)
        print(f"{ttype:8} {raw.nbytes:>10} {r['tvm_us']:>9.0f} {r['tvm_gbs']:>9.2f}  {tail}  {err:>8.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "n": n, "k": k, "rows": args.rows, "copy_gbs": copy_gbs,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
