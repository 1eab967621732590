"""Reproducible builds: the same inputs (model, options, tuning log) give the same library bytes.

TVM's VM shape lowering orders some statements by object address, so two compiles can emit the same
kernels in a different order. `nextn compile` therefore runs the build in a child process with address-space
randomisation off (`setarch -R`) and a fixed PYTHONHASHSEED, which makes that order — and the library's
sha256 — a function of the inputs. Where `setarch` is missing the build runs in-process (still correct,
not byte-reproducible).

The child is `python -m MODULE JSON_KWARGS`: MODULE's `__main__` block calls `child_main(its function, arg)`
(compiler/compile.py), which speaks the line protocol `run_in_child` reads: {"log": str}, {"error": str} (a
NextnError), {"done": result}.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

from nextn.common.errors import NextnError

CHILD_ENV = "NEXTN_COMPILE_CHILD"


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def available() -> bool:
    return shutil.which("setarch") is not None and os.environ.get("NEXTN_REPRODUCIBLE", "1") != "0"


def run_in_child(module: str, kwargs: dict, log) -> str:
    """Run `python -m module json(kwargs)` in the reproducible child; forward its log lines; re-raise its errors."""
    env = {**os.environ, CHILD_ENV: "1", "PYTHONHASHSEED": "0"}
    cmd = ["setarch", platform.machine(), "-R", sys.executable, "-m", module, json.dumps(kwargs)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    result = None
    for line in p.stdout:
        try:
            msg = json.loads(line)
        except ValueError:   # not one of the child's messages (a native library's print): pass it on
            sys.stderr.write(line)
            continue
        if "log" in msg:
            log(msg["log"])
        elif "error" in msg:
            result = NextnError(msg["error"])
        elif "done" in msg:
            result = msg["done"]
    rc = p.wait()
    if isinstance(result, NextnError):
        raise result
    if rc != 0 or result is None:
        raise RuntimeError(f"the compile child process failed (exit {rc}); see its output above")
    return result


def child_main(fn, arg: str) -> int:
    """In the child: fn(**json.loads(arg), log=...) with its log lines, error or result as protocol lines."""
    def out(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        res = fn(**json.loads(arg), log=lambda m: out({"log": str(m)}))
    except NextnError as e:
        out({"error": str(e)})
        return 3
    out({"done": res})
    return 0
