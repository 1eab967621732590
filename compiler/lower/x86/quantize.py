"""The activation row quantizers of the integer path ("q8" rows for the super-block formats, "q8_0" rows for the
32-block ones); their numpy statement is `nextn.common.quant.activation`."""
from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from .vec import const, ramp


def quantize_rows(K: int, rows: int | None = None, name: str = "quantize_q8", row_format: str = "q8"):
    """x float32 [T, K] -> xq int8 [T, K], xd float32 [T, K/B] (B = 256 for "q8", 32 for "q8_0"), and for "q8"
    xs int16 [T, K/16]: per B values d = amax / 127 and q = round-half-even(x * (127 / amax)) (q = 0 where
    amax = 0); xs = sums of q over 16."""
    B = 256 if row_format == "q8" else 32
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True, "tirx.is_scheduled": True})
            Tr = tirx.Var("T", "int64") if rows is None else rows
            x = T.arg("x", T.buffer((Tr, K), "float32", align=32))
            xq = T.arg("xq", T.buffer((Tr, K), "int8", align=32))
            xd = T.arg("xd", T.buffer((Tr, K // B), "float32", align=32))
            xs = T.arg("xs", T.buffer((Tr, K // 16), "int16", align=32)) if row_format == "q8" else None
            with T.sblock("root"):
                f0 = const(0.0, "float32", 16)
                with T.serial(0, Tr) as t:
                    with T.serial(0, K // B) as s:
                        m = T.decl_buffer((16,), "float32")
                        T.buffer_store(m, f0, [ramp(0, 16)])
                        for g in range(B // 16):
                            v = x[t, ramp(B * s + 16 * g, 16)]
                            T.buffer_store(m, tirx.max(m[ramp(0, 16)], tirx.Select(v < f0, -v, v)), [ramp(0, 16)])
                        amax = T.Bind(tirx.call_llvm_pure_intrin("float32", "llvm.vector.reduce.fmax", m[ramp(0, 16)]))
                        T.buffer_store(xd, amax / const(127.0, "float32"), [t, s])
                        inv = T.Bind(tirx.Select(amax > const(0.0, "float32"), const(127.0, "float32") / amax,
                                                 const(0.0, "float32")))
                        for g in range(B // 16):
                            v = x[t, ramp(B * s + 16 * g, 16)] * tirx.Broadcast(inv, 16)
                            q = T.Bind(tirx.Cast("int32x16", tirx.call_llvm_pure_intrin("float32x16", "llvm.roundeven", v)))
                            T.buffer_store(xq, tirx.Cast("int8x16", q), [t, ramp(B * s + 16 * g, 16)])
                            if xs is not None:
                                T.buffer_store(xs, tirx.Cast("int16", tirx.call_llvm_pure_intrin(
                                    "int32", "llvm.vector.reduce.add", q)), [t, (B // 16) * s + g])
    return ib.get()


def quantize_rows_q8_0(K: int, rows: int | None = None, name: str = "quantize_q8_0"):
    """The "q8_0" rows of the 32-block integer kernels: `quantize_rows` with blocks of 32 and no sums."""
    return quantize_rows(K, rows, name, "q8_0")
