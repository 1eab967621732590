"""The one door into the compiler from outside it: the runtime's compile-and-cache of a GGUF, and what the `nextn`
CLI's compile / tune / tuning commands run. Nothing else in the runtime imports the compiler
(tests/test_imports.py), and it imports this module only where a command needs it, so running an artifact
directory loads no compiler module.
"""
from __future__ import annotations

import os

from nextn.common.compile_options import CompileOptions, compiler_fingerprint
from nextn.common.errors import NextnError
from nextn.common.manifest import MANIFEST, read_manifest
from nextn.common.paths import cache_dir

from .compile import compile_model

__all__ = ["CompileOptions", "cache_path", "compile_model", "compiled_artifact", "compiler_fingerprint", "tune",
           "tune_offline", "tuning_export", "tuning_import", "tuning_merge", "tuning_ingest", "tuning_show"]


# -- compile and cache -------------------------------------------------------------------------------------------
def cache_path(model: str, options: CompileOptions = CompileOptions(), draft: str | None = None) -> str:
    """Where `model` (+ MTP-only `draft`) compiled with `options` is cached: the nextn cache's `artifacts` folder,
    under `options.cache_key` (the files' header identity, the options, nextn version and compiler fingerprint; a
    copy of a file is the same entry: the runtime passes the GGUF's own path at load). Raises NextnError for a
    missing or malformed file, a bad --arch, KV cache type or a missing tuning log."""
    return os.path.join(cache_dir(), "artifacts", options.cache_key(model, draft))


def compiled_artifact(model: str, options: CompileOptions = CompileOptions(), draft: str | None = None,
                      log=None) -> str:
    """The artifact directory of `model` (+ MTP-only `draft`) compiled with `options` (common/compile_options.py),
    compiled on first use and cached at `cache_path`. A damaged cache entry is rebuilt. Raises NextnError for
    missing files and bad input."""
    out = cache_path(model, options, draft)
    if os.path.isfile(os.path.join(out, MANIFEST)):
        try:
            read_manifest(out)
            return out
        except NextnError:
            pass  # a stale or damaged cache entry: rebuild it
    compile_model(model, out, options, draft=draft, log=log or (lambda *_: None))
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
