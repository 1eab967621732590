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


def launches(func: tirx.PrimFunc) -> list[dict]:
    """The kernel launches of a scheduled GPU PrimFunc: per outermost thread-bound region (one kernel after
    SplitHostDevice), {"grid": [x, y, z], "block": [x, y, z]} with each extent as its expression's text ("1" where
    unbound; a dynamic one names T, L, ...). Read from `T.thread_binding` loops and `T.launch_thread` attributes; a
    tag bound twice in one region (sibling loop nests) keeps its largest extent."""
    from tvm_ffi import WalkResult, structural_walk

    out = []

    def extents(region) -> dict:
        tags: dict[str, list] = {}

        def visit(node):
            if isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
                tags.setdefault(node.node.thread_tag, []).append(node.value)
            elif isinstance(node, tirx.For) and node.kind == tirx.ForKind.THREAD_BINDING:
                tags.setdefault(node.thread_binding.thread_tag, []).append(node.extent)
            return WalkResult.ADVANCE

        structural_walk(region, [(tirx.AttrStmt, visit), (tirx.For, visit)], order="pre")
        return tags

    def region(node):
        if not _binds_threads(node) or (isinstance(node, tirx.AttrStmt) and node.attr_key != "thread_extent"):
            return WalkResult.ADVANCE
        tags = extents(node)

        def dim(tag):
            vals = tags.get(tag)
            if not vals:
                return "1"
            consts = [int(v) for v in vals if isinstance(v, tirx.IntImm)]
            return str(max(consts)) if len(consts) == len(vals) else extent_text(vals[0])

        out.append({"grid": [dim(f"blockIdx.{a}") for a in "xyz"], "block": [dim(f"threadIdx.{a}") for a in "xyz"]})
        return WalkResult.SKIP

    structural_walk(func.body, [(tirx.AttrStmt, region), (tirx.For, region)], order="pre")
    return out


def extent_text(e) -> str:
    """A launch extent as a reader writes it: `(T + 3) // 4`, not the printer's `(T_1 + T.int64(3)) // T.int64(4)`."""
    import re

    text = re.sub(r"T\.int(?:64|32)\((-?\d+)\)", r"\1", str(e))
    text = re.sub(r"T\.(min|max)\(", r"\1(", text)
    for v in tirx.analysis.undefined_vars(e):
        text = re.sub(rf"\b{re.escape(str(v))}\b", v.name, text)
    return text


def extent_at(text: str, value: int = 1):
    """The value of an `extent_text` with every symbol (T, L, ...) set to `value` (T = 1: a decode step), or None."""
    import re

    names = {n: value for n in re.findall(r"\b[A-Za-z_]\w*\b", text) if n not in ("min", "max")}
    try:
        return int(eval(text, {"__builtins__": {}, "min": min, "max": max}, names))   # noqa: S307 (our own text)
    except Exception:   # not a plain arithmetic expression: no number
        return None
