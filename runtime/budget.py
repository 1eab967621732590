"""Memory budget: before a model allocates anything, the bytes it will need against the memory it can have, so a
context or KV type that does not fit ends in one line that says what would, never in an allocator's error.

What is counted (`Need`):
- weights the model holds in its own memory: on a GPU every planned weight buffer (device memory); on the CPU
  the buffers that are copies (`weights.copied_bytes`). Weights that are views of the memory-mapped GGUF are file
  pages: the kernel can drop and re-read them, and they are already in MemAvailable once cached, so they are not
  counted against it; they are reported, and when they and the rest exceed MemTotal the line says the weights would
  be read from disk again for every token (a warning, as llama.cpp's mmap loads them anyway).
- KV and state buffers: the manifest's `kv_cache.bytes_per_token` (trunk, + NextN when speculating: the compiler's
  accounting, compiler/compile.py `kv_plan`) per context cell plus the states that do not grow with it; for an
  artifact without it, what `state.state_buffers` allocates (`state.state_bytes`). The manifest's
  `kv_cache.caches` says which type each cache holds; the bytes under another type come from
  `nextn.common.kv_types` (what a smaller KV type would take).
- workspace: the intermediates of the largest step, a prefill chunk (`LoadedModel.prefill_chunk` rows,
  `workspace_bytes`): an estimate, not a measurement; on a GPU plus the storage the artifact's CUDA graphs allocate
  once (the manifest's `cuda_graph.static_bytes`, the compiler's plan).

Available (`available`): CPU: MemAvailable from /proc/meminfo, lowered to the cgroup's room (memory.max -
memory.current) inside a container; GPU: the device's free memory as TVM's runtime reports it (cudaMemGetInfo).
"""
from __future__ import annotations

from dataclasses import dataclass

from nextn.common.errors import NextnError

from . import state

GiB = 1 << 30
MEMINFO = "/proc/meminfo"
CGROUP = "/sys/fs/cgroup"
CTX_STEP = 256          # a suggested -c is a multiple of this (llama.cpp pads its context to 256 cells)


@dataclass
class Need:
    weights: int            # weight bytes in the model's own memory (copies on the CPU, everything on a GPU)
    weights_mapped: int     # CPU: weight bytes used in place from the mapped GGUF (file pages, not counted)
    kv: int                 # KV and state buffers for n_ctx cells
    workspace: int          # intermediates of the largest step (estimate)
    n_ctx: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.workspace


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _meminfo(path: str = MEMINFO) -> dict:
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.partition(":")
            parts = v.split()
            if parts and parts[0].isdigit():
                out[k] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def _cgroup_room(root: str = CGROUP) -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), None when unlimited or unknown."""
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((ln.strip().split("::", 1)[1] for ln in f if ln.startswith("0::")), "/")
        d = root + rel.rstrip("/")
        with open(f"{d}/memory.max") as f:
            mx = f.read().strip()
        if mx == "max":
            return None
        with open(f"{d}/memory.current") as f:
            return max(0, int(mx) - int(f.read().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def available(device) -> tuple[int, int | None, str]:
    """(bytes available, total bytes or None, what they are) for `device` (runtime/device.py Device)."""
    if device.kind == "cpu":
        mi = _meminfo()
        avail, what = mi.get("MemAvailable", 0), "MemAvailable"
        room = _cgroup_room()
        if room is not None and room < avail:
            avail, what = room, "the cgroup's memory.max - memory.current"
        return avail, mi.get("MemTotal"), what
    free = device.dev.available_global_memory
    return int(free or 0), device.dev.total_global_memory, f"free memory of {device.kind}:{device.index}"


def workspace_bytes(hp: dict, rows: int) -> int:
    """Intermediates of a step over `rows` rows (a prefill chunk): float32 rows of the widest activations — the
    residual and attention rows (4 × n_embd, q/k/v/o of the heads), the expert FFN rows of the routed experts (gate,
    up and their product), the shared / dense FFN — plus one logits row. An estimate: Relax's memory planner reuses
    buffers, TVM's pool rounds them up."""
    e = int(hp.get("n_embd", 0))
    heads = int(hp.get("n_head", 0)) * int(hp.get("head_dim", hp.get("hd_k", 0)) or 0)
    ffn = max(int(hp.get("n_ff", 0) or 0), int(hp.get("n_ff_exp", 0) or 0) * int(hp.get("n_expert_used", 0) or 0))
    per_row = 4 * e + 4 * heads + 3 * ffn
    return 4 * (rows * per_row + int(hp.get("n_vocab", 0)))


def need(model, n_ctx: int, weights: bool = True) -> Need:
    """What `model` (before loading) needs for n_ctx cells; `weights=False`: KV only (another sequence). The
    workspace is that of a prefill chunk of `model.prefill_chunk` rows."""
    from .weights import copied_bytes

    if not weights:
        w = mapped = ws = 0
    elif model.device.kind == "cpu":
        w = copied_bytes(model.files, model._plan)
        mapped, ws = model.weight_bytes - w, workspace_bytes(model.hparams, model.prefill_chunk)
    else:
        w, mapped = model.weight_bytes, 0
        ws = workspace_bytes(model.hparams, model.prefill_chunk) + model.graph_bytes
    return Need(w, mapped, kv_bytes(model, n_ctx), ws, n_ctx)


def kv_bytes_per_cell(model) -> int:
    """Bytes one context cell takes in `model`'s KV and state buffers (the manifest's kv_cache.bytes_per_token)."""
    bpt = (model.artifact.manifest.get("kv_cache") or {}).get("bytes_per_token")
    if not bpt:
        one, none = (state.state_bytes(model.entries, model.state_sizes(n)) for n in (1, 0))
        return one - none
    return int(bpt["trunk"]) + (int(bpt["nextn"]) if model.has_mtp else 0)


def kv_bytes(model, n_ctx: int) -> int:
    """KV and state bytes of `model` for n_ctx cells: per-cell bytes, plus the states that do not grow with -c."""
    return state.state_bytes(model.entries, model.state_sizes(0)) + n_ctx * kv_bytes_per_cell(model)


def _kv_as(model, n_ctx: int, kv_name: str) -> int | None:
    """KV bytes for n_ctx cells if every KV cache held type `kv_name` (manifest kv_cache.caches; None without)."""
    caches = (model.artifact.manifest.get("kv_cache") or {}).get("caches")
    if not caches:
        return None
    from nextn.common.kv_types import KV_TYPES

    return state.state_bytes(model.entries, model.state_sizes(n_ctx), retype={s: (KV_TYPES[t], KV_TYPES[kv_name])
                                                               for s, t in caches.items()})


def fits(model, n_ctx: int, avail: int, weights: bool = True) -> str | None:
    """None when n_ctx cells fit in `avail` bytes, else what would: a smaller -c and / or a smaller KV type."""
    n = need(model, n_ctx, weights)
    if n.total <= avail:
        return None
    fixed = n.weights + n.workspace + kv_bytes(model, 0)
    per_cell = kv_bytes_per_cell(model)
    hints = []
    c = (avail - fixed) // per_cell if per_cell else 0
    if c >= CTX_STEP:
        c -= c % CTX_STEP
    if c >= 2:
        hints.append(f"-c {c} would fit")
    kc = model.artifact.manifest.get("kv_cache") or {}
    if kc.get("caches"):
        from nextn.common.kv_types import KV_TYPES

        have = max(KV_TYPES[t].block_bytes / KV_TYPES[t].block for t in kc["caches"].values())
        for name, t in sorted(KV_TYPES.items(), key=lambda kv: -kv[1].block_bytes / kv[1].block):
            kv = _kv_as(model, n_ctx, name)
            if t.block_bytes / t.block < have and n.weights + n.workspace + kv <= avail:
                hints.append(f"-ctk {name} -ctv {name} at -c {n_ctx} would fit ({_gib(kv)} of KV)")
                break
    return "; ".join(hints) or "nothing fits: the weights and workspace alone need more"


def check(model, n_ctx: int, weights: bool = True, what: str = "") -> Need:
    """NextnError (one line: bytes needed and available, what would fit) unless `model` fits n_ctx cells. Returns
    the Need; warns through `model.log` when mapped weights would not stay in RAM."""
    n = need(model, n_ctx, weights)
    avail, total, source = available(model.device)
    hint = fits(model, n_ctx, avail, weights)
    if hint is not None:
        kc = model.artifact.manifest.get("kv_cache") or {}
        types = f" ({kc['type_k']}/{kc['type_v']})" if kc.get("type_k") else ""
        parts = ([f"weights {_gib(n.weights)}"] if weights else []) + [f"KV{types} {_gib(n.kv)}"] + \
                ([f"workspace {_gib(n.workspace)}"] if weights else [])
        mapped = f"; mapped weights {_gib(n.weights_mapped)} are file pages, not counted" if n.weights_mapped else ""
        raise NextnError(f"{model.artifact.path}: {what or 'loading'} at -c {n_ctx} needs {n.total} bytes "
                         f"({_gib(n.total)}: {' + '.join(parts)}), {avail} bytes ({_gib(avail)}) available "
                         f"({source}); {hint}{mapped}")
    if weights and n.weights_mapped and total and n.total + n.weights_mapped > total:
        log = getattr(model, "log", None)
        if log is not None:
            log(f"warning: mapped weights {_gib(n.weights_mapped)} + {_gib(n.total)} exceed this machine's "
                f"{_gib(total)} of RAM: weights will be read from disk again for every token")
    return n
