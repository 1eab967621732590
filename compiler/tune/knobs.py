"""`nextn tune` for the hand-written x86 kernels (compiler/lower/x86): a grid over their knobs, timed on this CPU.

meta_schedule has nothing to search in a kernel that is already written loop by loop, so these kernels expose
their few knobs (`x86.Knobs`: vector width, weight tile, row group, unroll) and the tuner times every admissible
combination on the kernel's real shape, with enough copies of the weight to stream it from memory as the model
does (a one-row decode kernel that fits in cache would time its arithmetic, not its bandwidth). A record is
kept only when it beats the default knobs measured in the same run, so a log never makes a kernel slower.
"""
from __future__ import annotations

import itertools
import time

import numpy as np

STREAM_BYTES = 96 << 20      # weight copies cycled per timing: well past this CPU's 32 MB L3
ROW_COUNTS = {None: 4}       # rows used to time a symbolic-T kernel (a verify of 3 drafts + 1)


def candidates(spec, width: int):
    """Admissible knob sets for `spec` on a CPU whose widest vectors are `width` bytes."""
    from nextn.compiler.lower import x86

    widths = sorted({32, width})
    tiles = (8, 16, 32, 64)
    groups = (1,) if spec.rows == 1 else (2, 4, 8)
    unrolls = (1, 2, 4) if spec.kind in x86.FLOAT_KINDS else (1,)
    for w, t, g, u in itertools.product(widths, tiles, groups, unrolls):
        if spec.kind in x86.FLOAT_KINDS and (spec.K // 32) < u:
            continue
        yield x86.Knobs(width=w, tile_n=t, row_group=g, unroll=u)


def _random_args(spec, copies: int, seed: int = 0):
    """Weight copies (valid blocks: finite f16 scales) and activation / output buffers for one timing."""
    import tvm

    from nextn.common.quant import activation
    from nextn.compiler.lower import x86

    rng = np.random.default_rng(seed)
    lead = (spec.X, spec.N) if spec.op == "matmul_id" else (spec.N,)
    shape, dtype = x86.weight_arg(spec.kind, lead, spec.K)
    weights = []
    for _ in range(copies):
        if dtype == "uint8":
            w = rng.integers(0, 256, shape, dtype=np.uint8)
            w = _finite_scales(spec.kind, w)
        elif dtype == "float32":
            w = rng.standard_normal(shape).astype(np.float32)
        else:   # float16 / bf16 bits: values of modest size
            w = (rng.standard_normal(shape).astype(np.float32) * 0.05).astype(np.float16)
            w = w if dtype == "float16" else (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        weights.append([tvm.runtime.tensor(w) for _ in range(spec.n_weights)])
    rows = spec.rows or ROW_COUNTS[None]
    x_rows = rows if spec.op == "matmul" or spec.shared_x else rows * spec.n_used
    x = rng.standard_normal((x_rows, spec.K)).astype(np.float32)
    acts = list(activation.quantize(x)) if spec.kind in x86.INT_KINDS else [x]
    acts = [tvm.runtime.tensor(a) for a in acts]
    if spec.op == "matmul":
        outs = [tvm.runtime.empty((rows, spec.N), "float32")]
        extra = []
    else:
        ids = np.stack([rng.permutation(spec.X)[:spec.n_used] for _ in range(rows)]).astype(np.int32)
        extra = [tvm.runtime.tensor(ids)]
        outs = [tvm.runtime.empty((rows, spec.n_used, spec.N), "float32") for _ in range(spec.n_weights)]
    return weights, acts, extra, outs


def _finite_scales(kind: str, raw: np.ndarray) -> np.ndarray:
    """Random block bytes with the f16 scale fields set to small finite values (random bits can be inf/NaN)."""
    import gguf

    gt = gguf.GGMLQuantizationType[kind.upper()]
    block, size = gguf.GGML_QUANT_SIZES[gt]
    offsets = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,), "Q8_0": (0,), "IQ4_NL": (0,)}[kind.upper()]
    b = raw.reshape(-1, size)
    for off in offsets:
        b[:, off:off + 2] = np.full(len(b), 0.01, np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def build_kernel(spec, knobs, target):
    """`spec` built with `knobs` for `target`: a callable (weights..., acts..., extra..., outs...)."""
    import tvm

    return tvm.compile(tvm.IRModule({"main": spec.build(knobs)}), target=target).mod["main"]


def stream_args(spec):
    """`_random_args` with enough weight copies (STREAM_BYTES) that a timing streams the weight from memory."""
    return _random_args(spec, max(1, -(-STREAM_BYTES // spec.weight_bytes())))


def time_kernel(spec, knobs, target, rounds: int = 3, args=None, fn=None) -> float:
    """Seconds per call of `spec` built with `knobs` (or the already built `fn`): best of `rounds` passes over
    the weight copies."""
    fn = fn or build_kernel(spec, knobs, target)
    weights, acts, extra, outs = args if args is not None else stream_args(spec)
    fn(*weights[0], *acts, *extra, *outs)   # warm-up (thread pool, first touch)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for ws in weights:
            fn(*ws, *acts, *extra, *outs)
        best = min(best, (time.perf_counter() - t0) / len(weights))
    return best


def search(spec, target, width: int, log=print):
    """(default seconds, best knobs, best seconds) for `spec`; the default is timed in the same run."""
    from nextn.compiler.lower import x86

    args = stream_args(spec)
    default = x86.default_knobs(spec, width)
    t_default = time_kernel(spec, default, target, args=args)
    best, t_best = default, t_default
    for kb in candidates(spec, width):
        if kb == default:
            continue
        t = time_kernel(spec, kb, target, args=args)
        if t < t_best:
            best, t_best = kb, t
    t_default = min(t_default, time_kernel(spec, default, target, args=args))   # once more: fair to the default
    return t_default, best, t_best
