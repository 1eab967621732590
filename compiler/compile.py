"""`nextn compile`: GGUF → IR graphs per entry point → Relax → TVM → artifact directory.

Entry points (fixed names; the runtime never contains model-specific code):
    prefill    trunk over the prompt rows; logits for `out_ids` rows only
    verify     trunk over [id_last, d1..dk] (k+1 rows); logits and argmax for every row
    mtp_rows   NextN rows teacher-forced with trunk hidden states (prompt warm-up, after each verify)
    mtp_draft  NextN rows with logits for every row (`mtp_logits` uses T rows)
    decode     `verify` specialised to one row (plain decoding): static shapes, fewer VM shape checks, tunable
    draft      `mtp_draft` specialised to one row (a draft step)
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import tempfile
from contextlib import nullcontext

from nextn.runtime.artifact import MANIFEST, SCHEMA, sha256_file
from nextn.runtime.errors import NextnError

from .loader.model_files import ModelFiles

ENTRY_POINTS = {
    "prefill": ("trunk", False),
    "verify": ("trunk", True),
    "mtp_rows": ("mtp", False),
    "mtp_draft": ("mtp", True),
    "decode": ("trunk", True),
    "draft": ("mtp", True),
}
MAX_DRAFT = 8
# Entry points whose symbols are fixed at compile time; the runtime routes one-row calls to them.
STATIC = {"decode": {"T": 1}, "draft": {"T": 1}, "mtp_draft_shared": {"T": 1}}
TARGETS = ("llvm", "cuda", "rocm")
GPU_TARGETS = ("cuda", "rocm")   # scratch-holding ops as separate kernels there (to_relax.SPLIT_OPS)


def nextn_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nextn")
    except PackageNotFoundError:
        return "0+unknown"


def make_target(target: str, arches: list[str] | None = None):
    """The TVM target for `target`; for GPUs, `arches` (see gpu_build.parse_arches): CUDA schedules for the lowest
    (its fatbin holds all), ROCm takes one arch per target (one library each)."""
    from tvm.target import Target

    if target in ("cuda", "rocm"):
        from .gpu_build import cuda_target, parse_arches, rocm_target

        arches = parse_arches(target, arches)
        return cuda_target(arches) if target == "cuda" else rocm_target(arches[0])
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


def build_graphs(mf: ModelFiles, with_mtp: bool, options: dict | None = None):
    """Graphs of every entry point; `options` are compile options (e.g. mtp_dense_attention), passed to the
    arch's builders that declare them (ModelSpec.compile_options). Each graph's `kind` is "trunk" or "mtp"."""
    spec, c = mf.spec, mf.config
    opts = {k: v for k, v in (options or {}).items() if k in spec.compile_options}
    graphs = {}
    for name, (kind, all_rows) in ENTRY_POINTS.items():
        if kind == "mtp" and not with_mtp:
            continue
        g = spec.build_trunk(c, mf.has_tensor, all_rows) if kind == "trunk" else spec.build_mtp(c, mf.has_tensor, all_rows, **opts)
        g.name, g.kind = name, kind
        graphs[name] = g
    if spec.extra_entry_points is not None:
        for name, (kind, g) in spec.extra_entry_points(c, mf.has_tensor, **opts).items():
            if kind == "mtp" and not with_mtp:
                continue
            g.name, g.kind = name, kind
            graphs[name] = g
    return graphs


def _rel(path: str, base: str) -> str:
    path = os.path.abspath(path)
    try:
        return os.path.relpath(path, base)
    except ValueError:
        return path


def compile_model(model: str, out_dir: str, target: str = "llvm", draft: str | None = None,
                  dump_ir: str | None = None, log=print, arches=None, mtp_dense_attention: bool = False,
                  tuning_log: str | None = None, cuda_graph: bool = True, split_kernels: bool | None = None) -> str:
    """Compile `model` (+ optional MTP-only `draft`) for `target` into `out_dir`; returns `out_dir`.
    `mtp_dense_attention`: glm-dsa NextN block with dense MLA and no indexer (llama.cpp's graph_mtp).
    `cuda_graph` (CUDA only): the one-row steps replay as CUDA graphs (lower/capture_graphs.py).
    `split_kernels`: attention, the DSA index score and top-k as separate kernels (to_relax.SPLIT_OPS); default:
    on GPU targets only (tests set it on llvm to check the GPU form's arithmetic).
    The build runs in a reproducible child process where possible (compiler/reproducible.py)."""
    from . import reproducible

    if not reproducible.in_child() and reproducible.available():
        return reproducible.run_in_child(
            {"model": os.fspath(model), "out_dir": os.fspath(out_dir), "target": target,
             "draft": os.fspath(draft) if draft else None, "dump_ir": dump_ir, "arches": list(arches) if arches else None,
             "mtp_dense_attention": bool(mtp_dense_attention),
             "tuning_log": os.fspath(tuning_log) if tuning_log else None, "cuda_graph": bool(cuda_graph),
             "split_kernels": split_kernels}, log)
    import tvm
    import tvm_ffi

    from nextn.schedules import schedule_pass

    from .lower import capture_graphs
    from .lower.pipeline import make_pipeline
    from .lower.to_relax import build_module, weight_params

    mf = ModelFiles(model, draft, load_mtp=False)
    with_mtp = mf.has_nextn
    if with_mtp:
        mf._validate_nextn()
    options = {"mtp_dense_attention": bool(mtp_dense_attention)}
    graphs = build_graphs(mf, with_mtp, options)
    kinds = {n: weight_kind(mf, n) for g in graphs.values() for n in g.weights}
    if dump_ir:
        os.makedirs(dump_ir, exist_ok=True)
        for name, g in graphs.items():
            with open(os.path.join(dump_ir, f"0_graph_{name}.txt"), "w") as f:
                f.write(g.dump() + "\n")
    if target not in TARGETS:
        raise NextnError(f"unsupported target '{target}' (supported: {', '.join(TARGETS)})")
    from .gpu_build import parse_arches

    arch_list = parse_arches(target, arches)
    # One library per (target, arch group): CUDA puts every arch in one fatbin; ROCm builds one code object per arch.
    lib_arches = [arch_list] if target == "cuda" else [[a] for a in arch_list] if target == "rocm" else [[]]
    tgt = make_target(target, lib_arches[0] or None)
    split = target in GPU_TARGETS if split_kernels is None else bool(split_kernels)
    mod = build_module(list(graphs.values()), kinds, STATIC, split_kernels=split)
    graph_entries = []
    if target == "cuda" and cuda_graph:
        mod, graph_entries = capture_graphs.mark(mod, mf.config.n_ctx_train, STATIC)
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".nextn-", dir=out_dir)   # write then rename: never a half artifact
    libs = []
    try:
        from .gpu_build import build_scope, write_schedule_report

        for la in lib_arches:
            tgt = make_target(target, la or None)
            log(f"compiling {len(graphs)} entry points ({', '.join(graphs)}) for {target}"
                f"{' ' + ','.join(la) if la else ''} ...")
            from .tune.apply import schedule_with_log

            sched, tuning_info = schedule_with_log(tuning_log, tgt, schedule_pass(tgt), log)
            graph_ctx = tvm.transform.PassContext(config=capture_graphs.PASS_CONFIG) if graph_entries else nullcontext()
            with build_scope(target, la), tgt, graph_ctx:
                ex = tvm.compile(mod, target=tgt, relax_pipeline=make_pipeline(tgt, sched, dump_ir, bool(graph_entries)))
            if tuning_info is not None:
                tuning_info["kernels_tuned"] = len(sched.applied)
                log(f"tuning log: {len(sched.applied)} kernel(s) use tuned schedules, the rest default schedules")
            write_schedule_report(target, dump_ir)
            lib_name = f"model_{target}.so" if target != "rocm" else f"model_{target}_{la[0]}.so"
            ex.export_library(os.path.join(tmp, lib_name))
            libs.append({"file": lib_name, "sha256": sha256_file(os.path.join(tmp, lib_name)),
                         "size": os.path.getsize(os.path.join(tmp, lib_name)), "arches": la})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    entry_points = {}
    for name, g in graphs.items():
        entry_points[name] = {
            "graph": g.kind,
            "inputs": [{"name": n, "dtype": v.dtype, "shape": list(v.shape)} for n, v in g.inputs.items()],
            "states": list(g.states),
            "state_shapes": {n: [d if isinstance(d, str) else int(d) for d in v.shape] for n, v in g.states.items()},
            "state_dtypes": {n: v.dtype for n, v in g.states.items()},
            "weights": [p[0] for p in weight_params(g, kinds)],
            "outputs": list(g.outputs),
            "ops": g.op_counts(),
            "static": STATIC.get(name, {}),
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
                            "mtp_only": buf not in {p[0] for n, gg in graphs.items() if gg.kind == "trunk"
                                                    for p in weight_params(gg, kinds)}})
    c = mf.config
    # Static per-layer state buffers (C = context), trunk and NextN separately: KV, and any arch-specific ones.
    kv = {key: {"layers": (c.n_layer if kind == "trunk" else int(with_mtp)), "dtype": "float32",
                "states": {n: [d if isinstance(d, str) else int(d) for d in v.shape]
                           for g in graphs.values() if g.kind == kind for n, v in g.states.items()}}
          for kind, key in (("trunk", "trunk"), ("mtp", "nextn"))}
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
                   "str": str(tgt), "arches": arch_list},
        "host": platform.machine(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model_files": model_files,
        "arch": c.arch,
        "hparams": c.to_json(),
        "has_mtp": with_mtp,
        "options": {k: v for k, v in options.items() if k in mf.spec.compile_options},
        "entry_points": entry_points,
        "buffer_plan": {"weights": buffers, "kv": kv,
                        "weight_bytes": sum(b["nbytes"] for b in buffers),
                        "trunk_weight_bytes": sum(b["nbytes"] for b in buffers if not b["mtp_only"])},
        "tuning_log": tuning_info,
        # The deepest draft a request may ask for; per-request n_max is lowered to it (the KV buffers of the
        # static engine hold any depth, this bounds the per-position stats and the adaptive controller).
        "max_draft": MAX_DRAFT,
        "split_kernels": split,   # attention / index score / top-k as separate kernels (to_relax.SPLIT_OPS)
        # one-row steps replayed as CUDA graphs: their inputs must stay put, L is rounded up to kv_bucket
        "cuda_graph": {"entries": graph_entries, "kv_bucket": capture_graphs.KV_BUCKET,
                       "max_ctx": mf.config.n_ctx_train} if graph_entries else None,
        "libraries": libs,
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
