"""GPU (CUDA / ROCm) schedules for the fused kernels: dlight rules, tried in order, per PrimFunc.

Every PrimFunc that reaches codegen must have its loops bound to GPU threads, so this pass either schedules a
function or fails the compile naming it (never a silent unscheduled kernel). The rule that took each function
is recorded (`last_report()`, `nextn compile --dump-ir` writes it as `schedule_report.json`), so one can see
which fused kernels defeated the specialised rules and landed in `Fallback`:

    python -m nextn.compiler.schedule_report MODEL.gguf [--target cuda|rocm] [--arch sm_90]   # PrimFunc -> rule

Rule order: the compiler's own rules first (`kernel_rules`: compiler/lower/cuda.RULES, "cuda:gemv", which takes
every `mul_mat` / `mul_mat_id`), then dlight's (TVM `python/tvm/s_tir/dlight/gpu/`; docs/design.md "TVM"):
`LowBatchGEMV` before `Matmul` because every matmul here has a dynamic row count T (1 for a draft step, k+1 for
verify, up to 512 for prefill); `GEMV` for static single rows; `Reduction` / `GeneralReduction` for norms and
argmax; `SerialReduction` (one thread per output, its reduction serial in a register) for the reductions those
decline; `Fallback` (one thread per output element, correct but not fast) last. There is no fp16 arithmetic, so no
rule tensorizes.
"""
from __future__ import annotations

import tvm
from tvm import tirx

from .gpu_bound import unbound_accesses

_REPORT: dict[str, str] = {}


def _rule_list(kernel_rules=()):
    """`kernel_rules`: (name, fn(func, target) -> Schedule | None) for kernels the compiler defines (schedules never
    imports the compiler; compiler/lower/cuda.RULES: "cuda:gemv", the GGUF matmuls), tried before dlight's rules."""
    from tvm.s_tir import dlight as dl

    return [
        *((name, _Hand(fn)) for name, fn in kernel_rules),
        ("LowBatchGEMV", dl.gpu.LowBatchGEMV()),
        ("Matmul", dl.gpu.Matmul()),
        ("GEMV", dl.gpu.GEMV()),
        ("Reduction", dl.gpu.Reduction()),
        ("GeneralReduction", dl.gpu.GeneralReduction()),
        ("SerialReduction", _Hand(serial_reduction)),
        ("Fallback", dl.gpu.Fallback()),
    ]


SERIAL_THREADS = 256


def serial_reduction(func: tirx.PrimFunc, target):
    """A reduction the reduction rules declined (MoE top-k's rank and select: every output compares its expert with
    all the others), as Fallback maps it, one thread per output with its reduction serial in the thread, but the
    accumulator in a register, stored once: Fallback's loop reads and writes the output in global memory at every
    step (`fused_add3_topk_rank`, 128 experts: 13-19 µs per MoE layer on the H200, docs/gpu.md). Single-block
    functions with spatial then reduction loops only (after inlining the element-wise producers); None otherwise."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline

    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    infos = try_inline(sch, infos)
    if len(infos) != 1:
        return None
    kinds, block = infos[0].dom_kind(), infos[0].block_rv
    if "R" not in kinds or set(kinds) - {"S", "R"}:
        return None
    loops = sch.get_loops(block)
    spatial = [lp for lp, k in zip(loops, kinds) if k == "S"] or [sch.add_unit_loop(block)]
    reduce = [lp for lp, k in zip(loops, kinds) if k == "R"]
    sch.reorder(*spatial, *reduce)
    bx, tx = sch.split(sch.fuse(*spatial), factors=[None, SERIAL_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    store = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(store, tx)
    sch.decompose_reduction(block, reduce[0])
    return sch


class _Hand:
    def __init__(self, fn):
        self.fn = fn

    def apply(self, func, target, _tunable):
        return self.fn(func, target)


def _inline_unbound_producers(sch) -> None:
    """Inline into their consumers the element-wise blocks a rule left outside every thread binding.

    dlight's LowBatchGEMV pads the GEMV's vector input (`pad_einsum`: T rounded up to its bucket of 4) and inlines
    that pad block only when it reads a function argument directly; when an element-wise producer was fused in
    front (BF16 / F16 weights, whose matmul FuseOps fuses with the SwiGLU before it: `fused_swiglu_mul_mat3`),
    the producer is inlined into the pad block *after* that test, so the pad block — the SwiGLU over all rows —
    stayed at the root, unbound, and was compiled as host code (issue 33). Inlining it does what the rule meant:
    each GEMV thread computes the SwiGLU of the inputs it loads (no T × K temporary, no extra launch)."""
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:   # no root block (a hand-written kernel): nothing to complete
        return
    for b in blocks:
        loops = [sch.get(lp) for lp in sch.get_loops(b)]
        if any(lp.kind == tirx.ForKind.THREAD_BINDING for lp in loops):
            continue
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in sch.get(b).iter_vars):
            continue
        try:
            sch.compute_inline(b)
        except Exception:   # not inlinable: unbound_accesses then rejects the rule
            continue


def schedule_func(func: tirx.PrimFunc, target, name: str = "", kernel_rules=()) -> tuple[tirx.PrimFunc, str]:
    """Apply the first rule that accepts `func` (`kernel_rules` first: see _rule_list); returns (scheduled func, rule
    name)."""
    errors = []
    for rule_name, rule in _rule_list(kernel_rules):
        try:
            space = rule.apply(func, target, False)
        except Exception as e:   # a rule that crashes on this shape: try the next one
            errors.append(f"{rule_name}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__}")
            continue
        if space is None:
            continue
        sch = space[0] if isinstance(space, (list, tuple)) else space
        # only LowBatchGEMV leaves element-wise producers unbound (on every fixture the inlining changes nothing after
        # another rule); a rule that left one anyway is rejected below and the next one tried
        if rule_name == "LowBatchGEMV":
            _inline_unbound_producers(sch)
        out = sch.mod["main"].with_attr("tirx.is_scheduled", True)
        unbound = unbound_accesses(out)
        if unbound:   # host code touching device buffers (issue 33): never accept it, try the next rule
            errors.append(f"{rule_name}: left {', '.join(unbound[:3])} outside GPU threads")
            continue
        problem = _lowering_problem(out)
        if problem:   # a rule can accept a function and still leave a schedule that does not lower: next rule
            errors.append(f"{rule_name}: {problem}")
            continue
        return out, rule_name
    raise RuntimeError(f"no GPU schedule rule accepted PrimFunc '{name}' ({'; '.join(errors) or 'all rules declined'})")


def _lowering_problem(func) -> str | None:
    """Why the scheduled `func` would fail to build (found later, at codegen, otherwise), or None: the cross-thread
    reduction lowering rejects it, or a register / shared-memory buffer keeps a size that depends on a dynamic
    shape once allocations are compacted (CUDA can only allocate those with constant sizes)."""
    import re

    from tvm import s_tir

    t = s_tir.transform
    try:
        mod = tvm.IRModule({"main": func})
        for p in (t.LowerCrossThreadReduction(), t.LowerInitBlock(), t.PlanAndUpdateBufferAllocationLocation(),
                  t.ConvertBlocksToOpaque(), t.CompactBufferAllocation()):
            mod = p(mod)
    except Exception as e:
        msg = str(e).strip().splitlines()
        return (msg[0] if msg else type(e).__name__)[:200]
    for line in mod["main"].script().splitlines():
        m = re.search(r"(\w+) = T\.(?:sblock_)?alloc_buffer\((.*)scope=\"(?:local|shared)", line)
        if m and re.search(r"[A-Za-z_]\w*", re.sub(r"T\.(int64|int32|min|max)\(|\"\w+\"|\w+=", "", m.group(2))):
            return f"{m.group(1)}: a register/shared buffer whose size depends on a dynamic shape"
    return None


@tvm.transform.module_pass(opt_level=0, name="nextn.ScheduleGPU")
class ScheduleGPU:
    """Schedule every PrimFunc of the module for the current GPU target (CUDA or ROCm); `kernel_rules` as
    schedule_func's."""

    def __init__(self, target, kernel_rules=()):
        self.target, self.kernel_rules = target, tuple(kernel_rules)

    def transform_module(self, mod, _ctx):
        _REPORT.clear()
        out = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"]):
                _REPORT[gv.name_hint] = "pre-scheduled"
                continue
            f, rule = schedule_func(func, self.target, gv.name_hint, self.kernel_rules)
            out[gv] = f
            _REPORT[gv.name_hint] = rule
        for gv, f in out.items():
            mod[gv] = f
        return mod


def last_report() -> dict[str, str]:
    """PrimFunc name → rule, from the last ScheduleGPU run in this process."""
    return dict(_REPORT)
