"""Where an engine runs: the CPU, or a CUDA GPU for a CUDA artifact. No compiler is needed on a GPU machine.

On CUDA, weights and the static KV buffers live in device memory, allocated with cupy when it is installed (else
by TVM's own allocator) and handed to the compiled entry points through DLPack once, at load (zero-copy views, no
per-call conversion). Each step copies only its few input ids/positions to the device, and reads back the hidden
rows and argmax ids it needs; logits stay on the device until asked for. TVM launches on the CUDA legacy default
stream, which is also cupy's default: one stream, so no synchronisation between them is needed.

A runtime-only TVM (the wheel minus libtvm_compiler.so) does not auto-load the CUDA plugin, so it is loaded by
path (nextn.common.cuda) before the artifact is opened.

GPU execution of this module is written but has not been run (no GPU was available where it was written).
"""
from __future__ import annotations

import re

import numpy as np

from nextn.common import cuda
from nextn.common.errors import NextnError

# What TVM's CUDA plugin needs where it runs (said when it cannot be loaded).
CUDA_NEEDS = "it needs libcudart.so.13 on LD_LIBRARY_PATH and an NVIDIA driver for CUDA 13 (R580 or newer)"


def parse_device(device: str) -> tuple[str, int]:
    d = (device or "cpu").strip().lower()
    if d == "cpu":
        return "cpu", 0
    m = re.fullmatch(r"(cuda|gpu)(?::(\d+))?", d)
    if m:
        return "cuda", int(m.group(2) or 0)
    if re.fullmatch(r"(rocm|hip)(?::\d+)?", d):
        return "rocm", 0
    raise NextnError(f"--device {device}: expected cpu or cuda:N")


class Device:
    """Allocation and transfer for one device; `tensor(np)` uploads, `empty(shape, dtype)` allocates zeroed."""

    def __init__(self, artifact, device: str = "cpu"):
        import tvm

        kind, idx = parse_device(device)
        tk = artifact.manifest["target"].get("kind", "llvm")
        self.kind, self.index = kind, idx
        if tk == "rocm":
            raise NextnError(f"{artifact.path}: a ROCm artifact; nextn's runtime has no ROCm loader in the TVM wheel "
                             f"(see docs/amd-runtime.md for what to build)")
        if kind == "rocm":
            raise NextnError(f"--device {device}: ROCm execution is not supported by this runtime (docs/amd-runtime.md)")
        if kind == "cpu" and tk != "llvm":
            raise NextnError(f"{artifact.path}: built for {tk} ({', '.join(artifact.manifest['target'].get('arches', []))}); "
                             f"run it with --device cuda:0")
        if kind == "cuda" and tk != "cuda":
            raise NextnError(f"--device {device}: this artifact is built for {tk}; compile with --target cuda")
        self._cp = None
        if kind == "cpu":
            self.dev = tvm.cpu()
            self.vm_devices = [self.dev]
            return
        cuda.load_plugin(CUDA_NEEDS)
        self.dev = tvm.cuda(idx)
        if not self.dev.exist:
            raise NextnError(f"--device {device}: no such CUDA device (is the NVIDIA driver loaded?)")
        self.arch = "sm_" + self.dev.compute_version.replace(".", "")
        have = artifact.manifest["target"].get("arches", [])
        if self.arch not in have:
            lowest = min(have, key=lambda a: int(re.match(r"sm_(\d+)", a).group(1)))
            if int(self.arch[3:]) < int(lowest[3:].rstrip("a")):
                raise NextnError(f"{artifact.path}: GPU {self.dev.device_name} is {self.arch}; the artifact carries "
                                 f"{', '.join(have)} (recompile with --arch {self.arch})")
            # newer GPU: the driver JIT-compiles the embedded PTX of the lowest arch (slow first load, still correct)
        self.vm_devices = [self.dev, tvm.cpu()]
        try:
            import cupy

            self._cp = cupy
            cupy.cuda.Device(idx).use()
        except ImportError:
            self._cp = None

    # -- memory ------------------------------------------------------------------------------------------------
    def tensor(self, a: np.ndarray):
        import tvm

        a = np.ascontiguousarray(a)
        if self._cp is None:
            return tvm.runtime.tensor(a, self.dev)
        return self._wrap(self._cp.asarray(a))

    def empty(self, shape, dtype: str):
        """A zero-filled buffer. Zeros, not garbage: KV cells past the last row are read (and masked) when L is
        rounded up to a bucket, and a masked NaN would still poison P·V (0 × NaN)."""
        import tvm

        if self._cp is None:
            t = tvm.runtime.empty(tuple(shape), dtype, self.dev)
            t.copyfrom(np.zeros(tuple(shape), dtype))
            return t
        return self._wrap(self._cp.zeros(tuple(shape), dtype=dtype))

    def _wrap(self, cp_array):
        """A TVM view of a cupy array (zero-copy through DLPack); the cupy owner is kept alive by the capsule."""
        import tvm_ffi

        return tvm_ffi.from_dlpack(cp_array)

    def synchronize(self):
        """Wait for the device's queued work (CUDA launches return at once); nothing to wait for on the CPU."""
        if self.kind == "cuda":
            self.dev.sync()
