"""Pick the schedule pass for a target."""
from __future__ import annotations

import tvm


def schedule_pass(target):
    kind = target.kind.name
    if kind == "llvm":
        from .cpu import ScheduleCPU

        return ScheduleCPU()
    raise ValueError(f"no schedules for target kind '{kind}'")
