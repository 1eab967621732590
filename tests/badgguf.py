"""Make modified copies of a fixture GGUF: broken ones by patching bytes of its header (same length, so offsets
hold), and ones with added or changed metadata keys through gguf-py's writer (`with_metadata`)."""
from __future__ import annotations

import struct
from pathlib import Path


def _header(path: Path) -> bytearray:
    return bytearray(path.read_bytes())


def replace_once(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    assert len(old) == len(new)
    data = _header(src)
    i = data.find(old)
    assert i >= 0, old
    data[i:i + len(old)] = new
    dst.write_bytes(bytes(data))
    return dst


def set_arch(src: Path, dst: Path, arch: bytes) -> Path:
    """Overwrite the value of general.architecture with `arch` (same length as the original)."""
    data = _header(src)
    key = b"general.architecture"
    i = data.find(key) + len(key)
    (vtype,) = struct.unpack_from("<I", data, i)
    (n,) = struct.unpack_from("<Q", data, i + 4)
    assert vtype == 8 and n == len(arch)
    data[i + 12:i + 12 + n] = arch
    dst.write_bytes(bytes(data))
    return dst


def set_first_dim(src: Path, dst: Path, tensor: bytes, ne0: int) -> Path:
    """Change ne[0] of `tensor` in the tensor-info table (a smaller value keeps the data in bounds)."""
    data = _header(src)
    i = data.find(struct.pack("<Q", len(tensor)) + tensor)
    assert i >= 0
    j = i + 8 + len(tensor)
    (n_dims,) = struct.unpack_from("<I", data, j)
    assert n_dims >= 1
    struct.pack_into("<Q", data, j + 4, ne0)
    dst.write_bytes(bytes(data))
    return dst


def truncate(src: Path, dst: Path, fraction: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * fraction)])
    return dst


def with_metadata(src: Path, dst: Path, values: dict) -> Path:
    """Copy `src` to `dst` with metadata `values` ({key: python value}: str, float or int) added or replaced;
    tensors are copied unchanged (gguf-py's gguf_new_metadata)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    kinds = {str: gguf.GGUFValueType.STRING, float: gguf.GGUFValueType.FLOAT32, int: gguf.GGUFValueType.UINT32}
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    align = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if align is not None:
        writer.data_alignment = align.contents()
    copy_with_new_metadata(reader, writer, {k: MetadataDetails(kinds[type(v)], v) for k, v in values.items()}, [])
    return dst
