"""The Relax pipeline from entry-point functions to a VM executable, one target.

Phases: legalize (reshape → TIR) → fuse (FuseOps/FuseTIR: elementwise producers into their consumers,
e.g. rms_norm × weight, bias adds, swiglu into the down matmul's input) → schedule (`nextn.schedules`) →
lower to the VM. Each phase's IR can be dumped (`nextn compile --dump-ir DIR`).
"""
from __future__ import annotations

import os

import tvm
from tvm import relax


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
    ]


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
        return mod

    return _pipeline
