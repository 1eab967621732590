"""Build, here, the runtime bundle a GPU machine runs the device check from (`bash bench/make_gpu_bundle.sh`).

    python bench/bundle.py [-o bench/gpu_bundle] [--host h200|here] [--arch sm_90] [--checks NAME,...]
                           [--realwidth glm45air-1-a0.1|none] [--realwidth-spec NAME,...|none] [--no-tar]

A bundle is a directory (and, for a GPU machine, its `.tar.xz`, the one file the device run carries):

    bundle.json   the plan: host (CPython version + ABI, machine, oldest glibc), what it carries and what it needs
                  from the host, the checks (artifact, GGUF, references), the real-width slice
    run.py        launcher (bench/bundle_run.py): checks the host against bundle.json, then runs the device check
                  or the nextn CLI with the bundle's site/ first on sys.path
    device_*.py, realwidth_files.py   the device check (device_check.py) and the bench modules it imports
                  (BUNDLED_BENCH)
    site/         the TVM runtime without the compiler (no libtvm_compiler.so), tvm_ffi built for the host's
                  CPython, gguf-py, nextn.common + nextn.runtime only (no nextn.compiler: the runtime-only path),
                  and with --host here numpy, tokenizers, tqdm, yaml, click, typing_extensions too
    lib/          libcudart.so.13 (TVM's CUDA plugin needs it; preloaded by run.py)
    art/          artifacts compiled here: per check one (the BF16 one also without CUDA graphs), the real-width one
    models/       the fixture GGUFs (Q8_0 glm4moe is a link to the repository's artifacts/ copy: it travels anyway)
    refs/         the fixture references; for quantized GGUFs the outputs of their llvm artifact on this CPU
    tools/        synth_realwidth.py: the real-width GGUF is generated where it runs (same bytes: sha256 checked)

Hosts: `h200` is the lent GPU machine's image (CPython 3.12, x86_64; numpy, tokenizers, tqdm, PyYAML, click and
typing_extensions installed there, so the bundle needs them instead of carrying them); `here` is this interpreter
(the bundle carries everything: what CI's runtime-only test runs under `python -I -S`).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.environ.get("NEXTN_FIXTURES") or os.path.join(os.path.dirname(ROOT), "shared", "fixtures")
SYNTH = os.path.join(os.path.dirname(FIXTURES), "tools", "synth_realwidth.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from realwidth_files import FILES as REALWIDTH_FILES, realwidth_dir  # noqa: E402  (bench/realwidth_files.py makes them)

REALWIDTH_DIR = realwidth_dir()
LIMIT_MB = 64                 # what one device run may carry: bundle + the repository's tracked files (MiB)

# Import name -> distribution, for what the runtime imports beyond the standard library.
HOST_PACKAGES = {"numpy": "numpy>=1.26", "tokenizers": "tokenizers>=0.20", "tqdm": "tqdm>=4.60",
                 "yaml": "pyyaml>=5.1", "click": "click>=8.1", "typing_extensions": "typing_extensions>=4.13"}
# What `--host here` copies for them (top-level files / folders of site-packages).
COPY = {"numpy": ["numpy", "numpy.libs"], "tokenizers": ["tokenizers"], "tqdm": ["tqdm"], "yaml": ["yaml", "_yaml"],
        "click": ["click"], "typing_extensions": ["typing_extensions.py"]}
HOSTS = {
    # The GPU machine lent to this project (its KINDS.md page): its python3 is CPython 3.12.
    "h200": {"implementation": "cpython", "python": "3.12", "soabi": "cpython-312-x86_64-linux-gnu",
             "machine": "x86_64", "needs": dict(HOST_PACKAGES)},
}
TVM_TRIM = ["3rdparty", "include", "src", "web", "lib64", "lib/libtvm_compiler.so", "lib/libtvm_runtime_extra.so",
            # Python packages the runtime never imports (checked: sys.modules after a load and a generation), cut
            # for the 64 MiB carry limit: the model importers, TVM's own test / benchmark helpers, other backends
            "relax/frontend/onnx", "relax/frontend/torch", "relax/frontend/tflite", "relax/frontend/stablehlo",
            "relax/frontend/nn/llm", "topi/testing", "contrib/cutlass", "contrib/hexagon",
            "s_tir/meta_schedule/testing", "s_tir/dlight/benchmark", "relax/backend/contrib/example_npu"]
FFI_TRIM = ["3rdparty", "include", "src", "cython", "stub", "share", "cmake"]
TVM_FFI_PIN = "apache-tvm-ffi==0.1.14.post1"
# bench/ modules the bundle carries beside run.py: the device check and what it imports.
BUNDLED_BENCH = ["device_check.py", "device_cuda.py", "device_refs.py", "device_stages.py", "device_timing.py",
                 "realwidth_files.py"]

# name: (fixture dir, GGUF, how it is checked). "fixture": the fixture's references (BF16 weights, exact);
# "cpu": the `--exact-matmul` CUDA artifact (float activation rows) against the GGUF's outputs on this CPU from the
# `--exact-matmul` llvm artifact (tested against the IR interpreter), at device_refs.GPU_TOL with near-ties marked;
# and, where every integer-path format of the GGUF is on the CUDA integer route (`gpu_route`), check "NAME-int8": the
# default CUDA artifact (int8 activation rows, `__dp4a`) against the default llvm artifact's outputs at
# device_refs.INT8_TOL (an int8 step moved by an upstream rounding difference changes a row by ~1e-2: no model-level
# comparison of two int8 computations is tight; the integer kernels are checked alone by the `int8 kernels` stage).
CHECKS = {
    "glm4moe-BF16": ("tiny-glm4moe", "tiny-glm4moe-BF16.gguf", "fixture"),
    "glm4moe-Q8_0": ("tiny-glm4moe", "tiny-glm4moe-Q8_0.gguf", "cpu"),
    "glm4moe-Q4_K_M": ("tiny-glm4moe", "tiny-glm4moe-Q4_K_M.gguf", "cpu"),
    # glm-dsa as Q4_K_M rather than Q8_0 (2026-12-06): 5.7 MB less in the archive, which the 64 MiB carry limit
    # needed, and its Q5_0 / Q5_K tensors are model-level checks no other file gives; Q8_0 stays with glm4moe
    "glm-dsa-Q4_K_M": ("tiny-glm-dsa", "tiny-glm-dsa-Q4_K_M.gguf", "cpu"),
}
IN_REPO = {"tiny-glm4moe/tiny-glm4moe-Q8_0.gguf": "artifacts/tiny-glm4moe-Q8_0.gguf"}   # same bytes, tracked
# The `realwidth` stage's file: GLM-4.5-Air widths, 1 dense + 1 MoE layer. The predictable glm45air-1-a0.1 has the
# widths and types of glm45air-1 (same kernels: the stage measures the same), is the first speculation file too (one
# artifact and one generated file serve both) and is what the speculation benches make anyway.
REALWIDTH = "glm45air-1-a0.1"
# The predictable real-width files (synth_realwidth.py --mtp-mix 0.1; bench/realwidth_files.py names): device check
# stages `realwidth NAME` time their steps against the HBM floor and speculation against plain decoding.
REALWIDTH_SPEC = ("glm45air-1-a0.1", "glm45air-4-a0.1")
# Their artifacts carry a reduced draft head of this many rows too (--spec-draft-vocab; docs/design.md measured
# 32768 on this file on the CPU: a draft step 0.38 decodes, 0.85 with the full head): the stages time a draft step
# with each, so the device shows what a draft step costs where its head is not most of its bytes. No bytes in the
# bundle (the runtime gathers the rows from the GGUF's head) and the full-head entries stay.
REALWIDTH_DRAFT_VOCAB = 32768


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# -- site/ ---------------------------------------------------------------------------------------------------------
def site_packages() -> str:
    import tvm

    return os.path.dirname(os.path.dirname(tvm.__file__))


def _trim(root: str, paths) -> None:
    for p in paths:
        full = os.path.join(root, p)
        if os.path.isdir(full):
            shutil.rmtree(full)
        elif os.path.exists(full):
            os.remove(full)
    for d in glob.glob(os.path.join(root, "**", "__pycache__"), recursive=True):
        shutil.rmtree(d, ignore_errors=True)


def _copy(src: str, dst: str) -> None:
    if os.path.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    else:
        shutil.copy2(src, dst)


def _glibc_of_tags(tags) -> str:
    """Oldest glibc a wheel's platform tags accept ('' for pure-Python wheels)."""
    vers = []
    for t in tags:
        m = re.search(r"manylinux_(\d+)_(\d+)", t) or re.search(r"manylinux(2014|2010|1)", t)
        if m and m.lastindex == 2:
            vers.append((int(m.group(1)), int(m.group(2))))
        elif m:
            vers.append({"2014": (2, 17), "2010": (2, 12), "1": (2, 5)}[m.group(1)])
    return "%d.%d" % min(vers) if vers else ""


def _dist_info(site: str, dist: str) -> tuple[str, str, list[str]]:
    """(dist-info folder, version, wheel tags) of an installed distribution."""
    norm = dist.replace("-", "_").lower()
    for d in os.listdir(site):
        if d.lower().startswith(norm + "-") and d.endswith(".dist-info"):
            version = d[len(norm) + 1:-len(".dist-info")]
            wheel = os.path.join(site, d, "WHEEL")
            tags = [ln.split(":", 1)[1].strip() for ln in open(wheel) if ln.startswith("Tag:")] if os.path.isfile(wheel) else []
            return d, version, tags
    raise SystemExit(f"bundle: {dist} is not installed in {site}")


def ffi_wheel(host: dict, cache: str) -> str:
    """The apache-tvm-ffi wheel for the host's CPython (pip download, kept in the nextn cache)."""
    tag = host["soabi"].split("-")[1]                     # cpython-312-... -> 312
    d = os.path.join(cache, "wheels")
    found = glob.glob(os.path.join(d, f"apache_tvm_ffi-0.1.14.post1-cp{tag}-*.whl"))
    if found:
        return found[0]
    os.makedirs(d, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           host["python"], "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
           "manylinux_2_24_x86_64", "--platform", "manylinux_2_17_x86_64", "-d", d, TVM_FFI_PIN]
    log("bundle: " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return glob.glob(os.path.join(d, f"apache_tvm_ffi-0.1.14.post1-cp{tag}-*.whl"))[0]


def build_site(site: str, host_name: str, cache: str) -> dict:
    """Fill site/; return {"host": ..., "carries": {dist: version}, "needs": {import: requirement}}."""
    src = site_packages()
    os.makedirs(os.path.join(site, "nextn"))
    carries, glibc = {}, []
    for name, dist in (("tvm", "apache_tvm"), ("gguf", "gguf")):
        _copy(os.path.join(src, name), os.path.join(site, name))
        _d, ver, tags = _dist_info(src, dist)
        carries[name] = ver
        glibc.append(_glibc_of_tags(tags))
    _trim(os.path.join(site, "tvm"), TVM_TRIM)
    if host_name == "here":
        h = {"implementation": sys.implementation.name, "python": "%d.%d" % sys.version_info[:2],
             "soabi": sysconfig.get_config_var("SOABI"), "machine": platform.machine()}
        _copy(os.path.join(src, "tvm_ffi"), os.path.join(site, "tvm_ffi"))
        _d, ver, tags = _dist_info(src, "apache_tvm_ffi")
        needs = {}
        for mod, files in COPY.items():
            for f in files:
                if os.path.exists(os.path.join(src, f)):
                    _copy(os.path.join(src, f), os.path.join(site, f))
            carries[mod] = _dist_info(src, {"yaml": "pyyaml"}.get(mod, mod))[1]
    else:
        h = {k: v for k, v in HOSTS[host_name].items() if k != "needs"}
        whl = ffi_wheel(h, cache)
        with zipfile.ZipFile(whl) as z:
            z.extractall(site, [n for n in z.namelist() if n.startswith("tvm_ffi/")])
        ver, tags = "0.1.14.post1", [os.path.basename(whl)[:-4].split("-", 2)[2]]
        needs = dict(HOSTS[host_name]["needs"])
    _trim(os.path.join(site, "tvm_ffi"), FFI_TRIM)
    carries["tvm_ffi"] = ver
    glibc.append(_glibc_of_tags(tags))
    for pkg in ("common", "runtime"):      # the runtime and its shared leaves; nextn.compiler stays behind
        _copy(os.path.join(ROOT, pkg), os.path.join(site, "nextn", pkg))
    h["glibc"] = max((g for g in glibc if g), key=lambda v: tuple(map(int, v.split("."))), default="")
    return {"host": h, "carries": carries, "needs": needs}


# -- artifacts, references -----------------------------------------------------------------------------------------
def compile_into(model: str, out: str, target: str, arches, cuda_graph: bool = True, kv: str = "f32",
                 exact: bool = False, draft_vocab: int = 0) -> str:
    """`kv`: both KV cache types; f32 for the fixture checks, which compare with float32 references. `exact`:
    `--exact-matmul` (float activation rows). `draft_vocab`: --spec-draft-vocab N (0: none)."""
    from nextn.compiler.entry import CompileOptions, compile_model

    compile_model(model, out, CompileOptions(target=target, arches=arches, cuda_graph=cuda_graph, cache_type_k=kv,
                                             cache_type_v=kv, exact_matmul=exact, draft_vocab=draft_vocab), log=log)
    if target == "cuda":
        from nextn.compiler.check_device_code import check_artifact

        check_artifact(out)
    return out


def copy_refs(fixture: str, dst: str, logits: bool) -> None:
    """reference.json (the prompts) and, with `logits`, the reference logits the device check reads: last rows of
    every prompt, every row of code-short (the others' full rows would be most of the bundle)."""
    import numpy as np

    os.makedirs(dst, exist_ok=True)
    if not os.path.isfile(os.path.join(dst, "reference.json")):
        shutil.copy2(os.path.join(FIXTURES, fixture, "reference.json"), dst)
    if not logits or os.path.isfile(os.path.join(dst, "reference_logits.npz")):
        return
    z = np.load(os.path.join(FIXTURES, fixture, "reference_logits.npz"))
    keep = {k: z[k] for k in z.files if k.endswith("/last_logits") or k.startswith("code-short/")}
    np.savez_compressed(os.path.join(dst, "reference_logits.npz"), **keep)


def cpu_artifact(gguf: str, exact: bool = True) -> str:
    """The llvm artifact of `gguf` with f32 KV (as compile_into's), `exact`: `--exact-matmul` (float activation
    rows); compiled once into the nextn cache under the options' cache key, bound to the file's path (the
    artifact is loaded by its directory)."""
    from nextn.common.manifest import MANIFEST
    from nextn.common.paths import cache_dir
    from nextn.compiler.entry import CompileOptions, compile_model

    options = CompileOptions(exact_matmul=exact, cache_type_k="f32", cache_type_v="f32")
    out = os.path.join(cache_dir(), "bundle-cpu", options.cache_key(gguf, at_path=True))
    if not os.path.isfile(os.path.join(out, MANIFEST)):
        compile_model(gguf, out, options, log=log)
    return out


def gpu_route(gguf: str) -> str:
    """"int8" when every tensor of the GGUF whose CPU matmuls take int8 activation rows (compiler/lower/x86
    INT_KINDS) has a format on the CUDA integer route (compiler/lower/cuda/int8.FORMATS: Q8_0, Q4_0 .. Q5_1, IQ4_NL,
    IQ4_XS, MXFP4, NVFP4, the K-quants, the codebook formats: today every integer kind of the CPU), so the default
    CUDA and llvm artifacts compute the same up to float32 rounding; else "float": a format the CPU quantizes and
    CUDA does not would make the default builds two different computations (issue 33), and only the
    `--exact-matmul` builds are compared."""
    import gguf as gg

    from nextn.compiler.lower.cuda.int8 import FORMATS
    from nextn.compiler.lower.x86 import INT_KINDS

    kinds = {t.tensor_type.name.lower() for t in gg.GGUFReader(gguf).tensors}
    return "int8" if not (kinds & set(INT_KINDS)) - set(FORMATS) else "float"


def record_cpu_expectations(gguf: str, fixture: str, path: str, artifact: str | None = None,
                            exact: bool = True) -> None:
    """The GGUF's outputs through its llvm artifact on this CPU (`exact`: `--exact-matmul`, float activation rows;
    else the default, int8 activation rows), with their top-2 margins: the bar of the CUDA artifact that computes
    the same (`gpu_route`; issue 33: the first H200 run compared the float CUDA kernels with the int8 CPU run)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import device_refs
    import nextn.runtime as rt

    log(f"bundle: recording {os.path.basename(gguf)} on this CPU (llvm, "
        f"{'--exact-matmul' if exact else 'int8 activations'}) ...")
    m = rt.load(artifact or cpu_artifact(gguf, exact=exact), ctx_size=4096, log=log)
    device_refs.record_expectations(m, os.path.join(FIXTURES, fixture), path)


# -- the bundle ------------------------------------------------------------------------------------------------------
def build(out: str, host: str = "h200", device: str = "cuda", arches=("sm_90",), checks=tuple(CHECKS),
          realwidth: str | None = REALWIDTH, prebuilt: dict | None = None, copy_models: bool = True,
          cache: str | None = None, reuse: str | None = None, cpu_artifacts: dict | None = None,
          realwidth_spec=(), int8_kernels: bool | None = None) -> dict:
    """Write the bundle directory `out`; returns its bundle.json. `prebuilt` {check name (+ "-nograph"), or the
    real-width name: artifact dir} skips compiling those; `reuse`: an earlier bundle whose artifacts and CPU
    expectations are taken as they are (built by the same compiler: nothing checks that); `copy_models` False
    references the fixture GGUFs where they are (CI); `cpu_artifacts` {check name: llvm artifact dir}: the
    `--exact-matmul` artifact a quantized check's expectations are recorded from (default: `cpu_artifact`, compiled
    and cached);
    `realwidth_spec`: names of REALWIDTH_FILES (the predictable ones, REALWIDTH_SPEC) for the `realwidth NAME` stages,
    or dicts {"name", "model", "artifact"} (CI: a tiny stand-in); `int8_kernels`: build the `int8 kernels` stage's
    library and cases (bench/int8_cases.py; None: on CUDA bundles)."""
    from nextn.common.paths import cache_dir

    cache = cache or cache_dir()
    target = "cuda" if device == "cuda" else "llvm"
    arches = list(arches) if target == "cuda" else None
    prebuilt = dict(prebuilt or {})
    int8_kernels = target == "cuda" if int8_kernels is None else int8_kernels
    if reuse and os.path.abspath(reuse) == os.path.abspath(out):
        reuse = out.rstrip("/") + ".prev"
        shutil.rmtree(reuse, ignore_errors=True)
        os.replace(out, reuse)
    if reuse and os.path.isdir(os.path.join(reuse, "art")):   # without art/: recompile, keep the expectations
        for name in os.listdir(os.path.join(reuse, "art")):
            prebuilt.setdefault(re.sub(f"-{target}$", "", name), os.path.join(reuse, "art", name))
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    plan = {"format": 1, "device": device, "created_by": f"bench/bundle.py at {git_head()}"}
    plan |= build_site(os.path.join(out, "site"), host, cache)
    if target == "cuda":
        from nextn.compiler.gpu_build import _find_cudart

        os.makedirs(os.path.join(out, "lib"))
        shutil.copy2(os.path.realpath(_find_cudart()), os.path.join(out, "lib", "libcudart.so.13"))
        plan["preload"] = ["lib/libcudart.so.13"]
    plan["checks"] = []
    first = True
    for name in checks:
        fixture, gguf, how = CHECKS[name]
        rel = f"{fixture}/{gguf}"
        src = os.path.join(FIXTURES, rel)
        if not copy_models:
            model = src
        elif rel in IN_REPO:
            model = place_link(out, f"models/{rel}", IN_REPO[rel], src)
        else:
            os.makedirs(os.path.join(out, "models", fixture), exist_ok=True)
            shutil.copy2(src, os.path.join(out, "models", rel))
            model = f"models/{rel}"
        ref = f"refs/{fixture}"
        copy_refs(fixture, os.path.join(out, ref), logits=how == "fixture")
        entry = {"name": name, "model": model, "reference": ref}
        # (name, CUDA graphs, the int8 variant)
        variants = [(name, True, False)] + ([(name + "-nograph", False, False)] if first and target == "cuda" else [])
        if how == "cpu" and target == "cuda" and gpu_route(src) == "int8":
            variants.append((name + "-int8", True, True))
        for vname, graph, int8 in variants:
            art = os.path.join(out, "art", vname)
            if vname in prebuilt:
                shutil.copytree(prebuilt[vname], art)
            else:
                compile_into(src, art, target, arches, cuda_graph=graph, exact=how == "cpu" and not int8)
            e = dict(entry, name=vname, artifact=f"art/{vname}",
                     role="main" if first and graph and not int8 else "nograph" if not graph else None)
            if how == "cpu":
                from device_refs import GPU_TOL, INT8_TOL

                # "expect-exact-" / "expect-int8-": the two computations never share a file (older bundles recorded
                # int8 expectations as "expect-")
                e.update(expect=f"refs/expect-{'int8' if int8 else 'exact'}-{name}", tol=INT8_TOL if int8 else GPU_TOL,
                         against="cpu run, int8 activations (both)" if int8 else "cpu run, --exact-matmul (both)")
                for ext in (".json", ".npz") if reuse and os.path.isfile(os.path.join(reuse, e["expect"] + ".json")) else ():
                    shutil.copy2(os.path.join(reuse, e["expect"] + ext), os.path.join(out, e["expect"] + ext))
                if not os.path.isfile(os.path.join(out, e["expect"] + ".json")):
                    record_cpu_expectations(src, fixture, os.path.join(out, e["expect"]),
                                            None if int8 else (cpu_artifacts or {}).get(name), exact=not int8)
            plan["checks"].append({k: v for k, v in e.items() if v is not None})
        first = False
    if int8_kernels:   # the `int8 kernels` stage: the integer-route kernels alone against the CPU's
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import int8_cases

        plan["int8_kernels"] = dict(int8_cases.build(os.path.join(out, "art", "int8"), target, arches), dir="art/int8")
    if isinstance(realwidth, dict):     # a given file + artifact (CI: the real-width stage on a tiny model)
        shutil.copytree(realwidth["artifact"], os.path.join(out, "art", "realwidth"))
        plan["realwidth"] = {"name": realwidth["name"], "model": realwidth["model"], "artifact": "art/realwidth"}
    elif realwidth:
        plan["realwidth"] = realwidth_slice(out, realwidth, target, arches, prebuilt)
    plan["realwidth_spec"] = []
    for rw in realwidth_spec or ():
        if isinstance(rw, dict):
            shutil.copytree(rw["artifact"], os.path.join(out, "art", f"spec-{rw['name']}"))
            plan["realwidth_spec"].append(dict(rw, artifact=f"art/spec-{rw['name']}"))
        else:
            plan["realwidth_spec"].append(realwidth_slice(out, rw, target, arches, prebuilt))
    strip_libraries(out)
    shutil.copy2(os.path.join(ROOT, "bench", "bundle_run.py"), os.path.join(out, "run.py"))
    for mod in BUNDLED_BENCH:
        shutil.copy2(os.path.join(ROOT, "bench", mod), os.path.join(out, mod))
    with open(os.path.join(out, "bundle.json"), "w") as f:
        json.dump(plan, f, indent=1)
    return plan


def strip_libraries(out: str) -> int:
    """Strip the static symbol tables and debug info (`strip --strip-unneeded`) of every library under out/art, and
    record each artifact's stripped files' sha256 and size in its manifest (the runtime refuses a library the
    manifest does not vouch for). The runtime finds its functions through the dynamic symbol table, which strip
    keeps. On the 2026-12-06 bundle: 4.3 MiB less unpacked, 0.4 MiB less in the archive (glm4moe Q8_0 sm_90: 1.40 ->
    1.04 MB), what the 64 MiB carry limit needed. Returns the bytes saved; 0 without a `strip` program."""
    from nextn.common.manifest import MANIFEST, library_entry

    tool = shutil.which("strip")
    if not tool:
        log("bundle: no `strip` program; artifacts carried with their symbol tables")
        return 0
    saved = 0
    for path in sorted(glob.glob(os.path.join(out, "art", "**", "*.so"), recursive=True)):
        before = os.path.getsize(path)
        subprocess.run([tool, "--strip-unneeded", path], check=True)
        saved += before - os.path.getsize(path)
    for man_path in sorted(glob.glob(os.path.join(out, "art", "*", MANIFEST))):
        art = os.path.dirname(man_path)
        with open(man_path) as f:
            man = json.load(f)
        man["libraries"] = [library_entry(os.path.join(art, lib["file"]), lib.get("arches", []))
                            for lib in man.get("libraries", [])]
        with open(man_path, "w") as f:
            json.dump(man, f, indent=1)
    log(f"bundle: stripped the artifacts' libraries: {saved / 2**20:.1f} MiB less")
    return saved


def place_link(out: str, rel: str, repo_rel: str, src: str) -> str:
    """models/REL as a relative link to the repository's copy of the same file (bench/gpu_bundle/ sits two
    levels below the repository root, where the device run unpacks it)."""
    if sha256(src) != sha256(os.path.join(ROOT, repo_rel)):
        raise SystemExit(f"bundle: {repo_rel} is not the fixture {src}")
    link = os.path.join(out, rel)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    depth = rel.count("/") + 2                             # models/a/b.gguf in bench/gpu_bundle/
    os.symlink(os.path.join(*[".."] * depth, repo_rel), link)
    return rel


def realwidth_slice(out: str, name: str, target: str, arches, prebuilt: dict) -> dict:
    """The real-width GGUF's recipe (generated on the GPU host: synth_realwidth.py PRESET OUT ARGS...), its sha256
    and size, and its artifact. `name`: a synthesized file of bench/realwidth_files.py (made here first when
    missing: 4-10 GB, run under the heavy-bench lock); its artifact is compiled once per bundle (the `realwidth`
    stage and a `realwidth NAME` stage of the same file share it)."""
    from realwidth_files import make

    if REALWIDTH_FILES.get(name, ("",))[0] != "synth":
        raise SystemExit(f"bundle: {name} is not a synth_realwidth.py file of bench/realwidth_files.py (it cannot be "
                         f"generated on the GPU host)")
    preset, *args = REALWIDTH_FILES[name][1]
    n_moe = int(args[0])
    gguf = make(name, log)
    art = os.path.join(out, "art", f"{name}-{target}")
    if not os.path.isdir(art) and name in prebuilt:
        shutil.copytree(prebuilt[name], art)
    elif not os.path.isdir(art):
        # f16 KV: speed and memory as llama.cpp's default KV type
        compile_into(gguf, art, target, arches, kv="f16", draft_vocab=REALWIDTH_DRAFT_VOCAB)
    man = json.load(open(os.path.join(art, "manifest.json")))
    mf = next(f for f in man["model_files"] if f["role"] == "model")
    os.makedirs(os.path.join(out, "tools"), exist_ok=True)
    shutil.copy2(SYNTH, os.path.join(out, "tools", "synth_realwidth.py"))
    # synth_realwidth.py reads the tiny fixture of the same arch as its metadata template: FIXTURES=models/
    tpl = "tiny-glm4moe/tiny-glm4moe-Q8_0.gguf"
    if not os.path.lexists(os.path.join(out, "models", tpl)):
        place_link(out, f"models/{tpl}", IN_REPO[tpl], os.path.join(FIXTURES, tpl))
    return {"name": name, "preset": preset, "n_moe": n_moe, "args": args, "file": f"{name}.gguf", "size": mf["size"],
            "sha256": sha256(gguf), "artifact": os.path.relpath(art, out), "synth": "tools/synth_realwidth.py",
            "fixtures": "models"}


def missing_inputs(out: str) -> list[str]:
    """What bundle `out`'s stages read and the bundle lacks, as 'STAGE: PATH' (empty: every input is there): per
    check its model (a link into the repository resolves from `out`'s place, bench/gpu_bundle/), reference folder,
    artifact (manifest.json and each library it lists) and recorded expectations (.json, .npz); the `int8 kernels`
    library and cases; per real-width stage its artifact, generator and template fixtures; the preloaded libraries
    and site/."""
    plan = json.load(open(os.path.join(out, "bundle.json")))
    need: list[tuple[str, str]] = [("run", "site"), ("run", "run.py"), *(("run", m) for m in BUNDLED_BENCH)]
    need += [("plugin", p) for p in plan.get("preload", [])]

    def artifact(stage, rel):
        need.append((stage, os.path.join(rel, "manifest.json")))
        man = os.path.join(out, rel, "manifest.json")
        if os.path.isfile(man):
            need.extend((stage, os.path.join(rel, lib["file"])) for lib in json.load(open(man)).get("libraries", []))

    for c in plan.get("checks", []):
        stage = f"reference {c['name']}"
        need += [(stage, c["model"]), (stage, c["reference"])]
        artifact(stage, c["artifact"])
        if c.get("expect"):
            need += [(stage, c["expect"] + ext) for ext in (".json", ".npz")]
    if plan.get("int8_kernels"):
        k = plan["int8_kernels"]
        need += [("int8 kernels", os.path.join(k["dir"], k[f])) for f in ("library", "cases")]
    for rw in [plan["realwidth"]] if plan.get("realwidth") else []:
        artifact("realwidth", rw["artifact"])
        need += [("realwidth", rw[f]) for f in ("synth", "fixtures") if f in rw]
    for rw in plan.get("realwidth_spec", []):
        artifact(f"realwidth {rw['name']}", rw["artifact"])
        need += [(f"realwidth {rw['name']}", rw[f]) for f in ("synth", "fixtures") if f in rw]
    return [f"{stage}: {rel}" for stage, rel in need if not os.path.exists(os.path.join(out, rel))]


def git_head() -> str:
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def repo_bytes() -> int:
    """Bytes of the repository's tracked files (they travel with every device run)."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
    return sum(os.path.getsize(os.path.join(ROOT, f.decode())) for f in files if f and
               os.path.isfile(os.path.join(ROOT, f.decode())))


def make_tar(out: str, top: str = "gpu_bundle") -> str:
    """out.tar.xz holding out/ as `top`/ (the folder bench/device_check.sh unpacks into bench/), links kept;
    xz -9, multi-threaded when the xz program is installed."""
    tar = out.rstrip("/") + ".tar.xz"
    if shutil.which("xz"):
        with open(tar, "wb") as f:
            xz = subprocess.Popen(["xz", "-9", "-T0", "-c"], stdin=subprocess.PIPE, stdout=f)
            with tarfile.open(fileobj=xz.stdin, mode="w|") as t:
                t.add(out, arcname=top)
            xz.stdin.close()
            if xz.wait() != 0:
                raise SystemExit("bundle: xz failed")
    else:
        with tarfile.open(tar, "w:xz", preset=9) as t:
            t.add(out, arcname=top)
    return tar


def _report_missing(out: str) -> int:
    """Print `missing_inputs(out)` (or that every stage's inputs are there); 1 if anything is missing."""
    gone = missing_inputs(out)
    for g in gone:
        print(f"bundle: missing input of stage {g}", file=sys.stderr)
    if not gone:
        log(f"bundle: {out}: every stage's inputs are present")
    return 1 if gone else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default=os.path.join(ROOT, "bench", "gpu_bundle"))
    ap.add_argument("--host", default="h200", choices=["h200", "here"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--arch", default="sm_90", help="CUDA arch(s) of the artifacts (comma list)")
    ap.add_argument("--checks", default=",".join(CHECKS), help=f"comma list of {', '.join(CHECKS)}")
    ap.add_argument("--realwidth", default=REALWIDTH, help=f"real-width slice ({REALWIDTH}) or none")
    ap.add_argument("--realwidth-spec", default=",".join(REALWIDTH_SPEC),
                    help="predictable real-width files for the speculation stages (comma list) or none")
    ap.add_argument("--no-tar", action="store_true", help="leave the directory only")
    ap.add_argument("--reuse", default=None, help="take the artifacts and CPU expectations of this earlier bundle "
                                                  "(e.g. the output directory itself) instead of compiling again")
    ap.add_argument("--limit-mb", type=float, default=LIMIT_MB, help="MiB a device run may carry (with the repository)")
    ap.add_argument("--check", metavar="DIR", default=None,
                    help="only list what the stages of the bundle DIR read and it lacks (exit 1 if anything)")
    a = ap.parse_args(argv)
    if a.check:
        return _report_missing(a.check)
    checks = [c for c in a.checks.split(",") if c]
    bad = [c for c in checks if c not in CHECKS]
    if bad:
        raise SystemExit(f"bundle: unknown check(s) {', '.join(bad)}; expected {', '.join(CHECKS)}")
    rw = None if a.realwidth == "none" else a.realwidth
    spec = [] if a.realwidth_spec == "none" else [n for n in a.realwidth_spec.split(",") if n]
    build(a.out, a.host, a.device, a.arch.split(","), checks, rw, reuse=a.reuse, realwidth_spec=spec)
    raw = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a.out) for f in fs
              if not os.path.islink(os.path.join(d, f)))
    log(f"bundle: {a.out} {raw / 2**20:.1f} MiB unpacked")
    if _report_missing(a.out):
        return 1
    if a.no_tar:
        return 0
    tar = make_tar(a.out)
    size, repo = os.path.getsize(tar), repo_bytes()
    total = (size + repo) / 2**20
    print(f"{tar}: {size / 2**20:.1f} MiB; with the repository's tracked files ({repo / 2**20:.1f} MiB) a device run "
          f"carries {total:.1f} MiB of the {a.limit_mb:.0f} MiB limit")
    if total > a.limit_mb:
        print(f"bundle: {total:.1f} MiB is over the {a.limit_mb:.0f} MiB a device run may carry; drop a check "
              f"(--checks) or the real-width slice (--realwidth none)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
