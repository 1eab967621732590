"""The tuning log: a pure-data JSON file that users share.

    {"format": "nextn-tuning-log", "schema": 4, "nextn_version": str, "tvm_version": str,
     "records": [{"workload_hash": str (hex), "name": str, "workload": str (base64 of TVM's IR JSON),
                  "target": {"key": str, "kind": str, "mcpu"|"arch": str, "device_name": str, "json": str},
                  "trace": [...] (meta_schedule trace JSON), "args_info": [...], "run_secs": [float, ...]}],
     "x86_knobs": [{"key": str (compiler/lower/x86 KernelSpec.key: x86.OP:KIND/ACTS:N..:K..:rows..),
                    "target": {...as above},
                    "knobs": {field: int | bool, ...} (x86.Knobs fields; a missing one takes the default's value),
                    "kept": bool, "rows": [int, ...], "default_secs": [float, ...], "run_secs": [float, ...],
                    "speedups": [float, ...], "noise": float | null, "rounds": int}]}

`records` are meta_schedule traces of TE kernels; `x86_knobs` the knob settings of the hand-written x86
kernels (compiler/tune/knobs.py): per row count in `rows`, the default's and these knobs' seconds per call and
the speedup default / knobs (medians over `rounds` interleaved rounds, compiler/tune/decide.py), and the
default's own relative noise. `kept` false: these knobs (the best challenger) did not beat the default by more
than the noise, so the kernel keeps its default; the record says so and by how much. Only schema 4 reads: the
earlier schemas were never in a release, and their kernel keys did not say which of a kind's kernels they tuned.
A log is data, never code: reading it parses JSON only, checks every field's type against this
schema, rejects unknown fields, checks that every trace instruction is a registered schedule primitive, and never
unpickles or evaluates anything. Merge keeps the fastest record per (workload, target key) and per (x86 kernel
key, target key) the kept one with the highest speedup.
"""
from __future__ import annotations

import base64
import json
import os

from nextn.common.compile_options import TUNING_LOG_FILE, tuning_log_file as log_file
from nextn.common.errors import NextnError

FORMAT = "nextn-tuning-log"
SCHEMA = 4
READS = (SCHEMA,)
LOG_FILE = TUNING_LOG_FILE
MAX_BYTES = 256 << 20
_TOP = {"format", "schema", "nextn_version", "tvm_version", "records", "x86_knobs"}
_KNOB_REC = {"key", "target", "knobs", "run_secs", "default_secs", "kept", "rows", "speedups", "noise", "rounds"}
_REC = {"workload_hash", "name", "workload", "target", "trace", "args_info", "run_secs"}
_TGT = {"key", "kind", "mcpu", "arch", "device_name", "json"}


def empty_log() -> dict:
    from nextn.common.versions import nextn_version, package_version

    return {"format": FORMAT, "schema": SCHEMA, "nextn_version": nextn_version(), "tvm_version": package_version("apache-tvm"),
            "records": [], "x86_knobs": []}


def _plain(x, where: str):
    """Only JSON scalars, lists and str-keyed dicts (what json.load produces) — nothing else."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return
    if isinstance(x, list):
        for v in x:
            _plain(v, where)
        return
    if isinstance(x, dict):
        for k, v in x.items():
            if not isinstance(k, str):
                raise NextnError(f"{where}: non-string key")
            _plain(v, where)
        return
    raise NextnError(f"{where}: unexpected value of type {type(x).__name__}")


def _instruction_kinds(trace) -> set[str]:
    # Trace JSON: [[kind, inputs, attrs, outputs], ...] (+ optional decisions list)
    insts = trace[0] if trace and isinstance(trace[0], list) and trace[0] and isinstance(trace[0][0], list) else trace
    kinds = set()
    for inst in insts:
        if not isinstance(inst, list) or not inst or not isinstance(inst[0], str):
            raise NextnError("trace instruction is not [kind, inputs, attrs, outputs]")
        kinds.add(inst[0])
    return kinds


def validate(log, where: str, check_kinds: bool = True) -> dict:
    """Check `log` against the schema; returns it. Raises NextnError naming the first problem."""
    if not isinstance(log, dict):
        raise NextnError(f"{where}: not a nextn tuning log (top level is not an object)")
    if log.get("format") != FORMAT:
        raise NextnError(f"{where}: not a nextn tuning log (format {log.get('format')!r}, expected {FORMAT!r})")
    if log.get("schema") not in READS:
        raise NextnError(f"{where}: tuning log schema {log.get('schema')!r}, this nextn reads schema "
                         f"{', '.join(map(str, READS))}; tune again (nextn tune)")
    extra = set(log) - _TOP
    if extra:
        raise NextnError(f"{where}: unknown field(s) {sorted(extra)}; a tuning log holds data fields only")
    if not isinstance(log.get("records"), list):
        raise NextnError(f"{where}: 'records' must be a list")
    _validate_knobs(log.get("x86_knobs", []), where, log["schema"])
    known = None
    if check_kinds:
        from tvm.s_tir.schedule import InstructionKind

        known = InstructionKind
    for i, r in enumerate(log["records"]):
        w = f"{where}: record {i}"
        if not isinstance(r, dict) or set(r) != _REC:
            got = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise NextnError(f"{w}: fields {got}, expected {sorted(_REC)}")
        _plain(r, w)
        if not (isinstance(r["workload_hash"], str) and r["workload_hash"].isalnum()):
            raise NextnError(f"{w}: 'workload_hash' must be an alphanumeric string")
        for k in ("name", "workload"):
            if not isinstance(r[k], str):
                raise NextnError(f"{w}: '{k}' must be a string")
        try:
            json.loads(base64.b64decode(r["workload"], validate=True))
        except Exception:
            raise NextnError(f"{w}: 'workload' is not base64-encoded IR JSON") from None
        t = r["target"]
        if not isinstance(t, dict) or not set(t) <= _TGT or "key" not in t or not all(isinstance(v, str) for v in t.values()):
            raise NextnError(f"{w}: 'target' must be an object of strings with a 'key'")
        if not isinstance(r["run_secs"], list) or not r["run_secs"] or \
                not all(isinstance(x, (int, float)) and x > 0 for x in r["run_secs"]):
            raise NextnError(f"{w}: 'run_secs' must be a non-empty list of positive numbers")
        if not isinstance(r["trace"], list) or not isinstance(r["args_info"], list):
            raise NextnError(f"{w}: 'trace' and 'args_info' must be lists")
        if known is not None:
            for kind in _instruction_kinds(r["trace"]):
                try:
                    known.get(kind)
                except Exception:
                    raise NextnError(f"{w}: trace instruction '{kind}' is not a schedule primitive") from None
    return log


def _validate_knobs(recs, where: str, schema: int) -> None:
    import dataclasses

    from nextn.compiler.lower.x86 import Knobs

    fields = {f.name: type(f.default) for f in dataclasses.fields(Knobs)}
    want = _KNOB_REC
    if not isinstance(recs, list):
        raise NextnError(f"{where}: 'x86_knobs' must be a list")
    for i, r in enumerate(recs):
        w = f"{where}: x86_knobs {i}"
        if not isinstance(r, dict) or set(r) != want:
            got = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise NextnError(f"{w}: fields {got}, expected {sorted(want)} (schema {schema})")
        _plain(r, w)
        t = r["target"]
        if not isinstance(r["key"], str) or not isinstance(t, dict) or not set(t) <= _TGT or "key" not in t \
                or not all(isinstance(v, str) for v in t.values()):
            raise NextnError(f"{w}: 'key' must be a string and 'target' an object of strings with a 'key'")
        kb = r["knobs"]
        if not isinstance(kb, dict):
            raise NextnError(f"{w}: 'knobs' must be an object of x86 knob values")
        for name, v in kb.items():
            if name not in fields:
                raise NextnError(f"{w}: '{name}' is not a knob of this nextn's x86 kernels (knobs: "
                                 f"{', '.join(fields)}); a newer nextn made this log")
            if fields[name] is bool:
                ok = isinstance(v, bool)
            else:
                ok = isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 4096
            if not ok:
                raise NextnError(f"{w}: knob '{name}' must be {'true or false' if fields[name] is bool else 'an integer in 1..4096'}")
        if "width" in kb and kb["width"] not in (32, 64):
            raise NextnError(f"{w}: knob 'width' must be 32 or 64 (vector bytes)")
        for f in ("run_secs", "default_secs", "speedups"):
            if not isinstance(r[f], list) or not r[f] or not all(_positive(x) for x in r[f]):
                raise NextnError(f"{w}: '{f}' must be a non-empty list of positive numbers")
        if not isinstance(r["rows"], list) or not r["rows"] or \
                not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in r["rows"]):
            raise NextnError(f"{w}: 'rows' must be a non-empty list of positive integers")
        if not len(r["rows"]) == len(r["run_secs"]) == len(r["default_secs"]) == len(r["speedups"]):
            raise NextnError(f"{w}: 'rows', 'run_secs', 'default_secs' and 'speedups' must have one entry per row count")
        if not isinstance(r["kept"], bool):
            raise NextnError(f"{w}: 'kept' must be true or false")
        if r["noise"] is not None and not (isinstance(r["noise"], (int, float)) and not isinstance(r["noise"], bool)
                                           and r["noise"] >= 0):
            raise NextnError(f"{w}: 'noise' must be a number >= 0 or null")
        if not (isinstance(r["rounds"], int) and not isinstance(r["rounds"], bool) and r["rounds"] >= 1):
            raise NextnError(f"{w}: 'rounds' must be a positive integer")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def read(path: str, check_kinds: bool = True) -> dict:
    """Read a log file (or LOG_DIR/log.json). Raises NextnError for anything that is not a valid log."""
    path = log_file(path)
    if not os.path.isfile(path):
        raise NextnError(f"{path}: no such tuning log")
    if os.path.getsize(path) > MAX_BYTES:
        raise NextnError(f"{path}: tuning log larger than {MAX_BYTES >> 20} MB")
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:1] == b"\x80":
        raise NextnError(f"{path}: looks like a Python pickle; tuning logs are JSON data only")
    try:
        log = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NextnError(f"{path}: not JSON ({e.__class__.__name__}); tuning logs are JSON data only") from None
    return validate(log, path, check_kinds)


def write(log: dict, path: str) -> str:
    if os.path.isdir(path) or not path.endswith(".json"):
        os.makedirs(path, exist_ok=True)
        path = os.path.join(path, LOG_FILE)
    tmp = path + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(log, f, indent=None, separators=(",", ":"), sort_keys=True)
    os.replace(tmp, path)
    return path


def best(r: dict) -> float:
    return min(r["run_secs"])


def speedup(r: dict) -> float:
    """An x86 knob record's speedup over the default: the geometric mean over its row counts."""
    import math

    return math.exp(sum(math.log(x) for x in r["speedups"]) / len(r["speedups"]))


def merge(logs: list[dict]) -> dict:
    """Union of `logs` (read, so in the current schema): per (workload_hash, target key) the fastest record, per
    (x86 kernel key, target key) the kept record with the highest speedup (a not-kept one only where no log kept
    one); deterministic order."""
    out = empty_log()
    keep: dict[tuple, dict] = {}
    for log in logs:
        for r in log["records"]:
            k = (r["workload_hash"], r["target"]["key"])
            if k not in keep or best(r) < best(keep[k]):
                keep[k] = r
    out["records"] = [keep[k] for k in sorted(keep)]
    knobs: dict[tuple, dict] = {}
    rank = lambda r: (r["kept"], speedup(r))   # noqa: E731
    for log in logs:
        for r in log.get("x86_knobs", []):
            k = (r["key"], r["target"]["key"])
            if k not in knobs or rank(r) > rank(knobs[k]):
                knobs[k] = r
    out["x86_knobs"] = [knobs[k] for k in sorted(knobs)]
    return out


def knob_records(log: dict, target_key: str) -> dict[str, dict]:
    """{x86 kernel key: knobs} of the kept knob records of `target_key` (a record that kept the default is none)."""
    return {r["key"]: r["knobs"] for r in log.get("x86_knobs", []) if r["target"]["key"] == target_key and r["kept"]}


def for_target(log: dict, target_key: str) -> tuple[dict[str, dict], int]:
    """Records of `target_key` by workload hash, and how many records were for other targets."""
    mine = {r["workload_hash"]: r for r in log["records"] if r["target"]["key"] == target_key}
    return mine, sum(1 for r in log["records"] if r["target"]["key"] != target_key)
