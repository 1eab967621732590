"""TVM's CUDA runtime plugin (`libtvm_runtime_cuda.so`), loaded by path.

A runtime-only TVM (the wheel without libtvm_compiler.so) does not load its CUDA backend by itself, and a build
machine without a GPU driver has no `libcuda.so.1` for it to link against (compiler/gpu_build.py loads a stub
first). Loading the plugin with RTLD_GLOBAL registers TVM's CUDA module factories in this process.
"""
from __future__ import annotations

import ctypes
import os

from .errors import NextnError

PLUGIN = "libtvm_runtime_cuda.so"


def plugin_loaded() -> bool:
    """True once TVM can create and load CUDA modules in this process."""
    import tvm_ffi

    names = set(tvm_ffi.registry.list_global_func_names())
    return {"ffi.Module.create.cuda", "ffi.Module.load_from_bytes.cuda"} <= names


def load_plugin(why_failed: str = "") -> None:
    """Load TVM's CUDA plugin from the installed `tvm` package unless it is loaded already. Its NEEDED libcuda.so.1
    and libcudart must be loadable (on the library path, or loaded before). Raises NextnError naming the plugin
    and `why_failed` (what the caller's setting needs) when it cannot be loaded."""
    import tvm

    if plugin_loaded():
        return
    plugin = os.path.join(os.path.dirname(tvm.__file__), "lib", PLUGIN)
    try:
        ctypes.CDLL(plugin, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise NextnError(f"cannot load TVM's CUDA runtime plugin {plugin} ({e}){'; ' + why_failed if why_failed else ''}") \
            from None
    if not plugin_loaded():
        raise NextnError(f"{plugin} loaded but registered no CUDA module factory")
