"""GGUF matmul kernels for the GPU targets (CUDA; ROCm takes the same schedules): TE compute definitions whose
dequantization is its own stage (`te.py`), and the decode / verify GEMV schedule that takes them (`gemv.py`).

`to_relax` emits `mul_mat` and `mul_mat_id` through `TE_OPS` for the "gpu" kernel form (the "cpu" and
"gpu-emulated" forms keep `te_ops`, where x86 kernels take the quantized matmuls), and `mul_mat_id` of several rows
as `expert_leaders` + `expert_groups` + `mul_mat_id_grouped` + `expert_gather` (each expert read once per window of rows that chose
it); FuseOps fuses their element-wise neighbours (bias adds, SwiGLU, the routed-expert weights), and
`schedules/gpu.py` tries `gemv.schedule` first on every PrimFunc ("cuda:gemv": RULES, which the compiler hands to
the schedule pass; schedules never import the compiler). Activations stay float32, so a kernel computes what the
float-activation CPU path computes (`--exact-matmul`), up to the fp32 summation order.
"""
from __future__ import annotations

from .gemv import schedule
from .te import (GROUP_ROWS, TE_OPS, expert_gather, expert_groups, expert_leaders, mul_mat, mul_mat_id,
                 mul_mat_id_grouped)

# The GPU schedule rules of these kernels, for schedules.gpu.ScheduleGPU (tried before dlight's)
RULES = (("cuda:gemv", schedule),)

__all__ = ["GROUP_ROWS", "RULES", "TE_OPS", "expert_gather", "expert_groups", "expert_leaders", "mul_mat",
           "mul_mat_id", "mul_mat_id_grouped", "schedule"]
