"""`--sleep-idle-seconds N`: after N seconds without work the server unloads its model (weights, slots and their KV,
the prompt caches) and reloads it when a request needs it, as llama-server does (tools/server/server-queue.cpp
`start_loop`, server-context.cpp `handle_sleeping_state`, `update_cached_responses`).

- Idle: no request in a slot or waiting for one, and no request in flight other than the ones that never wake the
  server, for N seconds.
- Those are /health, GET /props, /models, /v1/models and /metrics (llama-server's `create_response(true)` routes):
  while asleep they answer from what the server reported on entering sleep (`props` has `is_sleeping: true`;
  /metrics the counters then), and they do not count as work. Every other route waits for the reload first.
- /metrics' throughput gauges are reset by each scrape; a scrape while asleep resets the snapshot's, and then the
  live ones on waking, so one generation's throughput is reported once.
The counters (`Metrics`) survive a sleep, as llama-server's `server_metrics` do (only the model is reloaded).
"""
from __future__ import annotations

import gc
import threading
import time

AWAKE_ROUTES = ("/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics")


def wakes(method: str, path: str) -> bool:
    """Whether a request needs the model (and so wakes a sleeping server and counts as work)."""
    return not (path in AWAKE_ROUTES and (method == "GET" or path == "/metrics"))


class Sleeper:
    """Owns the sleep / wake cycle of one server (`state.sleeper`). `load()` loads the model into the state (and
    starts its scheduler); it runs at every wake. Thread-safe: the HTTP side calls `enter()` / `leave()` around
    every waking request and `wake()` (blocking) when `sleeping`."""

    def __init__(self, state, idle_s: float, load, log):
        self.state, self.idle_s, self._load, self.log = state, idle_s, load, log
        self.sleeping = False
        self.props = self.models = self.metrics = None     # the snapshots answered while asleep
        self._live = None                                  # the server's Metrics, kept across the sleep
        self.scraped_while_asleep = False
        self._active = 0
        self._t_last = time.monotonic()
        self._lock = threading.Lock()          # _active, _t_last, sleeping
        self._cycle = threading.Lock()         # one transition (to sleep or awake) at a time
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="nextn-sleep", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def enter(self) -> bool:
        """A waking request starts; True if the server is asleep (call `wake()` before serving it)."""
        with self._lock:
            self._active += 1
            self._t_last = time.monotonic()
            return self.sleeping

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            self._t_last = time.monotonic()

    def wake(self) -> None:
        with self._cycle:
            if not self.sleeping:
                return
            self.log("nextn serve: leaving sleep, reloading the model")
            self._load()
            self.state.scheduler.metrics = self._live         # the counters go on
            if self.scraped_while_asleep:                     # that scrape reported the buckets already
                self._live.reset_bucket()
            with self._lock:
                self.sleeping = False
                self._t_last = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            st = self.state
            if self.sleeping or not st.ready or st.scheduler is None:
                continue
            if st.scheduler.counts() != (0, 0):
                with self._lock:
                    self._t_last = time.monotonic()
                continue
            with self._lock:
                if self._active or time.monotonic() - self._t_last < self.idle_s:
                    continue
            self._sleep()

    def _sleep(self) -> None:
        from .routes_info import models_json, props_json

        with self._cycle:
            st = self.state
            with self._lock:       # checked again under the lock a waking request takes
                if self._active or time.monotonic() - self._t_last < self.idle_s or st.scheduler.counts() != (0, 0):
                    return
                self.props, self.models = props_json(st, True), models_json(st)
                self._live = st.scheduler.metrics
                self.metrics = self._live.snapshot()
                self.scraped_while_asleep = False
                self.sleeping = True
            self.log(f"nextn serve: idle for {self.idle_s:g} s, entering sleep (model unloaded)")
            st.scheduler.stop()
            st.scheduler, st.model, st.template = None, None, None
            gc.collect()
