"""Compile-on-demand for `nextn run MODEL.gguf`: artifacts cached by model sha256, target and nextn version."""
from __future__ import annotations

import os

from .artifact import load_artifact
from .errors import NextnError
from .model_check import cache_dir, file_sha256


def compiler_fingerprint() -> str:
    """Hash of the compiler's own sources and TVM version: a changed compiler never reuses a stale artifact."""
    import hashlib

    import nextn.compiler
    import nextn.schedules

    h = hashlib.sha256()
    for pkg in (nextn.compiler, nextn.schedules):
        root = os.path.dirname(pkg.__file__)
        for d, _dirs, files in sorted(os.walk(root)):
            for fn in sorted(files):
                if fn.endswith(".py"):
                    with open(os.path.join(d, fn), "rb") as f:
                        h.update(fn.encode() + f.read())
    try:
        from importlib.metadata import version

        h.update(version("apache-tvm").encode())
    except Exception:
        pass
    return h.hexdigest()[:12]


def compiled_artifact(model: str, target: str, draft: str | None = None, log=None, arches=None,
                      mtp_dense_attention: bool = False) -> str:
    from nextn.compiler.compile import compile_model, nextn_version

    if not os.path.isfile(model):
        raise NextnError(f"{model}: no such file")
    key = file_sha256(model)[:16]
    if draft:
        if not os.path.isfile(draft):
            raise NextnError(f"{draft}: no such file")
        key += "-" + file_sha256(draft)[:16]
    from nextn.compiler.gpu_build import parse_arches

    arch_list = parse_arches(target, arches)   # validates --arch (llvm takes none)
    target_key = f"{target}_{'+'.join(arch_list)}" if arch_list else target
    if mtp_dense_attention:   # a compile option changes the artifact: its own cache entry
        target_key += "-mtp-dense"
    out = os.path.join(cache_dir(), "artifacts", f"{key}-{target_key}-{nextn_version()}-{compiler_fingerprint()}")
    if os.path.isfile(os.path.join(out, "manifest.json")):
        try:
            load_artifact(out)
            return out
        except NextnError:
            pass  # a stale or damaged cache entry: rebuild it
    compile_model(model, out, target=target, draft=draft, log=log or (lambda *_: None), arches=arches,
                  mtp_dense_attention=mtp_dense_attention)
    return out
