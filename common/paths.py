"""Where nextn keeps what it derives from the user's files: `$NEXTN_CACHE`, default `~/.cache/nextn`."""
from __future__ import annotations

import os


def cache_dir() -> str:
    """The cache root (created on first use): compiled artifacts, model-file hashes, the build-machine libcuda stub."""
    d = os.environ.get("NEXTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nextn")
    os.makedirs(d, exist_ok=True)
    return d
