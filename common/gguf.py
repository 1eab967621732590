"""Reading and validating one GGUF file with gguf-py (the compiler reads hyper-parameters and checks tensors,
the runtime reads weights and tokenizer fields).

Shapes in nextn are row-major (numpy / PyTorch order): a GGUF matrix whose ggml `ne` is `{in, out}` is
`[out, in]` here, a 3-D expert tensor `{in, out, n_expert}` is `[n_expert, out, in]` (ggml's `ne[0]` is the
contiguous axis; gguf-py's `GGUFReader` reports `ne` order). Every error names the file and the key or tensor
and what was expected.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .errors import NextnError
from .hashing import file_sha256
from .quant import FORMATS, by_ggml_type

_GGUF_MAGIC = b"GGUF"

# F32 tensors load as float32 views; F16 / BF16 stay 16-bit where the compiler asked (nextn.common.quant), else
# they are widened to float32 at load; block-quantized types stay as their blocks (views, nothing repacked).
FLOAT_TYPES = ("F32", "F16", "BF16")


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


class GGUFFile:
    """A GGUF file opened through gguf-py's memory-mapped reader.

    The map is private copy-on-write (mode "c"): its pages are the page cache's until written, which nothing does,
    and its arrays are writable, which DLPack needs to hand them to the kernels without a copy.
    Raises NextnError when the file is missing, is not a GGUF, or is truncated.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise NextnError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise NextnError(f"{self.path}: is a directory, expected a GGUF file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != _GGUF_MAGIC:
            raise NextnError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        import gguf  # deferred: gguf-py import costs ~0.1 s

        try:
            reader = gguf.GGUFReader(self.path, "c")
        except Exception as e:  # gguf-py raises assorted errors on a cut-off header
            raise NextnError(f"{self.path}: cannot parse GGUF header ({type(e).__name__}: {e}); file truncated or corrupt") from None
        self._reader = reader
        self.fields: dict[str, object] = {}
        for key, field in reader.fields.items():
            try:
                self.fields[key] = field.contents()
            except Exception:  # an unreadable metadata value: keep the key, mark it
                self.fields[key] = None
        self.tensors = {t.name: t for t in reader.tensors}
        size = os.path.getsize(self.path)
        for t in reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise NextnError(f"{self.path}: tensor '{t.name}' extends past the end of the file "
                                 f"({end} > {size} bytes); file truncated")

    # -- metadata ---------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default=..., kind=None):
        """Metadata value of `key`; `kind` in (int, float, bool, str, list) checks the type."""
        if key not in self.fields:
            if default is ...:
                raise NextnError(f"{self.path}: metadata key '{key}' is missing")
            return default
        v = self.fields[key]
        if kind is not None:
            ok = (isinstance(v, kind) and not (kind is int and isinstance(v, bool))) or (kind is float and isinstance(v, int))
            if not ok:
                raise NextnError(f"{self.path}: metadata key '{key}' has value {v!r}, expected {kind.__name__}")
            if kind is float:
                v = float(v)
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
            raise NextnError(f"{self.path}: tensor '{name}' has ggml shape {list(reversed(got))}, expected {ne}")
        ttype = self.tensor_type(name)
        if ttype not in _supported_types():
            raise NextnError(f"{self.path}: tensor '{name}' has type {ttype}, which nextn does not support yet "
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

    def sha256(self) -> str:
        """Hex sha256 of the whole file (memoised per path, size and mtime: common.hashing.file_sha256)."""
        return file_sha256(self.path)
