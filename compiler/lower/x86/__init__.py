"""Hand-written x86 kernels for the CPU (llvm) target: quantized / 16-bit matmuls that read the GGUF's bytes.

`to_relax` routes `mul_mat` and `mul_mat_id` here when the target has AVX2 + FMA + F16C and the weight's kind is
in `KINDS` (2-D [N, K] dense weights, 3-D [H, N, K] per-head weights with x [T, H, K], 3-D [X, N, K] routed
experts); everything else keeps the TE element
expression path (`nextn.compiler.quant`). Integer kinds (`INT_KINDS`) multiply int8-quantized activation rows
when the artifact quantizes activations: "q8" rows (`quantize_rows`, per 256) for the K-quants, IQ4_XS and the
codebook formats (codebook.py: IQ1_S .. IQ3_S), "q8_0"
rows (`quantize_rows_q8_0`, per 32) for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 and NVFP4 (nvfp4.py) (semantics
in `nextn.common.quant.activation`).
Without quantized activations (--exact-matmul) Q8_0, IQ4_NL, MXFP4 and NVFP4 take the float path (they are in
`FLOAT_KINDS` too) and the others the element path. Vector width: 64 bytes on AVX-512BW, else 32 (`vector_width`);
VNNI (`has_vnni`) changes instructions, never results.
"""
from __future__ import annotations

from .batched import matmul_heads
from .formats import FLOAT_FORMATS, INT_FORMATS, act_args, act_layout, format_of, weight_arg
from .kernel import Knobs
from .matmul import matmul, matmul_id
from .quantize import quantize_rows, quantize_rows_q8_0

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


# LLVM CPU names (a target's `mcpu`) whose cores have a 48 KB L1 data cache (Intel Sunny Cove and after, AMD Zen 5);
# every other x86 CPU is taken to have 32 KB (Skylake, Zen 1-4): the vendors' optimization manuals
L1D_48K = frozenset({"icelake-client", "icelake-server", "tigerlake", "rocketlake", "alderlake", "raptorlake",
                     "meteorlake", "arrowlake", "arrowlake-s", "lunarlake", "sapphirerapids", "emeraldrapids",
                     "graniterapids", "graniterapids-d", "znver5"})


def l1d_kb(target) -> int:
    """The L1 data cache per core in KB of an llvm `target`'s CPU (its `mcpu`, `L1D_48K`): 48 or 32 (also where
    the target names no CPU). Knobs.fit_kb's default (`default_knobs`)."""
    try:
        mcpu = str(target.attrs.get("mcpu", "")) if target is not None else ""
    except Exception:
        mcpu = ""
    return 48 if mcpu in L1D_48K else 32


def activation_rows(kind: str, x, exact: bool = False) -> list:
    """numpy: the activation arguments of a `kind` kernel for float32 rows x [T, K] (act_args order)."""
    from nextn.common.quant import activation

    acts = act_layout(kind, exact)
    if acts == "q8_iq4xs":
        return list(activation.quantize_iq4xs(x))
    if acts == "q8_0_g8":
        return list(activation.quantize_q8_0_g8(x))
    if acts == "q8_q4k":
        return list(activation.quantize_q4k(x))
    if acts == "q8":
        return list(activation.quantize(x))
    return list(activation.quantize_q8_0(x)) if acts == "q8_0" else [x]


__all__ = ["FLOAT_KINDS", "INT_KINDS", "KINDS", "KernelSpec", "Knobs", "act_args", "act_layout", "activation_rows",
           "bit_knobs", "default_knobs", "format_of", "has_vnni", "l1d_kb", "matmul", "matmul_heads", "matmul_id",
           "quantize_rows", "quantize_rows_q8_0", "takes_w_rows", "vector_width", "weight_arg"]


from dataclasses import dataclass, field as _field   # noqa: E402


@dataclass(frozen=True)
class KernelSpec:
    """One x86 kernel of a model: what it computes (everything but the knobs). `key` names it in tuning logs.

    op: "matmul" (weight [N, K]), "matmul_heads" (one [N, K] weight per head: [X = H, N, K], x [T, H, K]) or
    "matmul_id" (routed experts [X, N, K], n_used per row, x shared by the slots or one row per slot, n_weights
    weights in one pass); rows: static row count or None (symbolic T); exact: the
    float path of a kind that has an integer one too (Q8_0, IQ4_NL, MXFP4, NVFP4 under --exact-matmul)."""
    op: str
    kind: str
    N: int
    K: int
    rows: int | None = None
    X: int = 0
    n_used: int = 0
    shared_x: bool = True
    n_weights: int = 1
    exact: bool = False

    @property
    def acts(self) -> str:
        """The activation row format: "q8", "q8_0" or "f32"."""
        return format_of(self.kind, self.exact).acts

    @property
    def layout(self) -> str:
        """How the kernel takes its activation rows (`act_layout`): what the activation quantizer writes."""
        return act_layout(self.kind, self.exact)

    @property
    def key(self) -> str:
        """The kernel's name in tuning logs: `x86.OP:KIND/ACTS:N..:K..:rows1|T` (+ `:X..:used..:shared|slots:w..`
        for matmul_id, `:H..` for matmul_heads). ACTS, the activation row format ("q8", "q8_0", "f32"), says which
        of a kind's kernels it is, so knobs tuned on one kernel never reach another."""
        r = "T" if self.rows is None else str(self.rows)
        base = f"x86.{self.op}:{self.kind}/{self.acts}:N{self.N}:K{self.K}:rows{r}"
        if self.op == "matmul_id":
            base += f":X{self.X}:used{self.n_used}:{'shared' if self.shared_x else 'slots'}:w{self.n_weights}"
        elif self.op == "matmul_heads":
            base += f":H{self.X}"
        return base

    @property
    def name(self) -> str:
        return self.key.replace("x86.", "x86_").replace(":", "_").replace("/", "_").lower()

    def build(self, knobs: Knobs, vnni: bool = False):
        """The PrimFunc with `knobs`; `vnni`: the target has VNNI at knobs.width (`has_vnni`)."""
        if self.op == "matmul":
            return matmul(self.kind, self.N, self.K, self.rows, knobs, name=self.name, vnni=vnni, exact=self.exact)
        if self.op == "matmul_heads":
            return matmul_heads(self.kind, self.X, self.N, self.K, self.rows, knobs, name=self.name, vnni=vnni,
                                exact=self.exact)
        return matmul_id(self.kind, self.X, self.N, self.K, self.n_used, self.shared_x, self.n_weights, self.rows,
                         knobs, name=self.name, vnni=vnni, exact=self.exact)

    def weight_bytes(self) -> int:
        shape, dtype = weight_arg(self.kind, (self.N,) if self.op == "matmul" else (self.X, self.N), self.K)
        n = 1
        for d in shape:
            n *= d
        return n * (1 if dtype == "uint8" else 4 if dtype == "float32" else 2) * self.n_weights


def takes_w_rows(spec: KernelSpec) -> bool:
    """Whether Knobs.w_rows changes `spec`'s kernel (RowPath.multi_row: IQ4_XS, the K-quants Q2_K .. Q6_K, the
    grouped 32-block formats Q8_0, Q4_0 .. Q5_1, IQ4_NL, MXFP4, and NVFP4)."""
    return format_of(spec.kind, spec.exact).path.multi_row


def bit_knobs(spec: KernelSpec) -> tuple[str, ...]:
    """The Knobs fields that change the bits of `spec`'s rows (its path's `bit_knobs`, kernel.RowPath): `width`
    (the float lanes a row accumulates in: 8 at 32 bytes, 16 at 64 for the K-quants and IQ4_XS; the float path's
    vectors) except on the grouped 32-block integer path (Q8_0, Q4_0 .. Q5_1, IQ4_NL, MXFP4: exact int32 lane sums
    at either width), NVFP4's (int32 x 16 per block, nvfp4.py) and the codebook formats (one int32 x 8 per block
    and row at either width, codebook.py), and `unroll` on the float path (blocks per accumulation step). A
    weight's one-row decode kernel and its row-count verify kernel must give equal rows (lossless speculation),
    and they are tuned as two kernels, so these knobs stay at `default_knobs`, the same for both (compiler/tune:
    not searched, not applied from a log). The other knobs
    (tile_n, row_group, w_rows, prefetch) change only the order of memory reads (tests/test_x86_kernels.py)."""
    return format_of(spec.kind, spec.exact).path.bit_knobs


def default_knobs(spec: KernelSpec, width: int, l1d: int = 32) -> Knobs:
    """nextn's default schedule for `spec` (what a tuning log record must beat); each choice won an interleaved
    `bench/x86_rows.py --against` run (numbers: docs/performance.md, the Zen 4 sections of 2026-12-03/04).
    w_rows: 2 for the routed experts' row-count kernels (prefill, verify) of the `takes_w_rows` formats at 64-byte
    width (an expert's few rows per tile pass: each activation load serves two weight rows) and for IQ4_XS's and
    the K-quants' dense row-count kernels (lanes.lane_rows; kquant.kquant_rows, where a verify's odd row goes as a
    pair across the two weight rows), else 1 (the grouped Q8_0 / IQ4_NL dense ones did not gain; the one-row
    decode kernels keep theirs).
    prefetch_level: Knobs' 2 (into L2, kernel.prefetch) for all, the routed down experts (one short activation row
    per slot) too.
    fit_kb: `l1d`, the target's L1 data cache in KB (`l1d_kb`; why: tiles.py), twice that at 32-byte width: on
    AVX2 a row costs compute, and 2-3 verify rows of a long K (Q8_0 4096 x 10944, 35 KB of activations) ran
    1.4-1.5x faster read whole from L2 than in chunks (Zen 3, docs/performance.md; 8-row prefill groups chunk
    either way).
    width: the target's `width`, at most the path's `max_width` (the codebook formats: 32, codebook.py)."""
    path = format_of(spec.kind, spec.exact).path
    width = min(width, path.max_width)
    two = (spec.op == "matmul_id" or path.w_rows_dense == 2) and spec.rows is None and width == 64 and path.multi_row
    return Knobs(width=width, w_rows=2 if two else 1, fit_kb=2 * l1d if width == 32 else l1d)
