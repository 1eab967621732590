"""nextn.common.timing.round_robin, the one interleaved timing loop of the benches and of `auto`'s calibration."""
from __future__ import annotations

from nextn.common.timing import round_robin


def test_round_robin_interleaves_the_calls_and_keeps_every_round():
    order = []
    calls = {k: (lambda k=k: order.append(k)) for k in ("decode", "verify_2", "draft")}
    t = round_robin(calls, 3)
    # one call of each per round, in the dict's order: a burst of load in one round hits all three
    assert order == ["decode", "verify_2", "draft"] * 3
    assert list(t) == ["decode", "verify_2", "draft"]
    assert all(len(v) == 3 and all(s >= 0.0 for s in v) for v in t.values())
    assert round_robin(calls, 0) == {"decode": [], "verify_2": [], "draft": []}
