"""Pick the schedule pass for a target."""
from __future__ import annotations


def schedule_pass(target):
    kind = target.kind.name
    if kind == "llvm":
        from .cpu import ScheduleCPU

        return ScheduleCPU()
    if kind in ("cuda", "rocm"):
        from .gpu import ScheduleGPU

        return ScheduleGPU(target)
    raise ValueError(f"no schedules for target kind '{kind}'")
