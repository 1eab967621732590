"""Reading and validating a GGUF model — one file, or the shards of a split GGUF — memory-mapped (the compiler
reads hyper-parameters and checks tensors, the runtime reads weights and tokenizer fields).

Shapes in nextn are row-major (numpy / PyTorch order): a GGUF matrix whose ggml `ne` is `{in, out}` is
`[out, in]` here, a 3-D expert tensor `{in, out, n_expert}` is `[n_expert, out, in]` (ggml's `ne[0]` is the
contiguous axis). Every error names the file and the key or tensor and what was expected. The header parser and
its checks are `gguf_header.py`; split GGUFs `gguf_split.py`.

A model is identified by its headers, not by its every byte (`identity`): what an artifact is compiled from is the
metadata and the tensor table (names, types, shapes, offsets); the weights are read from the file at load. So a
copy of the file is the same model (the compile cache is reused), an edit of the metadata or of the tensor table
(a changed key, a retyped or reshaped tensor) is another model (recompiled), and new weight bytes under the same
header are read as they are. `sha256()` reads every byte, only where asked (`nextn compile --verify-model`).
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from . import gguf_split
from .errors import NextnError, shown
from .gguf_header import parse
from .quant import FORMATS, by_ggml_type

# F32 tensors load as float32 views; F16 / BF16 stay 16-bit where the compiler asked (nextn.common.quant), else
# they are widened to float32 at load; block-quantized types stay as their blocks (views, nothing repacked).
FLOAT_TYPES = ("F32", "F16", "BF16")
MADV_WILLNEED, MADV_POPULATE_READ = 3, 22     # <sys/mman.h> (MADV_POPULATE_READ: Linux >= 5.14)
POPULATE_CHUNK = 32 << 20                       # bytes per madvise call (`_Shard.populate`)
POPULATED = ("populate", "willneed", "none")   # what `GGUFFile.populate` did, best first


def weakest(results) -> str:
    """The least done of several `populate` results ("none" for no results)."""
    return max(results, key=POPULATED.index, default="none")


def _supported_types() -> tuple[str, ...]:
    return FLOAT_TYPES + tuple(f.ggml_type for f in FORMATS.values())


@dataclass(frozen=True)
class Weight:
    """One tensor as stored for the kernels.

    `kind` is "f32" (one float32 array of the logical shape) or a format's kind (e.g. "q4_k", "bf16"), whose
    arrays are that format's buffers (nextn.common.quant). Arrays that keep the file's layout are views of the
    mapped file (no copy); widened float32 arrays are new.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    arrays: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


class _Shard:
    """One GGUF file, mapped copy-on-write (pages are the page cache's until written, which nothing does; the
    arrays are writable, which DLPack needs to hand them to kernels without a copy), and its parsed header."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.exists(path):
            raise NextnError(f"{path}: no such file")
        if os.path.isdir(path):
            raise NextnError(f"{path}: is a directory, expected a GGUF file")
        try:
            with open(path, "rb") as f:
                self.size = os.fstat(f.fileno()).st_size
                if self.size < 4:
                    raise NextnError(f"{path}: not a GGUF file ({self.size} bytes); file empty or truncated")
                self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as e:
            raise NextnError(f"{path}: cannot read ({e.strerror})") from None
        self.header = parse(path, self.buf, self.size)

    def populate(self) -> str:
        """Read the file's pages into the page cache and map them into this process (`GGUFFile.populate`)."""
        base = np.frombuffer(self.buf, np.uint8).ctypes.data
        libc = ctypes.CDLL(None, use_errno=True)        # a CDLL call releases the GIL while it runs
        for advice, name in ((MADV_POPULATE_READ, "populate"), (MADV_WILLNEED, "willneed")):
            # in POPULATE_CHUNK pieces: each call holds the process's mmap lock, which an allocation meanwhile
            # (the KV buffers, a prefill's workspace) waits for
            for off in range(0, self.size, POPULATE_CHUNK):
                n = min(POPULATE_CHUNK, self.size - off)
                if libc.madvise(ctypes.c_void_p(base + off), ctypes.c_size_t(n), advice) != 0:
                    break
            else:
                return name
        return "none"

    def header_digest(self) -> bytes:
        """sha256 of (file size, header bytes up to the tensor data): what an artifact depends on."""
        h = hashlib.sha256(struct.pack("<Q", self.size))
        h.update(memoryview(self.buf)[: min(self.header.data_start, self.size)])
        return h.digest()


def _stat_keys(paths) -> tuple | None:
    try:
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in map(os.stat, paths))
    except OSError:
        return None


class GGUFFile:
    """A GGUF model opened by its path — for a split GGUF the first shard's, and the other shards are found by
    name and checked (gguf_split.py). `fields`: the metadata (of the first shard); `tensors`: name → TensorInfo of
    every shard. Raises NextnError when a file is missing, is not a GGUF, is truncated or corrupt, or a shard is
    missing or belongs to another split."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        first = _Shard(self.path)
        self.shards = [first]
        count = gguf_split.split_count(self.path, first.header.fields)
        if count > 1:
            for no, sp in enumerate(gguf_split.shard_paths(self.path, count)[1:], start=1):
                if not os.path.isfile(sp):
                    raise NextnError(f"{sp}: no such file (shard {no + 1} of {count} of the split GGUF "
                                     f"{os.path.basename(self.path)})")
                s = _Shard(sp)
                gguf_split.check_shard(sp, s.header.fields, no, count, self.path)
                self.shards.append(s)
        self.fields: dict[str, object] = dict(first.header.fields)
        self._bad_utf8 = dict(first.header.bad_utf8)
        self.tensors = {}
        self._shard_of = {}
        for s in self.shards:
            for name, t in s.header.tensors.items():
                if name in self.tensors:
                    raise NextnError(f"{s.path}: tensor '{shown(name)}' is also in {self._shard_of[name].path}; a shard "
                                     f"is from another split")
                self.tensors[name] = t
                self._shard_of[name] = s
        if count > 1:
            want = first.header.fields.get(gguf_split.KEY_TENSORS)
            if want != len(self.tensors):
                raise NextnError(f"{self.path}: '{gguf_split.KEY_TENSORS}' = {want!r}, but the {count} shards hold "
                                 f"{len(self.tensors)} tensors; a shard is from another split")

    _opened: dict = {}       # `open`'s cache: path -> (the files' stat keys, GGUFFile), the last OPEN_CACHE paths
    OPEN_CACHE = 4

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFFile":
        """GGUFFile(path), parsed once per process while its files are unchanged (same inode, size, mtime): the
        compile cache's key (`compiler/entry.py`) and the runtime's weights (`runtime/weights.py`) read the same
        header, which takes 0.2 s for a 151552-token vocabulary."""
        path = os.fspath(path)
        hit = cls._opened.get(path)
        if hit is not None and hit[0] == _stat_keys(hit[1].paths):
            return hit[1]
        f = cls(path)
        cls._opened.pop(path, None)
        cls._opened[path] = (_stat_keys(f.paths), f)
        while len(cls._opened) > cls.OPEN_CACHE:
            cls._opened.pop(next(iter(cls._opened)))
        return f

    @property
    def paths(self) -> list[str]:
        """Every file of the model: the path, or the shards of a split GGUF in order."""
        return [s.path for s in self.shards]

    @property
    def size(self) -> int:
        """Bytes of every file of the model together."""
        return sum(s.size for s in self.shards)

    def populate(self) -> str:
        """Map every page of every shard into this process ahead of its first use, reading what the page cache does
        not hold, as llama.cpp's loader does (src/llama-mmap.cpp: the file is mapped with MAP_POPULATE): the first
        prefill that touches every routed expert then takes no page faults (0.3 s per 6.6 GB with the file cached,
        seconds from disk). madvise(MADV_POPULATE_READ); where the kernel lacks it (before Linux 5.14),
        MADV_WILLNEED (read-ahead only). Blocking for seconds on a large uncached file; the GIL is released.
        Returns what was done: "populate", "willneed" or "none" (both refused; nothing is lost either way)."""
        return weakest([s.populate() for s in self.shards])

    def identity(self) -> str:
        """Hex id of the model from its headers (every shard's size and header bytes, tensor data excluded): equal
        for copies, different after any change of metadata, tensor table or size (module docstring)."""
        h = hashlib.sha256(b"nextn-gguf-identity-1")
        for s in self.shards:
            h.update(s.header_digest())
        return h.hexdigest()

    def path_of(self, name: str) -> str:
        """The file that holds tensor `name` (a shard of a split GGUF)."""
        return self._shard_of[name].path

    # -- metadata ---------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default=..., kind=None):
        """Metadata value of `key`; `kind` in (int, float, bool, str, list) checks the type (a float must be finite:
        a NaN or infinite hyper-parameter only makes NaN logits)."""
        if key not in self.fields:
            if default is ...:
                raise NextnError(f"{self.path}: metadata key '{key}' is missing")
            return default
        if key in self._bad_utf8:
            raise NextnError(f"{self.path}: metadata key '{key}' {self._bad_utf8[key]}")
        v = self.fields[key]
        if kind is not None:
            ok = (isinstance(v, kind) and not (kind is int and isinstance(v, bool))) or (kind is float and isinstance(v, int))
            if not ok:
                raise NextnError(f"{self.path}: metadata key '{key}' has value {shown(v if not isinstance(v, str) else repr(v))}, "
                                 f"expected {kind.__name__}")
            if kind is float:
                v = float(v)
                if not math.isfinite(v):
                    raise NextnError(f"{self.path}: metadata key '{key}' has value {v}, expected a finite number")
        return v

    # -- tensors ----------------------------------------------------------------------------------
    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def tensor_type(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Row-major shape (reversed ggml ne)."""
        return tuple(int(x) for x in reversed(list(self.tensors[name].shape)))

    def check_tensor(self, name: str, shape: tuple[int, ...], what: str = "") -> None:
        if name not in self.tensors:
            raise NextnError(f"{self.path}: tensor '{name}' is missing{(' (' + what + ')') if what else ''}")
        got = self.tensor_shape(name)
        if got != tuple(shape):
            ne = list(reversed(shape))
            raise NextnError(f"{self.path_of(name)}: tensor '{name}' has ggml shape {list(reversed(got))}, expected {ne}")
        ttype = self.tensor_type(name)
        if ttype not in _supported_types():
            raise NextnError(f"{self.path_of(name)}: tensor '{name}' has type {ttype}, which nextn does not support yet "
                             f"(supported: {', '.join(_supported_types())})")

    def load(self, name: str, quantized: bool = True) -> Weight:
        """Tensor `name` in the form the kernels consume (see `Weight`): views of the mapped file where the kernels
        read the file's layout (every format when `quantized`, F32 always), else dequantized to float32 by gguf-py."""
        import gguf

        t = self.tensors[name]
        shape = self.tensor_shape(name)
        ttype = t.tensor_type.name
        raw = np.asarray(t.data)
        fmt = by_ggml_type(ttype)
        if fmt is not None and quantized:
            return Weight(name, fmt.kind, shape, fmt.pack(raw, shape))
        if ttype == "F32":
            return Weight(name, "f32", shape, (raw.reshape(-1).view(np.float32).reshape(shape),))
        arr = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
        return Weight(name, "f32", shape, (np.ascontiguousarray(arr),))

    def sha256(self, progress: bool = False) -> list[str]:
        """Hex sha256 of every file of the model (the shards in order), reading every byte; `progress`: a tqdm bar."""
        from .hashing import sha256_files

        return sha256_files(self.paths, progress=progress)
