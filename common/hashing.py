"""sha256 of files: libraries (verified before they are loaded), tuning logs and candidate libraries, and model
GGUFs where the user asks (`nextn compile --verify-model`; a run identifies a model by its header instead:
common/gguf.py `GGUFFile.identity`)."""
from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 22   # 4 MiB reads: a 100+ GB GGUF is hashed without holding it in memory


def sha256_file(path: str, bar=None) -> str:
    """Hex sha256 of the file at `path`, read in CHUNK-byte pieces; `bar` (a tqdm bar) is advanced by the bytes read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return h.hexdigest()


def sha256_files(paths: list[str], progress: bool = False) -> list[str]:
    """sha256_file of each path; `progress`: one tqdm bar (bytes, on stderr) over all of them."""
    if not progress:
        return [sha256_file(p) for p in paths]
    from tqdm import tqdm

    with tqdm(total=sum(os.path.getsize(p) for p in paths), unit="B", unit_scale=True, unit_divisor=1024,
              desc="sha256", leave=False) as bar:
        return [sha256_file(p, bar) for p in paths]
