"""Which GPU code does a compiled library really carry? Read from its bytes, no CUDA/ROCm tools needed.

TVM stores device code inside its own serialized module blob in the exported `.so`, so `cuobjdump` reports
"does not contain device code" even when it is there. This scans the file instead:

- CUDA fatbins (magic 0xBA55ED50; header u32 magic, u16 version, u16 header size, u64 payload size), and in each,
  the entries (u16 kind 1=PTX 2=ELF, u16, u32 header size, u64 payload size, ..., u32 arch at offset 28,
  u64 flags at offset 40, 0x2000 = compressed payload); entries follow each other at header size + payload size.
- bare cubins (NVRTC mode) and any uncompressed ELF in a fatbin: ELF with e_machine 190 (EM_CUDA), SM =
  (e_flags >> 8) & 0xff for the ELF ABI version 8 cubins nvcc 12/13 writes.
- AMD HSA code objects: ELF with e_machine 224 (EM_AMDGPU), EF_AMDGPU_MACH = e_flags & 0xff.
- CUDA C++ source embedded instead of compiled code (a build without the CUDA plugin): `extern "C" __global__`.

The build checks its libraries with it (nextn.compiler.check_device_code), the device check reads which code a
GPU will run (bench/device_check.py: SASS for its arch, or PTX the driver compiles at load).
"""
from __future__ import annotations

import re
import struct

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
