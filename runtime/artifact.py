"""A compiled artifact directory as the runtime opens it (format: nextn.common.manifest)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from nextn.common.manifest import read_manifest


@dataclass
class Artifact:
    path: str
    manifest: dict

    @property
    def library_path(self) -> str:
        return os.path.join(self.path, self.manifest["libraries"][0]["file"])

    def model_path(self, role: str = "model") -> str | None:
        """The GGUF recorded for `role` ("model" or "draft"): beside the artifact at its relative path if it is there,
        else at its absolute path; None when the artifact has no such file."""
        for f in self.manifest["model_files"]:
            if f["role"] == role:
                rel = os.path.normpath(os.path.join(self.path, f.get("relpath", "")))
                return rel if f.get("relpath") and os.path.isfile(rel) else f["path"]
        return None


def load_artifact(path: str) -> Artifact:
    """Read and verify an artifact directory. Raises NextnError on any missing file or hash mismatch."""
    return Artifact(path, read_manifest(path))
