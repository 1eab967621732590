"""The attention family's lowering: the KV store (`set_rows`) and attention (`flash_attn_ext`, `flash_attn_ext_mla`)
as the hand-written kernels of flash_attn.py and kv_access.py, registered with `@lower` (registry.py). The kernel
builds and KV-type helpers here serve the other families too (indexer/, recurrent/).

Kernels come in three builds: "cpu" (llvm), "gpu" (CUDA / ROCm thread blocks), and "gpu-emulated" (the GPU
kernels with serial threads, built for llvm: the GPU form's arithmetic, testable without a GPU). An entry point's
attention is either fused (one kernel) or split over L (partials per chunk + an ordered merge, flash-decoding);
both give the same bits on one target, the split one spreads long contexts over cores / thread blocks.
"""
from __future__ import annotations

import numpy as np
from tvm import relax, tirx

from nextn.common.kv_types import KV_TYPES

from ..registry import lower
from . import flash_attn, kv_access

FORMS = ("cpu", "gpu", "gpu-emulated")
F32 = "float32"


def leaf_state(node):
    """The state node an in-place chain (set_rows ...) starts from, or None for a non-state input."""
    while node.op not in ("state", "input", "weight"):
        if not node.inputs:
            return None
        node = node.inputs[0]
    return node if node.op == "state" else None


def kv_type_of(node) -> str:
    st = leaf_state(node)
    return st.attrs.get("kv_type", "f32") if st is not None else "f32"


def state_storage(node, shape_of):
    """(dtype, shape) of a state's buffer: a KV cache's storage for its type, else float32 [shape]."""
    kv = node.attrs.get("kv_type")
    shape = shape_of(node.shape)
    if kv is None:
        return node.dtype, shape
    t = KV_TYPES[kv]
    return t.storage_dtype, [*shape[:-1], t.storage_shape((int(node.shape[-1]),))[0]]


class Kernels:
    """The module's kernels, added to the BlockBuilder once per distinct configuration."""

    def __init__(self, bb: relax.BlockBuilder, form: str):
        assert form in FORMS, form
        self.bb, self.form, self._gv = bb, form, {}
        # what several ops of a function share, keyed by Relax vars or IR Node objects, never by node ids (ids restart
        # in every graph of the module): to_relax's routed-expert groups by ids, int8 rows, the routing weights, the
        # K / V store pairs
        self.memo = {}
        self.gpu, self.emulate = form != "cpu", form == "gpu-emulated"
        self.mma = False   # the many-row entries' integer-route matmuls as tensor-core tiles (to_relax build_module)

    def get(self, name: str, make):
        if name not in self._gv:
            self._gv[name] = self.bb.add_func(make(), name)
        return self._gv[name]


@lower("set_rows")
def emit_set_rows(bb, n, args, cx):
    k = cx.kernels
    cache, rows, pos = args
    kv = kv_type_of(n.inputs[0])
    _c, H, D = n.inputs[1].shape
    gv = k.get(f"set_rows_{kv}_h{H}_d{D}", lambda: kv_access.store_kernel(kv, int(H), int(D), gpu=k.gpu and not k.emulate))
    return k.bb.emit(relax.op.call_tir_inplace(gv, relax.Tuple([cache, rows, pos]), [0], cache.ty))


def attn_shape(n) -> flash_attn.AttnShape:
    """The static AttnShape of a flash_attn_ext / flash_attn_ext_mla node."""
    q = n.inputs[0]
    _t, H, Dk = q.shape
    if n.op == "flash_attn_ext":
        kn, vn = n.inputs[1], n.inputs[2]
        return flash_attn.AttnShape(int(H), int(kn.shape[1]), int(Dk), int(vn.shape[2]), n.attrs["scale"],
                                    kv_type_of(kn), kv_type_of(vn), False, False)
    kn = n.inputs[1]
    kt = kv_type_of(kn)
    return flash_attn.AttnShape(int(H), int(kn.shape[1]), int(Dk), int(n.attrs["n_v"]), n.attrs["scale"], kt, kt,
                                True, len(n.inputs) > 3)


@lower("flash_attn_ext", "flash_attn_ext_mla")
def emit_attention(bb, n, args, cx):
    """`n` (flash_attn_ext or flash_attn_ext_mla) as a fused kernel, or (`cx.split_l`) a partial + merge kernel
    pair."""
    k, sym, split = cx.kernels, cx.sym, cx.split_l
    a = attn_shape(n)
    if n.op == "flash_attn_ext":
        q, kc, vc, pos = args
        mask = None
    else:
        q, kc, pos, *m = args
        vc, mask = kc, (m[0] if m else None)
    if mask is None:   # the kernels take a mask argument either way: a [1, 1] constant when the op has none
        mask = relax.const(np.zeros((1, 1), np.float32))
    L = sym["L"]
    T = q.ty.shape[0]
    gpu = k.gpu
    kind = "gpu" if gpu else "cpu"
    lv = relax.prim_value(L)   # the kernels' trailing scalar parameter (after the outputs)
    ins = relax.Tuple([q, kc, vc, pos, mask, lv])
    out = relax.TensorType([T, a.H, a.Dv], F32)
    if not split:
        gv = k.get(f"flash_attn_{kind}_{a.tag()}",
                   lambda: flash_attn.gpu_kernel(a, False, k.emulate) if gpu else flash_attn.cpu_kernel(a, False))
        return k.bb.emit(relax.call_tir(gv, ins, out))
    nc = tirx.floordiv(L + (flash_attn.CHUNK - 1), flash_attn.CHUNK)
    one_row = isinstance(T, (int, tirx.IntImm)) and int(T) == 1     # decode, draft: static T = 1
    rb = 1 if gpu else flash_attn.cpu_rows_per_task(a, True, one_row)
    gp = k.get(f"flash_attn_partial_{kind}_{a.tag()}" + (f"_r{rb}" if rb > 1 else ""),
               lambda: flash_attn.gpu_kernel(a, True, k.emulate) if gpu else flash_attn.cpu_kernel(a, True, rb))
    gm = k.get(f"flash_attn_merge_{kind}_h{a.H}_d{a.Dv}",
               lambda: flash_attn.gpu_merge_kernel(a, k.emulate) if gpu else flash_attn.cpu_merge_kernel(a))
    part = k.bb.emit(relax.call_tir(gp, ins, [relax.TensorType([T, a.H, nc, a.Dv], F32),
                                              relax.TensorType([T, a.H, nc, 2], F32)]))
    pacc = k.bb.emit(relax.TupleGetItem(part, 0))
    pml = k.bb.emit(relax.TupleGetItem(part, 1))
    return k.bb.emit(relax.call_tir(gm, relax.Tuple([pacc, pml, pos, lv]), out))

