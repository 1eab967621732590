"""`nextn tune` for the hand-written x86 kernels (compiler/lower/x86): a grid over their knobs, timed on this CPU.

meta_schedule has nothing to search in a kernel that is already written loop by loop, so these kernels expose
their few knobs (`x86.Knobs`) and the tuner times every admissible combination on the kernel's real shape, with
enough copies of the weight to stream it from memory as the model does (a one-row decode kernel that fits in cache
would time its arithmetic, not its bandwidth), at the row counts the model calls it with: 1 for the one-row
entry points, the verify rows (2-4) and, where prefill calls it with the prompt's rows, a prefill chunk (512).

Two phases per kernel (compiler/tune/decide.py says why and how a record is judged):
    screen   a sweep over one knob at a time, each knob set timed once per row count, the default re-timed after
             every few sets; the `finalists` that look fastest against the default nearest in time go on
    confirm  `rounds` interleaved rounds of default, finalists, default; a finalist is kept only when it beats
             the default by more than the default's own back-to-back noise, else the default stays.

The search follows `x86.Knobs` generically: `SPACE` gives the values searched for the knobs it knows; any other
field (a knob a newer kernel adds) is searched over the `choices` of its dataclass metadata, else left at the
default. Arguments are made from the built PrimFunc's parameters (weights `w*`, expert ids `ids`, outputs `y*`,
anything else random of its dtype), so a kernel with other activation arguments needs no change here.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from . import decide

STREAM_BYTES = 96 << 20      # weight copies cycled per timing: well past this CPU's 32 MB L3
VERIFY_ROWS = (2, 3, 4)      # a verify of 1-3 drafts + the bonus row
PREFILL_ROWS = 512           # one prefill chunk
MIN_TIMING_S = 0.03          # passes over the weight copies per timing: until this much time (at most MAX_PASSES)
MAX_PASSES = 5
SCREEN_BLOCK = 4             # candidates between two default timings while screening


def space(spec, width: int, l1d: int = 32) -> dict:
    """{knob field: values searched} for `spec` on a CPU whose widest vectors are `width` bytes. A knob that
    cannot change the kernel is searched at its default only (row_group with one row; unroll on integer formats,
    whose block loop does not read it; w_rows on formats whose row functions take one weight row), and so is a
    knob that changes the bits of a row (`x86.bit_knobs`: a weight's decode and verify kernels, tuned apart,
    must give equal rows). `l1d`: the target's L1 data cache in KB (x86.l1d_kb: the default's fit_kb)."""
    from nextn.compiler.lower import x86

    default = x86.default_knobs(spec, width, l1d)
    fixed = x86.bit_knobs(spec)
    known = {
        "width": sorted({32, width}),
        "tile_n": (8, 16, 32, 64),
        "row_group": (default.row_group,) if spec.rows == 1 else (2, 4, 8),
        "unroll": tuple(u for u in (1, 2, 4) if spec.K // 32 >= u) if spec.acts == "f32"
        else (default.unroll,),
        "w_rows": None if x86.takes_w_rows(spec) else (default.w_rows,),
    }
    out = {}
    for f in dataclasses.fields(x86.Knobs):
        d = getattr(default, f.name)
        vals = (d,) if f.name in fixed else known.get(f.name) or tuple(f.metadata.get("choices", ())) or (d,)
        out[f.name] = tuple(vals) if d in vals else (d, *vals)
    return out


def rows_for(spec, prefill: bool, verify_rows=VERIFY_ROWS, prefill_rows=PREFILL_ROWS) -> list[int]:
    """Row counts `spec` is timed at: its static count, or the verify rows (+ a prefill chunk when `prefill`)."""
    if spec.rows is not None:
        return [spec.rows]
    return list(verify_rows) + ([prefill_rows] if prefill and prefill_rows else [])


def _finite_scales(kind: str, raw: np.ndarray) -> np.ndarray:
    """Random block bytes with the f16 scale fields set to small finite values (random bits can be inf/NaN)."""
    import gguf

    offsets = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,), "Q8_0": (0,), "IQ4_NL": (0,)}
    gt = getattr(gguf.GGMLQuantizationType, kind.upper(), None)
    if gt is None or kind.upper() not in offsets:
        return raw
    _block, size = gguf.GGML_QUANT_SIZES[gt]
    b = raw.reshape(-1, size)
    for off in offsets[kind.upper()]:
        b[:, off:off + 2] = np.full(len(b), 0.01, np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def _random_weight(kind, shape, dtype, rng):
    if dtype == "uint8":
        return _finite_scales(kind, rng.integers(0, 256, shape, dtype=np.uint8))
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal(shape).astype(np.float32) * 0.05).astype(np.float16)   # float16 / bf16 bits
    return w if dtype == "float16" else (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def build_kernel(spec, knobs, target):
    """`spec` built with `knobs` for `target` as compile builds it (VNNI where the target has it at the knobs'
    width): a callable taking the PrimFunc's arguments in order."""
    import tvm

    from nextn.compiler.lower import x86

    func = spec.build(knobs, x86.has_vnni(target, knobs.width))
    return tvm.compile(tvm.IRModule({"main": func}), target=target).mod["main"]


class KernelBench:
    """Times `spec` built with any knobs, at any row count, on the same buffers: `time(knobs, rows)` → seconds
    per call, the best of a few passes over the weight copies (≥ MIN_TIMING_S, ≤ MAX_PASSES). Kernels are built
    once per knob set; a knob set that fails to build raises from `time`."""

    def __init__(self, spec, target, seed: int = 0):
        from nextn.compiler.lower import x86

        self.spec, self.target = spec, target
        self.rng = np.random.default_rng(seed)
        self.params = list(spec.build(x86.Knobs()).params)
        copies = max(1, -(-STREAM_BYTES // spec.weight_bytes()))
        # routed experts: a call reads only the chosen experts, so the calls also cycle through sets of expert ids
        # until STREAM_BYTES of distinct expert rows are read (one copy of a big expert tensor is enough then)
        read = spec.weight_bytes() * (min(1.0, spec.n_used / spec.X) if spec.op == "matmul_id" else 1.0)
        self.n_calls = max(copies, min(64, -(-STREAM_BYTES // max(1, int(read)))))
        self.weight_idx = [i for i, p in enumerate(self.params) if p.name.startswith("w")]
        self.weights = [[self._tensor(self.params[i], None) for i in self.weight_idx] for _ in range(copies)]
        self._fns: dict = {}
        self._calls: dict = {}
        self._warm: set = set()

    def _shape(self, p, rows):
        from tvm import tirx
        from tvm.sym import Analyzer

        a = Analyzer()
        out = []
        for d in p.shape:
            if not isinstance(d, tirx.IntImm):
                for v in tirx.analysis.undefined_vars(d):
                    a.bind(v, tirx.IntImm(str(v.ty.dtype), rows))
                d = a.simplify(d)
            out.append(int(d))
        return tuple(out)

    def _tensor(self, p, rows):
        import tvm

        shape, dtype, rng = self._shape(p, rows), str(p.dtype), self.rng
        if p.name.startswith("w"):
            a = _random_weight(self.spec.kind, shape, dtype, rng)
        elif p.name == "ids":      # distinct experts per row, as the router picks them
            a = np.stack([rng.permutation(self.spec.X)[:shape[-1]] for _ in range(shape[0])]).astype(np.int32)
        elif p.name.startswith("y"):
            return tvm.runtime.empty(shape, dtype)
        elif dtype.startswith("int") or dtype.startswith("uint"):
            info = np.iinfo(dtype)
            a = rng.integers(max(info.min, -127), min(info.max, 127) + 1, shape).astype(dtype)
        else:                      # activation rows, their scales: values of modest size
            a = rng.standard_normal(shape).astype(dtype)
        return tvm.runtime.tensor(a)

    def fn(self, knobs):
        if knobs not in self._fns:
            self._fns[knobs] = build_kernel(self.spec, knobs, self.target)
        return self._fns[knobs]

    def _args(self, rows):
        """The argument lists of one pass at `rows` rows: weight copies and expert id sets in turn, the same
        activations and outputs."""
        if rows not in self._calls:
            rest = {i: self._tensor(p, rows) for i, p in enumerate(self.params) if i not in self.weight_idx}
            ids = [i for i, p in enumerate(self.params) if p.name == "ids"]
            calls = []
            # a prefill chunk reads each weight tile once for many rows: compute, not the stream, dominates
            for c in range(self.n_calls if rows <= 16 else min(self.n_calls, 4)):
                args = dict(rest)
                args.update(zip(self.weight_idx, self.weights[c % len(self.weights)]))
                if c and ids:
                    args[ids[0]] = self._tensor(self.params[ids[0]], rows)
                calls.append([args[i] for i in range(len(self.params))])
            self._calls[rows] = calls
        return self._calls[rows]

    def time(self, knobs, rows: int) -> float:
        f = self.fn(knobs)
        calls = self._args(rows)
        if (knobs, rows) not in self._warm:       # first call: thread pool, first touch of the outputs
            f(*calls[0])
            self._warm.add((knobs, rows))
        best, total, passes = math.inf, 0.0, 0
        while passes < 1 or (total < MIN_TIMING_S and passes < MAX_PASSES):
            t0 = time.perf_counter()
            for a in calls:
                f(*a)
            dt = time.perf_counter() - t0
            best, total, passes = min(best, dt / len(calls)), total + dt, passes + 1
        return best


@dataclasses.dataclass
class Result:
    """The search's answer for one kernel: `knobs` (the best challenger), `outcome` (its comparison with the
    default; `outcome.kept` says whether the log should use it), candidates tried / failed to build."""
    default: object
    knobs: object
    outcome: decide.Outcome
    tried: int
    failed: int
    seconds: float


def search(spec, width: int, time_fn, rows: list[int], rounds: int = 5, finalists: int = 3,
           min_gain: float = decide.MIN_GAIN, l1d: int = 32) -> Result:
    """Screen the knob sets of `spec` one knob at a time, confirm the `finalists` fastest-looking against the
    default in `rounds` interleaved rounds at each of `rows` (decide.interleaved). `time_fn(knobs, rows)` →
    seconds per call (KernelBench.time, or a fake clock in tests); an exception from it counts the knob set as
    failed to build. `l1d`: as in `space`.

    Screening is a coordinate sweep: for each knob in turn, every value with the other knobs at the best set so
    far, each timed once per row count with the default re-timed after every SCREEN_BLOCK sets (a set's score:
    the geometric mean over row counts of the default's mean timing on either side / its timing). A kernel build
    costs seconds, so the sweep builds sum(values - 1) sets rather than the grid's product."""
    from nextn.compiler.lower import x86

    t_start = time.perf_counter()
    default = x86.default_knobs(spec, width, l1d)
    sp = space(spec, width, l1d)
    screen, failed, tried = {default: 1.0}, 0, {default}

    def timings(kb):
        return {r: time_fn(kb, r) for r in rows}

    d_before = [timings(default)]

    def screen_block(block):
        nonlocal failed
        for i in range(0, len(block), SCREEN_BLOCK):
            timed = []
            for kb in block[i:i + SCREEN_BLOCK]:
                try:
                    timed.append((kb, timings(kb)))
                except Exception:   # a knob set this kernel cannot be built with (a newer knob's odd value)
                    failed += 1
            after = timings(default)
            for kb, t in timed:
                screen[kb] = decide.geomean((d_before[0][r] + after[r]) / 2 / t[r] for r in rows)
            d_before[0] = after

    cur = default
    for f in sp:
        block = [dataclasses.replace(cur, **{f: v}) for v in sp[f]]
        block = [kb for kb in block if kb not in tried]
        tried.update(block)
        screen_block(block)
        # move on from the best set so far only for a clear gain, not for noise on a knob that does not matter
        better = [kb for kb in block if kb in screen and screen[kb] > screen[cur] * (1 + min_gain)]
        cur = max(better, key=lambda kb: screen[kb]) if better else cur
    ranked = sorted((kb for kb in screen if kb != default), key=lambda kb: -screen[kb])
    # the sweep's answer (changed only for clear gains) and the best-screened others
    top = list(dict.fromkeys(([cur] if cur != default else []) + [kb for kb in ranked if screen[kb] > 1]))
    top = top[:finalists] or ranked[:1]
    outcomes = decide.interleaved(time_fn, default, top, rows, rounds, min_gain)
    changed = lambda kb: sum(getattr(kb, f) != getattr(default, f) for f in sp)   # noqa: E731
    best, outcome = decide.best(outcomes, changed, min_gain)
    return Result(default, best, outcome, len(tried), failed, time.perf_counter() - t_start)
