"""The real-width benches' run: which files, the report's head (machine, settings, the peer's build), measuring the
files in turn with the report written after each, and the peer's tools."""
from __future__ import annotations

import gzip
import json
import os
import sys
import time

from machine_probe import machine

# the prompt both engines get in the real-width benches' generations
PROMPT = "The quick brown fox jumps over the lazy dog, and then"

def resolve_files(names, directory, known=()) -> list[str]:
    """The GGUF paths to measure, smallest first: `names` (paths, or names in `directory`, .gguf optional;
    SystemExit naming a missing one), or else the files of `known` (file names) that exist in `directory`."""
    if not names:
        cands = [os.path.join(directory, n) for n in known]
        paths = [p for p in cands if os.path.isfile(p)]
    else:
        paths = []
        for n in names:
            p = next((c for c in (n, os.path.join(directory, n), os.path.join(directory, f"{n}.gguf"))
                      if os.path.isfile(c)), n)
            if not os.path.isfile(p):
                raise SystemExit(f"realwidth: {n}: no such file (looked in . and {directory})")
            paths.append(p)
    return sorted(paths, key=os.path.getsize)


def shown_path(p: str) -> str:
    """`p` as a report records it: under the home folder as `~/...`, any other absolute path by its name alone, so
    a report kept in the repository names no folder of the machine that made it."""
    if not os.path.isabs(p):
        return p
    home = os.path.expanduser("~")
    return "~" + p[len(home):] if p == home or p.startswith(home + os.sep) else os.path.basename(p)


def file_entry(path: str, info: dict, **fields) -> dict:
    """A file's report entry before its rounds: name, path (`shown_path`), size, arch and trunk layers (`info`:
    gguf_bytes.gguf_info), then `fields`."""
    return {"name": os.path.basename(path), "path": shown_path(os.path.abspath(path)),
            "size": os.path.getsize(path), "arch": info["arch"], "n_layer": info["n_layer"], **fields, "rounds": []}


def new_report(a, argv, **extra) -> dict:
    """The head of a run's report: the machine (its load before the run: `loaded`), the settings both engines got
    (`a`: threads, cache_type_k/v, repeat, n_gen, ctx, engines), the command line, the peer's build; `extra`."""
    from peer import peer_version

    report = {"machine": machine(), "threads": a.threads, "cache_type_k": a.cache_type_k,
              "cache_type_v": a.cache_type_v, "repeat": a.repeat, "n_gen": a.n_gen, "ctx": a.ctx,
              "engines": sorted(a.engines),
              "argv": [shown_path(x) for x in (sys.argv[1:] if argv is None else argv)],
              "llama_build": peer_version(), **extra, "files": []}
    # Our own processes raise the load during the run, so only the load before it says whether others were busy.
    report["loaded"] = report["machine"]["loadavg"][0] > 0.5
    return report


def run_files(report: dict, files, measure, summarize, output: str | None, after=None) -> dict:
    """Measure `files` in turn into report["files"]: entry = measure(path), entry["summary"] = summarize(entry),
    then after(report) if given; the report is written to `output` after each file (what is measured so far is
    kept) and at the end, with the load average then."""
    t0 = time.perf_counter()
    for path in files:
        entry = measure(path)
        entry["summary"] = summarize(entry)
        report["files"].append(entry)
        if after is not None:
            after(report)
        report["wall_s"] = time.perf_counter() - t0
        if output:
            write_report(report, output)
    report["loadavg_end"] = os.getloadavg()
    if output:
        write_report(report, output)
    return report


def write_report(report: dict, path: str) -> None:
    """Write a JSON report through a .tmp beside it, then renamed: a reader never sees half a report."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def peer_tools(names, log, who: str) -> dict:
    """{tool: path} of the peer's (llama.cpp's) `names` that are built; a missing one is logged (`who`: the bench)
    and kept as {"missing TOOL": why}."""
    from peer import PeerMissing, peer_tool

    tools = {}
    for t in names:
        try:
            tools[t] = peer_tool(t)
        except PeerMissing as e:
            tools[f"missing {t}"] = str(e)
            log(f"{who}: {e}")
    return tools


def saved_report(path: str, summarize) -> dict:
    """A report written by a bench's --output, each file summarized again from its saved rounds by `summarize`
    (so a report of an older tree reads with today's table). A `.gz` path is read through gzip: the reports kept in
    bench/reports are stored compressed, since every tracked byte travels with each device run (bench/bundle.py)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        report = json.load(f)
    for e in report["files"]:
        e["summary"] = summarize(e)
    return report


def file_notes(entry: dict, summary: dict, notes: list) -> bool:
    """Append to `notes` why report entry `entry` (its `summary`) has no or partial nextn rows; False if it was
    skipped (no rows at all)."""
    if entry.get("skipped"):
        notes.append(f"- {entry['name']}: skipped: {entry['skipped']}")
        return False
    if summary.get("nextn_status") != "ok":
        notes.append(f"- {entry['name']}: nextn: {summary.get('nextn_status')}")
    return True
