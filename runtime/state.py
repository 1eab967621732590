"""Static state buffers: the KV caches (trunk layers and the NextN block, separately) and any arch-specific state
(glm-dsa: the indexer key caches, the stored DSA selection), one buffer per state name of the manifest's entry
points, shaped with C = the context size, allocated once and zeroed.

Indexed by position, so rolling back is free: cells past the committed prefix are masked out (attention reads
cells <= pos) and overwritten by the next write. Zeroed, not left as garbage: with L rounded up to a bucket,
masked cells are read, and a masked NaN would still poison P·V (0 × NaN).
"""
from __future__ import annotations

import numpy as np

from nextn.common.kv_types import itemsize


def _states(entry_points: dict, n_ctx: int):
    """(name, shape with C = n_ctx, dtype) of each state buffer of the manifest `entry_points`, once each."""
    seen = set()
    for ep in entry_points.values():
        for s in ep["states"]:
            if s not in seen:
                seen.add(s)
                yield s, tuple(n_ctx if d == "C" else int(d) for d in ep["state_shapes"][s]), ep["state_dtypes"][s]


def state_buffers(entry_points: dict, n_ctx: int, empty) -> dict:
    """{state name: zeroed device buffer} for the manifest `entry_points` that will run; `empty(shape, dtype)`
    allocates on the device."""
    return {s: empty(shape, dtype) for s, shape, dtype in _states(entry_points, n_ctx)}


def state_bytes(entry_points: dict, n_ctx: int, retype: dict | None = None) -> int:
    """Bytes `state_buffers` allocates for n_ctx cells. `retype` {state: (its KV type, another KV type)}
    (nextn.common.kv_types): those caches counted as if they held the other type (the memory budget's what-if)."""
    total = 0
    for s, shape, dtype in _states(entry_points, n_ctx):
        lead = int(np.prod(shape[:-1], dtype=np.int64))
        row = shape[-1] * itemsize(dtype)
        if retype and s in retype:
            have, other = retype[s]
            row = other.row_bytes(row // have.block_bytes * have.block)
        total += lead * row
    return total


def nbytes(states: dict) -> int:
    return sum(int(np.prod(s.shape)) * itemsize(s.dtype) for s in states.values())
