"""`nextn tuning measure DIR`: time the candidate kernels of an offline tuning run (compiler/tune/offline.py).

Runs where the GPU is, with the TVM runtime only (no compiler): loads each library listed in
DIR/candidates.json after checking its sha256, times it on random inputs, writes DIR/results.json.
`random_args`, `time_main` and `cpu_name` are also what `nextn tune` times kernels with on this machine.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .artifact import sha256_file
from .errors import NextnError


def arg_specs(func) -> list[dict]:
    """[{shape, dtype}] of a static PrimFunc's buffer parameters (the form candidates.json stores)."""
    return [{"shape": [int(d) for d in p.shape], "dtype": str(p.dtype)} for p in func.params]


def random_args(specs, dev, seed: int = 0) -> list:
    """Device tensors for `specs`: integers in {0, 1} (quant codes, indices stay in range), floats ~ N(0, 0.1²)."""
    import tvm

    rng = np.random.default_rng(seed)
    out = []
    for a in specs:
        arr = (rng.integers(0, 2, a["shape"]) if a["dtype"].startswith("int") else
               rng.standard_normal(a["shape"]) * 0.1).astype(a["dtype"])
        out.append(tvm.runtime.tensor(arr, dev))
    return out


def time_main(mod, args, dev, number: int = 20) -> float:
    """Seconds per call of `mod["main"](*args)`: the best of 3 repeats of `number` calls."""
    fe = mod.time_evaluator("main", dev, number=number, repeat=3)
    return float(min(fe(*args).results))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def measure(cand_dir: str, device: str = "cpu", number: int = 20, log=print) -> dict:
    import tvm

    from .device import load_cuda_plugin, parse_device

    path = os.path.join(cand_dir, "candidates.json")
    try:
        with open(path) as f:
            book = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise NextnError(f"{path}: cannot read the candidate list ({e})") from None
    kind, index = parse_device(device)
    if kind == "cpu":
        dev, name = tvm.cpu(), cpu_name()
    elif kind == "cuda":
        load_cuda_plugin()   # not auto-loaded in runtime-only mode (field guide §6.3)
        dev = tvm.cuda(index)
        name = str(getattr(dev, "device_name", "cuda"))
    else:
        raise NextnError(f"--device {device}: measuring needs cpu or cuda:N")
    seconds = {}
    for w in book["workloads"]:
        args = random_args(w["args"], dev)
        for entry in [w["default"]] + w["candidates"]:
            lib = os.path.join(cand_dir, entry["file"])
            if sha256_file(lib) != entry["sha256"]:
                raise NextnError(f"{lib}: sha256 does not match candidates.json; refusing to load it")
            seconds[entry["file"]] = time_main(tvm.runtime.load_module(lib), args, dev, number)
        log(f"  {w['name']}: default {seconds[w['default']['file']] * 1e6:.1f} us, best candidate "
            f"{min([seconds[c['file']] for c in w['candidates']] or [float('nan')]) * 1e6:.1f} us")
    out = {"device": device, "device_name": name, "seconds": seconds}
    with open(os.path.join(cand_dir, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out
