"""Kernel schedules per target kind, applied to the fused PrimFuncs before codegen."""
from .select import schedule_pass

__all__ = ["schedule_pass"]
