"""Parallel slots: one compiled module and one set of weights, N sequences with their own static state.

Each slot owns a *sequence* (`LoadedModel.new_sequence()`: its own trunk and NextN KV buffers, the model's VM and weights),
and runs one request at a time as a `speculative.decode` generator, which carries that request's speculation state,
sampler RNG and counters. One background thread, the scheduler, steps the busy slots round-robin, one decode step
(prefill, or one verify round) per turn, so the asyncio loop that serves HTTP never waits on the model and a long
request does not hold the others back. More requests than slots wait in a FIFO queue. A request that finishes, hits
a finish rule, fails or whose client went away frees its slot, and no slot ever reads or writes another slot's buffers.

Prompt cache (llama-server `cache_prompt`, default on): a slot keeps the tokens its KV cells hold (`Slot.cache`:
prompt and generated tokens, as `speculative.CacheExtent` reports them, also for a cancelled request) and how many
of them have their NextN rows; the next request on that slot prefills only what follows the longest common prefix
(`Slot.reusable`; cells past it are overwritten before they are read: static, position-indexed KV). A request goes
to the idle slot whose cache shares the largest fraction of its prompt, above `--slot-prompt-similarity`, else to the
least recently used one (`Scheduler._pick`, llama-server `get_available_slot`). Models with recurrent states
(glm5next's KDA) keep the state of one position only, so their slots never reuse a prefix.
Results travel to the asyncio side through the request's `post` callback:
("tokens", [ids]) per step, then ("done", Outcome) or ("error", ApiError).
Semantics of the slot cycle: llama.cpp tools/server/server-context.cpp (`update_slots`, `process_token`).
"""
from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from nextn.common.errors import NextnError

from ..depth import calibrated
from ..speculative import decode
from .errors import ApiError
from .metrics import Metrics
from .params import GenParams
from . import slot_file
from .prompt_cache import PromptCache, cells_held, common_prefix
from .responses import Outcome


@dataclass
class Task:
    prompt_ids: list
    params: GenParams
    eog_ids: frozenset
    post: object                                    # post(kind, payload), thread-safe
    id: int = field(default_factory=itertools.count().__next__)
    cancelled: threading.Event = field(default_factory=threading.Event)
    outcome: Outcome = field(default_factory=Outcome)


class Slot:
    """One sequence (runtime/sequence.py) and its prompt cache: `cache` the tokens whose trunk KV cells the sequence holds,
    `n_mtp` how many of them have their NextN rows too (`speculative.CacheExtent`)."""

    def __init__(self, i: int, seq, speculative: bool = False):
        self.id, self.seq, self.speculative = i, seq, speculative
        self.task: Task | None = None
        self.steps = None
        self.n_gen = 0
        self.cache: list = []
        self.n_mtp = 0
        self.emitted: list = []
        self.extent = None
        self.chain = None    # the request's SamplerChain when it asks post-sampling probabilities
        self.t_last_used = 0.0
        # recurrent states (glm5next's KDA) hold the state at one position only: no prefix of it can be reused
        self.can_reuse = not seq.recurrent

    @property
    def n_ctx(self) -> int:
        return self.seq.n_ctx

    def reusable(self, prompt, p: GenParams) -> int:
        """Prompt tokens this slot need not evaluate again (llama-server `cache_prompt`): the longest common prefix
        of its cache and `prompt`, less one so that the last prompt token is evaluated (its logits are needed);
        with speculation also within the NextN rows it holds, less one more (the NextN row after the prefix pairs
        with the trunk hidden of the prefix's last token, which is not kept: that token is evaluated again)."""
        if not (p.cache_prompt and self.can_reuse and self.cache):
            return 0
        n = common_prefix(self.cache, prompt)
        if p.spec_type == "draft-mtp":
            if p.n_max == "auto" and not calibrated(self.seq, self.seq.model.max_draft):
                return 0     # depth.calibrate runs first, writing cells from position 0
            return max(0, min(n, self.n_mtp) - 1)
        return min(n, len(prompt) - 1)

    def start(self, task: Task, token_bytes, n_batch: int | None = None) -> None:
        from ..sampling import SamplerChain
        from ..speculative import CacheExtent

        p = task.params
        o = task.outcome
        spec = p.spec()
        n_cached = self.reusable(task.prompt_ids, p)
        o.slot, o.n_prompt, o.t_start = self.id, len(task.prompt_ids), time.perf_counter()
        o.n_cached = n_cached
        o.n_predict = p.n_predict
        o.post_sampling = p.post_sampling_probs
        budget = self.n_ctx if p.n_predict < 0 else max(1, p.n_predict)
        self.task, self.n_gen, self.emitted, self.extent = task, 0, [], CacheExtent()
        # until the first step reports, the caches are known to hold the reused prefix only
        self.n_mtp = min(self.n_mtp, n_cached + 1 if spec.enabled else n_cached)
        self.cache = list(task.prompt_ids[:n_cached])
        self.t_last_used = time.time()
        self.chain = SamplerChain(p.temperature, p.top_k, p.top_p, p.min_p) if p.post_sampling_probs else None
        on_batch = None
        if p.return_progress:     # llama-server's first prompt_progress: the prompt starts (cache known)
            task.post("progress", n_cached)

            def on_batch(n_done):  # after each -b batch but the last (that one is reported when the step returns)
                if n_done < len(task.prompt_ids):
                    task.post("progress", n_done)
        self.steps = decode(self.seq, task.prompt_ids, p.sampling(budget), spec, eog_ids=task.eog_ids,
                            token_bytes=token_bytes, n_cached=n_cached, extent=self.extent,
                            on_logits=self._on_logits if p.logprobs else None, logit_bias=p.logit_bias,
                            constraint=p.constraint, n_batch=n_batch, on_batch=on_batch)

    def _on_logits(self, rows, tokens, shaped) -> None:
        """Each emitted token's log-probability and its row's n_probs best (float64 log-softmax of the logits); with
        `post_sampling_probs`, its probability and the n_probs best after the request's sampler chain (llama-server
        server-context.cpp `populate_token_probs`: the chain's candidates, zero-probability ones left out)."""
        p = self.task.params
        n = min(p.n_probs, rows.shape[-1])
        if p.post_sampling_probs:
            for row, t in zip(shaped, tokens):
                ids, pr = self.chain.probs(row)
                got = dict(zip(ids.tolist(), pr.tolist()))
                top = [(i, x) for i, x in list(got.items())[:n] if x > 0.0]
                self.task.outcome.probs.append((int(t), got.get(int(t), 0.0), top))
            return
        for row, t in zip(rows, tokens):
            z = row.astype(np.float64)
            lp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
            top = np.argpartition(-lp, n - 1)[:n] if n else np.zeros(0, np.int64)
            top = top[np.argsort(-lp[top], kind="stable")]
            self.task.outcome.probs.append((int(t), float(lp[t]), [(int(i), float(lp[i])) for i in top]))

    def release(self, failed: bool = False) -> None:
        """End the slot's request (finished, cancelled or failed); the cache keeps what the KV holds."""
        if self.steps is not None:
            self.steps.close()
        e = self.extent
        if failed:
            self.cache, self.n_mtp = [], 0
        elif self.task is not None and e is not None and e.n_past is not None:
            self.cache = (list(self.task.prompt_ids) + self.emitted)[:e.n_past]
            self.n_mtp = e.n_mtp if e.n_mtp is not None else min(self.n_mtp, e.n_past)
        self.task, self.steps, self.extent, self.n_gen = None, None, None, 0

    # -- slot actions (llama-server POST /slots/{id}?action=save|restore|erase) -----------------------------------
    def erase(self) -> int:
        n, self.cache, self.n_mtp = len(self.cache), [], 0
        return n

    def save(self, path: str) -> int:
        """Write the cache's tokens, its NextN count and the state rows of the cells it holds (n = `cells_held`) to
        `path` (slot_file.py: an .npz, one member per state, written one at a time); returns the bytes written.
        The file grows with the tokens held, not with the slot's context (llama-server `llama_state_seq_save_file`)."""
        if not self.can_reuse:
            raise ApiError("this model's slots keep no prompt cache (its recurrent state exists at one position only)")
        slot_file.write(path, self.seq, self.cache, self.n_mtp, cells_held(self))
        return os.path.getsize(path)

    def restore(self, path: str) -> int:
        """Read a `save` file into this slot (the rows it holds only, one state at a time); ApiError (400) when it
        is not one or was made for another model, or holds more cells than this slot's context (the slot keeps its
        cache), or a state does not read back (the slot forgets its cache)."""
        if not self.can_reuse:
            raise ApiError("this model's slots keep no prompt cache (its recurrent state exists at one position only)")
        name = os.path.basename(path)
        try:
            tokens, n_mtp = slot_file.check(path, self.seq, self.n_ctx)
        except FileNotFoundError:
            raise ApiError(f"slot file {name!r} not found", "not_found_error") from None
        except slot_file.SlotFileError as e:
            raise ApiError(f"slot file {name!r} {e}") from None
        self.cache, self.n_mtp = [], 0       # until every buffer is in
        try:
            slot_file.read(path, self.seq)
        except (OSError, slot_file.SlotFileError) as e:
            raise ApiError(f"slot file {name!r} {e}") from None
        self.cache, self.n_mtp = tokens, n_mtp
        return os.path.getsize(path)

    def to_json(self) -> dict:
        t = self.task
        n_prompt = len(t.prompt_ids) if t else 0
        n_cached = t.outcome.n_cached if t else 0
        return {"id": self.id, "id_task": t.id if t else -1, "n_ctx": self.n_ctx, "n_prompt_tokens": n_prompt,
                "n_prompt_tokens_processed": n_prompt - n_cached if self.n_gen else 0,
                "n_prompt_tokens_cache": n_cached, "n_past": len(self.cache),
                "speculative": self.speculative, "is_processing": t is not None,
                "next_token": [{"has_next_token": t is not None, "has_new_line": False,
                                "n_remain": (t.params.n_predict - self.n_gen if t and t.params.n_predict >= 0 else -1),
                                "n_decoded": self.n_gen}]}


class Scheduler:
    """Start with `start()`; `submit(task)` from any thread; `cancel(task)` when its client is gone."""

    def __init__(self, sequences, token_bytes, metrics: Metrics | None = None, log=None, speculative: bool = False,
                 similarity: float = 0.1, pool: int | None = None, n_batch: int | None = None, cache_ram: int = 0,
                 cache_idle_slots: bool = True, verbose: bool = False):
        self.slots = [Slot(i, q, speculative) for i, q in enumerate(sequences)]
        self.pool = pool                 # --kv-unified: cells all slots may hold together (None: each its own)
        self.n_batch = n_batch           # -b: a prompt is evaluated in batches of this many tokens (None: at once)
        self.similarity = similarity     # --slot-prompt-similarity
        self.token_bytes = token_bytes
        self.metrics = metrics or Metrics()
        self.log = log or (lambda m: print(m, file=sys.stderr))
        # -v: llama-server's debug lines, the events its tests look for in the log among them
        self.debug = self.log if verbose else (lambda m: None)
        # --cache-ram MiB (0: off): slots' states kept in host memory when their slot gets another prompt
        self.prompt_cache = PromptCache(cache_ram, self.debug) if cache_ram != 0 and self.slots[0].can_reuse else None
        self.cache_idle_slots = cache_idle_slots and self.prompt_cache is not None
        if cache_idle_slots and cache_ram == 0:
            self.log("nextn serve: --cache-idle-slots requires --cache-ram, disabling")
        if self.cache_idle_slots:
            self.log("nextn serve: idle slots will be saved to the prompt cache" +
                     (" and cleared" if pool is not None else "") + " upon starting a new task")
            self.debug("nextn serve: __TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")
        self._queue: collections.deque[Task] = collections.deque()
        self._calls: collections.deque = collections.deque()   # (fn, concurrent Future): run between steps
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="nextn-scheduler", daemon=True)
        self.threads = 0                 # CPU threads of this thread's TVM pool (the one every model call uses)
        self._started = threading.Event()

    @property
    def n_ctx(self) -> int:
        """Cells of every slot (llama-server: -c divided by -np)."""
        return self.slots[0].n_ctx

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def submit(self, task: Task) -> None:
        with self._cv:
            self._queue.append(task)
            self._cv.notify()

    def cancel(self, task: Task) -> None:
        task.cancelled.set()
        with self._cv:
            if task in self._queue:
                self._queue.remove(task)
            self._cv.notify()

    def call(self, fn):
        """Run fn() on the scheduler thread between decode steps (the only thread that touches the sequences); returns
        a concurrent.futures.Future of its result."""
        import concurrent.futures

        fut = concurrent.futures.Future()
        with self._cv:
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut

    def counts(self) -> tuple[int, int]:
        """(requests processing, requests waiting for a slot)."""
        with self._cv:
            return sum(s.task is not None for s in self.slots), len(self._queue)

    def slots_json(self) -> list:
        with self._cv:
            return [s.to_json() for s in self.slots]

    # -- the scheduler thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        from ..threads import in_this_thread

        self.threads = in_this_thread()    # this thread's pool makes every model call: sized by -t
        self._started.set()
        while True:
            with self._cv:
                while not self._stop and not self._calls and not (self._queue and self._idle()) \
                        and all(s.task is None for s in self.slots):
                    self._cv.wait()
                if self._stop:
                    for s in self.slots:
                        s.release()
                    return
                calls, self._calls = list(self._calls), collections.deque()
                for task in list(self._queue):      # FIFO; a task that asked for a busy slot waits for it
                    slot, update = self._pick(task)
                    if slot is not None:
                        self._queue.remove(task)
                        if update and self.prompt_cache is not None:
                            self._update_cache(slot, task)
                        slot.start(task, self.token_bytes, self.n_batch)
                        if self.cache_idle_slots:
                            self._cache_idle()
                busy = [s for s in self.slots if s.task is not None]
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except BaseException as e:     # noqa: BLE001 - handed to the waiting route
                    fut.set_exception(e)
            for s in busy:
                self._step(s)

    def _idle(self) -> bool:
        return any(s.task is None for s in self.slots)

    def _pick(self, task: Task) -> tuple[Slot | None, bool]:
        """(an idle slot for `task` or None, whether its cache goes to the host prompt cache first) (llama-server
        `get_available_slot`): the one the request named (`id_slot`), when idle; else the one whose cache shares the
        largest fraction of the prompt as a common prefix, above --slot-prompt-similarity (0: off), saved first when
        the prompt keeps less than half of that cache; else the least recently used one, saved first."""
        if task.params.id_slot >= 0:
            s = self.slots[task.params.id_slot]
            return (s if s.task is None else None), False
        idle = [s for s in self.slots if s.task is None]
        if not idle:
            return None, False
        best, best_sim, best_n = None, 0.0, 0
        if self.similarity > 0 and task.params.cache_prompt:
            for s in idle:
                if s.cache:
                    n = common_prefix(s.cache, task.prompt_ids)
                    sim = n / len(task.prompt_ids)
                    if sim > best_sim and sim > self.similarity:
                        best, best_sim, best_n = s, sim, n
        if best is not None:
            return best, best_n / len(best.cache) < 0.5
        return min(idle, key=lambda s: s.t_last_used), True

    def _update_cache(self, s: Slot, task: Task) -> None:
        """--cache-ram: `s` is about to take `task`'s prompt: its cache goes to host memory, and the saved state that
        best covers the prompt comes back into it (llama-server `get_available_slot`'s "updating prompt cache")."""
        self.debug(f"nextn serve: slot {s.id}: updating prompt cache")
        if self.prompt_cache.save(s):
            self.debug(f"nextn serve: slot {s.id}: saved {len(s.cache)} tokens to the prompt cache")
        if task.params.cache_prompt and self.prompt_cache.load(s, task.prompt_ids):
            self.debug(f"nextn serve: slot {s.id}: restored {len(s.cache)} tokens from the prompt cache")
        self.debug(f"nextn serve: prompt cache: {self.prompt_cache.describe()}")

    def _cache_idle(self) -> None:
        """--cache-idle-slots (llama-server's default with --cache-ram): when a task starts, every idle slot's cache
        goes to host memory; with --kv-unified the slot is then cleared (its cells return to the pool)."""
        for x in self.slots:
            if x.task is None:
                if self.prompt_cache.save(x):
                    self.debug(f"nextn serve: slot {x.id}: saved idle slot to prompt cache ({len(x.cache)} tokens) "
                               f"__TEST_TAG_CACHE_IDLE_SLOT__")
                if self.pool is not None:
                    x.erase()

    def _step(self, s: Slot) -> None:
        task = s.task
        if task is None:           # freed earlier in this round (--kv-unified: the pool failed every busy request)
            return
        o = task.outcome
        if task.cancelled.is_set():
            self._free(s)
            return
        if self.pool is not None and not self._room(s):
            return
        try:
            toks = next(s.steps)
        except StopIteration as e:
            self._finish(s, e.value)
            return
        except NextnError as e:
            self._free(s, failed=True)
            task.post("error", ApiError(str(e), "server_error"))
            return
        except Exception as e:   # a bug: answer 500 and keep serving the other slots
            self.log(f"nextn serve: slot {s.id}: {type(e).__name__}: {e}")
            self._free(s, failed=True)
            task.post("error", ApiError(f"internal error: {type(e).__name__}: {e}", "server_error"))
            return
        now = time.perf_counter()
        if s.n_gen == 0:
            o.t_prompt = now
        if task.params.n_predict == 0:   # the prompt is evaluated, nothing is generated (llama-server: n_predict 0)
            o.t_last, o.finish, o.n_past = 0.0, "length", o.n_prompt
            self._report(s, o)
            return
        o.t_last = now
        if s.n_gen == 0 and task.params.return_progress:   # the whole prompt is evaluated
            task.post("progress", o.n_prompt)
        s.n_gen += len(toks)
        s.emitted += toks
        task.post("tokens", toks)

    def _room(self, s: Slot) -> bool:
        """--kv-unified (llama-server server-context.cpp `update_slots`): the cells slot `s`'s next step writes must
        fit in the pool with what every slot holds (a busy slot its KV so far, an idle one its prompt cache). The
        step writes the prompt past the reused prefix (prefill), or the last token and up to n_max drafts (counted
        whole: llama-server's batch holds the drafts too).
        No room: idle slots' caches are dropped, one at a time (`try_clear_idle_slots`); still none: every busy
        request fails with 500 "Context size has been exceeded." and its slot's cache is cleared. True if `s` may
        step."""
        p = s.task.params

        def held(x: Slot) -> int:
            e = x.extent
            return e.n_past if x.task is not None and e is not None and e.n_past is not None else len(x.cache)

        if s.extent is None or s.extent.n_past is None:
            need = len(s.task.prompt_ids) - len(s.cache)
        else:
            need = 1 + p.spec().max_drafts(s.seq.model.max_draft)
        while sum(held(x) for x in self.slots) + need > self.pool:
            idle = next((x for x in self.slots if x.task is None and x.cache), None)
            if idle is None:
                break
            self.log(f"nextn serve: --kv-unified: purging idle slot {idle.id} ({len(idle.cache)} cells)")
            with self._cv:
                idle.erase()
        else:
            return True
        self.log(f"nextn serve: --kv-unified: the pool of {self.pool} cells is full; failing the busy requests")
        for x in self.slots:
            if x.task is not None:
                t = x.task
                self._free(x, failed=True)
                t.post("error", ApiError("Context size has been exceeded.", "server_error"))
        return False

    def _finish(self, s: Slot, g) -> None:
        o = s.task.outcome
        st = g.stats
        o.tokens, o.finish, o.n_past = g.tokens, g.finish_reason, g.n_past
        o.drafted, o.accepted, o.rounds, o.accepted_at = st.drafted, st.accepted, st.rounds, list(st.accepted_at)
        o.plain_rounds = st.plain_rounds
        self._report(s, o)

    def _report(self, s: Slot, o: Outcome) -> None:
        self.metrics.add(o, len(o.tokens))
        task = s.task
        self._free(s)            # first: a client that reads /slots after its answer sees the slot idle, cache kept
        task.post("done", o)

    def _free(self, s: Slot, failed: bool = False) -> None:
        with self._cv:
            s.release(failed)
