"""How far two float32 computations of the same quantized model lie apart when only their summation order differs:
the measurement behind the device check's GPU tolerance (bench/device_check.py GPU_TOL).

    python bench/exact_tolerance.py [--models glm4moe-Q8_0,...] [--kinds code-short,...]

For each quantized model of the bundle's checks (bench/bundle.py CHECKS), the `--exact-matmul` llvm artifact (float
activation rows, what the CUDA kernels compute; bench/bundle.py `cpu_artifact`, the one the bundle records from) against the numpy IR
interpreter on gguf-py-dequantized weights (nextn.compiler.ir.interpret, numpy's BLAS order): last-row logits of the
prompt's prefill, max |Δ| / max |want| (nextn.common.compare.rel_err). For scale, the default llvm artifact, whose
K-quant / Q8_0 matmuls take int8-quantized activation rows, against the same interpreter; and that int8 artifact
against the interpreter with the same int8 activation rows (`quantized_activations`: x replaced by d · q per block,
float64 products): the same int8 computation in another summation order, the bar of the CUDA integer route
(compiler/lower/cuda/int8.py). Prints one line per prompt and the worst per model.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bundle import CHECKS, FIXTURES, cpu_artifact  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(n for n, c in CHECKS.items() if c[2] == "cpu"))
    ap.add_argument("--kinds", default="", help="prompt kinds (default: all but long-context)")
    a = ap.parse_args(argv)

    import nextn.runtime as rt
    from nextn.common.compare import rel_err
    from nextn.compiler.ir import interpret
    from nextn.compiler.ir.reference import graphs_and_dequantized, prefill_inputs, zero_states

    for name in a.models.split(","):
        fixture, gguf, _how = CHECKS[name]
        path = os.path.join(FIXTURES, fixture, gguf)
        exact = rt.load(cpu_artifact(path, exact=True), ctx_size=4096)
        q8act = rt.load(cpu_artifact(path, exact=False), ctx_size=4096)
        graphs, w = graphs_and_dequantized(path)
        graph = graphs["prefill"]
        prompts = json.load(open(os.path.join(FIXTURES, fixture, "reference.json")))["prompts"]
        kinds = [k for k in a.kinds.split(",") if k] or [p["kind"] for p in prompts if p["kind"] != "long-context"]
        worst = {"exact": 0.0, "q8act": 0.0, "int8": 0.0}
        acts = {b["tensor"]: b["activation"] for b in q8act.loaded.artifact.manifest["buffer_plan"]["weights"]
                if b.get("activation")}
        for p in prompts:
            if p["kind"] not in kinds:
                continue
            ids = np.asarray(p["prompt_ids"], np.int32)
            T = len(ids)
            st = zero_states(graph, T, planes=2)
            want = interpret.run(graph, prefill_inputs(graph, ids), w, st, n_kv=T)["logits"][0]
            want8 = interpret.run(graph, prefill_inputs(graph, ids), w, zero_states(graph, T, planes=2), n_kv=T,
                                  quantized_activations=acts)["logits"][0]
            got8 = q8act.sequence.prefill(ids, 0)[1]
            e = {"exact": rel_err(exact.sequence.prefill(ids, 0)[1], want), "q8act": rel_err(got8, want),
                 "int8": rel_err(got8, want8)}
            for k in worst:
                worst[k] = max(worst[k], e[k])
            print(f"{name:16s} {p['kind']:14s} T={T:4d}  exact-matmul {e['exact']:.2e}  int8 activations "
                  f"{e['q8act']:.2e}  int8 vs int8 interpreter {e['int8']:.2e}", flush=True)
        print(f"{name}: worst exact-matmul vs interpreter {worst['exact']:.2e}; int8-activation build vs interpreter "
              f"{worst['q8act']:.2e}; int8 build vs int8 interpreter {worst['int8']:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
