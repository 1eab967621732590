"""What the device check compares a device's outputs with: the fixtures' references (BF16 models), or a quantized
model's own CPU outputs recorded by bench/bundle.py (`record_expectations`), with the tolerances and the top-2
margins that tell a near-tie from a bug (`compare`)."""
from __future__ import annotations

import json
import os

import numpy as np

FULL_ROW_KINDS = ("code-short", "docs-heading")   # prompts whose every row has reference logits
N_MAX = (1, 2, 3)
LOGIT_TOL = 1e-4             # the fixtures' tolerance: max |Δ| / max |ref| per row
# Quantized models: the `--exact-matmul` CUDA artifact against the `--exact-matmul` llvm run (float activation rows,
# recorded by bench/bundle.py): the same computation in float32, only the summation order (and the GPU's exp) differ.
# 1e-5 is 16x the spread bench/exact_tolerance.py measures on the CPU and far below what int8 activations change
# (docs/gpu.md "References").
GPU_TOL = 1e-5
# The default (int8-activation) CUDA artifact of a GGUF on the CUDA integer route against the default llvm run
# (bench/bundle.py "NAME-int8"): the same int8 computation, but an upstream float32 rounding difference moves an
# activation across a quantization step now and then, and that row (and through the KV cache every later one) then
# differs by ~1e-2 (tests/test_compiled_vs_ir.py; bench/exact_tolerance.py "int8 vs int8 interpreter", last rows:
# up to 1.43e-2 on glm4moe-Q8_0, 1.14e-2 on glm4moe-Q4_K_M, 1.15e-2 on glm-dsa-Q8_0). 5e-2 catches a broken kernel (a
# wrong scale or quant order is O(1)), not a subtle one: greedy ids and acceptance become near-ties at 2 x 5e-2 and
# are reported, not failed. The integer kernels are checked tightly on their own (device_check `int8 kernels`).
INT8_TOL = 5e-2

def rel_err(got, want) -> float:
    from nextn.common.compare import rel_err as _rel_err

    return _rel_err(got, want)


def fixture_want(ref_dir: str, kinds) -> dict:
    """What a BF16 model must reproduce, from the fixture's reference.json + reference_logits.npz."""
    ref = json.load(open(os.path.join(ref_dir, "reference.json")))
    npz = np.load(os.path.join(ref_dir, "reference_logits.npz"))
    want = {}
    for p in ref["prompts"]:
        if kinds and p["kind"] not in kinds:
            continue
        w = {"prompt_ids": p["prompt_ids"], "n_predict": p["n_predict"], "greedy_ids": p["greedy_ids"],
             "argmax": p["last_logits_argmax"], "last_logits": npz[f"{p['kind']}/last_logits"],
             "spec": {str(k): [p["spec"][str(k)][f] for f in ("steps", "drafted", "accepted")] for k in N_MAX}}
        if f"{p['kind']}/trunk_logits" in npz.files:
            w["rows"] = {f: npz[f"{p['kind']}/{f}"] for f in ("trunk_logits", "trunk_hidden", "mtp_logits")}
        want[p["kind"]] = w
    return want


def expect_want(path: str, kinds) -> dict:
    """What a quantized model must reproduce: its own outputs on the CPU (llvm artifact), recorded by
    `record_expectations` when the bundle was built."""
    data = json.load(open(path + ".json"))
    npz = np.load(path + ".npz")
    return {k: dict(v, last_logits=npz[f"{k}/last_logits"]) for k, v in data.items() if not kinds or k in kinds}


def model_outputs(m, prompts: dict, rows: bool, margins: bool = False) -> dict:
    """Per prompt kind: last-row logits and argmax, the greedy continuation, greedy speculation at n_max 1..3
    ((rounds, drafted, accepted) and whether its tokens equal plain decoding); with `rows`, every row's trunk
    logits, hidden and NextN logits for the full-row kinds; with `margins`, the smallest top-2 gap of the greedy
    run (`greedy_margin`) and of each speculative run (`spec_margin`). glm-dsa drafts recompute the NextN index at
    every step (the references' rule); a second n_max 3 run with the shared index must give the same tokens."""
    from contextlib import nullcontext

    seq = m.sequence
    shared = "mtp_draft_shared" in seq.model.fn
    out = {}

    def gaps():
        return ArgmaxMargins(seq) if margins else nullcontext()

    for kind, p in prompts.items():
        ids = p["prompt_ids"]
        _h, last, am = seq.prefill(np.asarray(ids, np.int32), 0)
        with gaps() as g:
            plain = m.generate(ids, p["n_predict"], spec_type="none", ignore_eos=True)
        o = {"last_logits": np.asarray(last), "argmax": int(am), "greedy_ids": list(plain.ids), "spec": {},
             "spec_equal": {}, "margins": {"greedy_margin": g.min if margins else None, "spec_margin": {}}}
        if m.has_mtp:
            seq.model.share_mtp_index = False
            try:
                for k in N_MAX:
                    with gaps() as g:
                        r = m.generate(ids, p["n_predict"], spec_type="draft-mtp", n_max=k, ignore_eos=True)
                    o["spec"][str(k)] = [r.stats.rounds, r.stats.drafted, r.stats.accepted]
                    o["spec_equal"][str(k)] = r.ids == plain.ids
                    if margins:
                        o["margins"]["spec_margin"][str(k)] = g.min
            finally:
                seq.model.share_mtp_index = True
            if shared:
                r = m.generate(ids, p["n_predict"], spec_type="draft-mtp", n_max=3, ignore_eos=True)
                o["spec_equal"]["3 shared index"] = r.ids == plain.ids
        if rows and "rows" in p:
            o["rows"] = {"trunk_logits": m.logits(ids), "trunk_hidden": seq.hidden(ids)}
            if m.has_mtp:
                o["rows"]["mtp_logits"] = m.mtp_logits(ids)
        out[kind] = o
    return out


def compare(got: dict, want: dict, exact_acceptance: bool, tol: float = LOGIT_TOL) -> list[dict]:
    """One line per check: logits within `tol`, argmax, greedy ids, spec ≡ plain, acceptance counts.

    Expectations recorded with margins (`record_expectations`) tell a bug from a near-tie: when every logit of a
    run stays within tol · max|logit| of the expectation, an argmax can only change where the expectation's top-2
    gap was at most 2 · tol · max|logit|. A greedy-id or acceptance-count difference on a run whose smallest gap
    exceeds that is a failure; on a run that had such a near-tie it is reported (`undecided`), not failed."""
    checks = []

    def check(what, ok, detail="", margin=None):
        c = {"check": what, "ok": bool(ok), "detail": detail}
        if not ok and margin is not None and margin <= 2 * tol:
            c.update(ok=True, undecided=True, detail=f"{detail}; near-tie: the expectation's smallest top-2 gap "
                                                     f"{margin:.1e} <= 2 x tol, so an argmax may differ")
        checks.append(c)

    for kind, w in want.items():
        g = got[kind]
        e = rel_err(g["last_logits"], w["last_logits"])
        check(f"{kind} last logits", e < tol and g["argmax"] == w["argmax"],
              f"rel_err {e:.2e}, argmax {g['argmax']} (want {w['argmax']})", w.get("last_margin"))
        for f, arr in (w.get("rows") or {}).items():
            if f in g.get("rows", {}):
                e = rel_err(g["rows"][f], arr)
                check(f"{kind} {f}", e < tol, f"rel_err {e:.2e}")
        same = g["greedy_ids"] == w["greedy_ids"]
        first = next((i for i, (a, b) in enumerate(zip(g["greedy_ids"], w["greedy_ids"])) if a != b), None)
        check(f"{kind} greedy ids", same, "" if same else f"first difference at token {first}", w.get("greedy_margin"))
        for k, eq in g["spec_equal"].items():
            check(f"{kind} spec n_max={k} == spec off", eq)
        if exact_acceptance:
            for k, counts in g["spec"].items():
                if k in w["spec"]:
                    check(f"{kind} n_max={k} (rounds, drafted, accepted)", list(counts) == list(w["spec"][k]),
                          f"{counts} (want {w['spec'][k]})", (w.get("spec_margin") or {}).get(k))
    return checks


def top2_gap(logits) -> float:
    """Smallest (top-1 − top-2) / max|logit| over the rows of `logits` ([rows, V] or [V]): how close an argmax came
    to another token (the measure of nextn.common.compare.rel_err)."""
    lg = np.atleast_2d(np.asarray(logits, np.float32))
    top = np.sort(lg, axis=1)[:, -2:]
    return float(((top[:, 1] - top[:, 0]) / np.abs(lg).max(axis=1)).min())


class ArgmaxMargins:
    """Within the block, the smallest top-2 gap of every argmax the sequence `seq` computes (prefill's last row, verify /
    decode rows, NextN draft rows), read from the logits each entry point returns."""
    TAKES = ("prefill", "verify", "decode", "mtp_draft", "draft", "mtp_draft_shared")

    def __init__(self, seq):
        self.seq, self.min = seq, float("inf")

    def __enter__(self):
        run = self.run = self.seq._run

        def wrapped(name, *a, **k):
            out = run(name, *a, **k)
            if name in self.TAKES:
                self.min = min(self.min, top2_gap(out[1].numpy()))
            return out

        self.seq._run = wrapped
        return self

    def __exit__(self, *_exc):
        self.seq._run = self.run


def record_expectations(m, ref_dir: str, path: str, kinds=None) -> None:
    """Write PATH.json + PATH.npz: this model's outputs on the fixture prompts (run here, on the CPU; bench/bundle.py
    runs the `--exact-matmul` artifact, the computation the CUDA kernels implement), the expectation a GPU run of the
    same GGUF is compared with, with the smallest top-2 gap of the prefill, of the greedy run and of each greedy
    speculative run (`compare` tells near-ties from bugs with them)."""
    prompts = fixture_want(ref_dir, kinds)
    got = model_outputs(m, prompts, rows=False, margins=True)
    np.savez_compressed(path + ".npz", **{f"{k}/last_logits": v["last_logits"] for k, v in got.items()})
    keep = {k: {"prompt_ids": prompts[k]["prompt_ids"], "n_predict": prompts[k]["n_predict"],
                "argmax": v["argmax"], "greedy_ids": v["greedy_ids"], "spec": v["spec"],
                "last_margin": top2_gap(v["last_logits"]), **v["margins"]} for k, v in got.items()}
    with open(path + ".json", "w") as f:
        json.dump(keep, f)


def tolerance(check: dict) -> float:
    """The logits tolerance of a plan's check: its `tol` (bench/bundle.py writes GPU_TOL for the float-activation
    CPU expectations), else the fixtures' LOGIT_TOL."""
    return float(check.get("tol", LOGIT_TOL))
