"""GGUF matmul kernels for the GPU targets (CUDA; ROCm takes the same schedules): TE compute definitions whose
dequantization is its own stage (`te.py`), and the decode / verify GEMV schedule that takes them (`gemv.py`).

`to_relax` emits `mul_mat` and `mul_mat_id` through `TE_OPS` for the "gpu" kernel form (the "cpu" and
"gpu-emulated" forms keep `te_ops`, where x86 kernels take the quantized matmuls), and `mul_mat_id` of several rows
as `expert_leaders` + `expert_groups` + `mul_mat_id_grouped` + `expert_gather` (each expert read once per window of
rows that chose it); FuseOps fuses their element-wise neighbours (bias adds, SwiGLU, the routed-expert weights), and
`schedules/gpu.py` tries `gemv.schedule` first on every PrimFunc ("cuda:gemv": RULES, which the compiler hands to
the schedule pass; schedules never import the compiler).

Activations: by default the matmuls of the formats of `int8.FORMATS` (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4,
NVFP4, IQ4_XS, Q2_K ... Q6_K, IQ1_S ... IQ3_S: every integer kind of the CPU) take the integer route (`int8.py`:
each activation row quantized to int8 once per matmul exactly as the CPU's integer kernels do, `__dp4a` dot
products, the scales per (sub-)block in float; aligned weight words as one 32-bit load, `word_loads.py`), so a
kernel computes what the default llvm artifact computes, up to the fp32 summation order; float weights, and every
format under `--exact-matmul`, keep float32 activations (the float-activation CPU path, `--exact-matmul`).
"""
from __future__ import annotations

from . import int8, mma
from .gemv import schedule
from .te import (GROUP_ROWS, TE_OPS, expert_gather, expert_gather_sum, expert_groups, expert_leaders, mul_mat,
                 mul_mat_id, mul_mat_id_grouped)

# The GPU schedule rules of these kernels, for schedules.gpu.ScheduleGPU (tried before dlight's)
RULES = (("cuda:gemv", schedule), ("cuda:quantize", int8.schedule_quantize))

__all__ = ["GROUP_ROWS", "RULES", "int8", "mma", "TE_OPS", "expert_gather", "expert_gather_sum", "expert_groups",
           "expert_leaders", "mul_mat", "mul_mat_id", "mul_mat_id_grouped", "schedule"]
