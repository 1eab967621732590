"""Device check of a compiled nextn artifact: correctness vs the fixture references, then decode speed.

    python bench/device_check.py ARTIFACT_DIR --refs REF_DIR [--device cuda:0] [--out DIR] [-n 64]

1. logits vs references (trunk logits, hidden, NextN logits for the prompts with full rows; last-row logits and
   argmax for every prompt; tolerance 1e-4 relative, as the CPU tests), greedy continuation == reference,
   greedy spec-on (n_max 1..3) == spec-off with the reference acceptance counts;
2. decode tokens/s with speculation off and on (n_max 3), the fraction of the copy-bandwidth floor for the active
   weight bytes (tokens/s × bytes read per token ÷ measured device-to-device copy bandwidth), the MTP speedup.
Details go to OUT/device_check.json; a short table is printed last. Builds nothing, needs no compiler.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from nextn.common.compare import rel_err


def copy_bandwidth(dev, nbytes=256 << 20, reps=10):
    """Device-to-device copy bandwidth in bytes/s (reads + writes counted once each: 2 × nbytes per copy)."""
    import tvm

    a = tvm.runtime.empty((nbytes // 4,), "float32", dev)
    b = tvm.runtime.empty((nbytes // 4,), "float32", dev)
    b.copyfrom(a)
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        b.copyfrom(a)
    dev.sync()
    return 2 * nbytes * reps / (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--refs", required=True, help="dir with reference.json + reference_logits.npz")
    ap.add_argument("--model", default=None, help="GGUF the artifact was built from (if not at its recorded path)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("-n", type=int, default=64)
    a = ap.parse_args(argv)

    from nextn.runtime.api import Model
    from nextn.runtime.artifact import load_artifact
    from nextn.runtime.engine import Engine

    ref = json.load(open(os.path.join(a.refs, "reference.json")))
    npz = np.load(os.path.join(a.refs, "reference_logits.npz"))
    prompts = {p["kind"]: p for p in ref["prompts"]}
    t0 = time.perf_counter()
    eng = Engine(load_artifact(a.artifact), 4096, True, model_path=a.model, device=a.device)
    load_s = time.perf_counter() - t0
    m = Model(eng)
    dev = eng.dev
    res = {"device": a.device, "gpu": getattr(dev, "device_name", platform.processor()),
           "arch": getattr(eng.device, "arch", "cpu"), "load_s": load_s, "checks": [], "timing": {}}
    fails = 0

    def check(name, ok, detail=""):
        nonlocal fails
        fails += 0 if ok else 1
        res["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)

    for kind in sorted(prompts):
        ids = prompts[kind]["prompt_ids"]
        if f"{kind}/trunk_logits" in npz.files:
            e = rel_err(m.logits(ids), npz[f"{kind}/trunk_logits"])
            check(f"{kind} trunk logits", e < 1e-4, f"rel_err={e:.2e}")
            e = rel_err(eng.hidden(ids), npz[f"{kind}/trunk_hidden"])
            check(f"{kind} trunk hidden", e < 1e-4, f"rel_err={e:.2e}")
            if eng.has_mtp:
                e = rel_err(m.mtp_logits(ids), npz[f"{kind}/mtp_logits"])
                check(f"{kind} mtp logits", e < 1e-4, f"rel_err={e:.2e}")
        _h, last, am = eng.prefill(np.asarray(ids, np.int32), 0)
        e = rel_err(last, npz[f"{kind}/last_logits"])
        check(f"{kind} last logits", e < 1e-4 and am == prompts[kind]["last_logits_argmax"], f"rel_err={e:.2e} argmax={am}")
        p = prompts[kind]
        plain = m.generate(ids, p["n_predict"], spec_type="none", ignore_eos=True)
        check(f"{kind} greedy", plain.ids == p["greedy_ids"])
        if eng.has_mtp:
            for n_max in (1, 2, 3):
                r = m.generate(ids, p["n_predict"], spec_type="draft-mtp", n_max=n_max, ignore_eos=True)
                w = p["spec"][str(n_max)]
                check(f"{kind} spec n_max={n_max} == greedy", r.ids == plain.ids,
                      f"accepted {r.stats.accepted}/{r.stats.drafted} (ref {w['accepted']}/{w['drafted']})")

    # -- timing ---------------------------------------------------------------------------------------------------
    ids = prompts[sorted(prompts)[0]]["prompt_ids"]
    bw = copy_bandwidth(dev) if eng.device.kind == "cuda" else float("nan")
    man = eng.artifact.manifest
    active = man["buffer_plan"].get("trunk_weight_bytes", eng.weight_bytes)
    timing = {}
    for label, spec, n_max in (("spec off", "none", 0), ("spec on (n_max 3)", "draft-mtp", 3)):
        if spec == "draft-mtp" and not eng.has_mtp:
            continue
        m.generate(ids, 8, spec_type=spec, n_max=max(n_max, 1), ignore_eos=True)   # warm-up
        runs = [m.generate(ids, a.n, spec_type=spec, n_max=max(n_max, 1), ignore_eos=True) for _ in range(3)]
        best = max(runs, key=lambda r: r.tokens_per_s)
        tps = best.tokens_per_s
        # Bytes the trunk must read per generated token (plain decoding); speculation amortises it over accepted tokens.
        floor_tps = bw / active if bw == bw else float("nan")
        timing[label] = {"tokens_per_s": tps, "floor_tokens_per_s": floor_tps, "fraction_of_floor": tps / floor_tps,
                         "acceptance": best.stats.acceptance if spec != "none" else None,
                         "mean_len": best.stats.mean_len if spec != "none" else None}
    if len(timing) == 2:
        timing["mtp_speedup"] = timing["spec on (n_max 3)"]["tokens_per_s"] / timing["spec off"]["tokens_per_s"]
    res["timing"] = timing
    res["copy_bandwidth_GBps"] = bw / 1e9
    res["active_weight_bytes"] = active
    res["cuda_graph"] = man.get("cuda_graph")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "device_check.json"), "w") as f:
        json.dump(res, f, indent=1)

    print()
    print(f"device {res['gpu']} ({res['arch']}), artifact {man['target']['name']} {','.join(man['target'].get('arches', []))}"
          f" (CUDA graphs {'on: ' + ','.join(man['cuda_graph']['entries']) if man.get('cuda_graph') else 'off'}), "
          f"copy bw {bw / 1e9:.0f} GB/s, active weights {active / 1e6:.1f} MB")
    print(f"checks: {len(res['checks']) - fails}/{len(res['checks'])} ok")
    print(f"{'mode':20s} {'tok/s':>10s} {'floor tok/s':>12s} {'of floor':>9s} {'accept':>7s}")
    for label, t in timing.items():
        if isinstance(t, dict):
            acc = f"{t['acceptance']:.3f}" if t["acceptance"] is not None else "-"
            print(f"{label:20s} {t['tokens_per_s']:10.1f} {t['floor_tokens_per_s']:12.1f} {t['fraction_of_floor']:9.3f} {acc:>7s}")
    if "mtp_speedup" in timing:
        print(f"MTP speedup: {timing['mtp_speedup']:.2f}x")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
