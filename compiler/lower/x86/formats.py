"""The x86 formats by GGUF kind, and what a kind's kernel takes as arguments.

Each format declares its `path` (kernel.Format, kernel.RowPath), one module per path family:

    kquant.py    Q2_K .. Q6_K            "q8" rows (Q4_K / Q5_K in their nibble order, "q8_q4k")
    lanes.py     IQ4_XS                  "q8_iq4xs" rows
    block32.py   Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4  "q8_0_g8" rows (groups of 8 blocks, then single blocks)
    codebook.py  IQ1_S .. IQ3_S          "q8" rows
    nvfp4.py     NVFP4                   "q8_0" rows (one block of 64 at a time, 16 lanes of sub-block sums)
    floats.py    F16, BF16, F32, and Q8_0 / IQ4_NL / MXFP4 / NVFP4 under --exact-matmul: float32 rows

Integer path: the activation row is int8 per 256 (32) values (`nextn.common.quant.activation`), a block's quants
are multiplied with it exactly and its float factors enter once per block (or group) through one FMA per term, as
ggml-cpu's ggml_vec_dot_*_q8_K / *_q8_0 (ggml-cpu/arch/x86/quants.c). Float path: each weight dequantized exactly,
one FMA per weight.
"""
from __future__ import annotations

from .block32 import IQ4NLInt, MXFP4Int, Q40Int, Q41Int, Q50Int, Q51Int, Q80Int
from .codebook import CODEBOOK_FORMATS
from .floats import IQ4NL, MXFP4, NVFP4, Q80, Plain
from .kernel import layout_args
from .kquant import Q2K, Q3K, Q4K, Q5K, Q6K
from .lanes import IQ4XS
from .nvfp4 import NVFP4Int

BLOCK32_FORMATS = {"q8_0": Q80Int(), "q4_0": Q40Int(), "q4_1": Q41Int(), "q5_0": Q50Int(), "q5_1": Q51Int(),
                   "iq4_nl": IQ4NLInt(), "mxfp4": MXFP4Int()}
INT_FORMATS = {"q2_k": Q2K(), "q3_k": Q3K(), "q4_k": Q4K(), "q5_k": Q5K(), "q6_k": Q6K(), "iq4_xs": IQ4XS(),
               **BLOCK32_FORMATS, **CODEBOOK_FORMATS, "nvfp4": NVFP4Int()}
# kinds in both: the float formats are the --exact-matmul path (float32 activation rows)
FLOAT_FORMATS = {"q8_0": Q80(), "iq4_nl": IQ4NL(), "mxfp4": MXFP4(), "f16": Plain("float16"), "bf16": Plain("uint16"),
                 "f32": Plain("float32"), "nvfp4": NVFP4()}


def format_of(kind: str, exact: bool = False):
    """The implementation of `kind`: integer (quantized activation rows) unless `exact` or it has none."""
    return INT_FORMATS[kind] if kind in INT_FORMATS and not (exact and kind in FLOAT_FORMATS) else FLOAT_FORMATS[kind]


def weight_arg(kind: str, lead: tuple, K: int) -> tuple[tuple, str]:
    """(shape, dtype) of the weight argument: block bytes per row, or a plain float tensor's elements."""
    from .kernel import weight_arg as arg

    return arg(format_of(kind), lead, K)


def act_layout(kind: str, exact: bool = False) -> str:
    """How a `kind` kernel takes its activation rows: the row format (`acts`: "q8", "q8_0", "f32"), or a layout
    of it ("q8_q4k": the "q8" values in Q4_K's nibble order, kquant.Q4K; "q8_iq4xs": in IQ4_XS's order,
    lanes.IQ4XS; "q8_0_g8": the "q8_0" values in groups of 8 blocks in that order, block32.IQ4NLInt)."""
    return format_of(kind, exact).layout


def act_args(kind: str, rows, K: int, exact: bool = False) -> list[tuple[str, tuple, str]]:
    """[(name, shape, dtype)] of a kernel's activation arguments: the "q8" row (int8 values, f32 scale per 256,
    i16 sums per 16) for the super-block integer formats (for Q4_K / Q5_K in their nibble order), in IQ4_XS's
    order with i32 lane offsets per 16 for IQ4_XS, the "q8_0" row (int8 values, f32 scale per 32) for the
    32-block ones (for IQ4_NL / MXFP4 in groups of 8 blocks, with each lane's scale and offset per group), the
    float32 row otherwise (`exact`: the float path where a kind has both)."""
    return layout_args(act_layout(kind, exact), rows, K)
