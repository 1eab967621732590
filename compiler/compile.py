"""`nextn compile`: GGUF → IR graphs per entry point (graphs.py) → Relax → TVM → artifact directory (the
manifest format: nextn.common.manifest)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
from contextlib import nullcontext

from nextn.common.errors import NextnError
from nextn.common.kv_types import DEFAULT as DEFAULT_KV, kv_type, state_bytes_per_cell
from nextn.common.manifest import MANIFEST, MAX_DRAFT, SCHEMA, library_entry

from nextn.common.versions import nextn_version

from . import reproducible
from .graphs import SPLIT_L, STATIC, build_graphs, weight_kinds
from .loader.model_files import ModelFiles
from .target import GPU_TARGETS, TARGETS, make_target, required_cpu_flags

def _rel(path: str, base: str) -> str:
    path = os.path.abspath(path)
    try:
        return os.path.relpath(path, base)
    except ValueError:
        return path


def compile_model(model: str, out_dir: str, target: str = "llvm", draft: str | None = None,
                  dump_ir: str | None = None, log=print, arches=None, mtp_dense_attention: bool = False,
                  tuning_log: str | None = None, cuda_graph: bool = True, split_kernels: bool | None = None,
                  cache_type_k: str = DEFAULT_KV, cache_type_v: str = DEFAULT_KV, exact_matmul: bool = False,
                  verify_model: bool = False, draft_vocab: int = 0) -> str:
    """Compile `model` (+ optional MTP-only `draft`) for `target` into `out_dir`; returns `out_dir`.
    `mtp_dense_attention`: glm-dsa NextN block with dense MLA and no indexer (llama.cpp's graph_mtp).
    `cuda_graph` (CUDA only): the one-row steps replay as CUDA graphs (lower/capture_graphs.py).
    `split_kernels`: the GPU form of the kernels (lower/attention/; to_relax.SPLIT_OPS as separate kernels);
    default: on GPU targets only (on llvm, tests set it to check the GPU form's arithmetic with serial threads).
    `cache_type_k` / `cache_type_v`: KV cache types (llama.cpp -ctk / -ctv: f32, f16, bf16, q8_0; glm-dsa's latent
    and indexer key caches take the K type), fixed here because the kernels read the caches' storage.
    `exact_matmul` (llvm): float activations in every matmul; by default the CPU's K-quant / IQ4_XS / Q8_0 / IQ4_NL /
    MXFP4 matmuls take int8-quantized activation rows, as ggml-cpu does (compiler/lower/x86, nextn.common.quant.activation).
    `verify_model`: read every byte of the model file(s) for their sha256 (logged, and recorded in the manifest);
    otherwise the manifest identifies them by their headers (common/gguf.py `GGUFFile.identity`).
    `draft_vocab` N (--spec-draft-vocab; 0: none): also the draft entries with a head of N token rows
    (graphs.reduce_head), whose weight the runtime gathers from the head tensor at load (buffer plan `rows`).
    The build runs in a reproducible child process where possible (compiler/reproducible.py)."""
    if not reproducible.in_child() and reproducible.available():
        return reproducible.run_in_child("nextn.compiler.compile", {
            "model": os.fspath(model), "out_dir": os.fspath(out_dir), "target": target,
            "draft": os.fspath(draft) if draft else None, "dump_ir": dump_ir, "arches": list(arches) if arches else None,
            "mtp_dense_attention": bool(mtp_dense_attention),
            "tuning_log": os.fspath(tuning_log) if tuning_log else None, "cuda_graph": bool(cuda_graph),
            "split_kernels": split_kernels, "cache_type_k": cache_type_k, "cache_type_v": cache_type_v,
            "exact_matmul": bool(exact_matmul), "verify_model": bool(verify_model),
            "draft_vocab": int(draft_vocab or 0)}, log)
    import tvm
    import tvm_ffi

    from nextn.schedules import schedule_pass

    from .lower import capture_graphs
    from .lower.pipeline import make_pipeline
    from .lower.to_relax import build_module, weight_params

    mf = ModelFiles(model, draft, load_mtp=False)
    for d in getattr(mf.config, "defaults_applied", ()):   # optional keys whose absence changes the model
        log(f"warning: {mf.main.path}: {d}")
    with_mtp = mf.has_nextn
    if with_mtp:
        mf._validate_nextn()
    options = {"mtp_dense_attention": bool(mtp_dense_attention), "draft_vocab": int(draft_vocab or 0)}
    type_k, type_v = kv_type(cache_type_k, "--cache-type-k").name, kv_type(cache_type_v, "--cache-type-v").name
    graphs = build_graphs(mf, with_mtp, options, (type_k, type_v))
    kinds = weight_kinds(mf, graphs.values())
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
    form = "gpu" if target in GPU_TARGETS else "gpu-emulated" if split else "cpu"
    from .lower.x86.emit import for_target
    from .tune.apply import x86_knobs

    x86 = for_target(tgt, quantize_activations=not exact_matmul, knobs_for=x86_knobs(tuning_log, tgt, log))
    mod = build_module(list(graphs.values()), kinds, STATIC, form=form, split_l=SPLIT_L, x86=x86)
    graph_entries = []
    if target == "cuda" and cuda_graph:
        mod, graph_entries = capture_graphs.mark(mod, mf.config.n_ctx_train, STATIC)
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".nextn-", dir=out_dir)   # write then rename: never a half artifact
    libs = []
    try:
        from .gpu_build import build_scope

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
            _write_schedule_report(target, dump_ir)
            lib_name = f"model_{target}.so" if target != "rocm" else f"model_{target}_{la[0]}.so"
            ex.export_library(os.path.join(tmp, lib_name))
            libs.append(library_entry(os.path.join(tmp, lib_name), la))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    entry_points = {}
    for name, g in graphs.items():
        entry_points[name] = {
            "graph": g.kind,
            "inputs": [{"name": n, "dtype": v.dtype, "shape": list(v.shape)} for n, v in g.inputs.items()],
            "states": list(g.states),
            # states as their buffers hold them (a KV cache: its type's storage, nextn.common.kv_types)
            "state_shapes": {n: _storage(v)[1] for n, v in g.states.items()},
            "state_dtypes": {n: _storage(v)[0] for n, v in g.states.items()},
            "weights": [p[0] for p in weight_params(g, kinds)],
            "outputs": list(g.outputs),
            "ops": g.op_counts(),
            "static": STATIC.get(name, {}),
            # recurrent states: the state after each of the last rows is kept (verify, decode), or only after the
            # last row (the chunked KDA form of prefill, which the GPU form does not use); see ir/graph.py
            "keeps_row_states": split or all(n.attrs.get("chunk", 0) == 0 for n in g.live_nodes()
                                             if n.op == "gated_delta_net"),
        }
    buffers, seen = [], set()
    for g in graphs.values():
        for (buf, dtype, shape), wname in zip(weight_params(g, kinds), _weight_of_buffer(g, kinds)):
            if buf in seen:
                continue
            seen.add(buf)
            import numpy as np

            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            rows_of = g.weights[wname].attrs.get("rows_of")   # a reduced draft head: rows of this tensor
            buffers.append({"buffer": buf, "tensor": rows_of or wname, "kind": kinds[wname], "dtype": dtype,
                            # "draft_vocab": the runtime gathers the tensor's rows of the draft vocabulary's ids
                            "rows": "draft_vocab" if rows_of else None,
                            "shape": list(shape), "nbytes": nbytes,
                            # this weight's matmuls take int8 activation rows in this row format ("q8" per 256,
                            # "q8_0" per 32: nextn.common.quant.activation), else None
                            "activation": None if x86 is None else x86.quantized_weights.get(wname),
                            "role": "draft" if mf.draft is not None and mf.file_of(rows_of or wname) is mf.draft
                            else "model",
                            "mtp_only": buf not in {p[0] for n, gg in graphs.items() if gg.kind == "trunk"
                                                    for p in weight_params(gg, kinds)}})
    c = mf.config
    kv = kv_plan(graphs, c.n_layer, with_mtp)
    out_abs = os.path.abspath(out_dir)
    model_files = _model_files(mf, out_abs, verify_model, log)
    manifest = {
        "schema": SCHEMA,
        "nextn_version": nextn_version(),
        "tvm_version": tvm.__version__,
        "tvm_ffi_version": getattr(tvm_ffi, "__version__", "unknown"),
        "target": {"name": target, "kind": tgt.kind.name, "mcpu": str(tgt.attrs.get("mcpu", "")),
                   "str": str(tgt), "arches": arch_list,
                   "cpu_flags": required_cpu_flags(tgt) if tgt.kind.name == "llvm" else []},
        "host": platform.machine(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model_files": model_files,
        "arch": c.arch,
        "hparams": c.to_json(),
        "has_mtp": with_mtp,
        "options": {k: v for k, v in options.items() if k in mf.spec.compile_options},
        # KV cache types (-ctk / -ctv) and bytes per token: trunk always, NextN when speculation is on
        "kv_cache": {"type_k": type_k, "type_v": type_v,
                     "caches": {n: t for g in graphs.values() for n, t in g.kv_types().items()},
                     "bytes_per_token": {"trunk": kv["trunk"]["bytes_per_token"],
                                         "nextn": kv["nextn"]["bytes_per_token"],
                                         "total": kv["trunk"]["bytes_per_token"] + kv["nextn"]["bytes_per_token"]},
                     # float32 recurrent states (not KV: -ctk / -ctv do not apply), one plane; an engine keeps
                     # max_draft + 2 planes with speculation, 1 without
                     "recurrent_bytes_per_plane": kv["trunk"]["bytes_per_plane"]},
        "entry_points": entry_points,
        "buffer_plan": {"weights": buffers, "kv": kv,
                        "weight_bytes": sum(b["nbytes"] for b in buffers),
                        "trunk_weight_bytes": sum(b["nbytes"] for b in buffers if not b["mtp_only"])},
        "tuning_log": tuning_info,
        "max_draft": MAX_DRAFT,   # the deepest draft a request may ask for (common/manifest.py)
        # --spec-draft-vocab: token rows of the `_vocab` draft entries' head (graphs.reduce_head), None without
        "draft_vocab": options["draft_vocab"] if with_mtp and options["draft_vocab"] else None,
        "kernel_form": form,      # cpu, gpu, or gpu-emulated (the GPU kernels built for llvm; lower/attention/)
        # the hand-written x86 matmul kernels (compiler/lower/x86): vector width, activation quantization
        "x86_kernels": None if x86 is None else {"vector_bytes": x86.width, "kernels": len(x86.specs),
                                                 "activation_quant": "q8" if x86.quantize_activations else None},
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


if __name__ == "__main__":   # the reproducible child (compiler/reproducible.py) runs the build here
    sys.exit(reproducible.child_main(compile_model, sys.argv[1]))
