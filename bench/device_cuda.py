"""CUDA seen from outside TVM, for the device check (bench/device_check.py): the runtime library's versions, errors,
compute capability and memory through ctypes (the libcudart TVM's plugin uses), the libraries this process maps,
nvidia-smi. Standard library only: it runs in the bundle before anything else is known to work."""
from __future__ import annotations

import ctypes
import os
import subprocess

GB = 1e9

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
