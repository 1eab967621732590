"""The activation row quantizers of the integer path ("q8" rows for the super-block formats, "q8_0" rows for the
32-block ones); their numpy statement is `nextn.common.quant.activation`."""
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


def quantize_rows_q8_0(K: int, rows: int | None = None, name: str = "quantize_q8_0"):
    """x float32 [T, K] -> xq int8 [T, K], xd float32 [T, K/32]: the "q8_0" rows of the 32-block integer
    kernels, per 32 values the rule of `quantize_rows` (no sums)."""
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name(name)
            T.func_attr({"global_symbol": name, "tirx.noalias": True, "tirx.is_scheduled": True})
            Tr = tirx.Var("T", "int64") if rows is None else rows
            x = T.arg("x", T.buffer((Tr, K), "float32", align=32))
            xq = T.arg("xq", T.buffer((Tr, K), "int8", align=32))
            xd = T.arg("xd", T.buffer((Tr, K // 32), "float32", align=32))
            with T.sblock("root"):
                f0 = const(0.0, "float32", 16)
                with T.serial(0, Tr) as t:
                    with T.serial(0, K // 32) as s:
                        v0, v1 = x[t, ramp(32 * s, 16)], x[t, ramp(32 * s + 16, 16)]
                        m = tirx.max(tirx.Select(v0 < f0, -v0, v0), tirx.Select(v1 < f0, -v1, v1))
                        amax = T.Bind(tirx.call_llvm_pure_intrin("float32", "llvm.vector.reduce.fmax", m))
                        T.buffer_store(xd, amax / const(127.0, "float32"), [t, s])
                        inv = T.Bind(tirx.Broadcast(tirx.Select(amax > const(0.0, "float32"),
                                                                const(127.0, "float32") / amax,
                                                                const(0.0, "float32")), 32))
                        v = x[t, ramp(32 * s, 32)] * inv
                        q = tirx.Cast("int32x32", tirx.call_llvm_pure_intrin("float32x32", "llvm.roundeven", v))
                        T.buffer_store(xq, tirx.Cast("int8x32", q), [t, ramp(32 * s, 32)])
    return ib.get()
