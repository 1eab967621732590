"""`nextn tune` and `nextn tuning export|import|merge|measure|ingest|show` (registered on the main CLI group).

`tuning measure` runs with the TVM runtime only (runtime/measure.py); the others call the compiler through
`nextn.compiler.entry`, imported when they run.
"""
from __future__ import annotations

import os

import click

from nextn.common.measure import BUILD_TIMEOUT_S


def register(cli: click.Group) -> None:
    cli.add_command(tune)
    cli.add_command(tuning)


def _echo(s):
    click.echo(s, err=True)


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", default="llvm", show_default=True, help="Tuning target (llvm: this CPU).")
@click.option("--trials", default=32, show_default=True, help="meta_schedule trials per kernel.")
@click.option("-o", "--output", "out", default="tuning", show_default=True, help="Log directory (resumable).")
@click.option("--max-kernels", default=None, type=int, help="Tune only the N heaviest kernels.")
@click.option("-md", "--model-draft", "draft", default=None, help="MTP-only GGUF (draft) next to a trunk-only MODEL.")
@click.option("--cost-model", default="random", show_default=True, type=click.Choice(["random", "xgb"]),
              help="meta_schedule cost model (xgb needs the xgboost package).")
@click.option("--only", default=None, help="Tune only kernels whose name matches this regular expression.")
@click.option("--keep-slower", is_flag=True, help="Store the best found schedule even if the default is faster.")
@click.option("--search", default="knobs", show_default=True, type=click.Choice(["knobs", "generic"]),
              help="knobs: nextn's CPU schedule family with sampled lane count / tile; generic: meta_schedule's "
                   "default design space.")
@click.option("--arch", "arches", multiple=True, help="GPU arch(s) for --target cuda/rocm (offline flow).")
@click.option("--build-timeout", default=BUILD_TIMEOUT_S, show_default=True, type=float,
              help="Seconds a candidate may take to build, and to run, before it counts as failed (meta_schedule's "
                   "own 30 s fails every candidate on a busy machine).")
@click.option("--rounds", default=5, show_default=True, type=click.IntRange(min=1),
              help="Interleaved rounds of default-vs-candidate timings before a record is kept (it must beat the "
                   "default by more than the default's own noise).")
@click.option("--budget", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Seconds: start no further x86 kernel after this (the rest stay untuned; rerun to continue).")
@click.option("--verify-rows", default="2,3,4", show_default=True,
              help="Row counts at which symbolic-row (verify / prefill) x86 kernels are timed, comma-separated.")
@click.option("--prefill-rows", default=512, show_default=True, type=click.IntRange(min=0),
              help="Rows of a prefill chunk, at which kernels that prefill calls with the prompt's rows are also "
                   "timed (0: not).")
@click.option("--offline", default=None, type=click.Path(file_okay=False),
              help="Offline flow: sample and build candidates into this directory (no device needed); then "
                   "`nextn tuning measure DIR` where the device is and `nextn tuning ingest DIR -o LOG_DIR` here.")
def tune(model, target, trials, out, max_kernels, draft, cost_model, only, keep_slower, search, arches, build_timeout,
         rounds, budget, verify_rows, prefill_rows, offline):
    """Tune MODEL's distinct kernels for TARGET; records go to OUTPUT/log.json as each kernel finishes."""
    from nextn.compiler import entry

    if offline:
        entry.tune_offline(model, offline, target=target, arches=list(arches) or None, trials=trials,
                           max_kernels=max_kernels, only=only, draft=draft, log=_echo)
        _echo(f"candidates in {offline}; next: nextn tuning measure {offline} (on the device machine)")
        return
    try:
        rows = tuple(int(x) for x in verify_rows.split(","))
        if not rows or min(rows) < 1:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{verify_rows!r}: expected positive integers separated by commas",
                                 param_hint="--verify-rows") from None
    book = entry.tune(model, out, target=target, trials=trials, max_kernels=max_kernels, draft=draft,
                      cost_model=cost_model, log=_echo, only=only, keep_slower=keep_slower, search=search,
                      build_timeout=build_timeout, rounds=rounds, budget=budget, verify_rows=rows,
                      prefill_rows=prefill_rows)
    x86 = book.get("x86_knobs", [])
    _echo(f"{len(book['records'])} schedule record(s), {len(x86)} x86 knob record(s) "
          f"({sum(r['kept'] for r in x86)} kept, {sum(not r['kept'] for r in x86)} keep the default) in "
          f"{os.path.join(out, 'log.json')}")


@click.group()
def tuning():
    """Share tuning logs: export, import, merge, show (pure JSON data, validated on every read)."""


@tuning.command("export")
@click.argument("log_dir", type=click.Path())
@click.option("-o", "--output", "out", required=True, help="FILE.json to write.")
def export_(log_dir, out):
    """Write LOG_DIR's log as one JSON file (best record per workload and target)."""
    from nextn.compiler import entry

    _echo(f"exported {entry.tuning_export(log_dir, out)} record(s) to {out}")


@tuning.command("import")
@click.argument("file", type=click.Path())
@click.option("-o", "--output", "out", required=True, help="LOG_DIR to merge the records into.")
def import_(file, out):
    """Validate FILE.json and merge its records into LOG_DIR (kept: the faster record per workload/target)."""
    from nextn.compiler import entry

    n_new, n_all = entry.tuning_import(file, out)
    _echo(f"imported {n_new} record(s); {n_all} in {out}")


@tuning.command("merge")
@click.argument("log_dirs", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "out", required=True, help="LOG_DIR to write.")
def merge(log_dirs, out):
    """Merge logs, keeping the fastest record per workload and target."""
    from nextn.compiler import entry

    _echo(f"merged {len(log_dirs)} log(s): {entry.tuning_merge(log_dirs, out)} record(s) in {out}")


@tuning.command("measure")
@click.argument("cand_dir", type=click.Path(file_okay=False))
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda:N.")
def measure_(cand_dir, device):
    """Time the candidates of an offline run (TVM runtime only); writes CAND_DIR/results.json."""
    from .measure import measure

    measure(cand_dir, device, log=_echo)


@tuning.command("ingest")
@click.argument("cand_dir", type=click.Path(file_okay=False))
@click.option("-o", "--output", "out", required=True, help="LOG_DIR to merge the measured records into.")
def ingest_(cand_dir, out):
    """Turn measured candidates into log records (only those beating the default schedule)."""
    from nextn.compiler import entry

    _echo(f"{entry.tuning_ingest(cand_dir, out, log=_echo)} record(s) in {out}")


@tuning.command("show")
@click.argument("log", type=click.Path())
def show(log):
    """Print a log's records: workload, target, measured time."""
    from nextn.compiler import entry

    book = entry.tuning_show(log)
    click.echo(f"{log}: {book['format']} schema {book['schema']}, nextn {book['nextn_version']}, "
               f"TVM {book['tvm_version']}, {len(book['records'])} record(s)")
    for r in book["records"]:
        click.echo(f"  {r['workload_hash']}  {r['name']:<50} {r['target']['key']:<16} {min(r['run_secs']) * 1e6:9.1f} us"
                   f"  ({r['target'].get('device_name', '')})")
    x86 = book.get("x86_knobs", [])
    if x86:
        click.echo(f"{len(x86)} x86 knob record(s): per row count default ms -> these knobs' ms (default / knobs)")
    for r in x86:
        per = ", ".join(f"rows {n}: {d * 1e3:.3f} -> {t * 1e3:.3f} (x{s:.3f})"
                        for n, d, t, s in zip(r["rows"], r["default_secs"], r["run_secs"], r["speedups"]))
        noise = "not measured" if r["noise"] is None else f"{r['noise']:.1%}"
        kb = ",".join(f"{k}={v}" for k, v in r["knobs"].items())
        verdict = f"kept [{kb}]" if r["kept"] else f"default kept (best challenger [{kb}])"
        click.echo(f"  {r['key']}  {r['target']['key']}  {verdict}  {per}; "
                   f"noise {noise}, {r['rounds']} round(s)")
