"""bench/spec_ab.py's own arithmetic without a model: a round's cost split by entry point, in decodes (the plain
run's `decode` seconds per step; the runs are spec_realwidth `cell`s), against values computed by hand. No timings
are asserted."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import spec_ab  # noqa: E402


def test_split_prices_each_entry_in_decodes():
    # plain: 100 steps of 20 ms; n_max 2: 40 rounds, 10 of them plain, 2.0 s of decoding
    plain = {"tok_s": 50.0, "tokens": [1, 2, 3], "emitted": 100, "rounds": 0, "plain_rounds": 100, "drafted": 0,
             "accepted": 0, "decode_s": 2.1, "entry_s": {"decode": 2.0}}
    spec = {"tok_s": 60.0, "tokens": [1, 2, 3], "emitted": 115, "rounds": 30, "plain_rounds": 10, "drafted": 60,
            "accepted": 45, "decode_s": 1.9,
            "entry_s": {"verify": 0.9, "decode": 0.2, "mtp_draft": 0.4, "draft": 0.24, "mtp_rows": 0.0}}
    got = spec_ab.split({"plain": plain, "2": spec}, "2")
    one = 0.02                       # seconds of one decode
    per = lambda s: s / 40 / one     # noqa: E731 — seconds over 40 rounds, in decodes
    assert got["decode_ms"] == pytest.approx(20.0) and got["x_plain"] == pytest.approx(1.2)
    assert got["mtp_draft"] == pytest.approx(per(0.4), abs=1e-3) and got["draft"] == pytest.approx(per(0.24), abs=1e-3)
    assert got["nextn"] == pytest.approx(per(0.64), abs=1e-3)
    assert got["verify"] == pytest.approx(per(1.1), abs=1e-3)
    assert got["host"] == pytest.approx(per(1.9 - 1.74), abs=1e-3)
    assert got["accepted"] == "45/60" and got["same_as_plain"]
    assert not spec_ab.split({"plain": plain, "2": {**spec, "tokens": [1, 2, 4]}}, "2")["same_as_plain"]
    # `auto` (--n-max 3,auto) adds its round counts and depth switches, the same split otherwise
    ev = [{"at_token": 1, "to_depth": 1, "why": "probe"}]
    auto = spec_ab.split({"plain": plain, "auto": {**spec, "depth_switches": ev}}, "auto")
    assert auto["rounds"] == "30 spec / 10 plain" and auto["depth_switches"] == ev
    assert auto["verify"] == got["verify"] and "depth_switches" not in got
