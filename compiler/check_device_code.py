"""Which GPU architectures does a compiled library really carry? Read from the bytes, no CUDA/ROCm tools needed.

TVM stores device code inside its own serialized module blob in the exported `.so`, so `cuobjdump` reports
"does not contain device code" even when it is there (tvm-field-guide.md §2.5). This scans the file instead:

- CUDA fatbins (magic 0xBA55ED50; header u32 magic, u16 version, u16 header size, u64 payload size), and in each,
  the entries (u16 kind 1=PTX 2=ELF, u16, u32 header size, u64 payload size, ..., u32 arch at offset 28,
  u64 flags at offset 40, 0x2000 = compressed payload); entries follow each other at header size + payload size.
- bare cubins (NVRTC mode) and any uncompressed ELF in a fatbin: ELF with e_machine 190 (EM_CUDA), SM =
  (e_flags >> 8) & 0xff for the ELF ABI version 8 cubins nvcc 12/13 writes.
- AMD HSA code objects: ELF with e_machine 224 (EM_AMDGPU), EF_AMDGPU_MACH = e_flags & 0xff.
- CUDA C++ source embedded instead of compiled code (a build without the CUDA plugin): `extern "C" __global__`.

    python -m nextn.compiler.check_device_code ARTIFACT_DIR_OR_LIB.so [--expect sm_80,sm_90]
"""
from __future__ import annotations

import json
import os
import re
import struct
import sys

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
EM_CUDA, EM_AMDGPU = 190, 224
FATBIN_COMPRESSED = 0x2000
AMDGPU_MACH = {0x02F: "gfx906", 0x030: "gfx908", 0x03F: "gfx90a", 0x040: "gfx940", 0x04B: "gfx941", 0x04C: "gfx942",
               0x04F: "gfx950", 0x036: "gfx1030", 0x041: "gfx1100", 0x046: "gfx1101", 0x047: "gfx1102",
               0x048: "gfx1200", 0x04E: "gfx1201"}


def _fatbin_entries(data: bytes, p: int):
    _magic, _ver, hsz, fsz = struct.unpack_from("<IHHQ", data, p)
    q, end = p + hsz, min(p + hsz + fsz, len(data))
    while q + 48 <= end:
        kind, _v, ehsz, psz = struct.unpack_from("<HHIQ", data, q)
        if kind not in (1, 2) or ehsz < 48 or psz == 0:
            break
        arch, = struct.unpack_from("<I", data, q + 28)
        flags, = struct.unpack_from("<Q", data, q + 40)
        yield {"kind": "ptx" if kind == 1 else "sass", "arch": f"sm_{arch}", "bytes": psz,
               "compressed": bool(flags & FATBIN_COMPRESSED)}
        q += ehsz + psz


def _elf_archs(data: bytes):
    cuda, amd = [], []
    for m in re.finditer(re.escape(b"\x7fELF"), data):
        p = m.start()
        if p == 0 or p + 52 > len(data) or data[p + 4] != 2:   # skip the host .so itself; 64-bit ELF only
            continue
        machine, = struct.unpack_from("<H", data, p + 18)
        flags, = struct.unpack_from("<I", data, p + 48)
        if machine == EM_CUDA:
            cuda.append(f"sm_{(flags >> 8) & 0xff}")
        elif machine == EM_AMDGPU:
            amd.append(AMDGPU_MACH.get(flags & 0xff, f"amdgpu-mach-0x{flags & 0xff:03x}"))
    return cuda, amd


def device_code(lib: str) -> dict:
    """{'fatbins': [[entry...]...], 'cuda_sass': [...], 'cuda_ptx': [...], 'amdgpu': [...], 'cuda_source': bool}."""
    with open(lib, "rb") as f:
        data = f.read()
    fatbins = [list(_fatbin_entries(data, m.start())) for m in re.finditer(re.escape(FATBIN_MAGIC), data)]
    sass = {e["arch"] for fb in fatbins for e in fb if e["kind"] == "sass"}
    ptx = {e["arch"] for fb in fatbins for e in fb if e["kind"] == "ptx"}
    cuda_elf, amd = _elf_archs(data)
    sass |= set(cuda_elf)
    return {"fatbins": fatbins, "cuda_sass": sorted(sass), "cuda_ptx": sorted(ptx), "amdgpu": sorted(set(amd)),
            "cuda_source": b'extern "C" __global__' in data}


def missing_arches(lib: str, expect: list[str]) -> list[str]:
    """The requested arches `lib` does not carry compiled code for (empty = all there)."""
    info = device_code(lib)
    have = set(info["cuda_sass"]) | set(info["amdgpu"])
    return [a for a in expect if a not in have]


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
