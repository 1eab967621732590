"""bench/agentic.py's parsing and tables, on synthetic streams (no server): the numbers are recomputed here from the
stream's arrival times and the runs' values."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def agentic():
    spec = importlib.util.spec_from_file_location("agentic", os.path.join(ROOT, "bench", "agentic.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _chunk(delta=None, timings=None, choices=True):
    obj = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": None}] if choices else []}
    if timings:
        obj["timings"] = timings
    return ("data: " + json.dumps(obj)).encode()


def test_parse_stream_times_the_first_and_later_deltas(agentic):
    lines = [_chunk({"role": "assistant", "content": None}), b"", _chunk({"reasoning_content": "hm"}),
             _chunk({"content": "a"}), _chunk({"content": ""}), _chunk({"content": "b"}),
             _chunk(choices=False, timings={"cache_n": 7, "prompt_n": 3, "predicted_n": 3}), b"data: [DONE]"]
    # arrival times of the data lines that are not [DONE], in order (the role chunk at 10.05 carries no text)
    times = iter([10.05, 10.2, 10.3, 10.35, 10.6, 10.7])
    r = agentic.parse_stream(lines, t_sent=10.0, clock=lambda: next(times))
    assert r["n_deltas"] == 3                              # reasoning "hm", "a", "b"; empty and role chunks are not
    assert r["ttft_ms"] == pytest.approx(200.0)            # 10.2 - 10.0
    assert r["decode_tps"] == pytest.approx(2 / 0.4)       # 2 tokens after the first, 10.2 -> 10.6
    assert r["timings"] == {"cache_n": 7, "prompt_n": 3, "predicted_n": 3}


def test_parse_stream_without_tokens(agentic):
    r = agentic.parse_stream([_chunk({"role": "assistant"})], t_sent=0.0, clock=lambda: 1.0)
    assert r["ttft_ms"] is None and r["decode_tps"] is None and r["n_deltas"] == 0
    # the whole reply in one delta: the server's decode rate stands in for the client's
    one = [_chunk({"content": "abc"}), _chunk(choices=False, timings={"predicted_per_second": 2.5})]
    r = agentic.parse_stream(one, t_sent=0.0, clock=lambda: 1.0)
    assert r["n_deltas"] == 1 and r["ttft_ms"] == 1000.0 and r["decode_tps"] == 2.5


def _turn(ttft, tps, cache, prompt, turn=1):
    return {"ttft_ms": ttft, "decode_tps": tps, "n_deltas": 4, "timings": {"cache_n": cache, "prompt_n": prompt},
            "turn": turn}


def test_turn_table_and_ratios_take_medians_over_rounds(agentic):
    runs = {"a": [[_turn(100, 10, 0, 50), _turn(40, 12, 49, 20, 2)],
                  [_turn(300, 30, 0, 50), _turn(60, 14, 49, 20, 2)]],
            "b": [[_turn(200, 5, 0, 50)], [_turn(200, 7, 0, 50)]]}
    table = agentic.turn_table(runs).splitlines()
    assert table[0].startswith("| turn | a TTFT ms | a decode tok/s | a cache_n/prompt_n | b TTFT ms")
    assert table[2] == "| 1 | 200 | 20.0 | 0/50 | 200 | 6.0 | 0/50 |"     # medians of (100, 300), (10, 30), (5, 7)
    assert table[3] == "| 2 | 50 | 13.0 | 49/20 | - | - | -/- |"          # b has no turn 2
    # last 1 turn of each round: a's TTFT median(40, 60) = 50 over b's 200; decode median(12, 14) = 13 over 6
    assert agentic.ratio_line(runs, "a", "b", last=1) == "a / b, last 1 turns: TTFT 0.25x, decode tok/s 2.17x"


def test_a_last_turn_only_run_sits_at_its_turn(agentic, monkeypatch):
    # --cold-last: the baseline has turn 2 only; its row is turn 2's, and the ratio compares the last turns
    runs = {"a": [[_turn(100, 10, 0, 50), _turn(40, 12, 49, 20, 2)]], "cold": [[_turn(400, 8, 0, 69, 2)]]}
    table = agentic.turn_table(runs).splitlines()
    assert table[2] == "| 1 | 100 | 10.0 | 0/50 | - | - | -/- |"
    assert table[3] == "| 2 | 40 | 12.0 | 49/20 | 400 | 8.0 | 0/69 |"
    assert agentic.ratio_line(runs, "a", "cold", last=1) == "a / cold, last 1 turns: TTFT 0.10x, decode tok/s 1.50x"
    msgs = agentic.conversation(3, 12)
    sent = []
    monkeypatch.setattr(agentic, "chat",
                        lambda url, m, n, cache, ignore_eos=False: sent.append((len(m), cache)) or _turn(1, 1, 0, 1))
    out = agentic.replay("u", msgs, 4, cache=False, last_only=True)
    assert sent == [(len(msgs) - 1, False)] and [x["turn"] for x in out] == [3]


def test_conversation_is_deterministic_and_sessions_differ(agentic):
    a, b = agentic.conversation(3, 30), agentic.conversation(3, 30)
    assert a == b and len(a) == 7 and [m["role"] for m in a[1:3]] == ["user", "assistant"]
    other = agentic.conversation(3, 30, session=1)
    assert other[0] != a[0]
