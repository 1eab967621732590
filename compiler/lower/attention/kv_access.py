"""KV cache element access for the kernels: the storage of each KV type and its in-kernel dequantization.

A KV cache is logically float32 `[C, H, D]` (cells, heads, head width); its storage depends on the type
(`nextn.common.kv_types`): f32 / f16 / bf16 keep `[C, H, D]` in that dtype; q8_0 keeps ggml's `block_q8_0`
bytes `[C, H, D/32 * 34]` (uint8): per block of 32 an f16 scale `d` (little-endian) then 32 int8 `qs`, value
`d * qs` (ggml-common.h `block_q8_0`, gguf-py `Q8_0` dequantize). Kernels read through `element` (one value) or
`stage_row` (a whole row, vectorized per block), and write with `store_kernel`.
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from nextn.common.kv_types import KV_TYPES, QK8_0

F32 = "float32"


def storage_dtype(kv_type: str) -> str:
    return KV_TYPES[kv_type].storage_dtype


def storage_width(kv_type: str, d: int) -> int:
    """Last storage dimension of a row of `d` values."""
    return KV_TYPES[kv_type].storage_shape((d,))[0]


def q8_0_scale(buf, c, h, b):
    """float32 scale of block b of row (c, h) of a q8_0 cache: the f16 in bytes 34 b, 34 b + 1 (little-endian)."""
    o = b * 34
    bits = tirx.bitwise_or(tirx.Cast("uint16", buf[c, h, o]), tirx.shift_left(tirx.Cast("uint16", buf[c, h, o + 1]),
                                                                             tirx.const(8, "uint16")))
    return tirx.Cast(F32, tirx.reinterpret("float16", bits))


def q8_0_quant(buf, c, h, d):
    """float32 of the int8 quant of element d of row (c, h) of a q8_0 cache."""
    return tirx.Cast(F32, tirx.reinterpret("int8", buf[c, h, (d // QK8_0) * 34 + 2 + d % QK8_0]))


def element(buf, kv_type: str, c, h, d):
    """The float32 value of element d of row (c, h): what the interpreter's cache holds there."""
    if kv_type == "q8_0":
        return q8_0_quant(buf, c, h, d) * q8_0_scale(buf, c, h, d // QK8_0)
    return tirx.Cast(F32, buf[c, h, d])


def store_kernel(kv_type: str, H: int, D: int, gpu: bool = False, pair: bool = False):
    """ggml set_rows into a cache [C, H, D] of `kv_type`: cache[pos[t], h, :] = rows[t, h, :] rounded to the type
    (in place).
    f16 / bf16: round to nearest even (ggml's GGML_FP32_TO_FP16 / _BF16). q8_0: ggml's quantize_row_q8_0_ref
    (ggml-quants.c) per block of 32: amax = max |x|, d = amax / 127, id = d ? 1/d : 0, qs = roundf(x * id) (half
    away from zero), d stored as f16. `gpu`: one thread block per row, one thread per value / block.
    `pair`: two caches of the same type and shape at the same positions in one kernel, (cache, cache2, rows, rows2,
    pos), each thread storing its value / block of both (a layer's K and V: one launch where there were two; the
    same stores, so the same bits)."""
    kt = KV_TYPES[kv_type]
    sdt = kt.storage_dtype
    W = kt.storage_shape((D,))[0]
    if gpu:
        outer = lambda n: T.thread_binding(n, thread="blockIdx.x")      # noqa: E731
        inner = lambda n: T.thread_binding(n, thread="threadIdx.x")     # noqa: E731
    else:
        outer = lambda n: T.parallel(n)                                 # noqa: E731
        inner = lambda n: T.serial(n)                                   # noqa: E731
    attrs = {"tirx.noalias": True, "tirx.is_scheduled": True}

    if kv_type != "q8_0":
        @T.macro
        def put(cache, rows, pos, vr, vk):
            cache[T.Cast("int64", pos[vr // H]), vr % H, vk] = T.Cast(sdt, rows[vr // H, vr % H, vk])

        @T.prim_func(private=True, s_tir=True)
        def set_rows(var_cache: T.handle, var_rows: T.handle, var_pos: T.handle):
            T.func_attr(attrs)
            c, t = T.int64(), T.int64()
            cache = T.match_buffer(var_cache, (c, H, D), sdt)
            rows = T.match_buffer(var_rows, (t, H, D), F32)
            pos = T.match_buffer(var_pos, (t,), "int32")
            for r in outer(t * H):
                for k in inner(D):
                    with T.sblock("set_rows"):
                        vr, vk = T.axis.remap("SS", [r, k])
                        put(cache, rows, pos, vr, vk)

        @T.prim_func(private=True, s_tir=True)
        def set_rows_pair(var_cache: T.handle, var_cache2: T.handle, var_rows: T.handle, var_rows2: T.handle,
                          var_pos: T.handle):
            T.func_attr(attrs)
            c, c2, t = T.int64(), T.int64(), T.int64()
            cache = T.match_buffer(var_cache, (c, H, D), sdt)
            cache2 = T.match_buffer(var_cache2, (c2, H, D), sdt)
            rows = T.match_buffer(var_rows, (t, H, D), F32)
            rows2 = T.match_buffer(var_rows2, (t, H, D), F32)
            pos = T.match_buffer(var_pos, (t,), "int32")
            for r in outer(t * H):
                for k in inner(D):
                    with T.sblock("set_rows_pair"):
                        vr, vk = T.axis.remap("SS", [r, k])
                        put(cache, rows, pos, vr, vk)
                        put(cache2, rows2, pos, vr, vk)
        return set_rows_pair if pair else set_rows

    def rnd(x):
        """roundf: half away from zero, exact (x - trunc(x) is exact in float32)."""
        tr = tirx.trunc(x)
        half = tirx.abs(x - tr) >= tirx.const(0.5, F32)
        return tr + tirx.if_then_else(half, tirx.if_then_else(x < tirx.const(0.0, F32), tirx.const(-1.0, F32),
                                                              tirx.const(1.0, F32)), tirx.const(0.0, F32))

    @T.macro
    def put_q8(cache, rows, pos, vr, vb, st):   # st: local [2], amax then id
        ti = vr // H
        hi = vr % H
        cell = T.Cast("int64", pos[ti])
        st[0] = T.float32(0)
        for e in range(QK8_0):
            st[0] = T.max(st[0], T.fabs(rows[ti, hi, vb * QK8_0 + e]))
        st[1] = T.if_then_else(st[0] / T.float32(127) == T.float32(0), T.float32(0),
                               T.float32(1) / (st[0] / T.float32(127)))
        cache[cell, hi, vb * 34] = T.Cast("uint8", T.bitwise_and(
            T.reinterpret("uint16", T.Cast("float16", st[0] / T.float32(127))), T.uint16(255)))
        cache[cell, hi, vb * 34 + 1] = T.Cast("uint8", T.shift_right(
            T.reinterpret("uint16", T.Cast("float16", st[0] / T.float32(127))), T.uint16(8)))
        for e in range(QK8_0):
            cache[cell, hi, vb * 34 + 2 + e] = T.reinterpret(
                "uint8", T.Cast("int8", rnd(rows[ti, hi, vb * QK8_0 + e] * st[1])))

    @T.prim_func(private=True, s_tir=True)
    def set_rows_q8_0(var_cache: T.handle, var_rows: T.handle, var_pos: T.handle):
        T.func_attr(attrs)
        c, t = T.int64(), T.int64()
        cache = T.match_buffer(var_cache, (c, H, W), "uint8")
        rows = T.match_buffer(var_rows, (t, H, D), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        for r in outer(t * H):
            for b in inner(D // QK8_0):
                with T.sblock("set_rows_q8_0"):
                    vr, vb = T.axis.remap("SS", [r, b])
                    T.reads(rows[vr // H, vr % H, vb * QK8_0:vb * QK8_0 + QK8_0], pos[vr // H])
                    T.writes(cache[T.Cast("int64", pos[vr // H]), vr % H, vb * 34:vb * 34 + 34])
                    st = T.alloc_buffer((2,), F32, scope="local")
                    put_q8(cache, rows, pos, vr, vb, st)

    @T.prim_func(private=True, s_tir=True)
    def set_rows_q8_0_pair(var_cache: T.handle, var_cache2: T.handle, var_rows: T.handle, var_rows2: T.handle,
                           var_pos: T.handle):
        T.func_attr(attrs)
        c, c2, t = T.int64(), T.int64(), T.int64()
        cache = T.match_buffer(var_cache, (c, H, W), "uint8")
        cache2 = T.match_buffer(var_cache2, (c2, H, W), "uint8")
        rows = T.match_buffer(var_rows, (t, H, D), F32)
        rows2 = T.match_buffer(var_rows2, (t, H, D), F32)
        pos = T.match_buffer(var_pos, (t,), "int32")
        for r in outer(t * H):
            for b in inner(D // QK8_0):
                with T.sblock("set_rows_q8_0_pair"):
                    vr, vb = T.axis.remap("SS", [r, b])
                    T.reads(rows[vr // H, vr % H, vb * QK8_0:vb * QK8_0 + QK8_0],
                            rows2[vr // H, vr % H, vb * QK8_0:vb * QK8_0 + QK8_0], pos[vr // H])
                    T.writes(cache[T.Cast("int64", pos[vr // H]), vr % H, vb * 34:vb * 34 + 34],
                             cache2[T.Cast("int64", pos[vr // H]), vr % H, vb * 34:vb * 34 + 34])
                    st = T.alloc_buffer((2,), F32, scope="local")
                    put_q8(cache, rows, pos, vr, vb, st)
                    put_q8(cache2, rows2, pos, vr, vb, st)
    return set_rows_q8_0_pair if pair else set_rows_q8_0
