"""`nextn serve`: a llama-server–compatible HTTP server (OpenAI chat and completions, llama-server's /completion,
streaming, speculation stats, parallel slots). Data flow: HTTP (app.py, routes_*.py) → params.py → slots.py
(one scheduler thread, N sequences of one loaded model) → runtime/speculative.py `decode` → responses.py / sse.py.

`start(...)` loads the model in a background thread while the HTTP server already answers (503 until loaded);
`serve(...)` runs it until interrupted. The runtime reaches the compiler only through `nextn.compiler.entry`
(compile a GGUF on first use), like `nextn run`.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field

from nextn.common.compile_options import CompileOptions
from nextn.common.errors import NextnError
from .params import ServerDefaults


@dataclass
class ServeOptions:
    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int | None = None          # -c: total cells, split over the slots (llama-server)
    n_batch: int | None = None           # -b: prompt batch size (prefill and progress events per batch)
    kv_unified: bool = False             # --kv-unified: every slot may use all -c cells, their sum stays <= -c
    sleep_idle_seconds: int = -1         # --sleep-idle-seconds: unload the model after this idle time (-1: never)
    n_parallel: int = 1                  # -np
    threads: int | None = None           # -t (None: runtime/threads.py's default)
    draft: str | None = None             # -md
    device: str = "cpu"
    # --target, --arch, --mtp-dense-attention, -ctk / -ctv, --spec-draft-vocab: a GGUF is compiled with them, an
    # artifact directory must have the KV types and draft head asked (nextn.runtime.load)
    compile_options: CompileOptions = field(default_factory=CompileOptions)
    mtp_index_share: bool | None = None  # --mtp-index-share / --no-...: None = the GGUF's (nextn.runtime.load)
    chat_template_file: str | None = None
    chat_template: str | None = None     # --chat-template: a built-in name or Jinja text (wins over the file)
    api_keys: list = field(default_factory=list)
    metrics: bool = False
    slots: bool = True
    alias: str | None = None             # -a: comma-separated names; the first in sorted order names the model
    tags: str | None = None              # --tags: comma-separated, informational (/v1/models)
    spec_type: str | None = None         # None: draft-mtp when the model has a NextN block
    slot_prompt_similarity: float = 0.1  # -sps (llama-server's default)
    cors_origins: tuple = ("*",)         # --cors-origins (llama-server's default: every origin)
    slot_save_path: str | None = None    # --slot-save-path: POST /slots/{id}?action=save|restore files
    cache_ram: int = 8192                # --cache-ram MiB: host-memory prompt cache (-1: no limit, 0: off)
    cache_idle_slots: bool = True        # --cache-idle-slots: idle slots saved to it when a task starts
    defaults: ServerDefaults = field(default_factory=ServerDefaults)
    draft_vocab_file: str | None = None  # --spec-draft-vocab-file (nextn.runtime.load)


def load_state(state, opt: ServeOptions, log) -> None:
    """Load the model into `state` (app.ServerState) and start the scheduler. Raises NextnError."""
    from ..api import load
    from ..params import resolve_spec_type
    from .chat_template import GLM_END_OF_TURN, ChatTemplate
    from .slots import Scheduler

    d = opt.defaults
    want_spec = opt.spec_type != "none"
    per_slot = opt.ctx_size if opt.kv_unified else opt.ctx_size // opt.n_parallel if opt.ctx_size else None
    m = load(opt.model, ctx_size=per_slot, spec=want_spec, draft=opt.draft, log=log, device=opt.device,
             threads=opt.threads, mtp_index_share=opt.mtp_index_share, draft_vocab_file=opt.draft_vocab_file,
             max_draft=d.n_max if d.n_max != "auto" else None,   # requests only lower n_max
             options=opt.compile_options)
    loaded = m.loaded
    d.spec_type = resolve_spec_type(opt.spec_type, m.has_mtp, opt.model, "-md")
    if d.spec_type != "none" and d.n_max != "auto" and d.n_max > m.max_draft:
        log(f"--spec-draft-n-max {d.n_max} lowered to the engine's maximum {m.max_draft}")
        d.n_max = m.max_draft
    ctx = per_slot or (loaded.n_ctx if opt.kv_unified else loaded.n_ctx // opt.n_parallel)
    sequences = [loaded.new_sequence(ctx) for _ in range(opt.n_parallel)]
    tok = m.tokenizer
    turn_ends = {tok.token_id(t) for t in GLM_END_OF_TURN} - {None}
    state.eog, state.chat_eog = tok.eog_ids, frozenset(tok.eog_ids | turn_ends)
    state.template = ChatTemplate.load(loaded.files.main.fields, opt.chat_template_file,
                                       tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
                                       tok.token_text(tok.eos_id), inline=opt.chat_template)
    state.model = m
    state.scheduler = Scheduler(sequences, tok.token_to_bytes, log=log, speculative=d.spec_type != "none",
                                similarity=opt.slot_prompt_similarity, pool=ctx if opt.kv_unified else None,
                                n_batch=opt.n_batch, cache_ram=opt.cache_ram, cache_idle_slots=opt.cache_idle_slots,
                                verbose=d.verbose)
    state.scheduler.start()


def make_state(opt: ServeOptions):
    from importlib.metadata import version

    from .app import ServerState

    try:     # llama-server's build string is b<build>-<commit>; clients and its tests read the leading "b"
        fp = f"b{version('nextn')}-nextn"
    except Exception:
        fp = "b0-nextn"
    # llama-server: aliases are a std::set, the first of it (sorted) is the model's name
    aliases = sorted({a.strip() for a in (opt.alias or "").split(",") if a.strip()})
    tags = sorted({t.strip() for t in (opt.tags or "").split(",") if t.strip()})
    name = aliases[0] if aliases else os.path.basename(os.path.normpath(opt.model))
    opt.defaults.n_parallel = opt.n_parallel
    return ServerState(defaults=opt.defaults, api_keys=list(opt.api_keys), metrics_enabled=opt.metrics,
                       slots_enabled=opt.slots, model_name=name, aliases=aliases, tags=tags,
                       model_path=os.path.abspath(opt.model),
                       fingerprint=fp, cors_origins=tuple(opt.cors_origins), slot_save_path=opt.slot_save_path)


class Running:
    """A started server: `url`, `state`, `stop()`; `error` is the NextnError that stopped loading, if any."""

    def __init__(self, opt: ServeOptions, log=None):
        import uvicorn

        from .app import create_app

        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        if opt.n_parallel < 1:
            raise NextnError(f"-np {opt.n_parallel}: expected >= 1")
        self.opt, self.error = opt, None
        self.state = make_state(opt)
        self.state.log = self.log
        if opt.sleep_idle_seconds > 0:
            from .sleep import Sleeper

            self.state.sleeper = Sleeper(self.state, opt.sleep_idle_seconds,
                                         lambda: load_state(self.state, opt, self.log), self.log)
        cfg = uvicorn.Config(create_app(self.state), host=opt.host, port=opt.port, log_level="warning",
                             lifespan="off", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(cfg)
        # --host a,b: llama-server listens on each address of a comma-separated list
        self.hosts = [h.strip() for h in opt.host.split(",") if h.strip()] or ["127.0.0.1"]
        first = self.hosts[0]
        self.url = f"http://[{first}]:{opt.port}" if ":" in first else f"http://{first}:{opt.port}"
        self.loaded = threading.Event()

    def _load(self) -> None:
        try:
            load_state(self.state, self.opt, self.log)
            self.state.ready = True
            if self.state.sleeper is not None:
                self.state.sleeper.start()
            self.log(f"nextn serve: {self.state.model_name} ready on {self.url} ({self.opt.n_parallel} slot(s) of "
                     f"{self.state.scheduler.n_ctx} cells, speculation: {self.opt.defaults.spec_type}, "
                     f"threads: {self.state.scheduler.threads})")
        except NextnError as e:
            self.error = e
            self.server.should_exit = True
        except Exception as e:   # noqa: BLE001 - reported as one line, the server stops
            self.error = NextnError(f"loading failed: {type(e).__name__}: {e}")
            self.server.should_exit = True
        finally:
            self.loaded.set()

    def run(self) -> None:
        """Serve in this thread until interrupted (Ctrl+C) or loading fails; raises that NextnError."""
        socks = [listen(h, self.opt.port) for h in self.hosts] if len(self.hosts) > 1 else None
        threading.Thread(target=self._load, name="nextn-load", daemon=True).start()
        try:
            self.server.run(sockets=socks)
        finally:
            if self.state.sleeper is not None:
                self.state.sleeper.stop()
            if self.state.scheduler is not None:
                self.state.scheduler.stop()
        if self.error is not None:
            raise self.error

    def start_background(self) -> "Running":
        """Serve from a background thread (tests, embedding); returns once the socket listens."""
        import time

        self._thread = threading.Thread(target=self.run_quiet, name="nextn-http", daemon=True)
        self._thread.start()
        t0 = time.time()
        while not self.server.started and self._thread.is_alive() and time.time() - t0 < 60:
            time.sleep(0.02)
        return self

    def run_quiet(self) -> None:
        try:
            self.run()
        except NextnError:
            pass

    def stop(self) -> None:
        self.server.should_exit = True
        if getattr(self, "_thread", None) is not None:
            self._thread.join(timeout=15)


def listen(host: str, port: int):
    """A listening TCP socket on host:port (IPv6 when the address has a colon). Raises NextnError."""
    import socket

    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise NextnError(f"--host {host}: cannot listen on port {port} ({e.strerror or e})") from None
    return sock


def serve(opt: ServeOptions, log=None) -> None:
    Running(opt, log).run()
