"""What one call of a compiled entry point costs beyond its kernels, at real width: the Python share of plain
decode time, and the arguments each VM call passes.

    flock "$(python bench/realwidth_files.py --lock)" .venv/bin/python bench/call_overhead.py \
        "$(python bench/realwidth_files.py glm45air-1 | cut -d= -f2)"
    ... [-n 32] [--repeat 3] [--layers 46] [--json out.json]

Entry points take their states and weights as two tuples bound at load (compiler/lower/to_relax.py), so a decode
call passes inputs + n_kv + 2 arguments; passing every buffer would be inputs + n_kv + states + weight buffers.
Reported for the file and for the same model at `--layers` layers (GLM-4.5-Air: 46, the first dense; the per-layer
buffer counts are the file's), with the tvm-ffi cost of passing that many tensors to a no-op packed function
(`testing.nop`) against the two tuples. The decode rows: plain decode (spec off) of `-n` tokens after an 8-token
prompt of fixed random ids, best of `--repeat`: tok/s, ms per token inside the compiled entry points, and the
share of decode time outside them (the loop, host copies, sampling: `GenerateResult.python_share`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time


def ffi_call_us(n_tensors: int, calls: int = 2000) -> tuple[float, float]:
    """(µs per call of a no-op packed function with `n_tensors` tensor arguments, µs with them as one Array)."""
    import numpy as np
    import tvm
    import tvm_ffi

    nop = tvm_ffi.get_global_func("testing.nop")
    ts = [tvm.runtime.tensor(np.zeros(4, np.float32)) for _ in range(n_tensors)]
    arr = tvm_ffi.convert(ts)
    out = []
    for call in (lambda: nop(*ts), lambda: nop(arr, arr)):
        call()
        t = time.perf_counter()
        for _ in range(calls):
            call()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return out[0], out[1]


def buffers_per_layer(names: list[str]) -> dict[int, int]:
    """{layer index: weight buffers of that layer} from buffer names `blk.<i>.…`."""
    per: dict[int, int] = {}
    for n in names:
        m = re.match(r"blk\.(\d+)\.", n)
        if m:
            per[int(m.group(1))] = per.get(int(m.group(1)), 0) + 1
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", type=int, default=46, help="trunk layers of the real model (GLM-4.5-Air: 46)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np

    import nextn.runtime as rt

    m = rt.load(args.model, ctx_size=512, spec=False, log=lambda s: print(s, file=sys.stderr))
    seq = m.sequence
    ep = seq.model.artifact.manifest["entry_points"]["decode"]
    hp = seq.model.hparams
    per = buffers_per_layer(ep["weights"])
    n_dense = int(hp.get("n_lead_dense", 0))
    dense = max((per[i] for i in per if i < n_dense), default=0)
    moe = max(per.values())
    other = len(ep["weights"]) - sum(per.values())
    states_per_layer = len(ep["states"]) / hp["n_layer"]
    n_in = len(ep["inputs"]) + 1   # + n_kv
    file_unbundled = n_in + len(ep["states"]) + len(ep["weights"])
    real_unbundled = int(n_in + states_per_layer * args.layers + other + dense * n_dense + moe * (args.layers - n_dense))
    res = {"model": args.model, "decode_args_bundled": n_in + 2, "decode_args_unbundled_file": file_unbundled,
           f"decode_args_unbundled_{args.layers}_layers": real_unbundled}
    for label, n in (("file", file_unbundled), (f"{args.layers}_layers", real_unbundled)):
        sep, bundled = ffi_call_us(n - n_in)
        res[f"ffi_us_unbundled_{label}"], res["ffi_us_two_tuples"] = sep, bundled

    ids = [int(x) for x in np.random.default_rng(0).integers(0, hp["n_vocab"], 8)]
    best = None
    for _ in range(args.repeat):
        r = m.generate(ids, args.n_predict, spec_type="none", ignore_eos=True)
        if best is None or r.decode_s < best.decode_s:
            best = r
    n = len(best.ids)
    res.update(tok_s=best.tokens_per_s, ms_per_token=best.decode_s / n * 1e3,
               vm_ms_per_token=sum(best.vm_s.values()) / n * 1e3, python_share=best.python_share)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
