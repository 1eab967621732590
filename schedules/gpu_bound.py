"""Does a PrimFunc bound for a GPU module compute only on GPU threads? (TVM's `VerifyMemory` idea, made to hold.)

Whatever statement of a CUDA / ROCm PrimFunc is not nested in a GPU thread binding — a loop bound to `blockIdx.*` /
`threadIdx.*` / `vthread*` (`T.thread_binding`), or a `thread_extent` / `virtual_thread` attribute
(`T.launch_thread`) — ends up in the *host* half of the function after TVM's SplitHostDevice: a buffer it stores to
or loads from is read on the CPU through a device pointer, which crashes at the first call (issue 33: the BF16
glm4moe artifact's `fused_swiglu_mul_mat3` segfaulted in prefill on an H200). TVM 0.27 runs `VerifyMemory` in its
lowering pipeline, but after `FlattenBuffer`, whose `decl_buffer` aliases of the parameters it does not recognise:
that function passed it. This check reads the scheduled (s_tir) or lowered form before codegen instead.

`unbound_accesses(func)` lists the offending accesses; `schedules/gpu.py` rejects a rule's schedule that leaves one,
and the build (compiler/lower/pipeline.py) fails naming the PrimFunc when any function of the device module has one.
Host functions of the VM (shape computations: attribute `tirx.is_host_func`) are not device code and are skipped.
"""
from __future__ import annotations

from tvm import tirx

THREAD_ATTRS = ("thread_extent", "virtual_thread")


def _binds_threads(node) -> bool:
    if isinstance(node, tirx.AttrStmt):
        return node.attr_key in THREAD_ATTRS
    return isinstance(node, tirx.For) and node.kind == tirx.ForKind.THREAD_BINDING


def unbound_accesses(func: tirx.PrimFunc) -> list[str]:
    """'store NAME' / 'load NAME' for every buffer access of `func` outside any GPU thread binding (each buffer
    once, in program order); empty when all of its compute runs on GPU threads."""
    from tvm.ir import TensorLoad
    from tvm_ffi import WalkResult, structural_walk

    found: list[str] = []

    def on_thread(node):
        return WalkResult.SKIP if _binds_threads(node) else WalkResult.ADVANCE

    def note(kind):
        def visit(node):
            buf = node.buffer if kind == "store" else node.source
            s = f"{kind} {getattr(buf, 'name', buf)}"
            if s not in found:
                found.append(s)
            return WalkResult.ADVANCE
        return visit

    structural_walk(func.body, [(tirx.AttrStmt, on_thread), (tirx.For, on_thread),
                                (tirx.BufferStore, note("store")), (TensorLoad, note("load"))], order="pre")
    return found


def is_host_func(func) -> bool:
    """True for the PrimFuncs the VM runs on the host by design (shape functions of VMShapeLower)."""
    return bool(func.attrs is not None and "tirx.is_host_func" in func.attrs and func.attrs["tirx.is_host_func"])


def host_compute(mod) -> dict[str, list[str]]:
    """PrimFunc name → its accesses outside thread bindings, for every device PrimFunc of `mod` that has some."""
    out = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and not is_host_func(func):
            bad = unbound_accesses(func)
            if bad:
                out[gv.name_hint] = bad
    return out
