"""Apply a tuning log at compile time: replay the best trace of each tuned workload; default schedules elsewhere.

Deterministic: the same log gives the same traces, hence the same kernels and the same artifact bytes.
"""
from __future__ import annotations

import tvm

from .workloads import workload_hash


@tvm.transform.module_pass(opt_level=0, name="nextn.ApplyTuningLog")
class ApplyTuningLog:
    """Schedule tuned PrimFuncs from `records` (workload hash → record), then run `default` on the rest."""

    def __init__(self, records: dict, default):
        self.records = records
        self.default = default
        self.applied: set[str] = set()

    def transform_module(self, mod, ctx):
        from tvm.s_tir import meta_schedule as ms

        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            h = workload_hash(func)
            rec = self.records.get(h)
            if rec is None:
                continue
            wmod = tvm.IRModule({"main": func.without_attr("global_symbol")})
            r = ms.database.TuningRecord.from_json(_record_json(rec), ms.database.Workload(wmod))
            sch = tvm.s_tir.Schedule(wmod)
            r.trace.apply_to_schedule(sch, remove_postproc=False)
            new = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            if func.attrs is not None and "global_symbol" in func.attrs:
                new = new.with_attr("global_symbol", func.attrs["global_symbol"])
            mod[gv] = new
            self.applied.add(h)
        return self.default(mod)


def _record_json(rec):
    """The meta_schedule TuningRecord JSON form [trace, run_secs, target, args_info]; only the trace is replayed."""
    import tvm_ffi

    return tvm_ffi.convert([rec["trace"], [float(x) for x in rec["run_secs"]], {"kind": "llvm"}, rec["args_info"]])


def schedule_with_log(tuning_log: str | None, target, default, log=print):
    """The schedule pass for `target`: the log's records for this target (if any) + `default` elsewhere.

    Returns (pass, info) where info is the manifest's `tuning_log` entry (None without a log)."""
    if not tuning_log:
        return default, None
    import os

    from nextn.common.hashing import sha256_file

    from . import log as tlog
    from .workloads import target_key

    book = tlog.read(tuning_log)
    key = target_key(target)
    records, others = tlog.for_target(book, key)
    if others:
        log(f"tuning log: ignoring {others} record(s) made for other targets (this target is {key})")
    p = ApplyTuningLog(records, default)
    path = tlog.log_file(tuning_log)
    info = {"path": os.path.abspath(path), "sha256": sha256_file(path), "target_key": key,
            "records_for_target": len(records), "records_other_targets": others}
    return p, info


def x86_knobs(tuning_log: str | None, target, log=None):
    """spec -> x86.Knobs from the log's kept knob records for `target` (None without one: the default knobs). A
    record's missing knob fields (a log older than a knob) take the spec's default values, and so do the knobs
    that change a row's bits (`x86.bit_knobs`; a log made before they were fixed may set them: a weight's decode
    and verify kernels must give equal rows, and `log` says how many records had one)."""
    if not tuning_log:
        return lambda spec: None
    import dataclasses

    from nextn.compiler.lower import x86

    from . import log as tlog
    from .workloads import target_key

    book, key = tlog.read(tuning_log), target_key(target)
    records = tlog.knob_records(book, key)
    width = x86.vector_width(target)
    told = set()

    def knobs(spec):
        if spec.key not in records or width is None:
            return None
        default = x86.default_knobs(spec, width, x86.l1d_kb(target))
        rec = records[spec.key]
        bits = {f for f in x86.bit_knobs(spec) if f in rec and rec[f] != getattr(default, f)}
        if bits and log is not None and spec.key not in told:
            told.add(spec.key)
            log(f"tuning log: {spec.key}: {', '.join(f'{f}={rec[f]}' for f in sorted(bits))} not applied (it changes "
                f"the kernel's row bits, which must equal the other row count's kernel's); kept "
                f"{', '.join(f'{f}={getattr(default, f)}' for f in sorted(bits))}")
        return dataclasses.replace(default, **{f: v for f, v in rec.items() if f not in bits})

    return knobs
