"""The activation row quantizers of the integer path ("q8" rows for the super-block formats, "q8_0" rows for the
32-block ones, each also in the lane order of the IQ4 kernels); their numpy statement is
`nextn.common.quant.activation`."""
from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from nextn.common.quant.activation import AMAX_MIN, IQ4XS_ORDER, Q4K_ORDER

from .vec import const, ramp

_WHERE = {int(e): p for p, e in enumerate(IQ4XS_ORDER)}     # value index in a block of 256 -> its position
_WHERE_Q4K = {int(e): p for p, e in enumerate(Q4K_ORDER)}    # the same for a "q8_q4k" block


def _block(x, t, off, B):
    """(d, [int32 x 16 quants]) of the B values of row t from `off`: d = amax / 127, q = round-half-even(x * 127 /
    amax), q = 0 where amax = 0; an amax below AMAX_MIN is taken as 0 (the GPU's flushed subnormals: activation.py)."""
    f0 = const(0.0, "float32", 16)
    m = T.decl_buffer((16,), "float32")
    T.buffer_store(m, f0, [ramp(0, 16)])
    for g in range(B // 16):
        v = x[t, ramp(off + 16 * g, 16)]
        T.buffer_store(m, tirx.max(m[ramp(0, 16)], tirx.Select(v < f0, -v, v)), [ramp(0, 16)])
    amax = T.Bind(tirx.call_llvm_pure_intrin("float32", "llvm.vector.reduce.fmax", m[ramp(0, 16)]))
    amax = T.Bind(tirx.Select(amax < const(float(AMAX_MIN), "float32"), const(0.0, "float32"), amax))
    inv = T.Bind(tirx.Select(amax > const(0.0, "float32"), const(127.0, "float32") / amax, const(0.0, "float32")))
    qs = []
    for g in range(B // 16):
        v = x[t, ramp(off + 16 * g, 16)] * tirx.Broadcast(inv, 16)
        qs.append(T.Bind(tirx.Cast("int32x16", tirx.call_llvm_pure_intrin("float32x16", "llvm.roundeven", v))))
    return amax / const(127.0, "float32"), qs


def _ordered(xq, t, base, first, qs, lane_sums):
    """Store the quants of values first.. of a block of 256 at their IQ4XS_ORDER positions from `base` (runs of 4
    stay together: one 4-byte store each) and add each run's sum to its int32 lane's terms."""
    for g, q in enumerate(qs):
        for j in range(4):
            p = _WHERE[first + 16 * g + 4 * j]
            run = tirx.Shuffle([q], list(range(4 * j, 4 * j + 4)))
            T.buffer_store(xq, tirx.Cast("int8x4", run), [t, ramp(base + p, 4)])
            lane_sums[p % 64 // 4].append(tirx.call_llvm_pure_intrin("int32", "llvm.vector.reduce.add", run))


def _store_offsets(xc, t, base, lane_sums):
    for lane, terms in enumerate(lane_sums):
        total = terms[0]
        for v in terms[1:]:
            total = total + v
        T.buffer_store(xc, total * const(-128, "int32"), [t, base + lane])


def _position(row_format, g):
    """Where the 16 values 16g .. 16g + 16 of a block go in a row of `row_format` (16g, or by Q4K_ORDER, which
    keeps runs of 32 together)."""
    return _WHERE_Q4K[16 * g] if row_format == "q8_q4k" else 16 * g


def quantize_rows(K: int, rows: int | None = None, name: str = "quantize_q8", row_format: str = "q8"):
    """x float32 [T, K] -> the activation arguments of `row_format` (kernel.act_args), per B values (B = 256 for
    "q8", 32 for "q8_0") d = amax / 127 and q = round-half-even(x * (127 / amax)) (q = 0 where amax = 0):
    "q8": xq int8 [T, K], xd float32 [T, K/256], xs int16 [T, K/16] (sums of q over 16);
    "q8_q4k": the "q8" row with xq in Q4K_ORDER per 256 (xs as in "q8");
    "q8_iq4xs": xq in IQ4XS_ORDER per 256, xd, xc int32 [T, K/16] (-128 x the sums over each int32 lane);
    "q8_0": xq, xd float32 [T, K/32];
    "q8_0_g8": the "q8_0" row with each full group of 8 blocks in IQ4XS_ORDER (the blocks after them as they are),
    xd, xl float32 [T, K/256*16] (each int32 lane's d in the groups), xc int32 [T, K/256*16]
    (activation.quantize_q8_0_g8)."""
    B = 32 if row_format.startswith("q8_0") else 256
    G = K // 256
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True, "tirx.is_scheduled": True})
            Tr = tirx.Var("T", "int64") if rows is None else rows
            x = T.arg("x", T.buffer((Tr, K), "float32", align=32))
            xq = T.arg("xq", T.buffer((Tr, K), "int8", align=32))
            xd = T.arg("xd", T.buffer((Tr, K // B), "float32", align=32))
            if row_format in ("q8", "q8_q4k"):
                xs = T.arg("xs", T.buffer((Tr, K // 16), "int16", align=32))
            if row_format == "q8_iq4xs":
                xc = T.arg("xc", T.buffer((Tr, K // 16), "int32", align=32))
            if row_format == "q8_0_g8":
                xl = T.arg("xl", T.buffer((Tr, G * 16), "float32", align=32))
                xc = T.arg("xc", T.buffer((Tr, G * 16), "int32", align=32))
            with T.sblock("root"):
                with T.serial(0, Tr) as t:
                    if row_format == "q8_0_g8":
                        with T.serial(0, G) as gi:
                            lane_sums = [[] for _ in range(16)]
                            for b in range(8):
                                d, qs = _block(x, t, 256 * gi + 32 * b, 32)
                                d = T.Bind(d)
                                T.buffer_store(xd, d, [t, 8 * gi + b])
                                for lane in range(16):
                                    if lane // 4 + 4 * (lane % 4 // 2) == b:
                                        T.buffer_store(xl, d, [t, 16 * gi + lane])
                                _ordered(xq, t, 256 * gi, 32 * b, qs, lane_sums)
                            _store_offsets(xc, t, 16 * gi, lane_sums)
                        first = 8 * G
                    else:
                        first = 0
                    with T.serial(first, K // B) as s:
                        d, qs = _block(x, t, B * s, B)
                        T.buffer_store(xd, d, [t, s])
                        if row_format == "q8_iq4xs":
                            lane_sums = [[] for _ in range(16)]
                            _ordered(xq, t, B * s, 0, qs, lane_sums)
                            _store_offsets(xc, t, 16 * s, lane_sums)
                        for g, q in enumerate(qs if row_format != "q8_iq4xs" else []):
                            T.buffer_store(xq, tirx.Cast("int8x16", q), [t, ramp(B * s + _position(row_format, g), 16)])
                            if row_format in ("q8", "q8_q4k"):
                                T.buffer_store(xs, tirx.Cast("int16", tirx.call_llvm_pure_intrin(
                                    "int32", "llvm.vector.reduce.add", q)), [t, (B // 16) * s + g])
    return ib.get()


def quantize_rows_q8_0(K: int, rows: int | None = None, name: str = "quantize_q8_0"):
    """The "q8_0" rows of the 32-block integer kernels: `quantize_rows` with blocks of 32 and no sums."""
    return quantize_rows(K, rows, name, "q8_0")
