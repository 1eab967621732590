"""The one door into the compiler from outside it: the runtime's compile-and-cache of a GGUF, and what the `nextn`
CLI's compile / tune / tuning commands run. Nothing else in the runtime imports the compiler
(tests/test_imports.py), and it imports this module only where a command needs it, so running an artifact
directory loads no compiler module.
"""
from __future__ import annotations

import os

from nextn.common.errors import NextnError
from nextn.common.gguf import GGUFFile
from nextn.common.manifest import MANIFEST, read_manifest
from nextn.common.paths import cache_dir
from nextn.common.versions import nextn_version, package_version

from .compile import compile_model

__all__ = ["cache_path", "compile_model", "compiled_artifact", "compiler_fingerprint", "tune", "tune_offline", "tuning_export",
           "tuning_import", "tuning_merge", "tuning_ingest", "tuning_show"]


# -- compile and cache -------------------------------------------------------------------------------------------
def compiler_fingerprint() -> str:
    """Hash of the sources that shape an artifact (compiler, schedules, common: buffer layouts, manifest) and the
    TVM version: a changed compiler never reuses a stale artifact."""
    import hashlib

    import nextn.common
    import nextn.compiler
    import nextn.schedules

    h = hashlib.sha256()
    for pkg in (nextn.compiler, nextn.schedules, nextn.common):
        root = os.path.dirname(pkg.__file__)
        for d, _dirs, files in sorted(os.walk(root)):
            for fn in sorted(files):
                if fn.endswith(".py"):
                    with open(os.path.join(d, fn), "rb") as f:
                        h.update(fn.encode() + f.read())
    h.update(package_version("apache-tvm").encode())
    return h.hexdigest()[:12]


def cache_path(model: str, target: str, draft: str | None = None, arches=None, mtp_dense_attention: bool = False,
               cache_type_k: str | None = None, cache_type_v: str | None = None, draft_vocab: int = 0) -> str:
    """Where `model` (+ MTP-only `draft`) compiled for `target` is cached: keyed by the files' header identity
    (common/gguf.py `GGUFFile.identity`: a copy of a file is the same entry, an edited header another; no byte of
    tensor data is read), target (+ arches, options, KV cache types: default f16, f16), nextn version and compiler
    fingerprint. Raises NextnError for a missing or malformed file or an unknown KV cache type."""
    from nextn.common.kv_types import DEFAULT, kv_type

    from .gpu_build import parse_arches

    key = GGUFFile.open(model).identity()[:16]
    if draft:
        key += "-" + GGUFFile.open(draft).identity()[:16]
    arch_list = parse_arches(target, arches)   # validates --arch (llvm takes none)
    target_key = f"{target}_{'+'.join(arch_list)}" if arch_list else target
    if mtp_dense_attention:   # a compile option changes the artifact: its own cache entry
        target_key += "-mtp-dense"
    if draft_vocab:           # --spec-draft-vocab N: the reduced draft entries (their rows are gathered at load)
        target_key += f"-dv{int(draft_vocab)}"
    type_k = kv_type(cache_type_k or DEFAULT, "--cache-type-k").name
    type_v = kv_type(cache_type_v or DEFAULT, "--cache-type-v").name
    target_key += f"-kv_{type_k}_{type_v}"
    return os.path.join(cache_dir(), "artifacts", f"{key}-{target_key}-{nextn_version()}-{compiler_fingerprint()}")


def compiled_artifact(model: str, target: str, draft: str | None = None, log=None, arches=None,
                      mtp_dense_attention: bool = False, cache_type_k: str | None = None,
                      cache_type_v: str | None = None, draft_vocab: int = 0) -> str:
    """The artifact directory of `model` (+ MTP-only `draft`) for `target` with KV cache types -ctk / -ctv
    (default f16, f16) and `draft_vocab` (--spec-draft-vocab N; 0: none), compiled on first use and cached at
    `cache_path`. A damaged cache entry is rebuilt. Raises
    NextnError for missing files and bad input."""
    from nextn.common.kv_types import DEFAULT, kv_type

    type_k = kv_type(cache_type_k or DEFAULT, "--cache-type-k").name
    type_v = kv_type(cache_type_v or DEFAULT, "--cache-type-v").name
    out = cache_path(model, target, draft, arches, mtp_dense_attention, type_k, type_v, draft_vocab)
    if os.path.isfile(os.path.join(out, MANIFEST)):
        try:
            read_manifest(out)
            return out
        except NextnError:
            pass  # a stale or damaged cache entry: rebuild it
    compile_model(model, out, target=target, draft=draft, log=log or (lambda *_: None), arches=arches,
                  mtp_dense_attention=mtp_dense_attention, cache_type_k=type_k, cache_type_v=type_v,
                  draft_vocab=draft_vocab)
    return out


# -- tuning ------------------------------------------------------------------------------------------------------
def tune(model: str, out_dir: str, **options) -> dict:
    """`nextn tune` on this machine: compiler/tune/run.py `tune_model`; returns the log (also in out_dir)."""
    from .tune.run import tune_model

    os.makedirs(out_dir, exist_ok=True)
    return tune_model(model, out_dir, **options)


def tune_offline(model: str, out_dir: str, **options) -> dict:
    """`nextn tune --offline DIR`: sample and build candidates (compiler/tune/offline.py `gen`)."""
    from .tune.offline import gen

    return gen(model, out_dir, **options)


def tuning_export(log_dir: str, out: str) -> int:
    """LOG_DIR's log as one JSON file (best record per workload and target); returns the record count."""
    from .tune import log as tlog

    book = tlog.merge([tlog.read(log_dir)])
    tlog.write(book, out if out.endswith(".json") else out + ".json")
    return len(book["records"])


def tuning_import(file: str, out: str) -> tuple[int, int]:
    """Validate FILE.json and merge it into LOG_DIR `out`; returns (records imported, records in out)."""
    from .tune import log as tlog

    new = tlog.read(file)
    have = tlog.read(out) if os.path.exists(os.path.join(out, tlog.LOG_FILE)) else tlog.empty_log()
    book = tlog.merge([have, new])
    tlog.write(book, out)
    return len(new["records"]), len(book["records"])


def tuning_merge(log_dirs, out: str) -> int:
    """Merge logs into `out`, keeping the fastest record per workload and target; returns the record count."""
    from .tune import log as tlog

    book = tlog.merge([tlog.read(d) for d in log_dirs])
    tlog.write(book, out)
    return len(book["records"])


def tuning_ingest(cand_dir: str, out: str, log=print) -> int:
    """Measured offline candidates → records in LOG_DIR `out` (only those beating the default); returns the count."""
    from .tune.offline import ingest

    return len(ingest(cand_dir, out, log=log)["records"])


def tuning_show(path: str) -> dict:
    """The validated log at `path` (LOG_DIR or FILE.json), for printing."""
    from .tune import log as tlog

    return tlog.read(path)
