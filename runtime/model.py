"""A loaded model: the artifact's compiled library, its Relax VM and entry functions, the weights (bound once), the
device; shared by every sequence it makes (`new_sequence`, runtime/sequence.py).

Each entry point is a Relax VM function that runs every kernel of one step (prefill chunk, verify pass, MTP rows,
draft step), so Python never dispatches per kernel. Its signature: (*inputs, Shape([L]), *states, *weight buffers),
as the manifest records; the weights come from here (`weight_tuple`), the states from the sequence.
Loading is three plain steps, in order (bench/device_check.py times each): `load_module` opens the library (a PTX
JIT shows here), `vm_init` creates the Relax VM on the device, `load_weights` reads the buffer plan from the GGUF onto
the device; a sequence's states are allocated by `new_sequence` (load_info "kv", the first time).
"""
from __future__ import annotations

import contextlib
import os
import time

from nextn.common.compile_options import CompileOptions
from nextn.common.errors import NextnError
from nextn.common.gguf import weakest
from nextn.common.manifest import MAX_DRAFT

from . import budget
from .artifact import Artifact, load_artifact
from .sequence import PREFILL_CHUNK, VOCAB, Sequence
from .weights import ArtifactFiles, load_weights


def check_kv_types(artifact: Artifact, type_k: str | None, type_v: str | None) -> None:
    """NextnError (one line) when -ctk / -ctv ask for KV cache types the artifact was not compiled with."""
    from nextn.common.kv_types import kv_type

    kc = artifact.manifest.get("kv_cache") or {"type_k": "f32", "type_v": "f32"}
    for flag, want, have in (("--cache-type-k", type_k, kc["type_k"]), ("--cache-type-v", type_v, kc["type_v"])):
        if want is not None and kv_type(want, flag).name != have:
            raise NextnError(f"{artifact.path}: compiled with KV cache types -ctk {kc['type_k']} -ctv {kc['type_v']}, "
                             f"but {flag} {want} was asked for; recompile it with `nextn compile ... -ctk/-ctv`, or run "
                             f"the GGUF (compiled and cached per KV type)")


class LoadedModel:
    """Load with `LoadedModel.open(path, ...)`; `path` is an artifact directory or a GGUF (compiled and cached).
    One thread at a time: the VM is shared by the model's sequences."""

    prefill_chunk = PREFILL_CHUNK

    def __init__(self, artifact: Artifact, ctx_size: int | None = None, load_mtp: bool = True,
                 model_path: str | None = None, draft_path: str | None = None, device: str = "cpu",
                 staged: bool = False, log=None, max_draft: int | None = None, draft_vocab: int | None = None,
                 draft_vocab_file: str | None = None):
        """Check the files, the device and the memory budget (weights, a workspace and the KV of one sequence of
        `ctx_size` cells), then load (`load`). `staged`: leave the loading to the caller (`load_module`, `vm_init`,
        `load_weights`; bench/device_check.py times each step). `ctx_size`: a new sequence's cells (default: the
        training context, at most 4096). `max_draft`: the deepest draft this model will serve (default and upper
        bound: the artifact's); it sizes the recurrent states' planes. `draft_vocab` (--spec-draft-vocab N): draft
        with the reduced head of the artifact's N token rows (None: if the artifact has one; 0: the full head;
        another N than the artifact's: NextnError), its rows ranked by `draft_vocab_file` or the tokenizer
        (runtime/draft_vocab.py)."""
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
        self.shape = tvm_ffi.Shape
        self.tensor = self.device.tensor
        self.draft_vocab, self.draft_ids = self._draft_vocab(draft_vocab, draft_vocab_file)
        self._plan, self.entries = self._loaded_parts()
        self.weight_bytes = sum(b["nbytes"] for b in self._plan)
        self.inputs_of = {name: [i["name"] for i in ep["inputs"]] for name, ep in self.entries.items()}
        self.keeps_rows = {name: bool(ep.get("keeps_row_states", True)) for name, ep in self.entries.items()}
        # The deepest draft this model serves: the compiled maximum, or lower when asked.
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
        # the most rows a captured few-row entry (verify, a draft step 0 with its gap) was planned for; None: no bound
        self.graph_max_rows = int(cg["max_rows"]) if "max_rows" in cg else None
        self.graph_bytes = int(cg.get("static_bytes", 0))   # device memory the captured steps allocate once
        # tensor-core prefill (manifest tensor_core): calls of fewer than min_rows rows go to the GEMV copies of the
        # many-row entries ({entry: copy}), where a 64-row tile would waste most of its work
        tc = m.get("tensor_core") or {}
        self.few_row_entries = dict(tc.get("few_rows", {}))
        self.tensor_core_min_rows = int(tc.get("min_rows", 0))
        self.load_info: dict[str, dict] = {}   # per load step: seconds (device-synchronized), bytes where it moves any
        self.log = log
        self.n_sequences = 0                   # made by new_sequence
        self._populate = {"thread": None, "done": "skipped"}   # the mapped files' populate (`_start_populate`)
        self.budget = budget.check(self, self.n_ctx)   # before anything is allocated: fits, or one line saying what would
        if not staged:
            self.load()

    def _loaded_parts(self) -> tuple[list, dict]:
        """(the weight buffers of the manifest's plan, the entry points) this model loads: the NextN-only ones only
        when speculation is on, the reduced draft head's (its `_vocab` entries, its gathered weight) only with it."""
        m = self.artifact.manifest
        plan = [b for b in m["buffer_plan"]["weights"] if self.has_mtp or not b["mtp_only"]]
        entries = {name: ep for name, ep in m["entry_points"].items() if ep["graph"] != "mtp" or self.has_mtp}
        if not self.draft_vocab:
            entries = {n: ep for n, ep in entries.items() if not n.endswith(VOCAB)}
            plan = [b for b in plan if not b.get("rows")]
        return plan, entries

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

    # -- loading ---------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _timed(self, step: str, needs: str | None = None, **info):
        """Record load_info[step]: seconds until the device is synchronized, and `info`. NextnError when the step
        `needs` has not run."""
        if needs is not None and needs not in self.load_info:
            raise NextnError(f"load step {step} needs {needs} first")
        t0 = time.perf_counter()
        yield
        self.device.synchronize()
        self.load_info[step] = {"s": time.perf_counter() - t0, **info}

    def load(self) -> "LoadedModel":
        """Run the load steps not run yet, in order; returns self."""
        for step, fn in (("load_module", self.load_module), ("vm_init", self.vm_init),
                         ("weights", self.load_weights)):
            if step not in self.load_info:
                fn()
        return self

    def load_module(self) -> None:
        """Open the compiled library (on a GPU a PTX JIT happens here)."""
        import tvm

        with self._timed("load_module"):
            self._module = tvm.runtime.load_module(self.artifact.library_path)

    def vm_init(self) -> None:
        """Create the Relax VM on the device and look up the entry functions (`fn`)."""
        import tvm
        from tvm.runtime.vm import VirtualMachine

        with self._timed("vm_init", needs="load_module"):
            self.vm = VirtualMachine(self._module, self.device.vm_devices)
            self.fn = {name: self.vm[name] for name in self.entries}
            # The VM's pooled allocator keeps every freed buffer for a later request of the same size and never
            # returns it: a long prompt's chunks each ask for new [T, L] sizes (glm-dsa's index scores and masks, L
            # growing by a chunk each time), so without a release they would add up to O(T_prompt^2) bytes.
            self.release_pool = tvm.get_global_func("vm.builtin.memory_manager.clear")

    def load_weights(self) -> None:
        """Read the buffer plan from the GGUF onto the device (load_info "weights": seconds and bytes)."""
        import tvm_ffi

        with self._timed("weights", needs="vm_init", bytes=self.weight_bytes):
            with self.device.uploader(self.weight_bytes, "weights") as put:
                self._weights = load_weights(self.files, self._plan, put, {"draft_vocab": self.draft_ids})
            # the reduced draft head's row ids: an input of its entries, on the device once (Sequence passes it on)
            self.resident = {"draft_ids": self.tensor(self.draft_ids)} if self.draft_vocab else {}
            # Each entry point's weights as one ffi Array, built once: a call passes it as one argument (to_relax).
            self.weight_tuple = {name: tvm_ffi.convert([self._weights[w] for w in ep["weights"]])
                                 for name, ep in self.entries.items()}
        self._start_populate()

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

    # -- sequences -------------------------------------------------------------------------------------------------
    def state_sizes(self, n_ctx: int) -> dict:
        """The symbols of the manifest's state shapes for `n_ctx` cells: C (cells) and P (recurrent planes)."""
        return {"C": n_ctx, "P": self.rs_planes}

    def new_sequence(self, ctx_size: int | None = None) -> Sequence:
        """A sequence on this model (the Python API's, a server slot): its own static KV and recurrent states (trunk
        and NextN) of `ctx_size` cells (default: the model's n_ctx), its own VM timers; the same VM and weights.
        Calls on one never read or write another's states. The first sequence of at most n_ctx cells was counted in
        the load's memory budget; the others are checked on their own (NextnError: one line of what would fit).
        Raises NextnError for a second sequence of an artifact whose CUDA graphs replay the first one's buffers
        (recompile with --no-cuda-graph). Records load_info "kv" (seconds and bytes) the first time."""
        n = int(ctx_size or self.n_ctx)
        if n < 2:
            raise NextnError(f"context size {n} per sequence is too small (-c)")
        if self.n_sequences and self.static_inputs:
            raise NextnError(f"{self.artifact.path}: CUDA graphs replay the first sequence's own KV buffers, so this "
                             f"model cannot hold a second sequence (-np > 1); recompile with --no-cuda-graph")
        if self.n_sequences:
            budget.check(self, n, weights=False, what="another sequence's KV (a server slot)")
        elif n > self.n_ctx:
            budget.check(self, n, weights=False, what="the KV of a larger context")
        if "kv" in self.load_info:
            seq = Sequence(self, n)
        else:
            with self._timed("kv", needs="weights"):
                seq = Sequence(self, n)
            self.load_info["kv"]["bytes"] = seq.kv_bytes
        self.n_sequences += 1
        return seq

    @classmethod
    def open(cls, path: str, options: CompileOptions | None = None, ctx_size: int | None = None,
             load_mtp: bool = True, draft_path: str | None = None, log=None, device: str = "cpu",
             max_draft: int | None = None, draft_vocab_file: str | None = None) -> "LoadedModel":
        """Open an artifact directory, or a GGUF file, compiled first with `options` (common/compile_options.py;
        None: CompileOptions(), llvm with f16 KV caches) and cached by its header identity and the options' key.
        An artifact directory keeps the options it was compiled with and is checked against what `options` asked
        (`CompileOptions.asked`): its KV cache types (-ctk / -ctv) and its reduced draft head (--spec-draft-vocab N;
        not asked: the artifact's own). `max_draft`: the deepest draft asked for (recurrent states keep
        max_draft + 2 planes). `draft_vocab_file`: the reduced draft head's ranking (see __init__)."""
        options = options or CompileOptions()
        dv = {"draft_vocab": options.asked("draft_vocab"), "draft_vocab_file": draft_vocab_file}
        if os.path.isdir(path):
            art = load_artifact(path)
            check_kv_types(art, options.asked("cache_type_k"), options.asked("cache_type_v"))
            return cls(art, ctx_size, load_mtp, draft_path=draft_path, device=device, log=log, max_draft=max_draft,
                       **dv)
        from nextn.compiler import entry   # the one door into the compiler: compile-and-cache

        art_dir = entry.compiled_artifact(path, options, draft_path, log=log)
        return cls(load_artifact(art_dir), ctx_size, load_mtp, model_path=path, draft_path=draft_path, device=device,
                   log=log, max_draft=max_draft, **dv)
