"""Offline tuning for machines the build host cannot reach (meta_schedule's candidates built here, measured there):
gen → measure → ingest.

    nextn tune MODEL.gguf --target cuda --arch sm_90 --offline DIR   # here: sample + build candidates (no GPU)
    nextn tuning measure DIR [--device cuda:0]                        # there: runtime only, writes DIR/results.json
    nextn tuning ingest DIR -o LOG_DIR                                # here: best measured candidate per kernel

DIR holds `candidates.json` (per workload: its hash, IR, and for each candidate the trace, args_info and the
library file), one library per candidate, plus one `default` library per workload built with nextn's own
schedule, so that ingest keeps a record only when it beats the default on the measuring machine. The
candidate libraries are code: `measure` checks each one's sha256 against `candidates.json` before loading it.
"""
from __future__ import annotations

import base64
import json
import os

from nextn.common.errors import NextnError
from nextn.common.hashing import sha256_file
from nextn.common.measure import CANDIDATES, RESULTS

from . import log as tlog
from .workloads import arg_specs, select, target_key


def gen(model: str, out_dir: str, target: str = "cuda", arches=None, trials: int = 16, max_kernels: int | None = None,
        only: str | None = None, draft: str | None = None, seed: int = 0, log=print) -> dict:
    """Sample `trials` schedule candidates per workload and build each into out_dir (no device needed)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from nextn.compiler.target import host_llvm, make_target
    from nextn.compiler.lower import cuda
    from nextn.schedules import schedule_pass

    from .run import _to_py

    tgt = make_target(target, arches)
    wls = select(model, tgt, draft, only, max_kernels)
    os.makedirs(out_dir, exist_ok=True)
    scope = _build_scope(target, arches)
    ms_target = tgt if target != "llvm" else tvm.target.Target(host_llvm(os.cpu_count() or 1))
    book = {"target": {"key": target_key(tgt), "kind": target, "str": str(tgt)}, "workloads": []}
    default = schedule_pass(tgt, cuda.RULES)
    for wi, w in enumerate(wls):
        wmod = tvm.IRModule({"main": w.func})
        if target == "llvm":
            from nextn.schedules.cpu import schedule_space

            space = ms.space_generator.ScheduleFn(schedule_space, sch_rules=[], postprocs=[], mutator_probs={})
        else:
            space = "post-order-apply"
        ctx = ms.TuneContext(mod=wmod, target=ms_target, space_generator=space,
                             search_strategy=ms.search_strategy.ReplayTrace(), task_name="main", num_threads=1,
                             rand_state=seed)
        spaces = ctx.generate_design_space()
        ctx.pre_tuning(max_trials=trials, num_trials_per_iter=trials, design_spaces=spaces, database=None,
                       cost_model=None)
        entry = {"hash": w.hash, "name": w.name, "workload": base64.b64encode(tvm.ir.save_json(wmod).encode()).decode(),
                 "candidates": []}
        with scope(), tgt:
            dflt = default(tvm.IRModule({"main": w.func.with_attr("global_symbol", "main")}))
            dflt = tvm.IRModule({"main": dflt["main"].with_attr("global_symbol", "main")})
            entry["default"] = _export(tvm.compile(dflt, target=tgt), out_dir, f"w{wi}_default.so")
            for ci, c in enumerate(ctx.generate_measure_candidates() or []):
                try:
                    cmod = tvm.IRModule({"main": c.sch.mod["main"].with_attr("global_symbol", "main")})
                    so = _export(tvm.compile(cmod, target=tgt), out_dir, f"w{wi}_c{ci}.so")
                except Exception as e:   # sampled schedules can be invalid for the target
                    log(f"  {w.name} candidate {ci}: build failed ({str(e).strip().splitlines()[-1][:100]})")
                    continue
                entry["candidates"].append({**so, "trace": _to_py(c.sch.trace.as_json()),
                                            "args_info": [_to_py(a.as_json()) for a in c.args_info]})
        entry["args"] = arg_specs(w.func)
        book["workloads"].append(entry)
        log(f"  {w.name}: {len(entry['candidates'])} candidate(s) built")
    with open(os.path.join(out_dir, CANDIDATES), "w") as f:
        json.dump(book, f)
    return book


def _export(ex, out_dir, name):
    path = os.path.join(out_dir, name)
    ex.export_library(path)
    return {"file": name, "sha256": sha256_file(path)}


def _build_scope(target, arches):
    import contextlib

    if target in ("cuda", "rocm"):
        from nextn.common.compile_options import parse_arches
        from nextn.compiler.gpu_build import build_scope

        return lambda: build_scope(target, parse_arches(target, arches))
    return contextlib.nullcontext


def ingest(cand_dir: str, log_dir: str, log=print) -> dict:
    """Best measured candidate per workload → records in LOG_DIR (only where it beats the measured default)."""
    try:
        with open(os.path.join(cand_dir, CANDIDATES)) as f:
            book = json.load(f)
        with open(os.path.join(cand_dir, RESULTS)) as f:
            results = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise NextnError(f"{cand_dir}: cannot read {CANDIDATES} / {RESULTS} ({e}); run `nextn tuning measure` first")
    times = results.get("seconds", {})
    have = tlog.read(log_dir) if os.path.exists(os.path.join(log_dir, tlog.LOG_FILE)) else tlog.empty_log()
    new = tlog.empty_log()
    key = book["target"]["key"]
    for w in book["workloads"]:
        t_default = times.get(w["default"]["file"])
        measured = [(times[c["file"]], c) for c in w["candidates"] if c["file"] in times]
        if not measured:
            log(f"  {w['name']}: no measured candidate")
            continue
        t, c = min(measured, key=lambda x: x[0])
        if t_default is not None and t >= t_default:
            log(f"  {w['name']}: best candidate {t * 1e6:.1f} us does not beat the default {t_default * 1e6:.1f} us")
            continue
        kind, _, arch = key.partition(":")
        tgt = {"key": key, "kind": kind, "device_name": str(results.get("device_name", "")), "json": book["target"]["str"]}
        tgt["mcpu" if kind == "llvm" else "arch"] = arch
        new["records"].append({"workload_hash": w["hash"], "name": w["name"], "workload": w["workload"],
                               "target": tgt, "trace": c["trace"], "args_info": c["args_info"], "run_secs": [t]})
        log(f"  {w['name']}: {t * 1e6:.1f} us (default {t_default * 1e6 if t_default else float('nan'):.1f} us)")
    tlog.validate(new, cand_dir)
    merged = tlog.merge([have, new])
    tlog.write(merged, log_dir)
    return merged
