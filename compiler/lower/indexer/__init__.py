"""The DSA lightning indexer's lowering (glm-dsa, GLM-5.x): its score (`lightning_indexer`), the exact per-row top-k
as a mask (`top_k_mask`), the kept selection for NextN index sharing (`index_mask_store`) and GLM-5.3-Flash's key
pool (`kpool_store`), as the kernels of `dsa_kernels.py`, registered with `@lower` (registry.py). `index_mask_load`
and `kpool_expand` go through TE (to_relax.py)."""
from __future__ import annotations

from tvm import relax, tirx

from ..attention import F32, kv_type_of
from ..registry import float_buffers, lower
from . import dsa_kernels


@lower("lightning_indexer")
def emit_lightning_indexer(bb, n, args, cx):
    """The index score [T, L] (or [T, L // kpool] over k-pools: attribute `kpool`)."""
    k, sym = cx.kernels, cx.sym
    q, kc, w, pos = args
    _t, Hi, D = n.inputs[0].shape
    kt = kv_type_of(n.inputs[1])
    kp = int(n.attrs.get("kpool", 1))
    kind = "gpu" if k.gpu else "cpu"
    gv = k.get(f"lightning_indexer_{kind}_h{Hi}_d{D}_{kt}{f'_p{kp}' if kp > 1 else ''}",
               lambda: dsa_kernels.lightning_indexer_kernel(int(Hi), int(D), kt, gpu=k.gpu and not k.emulate,
                                                            emulate=k.emulate, kpool=kp))
    T = q.ty.shape[0]
    L = sym["L"]
    return k.bb.emit(relax.call_tir(gv, relax.Tuple([q, kc, w, pos, relax.prim_value(L)]),
                                    relax.TensorType([T, tirx.floordiv(L, kp) if kp > 1 else L], F32)))


@lower("top_k_mask")
def emit_top_k_mask(bb, n, args, cx):
    kp = n.attrs.get("kpool", 1)
    gv = bb.add_func(dsa_kernels._top_k_mask_kernel(n.attrs["k"], kp),
                     f"top_k_mask_{n.attrs['k']}" + (f"_pool{kp}" if kp > 1 else ""))
    score = args[0]
    return bb.emit(relax.call_tir(gv, relax.Tuple(list(args)), score.ty))


@lower("index_mask_store")
def emit_index_mask_store(bb, n, args, cx):
    after = n.attrs.get("after", 0.0)
    gv = bb.add_func(dsa_kernels._index_mask_store_kernel(after),
                     "index_mask_store" + ("" if after == 0.0 else "_after_neg_inf"))
    return bb.emit(relax.op.call_tir_inplace(gv, relax.Tuple(list(args)), [0], args[0].ty))


@lower("kpool_store")
def emit_kpool_store(bb, n, args, cx):
    args = float_buffers(args)   # ape is a float weight
    kp, d = (int(x) for x in n.inputs[3].shape)
    kt = kv_type_of(n.inputs[1])
    gv = bb.add_func(dsa_kernels.kpool_store_kernel(kp, d, kt, cx.kernels.gpu and not cx.kernels.emulate),
                     f"kpool_store_{kp}_{d}_{kt}")
    return bb.emit(relax.op.call_tir_inplace(gv, relax.Tuple(list(args)), [0], args[0].ty))
