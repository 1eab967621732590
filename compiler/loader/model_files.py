"""A model as one or two GGUF files: bundled (trunk + NextN), trunk-only, or trunk-only + MTP-only draft.

Layout detection follows llama.cpp (src/llama-model.cpp tensor loading; docs/design.md "GGUF"): an MTP-only
file declares the full `block_count` and `nextn_predict_layers` but has no `blk.0.attn_norm.weight`; a trunk-only
file has no `blk.{n_layer}.nextn.eh_proj.weight` (or no `nextn_predict_layers`). NextN tensors are only read
when speculation is requested (`load_mtp`).
"""
from __future__ import annotations

from nextn.common.errors import NextnError
from nextn.common.gguf import GGUFFile


class ModelFiles:
    """Resolve tensor names to files and validate every tensor the chosen entry points need.

    Raises NextnError naming the file and tensor/key on any mismatch.
    """

    def __init__(self, model_path, draft_path=None, load_mtp: bool = False):
        from nextn.compiler.models import registry

        self.main = GGUFFile(model_path)
        arch = self.main.get("general.architecture", kind=str)
        self.spec = registry.get(arch, self.main.path)
        if not self.main.has_tensor("blk.0.attn_norm.weight") and self.main.get(f"{arch}.nextn_predict_layers", 0):
            raise NextnError(f"{self.main.path}: this is an MTP-only (draft) GGUF; pass the trunk GGUF as the model "
                             f"and this file as the draft (--model-draft)")
        self.config = self.spec.config_from_gguf(self.main)
        self.draft = None
        self.load_mtp = load_mtp
        c = self.config
        if draft_path is not None:
            self.draft = GGUFFile(draft_path)
            darch = self.draft.get("general.architecture", kind=str)
            if darch != arch:
                raise NextnError(f"{self.draft.path}: draft arch '{darch}' does not match the model's '{arch}'")
            dc = self.spec.config_from_gguf(self.draft)
            if dc.n_layer_nextn != 1 or dc.n_layer != c.n_layer:
                raise NextnError(f"{self.draft.path}: expected an MTP GGUF with block_count {c.n_layer + 1} and "
                                 f"'{arch}.nextn_predict_layers' = 1 (got {dc.n_layer + dc.n_layer_nextn} and {dc.n_layer_nextn})")
            if not self.draft.has_tensor(f"blk.{c.n_layer}.nextn.eh_proj.weight"):
                raise NextnError(f"{self.draft.path}: tensor 'blk.{c.n_layer}.nextn.eh_proj.weight' is missing (not an MTP GGUF)")
            self.config = c = c.with_draft(dc)
        self._owner: dict[str, GGUFFile] = {}
        for name in self.main.tensors:
            self._owner[name] = self.main
        self.has_nextn = self.draft is not None or (
            c.n_layer_nextn > 0 and self.main.has_tensor(f"blk.{c.n_layer}.nextn.eh_proj.weight"))
        if self.draft is not None:
            # The NextN block and its own fallbacks (embeddings, norm, head) come from the draft file.
            for name in self.draft.tensors:
                if name.startswith(f"blk.{c.n_layer}."):
                    self._owner[name] = self.draft
        self._validate_trunk()
        if load_mtp:
            if not self.has_nextn:
                raise NextnError(f"{self.main.path}: --spec-type draft-mtp needs NextN tensors "
                                 f"(blk.{c.n_layer}.nextn.eh_proj.weight), but this GGUF is trunk-only; "
                                 f"pass an MTP GGUF with --model-draft, or use --spec-type none")
            self.validate_nextn()

    def _validate_trunk(self):
        for name, shape in self.spec.trunk_tensors(self.config).items():
            self.main.check_tensor(name, shape)
        if self.main.has_tensor("output.weight"):
            self.main.check_tensor("output.weight", (self.config.n_vocab, self.config.n_embd))

    def validate_nextn(self) -> None:
        """Check the NextN block's tensors (and the optional ones present) have the shapes the arch expects, in the
        file that supplies them (the draft GGUF of a split pair). Raises NextnError naming the tensor."""
        f = self.draft or self.main
        for name, shape in self.spec.nextn_tensors(self.config).items():
            f.check_tensor(name, shape, "NextN block")
        for name, (_fallback, shape) in self.spec.nextn_optional(self.config).items():
            if f.has_tensor(name):
                f.check_tensor(name, shape, "NextN block")

    def has_tensor(self, name: str) -> bool:
        return name in self._owner

    def file_of(self, name: str) -> GGUFFile:
        if name not in self._owner:
            raise NextnError(f"{self.main.path}: tensor '{name}' is missing")
        return self._owner[name]

    def load(self, name: str, quantized: bool = True):
        return self.file_of(name).load(name, quantized)

    @property
    def files(self) -> list[GGUFFile]:
        return [self.main] + ([self.draft] if self.draft is not None else [])
