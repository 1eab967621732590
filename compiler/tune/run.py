"""`nextn tune`: search schedules for the model's kernels with meta_schedule on this machine (llvm).

Each workload is tuned once per target key and written to LOG_DIR/log.json as soon as it is done, so an
interrupted run resumes where it stopped. A tuned record is kept only if it beats nextn's default schedule
for that kernel on this machine (measured in the same run); the log then never makes a kernel slower.

Every candidate is built and run in meta_schedule's worker processes, each killed after `build_timeout`
seconds (meta_schedule's own default, 30 s, fails every candidate on a busy machine, where a worker's first build
also pays TVM's imports). The summary says per kernel how many candidates built and ran, and why the others
failed; a run that could measure nothing at all writes no log and raises NextnError with those reasons.
"""
from __future__ import annotations

import collections
import os
import shutil
import tempfile
from dataclasses import dataclass, field

from nextn.common.errors import NextnError
from nextn.common.measure import BUILD_TIMEOUT_S

from . import log as tlog
from .workloads import select, target_key


def _to_py(o):
    """FFI containers / IntImm / FloatImm (as in Trace.as_json) → plain JSON values."""
    import tvm
    import tvm_ffi

    if o is None or isinstance(o, (str, bool, int, float)):
        return o
    if isinstance(o, tvm.tirx.IntImm):
        return int(o.value)
    if isinstance(o, tvm.tirx.FloatImm):
        return float(o.value)
    if isinstance(o, (tvm_ffi.Map, dict)):
        return {str(k): _to_py(v) for k, v in o.items()}
    if isinstance(o, (tvm_ffi.Array, list, tuple)):
        return [_to_py(x) for x in o]
    return str(o)


def _time_func(func, target, number: int = 50) -> float:
    """Seconds per call of `func` on random inputs (CPU), timed as `nextn tuning measure` times candidates."""
    import tvm

    from nextn.common.measure import random_args, time_main

    from .workloads import arg_specs

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with target:
        ex = tvm.compile(mod, target=target)
    return time_main(ex.mod, random_args(arg_specs(func), tvm.cpu()), tvm.cpu(), number)


@dataclass
class Tally:
    """What happened to one kernel's candidates: counts, and each failure reason with how often it occurred."""
    built: int = 0
    ran: int = 0
    build_failed: collections.Counter = field(default_factory=collections.Counter)
    run_failed: collections.Counter = field(default_factory=collections.Counter)

    def describe(self) -> str:
        n = self.built + sum(self.build_failed.values())
        out = f"{n} candidate(s): {self.built} built, {self.ran} ran"
        for what, reasons in (("failed to build", self.build_failed), ("failed to run", self.run_failed)):
            if reasons:
                out += f"; {sum(reasons.values())} {what} (" + "; ".join(
                    f"{r} x{c}" if c > 1 else r for r, c in reasons.most_common()) + ")"
        return out


def _reason(msg) -> str:
    """The telling line of a meta_schedule error message (its first line names the failure kind)."""
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else "unknown error")[:160]


def _counting(ms, tally: Tally, builder, runner):
    """`builder` and `runner` wrapped so that every result lands in `tally` (meta_schedule keeps only run_secs)."""
    from tvm.ir.utils import derived_object

    @derived_object
    class CountingBuilder(ms.builder.PyBuilder):
        def build(self, build_inputs):
            results = builder.build(build_inputs)
            for r in results:
                if r.error_msg is None:
                    tally.built += 1
                else:
                    tally.build_failed[_reason(r.error_msg)] += 1
            return results

    @derived_object
    class CountingFuture(ms.runner.PyRunnerFuture):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.res = inner, None

        def done(self):
            return self.inner.done()

        def result(self):
            if self.res is None:   # counted once, however often it is asked
                self.res = self.inner.result()
                if self.res.error_msg is None:
                    tally.ran += 1
                else:
                    tally.run_failed[_reason(self.res.error_msg)] += 1
            return self.res

    @derived_object
    class CountingRunner(ms.runner.PyRunner):
        def run(self, runner_inputs):
            return [CountingFuture(f) for f in runner.run(runner_inputs)]

    return CountingBuilder(), CountingRunner()


def tune_model(model: str, out_dir: str, target: str = "llvm", trials: int = 32, max_kernels: int | None = None,
               draft: str | None = None, cost_model: str = "random", log=print, progress: bool = True,
               only: str | None = None, keep_slower: bool = False, search: str = "knobs",
               build_timeout: float = BUILD_TIMEOUT_S) -> dict:
    """Tune the model's distinct static kernels; returns the log (also written to out_dir/log.json).

    `only`: a regular expression on kernel names; `keep_slower`: store the best found schedule even when the
    default is faster (for experiments; compile then uses it). `search`: "knobs" searches nextn's own CPU
    schedule family (lane count, output tile: schedules/cpu.py `schedule_space`); "generic" uses
    meta_schedule's default design space (post-order-apply + evolutionary search). `build_timeout`: seconds a
    candidate may take to build, and to run. Raises NextnError when no candidate of any kernel could be measured
    (the message gives each kernel's failures); no log is written then."""
    import base64
    import logging

    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from nextn.common.measure import cpu_name
    from nextn.compiler.target import make_target
    from nextn.schedules import schedule_pass

    # meta_schedule logs every search iteration at INFO; its per-task logs still go to files under the work dir
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    if target != "llvm":
        raise NextnError(f"`nextn tune --target {target}`: on-machine tuning runs on llvm only; GPU machines here "
                         f"are unreachable, so GPU tuning uses the offline flow (see docs/tuning.md)")
    if not build_timeout > 0:
        raise NextnError(f"--build-timeout {build_timeout}: expected a positive number of seconds")
    tgt = make_target(target)
    key = target_key(tgt)
    ms_target = Target({"kind": "llvm", "mcpu": str(tgt.attrs["mcpu"]), "num-cores": os.cpu_count() or 1})
    path = os.path.join(out_dir, tlog.LOG_FILE)
    book = tlog.read(path) if os.path.exists(path) else tlog.empty_log()
    have, _others = tlog.for_target(book, key)
    wls = select(model, tgt, draft, only, max_kernels)
    todo = [w for w in wls if w.hash not in have]
    log(f"{len(wls)} distinct kernels, {len(wls) - len(todo)} already in {path}, tuning {len(todo)} "
        f"with {trials} trials each on {key}")
    default = schedule_pass(tgt)
    it = todo
    if progress:
        from tqdm import tqdm

        it = tqdm(todo, unit="kernel", desc="tune")
    summary = []   # (name, tally, default seconds | None, tuned seconds | None)
    for w in it:
        wmod = tvm.IRModule({"main": w.func})
        work = tempfile.mkdtemp(prefix="ms-", dir=out_dir if os.path.isdir(out_dir) else None)
        tally = Tally()
        builder, runner = _counting(ms, tally, ms.builder.LocalBuilder(timeout_sec=build_timeout),
                                    ms.runner.LocalRunner(timeout_sec=build_timeout,
                                                          evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1)))
        try:
            space = "post-order-apply"
            if search == "knobs":   # nextn's own schedule family with sampled knobs (schedules/cpu.py)
                from nextn.schedules.cpu import schedule_space

                space = ms.space_generator.ScheduleFn(schedule_space, sch_rules=[], postprocs=[], mutator_probs={})
            db = ms.tune_tir(wmod, ms_target, work, max_trials_global=trials, num_trials_per_iter=min(8, trials),
                             cost_model=cost_model, num_tuning_cores=1, seed=0, space=space,
                             strategy="replay-trace" if search == "knobs" else "evolutionary",
                             builder=builder, runner=runner)
            # one workload per run: the fastest valid record (failed builds/runs carry 1e10)
            top = sorted((r for r in db.get_all_tuning_records() if r.run_secs and float(min(r.run_secs)) < 1e9),
                         key=lambda r: float(min(r.run_secs)))[:1]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if not top:
            summary.append((w.name, tally, None, None))
            continue
        rec = top[0]
        with tgt:
            t_default = _time_func(default(tvm.IRModule({"main": w.func}))["main"], tgt)
            sch = tvm.s_tir.Schedule(wmod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            t_tuned = _time_func(sch.mod["main"], tgt)
        summary.append((w.name, tally, t_default, t_tuned))
        if t_tuned >= t_default and not keep_slower:
            continue   # never store a record slower than the default schedule
        trace, _run_secs, _target, args_info = _to_py(rec.as_json())
        book["records"].append({
            "workload_hash": w.hash, "name": w.name,
            "workload": base64.b64encode(tvm.ir.save_json(wmod).encode()).decode(),
            "target": {"key": key, "kind": "llvm", "mcpu": str(tgt.attrs["mcpu"]), "device_name": cpu_name(),
                       "json": str(ms_target)},
            "trace": trace, "args_info": args_info, "run_secs": [t_tuned],
        })
        tlog.write(book, out_dir)   # after every workload: resumable
    for name, tally, td, tt in summary:
        if td is None:
            log(f"  {name}: no valid candidate; {tally.describe()}")
        else:
            kept = "kept" if tt < td or keep_slower else "default kept"
            log(f"  {name}: default {td * 1e6:.1f} us, tuned {tt * 1e6:.1f} us ({kept}); {tally.describe()}")
    x86_summary = _tune_x86(model, tgt, draft, book, key, out_dir, only, max_kernels, log, progress, keep_slower)
    if summary and not x86_summary and all(td is None for _n, _t, td, _tt in summary):
        raise NextnError(f"no candidate of the {len(summary)} kernel(s) could be measured, no log written "
                         f"({'; '.join(f'{n}: {t.describe()}' for n, t, _a, _b in summary[:3])}"
                         f"{'; ...' if len(summary) > 3 else ''}); on a busy machine raise --build-timeout "
                         f"(now {build_timeout:g} s)")
    tlog.write(book, out_dir)
    return book


def _tune_x86(model, tgt, draft, book, key, out_dir, only, max_kernels, log, progress, keep_slower) -> list:
    """Knob search of the model's x86 kernels (compiler/tune/knobs.py); records only what beats the default."""
    import dataclasses

    from nextn.common.measure import cpu_name
    from nextn.compiler.lower import x86

    from .knobs import search
    from .workloads import x86_specs

    width = x86.vector_width(tgt)
    if width is None:
        return []
    have = {r["key"] for r in book.get("x86_knobs", []) if r["target"]["key"] == key}
    specs = [s for s in x86_specs(model, tgt, draft, only, max_kernels) if s.key not in have]
    log(f"{len(specs)} x86 kernel(s) to tune (knobs: vector width, weight tile, row group, unroll)")
    it = specs
    if progress:
        from tqdm import tqdm

        it = tqdm(specs, unit="kernel", desc="tune x86")
    out = []
    for spec in it:
        t_default, best, t_best = search(spec, tgt, width)
        kept = t_best < t_default or keep_slower
        out.append((spec.key, t_default, t_best, best, kept))
        if kept and (keep_slower or best != x86.default_knobs(spec, width)):
            book.setdefault("x86_knobs", []).append({
                "key": spec.key, "target": {"key": key, "kind": "llvm", "mcpu": str(tgt.attrs["mcpu"]),
                                            "device_name": cpu_name()},
                "knobs": dataclasses.asdict(best), "run_secs": [t_best], "default_secs": [t_default]})
            tlog.write(book, out_dir)
    for k, td, tb, best, kept in out:
        log(f"  {k}: default {td * 1e6:.1f} us, tuned {tb * 1e6:.1f} us ({'kept ' + str(best) if kept else 'default kept'})")
    return out
