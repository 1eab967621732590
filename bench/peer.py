"""Find the peer's binaries: llama.cpp built by `bench/peer_llamacpp.sh` (llama-cpp-python==0.3.36 sdist).

    from peer import peer_tools, peer_tool
    peer_tool("llama-bench")          # absolute path, or PeerMissing with the command that builds it

The build script prints one `name=path` line per tool; this module reads the same cache folder
(`$NEXTN_PEER_DIR`, default ~/.cache/nextn-peer) without running the build, so a bench never starts a
15-minute compile by surprise.
"""
from __future__ import annotations

import os

TOOLS = ("llama-bench", "llama-completion", "llama-speculative-simple", "llama-server", "llama-quantize",
         "llama-gguf-split")
BUILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_llamacpp.sh")


class PeerMissing(RuntimeError):
    """A peer binary is not built; the message says how to build it."""


def peer_dir() -> str:
    return os.environ.get("NEXTN_PEER_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nextn-peer")


def peer_tools() -> dict[str, str]:
    """{tool name: absolute path} of the built peer binaries that exist (possibly empty)."""
    bin_dir = os.path.join(peer_dir(), "bin")
    return {t: os.path.join(bin_dir, t) for t in TOOLS if os.access(os.path.join(bin_dir, t), os.X_OK)}


def peer_version() -> str | None:
    """What the peer was built from (the build script's stamp: sdist version and CMake flags), or None."""
    try:
        with open(os.path.join(peer_dir(), "bin", ".stamp")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def peer_tool(name: str) -> str:
    """Absolute path of one peer binary; PeerMissing (naming the build command) when it is not built."""
    if name not in TOOLS:
        raise ValueError(f"unknown peer tool {name!r}; expected one of {', '.join(TOOLS)}")
    path = peer_tools().get(name)
    if path is None:
        raise PeerMissing(f"{name} not found in {os.path.join(peer_dir(), 'bin')}; build the peer once with "
                          f"`bash {os.path.relpath(BUILD)}` (~15 min on 2 cores; NEXTN_PEER_DIR picks the folder)")
    return path
