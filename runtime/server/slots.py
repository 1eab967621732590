"""Parallel slots: one compiled module and one set of weights, N sequences with their own static state.

Each slot owns an engine *sequence* (`Engine.sequence()`: its own trunk and NextN KV buffers, same VM and weights),
and runs one request at a time as a `speculative.decode` generator, which carries that request's speculation state,
sampler RNG and counters. One background thread, the scheduler, steps the busy slots round-robin, one decode step
(prefill, or one verify round) per turn, so the asyncio loop that serves HTTP never waits on the model and a long
request does not hold the others back. More requests than slots wait in a FIFO queue. A request that finishes, hits
a finish rule, fails or whose client went away frees its slot; its KV cells are simply overwritten by the next
request of that slot (static, position-indexed KV: a new sequence starts at position 0) and no slot ever reads or
writes another slot's buffers. Results travel to the asyncio side through the request's `post` callback:
("tokens", [ids]) per step, then ("done", Outcome) or ("error", ApiError).
Semantics of the slot cycle: llama.cpp tools/server/server-context.cpp (`update_slots`, `process_token`).
"""
from __future__ import annotations

import collections
import itertools
import sys
import threading
import time
from dataclasses import dataclass, field

from nextn.common.errors import NextnError

from ..speculative import decode
from .errors import ApiError
from .metrics import Metrics
from .params import GenParams
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
    def __init__(self, i: int, engine):
        self.id, self.engine = i, engine
        self.task: Task | None = None
        self.steps = None
        self.n_gen = 0

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    def start(self, task: Task, token_bytes) -> None:
        p = task.params
        o = task.outcome
        o.slot, o.n_prompt, o.t_start = self.id, len(task.prompt_ids), time.perf_counter()
        o.n_predict = p.n_predict
        budget = self.n_ctx if p.n_predict < 0 else max(1, p.n_predict)
        self.task, self.n_gen = task, 0
        self.steps = decode(self.engine, task.prompt_ids, budget, spec=p.spec_type == "draft-mtp",
                            n_max=p.n_max if p.spec_type == "draft-mtp" else 0, temp=p.temperature,
                            seed=None if p.seed < 0 else p.seed & 0xFFFFFFFF, eog_ids=task.eog_ids,
                            top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, n_min=p.n_min, p_min=p.p_min,
                            draft_sampling=p.draft_sampling, stop=p.stop, token_bytes=token_bytes)

    def release(self) -> None:
        if self.steps is not None:
            self.steps.close()
        self.task, self.steps = None, None

    def to_json(self) -> dict:
        t = self.task
        n_prompt = len(t.prompt_ids) if t else 0
        return {"id": self.id, "id_task": t.id if t else -1, "n_ctx": self.n_ctx, "n_prompt_tokens": n_prompt,
                "n_prompt_tokens_processed": n_prompt if self.n_gen else 0, "n_prompt_tokens_cache": 0,
                "speculative": bool(t and t.params.spec_type != "none"), "is_processing": t is not None,
                "next_token": [{"has_next_token": t is not None, "has_new_line": False,
                                "n_remain": (t.params.n_predict - self.n_gen if t and t.params.n_predict >= 0 else -1),
                                "n_decoded": self.n_gen}]}


class Scheduler:
    """Start with `start()`; `submit(task)` from any thread; `cancel(task)` when its client is gone."""

    def __init__(self, engines, token_bytes, metrics: Metrics | None = None, log=None):
        self.slots = [Slot(i, e) for i, e in enumerate(engines)]
        self.token_bytes = token_bytes
        self.metrics = metrics or Metrics()
        self.log = log or (lambda m: print(m, file=sys.stderr))
        self._queue: collections.deque[Task] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="nextn-scheduler", daemon=True)
        self.threads = 0                 # CPU threads of this thread's TVM pool (the one every engine call uses)
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

        self.threads = in_this_thread()    # this thread's pool makes every engine call: sized by -t
        self._started.set()
        while True:
            with self._cv:
                while not self._stop and not self._queue and all(s.task is None for s in self.slots):
                    self._cv.wait()
                if self._stop:
                    for s in self.slots:
                        s.release()
                    return
                for s in self.slots:
                    if s.task is None and self._queue:
                        task = self._queue.popleft()
                        s.start(task, self.token_bytes)
                busy = [s for s in self.slots if s.task is not None]
            for s in busy:
                self._step(s)

    def _step(self, s: Slot) -> None:
        task = s.task
        o = task.outcome
        if task.cancelled.is_set():
            self._free(s)
            return
        try:
            toks = next(s.steps)
        except StopIteration as e:
            self._finish(s, e.value)
            return
        except NextnError as e:
            task.post("error", ApiError(str(e), "server_error"))
            self._free(s)
            return
        except Exception as e:   # a bug: answer 500 and keep serving the other slots
            self.log(f"nextn serve: slot {s.id}: {type(e).__name__}: {e}")
            task.post("error", ApiError(f"internal error: {type(e).__name__}: {e}", "server_error"))
            self._free(s)
            return
        now = time.perf_counter()
        if s.n_gen == 0:
            o.t_prompt = now
        if task.params.n_predict == 0:   # the prompt is evaluated, nothing is generated (llama-server: n_predict 0)
            o.t_last, o.finish, o.n_past = 0.0, "length", o.n_prompt
            self._report(s, o)
            return
        o.t_last = now
        s.n_gen += len(toks)
        task.post("tokens", toks)

    def _finish(self, s: Slot, g) -> None:
        o = s.task.outcome
        st = g.stats
        o.tokens, o.finish, o.n_past = g.tokens, g.finish_reason, g.n_past
        o.drafted, o.accepted, o.rounds, o.accepted_at = st.drafted, st.accepted, st.rounds, list(st.accepted_at)
        o.plain_rounds = st.plain_rounds
        self._report(s, o)

    def _report(self, s: Slot, o: Outcome) -> None:
        self.metrics.add(o, len(o.tokens))
        s.task.post("done", o)
        self._free(s)

    def _free(self, s: Slot) -> None:
        with self._cv:
            s.release()
