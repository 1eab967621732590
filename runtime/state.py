"""Static state buffers: the KV caches (trunk layers and the NextN block, separately) and any arch-specific state
(glm-dsa: the indexer key caches, the stored DSA selection), one buffer per state name of the manifest's entry
points, shaped with C = the context size, allocated once and zeroed.

Indexed by position, so rolling back is free: cells past the committed prefix are masked out (attention reads
cells <= pos) and overwritten by the next write. Zeroed, not left as garbage: with L rounded up to a bucket,
masked cells are read, and a masked NaN would still poison P·V (0 × NaN).
"""
from __future__ import annotations

import numpy as np


def state_buffers(entry_points: dict, n_ctx: int, empty) -> dict:
    """{state name: zeroed device buffer} for the manifest `entry_points` that will run; `empty(shape, dtype)`
    allocates on the device."""
    states = {}
    for ep in entry_points.values():
        for s in ep["states"]:
            if s not in states:
                shape = tuple(n_ctx if d == "C" else int(d) for d in ep["state_shapes"][s])
                states[s] = empty(shape, ep["state_dtypes"][s])
    return states


def nbytes(states: dict) -> int:
    from nextn.common.kv_types import itemsize

    return sum(int(np.prod(s.shape)) * itemsize(s.dtype) for s in states.values())
