"""bench/tuning_check.py's end-to-end A/B bookkeeping, without timing anything: the arm order of each round is
balanced (no arm always first) and the ratios pair the arms within a round. No timings are asserted."""
from __future__ import annotations

import itertools
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import tuning_check as tc  # noqa: E402


def test_two_arms_go_abba():
    assert tc.arm_orders(["U", "T"], 8) == [("U", "T"), ("T", "U"), ("T", "U"), ("U", "T")] * 2


@pytest.mark.parametrize("n_arms", [2, 3])
def test_every_arm_takes_every_position_equally(n_arms):
    arms = "UTC"[:n_arms]
    cycle = 2 * n_arms   # 4 rounds for two arms, 6 for three
    orders = tc.arm_orders(arms, 3 * cycle)
    assert all(sorted(o) == sorted(arms) for o in orders)
    for start in range(0, len(orders), cycle):
        block = orders[start:start + cycle]
        for pos in range(n_arms):
            assert Counter(o[pos] for o in block) == {a: cycle // n_arms for a in arms}
    if n_arms == 3:   # and in 6 rounds, every order once
        assert sorted(orders[:6]) == sorted(itertools.permutations(arms))
    # each pair of consecutive rounds puts a different arm first (no arm first twice in a row within a pair)
    assert all(orders[r][0] != orders[r + 1][0] for r in range(0, len(orders), 2))


def test_ratios_are_paired_within_each_round_and_oriented_faster_above_one():
    rounds = [{"untuned": {"decode_tok_s": 10.0, "verify_1_ms": 20.0}, "tuned": {"decode_tok_s": 11.0, "verify_1_ms": 16.0}},
              {"untuned": {"decode_tok_s": 5.0, "verify_1_ms": 40.0}, "tuned": {"decode_tok_s": 5.0, "verify_1_ms": 50.0}},
              {"untuned": {"decode_tok_s": 8.0, "verify_1_ms": 10.0}, "tuned": {"decode_tok_s": 6.0, "verify_1_ms": 10.0}}]
    r = tc.paired_ratios(rounds, "tuned", "untuned")
    # tok/s: tuned / untuned per round; ms: untuned / tuned per round (both > 1 when tuned is faster)
    assert r["decode_tok_s"]["rounds"] == pytest.approx([1.1, 1.0, 0.75])
    assert r["verify_1_ms"]["rounds"] == pytest.approx([1.25, 0.8, 1.0])
    assert (r["decode_tok_s"]["median"], r["decode_tok_s"]["min"], r["decode_tok_s"]["max"]) == pytest.approx((1.0, 0.75, 1.1))
    assert (r["verify_1_ms"]["median"], r["verify_1_ms"]["min"], r["verify_1_ms"]["max"]) == pytest.approx((1.0, 0.8, 1.25))


def test_worker_metrics_flattens_a_realwidth_result():
    res = {"decode_tok_s": 3.0, "prefill_tok_s": 9.0, "ms": {"verify_1": 1.5, "draft": 0.5}, "load_s": 7.0}
    assert tc.worker_metrics(res) == {"decode_tok_s": 3.0, "prefill_tok_s": 9.0, "verify_1_ms": 1.5, "draft_ms": 0.5}
