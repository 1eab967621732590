"""`nextn tuning measure DIR`: time the candidate kernels of an offline tuning run (compiler/tune/offline.py).

Runs where the GPU is, with the TVM runtime only (no compiler): loads each library listed in
DIR/candidates.json after checking its sha256, times it on random inputs, writes DIR/results.json
(formats and timing: nextn.common.measure).
"""
from __future__ import annotations

import json
import os

from nextn.common.errors import NextnError
from nextn.common.hashing import sha256_file
from nextn.common.measure import CANDIDATES, RESULTS, cpu_name, random_args, time_main


def measure(cand_dir: str, device: str = "cpu", number: int = 20, log=print) -> dict:
    import tvm

    from nextn.common import cuda

    from .device import CUDA_NEEDS, parse_device

    path = os.path.join(cand_dir, CANDIDATES)
    try:
        with open(path) as f:
            book = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise NextnError(f"{path}: cannot read the candidate list ({e})") from None
    kind, index = parse_device(device)
    if kind == "cpu":
        dev, name = tvm.cpu(), cpu_name()
    elif kind == "cuda":
        cuda.load_plugin(CUDA_NEEDS)
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
                raise NextnError(f"{lib}: sha256 does not match {CANDIDATES}; refusing to load it")
            seconds[entry["file"]] = time_main(tvm.runtime.load_module(lib), args, dev, number)
        log(f"  {w['name']}: default {seconds[w['default']['file']] * 1e6:.1f} us, best candidate "
            f"{min([seconds[c['file']] for c in w['candidates']] or [float('nan')]) * 1e6:.1f} us")
    out = {"device": device, "device_name": name, "seconds": seconds}
    with open(os.path.join(cand_dir, RESULTS), "w") as f:
        json.dump(out, f, indent=1)
    return out
