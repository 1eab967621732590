"""Draft depth per round: fixed (`--spec-draft-n-max K`) or adaptive with a never-lose gate (`auto`).

Vocabulary:
- *depth* k: drafts proposed this round (0 = a plain decoding round: verify of one row, no NextN work).
- *alpha[j]*: running acceptance of the draft at position j+1 given that drafts 1..j were accepted — the
  conditional form of llama.cpp's `acc per pos`: the mean of the belief it started from (the prior alpha0, or for a
  position first reached after others the acceptance `believed` of it then), weighted as `prior_rounds` rounds, and
  the rounds that reached it, until that mean moves a round's result by less than `beta`; then an exponential moving
  average of weight beta. (Before: the moving average from alpha0 = 0.75 at once, so a probe that accepted moved
  the belief by 0.025; on glm45air-8-a0, acceptance 0.98, `auto` started speculating at token 53 in one run and
  never in another: docs/performance.md.)
- *expected tokens* E(k) = 1 + sum_{i=1..k} prod_{j<i} alpha[j]: tokens a round of depth k emits on average
  (Leviathan et al. 2023, eq. 1, with per-position rather than constant acceptance).
- *round cost* c(k) = base(k) × slowdown: base(k) from a one-off calibration of the sequence's entry points (verify
  of k+1 rows + k draft steps; a draft step is timed through `Sequence.mtp_draft`, so it is the step decoding will
  run — the reduced head's `draft_vocab` entry with --spec-draft-vocab, whose lower cost can make a depth pay);
  *slowdown* a moving average of measured round seconds / base(k): one for plain rounds, one for each depth once a
  round ran at it, and one for speculative rounds that stands in for the depths not run yet (it absorbs the loop's
  own time, the NextN gap rows fused into draft step 0, the calibration's error and the machine's current load; a
  measurement counts at most 4x the running value, so one preempted round cannot flip the choice).
- *gap*: NextN rows of emitted tokens not written yet (runtime/speculative.py `Drafter`); with `auto` the prompt's
  rows wait there too, and every plainly decoded token adds one. A draft writes up to `Drafter.fuse_rows` of them
  inside its step 0 (their cost is in the round's seconds); a longer gap first takes a separate `mtp_rows` call, the
  *catch-up*, priced at `row_s` a row and spread over the rounds it buys (`spread`); the decode loop times it, and
  `observe` takes its measured seconds out of the round's before updating a slowdown.
- *rate* r(k) = E(k) / c(k), tokens per second. Each round takes argmax_k r(k).
- *gate*: when r(0) >= max_k r(k), decode plainly and *probe* again after `interval` plain rounds; the interval
  doubles (up to `max_interval`) while probes keep losing and resets when speculation wins. A probe is one
  speculative round at the best depth: it re-measures acceptance and cost. Speculation, once measured, stops only
  when plain decoding is expected more than HOLD faster, and a probe's verdict uses the same margin: its catch-up is
  paid, so a few early rejections do not buy another catch-up and a plain interval. The first round probes when
  the prior says plain (no acceptance is measured, and the catch-up is the prompt alone). Every probe first writes
  the gap, ~0.05 decodes a row on glm45air-8-a0, so probes are *budgeted*: their measured seconds beyond plain
  decoding's for their tokens stay within PROBE_SHARE of the generation's plain seconds (`affordable`). When even
  alpha = 1 cannot beat plain decoding (*cost-bound*: verify of k+1 rows costs more than k+1 plain rounds), the
  probe is skipped — no acceptance could change the answer — and the check repeats every `max_interval` rounds,
  after re-timing the decode, the verify of the best depth and a draft step at the current context (three
  timing-only calls, `retime`; not where only the catch-up makes it cost-bound).
Every switch is recorded in `events` with the numbers behind it. tests/test_depth_sim.py runs the decode loop on a
simulated sequence with glm45air-8-a0's costs against every fixed depth.
"""
from __future__ import annotations

import numpy as np

from nextn.common.timing import round_robin


class FixedDepth:
    """Always k (llama.cpp's behaviour for `--spec-draft-n-max K`)."""

    def __init__(self, k: int):
        self.k_max = k
        self.events: list[dict] = []

    def choose(self, n_emitted: int, gap_rows: int = 0, left: int | None = None) -> int:
        return self.k_max

    def observe(self, k: int, a: int, seconds: float, n_emitted: int = 0, catch_up_s: float | None = None) -> None:
        pass


class AdaptiveDepth:
    """`--spec-draft-n-max auto`: depth 0..k_max chosen each round by expected tokens per second (module doc).

    `costs` = (verify_s, draft_s[, row_s]) from `calibrate`: seconds of a verify of T = 1..k_max+1 rows, of one
    draft step, of one NextN catch-up row.
    `remeasure(T)` → fresh seconds of a verify of T rows at the current position (timing only; used instead of a
    probe while cost-bound), or None where T rows do not fit the context; `remeasure_draft()` → fresh seconds of
    one draft step there, or None (no cell left, or not given: the calibration's draft seconds stay)."""

    def __init__(self, k_max: int, costs, remeasure=None, alpha0: float = 0.75, beta: float = 0.1,
                 interval: int = 16, max_interval: int = 256, remeasure_draft=None, prior_rounds: int = 4):
        self.k_max = k_max
        self.verify_s, self.draft_s = list(costs[0][:k_max + 1]), costs[1]
        self.row_s = costs[2] if len(costs) > 2 else 0.0      # NextN catch-up seconds per gap row
        self.gap_s = 0.0                                       # catch-up owed before the next draft
        self.left = None                                       # tokens the generation may still emit (None: no end)
        self.base = [self.verify_s[k] + k * self.draft_s for k in range(k_max + 1)]
        self.slow = [1.0, 1.0]               # slowdown of plain rounds, of speculative rounds
        self.slow_at = [None] * (k_max + 1)  # slowdown of rounds at depth k (None: none yet; slow[1] stands in)
        self.rounds_at = [0] * (k_max + 1)
        self.elapsed_s = 0.0                 # seconds of every round observed
        self.probe_loss_s = 0.0              # seconds the probes took beyond plain decoding's for their tokens
        self.alpha = [alpha0] * k_max
        self.reached = [0] * k_max           # rounds that reached draft position j+1
        self.prior_rounds = prior_rounds     # the belief a position starts from weighs as much as this many rounds
        self.remeasure, self.remeasure_draft = remeasure, remeasure_draft
        self.beta, self.interval0, self.max_interval = beta, interval, max_interval
        self.interval, self.plain_left, self.mode = interval, 0, "spec"    # mode: spec | plain | probe
        self.events: list[dict] = []

    @property
    def seen(self) -> list[bool]:
        """Whether a round has reached draft position j+1 yet."""
        return [n > 0 for n in self.reached]

    @property
    def seen_spec(self) -> bool:
        """Whether a speculative round has been measured."""
        return any(self.rounds_at[1:])

    def believed(self) -> list[float]:
        """alpha as the rates use it: a position no round has reached yet takes the acceptance of the deepest
        position reached before it (the prior alpha0 before any), so a depth that was never tried is neither
        written off nor favoured by the prior: without this `auto` kept depth 1 at 0.98 acceptance on
        glm45air-8-a0, where depth 3 ran 1.16x plain and depth 1 1.09x (positions 2, 3 stayed at the prior 0.75)."""
        out, last = [], None
        for a, seen in zip(self.alpha, self.seen):
            last = a if seen else (a if last is None else last)
            out.append(last)
        return out

    def expected(self, k: int, alpha=None) -> float:
        e = run = 1.0
        for a in (self.believed() if alpha is None else alpha)[:k]:
            run *= a
            e += run
        return e

    def cost(self, k: int) -> float:
        """Seconds of a round of depth k; a speculative round also pays the NextN catch-up of the gap, spread over
        the rounds it would buy (`spread`)."""
        if k == 0:
            return self.base[0] * self.slow[0]
        return self.base[k] * self.spec_slow(k) + self.gap_s / self.spread(k)

    def spec_slow(self, k: int) -> float:
        """Slowdown of a round at depth k: its own, measured, once a round ran at k; else the speculative rounds'.
        Per depth because the calibration prices the verifies past FIT_ROWS rows by a line that runs 10-21 % below
        their seconds (`extrapolate`): with one slowdown for all depths the deep ones kept looking cheap."""
        return self.slow[1] if self.slow_at[k] is None else self.slow_at[k]

    def affordable(self, k: int) -> bool:
        """Whether a probe at depth k fits the probe budget: the seconds the probes so far took beyond plain
        decoding's for their tokens, plus this one's priced excess (its catch-up `gap_s` and its round, less its
        expected tokens at plain's seconds), at most PROBE_SHARE of the generation's seconds at plain's rate
        (elapsed + `left` tokens). Every probe first writes the NextN rows of the tokens decoded plainly since the
        last draft (the catch-up, ~0.05 decodes a row on glm45air-8-a0), so probing at the doubling interval would
        cost ~5 % of a generation where nothing pays. With no known end (`left` None) the interval alone limits
        probes."""
        if self.left is None:
            return True
        plain_s = self.base[0] * self.slow[0]
        price = self.gap_s + self.base[k] * self.spec_slow(k) - self.expected(k) * plain_s
        return self.probe_loss_s + max(price, 0.0) <= PROBE_SHARE * (self.elapsed_s + self.left * plain_s)

    def spread(self, k: int) -> float:
        """Rounds of depth k a catch-up written now pays for: `interval`, or fewer where the generation ends
        sooner (`left` tokens at E(k) per round). Without this a probe near the end of a generation writes the
        NextN rows of everything emitted since the last draft for the few rounds left (bench/spec_realwidth.py,
        glm45air-4-a0.2: `auto` at 0.93x plain, its one probe at token 119 of 127 paying a 118-row catch-up)."""
        if self.left is None:
            return float(self.interval)
        return max(1.0, min(float(self.interval), self.left / self.expected(k)))

    def rates(self, alpha=None) -> list[float]:
        return [self.expected(k, alpha) / self.cost(k) for k in range(self.k_max + 1)]

    def choose(self, n_emitted: int, gap_rows: int = 0, left: int | None = None) -> int:
        """Depth of the next round; `gap_rows`: NextN rows a draft would first have to write; `left`: tokens the
        generation may still emit (its -n budget or the context's cells; None: unbounded)."""
        if self.plain_left > 0:              # the plain phase costs one compare per round
            self.plain_left -= 1
            return 0
        self.gap_s, self.left = gap_rows * self.row_s, left
        r = self.rates()
        best = max(range(1, self.k_max + 1), key=lambda k: r[k])
        if self.mode == "spec":
            if r[best] * (1.0 + HOLD if self.seen_spec else 1.0) > r[0]:
                return best
            bound = self.expected(best, [1.0] * self.k_max) / self.cost(best)
            if bound > r[0] and not any(self.seen) and self.left is not None and self.affordable(best):
                # No acceptance measured yet: the prior's verdict is a guess, and a probe is cheapest now (its
                # catch-up is the deferred prompt alone; later ones also write every token decoded since).
                self.mode = "probe"
                return best
            self._event(n_emitted, 0, f"depth {best} expects " + self._versus(r[best], r[0])
                        + (" even at acceptance 1 (cost-bound)" if bound <= r[0] else ""))
            if bound <= r[0]:                # no acceptance could win: look again only every max_interval
                self.interval = self.max_interval
            self.mode, self.plain_left = "plain", self.interval - 1
            return 0
        # The plain phase ran out.
        self.interval = min(2 * self.interval, self.max_interval)
        if r[best] > r[0]:
            self.mode, self.interval = "spec", self.interval0
            self._event(n_emitted, best, f"depth {best} expects " + self._versus(r[best], r[0]))
            return best
        if self.cost_bound():
            # Cost-bound: no acceptance could win; re-time at the current context instead of probing, unless the
            # catch-up alone is what no acceptance repays (near the generation's end): re-timing costs a decode, a
            # verify and a draft step, which told nothing new there (2 % of a 128-token generation in
            # tests/test_depth_sim.py).
            if self.remeasure is not None and self.cost_bound(catch_up=False):
                self.retime(best)
            self.interval = self.max_interval
            self.plain_left = self.interval - 1
            return 0
        if not self.affordable(best):        # the probe budget is spent: plain for another interval
            self.plain_left = self.interval - 1
            return 0
        self.mode = "probe"
        return best

    def cost_bound(self, catch_up: bool = True) -> bool:
        """Whether no depth beats plain decoding even at acceptance 1 (with the priced catch-up, or without it)."""
        gap_s = self.gap_s
        self.gap_s = gap_s if catch_up else 0.0
        try:
            r = self.rates([1.0] * self.k_max)
        finally:
            self.gap_s = gap_s
        return max(r[1:]) <= r[0]

    def retime(self, k: int) -> None:
        """Re-time the decode and the verify of k+1 rows at the sequence's current position (`remeasure`): the
        calibration ran at position 0, and a verify's attention grows with the context (bench/spec_depth.py;
        docs/performance.md, "Decode and draft-mtp at depth"). Every depth's verify seconds scale by the verify's
        change, plain's by the decode's; the plain slowdown is divided by the same factor, so the plain round seconds
        it has measured stay. The draft step is re-timed too where `remeasure_draft` is given: its attention grows
        with the context as the verify's does, its head does not, so it grows by its own factor, and a depth whose
        drafts got dearer must not look cheaper than it is."""
        v1, vk = self.remeasure(1), self.remeasure(k + 1)
        if v1 is None or vk is None:         # no cells left to time at
            return
        d = self.remeasure_draft() if self.remeasure_draft is not None else None
        if d is not None:
            self.draft_s = d
        f1, fk = v1 / self.verify_s[0], vk / self.verify_s[k]
        self.slow[0] /= f1
        if not self.seen_spec:
            self.slow[1] = self.slow[0]
        self.verify_s = [v1] + [v * fk for v in self.verify_s[1:]]
        self.base = [self.verify_s[j] + j * self.draft_s for j in range(self.k_max + 1)]

    def observe(self, k: int, a: int, seconds: float, n_emitted: int = 0, catch_up_s: float | None = None) -> None:
        """Record a round: depth k (drafts actually verified), accepted a, wall seconds. A speculative round's
        seconds include the NextN catch-up its choice priced apart (`gap_s`, charged once per `interval` in `cost`):
        `catch_up_s`, its measured seconds (the decode loop times the Drafter's `mtp_rows` call), or where not given
        the priced `gap_s`, is taken out before the slowdown is updated, else a first round that writes a deferred
        prompt gap makes every depth look cost-bound for max_interval rounds (found by bench/spec_realwidth.py with
        --spec-draft-vocab; docs/performance.md, "The reduced-vocabulary draft head at real width"). The measured
        seconds, not the price: `row_s` is one 32-row call's rate at position 0, and what a price misses would stay
        in the slowdown of every later round. The catch-up is then paid: the probe's verdict below no longer charges
        it (before, it priced the catch-up it had just paid once more). A depth's own slowdown starts from the
        speculative one, weighted as `prior_rounds` rounds, as an acceptance does."""
        self.elapsed_s += seconds
        if self.mode == "probe":
            self.probe_loss_s += max(seconds - (a + 1) * self.base[0] * self.slow[0], 0.0)
        if k > 0:
            seconds = max(seconds - (self.gap_s if catch_up_s is None else catch_up_s), 0.0)
            self.gap_s = 0.0
            self.rounds_at[k] += 1
            s, w = self.spec_slow(k), max(0.1, 1.0 / (self.rounds_at[k] + self.prior_rounds))
            self.slow_at[k] = s + w * (min(seconds / self.base[k], 4 * s) - s)
        s = self.slow[k > 0]
        self.slow[k > 0] = s + 0.1 * (min(seconds / self.base[k], 4 * s) - s)
        if not self.seen_spec:               # until a speculative round is measured, assume the plain overhead
            self.slow[1] = self.slow[0]
        belief = self.believed()
        for j in range(min(a + 1, k)):       # positions the round reached: 1..a accepted, a+1 rejected
            if not self.reached[j]:          # a position's first round starts from what was believed of it
                self.alpha[j] = belief[j]
            self.reached[j] += 1
            w = max(self.beta, 1.0 / (self.reached[j] + self.prior_rounds))
            self.alpha[j] += w * (float(j < a) - self.alpha[j])
        if self.mode == "probe":
            r = self.rates()
            best = max(range(1, self.k_max + 1), key=lambda j: r[j])
            # The probe's catch-up is paid: speculation goes on unless plain decoding is clearly faster (HOLD),
            # so a few unlucky rejections early do not cost another catch-up and a plain interval.
            if r[best] * (1.0 + HOLD) > r[0]:
                self.mode, self.interval = "spec", self.interval0
                self._event(n_emitted, best, f"probe at depth {k} accepted {a}: depth {best} expects "
                                             + self._versus(r[best], r[0]))
            else:
                if not self.events or self.events[-1]["to_depth"] != 0:     # the first probe: a switch to plain
                    self._event(n_emitted, 0, f"probe at depth {k} accepted {a}: depth {best} expects "
                                              + self._versus(r[best], r[0]))
                self.mode, self.plain_left = "plain", self.interval

    @staticmethod
    def _versus(spec: float, plain: float) -> str:
        rel = ">" if spec > plain else f"within {HOLD:.0%} of" if spec * (1.0 + HOLD) > plain else "<="
        return f"{spec:.1f} tok/s {rel} plain {plain:.1f} tok/s"

    def _event(self, n_emitted, to_k: int, why: str) -> None:
        self.events.append({"at_token": n_emitted, "to_depth": to_k, "why": why})


def spread_tokens(T: int, n_vocab: int) -> list[int]:
    """T distinct token ids spread over the vocabulary, for timing a verify of T rows. Rows of one repeated token
    route to the same experts and read a MoE layer's expert weights once; distinct tokens route apart, as the rows
    of a real verify mostly do (bench/spec_realwidth.py: 15-16 distinct of 16 routed at T = 2 on glm45air), so the
    gate prices a verify at (an upper bound of) what it costs, never below."""
    return [(1 + i * (n_vocab - 1) // max(T, 1)) % n_vocab for i in range(T)]


def calibrated(seq, k_max: int) -> bool:
    """Whether `calibrate(seq, k_max)` has run (and will not write cells from position 0 again)."""
    return k_max in seq.__dict__.get("_nextn_round_costs", {})


FIT_ROWS = 4        # `calibrate` times verifies of 1..FIT_ROWS rows and extrapolates the deeper ones (`extrapolate`)
CATCH_UP_ROWS = 32  # NextN catch-up rows `calibrate` times in one call (a deferred prompt gap is priced per row)
PROBE_SHARE = 0.02  # probes may cost at most this share of a generation's plain seconds (`AdaptiveDepth.affordable`)
HOLD = 0.02         # speculation, once measured, stops only where plain decoding is expected this much faster


def extrapolate(verify_s, n: int) -> list[float]:
    """Seconds of a verify of T = 1..n rows from the measured `verify_s` (T = 1..len(verify_s)): the measured ones,
    then a straight line from the last one with the least-squares slope over the multi-row verifies (T >= 2; with
    one of them, its step from T = 1), never below 0: past the dense weights, read once, a verify's seconds grow with
    the distinct experts its rows route to, about linearly while they are few of n_expert. Measured on
    glm45air-1-a0.1 (docs/performance.md, "The reduced-vocabulary draft head at real width"): the line from T = 1..4
    priced T = 5..9 10-21 % below their timed seconds, so deep depths are priced somewhat cheap; the acceptance
    product makes them rarely the best. Raises ValueError for an empty `verify_s`."""
    t = [float(x) for x in verify_s]
    if not t:
        raise ValueError("extrapolate: no measured verify")
    if n <= len(t):
        return t[:n]
    if len(t) == 1:
        slope = 0.0
    elif len(t) == 2:
        slope = t[1] - t[0]
    else:
        T = np.arange(2, len(t) + 1, dtype=np.float64)
        slope = float(np.polyfit(T, np.asarray(t[1:]), 1)[0])
    slope = max(0.0, slope)
    return t + [t[-1] + slope * (T - len(t)) for T in range(len(t) + 1, n + 1)]


def settled_min(calls: dict, max_rounds: int, rtol: float = 0.05, min_rounds: int = 2) -> dict:
    """{key: min seconds} of the calls ({key: f}), timed round-robin (common/timing.round_robin) after one
    warm-up round; stops after `min_rounds` timed rounds once a round moved no call's min by more than `rtol`
    (relative), else after `max_rounds`. The min of a few interleaved calls is what a shared machine allows."""
    round_robin(calls, 1)                      # warm-up: first-call costs (page faults, allocation)
    best: dict = {}
    for r in range(max_rounds):
        t = {k: v[0] for k, v in round_robin(calls, 1).items()}
        moved = any(k not in best or t[k] < best[k] * (1 - rtol) for k in t)
        best = {k: min(t[k], best.get(k, t[k])) for k in t}
        if r + 1 >= min_rounds and not moved:
            break
    return best


def calibrate(seq, k_max: int, reps: int = 5):
    """(seconds of a verify of T = 1..k_max+1 rows, of one draft step, of one NextN catch-up row). Timed: the
    verifies of T = 1..min(k_max + 1, FIT_ROWS) rows, one draft step and CATCH_UP_ROWS catch-up rows, the min of at
    most `reps` interleaved rounds after a warm-up, stopping early once the mins hold (`settled_min`); the deeper
    verifies are extrapolated (`extrapolate`). The verify and catch-up rows are distinct tokens (`spread_tokens`).
    Runs at position 0, so call it before prefill: every cell it writes is overwritten before it is read. Cached
    on the sequence per k_max. (Before: every verify up to k_max + 1 rows, reps + 1 rounds: 52.5 s, 153 decodes,
    on glm45air-1-a0.1 at k_max 8; docs/performance.md.)"""
    cache = seq.__dict__.setdefault("_nextn_round_costs", {})
    if k_max in cache:
        return cache[k_max]

    E, C = int(seq.model.hparams["n_embd"]), seq.n_ctx   # depths past the context are clamped by the loop anyway
    V = int(seq.model.hparams["n_vocab"])
    n, z = min(CATCH_UP_ROWS, C), np.zeros((CATCH_UP_ROWS, E), np.float32)
    fit = min(k_max + 1, FIT_ROWS, C)
    calls = {("verify", T): (lambda T=T: seq.verify(spread_tokens(T, V), 0)) for T in range(1, fit + 1)}
    if seq.model.has_mtp:
        calls["draft"] = lambda: seq.mtp_draft([0], z[:1], 0)
        calls["rows"] = lambda: seq.mtp_rows(spread_tokens(n, V), z[:n], 0)
    t = settled_min(calls, reps)
    verify = extrapolate([t[("verify", T)] for T in range(1, fit + 1)], k_max + 1)
    draft, row = (t["draft"], t["rows"] / n) if seq.model.has_mtp else (0.0, 0.0)
    cache[k_max] = (verify, draft, row)
    return cache[k_max]
