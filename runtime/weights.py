"""The model's weights as the artifact's buffer plan lays them out.

The GGUF file(s) an artifact was compiled from — the model, and an MTP-only draft for a trunk-only model — are
checked against the manifest (size and header identity: the same metadata and tensor table, hence the same
hyper-parameters, tensor types, shapes and offsets; common/gguf.py `GGUFFile.identity`), then
each planned buffer is read from the file its plan entry names ("role"), packed by its format
(nextn.common.quant), checked against the planned dtype and shape, and put on the device once. With speculation
off the NextN-only buffers are never read, and the draft file is not even opened.
"""
from __future__ import annotations

import os

from nextn.common.errors import NextnError
from nextn.common.gguf import GGUFFile


class ArtifactFiles:
    """The artifact's GGUF files, opened: `main` (role "model") and `draft` (role "draft", or None).

    `model_path` / `draft_path` override the paths the manifest records. Raises NextnError when a file is
    missing, is not the file the artifact was compiled from, or a draft is given to an artifact compiled without one."""

    def __init__(self, artifact, model_path: str | None = None, draft_path: str | None = None,
                 with_draft: bool = True):
        roles = {f["role"]: f for f in artifact.manifest["model_files"]}
        if draft_path is not None and "draft" not in roles:
            raise NextnError(f"{draft_path}: {artifact.path} was compiled without an MTP draft GGUF; recompile with "
                             f"--model-draft to use it")
        self.main = GGUFFile.open(model_path or artifact.model_path("model"))
        self.draft = None
        if with_draft and "draft" in roles:
            self.draft = GGUFFile.open(draft_path or artifact.model_path("draft"))
        for role, f in (("model", self.main), ("draft", self.draft)):
            if f is not None:
                _check_same_model(roles[role], f)

    def of_role(self, role: str) -> GGUFFile:
        f = self.main if role == "model" else self.draft
        if f is None:
            raise NextnError(f"{self.main.path}: the artifact reads tensors from a {role} GGUF, none is open")
        return f

    @property
    def files(self) -> list[GGUFFile]:
        return [self.main] + ([self.draft] if self.draft is not None else [])


def _check_same_model(entry: dict, f: GGUFFile) -> None:
    if f.size != entry["size"] or f.identity() != entry["identity"]:
        raise NextnError(f"{f.path}: not the model this artifact was compiled from ({entry['path']}): its metadata, "
                         f"tensor table or size differs; recompile with `nextn compile`")


def load_weights(files: ArtifactFiles, plan: list[dict], to_device, rows: dict | None = None) -> dict:
    """{buffer name: device tensor} for every entry of `plan` (the manifest's buffer_plan.weights, already filtered
    to what will run), reading each tensor once; `to_device(np.ndarray)` uploads. A plan entry with `rows` R (the
    reduced draft head, compiler/graphs.py `reduce_head`) holds the tensor's rows `rows[R]` (int array), gathered
    here into a copy (a format's rows are whole blocks, so a row gather of its main buffer is exact). Raises
    NextnError naming the file and tensor when a tensor does not load as planned."""
    import numpy as np

    by_tensor: dict[tuple, list[dict]] = {}
    for b in plan:
        by_tensor.setdefault((b["tensor"], b.get("rows")), []).append(b)
    bufs = {}
    for (tname, sel), blist in by_tensor.items():
        f = files.of_role(blist[0]["role"])
        w = f.load(tname, quantized=blist[0]["kind"] != "f32")
        arrays = list(w.arrays)
        if sel is not None:
            arrays[0] = np.ascontiguousarray(np.take(arrays[0], np.asarray(rows[sel], np.int64), axis=-2))
        for b, arr in zip(blist, arrays):
            if list(arr.shape) != b["shape"] or str(arr.dtype) != b["dtype"]:
                raise NextnError(f"{f.path}: tensor '{tname}' loads as {arr.dtype}{list(arr.shape)}, "
                                 f"the artifact expects {b['dtype']}{b['shape']}; recompile the artifact")
            bufs[b["buffer"]] = to_device(arr)
    return bufs


def copied_bytes(files: ArtifactFiles, plan: list[dict]) -> int:
    """Bytes of `plan` the CPU device will hold in its own memory (what the memory budget counts), read from the
    headers before anything loads; the rest are views of the mapped GGUF. As `load_weights` with `Device.weight`: a
    tensor's first buffer is a view when the kernels read the file's layout (a format's blocks, F32, a 16-bit type
    kept 16-bit: every kind but "f32" of a non-F32 tensor) and its data is ALIGNMENT-aligned (the map is page-aligned,
    so the file offset decides); a widened float32 tensor, a misaligned one and a format's further buffers (tables
    built at load) are new memory."""
    from nextn.common.quant.format import ALIGNMENT

    total, seen = 0, set()
    for b in plan:
        f = files.of_role(b["role"])
        first = (b["tensor"], b.get("rows")) not in seen
        seen.add((b["tensor"], b.get("rows")))
        in_place = first and not b.get("rows") and (b["kind"] != "f32" or f.tensor_type(b["tensor"]) == "F32") and \
            f.tensors[b["tensor"]].data_offset % ALIGNMENT == 0
        total += 0 if in_place else b["nbytes"]
    return total
