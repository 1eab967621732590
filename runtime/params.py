"""What a generation asks for, as two frozen objects passed whole from the CLI (`nextn run`), the Python API
(`Model.generate`) and the server (a request's `GenParams`) to `speculative.decode` — nano-vllm's
`SamplingParams` shape (nano-vllm/sampling_params.py), with llama.cpp's names and defaults (common/common.h
`common_params_sampling`, `common_params_speculative`). `check()` refuses values the CLI and the API refuse
(NextnError, one line naming the flag); the server reads request fields by llama-server's rules instead (it clamps
top_p to [0, 1], runtime/server/params.py), so the objects themselves take any value."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from nextn.common.errors import NextnError

SPEC_TYPES = ("none", "draft-mtp")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling of the target model (runtime/sampling.py): `temperature` 0 is greedy; otherwise llama.cpp's chain
    top-k → top-p → min-p → temperature, with random numbers keyed by `seed` (None: drawn from the OS) and the
    position. `n_predict`: tokens to generate at most (-n); `stop`: strings that end generation (cut before them);
    `ignore_eos`: do not stop at end-of-generation tokens."""

    n_predict: int = 64
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    stop: tuple = ()
    ignore_eos: bool = False

    def __post_init__(self):   # one stop string or several: a tuple either way
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))

    def check(self) -> "SamplingParams":
        """self, or NextnError naming the flags when temperature < 0, top_p not in (0, 1] or min_p not in [0, 1]."""
        if self.temperature < 0 or not 0.0 < self.top_p <= 1.0 or not 0.0 <= self.min_p <= 1.0:
            raise NextnError(f"--temp {self.temperature} / --top-p {self.top_p} / --min-p {self.min_p}: expected "
                             f"temp >= 0, 0 < top-p <= 1, 0 <= min-p <= 1")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class SpecParams:
    """NextN (MTP) self-speculation (llama.cpp --spec-type, --spec-draft-n-max/-n-min/-p-min; runtime/speculative.py):
    `type` "draft-mtp" or "none"; `n_max` the draft depth (an int >= 1, or "auto": runtime/depth.py); `n_min`: a
    shorter draft is discarded; `p_min`: drafting stops below this draft probability; `draft_sampling` "greedy"
    (sample-and-match) or "sample" (drafts drawn from the NextN distribution, rejection sampling)."""

    type: str = "draft-mtp"
    n_max: int | str = 3
    n_min: int = 0
    p_min: float = 0.0
    draft_sampling: str = "greedy"

    def check(self) -> "SpecParams":
        """self, or NextnError naming the flag of the first value out of its range."""
        if self.type not in SPEC_TYPES:
            raise NextnError(f"--spec-type '{self.type}': expected none or draft-mtp")
        n = self.n_max
        if n != "auto" and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
            raise NextnError(f"--spec-draft-n-max {n}: expected an integer >= 1 or 'auto'")
        if self.n_min < 0 or not 0.0 <= self.p_min <= 1.0:
            raise NextnError(f"--spec-draft-n-min {self.n_min} / --spec-draft-p-min {self.p_min}: expected n_min >= 0 "
                             f"and 0 <= p_min <= 1")
        if self.draft_sampling not in ("greedy", "sample"):
            raise NextnError(f"draft sampling '{self.draft_sampling}': expected greedy or sample")
        return self

    @property
    def enabled(self) -> bool:
        return self.type == "draft-mtp"

    def max_drafts(self, max_draft: int) -> int:
        """The most drafts a round proposes on a model whose NextN head drafts at most `max_draft` per round
        (LoadedModel.max_draft): 0 when speculation is off, `max_draft` at depth "auto", else min(n_max, max_draft)."""
        if not self.enabled:
            return 0
        return max_draft if self.n_max == "auto" else min(int(self.n_max), max_draft)


SPEC_OFF = SpecParams(type="none")


def resolve_spec_type(asked: str | None, has_mtp: bool, model: str, draft_flag: str = "--model-draft") -> str:
    """The speculation type a run or a server uses: `asked` (--spec-type), or when not given draft-mtp if the model
    has a NextN block, else none. NextnError when draft-mtp is asked of a trunk-only model (`draft_flag`: the flag
    that gives an MTP GGUF in that command's spelling)."""
    if asked is None:
        return "draft-mtp" if has_mtp else "none"
    if asked == "draft-mtp" and not has_mtp:
        raise NextnError(f"{model}: --spec-type draft-mtp needs a NextN block; this model is trunk-only "
                         f"(give the MTP GGUF with {draft_flag}, or use --spec-type none)")
    return asked
