"""Hand-written x86 kernels for the CPU (llvm) target: quantized / 16-bit matmuls that read the GGUF's bytes.

`to_relax` routes `mul_mat` and `mul_mat_id` here when the target has AVX2 + FMA + F16C and the weight's kind is
in `KINDS` (2-D [N, K] dense weights, 3-D [X, N, K] routed experts); everything else keeps the TE element
expression path (`nextn.compiler.quant`). Integer kinds (`INT_KINDS`) multiply int8-quantized activation rows
(`quantize_rows`; semantics in `nextn.common.quant.activation`) when the artifact quantizes activations, and
fall back to the element path otherwise. Vector width: 64 bytes on AVX-512BW, else 32 (`vector_width`);
VNNI (`has_vnni`) changes instructions, never results.
"""
from __future__ import annotations

from .formats import FLOAT_FORMATS, INT_FORMATS
from .loops import Knobs, act_args, matmul, matmul_id, weight_arg
from .quantize import quantize_rows

INT_KINDS = frozenset(INT_FORMATS)
FLOAT_KINDS = frozenset(FLOAT_FORMATS)
KINDS = INT_KINDS | FLOAT_KINDS


def vector_width(target) -> int | None:
    """64 (AVX-512BW), 32 (AVX2 + FMA + F16C) or None (no x86 kernels) for an llvm `target`."""
    from tvm.target import codegen

    if target.kind.name != "llvm":
        return None
    try:
        has = lambda f: codegen.llvm_cpu_has_features(f, target)   # noqa: E731
        if not all(has(f) for f in ("avx2", "fma", "f16c")):
            return None
        return 64 if has("avx512bw") else 32
    except Exception:       # not an x86 target
        return None


def has_vnni(target, width: int) -> bool:
    """Whether the llvm `target` has VNNI (u8 x s8 dot products, vpdpbusd) at `width` vector bytes: AVX512-VNNI
    for 64; AVX-VNNI, or AVX512-VNNI with AVX512VL, for 32."""
    from tvm.target import codegen

    try:
        has = lambda f: codegen.llvm_cpu_has_features(f, target)   # noqa: E731
        if width == 64:
            return has("avx512vnni")
        return has("avxvnni") or has("avx512vnni") and has("avx512vl")
    except Exception:
        return False


__all__ = ["FLOAT_KINDS", "INT_KINDS", "KINDS", "KernelSpec", "Knobs", "act_args", "default_knobs", "has_vnni", "matmul",
           "matmul_id", "quantize_rows", "vector_width", "weight_arg"]


from dataclasses import dataclass, field as _field   # noqa: E402


@dataclass(frozen=True)
class KernelSpec:
    """One x86 kernel of a model: what it computes (everything but the knobs). `key` names it in tuning logs.

    op: "matmul" (weight [N, K]) or "matmul_id" (routed experts [X, N, K], n_used per row, x shared by the slots
    or one row per slot, n_weights weights in one pass); rows: static row count or None (symbolic T)."""
    op: str
    kind: str
    N: int
    K: int
    rows: int | None = None
    X: int = 0
    n_used: int = 0
    shared_x: bool = True
    n_weights: int = 1

    @property
    def key(self) -> str:
        r = "T" if self.rows is None else str(self.rows)
        base = f"x86.{self.op}:{self.kind}:N{self.N}:K{self.K}:rows{r}"
        if self.op == "matmul_id":
            base += f":X{self.X}:used{self.n_used}:{'shared' if self.shared_x else 'slots'}:w{self.n_weights}"
        return base

    @property
    def name(self) -> str:
        return self.key.replace("x86.", "x86_").replace(":", "_").lower()

    def build(self, knobs: Knobs, vnni: bool = False):
        """The PrimFunc with `knobs`; `vnni`: the target has VNNI at knobs.width (`has_vnni`)."""
        if self.op == "matmul":
            return matmul(self.kind, self.N, self.K, self.rows, knobs, name=self.name, vnni=vnni)
        return matmul_id(self.kind, self.X, self.N, self.K, self.n_used, self.shared_x, self.n_weights, self.rows,
                         knobs, name=self.name, vnni=vnni)

    def weight_bytes(self) -> int:
        shape, dtype = weight_arg(self.kind, (self.X, self.N) if self.op == "matmul_id" else (self.N,), self.K)
        n = 1
        for d in shape:
            n *= d
        return n * (1 if dtype == "uint8" else 4 if dtype == "float32" else 2) * self.n_weights


def default_knobs(spec: KernelSpec, width: int) -> Knobs:
    """nextn's default schedule for `spec` (what a tuning log record must beat)."""
    return Knobs(width=width)
