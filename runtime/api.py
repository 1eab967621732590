"""The Python API: `nextn.runtime.load(...)` → `Model` with `generate`, `logits`, `mtp_logits`."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from nextn.common.compile_options import CompileOptions
from nextn.common.timing import python_share, tokens_per_s

from .model import LoadedModel
from .params import SamplingParams, SpecParams
from .sequence import Sequence
from .speculative import SpecStats, decode
from .threads import runtime_threads, use as use_threads


@dataclass
class GenerateResult:
    """`ids`: generated token ids (after the prompt); `text`: their detokenized text; `stats`: speculation
    counters; `prompt_tokens`: prompt length; timings in seconds; `finish_reason` ∈ {eos, stop, length}."""

    prompt_tokens: int
    ids: list[int]
    text: str
    stats: SpecStats
    prefill_s: float
    decode_s: float
    finish_reason: str
    spec_type: str
    n_max: int | str                # effective draft depth (an int, or "auto")
    vm_s: dict
    seed: int = 0                   # the RNG seed used (drawn from the OS when none was given)
    n_max_requested: int | str = 0
    threads: int = 0                # CPU threads TVM ran the kernels on (runtime.NumThreads of this thread)
    draft_vocab: int = 0            # rows of the reduced draft head (--spec-draft-vocab), 0: the full head

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_s(len(self.ids), self.decode_s)

    @property
    def python_share(self) -> float:
        """Share of decode time spent outside the compiled entry points (the loop, conversions, host copies)."""
        return python_share(self.vm_s, self.decode_s)

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "tokens": self.ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "spec_type": self.spec_type,
            "spec_draft_n_max": self.n_max,
            "spec_draft_n_max_requested": self.n_max_requested,
            "spec_draft_vocab": self.draft_vocab,
            "seed": self.seed,
            "threads": self.threads,
            "stats": self.stats.to_json(),
            "timings": {"prefill_s": self.prefill_s, "decode_s": self.decode_s, "tokens_per_s": self.tokens_per_s,
                        "draft_s": self.stats.draft_s, "verify_s": self.stats.verify_s,
                        "mtp_rows_s": self.vm_s.get("mtp_rows", 0.0), "sampling_s": self.stats.sampling_s,
                        # decode-phase seconds inside each compiled entry point, the device synchronized after
                        # every call (CUDA launches return before their kernels finish)
                        "entry_s": dict(self.vm_s)},
        }


class Model:
    """A compiled GLM model ready to generate. Build with `nextn.runtime.load`. `loaded`: the LoadedModel (VM,
    weights, device; runtime/model.py); `sequence`: the Sequence this API decodes on (its KV, made on first use)."""

    def __init__(self, loaded: LoadedModel, sequence: Sequence | None = None):
        self.loaded = loaded
        self._seq = sequence
        self._tok = None

    @property
    def sequence(self) -> Sequence:
        if self._seq is None:
            self._seq = self.loaded.new_sequence()
        return self._seq

    @property
    def tokenizer(self):
        if self._tok is None:
            from .tokenizer import Tokenizer

            self._tok = Tokenizer.from_gguf_fields(self.loaded.files.main.fields, source=self.loaded.files.main.path)
        return self._tok

    @property
    def has_mtp(self) -> bool:
        return self.loaded.has_mtp

    @property
    def max_draft(self) -> int:
        """The model's maximum draft depth; a request's n_max may only lower it."""
        return self.loaded.max_draft

    def generate(self, prompt: str | list[int], n_predict: int = 64, spec_type: str = "draft-mtp",
                 n_max: int | str = 3, temp: float = 0.0, seed: int | None = None, ignore_eos: bool = False, *,
                 n_min: int = 0, p_min: float = 0.0, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 stop=(), draft_sampling: str = "greedy", on_tokens=None, sampling: SamplingParams | None = None,
                 spec: SpecParams | None = None) -> GenerateResult:
        """Generate after `prompt` (text, tokenized without any prefix, or token ids). The options come as two
        objects (runtime/params.py), or as the keywords they are built from: `sampling` replaces n_predict, temp,
        seed, ignore_eos, top_k, top_p, min_p and stop; `spec` replaces spec_type, n_max, n_min, p_min and
        draft_sampling.

        `spec_type` "draft-mtp" speculates with the NextN head, "none" decodes plainly. `n_max`: draft depth (an
        int, lowered to `max_draft` if above it — `result.n_max` is the effective value) or "auto" (adaptive
        depth with a never-lose gate, `depth.py`). `n_min`, `p_min`: llama.cpp's --spec-draft-n-min/-p-min.
        Sampling (`temp` > 0): llama.cpp's chain top-k → top-p → min-p → temperature with a per-request `seed`;
        `draft_sampling` "greedy" verifies by sample-and-match (same seed ⇒ same text as spec off), "sample"
        draws drafts from the NextN distribution and verifies by rejection sampling (`sampling.py`). Output
        is distributed as plain sampling either way; greedy output (`temp` 0) is identical.
        `stop`: strings that end generation (the text is cut before the stop string; `ids` end with the token
        that completed it). `on_tokens(ids)` is called with each decoding step's emitted tokens as they arrive (for
        streaming; `text_stream.TextStream` turns them into printable text). Raises NextnError for bad values or a
        prompt that does not fit the context."""
        spec = (spec or SpecParams(spec_type, n_max, n_min, p_min, draft_sampling)).check()
        sampling = (sampling or SamplingParams(n_predict, temp, top_k, top_p, min_p, seed, stop, ignore_eos)).check()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        steps = decode(self.sequence, ids, sampling, spec, eog_ids=self.tokenizer.eog_ids,
                       token_bytes=self.tokenizer.token_to_bytes)
        while True:
            try:
                toks = next(steps)
            except StopIteration as e:
                g = e.value
                break
            if on_tokens is not None:
                on_tokens(toks)
        text = self.tokenizer.decode(g.tokens)
        if g.finish_reason == "stop":
            text = text[:min((i for i in (text.find(s) for s in sampling.stop if s) if i >= 0), default=len(text))]
        on = spec.enabled
        eff = "auto" if spec.n_max == "auto" else min(int(spec.n_max), self.max_draft)
        return GenerateResult(len(ids), g.tokens, text, g.stats, g.prefill_s, g.decode_s, g.finish_reason,
                              spec.type, eff if on else 0, g.vm_s, seed=g.seed,
                              n_max_requested=spec.n_max if on else 0, threads=runtime_threads(),
                              draft_vocab=self.loaded.draft_vocab if on else 0)

    def logits(self, token_ids) -> np.ndarray:
        """Trunk logits `[T, n_vocab]` float32 for positions 0..T-1."""
        return self.sequence.logits(token_ids)

    def mtp_logits(self, token_ids) -> np.ndarray:
        """Teacher-forced NextN logits `[T, n_vocab]` float32 (row p: token p + trunk hidden p-1, zeros at p = 0;
        predicts token p+1)."""
        return self.sequence.mtp_logits(token_ids)


def load(path: str, target: str = "llvm", ctx_size: int | None = None, spec: bool = True,
         draft: str | None = None, log=None, arches=None, device: str = "cpu",
         mtp_dense_attention: bool = False, cache_type_k: str | None = None,
         cache_type_v: str | None = None, threads: int | None = None, max_draft: int | None = None,
         mtp_index_share: bool | None = None, draft_vocab: int | None = None,
         draft_vocab_file: str | None = None, options: CompileOptions | None = None) -> Model:
    """Load an artifact directory, or a GGUF (compiled for `target` and cached first).

    The compile options come either as `options` (a CompileOptions, common/compile_options.py: what the CLI and the
    server build) or as the keywords `target`, `arches`, `mtp_dense_attention`, `cache_type_k`, `cache_type_v`,
    `draft_vocab`, which make one CompileOptions here; both at once raise ValueError. Either way the object goes
    whole to `LoadedModel.open`.

    `spec=False` leaves the NextN tensors unread. `draft` is an MTP-only GGUF next to a trunk-only model.
    `arches`: GPU archs when a GGUF is compiled for cuda/rocm; `device`: "cpu" or "cuda:N" (a CUDA artifact).
    `mtp_dense_attention`: when a glm-dsa GGUF is compiled, its NextN block uses dense MLA (llama.cpp) instead of
    its own DSA indexer (an artifact directory keeps what it was compiled with).
    `cache_type_k` / `cache_type_v`: KV cache types (llama.cpp -ctk / -ctv: f32, f16, bf16, q8_0); a GGUF is
    compiled with them (default f16, f16), an artifact directory must have them (None: its own).
    `threads`: CPU threads of the compiled kernels (llama.cpp -t; None: runtime/threads.py's default), set before
    the first kernel call.
    `max_draft`: the deepest draft this model will be asked for (default: the artifact's maximum); recurrent
    states (GLM-5.3-Flash's KDA) keep max_draft + 2 planes, one without speculation.
    `mtp_index_share`: whether NextN draft steps 1..n-1 reuse step 0's DSA selection (glm-dsa, glm5next;
    default: the GGUF's `attention.indexer.index_share_mtp`, on when the file does not say).
    `draft_vocab` (--spec-draft-vocab N): draft with a head of the N highest-ranked token rows (FR-Spec; the verify
    keeps the full head, so the output is unchanged); a GGUF is compiled with it (cached per N), an artifact
    directory must have been (None: an artifact's own, else the full head; 0: the full head). `draft_vocab_file`:
    the ranking (one token id per line, or a JSON list; default: the tokenizer's merge order, runtime/draft_vocab.py).
    Raises NextnError (missing/corrupt files, hash mismatch, unsupported arch, bad tensors, other KV types)."""
    keywords = {"target": target, "arches": arches, "mtp_dense_attention": mtp_dense_attention,
                "cache_type_k": cache_type_k, "cache_type_v": cache_type_v, "draft_vocab": draft_vocab}
    if options is None:
        options = CompileOptions(**keywords)
    elif any(v != _SIGNATURE.parameters[k].default for k, v in keywords.items()):
        raise ValueError("nextn.runtime.load: give the compile options as `options` or as keywords, not both")
    use_threads(threads)
    m = Model(LoadedModel.open(path, options, ctx_size=ctx_size, load_mtp=spec, draft_path=draft, log=log,
                               device=device, max_draft=max_draft, draft_vocab_file=draft_vocab_file))
    if mtp_index_share is not None:
        m.loaded.share_mtp_index = bool(mtp_index_share)
    return m


_SIGNATURE = inspect.signature(load)   # the keywords' defaults, for `options` given with them
