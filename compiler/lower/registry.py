"""The Relax lowering's registry: one function per IR op (compiler/ir/ops.py), fn(bb, node, args, cx) → the node's
Relax value, registered with `@lower(op)` by the module of the op's family (attention/, indexer/, mhc/, recurrent/;
to_relax.py for the ops that go through TE). to_relax.py imports every family and checks at import that the table is
covered (`ops.check_impls`)."""
from __future__ import annotations

from tvm import tirx

from nextn.common.manifest import split_dim
from nextn.compiler.ir.ops import registry

WHERE = "Relax lowering (compiler/lower/registry.py)"
LOWER: dict = {}   # op name -> fn(bb, node, args, cx): the node's Relax value
lower = registry(LOWER, WHERE)


class Cx:
    """What an op's lowering may read besides its node and arguments: `sym` (the shape symbols T, L, ... as TIR
    variables, or the static sizes), `kernels` (attention.Kernels: the kernel form and the kernels added so far),
    `split_l` (attention split over L: flash-decoding), `many_rows` (the entry's calls carry many rows: a prompt;
    graphs.MANY_ROWS)."""

    def __init__(self, sym: dict, kernels, split_l: bool, many_rows: bool = False):
        self.sym, self.kernels, self.split_l, self.many_rows = sym, kernels, split_l, many_rows


def float_buffers(args: list) -> list:
    """`args` with each float weight (kind "f32", [buffer], shape) as its buffer: for the hand-written kernels, which
    take no quantized weight. Raises AssertionError for a quantized one."""
    out = [a[1][0] if isinstance(a, tuple) and a[0] == "f32" else a for a in args]
    assert all(not isinstance(a, tuple) for a in out), "a quantized weight given to a hand-written kernel"
    return out


def dim_expr(d, sym):
    """An IR dimension (the grammar: nextn.common.manifest) as a TIR expression: an int, a symbol, or "X//k"."""
    if isinstance(d, int):
        return d
    base, k = split_dim(d)
    return sym[base] if k == 1 else tirx.floordiv(sym[base], k)
