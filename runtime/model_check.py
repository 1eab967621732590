"""Check that the GGUF files given at load time are the ones the artifact was compiled from."""
from __future__ import annotations

import json
import os

from .errors import NextnError


def cache_dir() -> str:
    d = os.environ.get("NEXTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nextn")
    os.makedirs(d, exist_ok=True)
    return d


def file_sha256(path: str) -> str:
    """sha256 of a (possibly huge) model file, remembered per (path, size, mtime) so it is hashed once."""
    from .artifact import sha256_file

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


def check_model_files(artifact, files) -> None:
    m = artifact.manifest
    roles = {"model": files.main, "draft": files.draft}
    for entry in m["model_files"]:
        f = roles.get(entry["role"])
        if f is None:
            if entry["role"] == "draft":
                continue
            raise NextnError(f"{artifact.path}: the artifact was compiled with a {entry['role']} file, none given")
        if os.path.getsize(f.path) != entry["size"] or file_sha256(f.path) != entry["sha256"]:
            raise NextnError(f"{f.path}: sha256 differs from the file this artifact was compiled from "
                             f"({entry['path']}); recompile with `nextn compile`")
    if files.config.to_json() != m["hparams"] and {**files.config.to_json(), "n_layer_nextn": 1} != m["hparams"]:
        raise NextnError(f"{files.main.path}: hyper-parameters differ from the artifact's manifest; recompile")
