"""Make modified copies of a fixture GGUF: broken ones by patching bytes of its header (same length, so offsets
hold), and valid ones with added or changed metadata keys or tensors, or split into shards, through gguf-py's
writer (`with_metadata`, `copy_gguf`)."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


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
    """A valid copy with ne[0] of `tensor` changed (the tensor rewritten as F32 ones of the new shape)."""
    import gguf

    t = next(t for t in gguf.GGUFReader(src).tensors if t.name == tensor.decode())
    shape = [int(d) for d in reversed(t.shape.tolist())]
    shape[-1] = ne0
    return copy_gguf(src, dst, tensors={t.name: np.ones(shape, np.float32)})


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


def copy_gguf(src: Path, dst: Path, metadata: dict | None = None, tensors: dict | None = None, only=None,
            split_max_tensors: int = 0) -> Path:
    """Copy `src` to `dst` through gguf-py's writer (a valid GGUF): `metadata` {key: (value, GGUFValueType) or
    None to drop it} changes keys, `tensors` {name: float32 array (stored F32) or (raw bytes, GGMLQuantizationType)}
    replaces tensors, names the source lacks added after its tensors, `only` keeps just those tensor names (in the
    source's order). `split_max_tensors` > 0 writes a split GGUF as llama.cpp's
    gguf-split does (gguf-py's own split writer: DST_STEM-0000i-of-0000n.gguf, all metadata in the first shard,
    split.no / split.count / split.tensors.count in every shard); returns the first shard's path then."""
    import gguf

    metadata, tensors = dict(metadata or {}), dict(tensors or {})
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    writer = gguf.GGUFWriter(dst, arch=arch.contents() if arch else "", endianess=reader.endianess,
                             split_max_tensors=split_max_tensors)
    if arch is None:   # a later shard of a split GGUF has no general.architecture
        writer.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE, None)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in metadata:
            new = metadata.pop(field.name)
            if new is not None:
                writer.add_key_value(field.name, new[0], new[1])
                if field.name == gguf.Keys.General.ALIGNMENT:
                    writer.data_alignment = new[0]
            continue
        if field.name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for key, new in metadata.items():
        if new is not None:
            writer.add_key_value(key, new[0], new[1])
            if key == gguf.Keys.General.ALIGNMENT:   # the writer pads the tensor data to it
                writer.data_alignment = new[0]
    def put(name, new):
        if isinstance(new, tuple):
            writer.add_tensor(name, np.ascontiguousarray(new[0]), raw_dtype=new[1])
        else:
            writer.add_tensor(name, np.ascontiguousarray(new, np.float32))

    for t in reader.tensors:
        if only is not None and t.name not in only:
            continue
        if t.name in tensors:
            put(t.name, tensors.pop(t.name))
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for name, new in tensors.items():
        if only is None or name in only:
            put(name, new)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(Path(dst))[0]


def rewrite(src: Path, dst: Path, arch: str | None = None, remove=(), values: dict | None = None,
            drop_tensors=()) -> Path:
    """Copy `src` to `dst` with the architecture renamed to `arch` (every `OLD.` key prefix follows), keys in
    `remove` left out (names after the rename), `values` ({key: python value, incl. lists and bools}) set, and
    tensors in `drop_tensors` left out."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(src)
    old = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    new = arch or old
    values = dict(values or {})
    writer = gguf.GGUFWriter(dst, arch=new, endianess=reader.endianess)
    align = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if align is not None:
        writer.data_alignment = align.contents()
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        name = new + field.name[len(old):] if field.name.startswith(old + ".") else field.name
        if name in remove:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, values.pop(name, field.contents()), vtype, sub_type=sub)
    for name, v in values.items():
        if isinstance(v, bool):
            writer.add_bool(name, v)
        elif isinstance(v, int):
            writer.add_uint32(name, v)
        elif isinstance(v, float):
            writer.add_float32(name, v)
        elif isinstance(v, list):
            writer.add_array(name, v)
        else:
            writer.add_string(name, v)
    tensors = [t for t in reader.tensors if t.name not in drop_tensors]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(np.asarray(t.data), tensor_endianess=reader.endianess)
    writer.close()
    return dst
