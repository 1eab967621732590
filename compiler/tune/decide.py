"""Whether a candidate kernel beats the default: interleaved, repeated timings judged against the default's own noise.

One timing per candidate lets noise choose: on a shared machine the fastest of twenty single timings is usually a
lucky one, and a log made that way slowed 4 of 6 kernels it touched when re-timed. So a candidate is kept only
after `rounds` rounds of, per row count,

    default, candidate 1, ..., candidate k, default          (the candidates' order rotated every round)

Per round and row count a candidate's ratio is min(the two default timings) / its timing (the default gets the
better of its two chances), its speedup the median of those ratios over the rounds, and the default's noise the
median over the rounds of |default before - default after| / the smaller (how much one kernel's timing moves
between two timings a few calls apart). A candidate is kept when its speedup (geometric mean over the row
counts) exceeds 1 + max(MIN_GAIN, noise) and no row count is slower than 1 - noise; otherwise the default stays.
This is plain code over timing callables so that tests can drive it with a fake clock.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MIN_GAIN = 0.02    # a gain below 2 % is not worth a record, however quiet the machine


@dataclass
class Outcome:
    """One candidate against the default, per row count in `rows` (seconds per call; medians over the rounds)."""
    rows: list
    default_secs: list
    run_secs: list
    speedups: list        # default / candidate per row count (> 1: the candidate is faster)
    noise: float          # the default's relative back-to-back spread, worst row count
    kept: bool

    @property
    def speedup(self) -> float:
        return geomean(self.speedups)


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def verdict(speedups, noise: float, min_gain: float = MIN_GAIN) -> bool:
    """Kept: faster overall by more than the noise (and MIN_GAIN), and at no row count slower than the noise."""
    return geomean(speedups) > 1 + max(min_gain, noise) and min(speedups) >= 1 - noise


def interleaved(time, default, cands: list, rows: list, rounds: int, min_gain: float = MIN_GAIN) -> dict:
    """{candidate: Outcome} from `rounds` interleaved rounds; `time(which, rows)` → seconds per call of `which`
    (`default` or one of `cands`) at `rows` activation rows."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    d_pairs = {r: [] for r in rows}
    c_secs = {c: {r: [] for r in rows} for c in cands}
    for i in range(rounds):
        order = cands[i % len(cands):] + cands[:i % len(cands)] if cands else []
        for r in rows:
            before = time(default, r)
            for c in order:
                c_secs[c][r].append(time(c, r))
            d_pairs[r].append((before, time(default, r)))
    noise_r = {r: statistics.median(abs(a - b) / min(a, b) for a, b in d_pairs[r]) for r in rows}
    noise = max(noise_r.values())
    d_best = {r: [min(p) for p in d_pairs[r]] for r in rows}
    out = {}
    for c in cands:
        sp = [statistics.median(d / t for d, t in zip(d_best[r], c_secs[c][r])) for r in rows]
        out[c] = Outcome(list(rows), [statistics.median(d_best[r]) for r in rows],
                         [statistics.median(c_secs[c][r]) for r in rows], sp, noise, verdict(sp, noise, min_gain))
    if not cands:   # the default alone: its own timings and noise (a log line "nothing to compare")
        out[default] = Outcome(list(rows), [statistics.median(d_best[r]) for r in rows],
                               [statistics.median(d_best[r]) for r in rows], [1.0] * len(rows), noise, False)
    return out


def best(outcomes: dict, cost=lambda c: 0, min_gain: float = MIN_GAIN):
    """(candidate, Outcome) to record: among the kept candidates those within the noise (at least `min_gain`) of
    the highest speedup,
    the one of least `cost` (e.g. knobs changed from the default: a change that buys nothing measurable is left
    out), then the highest speedup; with none kept the highest speedup (not kept: the log says the default stayed
    and by how much the best challenger lost)."""
    kept = [(c, o) for c, o in outcomes.items() if o.kept]
    if not kept:
        return max(outcomes.items(), key=lambda co: co[1].speedup)
    top = max(o.speedup for _c, o in kept)
    near = [(c, o) for c, o in kept if o.speedup * (1 + max(o.noise, min_gain)) >= top]
    return min(near, key=lambda co: (cost(co[0]), -co[1].speedup))
