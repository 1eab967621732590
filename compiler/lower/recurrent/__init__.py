"""The recurrent family's lowering: GLM-5.3-Flash's KDA layer ops `ssm_conv` and `gated_delta_net` as the kernels of
`kda_kernels.py`, registered with `@lower` (registry.py). Both update their state planes in place
(`call_tir_inplace`) and return the output rows. The GPU kernel forms (also "gpu-emulated": the GPU arithmetic on the
CPU, to test it) run the recurrence for every chunk size."""
from __future__ import annotations

from tvm import relax, te

from ..registry import float_buffers, lower
from . import kda_kernels


@lower("ssm_conv")
def emit_ssm_conv(bb, n, args, cx):
    x, w, state, pos, rs = args = float_buffers(args)
    ch, k = (int(d) for d in n.inputs[1].shape)
    gv = bb.add_func(kda_kernels.ssm_conv_kernel(ch, k, cx.kernels.gpu and not cx.kernels.emulate),
                     f"ssm_conv_{ch}_{k}")
    call = relax.op.call_tir_inplace(gv, relax.Tuple(list(args)), [2, -1], [state.ty, x.ty])
    return bb.emit(relax.TupleGetItem(bb.emit(call), 1))


@lower("gated_delta_net")
def emit_gated_delta_net(bb, n, args, cx):
    q, k, v, g, beta, state, pos, rs = args = float_buffers(args)
    _t, H, DK = n.inputs[0].shape
    DV = n.inputs[2].shape[2]
    chunk = n.attrs["chunk"]
    if chunk == 0 or cx.kernels.gpu:
        eg = bb.emit_te(lambda g_: te.compute(g_.shape, lambda *i: te.exp(g_[i]), name="exp_g"), g,
                        primfunc_name_hint="kda_decay")
        gv = bb.add_func(kda_kernels.gdn_recurrent_kernel(H, DV, DK, cx.kernels.gpu and not cx.kernels.emulate),
                         f"gated_delta_net_{H}_{DV}_{DK}")
        fargs = [q, k, v, eg, beta, state, pos, rs]
    else:
        gv = bb.add_func(kda_kernels.gdn_chunked_kernel(H, DV, DK, chunk),
                         f"gated_delta_net_chunk{chunk}_{H}_{DV}_{DK}")
        fargs = list(args)
    call = relax.op.call_tir_inplace(gv, relax.Tuple(fargs), [5, -1], [state.ty, v.ty])
    return bb.emit(relax.TupleGetItem(bb.emit(call), 1))
