"""The device check's stage runner: each stage in its own try, printed and recorded as it ends, its inputs' failure a
`skip`, OUT/device_check.json rewritten after every stage (a run killed in stage N leaves stages 1..N-1)."""
from __future__ import annotations

import json
import os
import time
import traceback

import numpy as np

from device_cuda import CudaRT

class Skip(Exception):
    """A stage that cannot run because a stage it needs did not succeed."""


class Check:
    """Runs stages one by one, each in its own try; prints and records each; rewrites OUT/device_check.json."""

    def __init__(self, out_dir: str, device: str, n_stages: int):
        self.out_dir, self.device, self.n_stages = out_dir, device, n_stages
        self.cuda = CudaRT() if device.startswith("cuda") else None
        self.results: dict = {"device": device, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "stages": []}
        self.ok: set[str] = set()
        os.makedirs(out_dir, exist_ok=True)

    def stage(self, name: str, fn, needs=()):
        i = len(self.results["stages"]) + 1
        print(f"[{i:2d}/{self.n_stages}] {name} ...", flush=True)
        rec = {"stage": name, "status": "ok", "s": 0.0}
        t0 = time.perf_counter()
        try:
            missing = [n for n in needs if n not in self.ok]
            if missing:
                raise Skip(f"needs {', '.join(missing)}")
            rec["result"] = fn() or {}
            self.ok.add(name)
        except Skip as e:
            rec.update(status="skip", error=str(e))
        except BaseException as e:   # noqa: BLE001 — a stage may die in any way (a native RuntimeError, an assert)
            if isinstance(e, KeyboardInterrupt):
                raise
            rec.update(status="FAIL", error=f"{type(e).__name__}: {e}".strip(), traceback=traceback.format_exc())
        rec["s"] = time.perf_counter() - t0
        if self.cuda is not None:
            rec["cuda_last_error"] = self.cuda.last_error()
        self.results["stages"].append(rec)
        if rec["status"] == "ok":
            print(f"    ok   {rec['s']:.2f} s  {summary(rec['result'])}", flush=True)
        else:
            cuda = f" | cudaGetLastError = {rec['cuda_last_error']}" if self.cuda is not None else ""
            print(f"    {rec['status']:4s} {rec['s']:.2f} s  {rec['error'].splitlines()[0][:400]}{cuda}", flush=True)
        self.write()
        return rec

    def write(self):
        path = os.path.join(self.out_dir, "device_check.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.results, f, indent=1, default=_json_default)
        os.replace(path + ".tmp", path)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def summary(result: dict, width: int = 300) -> str:
    """A stage's result on one line: the scalars, not the tables."""
    parts = []
    for k, v in result.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
        elif isinstance(v, (int, str, bool)) or v is None:
            parts.append(f"{k}={v}")
    s = " ".join(parts)
    return s if len(s) <= width else s[:width] + " …"
