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
import ctypes
import json
import os
import platform
import subprocess
import sys
import time
import traceback

import numpy as np

GB = 1e9
FULL_ROW_KINDS = ("code-short", "docs-heading")   # prompts whose every row has reference logits
QUICK_KINDS = ("code-short", "repetitive")
N_MAX = (1, 2, 3)
BUCKET_PROMPT = 250          # decode from cell 250 over the 256-cell bucket boundary
BUCKET_STEPS = 12
LOGIT_TOL = 1e-4             # the fixtures' tolerance: max |Δ| / max |ref| per row
# Quantized models against their float-activation CPU run (`--exact-matmul` llvm artifact, recorded by bench/bundle.py):
# the same computation, float32, only the summation order (and the GPU's exp) differ. bench/exact_tolerance.py
# measures that spread on this CPU as the exact-matmul artifact against the numpy IR interpreter on gguf-py-dequantized
# weights: at most 6.1e-7 over the bundle's quantized models and their prompts (docs/gpu.md); 1e-5 leaves a factor 16,
# and stays 350x below what int8-quantized activations change (3.6e-3 to 9.2e-2 here; 3.6e-3 to 2.4e-2 on the H200).
GPU_TOL = 1e-5
SPEED_CONFIGS = [("off", "none", 1), ("n_max=1", "draft-mtp", 1), ("n_max=2", "draft-mtp", 2),
                 ("n_max=3", "draft-mtp", 3), ("auto", "draft-mtp", "auto")]
# The stages each stage needs (a reference stage opens its own engine: it needs the plugin only).
NEEDS = {"open": ["plugin"], "load_module": ["open"], "vm_init": ["load_module"], "weights": ["vm_init"],
         "kv": ["weights"], "prefill": ["kv"], "decode_graphs": ["prefill"], "entry_timings": ["prefill"],
         "speed": ["prefill"], "realwidth": ["plugin"]}


SPEC_PROMPT = "Hello"        # the predictable real-width files' prompt (issue 33's H200 table used it)
SPEC_VERIFY_ROWS = (2, 3, 4)  # verify of k+1 rows for n_max k = 1..3


def needs(stage: str) -> list[str]:
    return ["plugin"] if stage.startswith(("reference ", "realwidth ")) else NEEDS.get(stage, [])


# -- CUDA through ctypes: versions, errors, memory (the runtime library TVM's plugin uses) ------------------------
class CudaRT:
    """libcudart / libcuda entry points used for diagnosis; every method answers even when CUDA is absent."""

    def __init__(self):
        self.rt = self.drv = None
        self.why = ""
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                self.rt = ctypes.CDLL(name)
                break
            except OSError as e:
                self.why = str(e)
        if self.rt is not None:
            self.rt.cudaGetErrorName.restype = ctypes.c_char_p
        try:
            self.drv = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            self.why = self.why or str(e)

    @staticmethod
    def _version(lib, fn):
        """cuDriverGetVersion / cudaRuntimeGetVersion(int *version)."""
        v = ctypes.c_int()
        return v.value if lib is not None and getattr(lib, fn)(ctypes.byref(v)) == 0 else None

    @staticmethod
    def _ver(v):
        return None if v is None else f"{v // 1000}.{v % 1000 // 10}"

    def last_error(self) -> str | None:
        if self.rt is None:
            return None
        e = int(self.rt.cudaGetLastError())
        return f"{self.rt.cudaGetErrorName(e).decode()} ({e})"

    def versions(self) -> dict:
        return {"driver_cuda": self._ver(self._version(self.drv, "cuDriverGetVersion")),
                "runtime_cuda": self._ver(self._version(self.rt, "cudaRuntimeGetVersion"))}

    def capability(self, dev: int = 0) -> str | None:
        """sm_XY from cudaDeviceGetAttribute(int *value, attr, device): 75 = major, 76 = minor."""
        if self.rt is None:
            return None
        major, minor = ctypes.c_int(), ctypes.c_int()
        if (self.rt.cudaDeviceGetAttribute(ctypes.byref(major), 75, dev) != 0
                or self.rt.cudaDeviceGetAttribute(ctypes.byref(minor), 76, dev) != 0):
            return None
        return f"sm_{major.value}{minor.value}"

    def mem_info(self) -> dict | None:
        if self.rt is None:
            return None
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if self.rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
            return None
        return {"free_GB": free.value / GB, "total_GB": total.value / GB}


def mapped_libraries(words=("libcuda", "libcudart", "libtvm", "libnvrtc", "ptxjitcompiler", "libnvidia")) -> list:
    """Shared libraries of this process whose file name holds one of `words` (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split(None, 5)[5].strip() for ln in f if len(ln.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if any(w in os.path.basename(p) for w in words))


def nvidia_smi() -> str:
    try:
        r = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,"
                            "clocks.mem,temperature.gpu,power.draw", "--format=csv"],
                           capture_output=True, text=True, timeout=30)
        return (r.stdout + r.stderr + q.stdout + q.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi: {e}"


# -- the stage runner ------------------------------------------------------------------------------------------------
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


# -- measuring -------------------------------------------------------------------------------------------------------
def rel_err(got, want) -> float:
    from nextn.common.compare import rel_err as _rel_err

    return _rel_err(got, want)


def step_bytes(manifest: dict, entry: str) -> int:
    """Weight bytes one row of `entry` must read (`nextn.common.manifest.step_read_bytes`)."""
    from nextn.common.manifest import step_read_bytes

    return int(step_read_bytes(manifest, entry)["total"])


def timed_entry(seq, name: str, call, reps: int) -> dict:
    """Median and min of `reps` calls of `call()`: device time inside entry `name` (the sequence synchronizes the
    device after each call) and wall time of the whole call (inputs, readback)."""
    call()                                       # warm-up: first launch, graph capture
    vm, wall = [], []
    for _ in range(reps):
        v0, t0 = seq.vm_seconds[name], time.perf_counter()
        call()
        wall.append(time.perf_counter() - t0)
        vm.append(seq.vm_seconds[name] - v0)
    return {"entry": name, "reps": reps, "median_ms": float(np.median(vm) * 1e3), "min_ms": float(min(vm) * 1e3),
            "wall_median_ms": float(np.median(wall) * 1e3)}


# -- references --------------------------------------------------------------------------------------------------
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
                fn = lambda f=getattr(self, "s_" + name): f(main)   # noqa: E731
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
        graph one (one-row `decode` replayed as CUDA graphs, L rounded up to 256-cell buckets), bit for bit."""
        graph = self.seq
        ng = self.check_of("nograph") if any(c.get("role") == "nograph" for c in self.plan["checks"]) else main
        nograph = self.open_model(ng, self.a.ctx).load().new_sequence()
        long = next(p for p in json.load(open(os.path.join(self.path(main["reference"]), "reference.json")))["prompts"]
                    if len(p["prompt_ids"]) >= BUCKET_PROMPT)
        ids = np.asarray(long["prompt_ids"][:BUCKET_PROMPT], np.int32)
        runs = []
        for seq in (nograph, graph):
            _h, _last, tok = seq.prefill(ids, 0)
            rows = []
            for i in range(BUCKET_STEPS):
                h, lg, am = seq.verify([tok], BUCKET_PROMPT + i)
                rows.append((np.array(h), lg.numpy().copy(), int(am[0])))
                tok = int(am[0])
            runs.append(rows)
        del nograph
        L = [graph.n_kv(BUCKET_PROMPT + i + 1) for i in range(BUCKET_STEPS)]
        diff = [i for i, (a, b) in enumerate(zip(*runs))
                if a[2] != b[2] or a[0].tobytes() != b[0].tobytes() or a[1].tobytes() != b[1].tobytes()]
        res = {"graph_artifact": main["artifact"], "nograph_artifact": ng["artifact"], "steps": BUCKET_STEPS,
               "L": sorted(set(L)), "ids": [r[2] for r in runs[1]], "bit_exact": not diff}
        if diff:
            i = diff[0]
            raise AssertionError(f"decode with CUDA graphs differs from decode without at step {i} (cell "
                                 f"{BUCKET_PROMPT + i}, L {L[i]}): ids {runs[0][i][2]} vs {runs[1][i][2]}, logits "
                                 f"rel_err {rel_err(runs[1][i][1], runs[0][i][1]):.2e}")
        return res

    def s_entry_timings(self, main) -> dict:
        reps = 3 if self.a.quick else 20
        rows = entry_timings(self.seq, reps)
        self.ctx.results["entry_timings"] = rows
        for r in rows:
            print(f"    {r['entry']:18s} rows {r['rows']:4d}  {r['median_ms']:9.3f} ms (min {r['min_ms']:.3f}, "
                  f"wall {r['wall_median_ms']:.3f})", flush=True)
        return {r["entry"] + "_ms": r["median_ms"] for r in rows}

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
            if r["entry"] in ("decode", "verify", "draft"):
                b = step_bytes(man, r["entry"])
                r["floor_ms"] = b / bw * 1e3
                r["of_floor"] = r["floor_ms"] / r["median_ms"]
                r["weight_bytes"] = b
        self.ctx.results["realwidth"] = res | {"rows": rows}
        for r in rows:
            fl = f"  floor {r['floor_ms']:.3f} ms = {r['of_floor']:.3f} of it" if "floor_ms" in r else ""
            print(f"    {r['entry']:18s} rows {r['rows']:4d}  {r['median_ms']:9.3f} ms{fl}", flush=True)
        return res | {r["entry"] + "_of_floor": r["of_floor"] for r in rows if "of_floor" in r}

    def realwidth_spec(self, rw: dict) -> dict:
        """A predictable real-width file (synth_realwidth.py --mtp-mix: the NextN head agrees with the trunk often
        enough for speculation to pay where the kernels allow it): decode, verify of 2 / 3 / 4 rows and a draft step
        as fractions of the HBM floor (weight bytes the step reads ÷ copy bandwidth, and in decodes), then greedy
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
            steps.append(("draft", 1, lambda: seq.mtp_draft(np.array([tok], np.int32), h[-1:], 64)))
        rows = []
        for entry, n_rows, call in steps:
            r = timed_entry(seq, entry, call, reps) | {"rows": n_rows}
            r["floor_ms"] = step_bytes(man, entry) / bw * 1e3
            r["of_floor"] = r["floor_ms"] / r["median_ms"]
            rows.append(r)
        decode_ms = rows[0]["median_ms"]
        for r in rows:
            r["decodes"] = r["median_ms"] / decode_ms
            print(f"    {r['entry']:8s} rows {r['rows']}  {r['median_ms']:9.3f} ms  = {r['decodes']:.2f} decodes, "
                  f"{r['of_floor']:.3f} of the floor ({r['floor_ms']:.3f} ms)", flush=True)
        m = Model(lm, seq)
        n, best_of = (16, 1) if self.a.quick else (rw.get("n_predict", 128), 2)
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


def speed_configs(m, prompt, n: int, reps: int) -> list[dict]:
    """Greedy decode of `n` tokens after `prompt` (text or ids) per SPEED_CONFIGS (spec off first), best of `reps`
    after a warm-up (which also calibrates auto): tok/s, acceptance, mean length, whether the tokens equal off's."""
    rows, plain = [], None
    for label, spec, k in SPEED_CONFIGS:
        if spec != "none" and not m.has_mtp:
            continue
        m.generate(prompt, 8, spec_type=spec, n_max=k, ignore_eos=True)
        best = max((m.generate(prompt, n, spec_type=spec, n_max=k, ignore_eos=True) for _ in range(reps)),
                   key=lambda r: r.tokens_per_s)
        plain = plain or best
        rows.append({"config": label, "tok_s": best.tokens_per_s,
                     "acceptance": best.stats.acceptance if spec != "none" else None,
                     "mean_len": best.stats.mean_len if spec != "none" else None,
                     "same_as_off": best.ids == plain.ids, "vm_s": best.vm_s})
    return rows


def entry_timings(seq, reps: int, prompt: int = 64, k: int = 3) -> list[dict]:
    """Synced per-entry timings: prefill of `prompt` rows, verify of k+1 rows, decode (one row), NextN rows for the
    prompt, one draft step. Token ids are in-vocabulary values (timing only); the verify rows are distinct tokens
    (`runtime.depth.spread_tokens`: copies of one token route to the same experts and under-price a verify)."""
    from nextn.runtime.depth import spread_tokens

    V = int(seq.model.hparams["n_vocab"])
    ids = np.arange(7, 7 + prompt, dtype=np.int32) % V
    h, _last, tok = seq.prefill(ids, 0)
    rows_k1 = np.asarray(spread_tokens(k + 1, V), np.int32)
    rows = [timed_entry(seq, "prefill", lambda: seq.prefill(ids, 0), reps) | {"rows": prompt},
            timed_entry(seq, "verify", lambda: seq.verify(rows_k1, prompt), reps) | {"rows": k + 1},
            timed_entry(seq, "decode", lambda: seq.verify(np.array([tok], np.int32), prompt), reps) | {"rows": 1}]
    if seq.model.has_mtp:
        hp = np.concatenate([np.zeros_like(h[:1]), h[:-1]])
        rows.append(timed_entry(seq, "mtp_rows", lambda: seq.mtp_rows(ids, hp, 0), reps) | {"rows": prompt})
        rows.append(timed_entry(seq, "draft", lambda: seq.mtp_draft(np.array([tok], np.int32), h[-1:], prompt), reps)
                    | {"rows": 1})
    return rows


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
    ap.add_argument("--realwidth-dir", default=os.environ.get("NEXTN_REALWIDTH_DIR", "/tmp/nextn-realwidth"),
                    help="where the real-width GGUF is generated")
    a = ap.parse_args(argv)
    plan_path = a.plan or os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundle.json")
    with open(plan_path) as f:
        plan = json.load(f)
    return DeviceCheck(plan, os.path.dirname(os.path.abspath(plan_path)), a).run()


if __name__ == "__main__":
    sys.exit(main())
