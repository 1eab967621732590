"""Pick the schedule pass for a target."""
from __future__ import annotations


def schedule_pass(target, kernel_rules=()):
    """The target's schedule pass; `kernel_rules`: the compiler's own GPU rules (schedules.gpu.schedule_func)."""
    kind = target.kind.name
    if kind == "llvm":
        from .cpu import ScheduleCPU

        return ScheduleCPU()
    if kind in ("cuda", "rocm"):
        from .gpu import ScheduleGPU

        return ScheduleGPU(target, kernel_rules)
    raise ValueError(f"no schedules for target kind '{kind}'")
