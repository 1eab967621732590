"""The tuning log: a pure-data JSON file that users share.

    {"format": "nextn-tuning-log", "schema": 2, "nextn_version": str, "tvm_version": str,
     "records": [{"workload_hash": str (hex), "name": str, "workload": str (base64 of TVM's IR JSON),
                  "target": {"key": str, "kind": str, "mcpu"|"arch": str, "device_name": str, "json": str},
                  "trace": [...] (meta_schedule trace JSON), "args_info": [...], "run_secs": [float, ...]}],
     "x86_knobs": [{"key": str (compiler/lower/x86 KernelSpec.key), "target": {...as above},
                    "knobs": {"width": int, "tile_n": int, "row_group": int, "unroll": int},
                    "run_secs": [float, ...], "default_secs": [float, ...]}]}

`records` are meta_schedule traces of TE kernels; `x86_knobs` the knob settings of the hand-written x86
kernels (compiler/tune/knobs.py), each with its time and the default's, measured side by side. Schema 1 logs
(no `x86_knobs`) still read. A log is data, never code: reading it parses JSON only, checks every field's type
against this schema, rejects unknown fields, checks that every trace instruction is a registered schedule
primitive, and never unpickles or evaluates anything. Merge keeps the fastest record per (workload or kernel
key, target key).
"""
from __future__ import annotations

import base64
import json
import os

from nextn.common.errors import NextnError

FORMAT = "nextn-tuning-log"
SCHEMA = 2
READS = (1, 2)
LOG_FILE = "log.json"
MAX_BYTES = 256 << 20
_TOP = {"format", "schema", "nextn_version", "tvm_version", "records", "x86_knobs"}
_KNOB_REC = {"key", "target", "knobs", "run_secs", "default_secs"}
_KNOBS = {"width", "tile_n", "row_group", "unroll"}
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
        raise NextnError(f"{where}: tuning log schema {log.get('schema')!r}, this nextn reads schemas "
                         f"{', '.join(map(str, READS))}")
    extra = set(log) - _TOP
    if extra:
        raise NextnError(f"{where}: unknown field(s) {sorted(extra)}; a tuning log holds data fields only")
    if not isinstance(log.get("records"), list):
        raise NextnError(f"{where}: 'records' must be a list")
    _validate_knobs(log.get("x86_knobs", []), where)
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


def _validate_knobs(recs, where: str) -> None:
    if not isinstance(recs, list):
        raise NextnError(f"{where}: 'x86_knobs' must be a list")
    for i, r in enumerate(recs):
        w = f"{where}: x86_knobs {i}"
        if not isinstance(r, dict) or set(r) != _KNOB_REC:
            got = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise NextnError(f"{w}: fields {got}, expected {sorted(_KNOB_REC)}")
        _plain(r, w)
        t = r["target"]
        if not isinstance(r["key"], str) or not isinstance(t, dict) or not set(t) <= _TGT or "key" not in t \
                or not all(isinstance(v, str) for v in t.values()):
            raise NextnError(f"{w}: 'key' must be a string and 'target' an object of strings with a 'key'")
        kb = r["knobs"]
        if not isinstance(kb, dict) or set(kb) != _KNOBS or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                   and 1 <= v <= 4096 for v in kb.values()):
            raise NextnError(f"{w}: 'knobs' must hold the integers {sorted(_KNOBS)}")
        if kb["width"] not in (32, 64):
            raise NextnError(f"{w}: knob 'width' must be 32 or 64 (vector bytes)")
        for f in ("run_secs", "default_secs"):
            if not isinstance(r[f], list) or not r[f] or not all(isinstance(x, (int, float)) and x > 0 for x in r[f]):
                raise NextnError(f"{w}: '{f}' must be a non-empty list of positive numbers")


def read(path: str, check_kinds: bool = True) -> dict:
    """Read a log file (or LOG_DIR/log.json). Raises NextnError for anything that is not a valid log."""
    if os.path.isdir(path):
        path = os.path.join(path, LOG_FILE)
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


def merge(logs: list[dict]) -> dict:
    """Union of `logs` keeping the fastest record per (workload_hash, target key); deterministic order."""
    out = empty_log()
    keep: dict[tuple, dict] = {}
    for log in logs:
        for r in log["records"]:
            k = (r["workload_hash"], r["target"]["key"])
            if k not in keep or best(r) < best(keep[k]):
                keep[k] = r
    out["records"] = [keep[k] for k in sorted(keep)]
    knobs: dict[tuple, dict] = {}
    for log in logs:
        for r in log.get("x86_knobs", []):
            k = (r["key"], r["target"]["key"])
            if k not in knobs or best(r) < best(knobs[k]):
                knobs[k] = r
    out["x86_knobs"] = [knobs[k] for k in sorted(knobs)]
    return out


def knob_records(log: dict, target_key: str) -> dict[str, dict]:
    """{x86 kernel key: knobs} of `target_key`."""
    return {r["key"]: r["knobs"] for r in log.get("x86_knobs", []) if r["target"]["key"] == target_key}


def for_target(log: dict, target_key: str) -> tuple[dict[str, dict], int]:
    """Records of `target_key` by workload hash, and how many records were for other targets."""
    mine = {r["workload_hash"]: r for r in log["records"] if r["target"]["key"] == target_key}
    return mine, sum(1 for r in log["records"] if r["target"]["key"] != target_key)
