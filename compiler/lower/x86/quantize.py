"""The activation row quantizer of the integer path; its numpy statement is `nextn.common.quant.activation`."""
from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script import builder as T

from .vec import const, ramp


def quantize_rows(K: int, rows: int | None = None, name: str = "quantize_q8"):
    """x float32 [T, K] -> xq int8 [T, K], xd float32 [T, K/256], xs int16 [T, K/16]: per 256 values
    d = amax / 127 and q = round-half-even(x * (127 / amax)) (q = 0 where amax = 0); xs = sums of q over 16."""
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True, "tirx.is_scheduled": True})
            Tr = tirx.Var("T", "int64") if rows is None else rows
            x = T.arg("x", T.buffer((Tr, K), "float32", align=32))
            xq = T.arg("xq", T.buffer((Tr, K), "int8", align=32))
            xd = T.arg("xd", T.buffer((Tr, K // 256), "float32", align=32))
            xs = T.arg("xs", T.buffer((Tr, K // 16), "int16", align=32))
            with T.sblock("root"):
                f0 = const(0.0, "float32", 16)
                with T.serial(0, Tr) as t:
                    with T.serial(0, K // 256) as s:
                        m = T.decl_buffer((16,), "float32")
                        T.buffer_store(m, f0, [ramp(0, 16)])
                        for g in range(16):
                            v = x[t, ramp(256 * s + 16 * g, 16)]
                            T.buffer_store(m, tirx.max(m[ramp(0, 16)], tirx.Select(v < f0, -v, v)), [ramp(0, 16)])
                        amax = T.Bind(tirx.call_llvm_pure_intrin("float32", "llvm.vector.reduce.fmax", m[ramp(0, 16)]))
                        T.buffer_store(xd, amax / const(127.0, "float32"), [t, s])
                        inv = T.Bind(tirx.Select(amax > const(0.0, "float32"), const(127.0, "float32") / amax,
                                                 const(0.0, "float32")))
                        for g in range(16):
                            v = x[t, ramp(256 * s + 16 * g, 16)] * tirx.Broadcast(inv, 16)
                            q = T.Bind(tirx.Cast("int32x16", tirx.call_llvm_pure_intrin("float32x16", "llvm.roundeven", v)))
                            T.buffer_store(xq, tirx.Cast("int8x16", q), [t, ramp(256 * s + 16 * g, 16)])
                            T.buffer_store(xs, tirx.Cast("int16", tirx.call_llvm_pure_intrin("int32", "llvm.vector.reduce.add", q)),
                                           [t, 16 * s + g])
    return ib.get()
