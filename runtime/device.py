"""Where an engine runs: the CPU, or a CUDA GPU for a CUDA artifact. No compiler is needed on a GPU machine.

On CUDA, weights and the static KV buffers live in device memory allocated by TVM and are handed to the compiled
entry points once, at load. Weights stream from the memory-mapped GGUF to the device in bounded chunks
(UPLOAD_CHUNK bytes per copy, one progress bar for the model): the copy reads the mapped pages and the driver
stages them through its own pinned buffers, so the host never holds a second copy of the model. Each step copies
only its few input ids / positions to the device and reads back the hidden rows and argmax ids it needs; logits
stay on the device until asked for.

A runtime-only TVM (the wheel minus libtvm_compiler.so) does not auto-load the CUDA plugin, so it is loaded by
path (nextn.common.cuda) before the artifact is opened.
"""
from __future__ import annotations

import contextlib
import platform
import re

import numpy as np

from nextn.common import cuda
from nextn.common.errors import NextnError
from nextn.common.kv_types import itemsize
from nextn.common.measure import cpu_flags

# What TVM's CUDA plugin needs where it runs (said when it cannot be loaded).
CUDA_NEEDS = "it needs libcudart.so.13 on LD_LIBRARY_PATH and an NVIDIA driver for CUDA 13 (R580 or newer)"
UPLOAD_CHUNK = 64 << 20       # bytes per host-to-device copy: bounds what one copy pins / stages
PROGRESS_MIN = 1 << 30        # a load of fewer bytes shows no progress bar (the tiny models load in milliseconds)


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
        host = artifact.manifest.get("host")
        if host and host != platform.machine():   # its host code (and for llvm all of it) is for that machine
            raise NextnError(f"{artifact.path}: compiled for a {host} host, this machine is {platform.machine()}; "
                             f"compile it again here")
        have = cpu_flags() if tk == "llvm" else None
        missing = [f for f in artifact.manifest["target"].get("cpu_flags", []) if have is not None and f not in have]
        if missing:     # its kernels would die with SIGILL (e.g. AVX-512 on a VM that masks it)
            raise NextnError(f"{artifact.path}: compiled for a CPU with {', '.join(missing)}, which this one lacks; "
                             f"compile it again here")
        self.copied_weight_bytes = 0     # weight bytes that could not be used in place (see `weight`)
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

    # -- memory ------------------------------------------------------------------------------------------------
    def tensor(self, a: np.ndarray):
        """A device copy of `a` (on CUDA written in chunks of UPLOAD_CHUNK bytes)."""
        import tvm

        if self.kind == "cpu":
            return tvm.runtime.tensor(np.ascontiguousarray(a), self.dev)
        t = tvm.runtime.empty(a.shape, str(a.dtype), self.dev)
        self.write(t, a)
        return t

    def write(self, t, a: np.ndarray, progress=None) -> None:
        """Copy host array `a` (e.g. a view of the mapped GGUF) into device tensor `t` of the same byte size,
        UPLOAD_CHUNK bytes per copy, through byte views of both: no host copy of `a` unless it is not contiguous."""
        src = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        flat = t._create_view((src.size,), "uint8")
        for off in range(0, src.size, UPLOAD_CHUNK):
            n = min(UPLOAD_CHUNK, src.size - off)
            flat._create_view((n,), "uint8", off).copyfrom(src[off:off + n])
            if progress is not None:
                progress.update(n)

    @contextlib.contextmanager
    def uploader(self, total_bytes: int, what: str = "weights"):
        """Within the block, `put(np_array)` → device tensor, all puts sharing one progress bar (bytes, on
        stderr) when `total_bytes` reaches PROGRESS_MIN."""
        from tqdm import tqdm

        with tqdm(total=total_bytes, desc=f"{what} -> {self.kind}", unit="B", unit_scale=True, leave=False,
                  disable=total_bytes < PROGRESS_MIN) as bar:
            if self.kind == "cpu":
                def put(a):
                    t = self.weight(a)
                    bar.update(a.nbytes)
                    return t
            else:
                def put(a):
                    import tvm

                    t = tvm.runtime.empty(a.shape, str(a.dtype), self.dev)
                    self.write(t, a, bar)
                    return t
            yield put

    def weight(self, a: np.ndarray):
        """A weight buffer for the kernels. On the CPU: `a` itself when it is `ALIGNMENT`-aligned and contiguous
        (a view of the mapped GGUF: no copy; the tensor keeps the map alive), else an aligned copy. On a GPU: an
        upload."""
        if self.kind != "cpu":
            return self.tensor(a)
        import tvm_ffi

        from nextn.common.quant.format import ALIGNMENT

        if not a.flags.c_contiguous or not a.flags.writeable or a.ctypes.data % ALIGNMENT:
            self.copied_weight_bytes += a.nbytes
            return self.tensor(a)          # TVM's own memory: 64-byte aligned
        return tvm_ffi.from_dlpack(a)      # no alignment demand (tvm.runtime.from_dlpack would insist on 64)

    def empty(self, shape, dtype: str):
        """A zero-filled buffer. Zeros, not garbage: KV cells past the last row are read (and masked) when L is
        rounded up to a bucket, and a masked NaN would still poison P·V (0 × NaN). Filled UPLOAD_CHUNK bytes at
        a time from one zero chunk (no host buffer the size of the KV)."""
        import tvm

        t = tvm.runtime.empty(tuple(shape), dtype, self.dev)
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize(dtype)
        if nbytes:
            zeros = np.zeros(min(nbytes, UPLOAD_CHUNK), np.uint8)
            flat = t._create_view((nbytes,), "uint8")
            for off in range(0, nbytes, UPLOAD_CHUNK):
                n = min(UPLOAD_CHUNK, nbytes - off)
                flat._create_view((n,), "uint8", off).copyfrom(zeros[:n])
        return t

    def synchronize(self):
        """Wait for the device's queued work (CUDA launches return at once); nothing to wait for on the CPU."""
        if self.kind == "cuda":
            self.dev.sync()
