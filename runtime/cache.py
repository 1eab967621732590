"""Compile-on-demand for `nextn run MODEL.gguf`: artifacts cached by model sha256, target and nextn version."""
from __future__ import annotations

import os

from .artifact import load_artifact
from .errors import NextnError
from .model_check import cache_dir, file_sha256


def compiled_artifact(model: str, target: str, draft: str | None = None, log=None) -> str:
    from nextn.compiler.compile import compile_model, nextn_version

    if not os.path.isfile(model):
        raise NextnError(f"{model}: no such file")
    key = file_sha256(model)[:16]
    if draft:
        if not os.path.isfile(draft):
            raise NextnError(f"{draft}: no such file")
        key += "-" + file_sha256(draft)[:16]
    out = os.path.join(cache_dir(), "artifacts", f"{key}-{target}-{nextn_version()}")
    if os.path.isfile(os.path.join(out, "manifest.json")):
        try:
            load_artifact(out)
            return out
        except NextnError:
            pass  # a stale or damaged cache entry: rebuild it
    compile_model(model, out, target=target, draft=draft, log=log or (lambda *_: None))
    return out
