"""`nextn compile`: GGUF → IR graphs per entry point → Relax → TVM → artifact directory.

Entry points (fixed names; the runtime never contains model-specific code):
    prefill    trunk over the prompt rows; logits for `out_ids` rows only
    verify     trunk over [id_last, d1..dk] (k+1 rows); logits and argmax for every row
    mtp_rows   NextN rows teacher-forced with trunk hidden states (prompt warm-up, after each verify)
    mtp_draft  NextN rows with logits for every row (a draft step is T = 1; `mtp_logits` uses T rows)
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import tempfile

from nextn.runtime.artifact import MANIFEST, SCHEMA, sha256_file
from nextn.runtime.errors import NextnError

from .loader.model_files import ModelFiles

ENTRY_POINTS = {
    "prefill": ("trunk", False),
    "verify": ("trunk", True),
    "mtp_rows": ("mtp", False),
    "mtp_draft": ("mtp", True),
}
TARGETS = ("llvm",)


def nextn_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nextn")
    except PackageNotFoundError:
        return "0+unknown"


def make_target(target: str):
    from tvm.target import Target

    if target == "llvm":
        # This host's CPU: the kernels use its vector ISA (the manifest records it; the runtime checks it).
        from tvm.target import codegen

        return Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    raise NextnError(f"unsupported target '{target}' (supported: {', '.join(TARGETS)})")


def weight_kind(mf: ModelFiles, name: str) -> str:
    """Buffer-plan kind of a tensor: its quantized format's kind, or "f32" (float types are widened on load)."""
    from .quant import by_ggml_type

    fmt = by_ggml_type(mf.file_of(name).tensor_type(name))
    return fmt.kind if fmt is not None else "f32"


def build_graphs(mf: ModelFiles, with_mtp: bool):
    spec, c = mf.spec, mf.config
    graphs = {}
    for name, (kind, all_rows) in ENTRY_POINTS.items():
        if kind == "mtp" and not with_mtp:
            continue
        build = spec.build_trunk if kind == "trunk" else spec.build_mtp
        g = build(c, mf.has_tensor, all_rows)
        g.name = name
        graphs[name] = g
    return graphs


def _rel(path: str, base: str) -> str:
    path = os.path.abspath(path)
    try:
        return os.path.relpath(path, base)
    except ValueError:
        return path


def compile_model(model: str, out_dir: str, target: str = "llvm", draft: str | None = None,
                  dump_ir: str | None = None, log=print) -> str:
    """Compile `model` (+ optional MTP-only `draft`) for `target` into `out_dir`; returns `out_dir`."""
    import tvm
    import tvm_ffi

    from nextn.schedules import schedule_pass

    from .lower.pipeline import make_pipeline
    from .lower.to_relax import build_module, weight_params

    mf = ModelFiles(model, draft, load_mtp=False)
    with_mtp = mf.has_nextn
    if with_mtp:
        mf._validate_nextn()
    graphs = build_graphs(mf, with_mtp)
    kinds = {n: weight_kind(mf, n) for g in graphs.values() for n in g.weights}
    if dump_ir:
        os.makedirs(dump_ir, exist_ok=True)
        for name, g in graphs.items():
            with open(os.path.join(dump_ir, f"0_graph_{name}.txt"), "w") as f:
                f.write(g.dump() + "\n")
    tgt = make_target(target)
    mod = build_module(list(graphs.values()), kinds)
    log(f"compiling {len(graphs)} entry points ({', '.join(graphs)}) for {target} ...")
    with tgt:
        ex = tvm.compile(mod, target=tgt, relax_pipeline=make_pipeline(tgt, schedule_pass(tgt), dump_ir))

    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".nextn-", dir=out_dir)   # write then rename: never a half artifact
    lib_name = f"model_{target}.so"
    ex.export_library(os.path.join(tmp, lib_name))

    entry_points = {}
    for name, g in graphs.items():
        entry_points[name] = {
            "graph": "trunk" if ENTRY_POINTS[name][0] == "trunk" else "mtp",
            "inputs": [{"name": n, "dtype": v.dtype, "shape": list(v.shape)} for n, v in g.inputs.items()],
            "states": list(g.states),
            "state_shapes": {n: [d if isinstance(d, str) else int(d) for d in v.shape] for n, v in g.states.items()},
            "state_dtypes": {n: v.dtype for n, v in g.states.items()},
            "weights": [p[0] for p in weight_params(g, kinds)],
            "outputs": list(g.outputs),
            "ops": g.op_counts(),
        }
    buffers, seen = [], set()
    for g in graphs.values():
        for (buf, dtype, shape), wname in zip(weight_params(g, kinds), _weight_of_buffer(g, kinds)):
            if buf in seen:
                continue
            seen.add(buf)
            import numpy as np

            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            buffers.append({"buffer": buf, "tensor": wname, "kind": kinds[wname], "dtype": dtype,
                            "shape": list(shape), "nbytes": nbytes,
                            "role": "draft" if mf.draft is not None and mf.file_of(wname) is mf.draft else "model",
                            "mtp_only": buf not in {p[0] for n, gg in graphs.items() if ENTRY_POINTS[n][0] == "trunk"
                                                    for p in weight_params(gg, kinds)}})
    c = mf.config
    kv = {
        "trunk": {"layers": c.n_layer, "shape": ["C", c.n_head_kv, c.head_dim], "dtype": "float32", "k_and_v": True},
        "nextn": {"layers": 1 if with_mtp else 0, "shape": ["C", c.n_head_kv, c.head_dim], "dtype": "float32", "k_and_v": True},
    }
    out_abs = os.path.abspath(out_dir)
    # Model files are referenced, not copied (weights stay in the GGUF): path relative to the artifact and absolute.
    model_files = [{"role": role, "path": os.path.abspath(f.path), "relpath": _rel(f.path, out_abs),
                    "size": os.path.getsize(f.path), "sha256": f.sha256()}
                   for role, f in (("model", mf.main), ("draft", mf.draft)) if f is not None]
    manifest = {
        "schema": SCHEMA,
        "nextn_version": nextn_version(),
        "tvm_version": tvm.__version__,
        "tvm_ffi_version": getattr(tvm_ffi, "__version__", "unknown"),
        "target": {"name": target, "kind": tgt.kind.name, "mcpu": str(tgt.attrs.get("mcpu", "")),
                   "str": str(tgt)},
        "host": platform.machine(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model_files": model_files,
        "arch": c.arch,
        "hparams": c.to_json(),
        "has_mtp": with_mtp,
        "entry_points": entry_points,
        "buffer_plan": {"weights": buffers, "kv": kv,
                        "weight_bytes": sum(b["nbytes"] for b in buffers),
                        "trunk_weight_bytes": sum(b["nbytes"] for b in buffers if not b["mtp_only"])},
        "tuning_log": None,
        "libraries": [{"file": lib_name, "sha256": sha256_file(os.path.join(tmp, lib_name)),
                       "size": os.path.getsize(os.path.join(tmp, lib_name))}],
    }
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    for fn in os.listdir(tmp):
        os.replace(os.path.join(tmp, fn), os.path.join(out_dir, fn))
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote {out_dir} ({manifest['libraries'][0]['size'] / 1e3:.0f} KB library)")
    return out_dir


def _weight_of_buffer(g, kinds):
    from .lower.to_relax import weight_buffers

    for name, node in g.weights.items():
        for _ in weight_buffers(kinds[name], node.shape):
            yield name
