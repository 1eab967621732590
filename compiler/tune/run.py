"""`nextn tune`: search schedules for the model's kernels with meta_schedule on this machine (llvm).

Each workload is tuned once per target key and written to LOG_DIR/log.json as soon as it is done, so an
interrupted run resumes where it stopped. A tuned record is kept only if it beats nextn's default schedule
for that kernel on this machine by more than the default's own noise, in interleaved rounds of timings
(compiler/tune/decide.py); the log then does not make a kernel slower. The hand-written x86 kernels are searched
over their knobs (compiler/tune/knobs.py) the same way.

Every candidate is built and run in meta_schedule's worker processes, each killed after `build_timeout`
seconds (meta_schedule's own default, 30 s, fails every candidate on a busy machine, where a worker's first build
also pays TVM's imports). The summary says per kernel how many candidates built and ran, and why the others
failed; a run that could measure nothing at all writes no log and raises NextnError with those reasons.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from nextn.common.errors import NextnError
from nextn.common.measure import BUILD_TIMEOUT_S

from . import decide
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


def _te_timer(funcs: dict, target, number: int = 20):
    """time(name, _rows) → seconds per call of funcs[name] on shared random inputs (CPU), timed as `nextn tuning
    measure` times candidates; for decide.interleaved."""
    import tvm

    from nextn.common.measure import random_args, time_main

    from .workloads import arg_specs

    mods = {}
    for name, func in funcs.items():
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        with target:
            mods[name] = tvm.compile(mod, target=target).mod
    args = random_args(arg_specs(next(iter(funcs.values()))), tvm.cpu())
    return lambda name, _rows: time_main(mods[name], args, tvm.cpu(), number)


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
               build_timeout: float = BUILD_TIMEOUT_S, rounds: int = 5, budget: float | None = None,
               verify_rows=None, prefill_rows: int | None = None, bench=None) -> dict:
    """Tune the model's distinct static kernels; returns the log (also written to out_dir/log.json).

    `only`: a regular expression on kernel names; `keep_slower`: store the best found schedule even when the
    default is faster (for experiments; compile then uses it). `search`: "knobs" searches nextn's own CPU
    schedule family (lane count, output tile: schedules/cpu.py `schedule_space`); "generic" uses
    meta_schedule's default design space (post-order-apply + evolutionary search). `build_timeout`: seconds a
    candidate may take to build, and to run. `rounds`: interleaved rounds of default-vs-candidate timings before a
    record is kept (compiler/tune/decide.py). `budget`: seconds after which the x86 knob search starts no further
    kernel (the rest stay untuned; a rerun continues). `verify_rows` / `prefill_rows`: the row counts at which
    symbolic-row x86 kernels are timed (knobs.VERIFY_ROWS, knobs.PREFILL_ROWS; prefill rows 0: none). `bench`:
    the x86 kernels' timer class (knobs.KernelBench; tests pass a fake clock). Raises
    NextnError when no candidate of any kernel could be measured (the message gives each kernel's failures); no log
    is written then."""
    import base64
    import logging

    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from nextn.common.measure import cpu_name
    from nextn.compiler.target import host_llvm, make_target
    from nextn.compiler.lower import cuda
    from nextn.schedules import schedule_pass

    # meta_schedule logs every search iteration at INFO; its per-task logs still go to files under the work dir
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    if target != "llvm":
        raise NextnError(f"`nextn tune --target {target}`: on-machine tuning runs on llvm only; GPU machines here "
                         f"are unreachable, so GPU tuning uses the offline flow (see docs/tuning.md)")
    if not build_timeout > 0:
        raise NextnError(f"--build-timeout {build_timeout}: expected a positive number of seconds")
    if rounds < 1:
        raise NextnError(f"--rounds {rounds}: expected at least 1 interleaved round")
    if budget is not None and not budget > 0:
        raise NextnError(f"--budget {budget}: expected a positive number of seconds")
    t_start = time.monotonic()
    tgt = make_target(target)
    key = target_key(tgt)
    ms_target = Target(host_llvm(os.cpu_count() or 1))
    path = os.path.join(out_dir, tlog.LOG_FILE)
    book = tlog.read(path) if os.path.exists(path) else tlog.empty_log()
    have, _others = tlog.for_target(book, key)
    wls = select(model, tgt, draft, only, max_kernels)
    todo = [w for w in wls if w.hash not in have]
    log(f"{len(wls)} distinct kernels, {len(wls) - len(todo)} already in {path}, tuning {len(todo)} "
        f"with {trials} trials each on {key}")
    default = schedule_pass(tgt, cuda.RULES)
    it = todo
    if progress:
        from tqdm import tqdm

        it = tqdm(todo, unit="kernel", desc="tune")
    summary = []   # (name, tally, default seconds | None, tuned seconds | None, decide.Outcome | None)
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
            summary.append((w.name, tally, None, None, None))
            continue
        rec = top[0]
        with tgt:
            sch = tvm.s_tir.Schedule(wmod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            timer = _te_timer({"default": default(tvm.IRModule({"main": w.func}))["main"], "tuned": sch.mod["main"]},
                              tgt)
        o = decide.interleaved(timer, "default", ["tuned"], [1], rounds)["tuned"]
        t_default, t_tuned = o.default_secs[0], o.run_secs[0]
        summary.append((w.name, tally, t_default, t_tuned, o))
        if not o.kept and not keep_slower:
            continue   # never store a record that does not beat the default schedule by more than the noise
        trace, _run_secs, _target, args_info = _to_py(rec.as_json())
        book["records"].append({
            "workload_hash": w.hash, "name": w.name,
            "workload": base64.b64encode(tvm.ir.save_json(wmod).encode()).decode(),
            "target": {"key": key, "kind": "llvm", "mcpu": str(tgt.attrs["mcpu"]), "device_name": cpu_name(),
                       "json": str(ms_target)},
            "trace": trace, "args_info": args_info, "run_secs": [t_tuned],
        })
        tlog.write(book, out_dir)   # after every workload: resumable
    for name, tally, td, tt, o in summary:
        if td is None:
            log(f"  {name}: no valid candidate; {tally.describe()}")
        else:
            kept = "kept" if o.kept or keep_slower else "default kept"
            log(f"  {name}: default {td * 1e6:.1f} us, tuned {tt * 1e6:.1f} us, x{o.speedup:.3f}, noise "
                f"{o.noise:.1%} ({kept}); {tally.describe()}")
    x86_summary = _tune_x86(model, tgt, draft, book, key, out_dir, only, max_kernels, log, progress, keep_slower,
                            rounds, None if budget is None else t_start + budget, verify_rows, prefill_rows, bench)
    if summary and not x86_summary and all(s[2] is None for s in summary):
        raise NextnError(f"no candidate of the {len(summary)} kernel(s) could be measured, no log written "
                         f"({'; '.join(f'{s[0]}: {s[1].describe()}' for s in summary[:3])}"
                         f"{'; ...' if len(summary) > 3 else ''}); on a busy machine raise --build-timeout "
                         f"(now {build_timeout:g} s)")
    tlog.write(book, out_dir)
    return book


def _tune_x86(model, tgt, draft, book, key, out_dir, only, max_kernels, log, progress, keep_slower, rounds=5,
              deadline=None, verify_rows=None, prefill_rows=None, bench=None) -> list:
    """Knob search of the model's x86 kernels (compiler/tune/knobs.py): one record per kernel searched, `kept` only
    where the best knobs beat the default by more than the noise (or `keep_slower`). `deadline` (time.monotonic):
    no kernel starts after it. `bench(spec, tgt)` → object with `time(knobs, rows)` (knobs.KernelBench)."""
    from nextn.common.measure import cpu_name
    from nextn.compiler.lower import x86

    from . import knobs as kn
    from .workloads import x86_kernels

    width = x86.vector_width(tgt)
    if width is None:
        return []
    bench = bench or kn.KernelBench
    verify_rows = kn.VERIFY_ROWS if verify_rows is None else tuple(verify_rows)
    prefill_rows = kn.PREFILL_ROWS if prefill_rows is None else prefill_rows
    have = {r["key"] for r in book.get("x86_knobs", []) if r["target"]["key"] == key}
    todo = [(s, p) for s, p in x86_kernels(model, tgt, draft, only, max_kernels) if s.key not in have]
    log(f"{len(todo)} x86 kernel(s) to tune (knobs: {', '.join(f.name for f in dataclasses.fields(x86.Knobs))}; "
        f"{rounds} interleaved rounds against the default)")
    it = todo
    if progress:
        from tqdm import tqdm

        it = tqdm(todo, unit="kernel", desc="tune x86")
    out, late = [], []
    for spec, prefill in it:
        if deadline is not None and time.monotonic() > deadline:
            late.append(spec.key)
            continue
        rows = kn.rows_for(spec, prefill, verify_rows, prefill_rows)
        b = bench(spec, tgt)
        res = kn.search(spec, width, b.time, rows, rounds=rounds, l1d=x86.l1d_kb(tgt))
        del b   # its weight copies
        o = res.outcome
        kept = res.knobs != res.default and (o.kept or keep_slower)
        out.append((spec.key, res, kept))
        book.setdefault("x86_knobs", []).append({
            "key": spec.key, "target": {"key": key, "kind": "llvm", "mcpu": str(tgt.attrs["mcpu"]),
                                        "device_name": cpu_name()},
            "knobs": dataclasses.asdict(res.knobs), "kept": kept, "rows": o.rows, "default_secs": o.default_secs,
            "run_secs": o.run_secs, "speedups": o.speedups, "noise": o.noise, "rounds": rounds})
        tlog.write(book, out_dir)   # after every kernel: resumable
    for k, res, kept in out:
        log(f"  {k}: {describe(res, kept)}")
    if late:
        log(f"  budget spent: {len(late)} x86 kernel(s) not started ({', '.join(late[:3])}{', ...' if len(late) > 3 else ''}); "
            f"rerun to continue")
    return out


def describe(res, kept: bool) -> str:
    """One kernel's line: per row count default and best ms and their ratio, the noise, and the verdict."""
    o = res.outcome
    per = "; ".join(f"rows {r}: default {d * 1e3:.3f} ms, best {t * 1e3:.3f} ms (x{s:.3f})"
                    for r, d, t, s in zip(o.rows, o.default_secs, o.run_secs, o.speedups))
    changed = {f: v for f, v in dataclasses.asdict(res.knobs).items() if getattr(res.default, f) != v}
    verdict = f"kept {changed}" if kept else "default kept"
    return (f"{per}; x{o.speedup:.3f} overall, noise {o.noise:.1%}; {verdict} "
            f"({res.tried} knob sets, {res.failed} failed to build, {res.seconds:.0f} s)")
