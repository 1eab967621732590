"""A loaded model: the artifact's compiled entry points, called one per step.

The engine calls one compiled entry point per step (prefill chunk, verify pass, MTP rows, draft step);
each is a Relax VM function that runs every kernel of that step, so Python never dispatches per kernel.
Its pieces: the weights (`weights.py`, bound once), the static KV / state buffers (`state.py`), the device
(`device.py`). Entry-point signatures: (*inputs, Shape([L]), *states, *weight buffers), as the manifest records.

Recurrent states (GLM-5.3-Flash's KDA layers: shape [P, ...] in the manifest, compiler/ir/graph.py) cannot be
truncated. Each trunk call reads the committed plane (its input `rs_plane`) and keeps the state after each of its
last rows in the other planes; `commit(n)` after the call keeps its first n rows by making the plane of row n-1
the committed one (no copy, no replay). Every trunk call is followed by one commit before the next call that
should see its rows; a call that is not committed (a timing call) leaves the committed state as it was.
"""
from __future__ import annotations

import copy
import os
import time

import numpy as np

from nextn.common.errors import NextnError
from nextn.common.gguf import weakest
from nextn.common.manifest import MAX_DRAFT

from . import budget, state
from .artifact import Artifact, load_artifact
from .weights import ArtifactFiles, load_weights

PREFILL_CHUNK = 512   # rows per prefill call (llama.cpp's default n_ubatch)


def check_kv_types(artifact: Artifact, type_k: str | None, type_v: str | None) -> None:
    """NextnError (one line) when -ctk / -ctv ask for KV cache types the artifact was not compiled with."""
    from nextn.common.kv_types import kv_type

    kc = artifact.manifest.get("kv_cache") or {"type_k": "f32", "type_v": "f32"}
    for flag, want, have in (("--cache-type-k", type_k, kc["type_k"]), ("--cache-type-v", type_v, kc["type_v"])):
        if want is not None and kv_type(want, flag).name != have:
            raise NextnError(f"{artifact.path}: compiled with KV cache types -ctk {kc['type_k']} -ctv {kc['type_v']}, "
                             f"but {flag} {want} was asked for; recompile it with `nextn compile ... -ctk/-ctv`, or run "
                             f"the GGUF (compiled and cached per KV type)")
ONE_ROW = {"verify": "decode", "mtp_draft": "draft", "mtp_draft_vocab": "draft_vocab"}   # one-row calls: static entries
VOCAB = "_vocab"   # suffix of the reduced-head draft entries (compiler/graphs.py `reduce_head`, --spec-draft-vocab)


class Engine:
    """Load with `Engine.open(path, ...)`; `path` is an artifact directory or a GGUF (compiled and cached)."""

    LOAD_STEPS = ("load_module", "vm_init", "weights", "kv")   # what loading does, in order (load_info)
    prefill_chunk = PREFILL_CHUNK

    def __init__(self, artifact: Artifact, ctx_size: int | None = None, load_mtp: bool = True,
                 model_path: str | None = None, draft_path: str | None = None, device: str = "cpu",
                 staged: bool = False, log=None, max_draft: int | None = None, draft_vocab: int | None = None,
                 draft_vocab_file: str | None = None):
        """Check the files and the device, then load (LOAD_STEPS). `staged`: leave the loading to `load_step`
        / `load_all` (bench/device_check.py runs and times each step on its own). `max_draft`: the deepest draft
        this engine will serve (default and upper bound: the artifact's); it sizes the recurrent states' planes.
        `draft_vocab` (--spec-draft-vocab N): draft with the reduced head of the artifact's N token rows (None: if
        the artifact has one; 0: the full head; another N than the artifact's: NextnError), its rows ranked by
        `draft_vocab_file` or the tokenizer (runtime/draft_vocab.py)."""
        import tvm_ffi

        from .device import Device

        self.artifact = artifact
        m = artifact.manifest
        self.hparams = m["hparams"]
        self.has_mtp = bool(load_mtp and m["has_mtp"])
        self.files = ArtifactFiles(artifact, model_path, draft_path, with_draft=self.has_mtp)
        self.n_ctx = int(ctx_size or min(self.hparams["n_ctx_train"], 4096))
        if self.n_ctx < 2:
            raise NextnError(f"context size {self.n_ctx} is too small (-c)")
        cg = m.get("cuda_graph") or {}
        if cg and self.n_ctx > int(cg["max_ctx"]):
            raise NextnError(f"{artifact.path}: context size {self.n_ctx} (-c) is larger than the {cg['max_ctx']} cells this "
                             f"artifact's CUDA graphs were planned for; recompile with --no-cuda-graph")
        self.device = Device(artifact, device)   # cpu, or cuda:N (weights + KV in device memory)
        self.dev = self.device.dev
        self._shape = tvm_ffi.Shape
        self._tensor = self.device.tensor
        # Weights, in the manifest's buffer plan; NextN-only buffers only when speculation is on.
        self._plan = [b for b in m["buffer_plan"]["weights"] if self.has_mtp or not b["mtp_only"]]
        self.draft_vocab, self.draft_ids = self._draft_vocab(draft_vocab, draft_vocab_file)
        self._entries = {name: ep for name, ep in m["entry_points"].items() if ep["graph"] != "mtp" or self.has_mtp}
        if not self.draft_vocab:   # no reduced head: its entries and its gathered weight are not loaded
            self._entries = {n: ep for n, ep in self._entries.items() if not n.endswith(VOCAB)}
            self._plan = [b for b in self._plan if not b.get("rows")]
        self.weight_bytes = sum(b["nbytes"] for b in self._plan)
        self._inputs_of = {name: [i["name"] for i in ep["inputs"]] for name, ep in self._entries.items()}
        self._keeps_rows = {name: bool(ep.get("keeps_row_states", True)) for name, ep in self._entries.items()}
        # The deepest draft this engine serves: the compiled maximum, or lower when asked.
        self.max_draft = int(m.get("max_draft", MAX_DRAFT))
        if max_draft is not None:
            self.max_draft = max(0, min(self.max_draft, int(max_draft)))
        # Recurrent states keep P planes: a verify of max_draft + 1 rows keeps every row's state beside the
        # committed one; without speculation one plane, updated in place.
        self.rs_planes = self.max_draft + 2 if self.has_mtp and self.max_draft > 0 else 1
        # glm-dsa / glm5next: draft steps 1..n_max-1 reuse step 0's NextN DSA selection
        # (index_share_for_mtp_iteration): the GGUF's attention.indexer.index_share_mtp where it says, else on
        share = self.hparams.get("index_share_mtp")
        self.share_mtp_index = True if share is None else bool(share)
        # CUDA graphs (manifest "cuda_graph"): the captured entry points read their inputs from buffers that must
        # not move between calls, and TVM keeps one graph per value of L, so L is rounded up to kv_bucket cells
        # (the extra cells are masked: attention reads cells <= pos). Both also work, and are tested, on the CPU.
        self.kv_bucket = int(cg.get("kv_bucket", 1))
        self.static_inputs = set(cg.get("entries", []))
        self._inbuf: dict[tuple, list] = {}
        self.load_info: dict[str, dict] = {}   # per load step: seconds (device-synchronized), bytes where it moves any
        self.log = log
        self._populate = {"thread": None, "done": "skipped"}   # the mapped files' populate (`_start_populate`)
        self.budget = budget.check(self, self.n_ctx)   # before anything is allocated: fits, or one line saying what would
        if not staged:
            self.load_all()

    def _draft_vocab(self, n, path):
        """(N, draft ids int32 [N] or None) of the reduced draft head asked for; see __init__."""
        from .draft_vocab import draft_ids

        have = self.artifact.manifest.get("draft_vocab") or 0
        if not self.has_mtp:   # no drafting at all (spec off, or a trunk-only model)
            return 0, None
        if n is not None and n != 0 and n != have:
            raise NextnError(f"{self.artifact.path}: --spec-draft-vocab {n} asked for, but the artifact was compiled "
                             + (f"with --spec-draft-vocab {have}" if have else "without a reduced draft head")
                             + "; recompile it with that flag, or run the GGUF (compiled and cached per N)")
        n = have if n is None else n
        if not n:
            if path:
                raise NextnError(f"{path}: --spec-draft-vocab-file needs --spec-draft-vocab N")
            return 0, None
        ids = draft_ids(n, int(self.hparams["n_vocab"]), self.files.main.fields, path)
        return n, ids

    def load_all(self) -> None:
        """Run the load steps not run yet, in order."""
        for step in self.LOAD_STEPS:
            if step not in self.load_info:
                self.load_step(step)

    def load_step(self, step: str) -> dict:
        """Run one of LOAD_STEPS (the earlier ones must have run): `load_module` opens the library (a PTX JIT
        shows here), `vm_init` creates the Relax VM on the device, `weights` reads the buffer plan from the GGUF
        onto the device, `kv` allocates and zeroes the state buffers. Returns and records its load_info."""
        i = self.LOAD_STEPS.index(step)
        missing = [s for s in self.LOAD_STEPS[:i] if s not in self.load_info]
        if missing:
            raise NextnError(f"load step {step} needs {', '.join(missing)} first")
        t0 = time.perf_counter()
        info = getattr(self, f"_load_{step}")() or {}
        self.device.synchronize()
        self.load_info[step] = {"s": time.perf_counter() - t0, **info}
        return self.load_info[step]

    def _load_load_module(self):
        import tvm

        self._module = tvm.runtime.load_module(self.artifact.library_path)

    def _load_vm_init(self):
        from tvm.runtime.vm import VirtualMachine

        import tvm

        self.vm = VirtualMachine(self._module, self.device.vm_devices)
        self._fn = {name: self.vm[name] for name in self._entries}
        # The VM's pooled allocator keeps every freed buffer for a later request of the same size and never
        # returns it: a long prompt's chunks each ask for new [T, L] sizes (glm-dsa's index scores and masks, L
        # growing by a chunk each time), so without a release they would add up to O(T_prompt^2) bytes.
        self._release_pool = tvm.get_global_func("vm.builtin.memory_manager.clear")
        self.vm_seconds = {name: 0.0 for name in self._fn}   # time inside compiled entry points, per entry

    def _load_weights(self):
        import tvm_ffi

        with self.device.uploader(self.weight_bytes, "weights") as put:
            self._weights = load_weights(self.files, self._plan, put, {"draft_vocab": self.draft_ids})
        # the reduced draft head's row ids: an input of its entries, put on the device once (`_inputs` passes it on)
        self._resident = {"draft_ids": self._tensor(self.draft_ids)} if self.draft_vocab else {}
        # Each entry point's weights as one ffi Array, built once: a call passes it as one argument (to_relax).
        self._weight_tuple = {name: tvm_ffi.convert([self._weights[w] for w in ep["weights"]])
                              for name, ep in self._entries.items()}
        self._start_populate()
        return {"bytes": self.weight_bytes}

    def _start_populate(self) -> None:
        """CPU: the kernels read the weights in place from the mapped GGUF, so map all of it now, in a background
        thread (GGUFFile.populate, as llama.cpp's MAP_POPULATE), instead of page-faulting mid-prefill on experts
        never touched yet; skipped when the files do not fit in MemAvailable (they would only evict each other).
        `wait_populated` joins it."""
        import threading

        if self.device.kind != "cpu":
            return
        files = self.files.files
        if sum(f.size for f in files) > budget.available(self.device)[0]:
            return

        def run():
            try:       # the lowest CPU priority (this thread only): it must not slow the first prompt on few cores
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except OSError:
                pass
            self._populate["done"] = weakest([f.populate() for f in files])

        t = threading.Thread(target=run, name="nextn-populate", daemon=True)
        self._populate = {"thread": t, "done": None}
        t.start()

    def wait_populated(self, timeout: float | None = None) -> str | None:
        """Wait for the background populate (`_start_populate`) to finish; returns what it did ("populate",
        "willneed", "none", or "skipped": not started), or None if it is still running after `timeout` seconds.
        Benchmarks call it before timing, to measure what llama.cpp measures after its MAP_POPULATE load."""
        t = self._populate["thread"]
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                return None
        return self._populate["done"]

    def _load_kv(self):
        self._alloc_states()
        return {"bytes": self.kv_bytes}

    def _state_sizes(self, n_ctx: int) -> dict:
        """The symbols of the manifest's state shapes for `n_ctx` cells: C (cells) and P (recurrent planes)."""
        return {"C": n_ctx, "P": self.rs_planes}

    def _alloc_states(self) -> None:
        """Static KV and recurrent states of one sequence (state.py), and each entry point's two trailing
        arguments: the tuple of its states and the tuple of its weights (to_relax's signature). The recurrent state
        starts uncommitted at position 0."""
        import tvm_ffi

        self.states, self.recurrent = state.state_buffers(self._entries, self._state_sizes(self.n_ctx),
                                                          self.device.empty)
        self._rest = {name: (tvm_ffi.convert([self.states[s] for s in ep["states"]]), self._weight_tuple[name])
                      for name, ep in self._entries.items()}
        self.kv_bytes = state.nbytes(self.states)
        # The committed recurrent state: its plane, the position it has reached, the last uncommitted trunk call.
        self.rs_plane, self.rs_pos, self._pending = 0, 0, None

    def resize_context(self, ctx_size: int) -> None:
        """Reallocate this sequence's KV for `ctx_size` cells (what it held is dropped)."""
        if ctx_size < 2:
            raise NextnError(f"context size {ctx_size} per sequence is too small (-c)")
        if ctx_size > self.n_ctx:
            budget.check(self, ctx_size, weights=False, what="the KV of a larger context")
        self.n_ctx = int(ctx_size)
        self._inbuf = {}
        self._alloc_states()

    def sequence(self, ctx_size: int | None = None) -> "Engine":
        """Another sequence on this engine (a server slot): the same compiled module and weights, its own static KV
        (trunk and NextN) of `ctx_size` cells (default: this engine's), its own VM timers. Calls on either never read
        or write the other's KV. One thread at a time per engine: the VM is shared. Raises NextnError for an artifact
        whose CUDA graphs captured this engine's buffers (recompile with --no-cuda-graph)."""
        if self.static_inputs:
            raise NextnError(f"{self.artifact.path}: CUDA graphs replay this engine's own KV buffers, so it cannot hold "
                             f"a second sequence (-np > 1); recompile with --no-cuda-graph")
        seq = copy.copy(self)
        seq.n_ctx = int(ctx_size or self.n_ctx)
        if seq.n_ctx < 2:
            raise NextnError(f"context size {seq.n_ctx} per sequence is too small (-c)")
        seq.vm_seconds = dict.fromkeys(self._fn, 0.0)
        seq._inbuf = {}
        budget.check(seq, seq.n_ctx, weights=False, what="another sequence's KV (a server slot)")
        seq._alloc_states()
        return seq

    @classmethod
    def open(cls, path: str, target: str = "llvm", ctx_size: int | None = None, load_mtp: bool = True,
             draft_path: str | None = None, log=None, arches=None, device: str = "cpu",
             mtp_dense_attention: bool = False, cache_type_k: str | None = None,
             cache_type_v: str | None = None, max_draft: int | None = None, draft_vocab: int | None = None,
             draft_vocab_file: str | None = None) -> "Engine":
        """Open an artifact directory, or a GGUF file (compiled for `target` first, cached by its header identity).
        `cache_type_k` / `cache_type_v` (-ctk / -ctv): a GGUF is compiled with them (default f16); an artifact
        directory must have been compiled with them (None: whatever it was compiled with). `max_draft`: the deepest
        draft asked for (recurrent states keep max_draft + 2 planes). `draft_vocab` / `draft_vocab_file`: the
        reduced draft head (--spec-draft-vocab N; a GGUF is compiled with it, cached per N; see __init__)."""
        dv = {"draft_vocab": draft_vocab, "draft_vocab_file": draft_vocab_file}
        if os.path.isdir(path):
            art = load_artifact(path)
            check_kv_types(art, cache_type_k, cache_type_v)
            return cls(art, ctx_size, load_mtp, draft_path=draft_path, device=device, log=log, max_draft=max_draft,
                       **dv)
        from nextn.compiler import entry   # the one door into the compiler: compile-and-cache

        options = entry.CompileOptions(target=target, arches=arches, mtp_dense_attention=mtp_dense_attention,
                                       cache_type_k=cache_type_k, cache_type_v=cache_type_v, draft_vocab=draft_vocab)
        art_dir = entry.compiled_artifact(path, options, draft_path, log=log)
        return cls(load_artifact(art_dir), ctx_size, load_mtp, model_path=path, draft_path=draft_path, device=device,
                   log=log, max_draft=max_draft, **dv)

    @property
    def kv_cache(self) -> dict:
        """KV cache types and sizes: {type_k, type_v, bytes_per_token {trunk, nextn, total}, bytes, recurrent_bytes}
        (`bytes`: what this engine allocated, states included, for its n_ctx cells; `recurrent_bytes`: the part of
        it in recurrent states, float32, all planes)."""
        kc = self.artifact.manifest.get("kv_cache") or {}
        return {"type_k": kc.get("type_k", "f32"), "type_v": kc.get("type_v", "f32"),
                "bytes_per_token": kc.get("bytes_per_token"), "n_ctx": self.n_ctx, "bytes": self.kv_bytes,
                "recurrent_bytes": state.nbytes({n: self.states[n] for n in self.recurrent})}

    # -- entry points -----------------------------------------------------------------------------
    def n_kv(self, end: int) -> int:
        """L for a call whose last row is cell end-1: end rounded up to kv_bucket cells, within the context."""
        b = self.kv_bucket
        return end if b <= 1 else min(self.n_ctx, -(-end // b) * b)

    def _inputs(self, name, arrays):
        """Device tensors of `arrays`; one already on the device (`_resident`) is passed as it is."""
        if name not in self.static_inputs:
            return [a if not isinstance(a, np.ndarray) else self._tensor(a) for a in arrays]
        key = (name, *(tuple(a.shape) for a in arrays))
        if key not in self._inbuf:   # one fixed buffer per input, written in place on every call
            self._inbuf[key] = [self.device.empty(a.shape, str(a.dtype)) for a in arrays]
        bufs = self._inbuf[key]
        for i, (b, a) in enumerate(zip(bufs, arrays)):
            if isinstance(a, np.ndarray):
                b.copyfrom(a)
            else:
                bufs[i] = a     # resident: already a fixed device buffer
        return bufs

    def _run(self, name, tokens, pos0, **extra):
        """Call entry point `name` on rows `tokens` at positions pos0..; `extra`: its other inputs by name."""
        T = len(tokens)
        if pos0 + T > self.n_ctx:
            raise NextnError(f"context is full: {pos0 + T} tokens do not fit in the context of {self.n_ctx} (-c)")
        if T == 1 and ONE_ROW.get(name) in self._fn:
            name = ONE_ROW[name]
        named = {"tokens": np.asarray(tokens, np.int32), "pos": np.arange(pos0, pos0 + T, dtype=np.int32), **extra}
        if "rs_plane" in self._inputs_of[name]:
            if pos0 not in (0, self.rs_pos):
                raise NextnError(f"the recurrent state is at position {self.rs_pos}: a trunk call must continue there "
                                 f"(or start a sequence at 0), not at {pos0}")
            named["rs_plane"] = np.array([self.rs_plane], np.int32)
            self._pending = (name, pos0, T)
        arrays = [self._resident[i] if i in self._resident else np.ascontiguousarray(named[i])
                  for i in self._inputs_of[name]]
        args = [*self._inputs(name, arrays), self._shape([self.n_kv(pos0 + T)])]
        t0 = time.perf_counter()
        out = self._fn[name](*args, *self._rest[name])
        self.device.synchronize()   # a CUDA launch returns before the kernels finish: time the work, not the launch
        self.vm_seconds[name] += time.perf_counter() - t0
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
                self._release_pool()
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
        kept = max(1, min(T, self.rs_planes - 1)) if self._keeps_rows[name] else 1
        if not 0 <= slot < kept:
            raise NextnError(f"cannot keep {n_rows} of the {T} rows of '{name}': it kept the recurrent state after its "
                             f"last {kept} row(s) only")
        self.rs_plane = (self.rs_plane + 1 + slot) % self.rs_planes
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
        last = last_only and "hidden_ids" in self._inputs_of["prefill"]

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

    def mtp_draft(self, tokens, h_prev, pos0: int, reuse_index: bool = False):
        """NextN rows with logits for every row: (h_nextn [T, E], logits [T, V] tvm tensor, argmax [T]).
        `reuse_index`: a one-row draft step after step 0 of the same round; with DSA index sharing (glm-dsa, glm5next;
        `share_mtp_index`, artifact entry `mtp_draft_shared`) it attends to the DSA selection step 0 stored
        instead of running the NextN indexer again. Ignored by models without it.
        With the reduced draft head (`draft_vocab` N) the `_vocab` entries run: logits [T, N] are those of the
        tokens `draft_ids` (in that order) and argmax is already a token id of the full vocabulary."""
        name = "mtp_draft"
        if reuse_index and self.share_mtp_index and len(tokens) == 1 and "mtp_draft_shared" in self._fn:
            name = "mtp_draft_shared"
        if self.draft_vocab:
            name += VOCAB
        out = self._run(name, tokens, pos0, h_prev=np.ascontiguousarray(h_prev, np.float32))
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
        if not self.has_mtp:
            raise NextnError("this model has no NextN (MTP) block loaded")
        ids = np.asarray(token_ids, np.int32)
        h = self.hidden(ids)
        h_prev = np.concatenate([np.zeros((1, h.shape[1]), np.float32), h[:-1]])

        def chunk(t, hp, p):   # mtp_rows with every row an output row (as `logits`: not the few-row mtp_draft)
            return self._run("mtp_rows", t, p, h_prev=np.ascontiguousarray(hp, np.float32),
                             out_ids=np.arange(len(t), dtype=np.int32))[1].numpy()

        return np.concatenate(self._by_chunk(chunk, 0, ids, h_prev))
