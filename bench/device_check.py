"""Staged device check of nextn's compiled artifacts: where the first run on a new GPU dies, and what it gets right.

    python3 run.py device-check [--device cuda:0] [--out DIR] [--quick] [--only STAGE,...]   (inside a bundle)
    python bench/device_check.py --plan PLAN.json --device cpu --out DIR                       (llvm artifacts)

The plan (the bundle's `bundle.json`, or any JSON of the same form) names the artifacts, their GGUFs and their
references. Every stage runs in its own `try`: it prints its name, then `ok` with its numbers or `FAIL` with the
exception and `cudaGetLastError`; `$OUT/device_check.json` is rewritten after every stage, so a run killed in
stage N still leaves stages 1..N-1 behind. A stage whose inputs failed says `skip` and names them; the stages
after it still run.

Stages: environment (Python, modules, nvidia-smi, driver / runtime versions through ctypes, the mapped CUDA
libraries, compute capability, SASS or PTX-JIT for this artifact, free memory) → plugin → load_module (timed:
a PTX JIT shows here) → vm_init → weights (bytes, s) → kv → prefill → decode without CUDA graphs, then with
graphs, across a 256-cell KV bucket boundary, compared bit for bit → per-entry timings (device-synchronized) →
one reference stage per model (logits, greedy ids, greedy spec on ≡ spec off with the reference acceptance) →
speed (decode tok/s spec off / n_max 1..3 / auto, MTP speedup, fraction of the copy-bandwidth floor measured in
the same run) → realwidth (GLM-4.5-Air widths: generate the GGUF, check its sha256, time plain decode, a verify of
k+1 rows and a draft step against the HBM floor). `--device cpu` runs every stage on llvm artifacts, which is
how CI proves this script's logic. A short table is printed last. Builds nothing and needs no compiler.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

# beside this file, in bench/ and in the bundle (bench/bundle.py BUNDLED_BENCH)
from device_cuda import GB, mapped_libraries, nvidia_smi
from device_refs import GPU_TOL, compare, expect_want, fixture_want, model_outputs, rel_err, tolerance
from device_stages import Check
from device_timing import draft_steps, entry_timings, full_head, speed_configs, step_bytes, timed_entry
from realwidth_files import realwidth_dir

QUICK_KINDS = ("code-short", "repetitive")
BUCKET_PROMPT = 250          # decode from cell 250 over the 256-cell bucket boundary
BUCKET_STEPS = 12
# The stages each stage needs (a reference stage opens its own engine: it needs the plugin only).
NEEDS = {"open": ["plugin"], "load_module": ["open"], "vm_init": ["load_module"], "weights": ["vm_init"],
         "kv": ["weights"], "prefill": ["kv"], "decode_graphs": ["prefill"], "entry_timings": ["prefill"],
         "speed": ["prefill"], "realwidth": ["plugin"]}


SPEC_PROMPT = "Hello"        # the predictable real-width files' prompt (issue 33's H200 table used it)
SPEC_VERIFY_ROWS = (2, 3, 4)  # verify of k+1 rows for n_max k = 1..3


def needs(stage: str) -> list[str]:
    return ["plugin"] if stage.startswith(("reference ", "realwidth ")) or stage == "int8 kernels" else \
        NEEDS.get(stage, [])


# -- the check -------------------------------------------------------------------------------------------------------
class DeviceCheck:
    def __init__(self, plan: dict, base: str, args):
        self.plan, self.base, self.a = plan, base, args
        self.kinds = [k for k in (args.prompts or "").split(",") if k] or (list(QUICK_KINDS) if args.quick else None)
        self.ctx = None
        self.loaded = self.seq = self.model = None   # the main check's LoadedModel, its Sequence, its api.Model

    def path(self, p: str | None) -> str | None:
        return None if p is None else p if os.path.isabs(p) else os.path.normpath(os.path.join(self.base, p))

    def check_of(self, role: str) -> dict:
        return next(c for c in self.plan["checks"] if c.get("role") == role)

    def stages(self):
        main = ["environment", "plugin", "open", "load_module", "vm_init", "weights", "kv", "prefill",
                "decode_graphs", "entry_timings"]
        refs = [f"reference {c['name']}" for c in self.plan["checks"] if c.get("role") != "nograph"]
        refs += ["int8 kernels"] if self.plan.get("int8_kernels") else []
        tail = ["speed"] + (["realwidth"] if self.plan.get("realwidth") else [])
        spec = [f"realwidth {rw['name']}" for rw in self.plan.get("realwidth_spec", [])]
        return main + refs + tail + spec

    def run(self) -> int:
        names = self.stages()
        only = [s for s in (self.a.only or "").split(",") if s]
        self.ctx = Check(self.a.out, self.a.device, len(names))
        self.ctx.results["plan"] = {k: v for k, v in self.plan.items() if k != "checks"} | {
            "checks": [c["name"] for c in self.plan["checks"]]}
        main = self.check_of("main")
        if only:   # --only STAGE runs STAGE and the stages it needs, transitively
            want = {n for n in names if any(n == o or n.startswith(o + " ") for o in only)}
            while True:
                more = {d for n in want for d in needs(n)}
                if more <= want:
                    break
                want |= more
            names = [n for n in names if n in want]
        self.ctx.n_stages = len(names)
        for name in names:
            if name.startswith("reference "):
                c = next(c for c in self.plan["checks"] if f"reference {c['name']}" == name)
                fn = lambda c=c: self.reference(c)   # noqa: E731
            elif name.startswith("realwidth "):
                rw = next(r for r in self.plan["realwidth_spec"] if f"realwidth {r['name']}" == name)
                fn = lambda rw=rw: self.realwidth_spec(rw)   # noqa: E731
            else:
                fn = lambda f=getattr(self, "s_" + name.replace(" ", "_")): f(main)   # noqa: E731
            self.ctx.stage(name, fn, needs=needs(name))
        # what this process ran on: a runtime-only bundle maps no TVM compiler library and imports no nextn.compiler
        self.ctx.results["runtime_only"] = {
            "libtvm_compiler_mapped": any("libtvm_compiler" in p for p in mapped_libraries(("libtvm",))),
            "compiler_modules": sorted(m for m in sys.modules if m.startswith("nextn.compiler"))}
        self.ctx.write()
        self.print_table()
        return 0 if all(s["status"] == "ok" for s in self.ctx.results["stages"]) else 1

    # -- engine stages -----------------------------------------------------------------------------------------
    def s_environment(self, _main) -> dict:
        import importlib

        env = {"python": sys.version.split()[0], "executable": sys.executable, "machine": platform.machine(),
               "platform": platform.platform(), "bundle": os.environ.get("NEXTN_BUNDLE"), "modules": {}}
        for mod in ("numpy", "tvm", "tvm_ffi", "tokenizers", "gguf", "tqdm", "yaml", "click"):
            try:
                m = importlib.import_module(mod)
                env["modules"][mod] = f"{getattr(m, '__version__', '?')} {os.path.dirname(m.__file__)}"
            except Exception as e:   # noqa: BLE001 — report, the stage that needs it fails on its own
                env["modules"][mod] = f"missing ({type(e).__name__}: {e})"
        from nextn.common.measure import cpu_name

        env["cpu"], env["cpus"] = cpu_name(), os.cpu_count()
        if os.environ.get("NEXTN_BUNDLE_PRELOAD_ERROR"):
            env["preload_error"] = os.environ["NEXTN_BUNDLE_PRELOAD_ERROR"]
        if self.ctx.cuda is not None:
            cu = self.ctx.cuda
            env["nvidia_smi"] = nvidia_smi()
            print("\n".join("    | " + ln for ln in env["nvidia_smi"].splitlines()), flush=True)
            env.update(cu.versions())
            env["capability"] = cu.capability(int(self.a.device.partition(":")[2] or 0))
            env["memory"] = cu.mem_info()
            env["cudart_error"] = cu.why if cu.rt is None else None
            env["artifact_code"] = self.device_code(self.check_of("main"), env["capability"])
        env["mapped_libraries"] = mapped_libraries()
        self.ctx.results["environment"] = env
        return {"python": env["python"], "numpy": env["modules"]["numpy"].split()[0],
                "capability": env.get("capability"), "driver_cuda": env.get("driver_cuda"),
                "runtime_cuda": env.get("runtime_cuda"), "free_GB": (env.get("memory") or {}).get("free_GB"),
                "code": (env.get("artifact_code") or {}).get("runs_as")}

    def device_code(self, check: dict, capability: str | None) -> dict:
        """SASS for this GPU, or PTX the driver must JIT-compile (at load_module), or neither."""
        from nextn.common.device_code import device_code

        art = self.path(check["artifact"])
        man = json.load(open(os.path.join(art, "manifest.json")))
        info = device_code(os.path.join(art, man["libraries"][0]["file"]))
        sm = int(capability[3:]) if capability else 0
        ptx = [a for a in info["cuda_ptx"] if int(a[3:].rstrip("a")) <= sm]
        runs = (f"SASS {capability}" if capability in info["cuda_sass"] else
                f"PTX JIT from {max(ptx)}" if ptx else f"no code for {capability}")
        return {"sass": info["cuda_sass"], "ptx": info["cuda_ptx"], "source": bool(info["cuda_source"]), "runs_as": runs}

    def s_plugin(self, _main) -> dict:
        if self.ctx.cuda is None:
            return {"plugin": "not needed on the cpu"}
        from nextn.common import cuda

        t0 = time.perf_counter()
        cuda.load_plugin()
        return {"s": time.perf_counter() - t0, "loaded": [os.path.basename(p) for p in mapped_libraries()]}

    def open_model(self, check: dict, ctx_size: int):
        """A LoadedModel of `check` whose load steps have not run yet."""
        from nextn.runtime.artifact import load_artifact
        from nextn.runtime.model import LoadedModel

        return LoadedModel(load_artifact(self.path(check["artifact"])), ctx_size, True,
                           model_path=self.path(check.get("model")), device=self.a.device, staged=True)

    def s_open(self, main) -> dict:
        lm = self.loaded = self.open_model(main, self.a.ctx)
        return {"artifact": main["artifact"], "target": lm.artifact.manifest["target"]["name"],
                "arches": ",".join(lm.artifact.manifest["target"].get("arches", [])),
                "cuda_graph": bool(lm.artifact.manifest.get("cuda_graph")), "n_ctx": lm.n_ctx}

    def s_load_module(self, _main):
        self.loaded.load_module()
        return dict(self.loaded.load_info["load_module"])

    def s_vm_init(self, _main):
        self.loaded.vm_init()
        return dict(self.loaded.load_info["vm_init"])

    def s_weights(self, _main):
        self.loaded.load_weights()
        r = dict(self.loaded.load_info["weights"])
        r["GBps"] = r["bytes"] / r["s"] / GB if r["s"] > 0 else None
        return r

    def s_kv(self, _main):
        self.seq = self.loaded.new_sequence()
        return dict(self.loaded.load_info["kv"])

    def s_prefill(self, main) -> dict:
        from nextn.runtime.api import Model

        seq = self.seq
        want = self.want_of(main, ["code-short"])["code-short"]
        ids = np.asarray(want["prompt_ids"], np.int32)
        seq.prefill(ids, 0)                                   # first call: launches, allocator warm-up
        t0 = time.perf_counter()
        _h, last, am = seq.prefill(ids, 0)
        s = time.perf_counter() - t0
        e = rel_err(last, want["last_logits"])
        self.model = Model(self.loaded, seq)
        # reported, not asserted: the reference stage judges the numbers; the stages after this one need a prefill
        # that runs, not one that matches
        return {"tokens": len(ids), "ms": s * 1e3, "rel_err": e, "argmax": am,
                "matches_reference": bool(e < tolerance(main) and am == want["argmax"])}

    def s_decode_graphs(self, main) -> dict:
        """Greedy decode from cell BUCKET_PROMPT for BUCKET_STEPS steps with the no-graph artifact, then with the
        graph one (one-row `decode` replayed as CUDA graphs, L rounded up to 256-cell buckets), bit for bit; then
        the few-row steps the graph artifact also replays (one graph per row count): a verify of k+1 rows and a
        draft step 0 with a gap of k rows (mtp_draft, its last row's head) for each k+1 in SPEC_VERIFY_ROWS, on
        the greedy tokens, at the cells after the decode steps."""
        graph = self.seq
        ng = self.check_of("nograph") if any(c.get("role") == "nograph" for c in self.plan["checks"]) else main
        nograph = self.open_model(ng, self.a.ctx).load().new_sequence()
        long = next(p for p in json.load(open(os.path.join(self.path(main["reference"]), "reference.json")))["prompts"]
                    if len(p["prompt_ids"]) >= BUCKET_PROMPT)
        ids = np.asarray(long["prompt_ids"][:BUCKET_PROMPT], np.int32)
        runs, few = [], []
        for seq in (nograph, graph):
            _h, _last, tok = seq.prefill(ids, 0)
            rows, first = [], tok
            for i in range(BUCKET_STEPS):
                h, lg, am = seq.verify([tok], BUCKET_PROMPT + i)
                rows.append((np.array(h), lg.numpy().copy(), int(am[0])))
                tok = int(am[0])
            runs.append(rows)
            toks, hs = [first] + [r[2] for r in rows], [r[0] for r in rows]   # the greedy chain and its hidden rows
            steps, p = [], BUCKET_PROMPT + BUCKET_STEPS
            for k1 in SPEC_VERIFY_ROWS:   # the few-row entries (graphs per row count on the graph artifact)
                h, lg, am = seq.verify(toks[-k1:], p)
                steps.append((f"verify {k1} rows", np.array(h), lg.numpy().copy(), np.array(am)))
                if seq.model.has_mtp:
                    h, lg, am = seq.mtp_draft(toks[-k1:], np.concatenate(hs[-k1:]), p, out_ids=[k1 - 1])
                    steps.append((f"mtp_draft {k1} rows", np.array(h), lg.numpy().copy(), np.array(am)))
            few.append(steps)
        del nograph
        L = [graph.n_kv(BUCKET_PROMPT + i + 1) for i in range(BUCKET_STEPS)]
        diff = [i for i, (a, b) in enumerate(zip(*runs))
                if a[2] != b[2] or a[0].tobytes() != b[0].tobytes() or a[1].tobytes() != b[1].tobytes()]
        few_diff = [a[0] for a, b in zip(*few) if any(x.tobytes() != y.tobytes() for x, y in zip(a[1:], b[1:]))]
        res = {"graph_artifact": main["artifact"], "nograph_artifact": ng["artifact"], "steps": BUCKET_STEPS,
               "L": sorted(set(L)), "ids": [r[2] for r in runs[1]], "few_row_steps": [s[0] for s in few[1]],
               "bit_exact": not diff and not few_diff}
        if diff:
            i = diff[0]
            raise AssertionError(f"decode with CUDA graphs differs from decode without at step {i} (cell "
                                 f"{BUCKET_PROMPT + i}, L {L[i]}): ids {runs[0][i][2]} vs {runs[1][i][2]}, logits "
                                 f"rel_err {rel_err(runs[1][i][1], runs[0][i][1]):.2e}")
        if few_diff:
            raise AssertionError(f"with CUDA graphs, {', '.join(few_diff)} at cell {BUCKET_PROMPT + BUCKET_STEPS} "
                                 f"differ from the same calls without")
        return res

    def s_entry_timings(self, main) -> dict:
        reps = 3 if self.a.quick else 20
        rows = entry_timings(self.seq, reps)
        self.ctx.results["entry_timings"] = rows
        for r in rows:
            if "error" in r:
                print(f"    {r['entry']:18s} FAIL {r['error']}", flush=True)
                continue
            print(f"    {r['entry']:18s} rows {r['rows']:4d}  {r['median_ms']:9.3f} ms (min {r['min_ms']:.3f}, "
                  f"wall {r['wall_median_ms']:.3f})", flush=True)
        return {r["entry"] + "_ms": r["median_ms"] for r in rows if "error" not in r}

    # -- references and speed ------------------------------------------------------------------------------------
    def reference(self, c: dict) -> dict:
        from nextn.runtime.api import Model

        if c.get("role") == "main" and "prefill" in self.ctx.ok:
            m = self.model
        else:
            m = Model(self.open_model(c, self.a.ctx).load())
        want = self.want_of(c, self.kinds)
        got = model_outputs(m, want, rows=True)
        tol = tolerance(c)
        checks = compare(got, want, exact_acceptance=True, tol=tol)
        self.ctx.results.setdefault("references", {})[c["name"]] = checks
        bad = [x for x in checks if not x["ok"]]
        for x in bad[:10]:
            print(f"    FAIL {x['check']} {x['detail']}", flush=True)
        undecided = [x for x in checks if x.get("undecided")]
        for x in undecided[:5]:
            print(f"    near-tie {x['check']} {x['detail']}", flush=True)
        if bad:
            raise AssertionError(f"{len(bad)} of {len(checks)} checks differ (first: {bad[0]['check']} {bad[0]['detail']})")
        return {"checks": len(checks), "prompts": len(want), "tol": tol, "undecided": len(undecided),
                "against": c.get("against") or ("cpu run" if c.get("expect") else "fixture reference")}

    def s_int8_kernels(self, _main) -> dict:
        """The integer-route GPU kernels alone (bench/int8_cases.py): per format and row count, the activation rows
        quantized on the device (and their sums of 16 quants) equal the CPU's bit for bit, and the GEMV's product the
        x86 kernel's within
        GPU_TOL (the same float rows in, so only the float32 summation order differs)."""
        import tvm

        spec = self.plan["int8_kernels"]
        base = self.path(spec["dir"])
        lib = tvm.runtime.load_module(os.path.join(base, spec["library"]))
        data = np.load(os.path.join(base, spec["cases"]))
        kind, _, idx = self.a.device.partition(":")
        dev = tvm.runtime.device(kind, int(idx or 0))
        res, bad = {}, []
        for t in spec["types"]:
            w = [tvm.runtime.tensor(data[f"{t}/w{i}"], dev) for i in range(8) if f"{t}/w{i}" in data.files]
            for T in spec["rows"]:
                x, want_q, want_d, want_s, want_y = (data[f"{t}/{T}/{f}"] for f in ("x", "xq", "xd", "xs", "y"))
                xq = tvm.runtime.empty(want_q.shape, "int32", dev)
                xd = tvm.runtime.empty(want_d.shape, "float32", dev)
                xs = tvm.runtime.empty(want_s.shape, "int32", dev)
                y = tvm.runtime.empty(want_y.shape, "float32", dev)
                lib[f"quantize_{t}"](tvm.runtime.tensor(x, dev), xq, xd, xs)
                lib[f"mul_mat_{t}"](xq, xd, xs, *w, y)
                rows_same = bool(np.array_equal(xq.numpy(), want_q) and np.array_equal(xs.numpy(), want_s) and
                                 np.array_equal(xd.numpy().view(np.uint32), want_d.view(np.uint32)))
                e = rel_err(y.numpy(), want_y)
                res[f"{t} T={T}"] = {"rows_bit_exact": rows_same, "rel_err": e}
                print(f"    {t:5s} T={T}  int8 rows {'equal' if rows_same else 'DIFFER'}  product rel_err {e:.2e}",
                      flush=True)
                if not rows_same or not e < GPU_TOL:
                    bad.append(f"{t} T={T}")
        self.ctx.results["int8_kernels"] = res
        if bad:
            raise AssertionError(f"the integer kernels differ from the CPU's (tol {GPU_TOL}): {', '.join(bad)}")
        return {"cases": len(res), "worst_rel_err": max(r["rel_err"] for r in res.values()), "tol": GPU_TOL}

    def want_of(self, c: dict, kinds) -> dict:
        """What check `c` must reproduce: its recorded CPU expectations, else the fixture's references."""
        expect = self.path(c.get("expect"))
        return expect_want(expect, kinds) if expect else fixture_want(self.path(c["reference"]), kinds)

    def s_speed(self, main) -> dict:
        """Decode tok/s per config on the main model: best of R runs; fraction of the copy-bandwidth floor."""
        m = self.model
        lm = m.loaded
        want = fixture_want(self.path(main["reference"]), ["code-module"])["code-module"]
        ids = want["prompt_ids"]
        n, reps = (16, 1) if self.a.quick else (self.a.n, 3)
        from nextn.common.measure import copy_bandwidth

        bw = copy_bandwidth(lm.dev, (64 << 20) if lm.device.kind == "cpu" else (1 << 30))
        per_token = step_bytes(lm.artifact.manifest, "decode")
        floor_tps = bw / per_token
        rows = speed_configs(m, ids, n, reps)
        for r in rows:
            r["of_floor"] = r["tok_s"] / floor_tps
        off = rows[0]["tok_s"]
        spec_rows = [r for r in rows[1:]]
        res = {"prompt": "code-module", "n": n, "best_of": reps, "copy_GBps": bw / GB, "bytes_per_token": per_token,
               "floor_tok_s": floor_tps, "off_tok_s": off,
               "mtp_speedup": max(r["tok_s"] for r in spec_rows) / off if spec_rows and off else None,
               "auto_speedup": next((r["tok_s"] / off for r in spec_rows if r["config"] == "auto"), None)}
        self.ctx.results["speed"] = res | {"rows": rows}
        if not all(r["same_as_off"] for r in rows):
            raise AssertionError("a speculative config produced other tokens than spec off: "
                                 + ", ".join(r["config"] for r in rows if not r["same_as_off"]))
        return res

    # -- real width ----------------------------------------------------------------------------------------------
    def s_realwidth(self, _main) -> dict:
        seq, res = self.realwidth_sequence(self.plan["realwidth"])
        lm = seq.model
        man = lm.artifact.manifest
        from nextn.common.measure import copy_bandwidth

        bw = copy_bandwidth(lm.dev, (256 << 20) if lm.device.kind == "cpu" else (1 << 30), reps=5)
        res["copy_GBps"] = bw / GB
        reps = 3 if self.a.quick else 20
        rows = entry_timings(seq, reps, prompt=64, k=3)
        for r in rows:
            if r["entry"] in ("decode", "verify", "draft", "draft_vocab") and "error" not in r:
                b = step_bytes(man, r["entry"])
                r["floor_ms"] = b / bw * 1e3
                r["of_floor"] = r["floor_ms"] / r["median_ms"]
                r["weight_bytes"] = b
        self.ctx.results["realwidth"] = res | {"rows": rows}
        for r in rows:
            if "error" in r:
                print(f"    {r['entry']:18s} FAIL {r['error']}", flush=True)
                continue
            fl = f"  floor {r['floor_ms']:.3f} ms = {r['of_floor']:.3f} of it" if "floor_ms" in r else ""
            print(f"    {r['entry']:18s} rows {r['rows']:4d}  {r['median_ms']:9.3f} ms{fl}", flush=True)
        return res | {r["entry"] + "_of_floor": r["of_floor"] for r in rows if "of_floor" in r}

    def realwidth_spec(self, rw: dict) -> dict:
        """A predictable real-width file (synth_realwidth.py --mtp-mix: the NextN head agrees with the trunk often
        enough for speculation to pay where the kernels allow it): decode, verify of 2 / 3 / 4 rows and a draft step
        (with the full head, and with the reduced one where the artifact has it: `draft_vocab`) as fractions of the
        HBM floor (weight bytes the step reads ÷ copy bandwidth, and in decodes), then greedy
        decode tok/s of spec off, n_max 1..3 and auto with their acceptance, best of R (tokens equal to spec off)."""
        from nextn.common.measure import copy_bandwidth
        from nextn.runtime.api import Model
        from nextn.runtime.depth import spread_tokens

        seq, res = self.realwidth_sequence(rw)
        lm = seq.model
        man = lm.artifact.manifest
        bw = copy_bandwidth(lm.dev, (256 << 20) if lm.device.kind == "cpu" else (1 << 30), reps=5)
        res["copy_GBps"] = bw / GB
        reps = 3 if self.a.quick else 20
        V = int(lm.hparams["n_vocab"])
        ids = np.arange(7, 7 + 64, dtype=np.int32) % V
        h, _last, tok = seq.prefill(ids, 0)
        steps = [("decode", 1, lambda: seq.verify(np.array([tok], np.int32), 64))]
        steps += [("verify", k1, lambda k1=k1: seq.verify(np.asarray(spread_tokens(k1, V), np.int32), 64))
                  for k1 in SPEC_VERIFY_ROWS]
        if lm.has_mtp:
            steps += [(name, 1, call) for name, call in draft_steps(seq, tok, h[-1:], 64)]
        rows = []   # (an OPTIONAL row that failed is printed and left out)
        for entry, n_rows, call in steps:
            r = timed_entry(seq, entry, call, reps) | {"rows": n_rows}
            if "error" in r:
                print(f"    {entry:8s} FAIL {r['error']}", flush=True)
                continue
            r["floor_ms"] = step_bytes(man, entry) / bw * 1e3
            r["of_floor"] = r["floor_ms"] / r["median_ms"]
            # kernels its graph replays (manifest cuda_graph.launches; None for an older artifact): the time above
            # the floor over them is what a launch costs, when the big kernels run near the floor
            # (one row: its static entry's graph)
            r["kernels"] = ((man.get("cuda_graph") or {}).get("launches") or {}).get(entry)
            rows.append(r)
        decode_ms = rows[0]["median_ms"]
        for r in rows:
            r["decodes"] = r["median_ms"] / decode_ms
            k = "" if r["kernels"] is None else f", {r['kernels']} kernels in its graph"
            print(f"    {r['entry']:8s} rows {r['rows']}  {r['median_ms']:9.3f} ms  = {r['decodes']:.2f} decodes, "
                  f"{r['of_floor']:.3f} of the floor ({r['floor_ms']:.3f} ms){k}", flush=True)
        m = Model(lm, seq)
        n, best_of = (16, 1) if self.a.quick else (rw.get("n_predict", 128), 2)
        with full_head(lm):   # the first H200 run's configuration; acceptance of the full head (see draft_steps)
            speed = speed_configs(m, SPEC_PROMPT, n, best_of)
        for x in speed:
            x["x_off"] = x["tok_s"] / speed[0]["tok_s"]
            a = x["acceptance"]
            print(f"    {x['config']:8s} {x['tok_s']:9.1f} tok/s  {x['x_off']:.2f}x off"
                  f"{'' if a is None else f'  acceptance {a:.2f}'}", flush=True)
        self.ctx.results.setdefault("realwidth_spec", {})[rw["name"]] = res | {"rows": rows, "speed": speed, "n": n,
                                                                               "best_of": best_of}
        if not all(x["same_as_off"] for x in speed):
            raise AssertionError("a speculative config produced other tokens than spec off: "
                                 + ", ".join(x["config"] for x in speed if not x["same_as_off"]))
        return res | {f"{r['entry']}{r['rows'] if r['entry'] == 'verify' else ''}_of_floor": r["of_floor"]
                      for r in rows} | {f"{x['config']}_x_off": x["x_off"] for x in speed[1:]}

    def realwidth_sequence(self, rw: dict):
        """(a sequence of a loaded model, facts) of a real-width plan slice: its GGUF generated here when the slice has a
        recipe (`synth` + `args`), checked against the sha256 the artifact was compiled from, or the given model."""
        from nextn.common.hashing import sha256_file   # the generated bytes must be the artifact's
        from nextn.runtime.artifact import load_artifact
        from nextn.runtime.model import LoadedModel

        res = {}
        if rw.get("synth"):    # generate the GGUF here (deterministic: the bytes the artifact was compiled from)
            d = self.a.realwidth_dir
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, rw["file"])
            if not (os.path.isfile(path) and os.path.getsize(path) == rw["size"]):
                t0 = time.perf_counter()
                import gguf

                # the generator runs in a child interpreter: give it the gguf and numpy this one imports (the bundle's)
                paths = {os.path.dirname(os.path.dirname(m.__file__)) for m in (gguf, np)}
                env = dict(os.environ, FIXTURES=self.path(rw["fixtures"]), PYTHONPATH=os.pathsep.join(sorted(paths)))
                args = rw.get("args") or [str(rw["n_moe"])]   # N MoE layers [--mtp-mix ALPHA]
                r = subprocess.run([sys.executable, self.path(rw["synth"]), rw["preset"], path + ".tmp", *args],
                                   env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(f"synth_realwidth.py failed: {(r.stderr or r.stdout).strip()[-400:]}")
                os.replace(path + ".tmp", path)
                res["generate_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            sha = sha256_file(path)
            res["sha256_s"] = time.perf_counter() - t0
            if sha != rw["sha256"]:
                raise AssertionError(f"{path}: sha256 {sha[:16]}… is not the {rw['sha256'][:16]}… the artifact was "
                                     f"compiled from (synth_realwidth.py not deterministic here?)")
        else:
            path = self.path(rw["model"])
        res["gguf_GB"] = os.path.getsize(path) / GB
        t0 = time.perf_counter()
        lm = LoadedModel(load_artifact(self.path(rw["artifact"])), rw.get("ctx", 4096), True, model_path=path,
                         device=self.a.device)
        seq = lm.new_sequence()
        res["load_s"] = time.perf_counter() - t0
        res["upload_GBps"] = lm.load_info["weights"]["bytes"] / lm.load_info["weights"]["s"] / GB
        return seq, res

    # -- the table -----------------------------------------------------------------------------------------------
    def print_table(self):
        r = self.ctx.results
        env = r.get("environment", {})
        print()
        gpu = (env.get("nvidia_smi") or "").splitlines()[-1] if env.get("nvidia_smi") else env.get("cpu", "?")
        print(f"device {self.a.device}: {gpu}")
        if env.get("capability"):
            print(f"  {env['capability']}, driver CUDA {env.get('driver_cuda')}, runtime CUDA {env.get('runtime_cuda')}, "
                  f"code {(env.get('artifact_code') or {}).get('runs_as')}")
        print(f"{'stage':34s} {'status':6s} {'s':>8s}")
        for s in r["stages"]:
            print(f"{s['stage']:34s} {s['status']:6s} {s['s']:8.2f}  {s.get('error', '').splitlines()[0][:80] if s.get('error') else ''}")
        sp = r.get("speed")
        if sp:
            print(f"\nspeed ({sp['prompt']}, {sp['n']} tokens, best of {sp['best_of']}): copy {sp['copy_GBps']:.1f} GB/s, "
                  f"{sp['bytes_per_token'] / 1e6:.2f} MB/token -> floor {sp['floor_tok_s']:.0f} tok/s")
            print(f"{'config':10s} {'tok/s':>10s} {'of floor':>9s} {'accept':>7s} {'x off':>6s}")
            for row in sp["rows"]:
                acc = f"{row['acceptance']:.3f}" if row["acceptance"] is not None else "-"
                print(f"{row['config']:10s} {row['tok_s']:10.1f} {row['of_floor']:9.3f} {acc:>7s} "
                      f"{row['tok_s'] / sp['off_tok_s']:6.2f}")
            if sp.get("mtp_speedup"):
                print(f"MTP speedup (best fixed or auto over spec off): {sp['mtp_speedup']:.2f}x")
        rw = r.get("realwidth")
        if rw:
            print(f"\nreal width ({self.plan['realwidth'].get('preset', 'file')}): copy {rw['copy_GBps']:.1f} GB/s, "
                  f"upload {rw['upload_GBps']:.2f} GB/s")
            for row in rw["rows"]:
                if "floor_ms" in row:
                    print(f"  {row['entry']:8s} rows {row['rows']:3d} {row['median_ms']:9.3f} ms  floor "
                          f"{row['floor_ms']:8.3f} ms  {row['of_floor']:.3f} of the floor (weight bytes / copy bandwidth)")
        bad = [s["stage"] for s in r["stages"] if s["status"] != "ok"]
        print(f"\n{len(r['stages']) - len(bad)}/{len(r['stages'])} stages ok" + (f"; not ok: {', '.join(bad)}" if bad else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default=None, help="plan JSON [default: bundle.json beside this script]")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", default=os.environ.get("OUT") or "device_check_out")
    ap.add_argument("-c", "--ctx", type=int, default=4096, help="KV cells of the engines")
    ap.add_argument("-n", type=int, default=64, help="tokens per speed run")
    ap.add_argument("--quick", action="store_true", help="two prompts, short speed runs (CI's CPU mode)")
    ap.add_argument("--prompts", default=None, help="comma list of prompt kinds for the reference stages")
    ap.add_argument("--only", default=None, help="comma list of stages to run (with what they need)")
    ap.add_argument("--realwidth-dir", default=realwidth_dir(),
                    help="where the real-width GGUF is generated [$NEXTN_REALWIDTH, default ~/.cache/nextn-realwidth]")
    a = ap.parse_args(argv)
    plan_path = a.plan or os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundle.json")
    with open(plan_path) as f:
        plan = json.load(f)
    return DeviceCheck(plan, os.path.dirname(os.path.abspath(plan_path)), a).run()


if __name__ == "__main__":
    sys.exit(main())
