"""CPU (llvm) schedules for the fused decode kernels."""
from __future__ import annotations

import tvm


@tvm.transform.module_pass(opt_level=0, name="nextn.ScheduleCPU")
class ScheduleCPU:
    """Leave kernels in their default (serial) form; see bench/ for the measured cost."""

    def transform_module(self, mod, _ctx):
        return mod
