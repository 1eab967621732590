"""Static state buffers: the KV caches (trunk layers and the NextN block, separately) and any arch-specific state
(glm-dsa: the indexer key caches, the stored DSA selection; glm5next: indexer rows, pooled keys, the KDA
recurrent states), one buffer per state name of the manifest's entry points, shaped with C = the context size
and P = the recurrent planes, allocated once and zeroed.

Position-indexed states ([C, ...], [C//k, ...]) roll back for free: cells past the committed prefix are masked
out (attention reads cells <= pos) and overwritten by the next write. Recurrent states ([P, ...]) cannot be
truncated: a call keeps the state after each of its last rows in its own plane and the sequence commits one
(`Sequence.commit`). Zeroed, not left as garbage: with L rounded up to a bucket, masked cells are read, and a masked
NaN would still poison P·V (0 × NaN).
"""
from __future__ import annotations

import numpy as np

from nextn.common.kv_types import itemsize
from nextn.common.manifest import resolve_shape


def _states(entry_points: dict, sizes: dict):
    """(name, recorded dims, shape with the symbols of `sizes` resolved ({"C": cells, "P": planes}), dtype) of each
    state buffer of the manifest `entry_points`, once each."""
    seen = set()
    for ep in entry_points.values():
        for s in ep["states"]:
            if s not in seen:
                seen.add(s)
                dims = ep["state_shapes"][s]
                yield s, dims, resolve_shape(dims, sizes), ep["state_dtypes"][s]


def state_buffers(entry_points: dict, sizes: dict, empty) -> tuple[dict, set]:
    """({state name: zeroed device buffer}, {names of the recurrent states: those with P planes}) for the manifest
    `entry_points` that will run; `sizes` gives the symbols ({"C": cells, "P": planes}); `empty(shape, dtype)`
    allocates on the device."""
    states, recurrent = {}, set()
    for s, dims, shape, dtype in _states(entry_points, sizes):
        states[s] = empty(shape, dtype)
        if dims[0] == "P":
            recurrent.add(s)
    return states, recurrent


def state_bytes(entry_points: dict, sizes: dict, retype: dict | None = None) -> int:
    """Bytes `state_buffers` allocates for `sizes` ({"C": cells, "P": planes}). `retype` {state: (its KV type,
    another KV type)} (nextn.common.kv_types): those caches counted as if they held the other type (the memory
    budget's what-if)."""
    total = 0
    for s, _dims, shape, dtype in _states(entry_points, sizes):
        lead = int(np.prod(shape[:-1], dtype=np.int64))
        row = shape[-1] * itemsize(dtype)
        if retype and s in retype:
            have, other = retype[s]
            row = other.row_bytes(row // have.block_bytes * have.block)
        total += lead * row
    return total


def nbytes(states: dict) -> int:
    return sum(int(np.prod(s.shape)) * itemsize(s.dtype) for s in states.values())
