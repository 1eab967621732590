"""The Python API: `nextn.runtime.load(...)` → `Model` with `generate`, `logits`, `mtp_logits`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine import Engine
from .speculative import SpecStats, generate as _generate


@dataclass
class GenerateResult:
    """`ids`: generated token ids (after the prompt); `text`: their detokenized text; `stats`: speculation
    counters; `prompt_tokens`: prompt length; timings in seconds; `finish_reason` ∈ {eos, length}."""

    prompt_tokens: int
    ids: list[int]
    text: str
    stats: SpecStats
    prefill_s: float
    decode_s: float
    finish_reason: str
    spec_type: str
    n_max: int
    vm_s: dict

    @property
    def tokens_per_s(self) -> float:
        return len(self.ids) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def python_share(self) -> float:
        return max(0.0, 1.0 - sum(self.vm_s.values()) / self.decode_s) if self.decode_s > 0 else 0.0

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "tokens": self.ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "spec_type": self.spec_type,
            "spec_draft_n_max": self.n_max,
            "stats": self.stats.to_json(),
            "timings": {"prefill_s": self.prefill_s, "decode_s": self.decode_s, "tokens_per_s": self.tokens_per_s,
                        "draft_s": self.vm_s.get("mtp_draft", 0.0), "verify_s": self.vm_s.get("verify", 0.0),
                        "mtp_rows_s": self.vm_s.get("mtp_rows", 0.0)},
        }


class Model:
    """A compiled GLM model ready to generate. Build with `nextn.runtime.load`."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._tok = None

    @property
    def tokenizer(self):
        if self._tok is None:
            from .tokenizer import Tokenizer

            self._tok = Tokenizer.from_gguf_fields(self.engine.files.main.fields)
        return self._tok

    @property
    def has_mtp(self) -> bool:
        return self.engine.has_mtp

    def generate(self, prompt: str | list[int], n_predict: int = 64, spec_type: str = "draft-mtp",
                 n_max: int = 3, temp: float = 0.0, seed: int | None = None, ignore_eos: bool = False) -> GenerateResult:
        """Generate after `prompt` (text, tokenized without any prefix, or token ids).

        `spec_type` "draft-mtp" speculates with the NextN head (depth `n_max`), "none" decodes plainly; greedy
        output (`temp` 0) is identical either way. Raises NextnError for a prompt that does not fit the context.
        """
        from .errors import NextnError

        if spec_type not in ("none", "draft-mtp"):
            raise NextnError(f"--spec-type '{spec_type}': expected none or draft-mtp")
        if n_max < 1:
            raise NextnError(f"--spec-draft-n-max {n_max}: expected >= 1")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        spec = spec_type == "draft-mtp"
        g = _generate(self.engine, ids, n_predict, spec=spec, n_max=n_max, temp=temp, seed=seed,
                      eog_ids=frozenset() if ignore_eos else self.tokenizer.eog_ids)
        return GenerateResult(len(ids), g.tokens, self.tokenizer.decode(g.tokens), g.stats, g.prefill_s, g.decode_s,
                              g.finish_reason, spec_type, n_max if spec else 0, g.vm_s)

    def logits(self, token_ids) -> np.ndarray:
        """Trunk logits `[T, n_vocab]` float32 for positions 0..T-1."""
        return self.engine.logits(token_ids)

    def mtp_logits(self, token_ids) -> np.ndarray:
        """Teacher-forced NextN logits `[T, n_vocab]` float32 (row p: token p + trunk hidden p-1, zeros at p = 0;
        predicts token p+1)."""
        return self.engine.mtp_logits(token_ids)


def load(path: str, target: str = "llvm", ctx_size: int | None = None, spec: bool = True,
         draft: str | None = None, log=None) -> Model:
    """Load an artifact directory, or a GGUF (compiled for `target` and cached first).

    `spec=False` leaves the NextN tensors unread. `draft` is an MTP-only GGUF next to a trunk-only model.
    Raises NextnError (missing/corrupt files, hash mismatch, unsupported arch, bad tensors)."""
    return Model(Engine.open(path, target=target, ctx_size=ctx_size, load_mtp=spec, draft_path=draft, log=log))
