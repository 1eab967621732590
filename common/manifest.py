"""The artifact's `manifest.json`: written by the compiler (compiler/compile.py), read by the runtime.

    DIR/manifest.json   nextn/TVM versions, target, model files (path, size, sha256), arch + hparams,
                        entry points (argument order), buffer plan, libraries (file, sha256), tuning log,
                        max_draft, split_kernels, cuda_graph
    DIR/<library>.so    the Relax VM executable with every kernel

Reading verifies the sha256 of every library before anything opens it: a compiled library is code, and nextn
never loads one the manifest does not vouch for.
"""
from __future__ import annotations

import json
import os

from .errors import NextnError
from .hashing import sha256_file

MANIFEST = "manifest.json"
SCHEMA = 1
# The deepest draft a request may ask for (manifest "max_draft"); a request's n_max is lowered to it. The static
# KV buffers hold any depth: this bounds the per-position stats and the adaptive depth controller.
MAX_DRAFT = 8


def library_entry(path: str, arches: list[str]) -> dict:
    """The manifest's record of one library file: {file, sha256, size, arches}."""
    return {"file": os.path.basename(path), "sha256": sha256_file(path), "size": os.path.getsize(path),
            "arches": arches}


def read_manifest(path: str) -> dict:
    """The manifest of artifact directory `path`, after checking its schema and every library's sha256.
    Raises NextnError on a missing or unreadable manifest, another schema, a missing library or a hash mismatch."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise NextnError(f"{path}: not a nextn artifact (no {MANIFEST})")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise NextnError(f"{mpath}: unreadable manifest ({e})") from None
    if manifest.get("schema") != SCHEMA:
        raise NextnError(f"{mpath}: manifest schema {manifest.get('schema')!r}, expected {SCHEMA}")
    for lib in manifest.get("libraries", []):
        lp = os.path.join(path, lib["file"])
        if not os.path.isfile(lp):
            raise NextnError(f"{lp}: library listed in the manifest is missing")
        got = sha256_file(lp)
        if got != lib["sha256"]:
            raise NextnError(f"{lp}: sha256 {got[:16]}… does not match the manifest ({lib['sha256'][:16]}…); "
                             f"refusing to load a library the manifest does not vouch for")
    if not manifest.get("libraries"):
        raise NextnError(f"{mpath}: lists no library")
    return manifest
