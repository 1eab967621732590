"""The KDA delta-rule kernel at GLM-5.3-Flash's real widths (64 heads x 128 x 128 per layer), on this CPU.

    python bench/kda_kernels.py [--heads 64] [--dim 128] [--prefill 512] [--repeat 5]

Times `gated_delta_net` as the artifacts compile it (llvm, this host's CPU) for one layer: the recurrence for
1..4 rows (decode and verify of k+1 rows: the state after every row is kept for rollback) and a 512-row prefill
in the recurrent and the chunked form (chunk 16), best of --repeat, side by side in one run. The rest of a KDA
layer (projections, conv, gate, norm) is ordinary matmul / elementwise work and is not timed here.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def delta_rule_graph(H: int, D: int, chunk: int):
    from nextn.compiler.ir import Graph

    g = Graph(f"gdn_{chunk}")
    ins = [g.input(n, ("T", H, D)) for n in ("q", "k", "v", "g")]
    beta, pos, rs = g.input("beta", ("T", H)), g.input("pos", ("T",), "int32"), g.input("rs_plane", (1,), "int32")
    g.output("o", g.gated_delta_net(*ins, beta, g.state("S", ("P", H, D, D)), pos, rs, chunk))
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()

    import tvm
    import tvm_ffi
    from tvm.runtime.vm import VirtualMachine

    from nextn.compiler.target import make_target
    from nextn.compiler.lower.pipeline import make_pipeline
    from nextn.compiler.lower.to_relax import build_module
    from nextn.schedules import schedule_pass

    H, D, P = a.heads, a.dim, 6
    graphs = [delta_rule_graph(H, D, 0), delta_rule_graph(H, D, 16)]
    tgt = make_target("llvm")
    with tgt:
        ex = tvm.compile(build_module(graphs, {}), target=tgt, relax_pipeline=make_pipeline(tgt, schedule_pass(tgt)))
    vm = VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    state = tvm.runtime.tensor(rng.standard_normal((P, H, D, D)).astype(np.float32) * 0.1)

    def seconds(chunk: int, T: int) -> float:
        def l2(x):
            return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

        x = [l2(rng.standard_normal((T, H, D))), l2(rng.standard_normal((T, H, D))),
             rng.standard_normal((T, H, D)).astype(np.float32), rng.uniform(-5, 0, (T, H, D)).astype(np.float32),
             rng.uniform(0, 1, (T, H)).astype(np.float32), np.arange(1, T + 1, dtype=np.int32), np.array([0], np.int32)]
        args = [tvm.runtime.tensor(v) for v in x] + [tvm_ffi.Shape([T + 1]), state]
        f = vm[f"gdn_{chunk}"]
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            f(*args)
            best = min(best, time.perf_counter() - t0)
        return best

    one = seconds(0, 1)
    print(f"gated_delta_net, {H} heads x {D} x {D} (one KDA layer), best of {a.repeat}:")
    print(f"  decode (1 row): {one * 1e3:.3f} ms")
    for T in (2, 3, 4):
        s = seconds(0, T)
        print(f"  verify of {T} rows: {s * 1e3:.3f} ms = {s / one:.2f} x decode")
    rec, chk = seconds(0, a.prefill), seconds(16, a.prefill)
    print(f"  prefill of {a.prefill} rows: recurrence {rec * 1e3:.1f} ms, chunked (16) {chk * 1e3:.1f} ms "
          f"({rec / chk:.2f} x)")


if __name__ == "__main__":
    main()
