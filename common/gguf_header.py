"""Parse and validate a GGUF file's header (metadata key-values and tensor infos) from a memory map.

The layout is GGUF v2/v3 (ggml/docs/gguf.md); the checks are llama.cpp's own (ggml/src/gguf.cpp
`gguf_init_from_file_impl`): every length and count is bounded by the bytes left in the file before anything is
read or allocated, keys and tensor names are unique, value and tensor types are known, a tensor has at most 4
dimensions whose element count fits int64 and whose rows are whole blocks, `general.alignment` is a power of two
(u32), and the tensors are stored in order, each at the padded end of the previous one, inside the file.

gguf-py provides the type tables (`GGUFValueType`, `GGMLQuantizationType`, `GGML_QUANT_SIZES`); its `GGUFReader` is
not used here: it builds one numpy view per array element (about 24 s for the header of a GLM GGUF with a 151k-token
vocabulary on a loaded 2-core machine, where this parser takes a fraction of a second) and, on an array count that
runs past the end of the file, loops without end. A malformed header raises `NextnError` naming the file, the key or
tensor, and the byte offset, never anything else.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from .errors import NextnError, shown

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32          # GGUF_DEFAULT_ALIGNMENT
MAX_DIMS = 4                    # GGML_MAX_DIMS
MAX_NAME = 64                   # GGML_MAX_NAME: a tensor name is shorter
MAX_STRING = 1 << 30            # GGUF_MAX_STRING_LENGTH
MAX_ARRAY = 1 << 30             # GGUF_MAX_ARRAY_ELEMENTS
INT64_MAX = (1 << 63) - 1
_U64 = struct.Struct("<Q")

# GGUF value types (gguf-py GGUFValueType): struct code of the scalars; 8 = string, 9 = array.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
       10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY, UINT32 = 8, 9, 4
# Typed views of tensor data, as gguf-py's reader gives them (other types are byte rows: one block row per row).
_TYPED = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16, "I32": np.int32,
          "I64": np.int64}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: `shape` in ggml `ne` order (ne[0] contiguous), `tensor_type` a gguf-py
    GGMLQuantizationType, `data_offset` absolute in the file, `n_bytes` of data; `data` is a view of the mapped
    bytes shaped as gguf-py's reader shapes it (typed for F32/F16/..., else uint8 rows of whole blocks)."""
    name: str
    tensor_type: object
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    _buf: object = field(repr=False, compare=False)

    @property
    def data(self) -> np.ndarray:
        np_shape = tuple(reversed(self.shape)) or (1,)
        typed = _TYPED.get(self.tensor_type.name)
        if typed is not None:
            return np.frombuffer(self._buf, typed, self.n_elements, self.data_offset).reshape(np_shape)
        raw = np.frombuffer(self._buf, np.uint8, self.n_bytes, self.data_offset)
        return raw.reshape(*np_shape[:-1], -1) if self.n_bytes else raw


@dataclass(frozen=True)
class Header:
    version: int
    fields: dict            # key -> value (str, int, float, bool, or a list of them); None where not valid UTF-8
    bad_utf8: dict          # key -> where the invalid UTF-8 is (a message fragment)
    tensors: dict           # name -> TensorInfo, in file order
    alignment: int
    data_start: int         # first byte of the tensor data section (= header length, padding included)


class _Cursor:
    """Bounds-checked little-endian reads from `buf` (a memory map) of `size` bytes."""

    def __init__(self, path: str, buf, size: int):
        self.path, self.buf, self.size, self.off = path, buf, size, 0

    def fail(self, what: str, at: int | None = None) -> NextnError:
        return NextnError(f"{self.path}: {what} (at byte {self.off if at is None else at} of {self.size}); "
                          f"file truncated or corrupt")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.off:
            raise self.fail(f"{what} needs {n} bytes, {self.size - self.off} remain")

    def scalar(self, code: str, what: str):
        n = struct.calcsize("<" + code)
        self.need(n, what)
        (v,) = struct.unpack_from("<" + code, self.buf, self.off)
        self.off += n
        return v

    def string_bytes(self, what: str) -> bytes:
        n = self.scalar("Q", f"length of {what}")
        if n > MAX_STRING:
            raise self.fail(f"{what} has length {n}, more than the {MAX_STRING} bytes a GGUF string may hold", self.off - 8)
        self.need(n, what)
        s = bytes(self.buf[self.off:self.off + n])
        self.off += n
        return s


def _text(cur: _Cursor, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise cur.fail(f"{what} is not valid UTF-8") from None


def _value(cur: _Cursor, vtype: int, key: str):
    """One metadata value of type `vtype`; returns (value, invalid-UTF-8 note or None)."""
    if vtype in _SCALAR:
        return cur.scalar(_SCALAR[vtype], f"value of '{shown(key)}'"), None
    if vtype == STRING:
        raw = cur.string_bytes(f"value of '{shown(key)}'")
        try:
            return raw.decode("utf-8"), None
        except UnicodeDecodeError:
            return None, "is not valid UTF-8"
    if vtype != ARRAY:
        raise cur.fail(f"metadata key '{shown(key)}' has unknown value type {vtype}", cur.off - 4)
    etype = cur.scalar("I", f"element type of '{shown(key)}'")
    n = cur.scalar("Q", f"element count of '{shown(key)}'")
    if etype == ARRAY or (etype not in _SCALAR and etype != STRING):
        raise cur.fail(f"metadata key '{shown(key)}' is an array of unsupported type {etype}", cur.off - 12)
    min_size = 8 if etype == STRING else np.dtype(_NP[etype]).itemsize
    if n > MAX_ARRAY or n * min_size > cur.size - cur.off:
        raise cur.fail(f"metadata key '{shown(key)}' declares {n} array elements, more than the "
                       f"{cur.size - cur.off} bytes left can hold", cur.off - 8)
    if etype != STRING:
        arr = np.frombuffer(cur.buf, _NP[etype], n, cur.off)
        cur.off += n * min_size
        return arr.tolist(), None
    # The hot loop of a real header (150k+ tokens and merges): cur.string_bytes inlined.
    raws, buf, off, size, unpack = [], cur.buf, cur.off, cur.size, _U64.unpack_from
    for i in range(n):
        if off + 8 > size:
            cur.off = off
            raise cur.fail(f"length of element {i} of '{shown(key)}' needs 8 bytes, {size - off} remain")
        (slen,) = unpack(buf, off)
        off += 8
        if slen > min(MAX_STRING, size - off):
            cur.off = off - 8
            raise cur.fail(f"element {i} of '{shown(key)}' has length {slen}, more than the {size - off} bytes left")
        raws.append(buf[off:off + slen])
        off += slen
    cur.off = off
    try:
        return [r.decode("utf-8") for r in raws], None
    except UnicodeDecodeError:
        out = [r.decode("utf-8", "replace") for r in raws]
        i = next(i for i, r in enumerate(raws) if out[i].encode() != r)
        return [None if out[j].encode() != r else out[j] for j, r in enumerate(raws)], f"element {i} is not valid UTF-8"


def parse(path: str, buf, size: int) -> Header:
    """Parse and validate the header of the GGUF at `path`, mapped as `buf` (`size` bytes). Raises NextnError."""
    import gguf

    cur = _Cursor(path, buf, size)
    if size < 4 or bytes(buf[:4]) != MAGIC:
        raise NextnError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
    cur.off = 4
    version = cur.scalar("I", "version")
    if version and not version & 0xFFFF:
        raise NextnError(f"{path}: GGUF version {version:#x}: a big-endian file, or corrupt; nextn reads "
                         f"little-endian GGUF files")
    if version not in VERSIONS:
        raise NextnError(f"{path}: GGUF version {version}; nextn reads versions {' and '.join(map(str, VERSIONS))}"
                         + (" (v1 is no longer supported, as in llama.cpp)" if version == 1 else ""))
    n_tensors = cur.scalar("q", "tensor count")
    n_kv = cur.scalar("q", "metadata key-value count")
    left = size - cur.off
    if not 0 <= n_kv <= left // 14:            # a pair is at least 8 + 1 (key) + 4 (type) + 1 (value) bytes
        raise cur.fail(f"header declares {n_kv} metadata key-values, more than the {left} bytes left can hold", 16)
    if not 0 <= n_tensors <= left // 25:       # a tensor info is at least 8 + 1 (name) + 4 + 4 + 8 bytes
        raise cur.fail(f"header declares {n_tensors} tensors, more than the {left} bytes left can hold", 8)

    fields, bad = {}, {}
    for i in range(n_kv):
        key = _text(cur, cur.string_bytes(f"key {i}"), f"metadata key {i}")
        if not key:
            raise cur.fail(f"metadata key {i} is empty")
        if key in fields:
            raise cur.fail(f"metadata key '{shown(key)}' appears twice")
        vtype = cur.scalar("I", f"value type of '{shown(key)}'")
        fields[key], note = _value(cur, vtype, key)
        if note:
            bad[key] = note
        if key == "general.alignment" and vtype != UINT32:
            raise cur.fail(f"metadata key 'general.alignment' has value type {vtype}, expected {UINT32} (u32)")
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise NextnError(f"{path}: metadata key 'general.alignment' = {alignment}, expected a power of two")

    infos = []
    seen = set()
    for i in range(n_tensors):
        at = cur.off
        name = _text(cur, cur.string_bytes(f"name of tensor {i}"), f"name of tensor {i}")
        if len(name.encode()) >= MAX_NAME:
            raise cur.fail(f"tensor {i} name '{shown(name)}' is {len(name.encode())} bytes, expected fewer than {MAX_NAME}", at)
        if name in seen:
            raise cur.fail(f"tensor '{shown(name)}' appears twice", at)
        seen.add(name)
        n_dims = cur.scalar("I", f"dimension count of tensor '{shown(name)}'")
        if n_dims > MAX_DIMS:
            raise cur.fail(f"tensor '{shown(name)}' has {n_dims} dimensions, at most {MAX_DIMS} allowed", cur.off - 4)
        ne = tuple(cur.scalar("q", f"dimension {j} of tensor '{shown(name)}'") for j in range(n_dims))
        if any(d < 0 for d in ne):
            raise cur.fail(f"tensor '{shown(name)}' has ggml shape {list(ne)} with a negative dimension")
        n_el = 1
        for d in ne:
            n_el *= d
        if n_el > INT64_MAX:
            raise cur.fail(f"tensor '{shown(name)}' has ggml shape {list(ne)}: {n_el} elements overflow int64")
        raw_type = cur.scalar("I", f"type of tensor '{shown(name)}'")
        try:
            ttype = gguf.GGMLQuantizationType(raw_type)
            block, type_size = gguf.GGML_QUANT_SIZES[ttype]
        except (ValueError, KeyError):
            raise cur.fail(f"tensor '{shown(name)}' has unknown ggml type {raw_type}", cur.off - 4) from None
        row = ne[0] if ne else 1
        if row % block:
            raise cur.fail(f"tensor '{shown(name)}' of type {ttype.name} has rows of {row} elements, not a multiple of "
                           f"its block size {block}")
        offset = cur.scalar("Q", f"data offset of tensor '{shown(name)}'")
        infos.append((name, ttype, ne, n_el, n_el // block * type_size, offset))

    data_start = cur.off + (-cur.off % alignment)
    tensors, expected, prev = {}, 0, None
    for name, ttype, ne, n_el, nbytes, offset in infos:
        if offset != expected:
            after = (f"the end of tensor '{shown(prev[0])}' ({prev[1].name} {list(prev[2])}) padded to {alignment} bytes"
                     if prev else "the start of the data section")
            raise NextnError(f"{path}: tensor '{shown(name)}' has data offset {offset}, expected {expected} ({after}); "
                             f"file corrupt")
        prev = (name, ttype, ne)
        end = data_start + offset + nbytes
        if end > size:
            raise NextnError(f"{path}: tensor '{shown(name)}' extends past the end of the file ({end} > {size} bytes); "
                             f"file truncated")
        tensors[name] = TensorInfo(name, ttype, ne, n_el, nbytes, data_start + offset, buf)
        expected = offset + nbytes + (-nbytes % alignment)
    return Header(version, fields, bad, tensors, alignment, data_start)
