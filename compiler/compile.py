"""`nextn compile`: GGUF → IR graphs per entry point (graphs.py) → Relax → TVM → artifact directory (the
manifest format: nextn.common.manifest), in three steps: `plan` (read the model, build the graphs, decide the
libraries and lower to one Relax module), `build` (one TVM build per library), `manifest` (what the runtime reads)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass

from nextn.common.compile_options import CompileOptions
from nextn.common.errors import NextnError
from nextn.common.kv_types import state_bytes_per_cell
from nextn.common.manifest import MANIFEST, MAX_DRAFT, SCHEMA, library_entry

from nextn.common.versions import nextn_version

from . import reproducible
from .graphs import FEW_ROWS, FEW_SUFFIX, MANY_ROWS, SPLIT_L, STATIC, build_graphs, max_rows, weight_kinds
from .loader.model_files import ModelFiles
from .target import GPU_TARGETS, TARGETS, make_target, required_cpu_flags

def _rel(path: str, base: str) -> str:
    path = os.path.abspath(path)
    try:
        return os.path.relpath(path, base)
    except ValueError:
        return path


def compile_model(model: str, out_dir: str, options: CompileOptions = CompileOptions(), draft: str | None = None,
                  dump_ir: str | None = None, verify_model: bool = False, log=print) -> str:
    """Compile `model` (+ optional MTP-only `draft`) with `options` (common/compile_options.py) into `out_dir`; returns
    `out_dir`. `dump_ir`: write the IR graphs and each Relax phase (GPU targets: the schedule report) to this folder.
    `verify_model`: read every byte of the model file(s) for their sha256 (logged, and recorded in the manifest);
    otherwise the manifest identifies them by their headers (common/gguf.py `GGUFFile.identity`).
    The build runs in a reproducible child process where possible (compiler/reproducible.py); the artifact is
    written to a temporary folder in `out_dir` and renamed into place, never half written. Raises NextnError for a
    bad model file or option."""
    if not reproducible.in_child() and reproducible.available():
        return reproducible.run_in_child("nextn.compiler.compile", {
            "model": os.fspath(model), "out_dir": os.fspath(out_dir), "options": options.to_json(),
            "draft": os.fspath(draft) if draft else None, "dump_ir": dump_ir, "verify_model": bool(verify_model)}, log)
    p = plan(model, options, draft, dump_ir, log)
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".nextn-", dir=out_dir)   # write then rename: never a half artifact
    try:
        built = build(p, tmp, dump_ir, log)
        man = manifest(p, built, _model_files(p.mf, os.path.abspath(out_dir), verify_model, log))
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(man, f, indent=1)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for fn in os.listdir(tmp):
        os.replace(os.path.join(tmp, fn), os.path.join(out_dir, fn))
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote {out_dir} ({man['libraries'][0]['size'] / 1e3:.0f} KB library)")
    return out_dir


@dataclass
class Plan:
    """What one compile builds, decided before any TVM build (`plan`)."""
    options: CompileOptions
    mf: ModelFiles
    with_mtp: bool           # the NextN block's entry points are built (the model has one)
    kv_types: tuple          # (type_k, type_v) names (common/kv_types.py)
    graphs: dict             # entry point name → IR graph (graphs.build_graphs)
    kinds: dict              # weight name → its buffer kind (graphs.weight_kinds)
    arch_list: list          # the normalised --arch list ([] on llvm)
    lib_arches: list         # one arch group per library: CUDA one fatbin, ROCm a code object per arch, llvm one
    x86: object              # the x86 matmul kernels' lowering (compiler/lower/x86), None off x86 / AVX2
    mod: object              # the Relax module of every entry point
    graph_entries: list      # entry points replayed as CUDA graphs
    gpu_int8: str | None = None   # the GPU matmuls' integer route: "cuda" (__dp4a), "plain", None (--exact-matmul)
    gpu_int8_weights: dict = None  # weight name -> activation row format of its integer-route GPU matmuls
    mma: bool = False        # the many-row entries' integer-route matmuls on tensor cores (lower/cuda/mma.py)


@dataclass
class Built:
    """What `build` made: the manifest's `libraries`, its `tuning_log` entry and the TVM target of the last
    library (the manifest's `target` fields)."""
    libraries: list
    tuning_info: dict | None
    tgt: object
    kernels: dict | None = None   # GPU builds: the manifest's `gpu_kernels.kernels` (kernel_report.kernel_summary)
    graph_bytes: int = 0          # CUDA graphs: the storage their captured regions allocate once (the largest build)
    graph_launches: dict | None = None   # CUDA graphs: kernels per captured entry point (pipeline.graph_launches)


def plan(model: str, options: CompileOptions, draft: str | None = None, dump_ir: str | None = None,
         log=print) -> Plan:
    """Read and check the model file(s), build the IR graphs of every entry point (written to `dump_ir` when
    given), decide the libraries to build (target, arch groups, kernel form) and lower the graphs to one Relax
    module with the x86 kernels (a tuning log's knobs) and CUDA graph capture. Raises NextnError for a bad model,
    an unsupported target, --arch or KV type."""
    from nextn.common.compile_options import parse_arches
    from .lower import capture_graphs
    from .lower.to_relax import build_module
    from .lower.x86.emit import for_target
    from .tune.apply import x86_knobs

    o = options
    mf = ModelFiles(model, draft, load_mtp=False)
    for d in getattr(mf.config, "defaults_applied", ()):   # optional keys whose absence changes the model
        log(f"warning: {mf.main.path}: {d}")
    with_mtp = mf.has_nextn
    if with_mtp:
        mf.validate_nextn()
    kv_types = o.kv_types()
    if o.target not in TARGETS:
        raise NextnError(f"unsupported target '{o.target}' (supported: {', '.join(TARGETS)})")
    arch_list = parse_arches(o.target, o.arches)
    # prefill's integer-route matmuls on tensor cores (lower/cuda/mma.py): CUDA where every arch has int8 mma.sync
    # (sm_80+), and the "gpu-emulated" form, which then tests their arithmetic; with the GEMV copies of the
    # many-row entries for calls of few rows (graphs.FEW_SUFFIX)
    from .lower.cuda.mma import has_mma
    mma = not o.exact_matmul and (o.kernel_form == "gpu-emulated" or o.kernel_form == "gpu" and o.target == "cuda"
                                  and has_mma(arch_list))
    graphs = build_graphs(mf, with_mtp, o.graph_options(), kv_types, few_rows=mma)
    kinds = weight_kinds(mf, graphs.values())
    if dump_ir:
        os.makedirs(dump_ir, exist_ok=True)
        for name, g in graphs.items():
            with open(os.path.join(dump_ir, f"0_graph_{name}.txt"), "w") as f:
                f.write(g.dump() + "\n")
    # One library per (target, arch group): CUDA puts every arch in one fatbin; ROCm builds one code object per arch.
    lib_arches = [arch_list] if o.target == "cuda" else [[a] for a in arch_list] if o.target == "rocm" else [[]]
    tgt = make_target(o.target, lib_arches[0] or None)
    # the GPU matmuls' integer route (lower/cuda/int8.py) unless --exact-matmul: __dp4a where the arch has it; the
    # "gpu-emulated" form takes it too (its definitions with int32 arithmetic on llvm), so that the tests run the
    # GPU form's quantized matmuls whole-model on a CPU, and then no x86 kernel takes a matmul
    from .lower.cuda.int8 import has_dot4
    gpu_int8 = None if o.exact_matmul or o.kernel_form == "cpu" else "cuda" if has_dot4(tgt) else "plain"
    x86 = None if gpu_int8 and o.kernel_form == "gpu-emulated" else \
        for_target(tgt, quantize_activations=not o.exact_matmul, knobs_for=x86_knobs(o.tuning_log, tgt, log))
    int8_weights = {}
    mod = build_module(list(graphs.values()), kinds, STATIC, form=o.kernel_form, split_l=SPLIT_L, x86=x86,
                       gpu_int8=gpu_int8, int8_weights=int8_weights, mma=mma, many_rows=MANY_ROWS)
    graph_entries = []
    if o.target == "cuda" and o.cuda_graph:
        mod, graph_entries = capture_graphs.mark(mod, mf.config.n_ctx_train, STATIC, FEW_ROWS, max_rows(MAX_DRAFT))
    return Plan(o, mf, with_mtp, kv_types, graphs, kinds, arch_list, lib_arches, x86, mod, graph_entries, gpu_int8,
                int8_weights, mma)


def build(p: Plan, out: str, dump_ir: str | None = None, log=print) -> Built:
    """Build `p`'s module once per arch group into the folder `out` (model_TARGET.so, ROCm: model_rocm_ARCH.so),
    scheduled by the target's default schedules and the tuning log's records (compiler/tune/apply.py)."""
    import tvm

    from nextn.schedules import schedule_pass

    from .gpu_build import build_scope
    from .lower import capture_graphs, cuda
    from .kernel_report import kernel_summary
    from .lower.pipeline import GPU_KINDS, last_graph_launches, last_graph_storage, last_kernel_report, make_pipeline
    from .tune.apply import schedule_with_log

    target, libs, tuning_info, tgt, kernels, graph_bytes = p.options.target, [], None, None, None, 0
    launches = None
    for la in p.lib_arches:
        tgt = make_target(target, la or None)
        log(f"compiling {len(p.graphs)} entry points ({', '.join(p.graphs)}) for {target}"
            f"{' ' + ','.join(la) if la else ''} ...")
        sched, tuning_info = schedule_with_log(p.options.tuning_log, tgt, schedule_pass(tgt, cuda.RULES), log)
        graph_ctx = tvm.transform.PassContext(config=capture_graphs.PASS_CONFIG) if p.graph_entries else nullcontext()
        pipeline = make_pipeline(tgt, sched, dump_ir, bool(p.graph_entries))
        with build_scope(target, la), tgt, graph_ctx:
            ex = tvm.compile(p.mod, target=tgt, relax_pipeline=pipeline)
        if tuning_info is not None:
            tuning_info["kernels_tuned"] = len(sched.applied)
            log(f"tuning log: {len(sched.applied)} kernel(s) use tuned schedules, the rest default schedules")
        _write_schedule_report(target, dump_ir)
        if target in GPU_KINDS:   # the same schedules for every arch group
            kernels = kernel_summary(last_kernel_report())
        graph_bytes = max(graph_bytes, last_graph_storage())
        launches = last_graph_launches()   # the same module for every arch group
        lib_name = f"model_{target}.so" if target != "rocm" else f"model_{target}_{la[0]}.so"
        ex.export_library(os.path.join(out, lib_name))
        libs.append(library_entry(os.path.join(out, lib_name), la))
    return Built(libs, tuning_info, tgt, kernels, graph_bytes, launches)


def manifest(p: Plan, built: Built, model_files: list[dict]) -> dict:
    """The artifact's manifest (common/manifest.py reads it; docs/design.md describes the fields) of plan `p`,
    its libraries `built` and the record of its `model_files` (`_model_files`)."""
    import tvm
    import tvm_ffi

    from .lower import capture_graphs
    from .lower.cuda.mma import MIN_ROWS

    o, c, tgt = p.options, p.mf.config, built.tgt
    graph_options = o.graph_options()
    kv = kv_plan(p.graphs, c.n_layer, p.with_mtp)
    buffers = _weight_buffers(p)
    return {
        "schema": SCHEMA,
        "nextn_version": nextn_version(),
        "tvm_version": tvm.__version__,
        "tvm_ffi_version": getattr(tvm_ffi, "__version__", "unknown"),
        "target": {"name": o.target, "kind": tgt.kind.name, "mcpu": str(tgt.attrs.get("mcpu", "")),
                   "str": str(tgt), "arches": p.arch_list,
                   "cpu_flags": required_cpu_flags(tgt) if tgt.kind.name == "llvm" else []},
        "host": platform.machine(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model_files": model_files,
        "arch": c.arch,
        "hparams": c.to_json(),
        "has_mtp": p.with_mtp,
        "options": {k: v for k, v in graph_options.items() if k in p.mf.spec.compile_options},
        # KV cache types (-ctk / -ctv) and bytes per token: trunk always, NextN when speculation is on
        "kv_cache": {"type_k": p.kv_types[0], "type_v": p.kv_types[1],
                     "caches": {n: t for g in p.graphs.values() for n, t in g.kv_types().items()},
                     "bytes_per_token": {"trunk": kv["trunk"]["bytes_per_token"],
                                         "nextn": kv["nextn"]["bytes_per_token"],
                                         "total": kv["trunk"]["bytes_per_token"] + kv["nextn"]["bytes_per_token"]},
                     # float32 recurrent states (not KV: -ctk / -ctv do not apply), one plane; an engine keeps
                     # max_draft + 2 planes with speculation, 1 without
                     "recurrent_bytes_per_plane": kv["trunk"]["bytes_per_plane"]},
        "entry_points": _entry_points(p),
        "buffer_plan": {"weights": buffers, "kv": kv,
                        "weight_bytes": sum(b["nbytes"] for b in buffers),
                        "trunk_weight_bytes": sum(b["nbytes"] for b in buffers if not b["mtp_only"])},
        "tuning_log": built.tuning_info,
        "max_draft": MAX_DRAFT,   # the deepest draft a request may ask for (common/manifest.py)
        # --spec-draft-vocab: token rows of the `_vocab` draft entries' head (graphs.reduce_head), None without
        "draft_vocab": o.draft_vocab if p.with_mtp and o.draft_vocab else None,
        "kernel_form": o.kernel_form,   # cpu, gpu, or gpu-emulated (the GPU kernels built for llvm; lower/attention/)
        # the hand-written x86 matmul kernels (compiler/lower/x86): vector width, activation quantization
        "x86_kernels": None if p.x86 is None else {"vector_bytes": p.x86.width, "kernels": len(p.x86.specs),
                                                   "activation_quant": "q8" if p.x86.quantize_activations else None},
        # steps replayed as CUDA graphs: their inputs must stay put, L is rounded up to kv_bucket; the few-row ones
        # (verify, a draft step 0 with its gap) take at most max_rows rows; static_bytes: the device memory their
        # captured regions allocate once (planned for max_rows rows and max_ctx cells); launches: the kernels each
        # entry's graph replays (a launch costs ~2-3 us on an H200 whatever it computes: docs/gpu.md)
        "cuda_graph": {"entries": p.graph_entries, "kv_bucket": capture_graphs.KV_BUCKET,
                       "max_ctx": c.n_ctx_train, "max_rows": max_rows(MAX_DRAFT),
                       "static_bytes": built.graph_bytes, "launches": built.graph_launches or {}}
        if p.graph_entries else None,
        "libraries": built.libraries,
        # prefill on tensor cores (lower/cuda/mma.py; CUDA and "gpu-emulated" artifacts only: CPU manifests keep
        # their fields): calls of fewer than min_rows rows of a many-row entry go to its GEMV copy (few_rows:
        # {entry: copy}; runtime/sequence.py)
        **({"tensor_core": {"min_rows": MIN_ROWS, "few_rows": {e: e + FEW_SUFFIX for e in sorted(MANY_ROWS)
                                                               if e + FEW_SUFFIX in p.graphs}}} if p.mma else {}),
        # GPU artifacts only (CPU manifests keep their fields): the GPU matmuls (compiler/lower/cuda) take int8
        # activation rows ("q8": the integer route, `dot` "cuda" for __dp4a) or float ones (None: --exact-matmul);
        # `kernels`: per PrimFunc its schedule rule, weight bytes and launch shape (compiler/kernel_report.py)
        **({"gpu_kernels": {"activation_quant": "q8" if p.gpu_int8 else None, "dot": p.gpu_int8,
                            "kernels": built.kernels}}
           if o.kernel_form == "gpu" else {}),
    }


def _entry_points(p: Plan) -> dict:
    """The manifest's `entry_points`: each entry point's inputs, states (as their buffers hold them), weights and
    outputs, in the order of its compiled function's arguments."""
    from .lower.to_relax import weight_params

    out = {}
    for name, g in p.graphs.items():
        out[name] = {
            "graph": g.kind,
            "inputs": [{"name": n, "dtype": v.dtype, "shape": list(v.shape)} for n, v in g.inputs.items()],
            "states": list(g.states),
            # states as their buffers hold them (a KV cache: its type's storage, nextn.common.kv_types)
            "state_shapes": {n: _storage(v)[1] for n, v in g.states.items()},
            "state_dtypes": {n: _storage(v)[0] for n, v in g.states.items()},
            "weights": [w[0] for w in weight_params(g, p.kinds)],
            "outputs": list(g.outputs),
            "ops": g.op_counts(),
            "static": STATIC.get(name, {}),
            # recurrent states: the state after each of the last rows is kept (verify, decode), or only after the
            # last row (the chunked KDA form of prefill, which the GPU form does not use); see ir/graph.py
            "keeps_row_states": p.options.split or all(n.attrs.get("chunk", 0) == 0 for n in g.live_nodes()
                                                       if n.op == "gated_delta_net"),
        }
    return out


def _weight_buffers(p: Plan) -> list[dict]:
    """The buffer plan's `weights`: one record per weight buffer of every entry point, first use first."""
    import numpy as np

    from .lower.to_relax import weight_params

    trunk_buffers = {w[0] for gg in p.graphs.values() if gg.kind == "trunk" for w in weight_params(gg, p.kinds)}
    buffers, seen = [], set()
    for g in p.graphs.values():
        for (buf, dtype, shape), wname in zip(weight_params(g, p.kinds), _weight_of_buffer(g, p.kinds)):
            if buf in seen:
                continue
            seen.add(buf)
            rows_of = g.weights[wname].attrs.get("rows_of")   # a reduced draft head: rows of this tensor
            buffers.append({"buffer": buf, "tensor": rows_of or wname, "kind": p.kinds[wname], "dtype": dtype,
                            # "draft_vocab": the runtime gathers the tensor's rows of the draft vocabulary's ids
                            "rows": "draft_vocab" if rows_of else None,
                            "shape": list(shape), "nbytes": int(np.prod(shape)) * np.dtype(dtype).itemsize,
                            # this weight's matmuls take int8 activation rows in this row format ("q8" per 256,
                            # "q8_0" per 32: nextn.common.quant.activation), else None
                            # (the CUDA integer route's: lower/cuda/int8.py, the same row formats)
                            "activation": p.x86.quantized_weights.get(wname) if p.x86 is not None else
                            (p.gpu_int8_weights or {}).get(wname),
                            "role": "draft" if p.mf.draft is not None and p.mf.file_of(rows_of or wname) is p.mf.draft
                            else "model",
                            "mtp_only": buf not in trunk_buffers})
    return buffers


def kv_plan(graphs: dict, n_layer: int, with_mtp: bool) -> dict:
    """The static per-layer state buffers (C = context) of `graphs`, trunk and NextN separately: KV caches (in their
    -ctk / -ctv storage) and any arch-specific states, with `bytes_per_token`, the bytes one context cell takes
    (what the manifest's `kv_cache.bytes_per_token` and the memory budget count), and `bytes_per_plane`, the bytes
    of one plane of the recurrent states ([P, ...]: glm5next's KDA), per sequence whatever its length."""
    kv = {key: {"layers": (n_layer if kind == "trunk" else int(with_mtp)),
                "states": {n: {"shape": _storage(v)[1], "dtype": _storage(v)[0],
                               "kv_type": v.attrs.get("kv_type")}
                           for g in graphs.values() if g.kind == kind for n, v in g.states.items()}}
          for kind, key in (("trunk", "trunk"), ("mtp", "nextn"))}
    for part in kv.values():
        per_cell = [_cell_bytes(st) for st in part["states"].values()]
        part["bytes_per_token"] = sum(b for b in per_cell if b is not None)
        part["bytes_per_plane"] = sum(state_bytes_per_cell(st["shape"], st["dtype"]) for st in part["states"].values()
                                      if st["shape"][0] == "P")
    return kv


def _cell_bytes(st: dict):
    """Bytes per context cell of a position-indexed state ([C, ...]; [C//k, ...]: one row per k cells), None for
    a recurrent one ([P, ...])."""
    d0 = st["shape"][0]
    if d0 == "C":
        return state_bytes_per_cell(st["shape"], st["dtype"])
    if isinstance(d0, str) and d0.startswith("C//"):
        b, k = state_bytes_per_cell(st["shape"], st["dtype"]), int(d0[3:])
        return b // k if b % k == 0 else b / k
    return None


def _storage(state_node):
    """(dtype, shape with "C") of a state's buffer."""
    from .lower.attention import state_storage

    return state_storage(state_node, lambda shape: [d if isinstance(d, str) else int(d) for d in shape])


def _model_files(mf, out_abs: str, verify: bool, log) -> list[dict]:
    """The manifest's record of the model GGUF(s). Referenced, not copied (the weights stay in the GGUF): the
    path relative to the artifact and absolute (a split GGUF: its first shard), the total size, the header identity
    and each shard's size, plus each shard's sha256 when `verify` (read with a progress bar, and logged in
    sha256sum's format)."""
    out = []
    for role, f in (("model", mf.main), ("draft", mf.draft)):
        if f is None:
            continue
        shards = [{"file": os.path.basename(s.path), "size": s.size} for s in f.shards]
        if verify:
            for sh, p, digest in zip(shards, f.paths, f.sha256(progress=True)):
                sh["sha256"] = digest
                log(f"sha256 {digest}  {p}")
        out.append({"role": role, "path": os.path.abspath(f.path), "relpath": _rel(f.path, out_abs), "size": f.size,
                    "identity": f.identity(), "shards": shards})
    return out


def _write_schedule_report(target: str, dump_dir: str | None):
    """With --dump-ir on a GPU target: DIR/schedule_report.json, PrimFunc → the schedule rule that took it
    (python -m nextn.compiler.schedule_report prints the same table without a build)."""
    if not dump_dir or target not in GPU_TARGETS:
        return
    from nextn.schedules.gpu import last_report

    with open(os.path.join(dump_dir, "schedule_report.json"), "w") as f:
        json.dump(last_report(), f, indent=1, sort_keys=True)


def _weight_of_buffer(g, kinds):
    from .lower.to_relax import weight_buffers

    for name, node in g.weights.items():
        for _ in weight_buffers(kinds[name], node.shape):
            yield name


def _compile_in_child(options: dict, **kwargs) -> str:
    """compile_model with the options as `CompileOptions.to_json` sent them to the child."""
    return compile_model(options=CompileOptions.from_json(options), **kwargs)


if __name__ == "__main__":   # the reproducible child (compiler/reproducible.py) runs the build here
    sys.exit(reproducible.child_main(_compile_in_child, sys.argv[1]))
