"""`nextn tuning measure DIR`: time the candidate kernels of an offline tuning run (compiler/tune/offline.py).

Runs where the GPU is, with the TVM runtime only (no compiler): loads each library listed in
DIR/candidates.json after checking its sha256, times it on random inputs, writes DIR/results.json.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .artifact import sha256_file
from .errors import NextnError


def measure(cand_dir: str, device: str = "cpu", number: int = 20, log=print) -> dict:
    import tvm

    path = os.path.join(cand_dir, "candidates.json")
    try:
        with open(path) as f:
            book = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise NextnError(f"{path}: cannot read the candidate list ({e})") from None
    if device == "cpu":
        dev = tvm.cpu()
        name = _cpu_name()
    elif device.startswith("cuda"):
        import ctypes

        lib = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
        if os.path.exists(lib):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)   # not auto-loaded in runtime-only mode (field guide §6.3)
        dev = tvm.cuda(int(device.partition(":")[2] or 0))
        name = str(getattr(dev, "device_name", "cuda"))
    else:
        raise NextnError(f"--device {device}: expected cpu or cuda:N")
    rng = np.random.default_rng(0)
    seconds = {}
    for w in book["workloads"]:
        args = []
        for a in w["args"]:
            arr = (rng.integers(0, 2, a["shape"]) if a["dtype"].startswith("int") else
                   rng.standard_normal(a["shape"]) * 0.1).astype(a["dtype"])
            args.append(tvm.runtime.tensor(arr, dev))
        for entry in [w["default"]] + w["candidates"]:
            lib = os.path.join(cand_dir, entry["file"])
            if sha256_file(lib) != entry["sha256"]:
                raise NextnError(f"{lib}: sha256 does not match candidates.json; refusing to load it")
            mod = tvm.runtime.load_module(lib)
            fe = mod.time_evaluator("main", dev, number=number, repeat=3)
            seconds[entry["file"]] = float(min(fe(*args).results))
        log(f"  {w['name']}: default {seconds[w['default']['file']] * 1e6:.1f} us, best candidate "
            f"{min([seconds[c['file']] for c in w['candidates']] or [float('nan')]) * 1e6:.1f} us")
    out = {"device": device, "device_name": name, "seconds": seconds}
    with open(os.path.join(cand_dir, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"
