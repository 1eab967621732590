"""Host-memory prompt cache (`--cache-ram N` MiB, llama-server's `server_prompt_cache`, tools/server/server-task.cpp;
the slot side in server-context.cpp `get_available_slot`, `prompt_save`, `prompt_load`, and the idle-slot saving of
`process_single_task`, `--cache-idle-slots`).

A slot's KV (trunk and NextN caches, every position-indexed state buffer) covering the tokens its prompt cache holds
(`Slot.cache`, `Slot.n_mtp`) is copied to host memory when that slot is about to be given a different prompt, and
copied back into a slot whose next prompt shares a large enough prefix with it, so a conversation that lost its slot
to another one prefills only what follows that prefix again. Entries are the rows [0, n) of each buffer (n: the
tokens held, n_mtp when larger), so an entry's bytes grow with its tokens, as llama.cpp's `llama_state_seq_get_data`.
The restored rows are the bytes the slot computed, so output after a restore is the output of a cold start.
Recurrent states (glm5next's KDA) exist at one position only: such slots never reach this cache (`Slot.can_reuse`).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from nextn.common.kv_types import itemsize

from .. import state

MIB = 1024 * 1024


@dataclass
class Entry:
    tokens: list               # the prompt cache's tokens (prompt and generated) the rows cover
    n_mtp: int                 # how many of them have their NextN rows (Slot.n_mtp)
    rows: dict                 # state name -> numpy array: rows [0, n) of a position-indexed buffer, else the whole

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.rows.values())


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cells_held(slot) -> int:
    """Cells [0, n) whose state a slot's prompt cache needs: its tokens, or its NextN rows when those reach further
    (`Slot.n_mtp`), within the slot's context."""
    return min(max(len(slot.cache), slot.n_mtp), slot.n_ctx)


def snapshot(seq, n: int) -> dict:
    """Rows [0, n) of every position-indexed state buffer of `seq` (the whole buffer of any other), as host arrays;
    only those rows are read from the device (runtime/state.py `read_cells`)."""
    return state.read_cells(seq.states, state.state_dims(seq.model.entries), n)


def put_back(seq, rows: dict) -> None:
    """Write `snapshot` rows into `seq`'s buffers, those rows only (rows past them keep what they hold: masked,
    overwritten before they are read)."""
    state.write_cells(seq.states, rows)


class PromptCache:
    """Saved slot states, oldest first; `limit_mib` the bytes they may take (-1: no limit). Used from the scheduler
    thread only."""

    def __init__(self, limit_mib: int, log=None):
        self.limit = None if limit_mib < 0 else int(limit_mib) * MIB
        self.states: collections.deque[Entry] = collections.deque()
        self.log = log or (lambda m: None)

    def size(self) -> int:
        return sum(e.nbytes for e in self.states)

    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.states)

    def save(self, slot) -> bool:
        """Copy `slot`'s prompt cache and its rows in (llama-server `prompt_save` + `server_prompt_cache::alloc`).
        False when the slot holds nothing, an entry already covers all of its tokens, or the entry alone would pass
        the limit. Entries whose tokens are a prefix of the slot's are dropped (superseded), then the oldest ones
        until the new one fits."""
        toks = list(slot.cache)
        if not toks or not slot.can_reuse:
            return False
        if any(common_prefix(e.tokens, toks) == len(toks) for e in self.states):
            return False
        n = cells_held(slot)
        dims = state.state_dims(slot.seq.model.entries)
        est = sum(int(np.prod(v.shape[1:])) * state.held_rows(dims[k], int(v.shape[0]), n) * itemsize(v.dtype)
                  for k, v in slot.seq.states.items()) if self.limit is not None else 0
        if self.limit is not None and est > self.limit:
            self.log(f"nextn serve: prompt cache: slot {slot.id}'s state ({est / MIB:.3f} MiB) exceeds --cache-ram "
                     f"({self.limit / MIB:.0f} MiB), not saved")
            return False
        self.states = collections.deque(e for e in self.states if common_prefix(e.tokens, toks) < len(e.tokens))
        while self.limit is not None and self.states and self.size() + est > self.limit:
            self.states.popleft()
        self.states.append(Entry(toks, int(slot.n_mtp), snapshot(slot.seq, n)))
        return True

    def load(self, slot, prompt) -> bool:
        """Give `slot` the entry that keeps the largest fraction of itself and of `prompt` as a common prefix, if
        that beats what the slot holds (llama-server `server_prompt_cache::load`: entries keeping < 25 % of their
        tokens are left alone, an empty slot takes any). The entry leaves the cache. True if one was loaded."""
        lcp = common_prefix(slot.cache, prompt)
        keep_best = lcp / len(slot.cache) if slot.cache else -1.0
        sim_best = lcp / max(1, len(prompt))
        best = None
        for e in self.states:
            n = common_prefix(e.tokens, prompt)
            keep, sim = n / len(e.tokens), n / max(1, len(prompt))
            if keep < 0.25:
                continue
            if keep > keep_best and sim > sim_best:
                keep_best, sim_best, best = keep, sim, e
        if best is None:
            return False
        slot.cache, slot.n_mtp = [], 0            # until every buffer is in
        put_back(slot.seq, best.rows)
        slot.cache, slot.n_mtp = list(best.tokens), best.n_mtp
        self.states.remove(best)
        return True

    def describe(self) -> str:
        lim = "no limit" if self.limit is None else f"{self.limit / MIB:.0f} MiB"
        return f"{len(self.states)} prompts, {self.n_tokens()} tokens, {self.size() / MIB:.3f} MiB (limit {lim})"
