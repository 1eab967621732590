"""`CompileOptions`: every option that shapes an artifact, in one frozen object passed whole from where it is
given (`nextn compile` / `run` / `bench` / `serve`, `nextn.runtime.load`, the server's ServeOptions, the tests'
artifact cache) to `compile_model` (compiler/entry.py `compiled_artifact`). It owns the compile-cache key (`key`,
`cache_key`) and its JSON form (`to_json` / `from_json`: what the reproducible child process receives);
`from_manifest` reads the options back from an artifact's manifest (common/manifest.py), including manifests written
before this object existed.

It lives in common, not in the compiler, because the runtime builds it too, and running an artifact directory
imports no compiler module (docs/gpu.md: a GPU machine gets only common + runtime); so do the facts its key
needs: the target names (`GPU_TARGETS`), the GPU arch lists (`parse_arches`), the tuning log's file name.
`compiler_fingerprint` hashes the compiler's sources by finding its folder, without importing it.

Not options: the model files (inputs), and how one compile runs and what it reports (`dump_ir`, `verify_model`,
`log`: arguments of `compile_model`), none of which changes the library or the entry points.
Validation (target, --arch, KV types) happens where a compile or a key needs it, with the messages it always had.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass

from .errors import NextnError
from .kv_types import DEFAULT as DEFAULT_KV, kv_type
from .versions import nextn_version, package_version

GPU_TARGETS = ("cuda", "rocm")   # scratch-holding ops as separate kernels there (to_relax.SPLIT_OPS)
CUDA_ARCHES = ("sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_103",
               "sm_120", "sm_120a")
ROCM_ARCHES = ("gfx906", "gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1200", "gfx1201")
DEFAULT_ARCHES = {"cuda": ["sm_80", "sm_90", "sm_120"], "rocm": ["gfx942"]}
TUNING_LOG_FILE = "log.json"     # LOG_DIR/log.json of `nextn tune` (compiler/tune/log.py)
# Fields whose None means "not asked": a compile takes the default, an artifact directory keeps its own (`asked`).
_ASKABLE = ("cache_type_k", "cache_type_v", "draft_vocab")


def parse_arches(target: str, arches) -> list[str]:
    """Normalise `--arch` values (repeatable and/or comma lists) for `target`; defaults when none given."""
    flat = [a.strip().lower() for x in (arches or []) for a in str(x).split(",") if a.strip()]
    if target not in ("cuda", "rocm"):
        if flat:
            raise NextnError(f"--arch {','.join(flat)}: the llvm target compiles for this CPU and takes no --arch")
        return []
    known = {"cuda": CUDA_ARCHES, "rocm": ROCM_ARCHES}[target]
    if not flat:
        return list(DEFAULT_ARCHES[target])
    out = []
    for a in flat:
        if target == "cuda" and re.fullmatch(r"\d+a?", a):
            a = "sm_" + a
        if a not in known:
            raise NextnError(f"--arch {a}: not a {target} architecture nextn builds for "
                             f"(expected one of {', '.join(known)})")
        if a not in out:
            out.append(a)
    return out


def tuning_log_file(path: str) -> str:
    """The log file of `path`: LOG_DIR/log.json, or `path` itself (FILE.json)."""
    return os.path.join(path, TUNING_LOG_FILE) if os.path.isdir(path) else path


@dataclass(frozen=True)
class CompileOptions:
    """Options of one compile; every field is part of the cache key (`key`). `nextn compile` flags in brackets.

    - `target` [--target]: llvm (this CPU), cuda, rocm (compiler/target.py TARGETS); `arches` [--arch]: GPU archs as
      given (repeatable or comma lists; `parse_arches` normalises them), () for the target's defaults.
    - `mtp_dense_attention` [--mtp-dense-attention]: glm-dsa's NextN block as dense MLA without an indexer
      (llama.cpp's graph_mtp); an option only the archs that declare it read (ModelSpec.compile_options).
    - `cache_type_k` / `cache_type_v` [-ctk / -ctv]: KV cache types (llama.cpp's: f32, f16, bf16, q8_0; glm-dsa's
      latent and indexer key caches take the K type; None: f16), fixed here because the kernels read the caches'
      storage (common/kv_types.py).
    - `draft_vocab` N [--spec-draft-vocab]: also the draft entries with a head of N token rows (graphs.reduce_head),
      whose weight the runtime gathers from the head tensor at load (buffer plan `rows`); 0: none.
    - `exact_matmul` [--exact-matmul] (llvm): float activations in every matmul; by default the CPU's K-quant /
      IQ4_XS / Q8_0 / IQ4_NL / MXFP4 matmuls take int8-quantized activation rows, as ggml-cpu does
      (compiler/lower/x86, nextn.common.quant.activation).
    - `split_kernels`: the GPU form of the kernels (lower/attention/; to_relax.SPLIT_OPS as separate kernels);
      None: on GPU targets only (tests set it on llvm to check the GPU form's arithmetic with serial threads: its
      integer-route matmuls too, lower/cuda/int8.py, unless exact_matmul; then no x86 kernel takes a matmul).
    - `cuda_graph` [--cuda-graph/--no-cuda-graph] (cuda): the one-row steps replay as CUDA graphs
      (lower/capture_graphs.py).
    - `tuning_log` [--tuning-log]: LOG_DIR or FILE.json of `nextn tune`: tuned kernels take its schedules and
      knobs (compiler/tune/apply.py); the key holds the log's content.

    `cache_type_k`, `cache_type_v`, `draft_vocab` given as None (their defaults) read as f16, f16, 0, and are "not
    asked" (`asked`): a GGUF compiles with the default, an artifact directory keeps what it was compiled with.
    Equality, the key and the JSON see only the values (equal options compile the same artifact).
    """
    target: str = "llvm"
    arches: tuple = ()
    mtp_dense_attention: bool = False
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    draft_vocab: int | None = None
    exact_matmul: bool = False
    split_kernels: bool | None = None
    cuda_graph: bool = True
    tuning_log: str | None = None

    def __post_init__(self):
        # Coerce what callers pass (a list of arches, None for a default KV type, a path-like log) to one spelling,
        # so that equal options compare and hash equal; remember which askable fields were left None.
        object.__setattr__(self, "_unasked", frozenset(n for n in _ASKABLE if getattr(self, n) is None))
        arches = self.arches
        coerced = {"arches": tuple(str(a) for a in ([arches] if isinstance(arches, str) else arches or ())),
                   "mtp_dense_attention": bool(self.mtp_dense_attention), "draft_vocab": int(self.draft_vocab or 0),
                   "cache_type_k": str(self.cache_type_k or DEFAULT_KV),
                   "cache_type_v": str(self.cache_type_v or DEFAULT_KV),
                   "exact_matmul": bool(self.exact_matmul), "cuda_graph": bool(self.cuda_graph),
                   "split_kernels": None if self.split_kernels is None else bool(self.split_kernels),
                   "tuning_log": os.fspath(self.tuning_log) if self.tuning_log else None}
        for k, v in coerced.items():
            object.__setattr__(self, k, v)

    # -- what the options mean ---------------------------------------------------------------------------------------
    def asked(self, name: str):
        """The value of `name` (cache_type_k, cache_type_v, draft_vocab) as the caller gave it, None where it gave
        None: what an artifact directory is checked against (runtime/model.py `LoadedModel.open`)."""
        if name not in _ASKABLE:
            raise ValueError(f"{name}: not one of {', '.join(_ASKABLE)}")
        return None if name in self._unasked else getattr(self, name)

    @property
    def split(self) -> bool:
        """Whether the kernels take their GPU form (lower/attention/; to_relax.SPLIT_OPS as separate kernels)."""
        return self.target in GPU_TARGETS if self.split_kernels is None else self.split_kernels

    @property
    def kernel_form(self) -> str:
        """The manifest's `kernel_form`: cpu, gpu, or gpu-emulated (the GPU kernels built for llvm)."""
        return "gpu" if self.target in GPU_TARGETS else "gpu-emulated" if self.split else "cpu"

    def arch_list(self) -> list[str]:
        """The normalised --arch list of the target (its defaults when none given). Raises NextnError for an arch
        the target does not build for, or any arch on llvm."""
        return parse_arches(self.target, self.arches)

    def kv_types(self) -> tuple[str, str]:
        """(type_k, type_v) as common/kv_types.py names them. Raises NextnError naming -ctk / -ctv otherwise."""
        return kv_type(self.cache_type_k, "--cache-type-k").name, kv_type(self.cache_type_v, "--cache-type-v").name

    def graph_options(self) -> dict:
        """The options the IR builders read (graphs.build_graphs; an arch takes those its ModelSpec declares)."""
        return {"mtp_dense_attention": self.mtp_dense_attention, "draft_vocab": self.draft_vocab}

    # -- cache key ---------------------------------------------------------------------------------------------------
    def key(self) -> str:
        """The options' part of a cache key, readable: `TARGET[_ARCH+ARCH][-mtp-dense][-dvN]-kv_K_V` and, for each
        other field off its default, `-exact`, `-split` / `-nosplit`, `-nocg`, `-tune<sha256 of the log, 12 hex>`.
        Equal options give equal keys; changing any field changes the key (split_kernels None and its target's
        default are the same option). Raises NextnError for a bad --arch, KV type or a missing tuning log."""
        arch_list = self.arch_list()
        k = f"{self.target}_{'+'.join(arch_list)}" if arch_list else self.target
        if self.mtp_dense_attention:
            k += "-mtp-dense"
        if self.draft_vocab:
            k += f"-dv{self.draft_vocab}"
        k += "-kv_{}_{}".format(*self.kv_types())
        if self.exact_matmul:
            k += "-exact"
        if self.split != (self.target in GPU_TARGETS):
            k += "-split" if self.split else "-nosplit"
        if not self.cuda_graph:
            k += "-nocg"
        if self.tuning_log:   # the log's content, not its name, decides the schedules
            k += f"-tune{_tuning_log_sha256(self.tuning_log)[:12]}"
        return k

    def cache_key(self, model: str, draft: str | None = None, at_path: bool = False) -> str:
        """The one compile-cache key of `model` (+ MTP-only `draft`) compiled with these options:
        `MODELID[-DRAFTID][-pPATHS]-KEY-VERSION-FINGERPRINT`: the files' header identity (common/gguf.py
        `GGUFFile.identity`, 16 hex: a copy of a file is the same model, an edited header another; no tensor byte is
        read), `key()`, the nextn version and `compiler_fingerprint()` (a changed compiler never reuses an artifact).
        `at_path`: also the files' absolute paths (12 hex of their sha256), for an artifact that is loaded by its
        directory, whose manifest refers to the files by path (the tests' cache, bench/bundle.py); the runtime's
        cache (entry.cache_path) passes the GGUF's path at load instead. Raises NextnError for a missing or malformed
        file and as `key()`."""
        from .gguf import GGUFFile

        files = [f for f in (model, draft) if f]
        k = "-".join(GGUFFile.open(os.fspath(f)).identity()[:16] for f in files)
        if at_path:
            paths = json.dumps([os.path.abspath(os.fspath(f)) for f in files])
            k += "-p" + hashlib.sha256(paths.encode()).hexdigest()[:12]
        return f"{k}-{self.key()}-{nextn_version()}-{compiler_fingerprint()}"

    # -- JSON --------------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """Every field, JSON types only (arches a list); `from_json(o.to_json()) == o`."""
        d = dataclasses.asdict(self)
        d["arches"] = list(self.arches)
        return d

    @classmethod
    def from_json(cls, d) -> "CompileOptions":
        """The options of a `to_json` dict; absent fields take their defaults. Raises NextnError for a non-object or
        an unknown field."""
        if not isinstance(d, dict):
            raise NextnError(f"compile options: expected a JSON object, got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        for k in d:
            if k not in names:
                raise NextnError(f"compile options: unknown field '{k}' (expected one of {', '.join(names)})")
        return cls(**d)

    @classmethod
    def from_manifest(cls, manifest: dict) -> "CompileOptions":
        """The options an artifact was compiled with, as its manifest (any schema-1 manifest, those written before
        this object included) records them: `target` {name, arches}, `options`, `kv_cache` {type_k, type_v} (absent:
        f32, what artifacts before KV types held), `draft_vocab`, `x86_kernels.activation_quant` /
        `gpu_kernels.activation_quant` (None: exact), `kernel_form`, `cuda_graph`, `tuning_log.path`. An option the
        arch ignores is not recorded, so it reads back as its default (mtp_dense_attention on glm4moe; draft_vocab
        without a NextN block)."""
        t = manifest["target"]
        recorded = manifest.get("options") or {}
        kc = manifest.get("kv_cache") or {}
        x86 = manifest.get("x86_kernels")
        form = manifest.get("kernel_form", "cpu")
        default_form = "gpu" if t["name"] in GPU_TARGETS else "cpu"
        tl = manifest.get("tuning_log")
        return cls(target=t["name"], arches=tuple(t.get("arches") or ()),
                   mtp_dense_attention=bool(recorded.get("mtp_dense_attention", False)),
                   cache_type_k=kc.get("type_k", "f32"), cache_type_v=kc.get("type_v", "f32"),
                   draft_vocab=int(manifest.get("draft_vocab") or 0),
                   exact_matmul=any(k is not None and k.get("activation_quant") is None
                                    for k in (x86, manifest.get("gpu_kernels"))),
                   split_kernels=None if form == default_form else form == "gpu-emulated",
                   cuda_graph=t["name"] != "cuda" or manifest.get("cuda_graph") is not None,
                   tuning_log=tl["path"] if tl else None)


def compiler_fingerprint() -> str:
    """Hash of the sources that shape an artifact (compiler, schedules, common: buffer layouts, manifest) and the
    TVM version: a changed compiler never reuses a stale artifact. The packages' folders are found, not imported
    (common imports no other nextn package); called only where a compile or its key is needed."""
    from importlib.util import find_spec

    h = hashlib.sha256()
    for pkg in ("nextn.compiler", "nextn.schedules", "nextn.common"):
        root = os.path.dirname(find_spec(pkg).origin)
        for d, _dirs, files in sorted(os.walk(root)):
            for fn in sorted(files):
                if fn.endswith(".py"):
                    with open(os.path.join(d, fn), "rb") as f:
                        h.update(fn.encode() + f.read())
    h.update(package_version("apache-tvm").encode())
    return h.hexdigest()[:12]


def _tuning_log_sha256(path: str) -> str:
    """sha256 of the tuning log file at `path` (LOG_DIR: its log.json), as the manifest's `tuning_log.sha256`."""
    from .hashing import sha256_file

    f = tuning_log_file(path)
    if not os.path.isfile(f):
        raise NextnError(f"{f}: no such tuning log")
    return sha256_file(f)
