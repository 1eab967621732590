"""The artifact's `manifest.json`: written by the compiler (compiler/compile.py), read by the runtime.

    DIR/manifest.json   nextn/TVM versions, target, model files (path, size, header identity, shards; sha256
                        with --verify-model), arch + hparams,
                        entry points (argument order), buffer plan, libraries (file, sha256), tuning log,
                        max_draft, kv_cache (types, bytes per token), kernel_form, cuda_graph
    DIR/<library>.so    the Relax VM executable with every kernel

Reading verifies the sha256 of every library before anything opens it: a compiled library is code, and nextn
never loads one the manifest does not vouch for.
"""
from __future__ import annotations

import json
import os

from .errors import NextnError
from .hashing import sha256_file

MANIFEST = "manifest.json"
SCHEMA = 3   # 3: model files by header identity (common/gguf.py), not by sha256; 2: entry points take their
#              states and weights as two tuples (compiler/lower/to_relax.py)
# The deepest draft a request may ask for (manifest "max_draft"); a request's n_max is lowered to it. The static
# KV buffers hold any depth: this bounds the per-position stats, the adaptive depth controller and the planes of
# recurrent states (an engine keeps max_draft + 2 of them, runtime/engine.py).
MAX_DRAFT = 8


# The shape-symbol grammar of IR shapes (compiler/ir/graph.py), which the manifest records: a dimension is an int,
# a symbol ("T", "L", "C", ...) or "X//k" (symbol X divided by int k, floor). Its one home: the IR builds it with
# `div_dim`, the runtime reads it with `dim_value`, the lowering (compiler/lower/to_relax.py) with `split_dim`.
def div_dim(d, k: int):
    """`d` (an int or a symbol) divided by k (floor) as a dimension: an int, or the symbol form "X//k"."""
    if k == 1:
        return d
    if isinstance(d, int):
        return d // k
    assert "//" not in d, d
    return f"{d}//{k}"


def split_dim(d: str) -> tuple[str, int]:
    """(symbol, divisor) of a symbolic dimension: "L" -> ("L", 1), "C//4" -> ("C", 4)."""
    if "//" in d:
        base, k = d.split("//")
        return base, int(k)
    return d, 1


def dim_value(d, sizes: dict) -> int:
    """A dimension of a recorded shape once its symbols are known: an int, a symbol (`sizes`, e.g.
    {"C": 4096, "P": 5}) or "X//k"."""
    if isinstance(d, int):
        return d
    base, k = split_dim(d)
    return sizes[base] // k


def resolve_shape(shape, sizes: dict) -> tuple[int, ...]:
    return tuple(dim_value(d, sizes) for d in shape)


def library_entry(path: str, arches: list[str]) -> dict:
    """The manifest's record of one library file: {file, sha256, size, arches}."""
    return {"file": os.path.basename(path), "sha256": sha256_file(path), "size": os.path.getsize(path),
            "arches": arches}


def read_manifest(path: str) -> dict:
    """The manifest of artifact directory `path`, after checking its schema and every library's sha256.
    Raises NextnError on a missing or unreadable manifest, another schema, a missing library or a hash mismatch."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise NextnError(f"{path}: not a nextn artifact (no {MANIFEST})")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise NextnError(f"{mpath}: unreadable manifest ({e})") from None
    if manifest.get("schema") != SCHEMA:
        raise NextnError(f"{mpath}: manifest schema {manifest.get('schema')!r}, expected {SCHEMA}")
    for lib in manifest.get("libraries", []):
        lp = os.path.join(path, lib["file"])
        if not os.path.isfile(lp):
            raise NextnError(f"{lp}: library listed in the manifest is missing")
        got = sha256_file(lp)
        if got != lib["sha256"]:
            raise NextnError(f"{lp}: sha256 {got[:16]}… does not match the manifest ({lib['sha256'][:16]}…); "
                             f"refusing to load a library the manifest does not vouch for")
    if not manifest.get("libraries"):
        raise NextnError(f"{mpath}: lists no library")
    return manifest


# Weight bytes a step reads per row: what bounds decoding on a memory-bound machine (bench/realwidth.py,
# bench/device_check.py). The MoE FFN of a token reads n_expert_used of the n_expert routed experts.
ROUTED_EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def read_bytes_per_row(tensors, n_expert: int, n_expert_used: int, n_vocab: int, tied: bool | None = None) -> dict:
    """Weight bytes one row (token) reads, by category, and their `total`: the routed experts (`ffn_{gate,up,down}
    _exps`) at n_expert_used / n_expert (`routed`), one row of `token_embd` (`token_embd_row`; the whole of it as
    `lm_head` too when there is no `output.weight`: a tied lm head), `output.weight` (`lm_head`), the rest whole
    (`dense`). `tensors`: [(GGUF tensor name, bytes)], several entries per tensor allowed (a format's buffers);
    `tied`: whether the model lacks `output.weight` [default: it is not among `tensors`].
    A lower bound for k+1 rows, which may route to the same experts; KV reads are not counted."""
    if tied is None:
        tied = "output.weight" not in {n for n, _ in tensors}
    out = {"dense": 0.0, "routed": 0.0, "lm_head": 0.0, "token_embd_row": 0.0}
    for name, nbytes in tensors:
        if name.endswith(ROUTED_EXPERTS):
            out["routed"] += nbytes * n_expert_used / max(1, n_expert)
        elif name == "token_embd.weight":
            out["token_embd_row"] += nbytes / n_vocab
            out["lm_head"] += nbytes if tied else 0
        elif name == "output.weight":
            out["lm_head"] += nbytes
        else:
            out["dense"] += nbytes
    out["total"] = sum(out.values())
    return out


def step_read_bytes(manifest: dict, entry: str = "decode") -> dict:
    """`read_bytes_per_row` over the weight buffers entry point `entry` takes, in the buffer plan's bytes (the
    layout the kernels stream, repacked formats included)."""
    hp = manifest["hparams"]
    plan = {b["buffer"]: b for b in manifest["buffer_plan"]["weights"]}
    tensors = [(plan[w]["tensor"], plan[w]["nbytes"]) for w in manifest["entry_points"][entry]["weights"]]
    tied = "output.weight" not in {b["tensor"] for b in plan.values()}
    return read_bytes_per_row(tensors, int(hp.get("n_expert", 1)), int(hp.get("n_expert_used", 1)),
                              int(hp["n_vocab"]), tied)
