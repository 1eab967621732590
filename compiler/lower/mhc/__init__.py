"""mHC's lowering (GLM-5.3-Flash's residual streams, arXiv:2512.24880): `dsv4_hc_comb`, the Sinkhorn-normalised
stream mix, as the kernel of `mhc_kernels.py`, registered with `@lower` (registry.py)."""
from __future__ import annotations

from tvm import relax

from ..registry import lower
from . import mhc_kernels


@lower("dsv4_hc_comb")
def emit_hc_comb(bb, n, args, cx):
    k = cx.kernels
    S = int(n.shape[1])
    gv = bb.add_func(mhc_kernels.hc_comb_kernel(S, n.attrs["eps"], n.attrs["iters"], k.gpu and not k.emulate),
                     f"dsv4_hc_comb_{S}")
    return bb.emit(relax.call_tir(gv, relax.Tuple(list(args)), args[0].ty))
