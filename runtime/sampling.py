"""Sampling for speculative decoding: llama.cpp's sampler chain, a per-request counter-based RNG, and the two
verifiers that keep speculation lossless at any temperature.

Vocabulary (one meaning each, used so in code, stats and docs; after vLLM's rejection sampler):
- *target distribution* p_i: the trunk's sampler-chain distribution at verify row i (prefix + d1..di); it gives
  the token at position n_past + i + 1.
- *draft distribution* q_i: the NextN head's distribution that proposed d_{i+1}.
- *accepted* draft: a draft kept by the verifier. *Rejected*: the first draft not kept, and every one after it.
- *recovered* token: the token emitted at the first rejected position (sample-and-match: the trunk's own sample;
  rejection sampling: a sample of norm(max(p_i - q_i, 0))).
- *bonus* token: the token sampled from p_k when all k drafts are accepted.
- *emitted*: the accepted drafts plus one recovered or bonus token (before the finish rules cut the block).

Two verifiers, both exact (every emitted token is distributed as plain sampling from the trunk would give it):
- `sample_and_match` for a *greedy* draft (llama.cpp common/sampling.cpp `common_sampler_sample_and_accept_n`):
  sample row i with the full chain; accept d_{i+1} iff the sample equals it. Draft probabilities are not used.
  Because row i always uses the uniform of the position it samples, the same seed gives the same text with
  speculation on or off (up to float differences between row counts, which the compiled kernels do not have).
- `rejection_sample` for a *sampled* draft (Leviathan et al. 2023, "Fast Inference from Transformers via
  Speculative Decoding", Alg. 1; vLLM v1 `rejection_sampler.py`): accept d with probability min(1, p(d)/q(d)),
  else emit a recovered token from norm(max(p - q, 0)). Same seed ⇒ same text for the same settings, but not the
  same text as spec off.

RNG contract (`CounterRNG`): every random number is a pure function of (seed, position, stream), so the text
depends only on the seed and the tokens, never on how many random numbers earlier rounds drew; a round without
drafts draws exactly one number (the token it samples), like plain decoding.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

TARGET, DRAFT, ACCEPT = 0, 1, 2      # RNG streams: trunk samples, draft samples, accept tests
_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class CounterRNG:
    """Uniforms in [0, 1) keyed by (seed, position, stream) via splitmix64 (Steele et al. 2014). `seed` None draws
    a fresh seed from the OS; `self.seed` is the seed used (report it to reproduce a run)."""

    def __init__(self, seed: int | None = None):
        self.seed = int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
        self._key = _splitmix64(self.seed & _M64)

    def uniform(self, pos: int, stream: int = TARGET) -> float:
        return (_splitmix64(self._key ^ _splitmix64(4 * pos + stream)) >> 11) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class SamplerChain:
    """llama.cpp's default chain (common/sampling.cpp; src/llama-sampling.cpp): top-k → top-p → min-p → temperature
    → dist. top-p and min-p see the softmax at temperature 1 of the candidates left, as in llama.cpp's order.
    `top_k` <= 0, `top_p` >= 1, `min_p` <= 0 disable a stage; `temp` <= 0 is greedy (argmax).
    Candidates are ordered by descending logit, ties by ascending token id."""

    temp: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    def probs(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """logits [V] float → (token ids [n] int64, probabilities [n] float64 summing to 1), n >= 1."""
        z = np.asarray(logits, np.float64)
        if 0 < self.top_k < z.shape[0]:
            part = np.argpartition(-z, self.top_k - 1)[:self.top_k]
            # argpartition breaks ties at the k-th logit arbitrarily: take all tied ids, keep the lowest.
            part = np.union1d(part, np.flatnonzero(z == z[part].min()))
            ids = part[np.lexsort((part, -z[part]))][:self.top_k]
        else:
            ids = np.lexsort((np.arange(z.shape[0]), -z))
        zs = z[ids]
        p = np.exp(zs - zs[0])
        p /= p.sum()
        n = len(ids)
        if self.top_p < 1.0:
            n = min(n, int(np.searchsorted(np.cumsum(p), self.top_p)) + 1)
        if self.min_p > 0.0:
            n = min(n, max(1, int(np.count_nonzero(p >= self.min_p * p[0]))))
        ids, zs = ids[:n], zs[:n]
        if self.greedy:
            return ids[:1], np.ones(1)
        w = np.exp((zs - zs[0]) / self.temp)
        return ids, w / w.sum()

    def sample(self, logits: np.ndarray, u: float) -> int:
        """Inverse-CDF draw with the uniform `u` (so a draw is a function of `u` alone)."""
        ids, p = self.probs(logits)
        return int(ids[_pick(p, u)])


def _pick(p: np.ndarray, u: float) -> int:
    return min(int(np.searchsorted(np.cumsum(p), u * p.sum(), side="right")), len(p) - 1)


def _dense(ids: np.ndarray, p: np.ndarray, n_vocab: int) -> np.ndarray:
    out = np.zeros(n_vocab)
    out[ids] = p
    return out


def sample_and_match(chain: SamplerChain, rng: CounterRNG, logits: np.ndarray, drafts: list[int], pos0: int):
    """Greedy-draft verifier. logits [k+1, V] of verify rows at positions pos0..; drafts d1..dk.
    Returns (accepted a, recovered-or-bonus token); row i samples the token at position pos0 + i + 1."""
    for i in range(len(drafts) + 1):
        x = chain.sample(logits[i], rng.uniform(pos0 + i + 1, TARGET))
        if i == len(drafts) or x != drafts[i]:
            return i, x


def rejection_sample(chain: SamplerChain, rng: CounterRNG, logits: np.ndarray, drafts: list[int], q: list,
                     pos0: int):
    """Sampled-draft verifier. q[i] = (ids, probs) of the draft distribution that drew d_{i+1} (from
    `SamplerChain.probs`). Accept d with probability min(1, p(d)/q(d)); at the first rejection emit a recovered
    token ~ norm(max(p - q, 0)); after k acceptances a bonus token ~ p_k. Returns (accepted a, token)."""
    V = logits.shape[1]
    for i, d in enumerate(drafts):
        p = _dense(*chain.probs(logits[i]), V)
        qd = _dense(*q[i], V)
        pos = pos0 + i + 1
        if rng.uniform(pos, ACCEPT) * qd[d] < p[d]:
            continue
        resid = np.maximum(p - qd, 0.0)   # > 0 somewhere: a rejection means p(d) < q(d)
        nz = np.flatnonzero(resid)
        return i, int(nz[_pick(resid[nz], rng.uniform(pos, TARGET))])
    k = len(drafts)
    return k, chain.sample(logits[k], rng.uniform(pos0 + k + 1, TARGET))
