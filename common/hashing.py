"""sha256 of files: libraries (verified before they are loaded), model GGUFs (cache keys, the artifact's record
of its inputs), tuning logs and candidate libraries."""
from __future__ import annotations

import hashlib
import json
import os

from .paths import cache_dir

CHUNK = 1 << 22   # 4 MiB reads: a 100+ GB GGUF is hashed without holding it in memory


def sha256_file(path: str) -> str:
    """Hex sha256 of the file at `path`, read in CHUNK-byte pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str) -> str:
    """sha256 of a (possibly huge) model file, remembered per (path, size, mtime) in the cache, so it is hashed
    once per version of the file."""
    st = os.stat(path)
    key = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    memo_path = os.path.join(cache_dir(), "sha256.json")
    try:
        with open(memo_path) as f:
            memo = json.load(f)
    except (OSError, json.JSONDecodeError):
        memo = {}
    if key not in memo:
        memo[key] = sha256_file(path)
        tmp = memo_path + f".{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(memo, f)
        os.replace(tmp, memo_path)
    return memo[key]
