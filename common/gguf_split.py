"""Split GGUFs as llama.cpp's gguf-split writes them (tools/gguf-split/gguf-split.cpp): `NAME-00001-of-0000N.gguf`
... `NAME-0000N-of-0000N.gguf`, each a complete GGUF holding some of the tensors; the first holds all the metadata,
every shard holds `split.no` (u16, 0-based), `split.count` (u16) and `split.tensors.count` (i32, the total).

A model is opened by its first shard, and the others are found by name, as llama.cpp's loader does
(src/llama-model-loader.cpp `llama_get_list_splits`, src/llama.cpp `llama_split_path` / `llama_split_prefix`).
"""
from __future__ import annotations

import os

from .errors import NextnError

KEY_NO, KEY_COUNT, KEY_TENSORS = "split.no", "split.count", "split.tensors.count"


def shard_path(prefix: str, no: int, count: int) -> str:
    """llama_split_path: the path of shard `no` (0-based) of `count`."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def shard_paths(first: str, count: int) -> list[str]:
    """Every shard's path, from the first shard's (llama_split_prefix: it must end in -00001-of-{count:05d}.gguf)."""
    suffix = f"-00001-of-{count:05d}.gguf"
    if not first.endswith(suffix) or len(first) == len(suffix):
        raise NextnError(f"{first}: declares {KEY_COUNT} = {count}, but its name does not end in '{suffix}', so "
                         f"the other shards cannot be found (llama.cpp's gguf-split names)")
    prefix = first[: -len(suffix)]
    return [shard_path(prefix, i, count) for i in range(count)]


def split_count(path: str, fields: dict) -> int:
    """The file's `split.count` (1 when absent), after checking it is shard 0. Raises NextnError otherwise."""
    count = fields.get(KEY_COUNT, 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise NextnError(f"{path}: metadata key '{KEY_COUNT}' = {count!r}, expected a shard count >= 1")
    if count > 1:
        no = fields.get(KEY_NO)
        if no != 0:
            first = shard_first_name(path, no, count) if isinstance(no, int) else None
            raise NextnError(f"{path}: shard {KEY_NO} = {no!r} of a {count}-shard split GGUF; a split model is opened "
                             f"by its first shard" + (f" ({os.path.basename(first)})" if first and first != path else ""))
    return count


def shard_first_name(path: str, no: int, count: int) -> str:
    suffix = f"-{no + 1:05d}-of-{count:05d}.gguf"
    return path[: -len(suffix)] + f"-00001-of-{count:05d}.gguf" if path.endswith(suffix) else path


def check_shard(path: str, fields: dict, no: int, count: int, first: str) -> None:
    """Shard `no` of `count` (opened after `first`) says so. Raises NextnError naming it."""
    got_no, got_count = fields.get(KEY_NO), fields.get(KEY_COUNT)
    if got_no != no or got_count != count:
        raise NextnError(f"{path}: {KEY_NO} = {got_no!r} and {KEY_COUNT} = {got_count!r}, expected {no} and {count} "
                         f"(shard {no + 1} of {os.path.basename(first)}'s split)")
