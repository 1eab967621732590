"""Start `nextn serve` from a llama-server command line, for llama.cpp's server test suite (bench/peer_server_tests.sh).

The suite (tools/server/tests/utils.py `ServerProcess.start`) runs `$LLAMA_SERVER_BIN_PATH --port P --temp T ...` and
terminates that process after each test, so this script maps the flags and replaces itself (exec) with
`python -m nextn.runtime.cli serve MODEL ...`: the suite's PID is nextn's. The model is always $NEXTN_SHIM_MODEL (the
suite's `--hf-repo` / `--model` name llama.cpp's own test models). Flags of features nextn does not have are dropped
and named on stderr; the tests that need them fail or are listed as not applicable (docs/server.md).

    NEXTN_SHIM_MODEL=tiny.gguf python bench/llama_server_shim.py --port 8080 --ctx-size 512 --parallel 2 ...

Starting Python and importing TVM, numpy and the server's modules takes ~10 s on a loaded 2-core machine, the load of
the cached tiny artifact 0.5 s, and the suite starts a server per test. So with NEXTN_SHIM_ZYGOTE=SOCKET the shim asks
a warm process (`python bench/llama_server_shim.py --zygote SOCKET LOG`, started by bench/peer_server_tests.sh, the
imports done once) to fork a `nextn serve` with these arguments, writing to the shim's own stdout and stderr (passed
over the socket: a test that reads the server's log file sees nextn's); the shim stays the process the suite sees: it
forwards SIGTERM / SIGINT to the forked server and exits with its exit status.
"""
from __future__ import annotations

import os
import sys

# llama-server flag -> nextn serve flag, both taking one value
VALUED = {"--port": "--port", "--host": "--host", "--temp": "--temp", "--seed": "--seed", "-s": "--seed",
          "--threads": "-t", "-t": "-t", "--alias": "--alias", "-a": "--alias", "--ctx-size": "-c", "-c": "-c",
          "--parallel": "-np", "-np": "-np", "-ctk": "-ctk", "--cache-type-k": "-ctk", "-ctv": "-ctv",
          "--cache-type-v": "-ctv", "--n-predict": "-n", "-n": "-n", "--slot-save-path": "--slot-save-path",
          "--spec-type": "--spec-type", "--api-key": "--api-key", "--spec-draft-n-max": "--spec-draft-n-max",
          "--spec-draft-n-min": "--spec-draft-n-min", "--reasoning-format": "--reasoning-format",
          "--chat-template-file": "--chat-template-file", "--cors-origins": "--cors-origins",
          "--reasoning-budget": "--reasoning-budget", "--top-k": "--top-k", "--top-p": "--top-p",
          "--min-p": "--min-p", "--tags": "--tags", "-sps": "-sps", "--slot-prompt-similarity": "-sps",
          "--sleep-idle-seconds": "--sleep-idle-seconds", "--batch-size": "-b", "-b": "-b",
          "--cache-ram": "--cache-ram", "-cram": "--cache-ram"}
FLAGS = {"--metrics": "--metrics", "--no-slots": "--no-slots", "--verbose": "--verbose", "--kv-unified": "--kv-unified",
         "-kvu": "--kv-unified", "--no-cache-idle-slots": "--no-cache-idle-slots",
         "--cache-idle-slots": "--cache-idle-slots"}
# taken with their value and dropped: the model source (always $NEXTN_SHIM_MODEL) and settings with no nextn
# counterpart (batch sizes, GPU layers, flash attention, ...)
DROP_VALUED = {"--model", "-m", "--model-url", "--hf-repo", "-hf", "--hf-file", "--ubatch-size",
               "-ub", "--n-gpu-layers", "-ngl", "-fa", "--flash-attn", "--pooling", "--grp-attn-n",
               "--grp-attn-w", "--lora", "--model-draft", "-md", "--mmproj-url", "--media-path",
               "--models-dir", "--models-max", "--models-preset", "--tools",
               "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json", "--spec-synth-len",
               "--spec-synth-rates"}
DROP_FLAGS = {"--offline", "--cont-batching", "--embedding", "--reranking", "--swa-full", "--slots",
              "--context-shift", "--no-ui", "--no-models-autoload", "--jinja", "--no-jinja",
              "--no-mmproj", "--ui-mcp-proxy", "--backend_sampling"}


def translate(argv: list[str], model: str) -> tuple[list[str], list[str]]:
    """(nextn serve arguments, dropped llama-server arguments) for a llama-server argument list."""
    out, dropped = [model], []
    i = 0
    while i < len(argv):
        a = argv[i]
        v = argv[i + 1] if i + 1 < len(argv) else None
        if a in VALUED:
            out += [VALUED[a], v]
            i += 2
        elif a in FLAGS:
            out.append(FLAGS[a])
            i += 1
        elif a in ("--reasoning", "-rea"):
            if v in ("off", "false", "0"):   # llama-server: enable_thinking false by default
                out += ["--reasoning-budget", "0"]
            i += 2
        elif a == "--chat-template":       # a built-in name or inline Jinja, as llama-server takes it
            out += ["--chat-template", v]
            i += 2
        elif a in DROP_VALUED:
            dropped += [a, v]
            i += 2
        elif a in DROP_FLAGS:
            dropped.append(a)
            i += 1
        else:
            dropped.append(a)
            i += 1
    return out, dropped


def zygote(sock_path: str, log_path: str) -> None:
    """Import what `nextn serve` needs, then fork one server per request on the unix socket `sock_path`: a request is
    one JSON line {"args", "env", "cwd"}; the answer {"pid"} at once, then {"exit": status} when that server ends.
    The request's first byte carries the shim's stdout and stderr (SCM_RIGHTS): the server writes there; without
    them, to `log_path`."""
    import json
    import socket
    import threading

    import nextn.runtime.api  # noqa: F401 - the imports are the point: every forked server starts with them done
    import nextn.runtime.cli
    import nextn.runtime.server.app  # noqa: F401
    import nextn.runtime.server.routes_generate  # noqa: F401
    import nextn.runtime.server.slots  # noqa: F401
    import tvm  # noqa: F401
    import uvicorn  # noqa: F401
    for lazy in ("jinja2", "jinja2.sandbox", "jinja2.ext", "tokenizers", "llguidance", "fastapi", "starlette.responses",
                 "nextn.compiler.entry", "nextn.common.gguf", "nextn.runtime.server.chat_template",
                 "nextn.runtime.server.grammar", "nextn.runtime.tokenizer"):   # imported by a server's first steps
        try:
            __import__(lazy)
        except ImportError:
            pass

    if os.path.exists(sock_path):
        os.unlink(sock_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(8)
    print(f"llama_server_shim: zygote ready on {sock_path}", file=sys.stderr, flush=True)

    def reap(conn, pid):
        _, status = os.waitpid(pid, 0)
        try:
            conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        except OSError:
            pass
        conn.close()

    while True:
        conn, _ = srv.accept()
        _, fds, _, _ = socket.recv_fds(conn, 1, 2)      # the shim's stdout and stderr
        req = json.loads(conn.makefile().readline())
        pid = os.fork()
        if pid == 0:                       # the server: the suite's flags, this process's imports
            srv.close()
            conn.close()
            if len(fds) == 2:              # where the suite sends llama-server's output (a test may read its log)
                os.dup2(fds[0], 1)
                os.dup2(fds[1], 2)
            else:
                fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
            os.environ.clear()
            os.environ.update(req["env"])
            os.chdir(req["cwd"])
            code = 0
            try:
                nextn.runtime.cli.main(["serve", *req["args"]])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:          # noqa: BLE001 - reported in the log, the exit status says it failed
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        threading.Thread(target=reap, args=(conn, pid), daemon=True).start()


def through_zygote(sock_path: str, args: list[str]) -> int:
    """Have the zygote fork `nextn serve args`; forward SIGTERM / SIGINT to it; return its exit status."""
    import json
    import signal
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    sys.stdout.flush()
    sys.stderr.flush()
    socket.send_fds(s, [b"F"], [1, 2])    # the server writes where this process would (the suite's log file)
    s.sendall(json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode() + b"\n")
    f = s.makefile()
    pid = json.loads(f.readline())["pid"]

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    line = f.readline()
    return json.loads(line)["exit"] if line else 1


def main() -> None:
    if sys.argv[1:2] == ["--zygote"]:
        return zygote(sys.argv[2], sys.argv[3])
    model = os.environ.get("NEXTN_SHIM_MODEL")
    if not model:
        sys.exit("llama_server_shim: set NEXTN_SHIM_MODEL to the GGUF to serve")
    args, dropped = translate(sys.argv[1:], model)
    if dropped:
        print(f"llama_server_shim: not passed to nextn serve: {' '.join(dropped)}", file=sys.stderr, flush=True)
    if os.environ.get("NEXTN_SHIM_ZYGOTE"):
        sys.exit(through_zygote(os.environ["NEXTN_SHIM_ZYGOTE"], args))
    py = os.environ.get("NEXTN_SHIM_PYTHON", sys.executable)
    os.execv(py, [py, "-m", "nextn.runtime.cli", "serve", *args])


if __name__ == "__main__":
    main()
