"""Decoding with NextN (MTP) self-speculation: the draft-mtp algorithm of llama.cpp
(common/speculative.cpp `common_speculative_impl_draft_mtp`, tools/server; glm-mtp-reference.md §6–§7).

Vocabulary (used exactly so in code, stats and docs):
- *round*: one verification pass of the trunk over `[id_last, d1..dk]` (k + 1 rows).
- *drafted* tokens `d1..dk`: proposed greedily by the NextN head, k <= n_max.
- *accepted*: the longest prefix of the drafts that the trunk's own choice reproduces (sample-and-match:
  the trunk samples row i with its full sampler; the draft d_{i+1} is accepted iff it equals that sample).
- *rejected*: drafts after the first mismatch. The trunk's own token at the mismatch (or, when all k are
  accepted, at row k: the *bonus* token) is emitted too, so a round emits accepted + 1 tokens.
- *emitted*: tokens appended to the output.
Greedy output is therefore byte-identical with speculation on or off (same kernels for every row count).

Hidden-state plumbing (§6.2): NextN row p pairs token p with a post-norm hidden of position p-1 — the trunk's
`output_norm` output (`pending_h`, zeros before position 0), or, inside a draft, the previous draft step's
`t_h_nextn` (post `shared_head_norm`). After each trunk pass the NextN rows are re-run teacher-forced over
the same tokens, so the NextN KV below the committed position always holds trunk-paired rows; draft rows past
it are simply overwritten (static, position-indexed KV: the rollback is implicit).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .errors import NextnError


@dataclass
class SpecStats:
    """Per-request speculation counters (llama.cpp server: `draft acceptance`, `mean len`, `acc per pos`)."""

    n_max: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_at: list = field(default_factory=list)   # accepted_at[i]: rounds with >= i+1 accepted drafts

    def record(self, k: int, a: int) -> None:
        self.rounds += 1
        self.drafted += k
        self.accepted += a
        for i in range(a):
            self.accepted_at[i] += 1

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_len(self) -> float:
        """1 + accepted / rounds: tokens emitted per trunk pass."""
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    @property
    def per_pos(self) -> list[float]:
        return [n / self.rounds if self.rounds else 0.0 for n in self.accepted_at]

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": self.acceptance, "mean_len": self.mean_len, "per_pos": self.per_pos}


@dataclass
class Generation:
    tokens: list[int]
    stats: SpecStats
    prefill_s: float
    decode_s: float
    finish_reason: str
    vm_s: dict = field(default_factory=dict)   # decode-phase seconds inside each compiled entry point

    @property
    def python_share(self) -> float:
        """Share of decode time spent outside compiled entry points (the loop, conversions, host copies)."""
        return max(0.0, 1.0 - sum(self.vm_s.values()) / self.decode_s) if self.decode_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0


class Sampler:
    """Temperature 0: argmax (computed in-graph). Temperature > 0: softmax(logits / T) with a seeded RNG."""

    def __init__(self, temp: float = 0.0, seed: int | None = None):
        self.temp = float(temp)
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    def sample(self, logits_row: np.ndarray) -> int:
        z = logits_row.astype(np.float64) / self.temp
        p = np.exp(z - z.max())
        p /= p.sum()
        return int(self.rng.choice(p.shape[0], p=p))


def generate(engine, prompt_ids, n_predict: int, spec: bool = True, n_max: int = 3, temp: float = 0.0,
             seed: int | None = None, eog_ids=frozenset()) -> Generation:
    """Generate up to `n_predict` tokens after `prompt_ids`; speculate with the NextN head when `spec`."""
    prompt = np.asarray(prompt_ids, np.int32)
    if len(prompt) == 0:
        raise NextnError("the prompt is empty")
    if len(prompt) >= engine.n_ctx:
        raise NextnError(f"the prompt has {len(prompt)} tokens, but the context holds {engine.n_ctx} (-c); "
                         f"raise -c or shorten the prompt")
    if spec and not engine.has_mtp:
        raise NextnError("--spec-type draft-mtp needs a NextN block, and this model has none loaded")
    sampler = Sampler(temp, seed)
    stats = SpecStats(n_max=n_max if spec else 0, accepted_at=[0] * (n_max if spec else 0))

    t0 = time.perf_counter()
    hidden, last_logits, last_argmax = engine.prefill(prompt, 0)
    id_last = last_argmax if sampler.greedy else sampler.sample(last_logits)
    if spec:   # MTP warm-up over the prompt: row p pairs token p with trunk hidden p-1 (zeros at p = 0)
        engine.mtp_rows(prompt, np.concatenate([np.zeros((1, hidden.shape[1]), np.float32), hidden[:-1]]), 0)
    pending_h = hidden[-1:]              # trunk hidden of the position before id_last
    n_past = len(prompt)                 # the position id_last will occupy
    out = [int(id_last)]
    vm0 = dict(engine.vm_seconds)
    t1 = time.perf_counter()
    finish = "eos" if id_last in eog_ids else "length"

    while len(out) < n_predict and out[-1] not in eog_ids:
        if n_past + 1 > engine.n_ctx:
            break
        # Draft: k <= n_max tokens, clamped to the remaining budget and context.
        k = min(n_max, n_predict - len(out), engine.n_ctx - n_past - 1) if spec else 0
        drafts, h, tok = [], pending_h, id_last
        for i in range(k):
            h, _lg, am = engine.mtp_draft([tok], h, n_past + i)
            tok = int(am[0])
            drafts.append(tok)
        # Verify: one trunk pass over [id_last, d1..dk].
        rows = [id_last] + drafts
        hid, logits, am = engine.verify(rows, n_past)
        if sampler.greedy:
            choice = [int(x) for x in am]
        else:
            lg = logits.numpy()
            choice = []
            for i in range(len(rows)):
                choice.append(sampler.sample(lg[i]))
                if i < k and choice[i] != drafts[i]:
                    break
        a = 0
        while a < k and choice[a] == drafts[a]:
            a += 1
        if spec:
            stats.record(k, a)
            # process(): NextN rows over the verified tokens, paired with trunk hidden (shifted by one row).
            engine.mtp_rows(rows, np.concatenate([pending_h, hid[:-1]]), n_past)
        new = drafts[:a] + [choice[a]]
        pending_h = hid[a:a + 1]
        n_past += a + 1
        id_last = new[-1]
        for t in new:
            out.append(int(t))
            if t in eog_ids:
                break
    if out[-1] in eog_ids:
        finish = "eos"
    out = out[:n_predict]
    t2 = time.perf_counter()
    vm_s = {k: engine.vm_seconds[k] - vm0.get(k, 0.0) for k in engine.vm_seconds}
    return Generation(out, stats, t1 - t0, t2 - t1, finish, vm_s)
