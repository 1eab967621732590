"""One sequence on a loaded model (runtime/model.py): its static KV and recurrent states (`state.py`), their commit,
the fixed input buffers of CUDA-graph entries, its context size and its VM timers; the calls of one decoding step
(`prefill`, `verify`, `mtp_rows`, `mtp_draft`) and the whole-sequence API (`logits`, `hidden`, `mtp_logits`).
Sequences of one model share its VM and weights and never read or write each other's states.

Recurrent states (GLM-5.3-Flash's KDA layers: shape [P, ...] in the manifest, compiler/ir/graph.py) cannot be
truncated. Each trunk call reads the committed plane (its input `rs_plane`) and keeps the state after each of its
last rows in the other planes; `commit(n)` after the call keeps its first n rows by making the plane of row n-1
the committed one (no copy, no replay). Every trunk call is followed by one commit before the next call that
should see its rows; a call that is not committed (a timing call) leaves the committed state as it was.
"""
from __future__ import annotations

import time
import numpy as np

from nextn.common.errors import NextnError

from . import budget, state

PREFILL_CHUNK = 512   # rows per prefill call (llama.cpp's default n_ubatch)
VOCAB = "_vocab"   # suffix of the reduced-head draft entries (compiler/graphs.py `reduce_head`, --spec-draft-vocab)
ONE_ROW = {"verify": "decode", "mtp_draft": "draft", "mtp_draft_vocab": "draft_vocab"}   # one-row calls: static entries


class Sequence:
    """Made by `LoadedModel.new_sequence(ctx_size)`. `model`: the LoadedModel (runtime/model.py) it runs on; `n_ctx`: its cells;
    `states` / `recurrent`: its state buffers by manifest name (state.py); `vm_seconds`: seconds inside each compiled
    entry point, the device synchronized after every call."""

    def __init__(self, model, n_ctx: int):
        self.model = model
        self.n_ctx = int(n_ctx)
        self.vm_seconds = dict.fromkeys(model.fn, 0.0)
        self._alloc_states()

    def _alloc_states(self) -> None:
        """Static KV and recurrent states of this sequence (state.py), and each entry point's two trailing arguments:
        the tuple of its states and the tuple of its weights (to_relax's signature). The recurrent state starts
        uncommitted at position 0; the fixed input buffers (CUDA graphs) start empty."""
        import tvm_ffi

        m = self.model
        self.states, self.recurrent = state.state_buffers(m.entries, m.state_sizes(self.n_ctx), m.device.empty)
        self._rest = {name: (tvm_ffi.convert([self.states[s] for s in ep["states"]]), m.weight_tuple[name])
                      for name, ep in m.entries.items()}
        self.kv_bytes = state.nbytes(self.states)
        self._inbuf: dict[tuple, list] = {}
        # The committed recurrent state: its plane, the position it has reached, the last uncommitted trunk call.
        self.rs_plane, self.rs_pos, self._pending = 0, 0, None

    def resize_context(self, ctx_size: int) -> None:
        """Reallocate this sequence's KV for `ctx_size` cells (what it held is dropped)."""
        if ctx_size < 2:
            raise NextnError(f"context size {ctx_size} per sequence is too small (-c)")
        if ctx_size > self.n_ctx:
            budget.check(self.model, ctx_size, weights=False, what="the KV of a larger context")
        self.n_ctx = int(ctx_size)
        self._alloc_states()

    @property
    def kv_cache(self) -> dict:
        """KV cache types and sizes: {type_k, type_v, bytes_per_token {trunk, nextn, total}, bytes, recurrent_bytes}
        (`bytes`: what this sequence allocated, states included, for its n_ctx cells; `recurrent_bytes`: the part of
        it in recurrent states, float32, all planes)."""
        kc = self.model.artifact.manifest.get("kv_cache") or {}
        return {"type_k": kc.get("type_k", "f32"), "type_v": kc.get("type_v", "f32"),
                "bytes_per_token": kc.get("bytes_per_token"), "n_ctx": self.n_ctx, "bytes": self.kv_bytes,
                "recurrent_bytes": state.nbytes({n: self.states[n] for n in self.recurrent})}

    # -- entry points -----------------------------------------------------------------------------
    def n_kv(self, end: int) -> int:
        """L for a call whose last row is cell end-1: end rounded up to kv_bucket cells, within the context."""
        b = self.model.kv_bucket
        return end if b <= 1 else min(self.n_ctx, -(-end // b) * b)

    def _inputs(self, name, arrays):
        """Device tensors of `arrays`; one already on the device (the model's `resident`) is passed as it is."""
        m = self.model
        if name not in m.static_inputs:
            return [a if not isinstance(a, np.ndarray) else m.tensor(a) for a in arrays]
        key = (name, *(tuple(a.shape) for a in arrays))
        if key not in self._inbuf:   # one fixed buffer per input, written in place on every call
            self._inbuf[key] = [m.device.empty(a.shape, str(a.dtype)) for a in arrays]
        bufs = self._inbuf[key]
        for i, (b, a) in enumerate(zip(bufs, arrays)):
            if isinstance(a, np.ndarray):
                b.copyfrom(a)
            else:
                bufs[i] = a     # resident: already a fixed device buffer
        return bufs

    def _run(self, name, tokens, pos0, **extra):
        """Call entry point `name` on rows `tokens` at positions pos0..; `extra`: its other inputs by name."""
        m = self.model
        T = len(tokens)
        if pos0 + T > self.n_ctx:
            raise NextnError(f"context is full: {pos0 + T} tokens do not fit in the context of {self.n_ctx} (-c)")
        if T == 1 and ONE_ROW.get(name) in m.fn:
            name = ONE_ROW[name]
        timed = name   # (a few-row copy's seconds count as its entry's)
        if T < m.tensor_core_min_rows and name in m.few_row_entries:
            name = m.few_row_entries[name]
        if name in m.static_inputs and m.graph_max_rows is not None and T > m.graph_max_rows:
            raise NextnError(f"{name}: {T} rows, more than the {m.graph_max_rows} this artifact's CUDA graphs were "
                             f"planned for (a draft of at most {m.graph_max_rows - 1} tokens); recompile with "
                             f"--no-cuda-graph")
        named = {"tokens": np.asarray(tokens, np.int32), "pos": np.arange(pos0, pos0 + T, dtype=np.int32), **extra}
        if "rs_plane" in m.inputs_of[name]:
            if pos0 not in (0, self.rs_pos):
                raise NextnError(f"the recurrent state is at position {self.rs_pos}: a trunk call must continue there "
                                 f"(or start a sequence at 0), not at {pos0}")
            named["rs_plane"] = np.array([self.rs_plane], np.int32)
            self._pending = (name, pos0, T)
        arrays = [m.resident[i] if i in m.resident else np.ascontiguousarray(named[i]) for i in m.inputs_of[name]]
        args = [*self._inputs(name, arrays), m.shape([self.n_kv(pos0 + T)])]
        t0 = time.perf_counter()
        out = m.fn[name](*args, *self._rest[name])
        m.device.synchronize()   # a CUDA launch returns before the kernels finish: time the work, not the launch
        self.vm_seconds[timed] += time.perf_counter() - t0
        return out

    def _by_chunk(self, call, pos0: int, *rows):
        """call(*(r[s:s + PREFILL_CHUNK] for r in rows), pos0 + s) for each chunk of PREFILL_CHUNK rows, in order.
        Over several chunks, the allocator's pool is released after each one (buffers in use stay): the next chunk's
        L-sized buffers differ in size, so pooled ones would only accumulate."""
        n = len(rows[0])
        out = []
        for s in range(0, n, PREFILL_CHUNK):
            out.append(call(*(r[s:s + PREFILL_CHUNK] for r in rows), pos0 + s))
            if n > PREFILL_CHUNK:
                self.model.release_pool()
        return out

    def commit(self, n_rows: int) -> None:
        """Keep the first `n_rows` rows of the last trunk call (all of them after a prefill chunk; id_last and the
        accepted drafts after a verify): the recurrent states take the plane of row n_rows-1 (ir/graph.py slots).
        Position-indexed states need nothing (cells past the committed prefix are masked and rewritten).
        Raises NextnError when the call did not keep that row's state."""
        if self._pending is None:
            if self.recurrent:
                raise NextnError("commit() without a trunk call to commit")
            return
        name, pos0, T = self._pending
        slot = T - n_rows
        planes = self.model.rs_planes
        kept = max(1, min(T, planes - 1)) if self.model.keeps_rows[name] else 1
        if not 0 <= slot < kept:
            raise NextnError(f"cannot keep {n_rows} of the {T} rows of '{name}': it kept the recurrent state after its "
                             f"last {kept} row(s) only")
        self.rs_plane = (self.rs_plane + 1 + slot) % planes
        self.rs_pos, self._pending = pos0 + n_rows, None

    def _committed(self, name, tokens, pos0, **extra):
        """_run, then commit every row (prefill chunks, whole-sequence logits)."""
        out = self._run(name, tokens, pos0, **extra)
        self.commit(len(tokens))
        return out

    def prefill(self, tokens, pos0: int = 0, on_hidden=None, last_only: bool = False):
        """Trunk over `tokens` at positions pos0.. (chunked, each chunk committed). Returns (hidden [T, n_embd] f32
        post output_norm, logits [n_vocab] f32 of the last row, argmax of the last row). `on_hidden(h, p)`: called
        with each chunk's hidden rows (numpy [t, n_embd], first position p) as they come, and only the last row is
        returned, so a long prompt holds one chunk of hidden states, not all of them.

        `last_only`: only the last row's output is wanted (plain decoding; llama-bench's pp): each chunk's last trunk
        layer runs its FFN on that row alone (`hidden_ids`, compiler/models/glm_base/graph.py), and hidden is that
        row [1, n_embd] (on_hidden sees it per chunk). The last row's bits are the same either way."""
        # an artifact compiled before hidden_ids computes every row (and ignores the input)
        last = last_only and "hidden_ids" in self.model.inputs_of["prefill"]

        def chunk(t, p):
            ids = np.array([len(t) - 1], np.int32) if last else np.arange(len(t), dtype=np.int32)
            h, lg, am = self._committed("prefill", t, p, hidden_ids=ids,
                                        out_ids=np.array([len(ids) - 1], np.int32))
            h = h.numpy()
            if on_hidden is None:
                return h, lg, am
            on_hidden(h, p)
            return h[-1:], lg, am

        outs = self._by_chunk(chunk, pos0, tokens)
        _h, lg, am = outs[-1]
        if on_hidden is not None or last_only:
            hidden = outs[-1][0][-1:]
        else:
            hidden = np.concatenate([o[0] for o in outs])
        return hidden, lg.numpy()[0], int(am.numpy()[0])

    def verify(self, tokens, pos0: int):
        """Trunk over k+1 rows [id_last, d1..dk] at pos0..: (hidden [k+1, E], logits [k+1, V], argmax [k+1]).
        Follow it with `commit(rows kept)` (recurrent states keep the state after each row until then)."""
        h, lg, am = self._run("verify", tokens, pos0)
        return h.numpy(), lg, am.numpy()

    def mtp_rows(self, tokens, h_prev, pos0: int):
        """NextN rows teacher-forced: row t pairs tokens[t] with h_prev[t]; writes the NextN KV at pos0..
        Returns h_nextn [T, E] of the rows."""
        def rows(t, h, p):
            out = self._run("mtp_rows", t, p, h_prev=np.ascontiguousarray(h, np.float32),
                            out_ids=np.array([len(t) - 1], np.int32))
            return out[0].numpy()

        return np.concatenate(self._by_chunk(rows, pos0, tokens, h_prev))

    def mtp_draft(self, tokens, h_prev, pos0: int, reuse_index: bool = False, out_ids=None):
        """NextN rows: (h_nextn [T, E], logits [R, V] tvm tensor, argmax [R]) with R the rows `out_ids` (int indices
        into the T rows, ascending; None: every row). A draft step 0 carrying the NextN gap asks for its last row: the
        head runs on the asked rows only (compiler/graphs.py `select_head_rows`; a one-row call has its one row, and
        an artifact compiled before `out_ids` returns every row).
        `reuse_index`: a one-row draft step after step 0 of the same round; with DSA index sharing (glm-dsa, glm5next;
        `share_mtp_index`, artifact entry `mtp_draft_shared`) it attends to the DSA selection step 0 stored
        instead of running the NextN indexer again. Ignored by models without it.
        With the reduced draft head (`draft_vocab` N) the `_vocab` entries run: logits [R, N] are those of the
        tokens `draft_ids` (in that order) and argmax is already a token id of the full vocabulary."""
        name = "mtp_draft"
        if reuse_index and self.model.share_mtp_index and len(tokens) == 1 and "mtp_draft_shared" in self.model.fn:
            name = "mtp_draft_shared"
        if self.model.draft_vocab:
            name += VOCAB
        ids = np.arange(len(tokens), dtype=np.int32) if out_ids is None else np.asarray(out_ids, np.int32)
        out = self._run(name, tokens, pos0, h_prev=np.ascontiguousarray(h_prev, np.float32), out_ids=ids)
        h, lg, am = out[0], out[1], out[2]   # glm-dsa's mtp_draft also returns the stored selection (unused here)
        return h.numpy(), lg, am.numpy()

    # -- whole-sequence API -----------------------------------------------------------------------
    def logits(self, token_ids) -> np.ndarray:
        """Trunk logits `[T, n_vocab]` float32 for `token_ids` at positions 0..T-1 (no KV reuse).
        Semantics: llama.cpp src/models/glm4-moe.cpp (the trunk graph). Runs `prefill` with every row as an output
        row: `verify` is for a few rows (its attention keeps per-chunk partials of every row)."""
        ids = np.asarray(token_ids, np.int32)

        def chunk(t, p):
            every = np.arange(len(t), dtype=np.int32)
            return self._committed("prefill", t, p, hidden_ids=every, out_ids=every)[1].numpy()

        return np.concatenate(self._by_chunk(chunk, 0, ids))

    def hidden(self, token_ids) -> np.ndarray:
        """Trunk post-`output_norm` hidden `[T, n_embd]` float32 (the MTP seed `t_h_nextn`)."""
        return self.prefill(np.asarray(token_ids, np.int32), 0)[0]

    def mtp_logits(self, token_ids) -> np.ndarray:
        """Teacher-forced NextN logits `[T, n_vocab]` float32: row p pairs token p with the trunk hidden at
        p-1 (zeros at p = 0) and predicts token p+1 (llama.cpp common/speculative.cpp draft-mtp `process()`,
        docs/design.md "Speculation")."""
        if not self.model.has_mtp:
            raise NextnError("this model has no NextN (MTP) block loaded")
        ids = np.asarray(token_ids, np.int32)
        h = self.hidden(ids)
        h_prev = np.concatenate([np.zeros((1, h.shape[1]), np.float32), h[:-1]])

        def chunk(t, hp, p):   # mtp_rows with every row an output row (as `logits`: not the few-row mtp_draft)
            return self._run("mtp_rows", t, p, h_prev=np.ascontiguousarray(hp, np.float32),
                             out_ids=np.arange(len(t), dtype=np.int32))[1].numpy()

        return np.concatenate(self._by_chunk(chunk, 0, ids, h_prev))
