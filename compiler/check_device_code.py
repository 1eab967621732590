"""Check that each library of an artifact carries compiled device code for every arch its manifest lists (the
reader: nextn.common.device_code), and that no PrimFunc's host half computes (`host_compute_functions`).

    python -m nextn.compiler.check_device_code ARTIFACT_DIR_OR_LIB.so [--expect sm_80,sm_90]
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

# Float arithmetic in a host function: x86-64 SSE / AVX scalar and packed add/sub/mul/div/max/min/sqrt and FMA,
# AArch64 f-prefixed arithmetic, or a call into libm. The host half of a GPU PrimFunc (TVM's `NAME_compute_` after
# SplitHostDevice / MakePackedAPI) only computes launch dimensions and packs arguments, all integers and pointers.
_HOST_FLOAT = re.compile(r"\t(v?(add|sub|mul|div|max|min|sqrt)[ps][sd]|vfn?m(add|sub)\w*|"
                         r"f(add|sub|mul|div|max|min|sqrt|madd|msub|mla|mls|nmul))\s"
                         r"|\t(call|bl)\s.*<(exp|log|tanh|pow|sin|cos|erf|sqrt)f?@plt>")
_FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")


def host_compute_functions(lib: str) -> list[str] | None:
    """PrimFuncs of `lib` whose host half (`NAME_compute_`) does float arithmetic — code that should have run on GPU
    threads (issue 33: `fused_swiglu_mul_mat3_compute_` looped over device buffers with SSE and `expf`); read from
    `objdump -d`. None when objdump is not installed (not checked)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", lib], capture_output=True, text=True, check=True).stdout
    bad, fn = [], None
    for line in out.splitlines():
        m = _FUNC.match(line)
        if m:
            fn = m.group(1)[:-len("_compute_")] if m.group(1).endswith("_compute_") else None
        elif fn is not None and _HOST_FLOAT.search(line) and fn not in bad:
            bad.append(fn)
    return bad

from nextn.common.device_code import device_code, missing_arches


def check_artifact(path: str) -> dict:
    """Check every library of an artifact against the arches its manifest lists; raises NextnError on a gap."""
    from nextn.common.errors import NextnError

    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    report = {}
    for lib in m["libraries"]:
        lp = os.path.join(path, lib["file"])
        info = device_code(lp)
        expect = lib.get("arches") or []
        miss = missing_arches(lp, expect)
        if info["cuda_source"]:
            raise NextnError(f"{lp}: carries CUDA source, not compiled device code (built without the CUDA plugin)")
        if miss:
            raise NextnError(f"{lp}: no compiled device code for {', '.join(miss)} (manifest lists {', '.join(expect)})")
        host = host_compute_functions(lp) if m["target"]["kind"] in ("cuda", "rocm") else []
        if host:
            raise NextnError(f"{lp}: the host half of PrimFunc '{host[0]}' does float arithmetic (code that should run "
                             f"on GPU threads; {len(host)} such function(s): {', '.join(host[:4])})")
        report[lib["file"]] = {"expected": expect, **{k: v for k, v in info.items() if k != "fatbins"},
                               "fatbin_entries": [e for fb in info["fatbins"] for e in fb],
                               "host_compute": "not checked (no objdump)" if host is None else host}
    return report


def main(argv=None):
    import argparse

    from nextn.common.errors import NextnError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="artifact directory or library .so")
    ap.add_argument("--expect", default="", help="comma list of arches that must be present (library mode)")
    a = ap.parse_args(argv)
    try:
        if os.path.isdir(a.path):
            print(json.dumps(check_artifact(a.path), indent=1))
            return 0
        info = device_code(a.path)
        gpu = info["cuda_sass"] or info["cuda_ptx"] or info["amdgpu"]   # a CPU library computes on the host
        host = host_compute_functions(a.path) if gpu else []
        print(json.dumps({**info, "host_compute": host}, indent=1))
        miss = missing_arches(a.path, [x for x in a.expect.split(",") if x])
        if miss:
            print(f"missing: {', '.join(miss)}", file=sys.stderr)
            return 1
        if host:
            print(f"host compute in: {', '.join(host)}", file=sys.stderr)
            return 1
        return 0
    except (NextnError, OSError) as e:
        print(f"check_device_code: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
