"""The model's tunable kernels: the fused PrimFuncs of the one-row `decode` and `draft` entry points.

Only static-shape kernels are tunable (meta_schedule measures concrete shapes); kernels with a dynamic
extent (attention over the KV length) keep nextn's default schedule. A workload is identified by the
structural hash of its PrimFunc without its symbol name, computed identically here and in `apply.py`,
so a log made on one machine matches the same kernels on another.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from nextn.compiler.graphs import MANY_ROWS

TUNED_ENTRY_POINTS = ("decode", "draft")


@dataclass
class Workload:
    hash: str
    name: str
    func: object          # tirx.PrimFunc (symbol-free)
    entry_points: list


def arg_specs(func) -> list[dict]:
    """[{shape, dtype}] of a static PrimFunc's buffer parameters (the form candidates.json stores)."""
    return [{"shape": [int(d) for d in p.shape], "dtype": str(p.dtype)} for p in func.params]


def workload_hash(func) -> str:
    import tvm_ffi

    f = func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(f, map_free_vars=True) & 0xFFFFFFFFFFFFFFFF:016x}"


def is_tunable(func) -> bool:
    """Static shapes (no symbolic extent, no scalar parameter) and at least one reduction to schedule."""
    import tvm

    if any(not isinstance(p, tvm.tirx.Buffer) for p in func.params):   # a scalar parameter: dynamic extent
        return False
    text = func.script()
    # Symbolic extents appear as `T.int64()` / `T.int32()` variable declarations in the script form.
    if re.search(r"=\s*T\.int(32|64)\(\)", text) or "TypeVar(" in text or re.search(r"\w+: T\.int(32|64)[,)]", text):
        return False
    return "T.axis.reduce" in text or re.search(r'T\.axis\.remap\("[SR]*R', text) is not None


def target_key(target) -> str:
    kind = target.kind.name
    if kind == "llvm":
        off = "".join(str(a) for a in target.attrs.get("mattr", []) if str(a).startswith("-"))
        return f"llvm:{target.attrs.get('mcpu', 'generic')}{off}"   # a VM's masked features: another ISA
    return f"{kind}:{target.attrs.get('arch', target.attrs.get('mcpu', ''))}"


def lowered_module(model: str, target, draft: str | None = None):
    """(the model's Relax module as compile builds it, its x86 lowering or None)."""
    from nextn.compiler.graphs import SPLIT_L, STATIC, build_graphs, weight_kinds
    from nextn.compiler.loader.model_files import ModelFiles
    from nextn.compiler.lower.cuda.int8 import has_dot4
    from nextn.compiler.lower.cuda.mma import has_mma
    from nextn.compiler.lower.to_relax import build_module
    from nextn.compiler.lower.x86.emit import for_target
    from nextn.compiler.target import GPU_TARGETS

    mf = ModelFiles(model, draft, load_mtp=False)
    graphs = build_graphs(mf, mf.has_nextn)
    kinds = weight_kinds(mf, graphs.values())
    x86 = for_target(target)
    gpu = target.kind.name in GPU_TARGETS
    gpu_int8 = ("cuda" if has_dot4(target) else "plain") if gpu else None   # as compile.plan's default build
    mod = build_module(list(graphs.values()), kinds, STATIC, form="gpu" if gpu else "cpu", split_l=SPLIT_L, x86=x86,
                       gpu_int8=gpu_int8, mma=target.kind.name == "cuda" and has_mma([target.attrs.get("arch", "")]),
                       many_rows=MANY_ROWS)
    return mod, x86


PREFILL_ENTRY_POINTS = tuple(sorted(MANY_ROWS))   # entry points whose rows are a prompt chunk


def x86_kernels(model: str, target, draft: str | None = None, only: str | None = None,
                max_kernels: int | None = None) -> list[tuple]:
    """[(KernelSpec, prefill)] of the model's hand-written x86 kernels (compiler/lower/x86), heaviest weight first,
    filtered by the regular expression `only` on their keys and cut to `max_kernels`. `prefill`: a symbolic-row
    kernel that a prefill entry point calls with the prompt chunk's rows (not only with its few output rows, as
    the lm head is), so tuning times it at a prefill chunk's rows as well as the verify rows."""
    mod, x86 = lowered_module(model, target, draft)
    specs = sorted((x86.specs.values() if x86 else []), key=lambda s: (-s.weight_bytes(), s.key))
    if only:
        specs = [s for s in specs if re.search(only, s.key)]
    specs = specs if max_kernels is None else specs[:max_kernels]
    chunk = _prompt_row_kernels(mod)
    return [(s, s.rows is None and s.name in chunk) for s in specs]


def x86_specs(model: str, target, draft: str | None = None, only: str | None = None,
              max_kernels: int | None = None) -> list:
    """The KernelSpecs of `x86_kernels`."""
    return [s for s, _p in x86_kernels(model, target, draft, only, max_kernels)]


def _prompt_row_kernels(mod) -> set[str]:
    """Names of the kernels that a PREFILL_ENTRY_POINTS function calls with its token count as the row count."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    first = lambda shape: shape.values[0] if hasattr(shape, "values") else shape[0]   # noqa: E731
    out = set()
    names = {gv.name_hint for gv in mod.functions}
    for ep in PREFILL_ENTRY_POINTS:
        if ep not in names:
            continue
        f = mod[ep]
        t = first(f.params[0].ty.shape)
        for block in f.body.blocks:
            for b in block.bindings:
                v = b.value
                if not (isinstance(v, relax.Call) and v.op.same_as(call_tir)):
                    continue
                ty = b.var.ty
                ty = ty.fields[0] if hasattr(ty, "fields") else ty
                if hasattr(ty, "shape") and ty.shape is not None and first(ty.shape).same_as(t):
                    out.add(v.args[0].name_hint)
    return out


def fused_module(model: str, target, draft: str | None = None):
    """The model's Relax module after the legalize and fuse phases (what the schedule phase sees)."""
    import tvm

    from nextn.compiler.lower.pipeline import phases

    mod, _x86 = lowered_module(model, target, draft)
    with target:
        for _name, passes in phases(target, None)[:2]:
            mod = tvm.transform.Sequential(passes)(mod)
    return mod


def extract(mod) -> list[Workload]:
    """Distinct static PrimFuncs called by the tuned entry points, in a deterministic order."""
    import tvm

    out: dict[str, Workload] = {}
    for ep in TUNED_ENTRY_POINTS:
        if ep not in [gv.name_hint for gv in mod.functions]:
            continue
        for callee in sorted(set(re.findall(r"call_tir\w*\((\w+)", mod[ep].script()))):
            f = mod[callee]
            if not isinstance(f, tvm.tirx.PrimFunc) or not is_tunable(f):
                continue
            h = workload_hash(f)
            if h in out:
                out[h].entry_points.append(ep)
            else:
                out[h] = Workload(h, callee, f.without_attr("global_symbol"), [ep])
    return list(out.values())


def _size(func) -> int:
    """Elements of the largest buffer: the weight for a matmul, a proxy for the kernel's work."""
    n = 1
    for p in func.params:
        s = 1
        for d in p.shape:
            s *= int(d)
        n = max(n, s)
    return n


def select(model: str, target, draft: str | None = None, only: str | None = None,
           max_kernels: int | None = None) -> list[Workload]:
    """The model's tunable workloads for `target`, heaviest first, filtered by the name regex `only` and
    cut to the `max_kernels` heaviest."""
    wls = sorted(extract(fused_module(model, target, draft)), key=lambda w: -_size(w.func))
    if only:
        wls = [w for w in wls if re.search(only, w.name)]
    return wls if max_kernels is None else wls[:max_kernels]
