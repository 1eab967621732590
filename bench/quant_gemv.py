"""GEMV / few-row GEMM speed per weight format at real widths, as a fraction of a read of the same bytes measured
in the same run.

    python bench/quant_gemv.py [--types Q4_K,Q6_K | codebook] [--shapes 4096x4096,151552x4096 | --n N --k K] [--rows 1]
                               [--exact] [--element] [--prefetch KB] [--width 32] [--mapped DIR] [--stream-mb 256]
                               [--repeat 5] [--threads T] [--json out.json]
    python bench/quant_gemv.py --target cuda|rocm [--arch sm_90] ...        (GPU: the element-expression kernels)

CPU (llvm): each format is timed with the kernel the compiler gives a model's matmul: the x86 kernels
(compiler/lower/x86; K-quants Q2_K .. Q6_K, IQ4_XS and the codebook formats IQ1_S .. IQ3_S on "q8" int8 activation
rows, Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 / NVFP4 on "q8_0" rows, the float path with --exact) where
they apply, else the TE element-expression kernel (the integer formats, Q8_0 / IQ4_NL / MXFP4 / NVFP4 aside, with
--exact).
The weight is cycled through enough copies (--stream-mb, 8x this CPU's 32 MB L3) to come from memory, as in
decoding a model far larger than the cache. GB/s = the weight's GGUF bytes / time (best round).

The ceiling is a probe per case (`probe_kernel`): a TVM kernel that reads (sums) the very same weight copies, in
the same work items (tiles of tile_n weight rows, each a contiguous stream) on the same threads with the same
software prefetch (kernel.prefetch, Knobs.prefetch_kb) and no decode; kernel and probe run in interleaved
rounds, and "of probe" is the median over the rounds of the kernel's GB/s over the probe's in the same round.
"of numpy" = GB/s over bench/realwidth.py's reference (`threads` numpy sums over 512 MB, which reads less than
a prefetching kernel streams), for continuity with its tables; the header also prints a TVM sum of 1 GiB without
prefetch. "vs Q8_0" = GB/s over Q8_0's on the same shape in the same run (Q8_0 is timed first, also when
--types leaves it out). --element also times the element kernel for comparison ("x elem": the kernel's GB/s over
the element kernel's, same run). --rows R times R activation
rows (a verify of R-1 drafts). --threads sets TVM_NUM_THREADS (default: it, or every core).
On a GPU: the element kernels and the device's copy bandwidth (read + write), as before.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ4_XS", "IQ4_NL", "Q4_0", "Q5_0", "Q2_K", "Q3_K", "Q4_1", "Q5_1",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "MXFP4", "NVFP4", "BF16", "F16"]
DEFAULT_TYPES = "Q4_K,Q5_K,Q6_K,Q8_0,IQ4_XS,IQ4_NL"
CODEBOOK_TYPES = "IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,IQ1_S,IQ1_M"     # --types codebook
# GLM-4.5-Air / GLM-5.2 widths: attention and dense FFN (K = 4096, 6144, 10944, 12288), experts (K = 1408), lm head
SHAPES = "4096x4096,12288x4096,4096x12288,10944x4096,4096x10944,1408x4096,4096x1408,6144x6144,151552x4096"
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
              "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
              "IQ1_M": [], "MXFP4": [], "NVFP4": []}     # IQ1_M, MXFP4, NVFP4: see random_raw


def random_raw(ttype, n, k, rng):
    """GGUF bytes [n, k / block * size] of a random `ttype` matrix with ordinary float16 scales."""
    import gguf

    if ttype in ("F16", "BF16"):
        v = rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.05)   # float32: the lm head in f64 is 5 GB
        if ttype == "F16":
            return v.astype(np.float16).view(np.uint8)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    block, tsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]]
    b = rng.integers(0, 256, (n * k // block, tsize), dtype=np.uint8)
    d = (rng.standard_normal(len(b)) * 0.01).astype(np.float16)
    for off in F16_FIELDS[ttype]:
        b[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    if ttype == "IQ1_M":    # the float16 scale is the top nibbles of the four scale words (bytes 48..55)
        w = b[:, 48:56].copy().view(np.uint16) & 0x0FFF
        w |= ((d.view(np.uint16)[:, None] >> (4 * np.arange(4, dtype=np.uint16))) & 0xF) << 12
        b[:, 48:56] = w.view(np.uint8)
    if ttype == "MXFP4":    # exponent byte e: scale 2^(e-128) around 0.01
        b[:, 0] = rng.integers(115, 125, len(b))
    if ttype == "NVFP4":    # ue4m3 scale bytes around 0.01 (the per-tensor `.scale` is a separate multiply)
        b[:, :4] = rng.integers(24, 40, (len(b), 4))
    return b.reshape(n, k // block * tsize)


def build_element(kind, n, k, rows, target="llvm", arch=None):
    """The TE element-expression kernel (`gemv(x, *weight buffers, y)`), scheduled for `target`."""
    import tvm
    from tvm import te, tirx

    from nextn.common.quant import FORMATS
    from nextn.compiler.lower import te_ops
    from nextn.compiler.target import make_target
    from nextn.schedules import schedule_pass

    i64 = lambda s: [tirx.IntImm("int64", int(v)) for v in s]  # noqa: E731
    bufs = [te.placeholder(i64(s), dt, name="w" + sfx.replace(".", "_")) for sfx, dt, s in FORMATS[kind].buffers((n, k))]
    x = te.placeholder(i64((rows, k)), "float32", name="x")
    f = te.create_prim_func([x, *bufs, te_ops.mul_mat(te_ops.QWeight(kind, bufs, (n, k)), x)])
    mod = tvm.IRModule({"gemv": f.with_attr("global_symbol", "gemv")})
    if target == "llvm":
        tgt = make_target("llvm")
        with tgt:
            return tvm.compile(schedule_pass(tgt)(mod), target=tgt).mod["gemv"]
    from nextn.compiler.gpu_build import build_scope

    arches = [arch] if arch else None
    tgt = make_target(target, arches)
    with build_scope(target, arches or [str(tgt.attrs.get("arch", ""))]), tgt:
        return tvm.compile(schedule_pass(tgt)(mod), target=tgt)


def read_bandwidth(nbytes=1 << 30, repeat=5) -> float:
    """GB/s of a TVM kernel that sums a `nbytes` uint64 buffer, chunks spread over the threads (a STREAM read)."""
    import tvm
    from tvm import tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script import builder as T

    from nextn.compiler.target import make_target

    n, chunks = nbytes // 8, 256
    per = n // chunks
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("read_sum")
            T.func_attr({"global_symbol": "read_sum", "tirx.noalias": True})
            a = T.arg("a", T.buffer((n,), "uint64", align=64))
            out = T.arg("out", T.buffer((chunks,), "uint64"))
            with T.parallel(0, chunks) as c:
                acc = T.decl_buffer((32,), "uint64")
                T.buffer_store(acc, tirx.Broadcast(tirx.const(0, "uint64"), 32), [tirx.Ramp(0, 1, 32)])
                with T.serial(0, per // 32) as i:
                    T.buffer_store(acc, acc[tirx.Ramp(0, 1, 32)] + a[tirx.Ramp(c * per + i * 32, 1, 32)],
                                   [tirx.Ramp(0, 1, 32)])
                T.buffer_store(out, tirx.call_llvm_pure_intrin("uint64", "llvm.vector.reduce.add",
                                                               acc[tirx.Ramp(0, 1, 32)]), [c])
    tgt = make_target("llvm")
    f = tvm.compile(tvm.IRModule({"read_sum": ib.get()}), target=tgt).mod["read_sum"]
    buf = tvm.runtime.tensor(np.ones(n, np.uint64))
    res = tvm.runtime.empty((chunks,), "uint64")
    f(buf, res)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f(buf, res)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


PROBE_UNROLL = 4     # 64-byte lines per step of the probe's loop


def probe_kernel(shape, dtype, n_items: int, prefetch_kb: int, prefetch_level: int = 2):
    """The read-bandwidth ceiling of a GEMV on this weight: a TVM kernel that reads (sums) every 64-byte line of
    a weight argument of `shape` / `dtype` (the packed GGUF bytes the x86 kernel reads), its lines split over
    `n_items` parallel work items in order (the GEMV's tiles of weight rows: the same threads, each a contiguous
    stream), with the x86 kernels' software prefetch `prefetch_kb` ahead into cache level `prefetch_level`
    (compiler/lower/x86/kernel.prefetch) and no decode. `probe(w, out)`: out uint64 [n_items, 8] = per item the
    lane sums of the lines it read. Returns (probe, bytes read: the whole 64-byte lines)."""
    import tvm
    from tvm import tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script import builder as T

    from nextn.compiler.lower.x86 import kernel
    from nextn.compiler.target import make_target

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    lines = nbytes // 64
    kern = kernel.Kern(prefetch=prefetch_kb * 1024, prefetch_level=prefetch_level, row_bytes=0)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("read_probe")
            T.func_attr({"global_symbol": "read_probe", "tirx.noalias": True})
            w = T.arg("w", T.buffer(shape, dtype, align=32))
            out = T.arg("out", T.buffer((n_items, 8), "uint64"))
            kern.w8 = T.decl_buffer((nbytes,), "int8", data=w.data)
            w64 = T.decl_buffer((lines * 8,), "uint64", data=w.data, align=32)
            with T.parallel(0, n_items) as it:
                acc = T.decl_buffer((8,), "uint64")
                T.buffer_store(acc, tirx.Broadcast(tirx.const(0, "uint64"), 8), [tirx.Ramp(0, 1, 8)])
                lo = T.Bind(tirx.Cast("int64", it) * lines // n_items)
                hi = T.Bind((tirx.Cast("int64", it) + 1) * lines // n_items)
                with T.serial(0, (hi - lo) // PROBE_UNROLL) as i:     # PROBE_UNROLL lines a step
                    ln = T.Bind(lo + i * PROBE_UNROLL)
                    kernel.prefetch(kern, 0, ln * 64, 64 * PROBE_UNROLL)
                    v = w64[tirx.Ramp(ln * 8, 1, 8)]
                    for u in range(1, PROBE_UNROLL):
                        v = v + w64[tirx.Ramp((ln + u) * 8, 1, 8)]
                    T.buffer_store(acc, acc[tirx.Ramp(0, 1, 8)] + v, [tirx.Ramp(0, 1, 8)])
                with T.serial(lo + (hi - lo) // PROBE_UNROLL * PROBE_UNROLL, hi) as ln:
                    kernel.prefetch(kern, 0, ln * 64, 64)
                    T.buffer_store(acc, acc[tirx.Ramp(0, 1, 8)] + w64[tirx.Ramp(ln * 8, 1, 8)], [tirx.Ramp(0, 1, 8)])
                T.buffer_store(out, acc[tirx.Ramp(0, 1, 8)], [it, tirx.Ramp(0, 1, 8)])
    f = tvm.compile(tvm.IRModule({"read_probe": ib.get()}), target=make_target("llvm")).mod["read_probe"]
    return f, lines * 64


def numpy_read_bandwidth(threads: int) -> float:
    """GB/s of bench/realwidth.py's reference (`threads` numpy sums over 512 MB), the figure its tables divide by."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine_probe import stream_bandwidth

    return stream_bandwidth(threads)["read_GBps"]


def _stream_times(calls: dict, weights, repeat) -> dict:
    """{name: [seconds per call in each round]} of each (fn, rest) in `calls` called as fn(w, *rest) over the
    weight copies, `repeat` rounds interleaved (one pass of each per round), so that a shared machine's slow
    moments fall on all of them alike and each round's passes can be compared."""
    weights = [w for w in weights if not hasattr(w, "name")]    # (a mapped file's handle)
    for fn, rest in calls.values():
        fn(weights[0], *rest)
    out = {name: [] for name in calls}
    for _ in range(repeat):
        for name, (fn, rest) in calls.items():
            t0 = time.perf_counter()
            for w in weights:
                fn(w, *rest)
            out[name].append((time.perf_counter() - t0) / len(weights))
    return out


def _mapped_copies(packed: np.ndarray, copies: int, folder: str):
    """`copies` views of `packed` in a memory-mapped file in `folder` (page-cache pages, 32 mod 64 aligned as
    GGUF tensor data may be), as a model's weights are (runtime/device.py Device.weight)."""
    import tempfile

    import tvm_ffi

    stride = -(-packed.nbytes // 64) * 64 + 64
    f = tempfile.NamedTemporaryFile(dir=folder, suffix=".bin")
    f.truncate(copies * stride + 64)
    mm = np.memmap(f.name, np.uint8, "r+")
    out = []
    for i in range(copies):
        v = mm[i * stride + 32:i * stride + 32 + packed.nbytes].view(packed.dtype).reshape(packed.shape)
        v[...] = packed
        out.append(tvm_ffi.from_dlpack(v))
    out.append(f)    # kept alive with the views; not a weight
    return out


CHECK_ROWS = 2048


def cpu_case(ttype, n, k, rows, args, rng):
    import gguf
    import tvm

    from nextn.common.quant import activation, by_ggml_type
    from nextn.compiler.lower import x86
    from nextn.compiler.target import make_target

    fmt = by_ggml_type(ttype)
    raw = random_raw(ttype, n, k, rng)
    copies = max(1, -(-(args.stream_mb << 20) // raw.nbytes))
    weights = _mapped_copies(fmt.pack(raw, (n, k))[0], copies, args.mapped) if args.mapped else \
        [tvm.runtime.tensor(fmt.pack(raw, (n, k))[0]) for _ in range(copies)]
    x = rng.standard_normal((rows, k)).astype(np.float32)
    y = tvm.runtime.empty((rows, n), "float32")
    m = min(n, CHECK_ROWS)     # the error is checked on the first rows (the lm head's whole f64 matrix is 5 GB)
    w_f = gguf.quants.dequantize(raw[:m], gguf.GGMLQuantizationType[ttype]).astype(np.float64)
    tgt = make_target("llvm")
    width = x86.vector_width(tgt)
    if width and args.width:
        width = min(width, args.width)
    quantized = fmt.kind in x86.INT_KINDS and not args.exact
    path = None
    knobs = x86.Knobs(width=width or 32) if args.prefetch is None else \
        x86.Knobs(width=width or 32, prefetch_kb=args.prefetch)
    calls = {}
    if width and (fmt.kind in x86.FLOAT_KINDS or quantized):
        exact = not quantized
        fn = tvm.compile(tvm.IRModule({"main": x86.matmul(fmt.kind, n, k, rows, knobs, exact=exact,
                                                          vnni=x86.has_vnni(tgt, knobs.width))}),
                         target=tgt).mod["main"]
        row_format = x86.format_of(fmt.kind, exact).acts
        acts = [tvm.runtime.tensor(a) for a in x86.activation_rows(fmt.kind, x, exact)]
        calls["x86"] = (fn, [*acts, y])
        path = f"x86 {row_format}" if quantized else "x86 float"
    if args.element or not path:
        el = build_element(fmt.kind, n, k, rows)
        xt = tvm.runtime.tensor(x)
        tables = [tvm.runtime.tensor(a) for a in fmt.pack(raw, (n, k))[1:]]
        ye = tvm.runtime.empty((rows, n), "float32")
        calls["element"] = (lambda w, out: el(xt, w, *tables, out), [ye])
    # the ceiling on these very weight copies: the same bytes, tiles, threads and prefetch, no decode
    n_items = -(-n // knobs.tile_n)
    probe, nread = probe_kernel(weights[0].shape, str(weights[0].dtype), n_items, knobs.prefetch_kb,
                                knobs.prefetch_level)
    calls["probe"] = (probe, [tvm.runtime.empty((n_items, 8), "uint64")])
    rounds = _stream_times(calls, weights, args.repeat)
    best = {name: min(ts) for name, ts in rounds.items()}

    def rel_err(got, xf):
        want = xf @ w_f.T
        return float(np.abs(got.numpy()[:, :m] - want).max() / np.abs(want).max())

    r = {"type": ttype, "n": n, "k": k, "rows": rows, "weight_bytes": raw.nbytes, "probe_gbs": nread / best["probe"] / 1e9}
    if path:
        xf = activation.round_trip(x, row_format) if quantized else x.astype(np.float64)
        r.update(path=path, us=best["x86"] * 1e6, gbs=raw.nbytes / best["x86"] / 1e9, max_rel=rel_err(y, xf))
    if "element" in calls:
        r.update(element_us=best["element"] * 1e6, element_gbs=raw.nbytes / best["element"] / 1e9,
                 element_max_rel=rel_err(ye, x.astype(np.float64)))
        if not path:
            r.update(path="element", us=r["element_us"], gbs=r["element_gbs"], max_rel=r["element_max_rel"])
    # per round: the kernel's GB/s over the probe's right before or after it; the median of the rounds
    main = rounds["x86" if path and path != "element" else "element"]
    r["of_probe"] = float(np.median([raw.nbytes / nread * p / t for p, t in zip(rounds["probe"], main)]))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="llvm", choices=["llvm", "cuda", "rocm"])
    ap.add_argument("--arch", default=None, help="GPU arch (sm_90, gfx942); default: the target's lowest")
    ap.add_argument("--shapes", default=SHAPES, help="NxK,... (weight rows x row length)")
    ap.add_argument("--n", type=int, default=None, help="one shape: N (with --k)")
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--rows", type=int, default=1, help="activation rows (1 = decode GEMV, k+1 = verify)")
    ap.add_argument("--types", default=DEFAULT_TYPES, help=f"of {','.join(TYPES)}; 'codebook': {CODEBOOK_TYPES}")
    ap.add_argument("--exact", action="store_true", help="float activations for the integer formats too")
    ap.add_argument("--element", action="store_true", help="also time the TE element-expression kernel")
    ap.add_argument("--prefetch", type=int, default=None,
                    help="x86 kernels' software prefetch distance in KB (0: none; default: the kernels' default)")
    ap.add_argument("--width", type=int, default=None, choices=[32, 64],
                    help="x86 kernels' vector bytes (default: the CPU's widest, x86.vector_width)")
    ap.add_argument("--mapped", default=None, metavar="DIR",
                    help="weight copies in a memory-mapped file in DIR (page-cache pages) rather than allocated")
    ap.add_argument("--stream-mb", type=int, default=256, help="weight copies cycled per timing (MB)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of every kernel and of the numpy reference (TVM_NUM_THREADS; default: it, or all cores)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.types = CODEBOOK_TYPES if args.types == "codebook" else args.types
    import os

    args.threads = args.threads or int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count())
    os.environ["TVM_NUM_THREADS"] = str(args.threads)      # before TVM's thread pool starts
    shapes = [(args.n, args.k)] if args.n else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rng = np.random.default_rng(0)
    if args.target != "llvm":
        return gpu_main(args, shapes, rng)
    import gguf

    bw0, np0 = read_bandwidth(), numpy_read_bandwidth(args.threads)
    print(f"{args.threads} thread(s), rows = {args.rows}, load average {os.getloadavg()[0]:.2f}; read bandwidth: "
          f"TVM sum of 1 GiB {bw0:.1f} GB/s, numpy sum of 512 MB (bench/realwidth.py) {np0:.1f} GB/s")
    print("GB/s = GGUF weight bytes / time; probe = a read of the same weight copies with the same tiles, threads "
          "and prefetch, no decode")
    print(f"{'type':7} {'N x K':>13} {'path':10} {'us':>9} {'GB/s':>6} {'probe':>6} {'of probe':>8} {'of numpy':>8} "
          f"{'vs Q8_0':>7}  {'element GB/s':>12} {'x elem':>6}  {'max rel':>8}")
    results, q8 = [], {}
    types = args.types.split(",")
    for ttype in ["Q8_0"] + [t for t in types if t != "Q8_0"]:   # Q8_0 first: the "vs Q8_0" baseline per shape
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ttype]][0]
        for n, k in shapes:
            if k % block:
                continue
            r = cpu_case(ttype, n, k, args.rows, args, rng)
            if ttype == "Q8_0":
                q8[(n, k)] = r["gbs"]
            r["vs_q8_0"] = r["gbs"] / q8[(n, k)]
            if "element_gbs" in r:
                r["vs_element"] = r["gbs"] / r["element_gbs"]
            if ttype not in types:
                continue
            results.append(r)
            el = f"{r['element_gbs']:12.2f} {r['vs_element']:6.2f}" if "element_gbs" in r else " " * 19
            print(f"{ttype:7} {f'{n}x{k}':>13} {r['path']:10} {r['us']:9.0f} {r['gbs']:6.2f} {r['probe_gbs']:6.2f} "
                  f"{r['of_probe']:8.3f} {r['gbs'] / np0:8.3f} {r['vs_q8_0']:7.3f}  {el}  {r['max_rel']:8.1e}",
                  flush=True)
    bw1, np1 = read_bandwidth(), numpy_read_bandwidth(args.threads)
    for r in results:
        r["of_read"], r["of_numpy"] = r["gbs"] / min(bw0, bw1), r["gbs"] / min(np0, np1)
    print(f"again: TVM sum {bw1:.1f} GB/s, numpy {np1:.1f} GB/s, load average {os.getloadavg()[0]:.2f} ('of numpy' "
          f"above used the first; the JSON's of_read / of_numpy use the smaller)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": "llvm", "rows": args.rows, "threads": args.threads, "read_gbs": [bw0, bw1],
                       "numpy_read_gbs": [np0, np1], "loadavg": os.getloadavg(), "results": results}, f, indent=1)


def gpu_main(args, shapes, rng):
    import tvm

    from nextn.common.quant import by_ggml_type

    dev = {"cuda": tvm.cuda, "rocm": tvm.rocm}[args.target]()
    if not dev.exist:
        raise SystemExit(f"no {args.target} device here: the GPU mode runs on the GPU machine")
    from nextn.common.measure import copy_bandwidth

    copy_gbs = copy_bandwidth(dev, 1 << 30) / 1e9
    print(f"{args.target} copy bandwidth {copy_gbs:.0f} GB/s; rows = {args.rows}")
    results = []
    for ttype in args.types.split(","):
        fmt = by_ggml_type(ttype)
        for n, k in shapes:
            raw = random_raw(ttype, n, k, rng)
            packed = [tvm.runtime.tensor(a, dev) for a in fmt.pack(raw, (n, k))]
            lib = build_element(fmt.kind, n, k, args.rows, args.target, args.arch)
            x = tvm.runtime.tensor(rng.standard_normal((args.rows, k)).astype(np.float32), dev)
            out = tvm.runtime.empty((args.rows, n), "float32", dev)
            t = min(lib.mod.time_evaluator("gemv", dev, number=5, repeat=args.repeat)(x, *packed, out).results)
            r = {"type": ttype, "n": n, "k": k, "us": t * 1e6, "gbs": raw.nbytes / t / 1e9}
            r["fraction_of_copy"] = r["gbs"] / copy_gbs
            results.append(r)
            print(f"{ttype:7} {f'{n}x{k}':>13} {r['us']:9.0f} {r['gbs']:7.1f} {r['fraction_of_copy']:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "rows": args.rows, "copy_gbs": copy_gbs, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
