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


# -- the cells a sequence holds, as host arrays (prompt cache, slot save / restore) ---------------------------------
def state_dims(entry_points: dict) -> dict:
    """{state name: its recorded dims (e.g. ["C", 2, 32], ["C//4", 1, 64], ["P", 3, 256])} of the manifest
    `entry_points`."""
    out = {}
    for ep in entry_points.values():
        for s in ep["states"]:
            out.setdefault(s, list(ep["state_shapes"][s]))
    return out


def cell_rows(dims, n_cells: int) -> int | None:
    """Leading rows of a state buffer with recorded `dims` that hold cells [0, n_cells): n_cells for [C, ...],
    ceil(n_cells / k) for [C//k, ...] (one row per k cells); None for any other state (recurrent [P, ...]: it is
    not position-indexed, the whole buffer goes)."""
    d0 = dims[0]
    if d0 == "C":
        return n_cells
    if isinstance(d0, str) and d0.startswith("C//"):
        k = int(d0[3:])
        return -(-n_cells // k)
    return None


def held_rows(dims, buffer_rows: int, n_cells: int) -> int:
    """Leading rows of a state buffer (recorded `dims`, `buffer_rows` rows) that carry cells [0, n_cells):
    `cell_rows`, at most the buffer's; the whole buffer for a state that is not position-indexed. What `read_cells`
    reads, a slot file holds and the prompt cache prices."""
    rows = cell_rows(dims, n_cells)
    return buffer_rows if rows is None else min(rows, buffer_rows)


def _rows_view(t, rows: int):
    """The first `rows` rows of device buffer `t` as a buffer of its own, sharing `t`'s memory (a byte-offset-0
    view: rows [0, rows) of a C-contiguous buffer are one contiguous prefix), so a copy moves those rows only."""
    if rows == int(t.shape[0]):
        return t
    return t._create_view((rows,) + tuple(int(d) for d in t.shape[1:]), str(t.dtype))


def read_cells(states: dict, dims: dict, n_cells: int) -> dict:
    """{name: host array} of what `states` (a sequence's buffers, dims as `state_dims`) hold for cells
    [0, n_cells): the leading `cell_rows` rows of each position-indexed buffer, the whole of any other. Only those
    bytes cross from the device (llama.cpp `llama_state_seq_get_data`: the cells of one sequence), so the cost
    grows with the tokens held, not with the context size."""
    out = {}
    for k, v in states.items():
        rows = held_rows(dims[k], int(v.shape[0]), n_cells)
        # rows 0: a one-row read sliced to none, for the host dtype and shape
        out[k] = _rows_view(v, max(rows, 1)).numpy()[:rows]
    return out


def write_cells(states: dict, rows: dict) -> None:
    """Write `read_cells` arrays back into `states`' leading rows (rows past them keep what they hold: cells past
    the committed prefix are masked and overwritten before they are read). ValueError when an array does not fit
    its buffer (another model or a larger context)."""
    for k, v in states.items():
        a = rows[k]
        if a.shape[0] == 0:
            continue
        if a.ndim != len(v.shape) or tuple(a.shape[1:]) != tuple(int(d) for d in v.shape[1:]) \
                or a.shape[0] > int(v.shape[0]):
            raise ValueError(f"state {k}: {tuple(a.shape)} does not fit the buffer {tuple(v.shape)}")
        _rows_view(v, a.shape[0]).copyfrom(np.ascontiguousarray(a))
