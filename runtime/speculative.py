"""Decoding with NextN (MTP) self-speculation: the draft-mtp algorithm of llama.cpp
(common/speculative.cpp `common_speculative_impl_draft_mtp`, common/sampling.cpp
`common_sampler_sample_and_accept_n`, tools/server/server-context.cpp; docs/design.md "Speculation").

Vocabulary (used exactly so in code, stats and docs; the sampling words are defined in `sampling.py`):
- *round*: one verification pass of the trunk over `[id_last, d1..dk]` (k + 1 rows) with k >= 1 drafts;
  a *plain round* verifies `[id_last]` alone (spec off, or depth 0 chosen by `auto`).
- *drafted* tokens `d1..dk`: proposed by the NextN head (greedy, or sampled), k <= n_max; drafting stops early
  when the draft's probability is below p_min, and a draft shorter than n_min is discarded (llama.cpp `draft()`).
- *accepted* / *rejected* / *recovered* / *bonus* / *emitted*: see `sampling.py`. A round emits accepted + 1
  tokens, cut by the finish rules (EOS/EOG, then stop strings, then the -n budget, one token at a time).
  Counters count emitted tokens only: a draft cut by a finish rule is not counted as accepted.
Greedy output is byte-identical with speculation on or off (same kernels for every row count); sampled output
is too with a greedy draft (sample-and-match with position-keyed random numbers).

Hidden-state plumbing: NextN row p pairs token p with a post-norm hidden of position p-1 — the trunk's
`output_norm` output (`pending_h`, zeros before position 0), or, inside a draft, the previous draft step's
`t_h_nextn`. The NextN KV below the committed position must hold trunk-paired rows.

The NextN rows of emitted tokens (the gap). llama.cpp (common/speculative.cpp draft-mtp `process()`, run after every
target `llama_decode`, and `draft()`; tools/server/server-context.cpp) re-runs the NextN rows of *every* verified
row: after a round of k drafts it decodes k + 1 teacher-forced rows [id_last, d1..dk] (paired with the verify's
trunk hidden states, logits off; the rejected drafts' rows are written, then removed by `seq_rm`), and its next
`draft()` runs k one-row steps, the first for the new id_last: 2k + 1 NextN rows per round. The verify computes only
the trunk hidden states these rows take as h_prev, not the rows themselves (they go through the NextN block), so
nothing more of it can be reused. nextn writes the rows of emitted tokens only, once, and lazily: the a accepted
drafts wait in a *gap* and go in with the next draft's step 0: one `mtp_draft` call whose head runs on its last row
only (`out_ids`), while gap + id_last is at most `Drafter.fuse_rows` = max_draft + 1 rows (every fixed-depth round),
else one `mtp_rows` call first (`auto`'s deferred prompt); so a round costs a + k NextN rows in k NextN calls, reads
the NextN block's weights k times, and a plain round none. Measured on the
three trained fixtures' prompts (bench/draft_vocab.py; docs/design.md "Speculation"): at n_max 1, 1.68-1.74 NextN
rows per round against llama.cpp's 3.00; at n_max 3, 4.28-4.43 against 6.85-6.90.

Rollback: static, position-indexed KV: cells past the committed prefix are overwritten before they are read (the
rollback is implicit); recurrent trunk states (GLM-5.3-Flash's KDA) roll back by `Sequence.commit(m)` after each
verify, which keeps the state after row m-1 (a plane choice, no replay).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from nextn.common.errors import NextnError
from nextn.common.timing import time_call

from .depth import AdaptiveDepth, FixedDepth, calibrate, spread_tokens
from .params import SamplingParams, SpecParams
from .sampling import DRAFT, TARGET, CounterRNG, SamplerChain, rejection_sample, sample_and_match


@dataclass
class SpecStats:
    """Per-request speculation counters (llama.cpp server: `draft acceptance`, `mean len`, `acc per pos`);
    `SpecStats.merge` aggregates requests. Times in seconds."""

    n_max: int = 0
    rounds: int = 0                 # verify passes with >= 1 draft
    plain_rounds: int = 0           # verify passes of one row (no draft)
    drafted: int = 0
    accepted: int = 0               # accepted and emitted
    emitted: int = 0                # tokens emitted by the decode loop (all rounds; the first token is prefill's)
    accepted_at: list = field(default_factory=list)   # [i]: rounds with >= i+1 accepted drafts
    drafted_at: list = field(default_factory=list)    # [i]: rounds that drafted >= i+1 tokens
    draft_s: float = 0.0
    verify_s: float = 0.0
    sampling_s: float = 0.0
    events: list = field(default_factory=list)        # `auto` depth switches: {at_token, to_depth, why}

    def record(self, k: int, a: int, m: int) -> None:
        """A round of k drafts, a accepted, m tokens emitted (m <= a + 1 after the finish rules)."""
        self.emitted += m
        if k == 0:
            self.plain_rounds += 1
            return
        a = min(a, m)
        self.rounds += 1
        self.drafted += k
        self.accepted += a
        for i in range(k):
            self.drafted_at[i] += 1
        for i in range(a):
            self.accepted_at[i] += 1

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_len(self) -> float:
        """1 + accepted / rounds: tokens emitted per speculative trunk pass."""
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    @property
    def per_pos(self) -> list[float]:
        """llama.cpp's `acc per pos`: [i] = rounds with >= i+1 accepted / rounds."""
        return [n / self.rounds if self.rounds else 0.0 for n in self.accepted_at]

    @property
    def per_pos_rate(self) -> list[float]:
        """[i] = accepted drafts at position i+1 / drafts made at position i+1."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @classmethod
    def merge(cls, many) -> "SpecStats":
        many = list(many)
        n = max([s.n_max for s in many] + [0])
        out = cls(n_max=n, accepted_at=[0] * n, drafted_at=[0] * n)
        for s in many:
            for f in ("rounds", "plain_rounds", "drafted", "accepted", "emitted", "draft_s", "verify_s", "sampling_s"):
                setattr(out, f, getattr(out, f) + getattr(s, f))
            for i in range(s.n_max):
                out.accepted_at[i] += s.accepted_at[i]
                out.drafted_at[i] += s.drafted_at[i]
            out.events += s.events
        return out

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": self.acceptance, "mean_len": self.mean_len, "per_pos": self.per_pos,
                "plain_rounds": self.plain_rounds, "emitted": self.emitted, "per_pos_rate": self.per_pos_rate,
                "draft_s": self.draft_s, "verify_s": self.verify_s, "sampling_s": self.sampling_s,
                "depth_switches": self.events}


@dataclass
class Generation:
    tokens: list[int]
    stats: SpecStats
    prefill_s: float
    decode_s: float
    finish_reason: str              # eos | stop | length
    vm_s: dict = field(default_factory=dict)   # decode-phase seconds inside each compiled entry point
    seed: int = 0
    n_past: int = 0                 # trunk KV cells committed at the end (prompt + emitted - 1)


@dataclass
class CacheExtent:
    """How far a sequence's caches hold rows of its tokens, after `decode`'s latest step (a server slot's prompt
    cache reads it, also after closing the generator early): the trunk KV holds tokens[:n_past] (the prompt, then the
    emitted tokens but the last); with speculation the NextN KV holds the trunk-paired rows [0, n_mtp) (n_mtp <=
    n_past: rows still waiting in the Drafter's gap are not written yet). None: not known (no step yet, or no
    speculation: the NextN KV was not touched)."""

    n_past: int | None = None
    n_mtp: int | None = None


class FinishRules:
    """Per emitted token, in precedence: EOS/EOG token → stop string (UTF-8 bytes; may span tokens) → -n budget."""

    def __init__(self, eog_ids, stop, token_bytes, n_predict: int):
        self.eog, self.n_predict, self.token_bytes = eog_ids, n_predict, token_bytes
        self.stop = [s.encode("utf-8") for s in stop if s]
        self.longest = max((len(s) for s in self.stop), default=0)
        self.text = b""

    def push(self, out: list, t: int):
        """Append t to out; return the finish reason it triggers, or None."""
        out.append(int(t))
        if t in self.eog:
            return "eos"
        if self.stop:
            start = max(0, len(self.text) - self.longest + 1)
            self.text += self.token_bytes(t)
            if any(s in self.text[start:] for s in self.stop):
                return "stop"
        return "length" if len(out) >= self.n_predict else None


class Drafter:
    """The NextN side: keeps the NextN KV in step with the trunk and proposes drafts (llama.cpp `process()`, `draft()`).
    `add_rows` queues teacher-forced rows (the gap); `propose` writes the gap, then drafts up to k tokens."""

    def __init__(self, seq, chain: SamplerChain, rng: CounterRNG, sampled: bool, n_min: int, p_min: float):
        self.seq, self.chain, self.rng = seq, chain, rng
        # A gap + id_last of up to this many rows rides along in the draft-step-0 call (its head runs on the last row
        # only: `out_ids`): a verify's row limit, so every fixed-depth round (a <= n_max accepted + id_last) fuses;
        # only a longer gap (`auto`'s deferred prompt and plain rounds) is written by `mtp_rows` first.
        self.fuse_rows = int(seq.model.max_draft) + 1
        self.sampled, self.n_min, self.p_min = sampled and not chain.greedy, n_min, p_min
        self.tok, self.h, self.pos0 = [], [], 0
        self.catch_up_s = 0.0       # seconds of the `mtp_rows` catch-ups `propose` wrote since `take_catch_up`

    def catch_up_rows(self) -> int:
        """Gap rows a draft proposed now would write by a separate `mtp_rows` call (the catch-up) before its step 0:
        all of them when gap + id_last exceeds `fuse_rows`, else none (they ride in step 0, whose seconds are the
        round's). Call it before id_last is added."""
        return len(self.tok) if len(self.tok) + 1 > self.fuse_rows else 0

    def take_catch_up(self) -> float:
        """Seconds of the catch-ups written since the last call (the gate takes them out of a round's seconds)."""
        s, self.catch_up_s = self.catch_up_s, 0.0
        return s

    def add_rows(self, tokens, h_prev, pos0: int) -> None:
        if not self.tok:
            self.pos0 = pos0
        self.tok += [int(t) for t in tokens]
        self.h.append(h_prev)

    def flush(self) -> None:
        if self.tok:
            self.seq.mtp_rows(self.tok, np.concatenate(self.h), self.pos0)
        self.tok, self.h = [], []

    def propose(self, n_past: int, k: int):
        """The gap ends with (id_last @ n_past, pending_h). Returns (drafts, q) — q[i] the draft distribution of
        d_{i+1} when drafts are sampled, else None."""
        last_tok, last_h = self.tok[-1:], self.h[-1][-1:]
        if len(self.tok) > self.fuse_rows:
            self.tok, self.h[-1] = self.tok[:-1], self.h[-1][:-1]
            t = time.perf_counter()
            self.flush()
            self.catch_up_s += time.perf_counter() - t
            toks, h, pos = last_tok, last_h, n_past
        else:
            toks, h, pos = self.tok, np.concatenate(self.h), self.pos0
        self.tok, self.h = [], []
        drafts, q = [], []
        for i in range(k):
            # glm-dsa: step 0 selects, 1.. reuse; the head runs on the last row only (the gap's rows write KV)
            h, lg, am = self.seq.mtp_draft(toks, h, pos, reuse_index=i > 0, out_ids=[len(toks) - 1])
            d, qi, p = self._pick(lg, am, n_past + i + 1)
            if p < self.p_min:
                break
            drafts.append(d)
            q.append(qi)
            toks, h, pos = [d], h[-1:], n_past + i + 1
        if len(drafts) < self.n_min:
            return [], None
        return drafts, (q if self.sampled else None)

    def _pick(self, lg, am, pos: int):
        if self.sampled:
            ids, p = self.chain.probs(lg.numpy()[-1])
            if self.seq.model.draft_vocab:   # the reduced head's logits are those of draft_ids, in that order
                ids = self.seq.model.draft_ids[ids].astype(np.int64)
            j = int(np.searchsorted(np.cumsum(p), self.rng.uniform(pos, DRAFT) * p.sum(), side="right"))
            j = min(j, len(p) - 1)
            return int(ids[j]), (ids, p), float(p[j])
        if self.p_min <= 0.0:
            return int(am[-1]), None, 1.0
        # llama.cpp's draft sampler: top-k(10) at temperature 1, take the most probable; p = its softmax share.
        z = np.sort(lg.numpy()[-1].astype(np.float64))[-10:]
        return int(am[-1]), None, float(1.0 / np.exp(z - z[-1]).sum())


def decode(seq, prompt_ids, sampling: SamplingParams = SamplingParams(), spec: SpecParams = SpecParams(), *,
           eog_ids=frozenset(), token_bytes=None, controller=None, n_cached: int = 0,
           extent: CacheExtent | None = None, on_logits=None, logit_bias=None, constraint=None,
           n_batch: int | None = None, on_batch=None):
    """Decode step by step: a generator that yields the tokens each step emits (a list of ints; the first yield is
    prefill's token, then one yield per verify round: its accepted drafts + the recovered or bonus token, cut by
    the finish rules) and returns the `Generation` when a finish rule fires. Closing it early (`.close()`) stops
    decoding; the KV of `seq` past the last committed cell is simply overwritten by the next request.

    `seq`: a runtime/sequence.py Sequence. `sampling` (runtime/params.py): n_predict, the sampler chain, seed, stop
    strings, ignore_eos; `spec`: speculate when `spec.enabled`, at depth n_max (an int, lowered to the model's
    max_draft, or "auto": `depth.AdaptiveDepth`), with n_min, p_min, draft_sampling. `eog_ids`: the tokens that end
    generation (none with sampling.ignore_eos); `token_bytes(t)`: a token's bytes (stop strings); `controller`: a
    depth controller instead of spec.n_max's. `n_cached` (a server slot's prompt cache, llama-server
    `cache_prompt`): the trunk KV already holds prompt[:n_cached] and, with speculation, the NextN KV its
    trunk-paired rows [0, n_cached] (one more: the row of token n_cached pairs with the trunk hidden of n_cached - 1,
    which is not kept), so prefill starts at n_cached and the NextN warm-up at n_cached + 1; 0 <= n_cached <
    len(prompt). `extent`, when given, is updated before every yield (`CacheExtent`). `on_logits(rows, tokens,
    shaped)`, when given, is called before every yield with the target model's logits of the tokens the step emits
    (float32 [m, n_vocab]: prefill's last row, or the verify rows that chose them; a server's logprobs) and the same
    rows as the sampler chain read them (`shaped`: + logit_bias, grammar-masked; a server's post-sampling probs).
    `n_batch`: the prompt is evaluated in batches of that many tokens (llama-server -b; None: one call), calling
    `on_batch(n)` after each with n the prompt tokens evaluated so far, the cache included.
    `logit_bias` (float32 [n_vocab], -inf bans a token; llama.cpp's
    logit-bias sampler, first in the chain) is added to the target logits before every choice, greedy or sampled;
    drafts are proposed without it and verified against it, so output is the same with speculation on or off.
    `constraint` (a grammar; runtime/server/grammar.py `Constraint`: allowed() the bool [n_vocab] mask of the next
    token, validate(tokens) how many of them it accepts in order, consume, rollback) masks the target logits of every
    choice; drafts are cut to the prefix it accepts before verification and each verify row is masked by the state
    after the drafts before it, so output is exactly what plain constrained decoding gives.
    Raises NextnError (at the first `next`) for an empty prompt, a prompt that does not fit the context, or
    speculation without a NextN block."""
    prompt = _checked_prompt(seq, prompt_ids, spec, n_cached)
    n_predict = sampling.n_predict
    chain = SamplerChain(sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
    rng = CounterRNG(sampling.seed)
    auto = spec.enabled and spec.n_max == "auto"
    k_max = spec.max_drafts(seq.model.max_draft)
    # `auto` refreshes verify costs while cost-bound by timing a verify at the next cells (rewritten before read).
    remeasure = lambda T: time_call(   # noqa: E731
        lambda: seq.verify(spread_tokens(T, int(seq.model.hparams["n_vocab"])), n_past)) \
        if n_past + T <= seq.n_ctx else None
    # ... and a draft step there (its NextN cell is rewritten by the catch-up rows before a draft reads it)
    remeasure_draft = lambda: time_call(   # noqa: E731
        lambda: seq.mtp_draft([0], np.zeros((1, int(seq.model.hparams["n_embd"])), np.float32), n_past)) \
        if seq.model.has_mtp and n_past + 1 <= seq.n_ctx else None
    depth = controller or (AdaptiveDepth(k_max, calibrate(seq, k_max), remeasure, remeasure_draft=remeasure_draft)
                           if auto else FixedDepth(k_max))
    drafter = Drafter(seq, chain, rng, spec.draft_sampling == "sample", spec.n_min, spec.p_min) \
        if spec.enabled else None
    rules = FinishRules(frozenset() if sampling.ignore_eos else eog_ids, sampling.stop, token_bytes, n_predict)
    stats = SpecStats(n_max=k_max, accepted_at=[0] * k_max, drafted_at=[0] * k_max, events=depth.events)

    t0 = time.perf_counter()
    hidden, raw_logits, last_argmax = _prefill(seq, prompt, n_cached, drafter, auto, n_batch, on_batch)
    last_logits = raw_logits
    if logit_bias is not None or constraint is not None:
        last_logits = _target(raw_logits[None], logit_bias, constraint, [])[0]
        last_argmax = int(np.argmax(last_logits))
    id_last = last_argmax if chain.greedy else chain.sample(last_logits, rng.uniform(len(prompt), TARGET))
    pending_h, n_past = hidden[-1:], len(prompt)    # trunk hidden before id_last; the position id_last takes
    out: list[int] = []
    finish = rules.push(out, id_last)
    if constraint is not None:
        constraint.consume([id_last])
    vm0, t1 = dict(seq.vm_seconds), time.perf_counter()
    _mark(extent, n_past, drafter)
    if on_logits is not None:
        on_logits(raw_logits[None], [id_last], last_logits[None])
    yield [id_last]

    while finish is None:
        if n_past + 1 > seq.n_ctx:   # id_last has no cell left
            finish = "length"
            break
        tr = time.perf_counter()
        drafts, q = [], None
        if spec.enabled:
            left = min(n_predict - len(out), seq.n_ctx - n_past - 1)
            k = min(depth.choose(len(out), drafter.catch_up_rows(), left=left), left)
            drafter.add_rows([id_last], pending_h, n_past)
            if k > 0:
                drafts, q = drafter.propose(n_past, k)
        if constraint is not None and drafts:    # verify only the drafts the grammar accepts
            drafts = drafts[:constraint.validate(drafts)]
            q = q[:len(drafts)] if q is not None else None
        tv = time.perf_counter()
        hid, logits, am = seq.verify([id_last] + drafts, n_past)
        ts = time.perf_counter()
        a, token, raw, target = _accept(chain, rng, logits, am, drafts, q, n_past, logit_bias, constraint,
                                keep_rows=on_logits is not None)
        te = time.perf_counter()
        new = drafts[:a] + [token]
        m, finish = _emit(rules, out, new, constraint)
        seq.commit(m)           # the trunk keeps rows id_last, d1..d_{m-1} (recurrent states: their plane)
        if spec.enabled and m > 1:      # NextN rows of the emitted drafts, paired with the trunk hidden before each
            drafter.add_rows(new[:m - 1], hid[:m - 1], n_past + 1)
        pending_h, n_past, id_last = hid[m - 1:m], n_past + m, new[m - 1]
        stats.record(len(drafts), a, m)
        stats.draft_s += tv - tr
        stats.verify_s += ts - tv
        stats.sampling_s += te - ts
        depth.observe(len(drafts), a, time.perf_counter() - tr, len(out),
                      catch_up_s=drafter.take_catch_up() if spec.enabled else 0.0)
        _mark(extent, n_past, drafter)
        if on_logits is not None:
            on_logits(raw[:m], new[:m], target[:m])
        yield new[:m]
    t2 = time.perf_counter()
    vm_s = {name: seq.vm_seconds[name] - vm0.get(name, 0.0) for name in seq.vm_seconds}
    return Generation(out, stats, t1 - t0, t2 - t1, finish, vm_s, rng.seed, n_past)


def _checked_prompt(seq, prompt_ids, spec: SpecParams, n_cached: int) -> np.ndarray:
    """The prompt as int32, or NextnError for what `decode` refuses (its docstring)."""
    prompt = np.asarray(prompt_ids, np.int32)
    if len(prompt) == 0:
        raise NextnError("the prompt is empty")
    if len(prompt) >= seq.n_ctx:
        raise NextnError(f"the prompt has {len(prompt)} tokens, but the context holds {seq.n_ctx} (-c); "
                         f"raise -c or shorten the prompt")
    if spec.enabled and not seq.model.has_mtp:
        raise NextnError("--spec-type draft-mtp needs a NextN block, and this model has none loaded")
    if not 0 <= n_cached < len(prompt):
        raise NextnError(f"n_cached {n_cached}: expected 0 <= n_cached < {len(prompt)} (the prompt's length)")
    return prompt


def _prefill(seq, prompt, n_cached: int, drafter, defer: bool, n_batch: int | None = None, on_batch=None):
    """Prefill prompt[n_cached:] (hidden rows, last logits, last argmax), with the MTP warm-up over the prompt chunk
    by chunk when `drafter` is given: row p pairs token p with trunk hidden p-1 (zeros at p = 0). Eager, as
    llama.cpp's process() after each prompt ubatch (a long prompt never holds all its hidden rows); `defer`
    (`auto`) leaves the rows in the drafter's gap for a draft (its first rounds may not draft at all). `n_batch` /
    `on_batch`: decode's docstring."""
    # the trunk hidden before a chunk's first row; None: that row's NextN row is cached (n_cached > 0)
    before = [np.zeros((1, seq.model.hparams["n_embd"]), np.float32) if n_cached == 0 else None]

    def warm_up(h, p):
        if drafter is not None:
            if before[0] is not None:
                drafter.add_rows(prompt[p:p + len(h)], np.concatenate([before[0], h[:-1]]), p)
            elif len(h) > 1:
                drafter.add_rows(prompt[p + 1:p + len(h)], h[:-1], p + 1)
            if not defer:
                drafter.flush()
        before[0] = h[-1:]

    step = n_batch or len(prompt)
    for s in range(n_cached, len(prompt), step):
        e = min(len(prompt), s + step)
        out = seq.prefill(prompt[s:e], s, on_hidden=warm_up, last_only=drafter is None)
        if on_batch is not None:
            on_batch(e)
    return out


def _accept(chain, rng, logits, am, drafts, q, n_past: int, logit_bias, constraint, keep_rows: bool):
    """(accepted drafts a, the recovered or bonus token, the target rows on the host or None, the same rows as the
    chain read them: + logit_bias, constraint-masked) of a verify's
    `logits` / device argmax `am` over [id_last] + drafts: greedy match, sample-and-match (greedy drafts, q None)
    or rejection sampling (sampled drafts' q); `sampling.py`. The rows come to the host only when needed."""
    shaped = logit_bias is not None or constraint is not None
    raw = logits.numpy() if (shaped or not chain.greedy or keep_rows) else None
    target = _target(raw, logit_bias, constraint, drafts) if shaped else raw
    if shaped:
        am = np.argmax(target, axis=-1)
    if chain.greedy:
        a = next((i for i, d in enumerate(drafts) if int(am[i]) != d), len(drafts))
        return a, int(am[a]), raw, target
    if q is None:
        return (*sample_and_match(chain, rng, target, drafts, n_past), raw, target)
    return (*rejection_sample(chain, rng, target, drafts, q, n_past), raw, target)


def _emit(rules: FinishRules, out: list, new: list, constraint):
    """Push a round's tokens `new` through the finish rules into `out`: (tokens emitted m, finish reason or None)."""
    for m, t in enumerate(new, 1):
        finish = rules.push(out, t)
        if finish:
            break
    if constraint is not None:
        constraint.consume(new[:m])
    return m, finish


def _mark(extent: CacheExtent | None, n_past: int, drafter) -> None:
    """Update `extent` (decode's docstring) after a step."""
    if extent is not None:
        extent.n_past = n_past
        if drafter is not None:
            extent.n_mtp = drafter.pos0 if drafter.tok else n_past


def _target(rows, logit_bias, constraint, drafts):
    """The target rows [k+1, V] a choice reads: + logit_bias, then row i masked (-inf) by the constraint's state after
    drafts[:i] (consumed for the masks, then rolled back)."""
    rows = rows + logit_bias if logit_bias is not None else rows.copy()
    if constraint is not None:
        for i in range(len(rows)):
            rows[i][~constraint.allowed()] = -np.inf
            if i < len(drafts) and i < len(rows) - 1:
                constraint.consume([drafts[i]])
        constraint.rollback(min(len(drafts), len(rows) - 1))
    return rows


def generate(seq, prompt_ids, sampling: SamplingParams = SamplingParams(), spec: SpecParams = SpecParams(),
             **kw) -> Generation:
    """Generate up to `sampling.n_predict` tokens after `prompt_ids` (int list) on Sequence `seq`, speculating as
    `spec` says; keywords as `decode` (eog_ids, token_bytes, controller, ...). Raises NextnError."""
    return run_to_end(decode(seq, prompt_ids, sampling, spec, **kw))


def run_to_end(steps) -> Generation:
    """Drive a `decode` generator to its end; returns its Generation."""
    while True:
        try:
            next(steps)
        except StopIteration as e:
            return e.value
