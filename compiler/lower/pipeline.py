"""The Relax pipeline from entry-point functions to a VM executable, one target.

Phases: legalize (reshape → TIR) → fuse (FuseOps/FuseTIR: elementwise producers into their consumers,
e.g. rms_norm × weight, bias adds, swiglu into the down matmul's input) → schedule (`nextn.schedules`) →
lower to the VM → on CUDA / ROCm, verify that no PrimFunc of the device module computes on the host
(`check_device_module`). Each phase's IR can be dumped (`nextn compile --dump-ir DIR`).
"""
from __future__ import annotations

import os

import tvm
import tvm_ffi
from tvm import relax

from nextn.common.errors import NextnError

# A NextnError raised in one of our passes crosses TVM's FFI: registered, it arrives at the caller as itself (one
# line on the CLI) instead of a RuntimeError with a traceback.
tvm_ffi.error.register_error("NextnError", NextnError)


def phases(target, schedule_pass, cuda_graph: bool = False):
    """`cuda_graph`: add RewriteCUDAGraph after static memory planning (capture_graphs.py; CUDA only)."""
    from .capture_graphs import rewrite

    return [
        ("legalize", [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()]),
        ("fuse", [relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
                  relax.transform.DeadCodeElimination()]),
        ("schedule", [schedule_pass]),
        ("lower", [
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
            relax.transform.StaticPlanBlockMemory(),
            *([rewrite()] if cuda_graph else []),
            relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(),
            relax.transform.LowerRuntimeBuiltin(),
            relax.transform.ComputePrimValue(),
            relax.transform.VMShapeLower(),
            relax.transform.AttachGlobalSymbol(),
        ]),
        *([("verify_device", [VerifyDeviceModule(target)])] if target.kind.name in GPU_KINDS else []),
    ]


GPU_KINDS = ("cuda", "rocm")


_KERNEL_REPORT: dict = {}   # the last GPU pipeline's kernel report (`last_kernel_report`)


def last_kernel_report() -> dict:
    """The kernel report (compiler/kernel_report.py `kernel_report`) of the last GPU module this process scheduled
    (empty before any): the manifest's `gpu_kernels.kernels` (compiler/compile.py)."""
    return dict(_KERNEL_REPORT)


def _kernel_report(mod, dump_dir: str | None) -> None:
    """Record the scheduled module's kernel report (per PrimFunc its schedule rule, launch shape and weight bytes)
    and with `dump_dir` write it as DIR/kernel_report.json (the rule table alone is DIR/schedule_report.json)."""
    import json

    from nextn.compiler.kernel_report import kernel_report
    from nextn.schedules.gpu import last_report

    rep = kernel_report(mod, last_report())
    _KERNEL_REPORT.clear()
    _KERNEL_REPORT.update(rep)
    if dump_dir:
        with open(os.path.join(dump_dir, "kernel_report.json"), "w") as f:
            json.dump(rep, f, indent=1, sort_keys=True)


def check_device_module(mod, target) -> None:
    """Raise NextnError naming the first PrimFunc of `mod` (a GPU build's module before codegen) with a buffer
    access outside every GPU thread binding: after SplitHostDevice that code would run on the host and read device
    memory through device pointers (issue 33's BF16 segfault). TVM's own VerifyMemory runs too late to see it
    (schedules/gpu_bound.py). Shape functions the VM runs on the host are exempt."""
    from nextn.schedules.gpu_bound import host_compute

    bad = host_compute(mod)
    if bad:
        name = sorted(bad)[0]
        more = f"; {len(bad) - 1} more: {', '.join(sorted(bad)[1:4])}" if len(bad) > 1 else ""
        raise NextnError(f"{target.kind.name} build: PrimFunc '{name}' would compute on the host "
                         f"({', '.join(bad[name][:3])} outside any GPU thread binding){more}; "
                         f"a schedule left it unbound, the build stops before codegen")


@tvm.transform.module_pass(opt_level=0, name="nextn.VerifyDeviceModule")
class VerifyDeviceModule:
    """`check_device_module` as a pass (the last phase of a CUDA / ROCm pipeline); the module is unchanged."""

    def __init__(self, target):
        self.target = target

    def transform_module(self, mod, _ctx):
        check_device_module(mod, self.target)
        return mod


_GRAPH_STORAGE: dict = {}   # the last pipeline's CUDA graph storage bytes (`last_graph_storage`)


def last_graph_storage() -> int:
    """Bytes of device memory the CUDA graphs of the last module this process lowered allocate once, at the first
    capture (0 without graphs): the manifest's `cuda_graph.static_bytes`, which the runtime's memory budget counts."""
    return int(_GRAPH_STORAGE.get("bytes", 0))


def last_graph_launches() -> dict:
    """Kernels each captured entry point's CUDA graph replays, in the last module this process lowered ({} without
    graphs): the manifest's `cuda_graph.launches`."""
    return dict(_GRAPH_STORAGE.get("launches", {}))


def graph_launches(mod) -> dict:
    """{entry: kernels its CUDA graphs launch} of the lowered `mod`: the kernels of the captured regions
    (RewriteCUDAGraph's `*_cuda_graph_capture*` functions) each entry runs; a draft step 0 runs two (its quantized
    head rows are a second region), and the reduced-head draft entries (`_vocab`) run their full-head twins'
    regions, which the pass lifts once. Each small kernel of a graph still costs ~2-3 us on an H200 (docs/gpu.md),
    so the count is half of a step's cost model."""
    kernels: dict[str, int] = {}
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function) and "_cuda_graph_capture" in gv.name_hint:
            calls = []

            def visit(e, calls=calls):
                if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.GlobalVar) \
                        and isinstance(mod[e.op], tvm.tirx.PrimFunc) and not e.op.name_hint.startswith("shape_func"):
                    calls.append(e.op.name_hint)

            relax.analysis.post_order_visit(f, visit)
            kernels[gv.name_hint] = len(calls)
    out: dict[str, int] = {}
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function) and gv.name_hint not in kernels:
            regions: set[str] = set()
            relax.analysis.post_order_visit(f, lambda e, r=regions: r.add(e.name_hint) if isinstance(
                e, tvm.ir.GlobalVar) and e.name_hint in kernels else None)
            if regions:
                out[gv.name_hint] = sum(kernels[r] for r in regions)
    return out


def graph_storage_bytes(mod) -> int:
    """The sum of the constant-size storages in `mod`'s `cuda_graph_alloc` functions: what RewriteCUDAGraph plans
    once for every captured region (the regions of different entry points share it; sizes at their bounds: rows,
    L and C at `tir_var_upper_bound`)."""
    sizes = []

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") in ("relax.vm.alloc_storage",
                                                                        "relax.memory.alloc_storage"):
            sizes.append(int(e.args[0].values[0]))

    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function) and gv.name_hint.startswith("cuda_graph_alloc"):
            relax.analysis.post_order_visit(f, visit)
    return sum(sizes)


def make_pipeline(target, schedule_pass, dump_dir: str | None = None, cuda_graph: bool = False):
    @tvm.transform.module_pass(opt_level=0, name="nextn_pipeline")
    def _pipeline(mod, _ctx):
        with target:
            for i, (name, passes) in enumerate(phases(target, schedule_pass, cuda_graph)):
                mod = tvm.transform.Sequential(passes)(mod)
                if dump_dir:
                    os.makedirs(dump_dir, exist_ok=True)
                    with open(os.path.join(dump_dir, f"{i + 1}_{name}.py"), "w") as f:
                        f.write(mod.script())
                if name == "schedule" and target.kind.name in GPU_KINDS:
                    _kernel_report(mod, dump_dir)
                if name == "lower":
                    _GRAPH_STORAGE["bytes"] = graph_storage_bytes(mod) if cuda_graph else 0
                    _GRAPH_STORAGE["launches"] = graph_launches(mod) if cuda_graph else {}
        return mod

    return _pipeline
