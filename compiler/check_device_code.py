"""Check that each library of an artifact carries compiled device code for every arch its manifest lists (the
reader: nextn.common.device_code).

    python -m nextn.compiler.check_device_code ARTIFACT_DIR_OR_LIB.so [--expect sm_80,sm_90]
"""
from __future__ import annotations

import json
import os
import sys

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
        report[lib["file"]] = {"expected": expect, **{k: v for k, v in info.items() if k != "fatbins"},
                               "fatbin_entries": [e for fb in info["fatbins"] for e in fb]}
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
        print(json.dumps({k: v for k, v in info.items()}, indent=1))
        miss = missing_arches(a.path, [x for x in a.expect.split(",") if x])
        if miss:
            print(f"missing: {', '.join(miss)}", file=sys.stderr)
            return 1
        return 0
    except (NextnError, OSError) as e:
        print(f"check_device_code: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
