"""A slot's prompt cache as a file (`POST /slots/{id}?action=save|restore`, `--slot-save-path`; llama-server
`llama_state_seq_save_file` / `llama_state_seq_load_file`).

The file is a numpy .npz (an uncompressed zip of .npy members): `tokens` (int32 [n_tokens]: the cache's tokens),
`n_mtp` (int64: how many of them have their NextN rows) and one `state.<name>` per state buffer, holding rows
[0, n) of a position-indexed buffer (n = the cells the cache holds, `state.held_rows`) or the whole of any other.
Both directions move one state at a time, so host memory holds one state's rows, not the whole cache (a 16K-token
slot of a 46-layer model is gigabytes).
"""
from __future__ import annotations

import zipfile

import numpy as np

from nextn.common.kv_types import itemsize

from .. import state


class SlotFileError(ValueError):
    """A file that is not a saved slot, or one saved for another model / a larger context (one line)."""


def write(path: str, seq, tokens, n_mtp: int, n_cells: int) -> None:
    """Write `tokens`, `n_mtp` and the rows of cells [0, n_cells) of each of `seq`'s state buffers to `path`."""
    dims = state.state_dims(seq.model.entries)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        _put(z, "tokens", np.asarray(tokens, np.int32))
        _put(z, "n_mtp", np.int64(n_mtp))
        for k, v in seq.states.items():
            _put(z, f"state.{k}", state.read_cells({k: v}, dims, n_cells)[k])


def check(path: str, seq, n_ctx: int) -> tuple[list[int], int]:
    """(tokens, n_mtp) of slot file `path` after checking, from the members' headers alone, that its states are rows
    of `seq`'s buffers for the cells it holds and that those fit `n_ctx` cells. FileNotFoundError; SlotFileError
    naming what does not match."""
    with _open(path) as z:
        if not {"tokens", "n_mtp"} <= set(z.files):
            raise SlotFileError("is not a saved slot: no tokens / n_mtp")
        try:
            tokens, n_mtp = [int(t) for t in z["tokens"]], int(z["n_mtp"])
            have = {k[len("state."):]: _header(z, k) for k in z.files if k.startswith("state.")}
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise SlotFileError(f"is not a saved slot: {e}") from None
    n = max(len(tokens), n_mtp)
    if n > n_ctx:
        raise SlotFileError(f"holds {n} cells; the slot has {n_ctx}")
    dims = state.state_dims(seq.model.entries)
    want = {k: ((state.held_rows(dims[k], int(v.shape[0]), n),) + tuple(int(d) for d in v.shape[1:]),
                itemsize(v.dtype)) for k, v in seq.states.items()}
    if want != have:
        raise SlotFileError("was saved by another model (or by a nextn that saved whole buffers)")
    return tokens, n_mtp


def read(path: str, seq) -> None:
    """Write the state rows of slot file `path` (`check`ed first) into `seq`'s buffers, one state at a time.
    SlotFileError when a member does not read back; the buffers then hold part of the file."""
    with _open(path) as z:
        for k, v in seq.states.items():
            try:
                state.write_cells({k: v}, {k: z[f"state.{k}"]})
            except (OSError, ValueError, TypeError, RuntimeError, zipfile.BadZipFile) as e:
                raise SlotFileError(f"state {k} does not read back: {e}") from None


def _open(path: str):
    try:
        z = np.load(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise SlotFileError(f"is not a saved slot: {e}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise SlotFileError("is not a saved slot: a single array, not an .npz")
    return z


def _put(z: zipfile.ZipFile, name: str, a) -> None:
    with z.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)


def _header(z, key: str):
    """(shape, element size) of member `key` of an open NpzFile, from its .npy header only."""
    with z.zip.open(key + ".npy") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return tuple(int(d) for d in shape), dtype.itemsize
