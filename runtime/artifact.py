"""The compiled artifact: one directory per model × target, described by `manifest.json`.

    DIR/manifest.json   nextn/TVM versions, target, model files (path, size, sha256), arch + hparams,
                        entry points (argument order), buffer plan, libraries (file, sha256), tuning log
    DIR/<library>.so    the Relax VM executable with every kernel

Loading verifies the sha256 of every library before it is opened: a compiled library is code, and
nextn never loads one the manifest does not vouch for.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from .errors import NextnError

MANIFEST = "manifest.json"
SCHEMA = 1


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Artifact:
    path: str
    manifest: dict

    @property
    def library_path(self) -> str:
        return os.path.join(self.path, self.manifest["libraries"][0]["file"])

    def model_path(self, role: str = "model") -> str | None:
        for f in self.manifest["model_files"]:
            if f["role"] == role:
                rel = os.path.normpath(os.path.join(self.path, f.get("relpath", "")))
                return rel if f.get("relpath") and os.path.isfile(rel) else f["path"]
        return None


def load_artifact(path: str) -> Artifact:
    """Read and verify an artifact directory. Raises NextnError on any missing file or hash mismatch."""
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
    return Artifact(path, manifest)
