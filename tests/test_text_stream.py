"""TextStream: what a streaming client may show — never half a UTF-8 character, never text past a stop string —
and the pieces always add up to the final text. Token bytes here are chosen by hand; the expected text is the
plain UTF-8 decoding of their concatenation, cut at the first stop string."""
import random

import pytest

from nextn.runtime.text_stream import TextStream

PIECES = [b"def", b" caf", b"\xc3", b"\xa9", b"()", b":\n", b"  \xe2\x82", b"\xac", b" # ", b"STO", b"P", b" x",
          b"\xf0\x9f", b"\x98", b"\x80", b""]   # é, €, 😀 split across tokens; a control token (no bytes)


def run(tokens, stop):
    ts = TextStream(lambda t: PIECES[t], stop)
    out = [ts.push(t) for t in tokens]
    return ts, out, ts.finish()


def test_split_characters_are_held_until_whole():
    ts, out, rest = run(range(len(PIECES)), [])
    assert out[2] is None and out[3] == "é"          # first byte of é: nothing to show yet
    assert out[6] == ":\n  "[2:] and out[7] == "€"
    assert out[12] is None and out[13] is None and out[14] == "😀"
    assert out[15] == ""                            # a control token shows nothing
    assert "".join(o or "" for o in out) + rest == b"".join(PIECES).decode()


def test_stop_string_is_never_streamed():
    ts, out, rest = run(range(len(PIECES)), ["STOP"])
    full = b"".join(PIECES).decode()
    want = full[:full.find("STOP")]
    assert out[9] == "" and out[10] == ""             # "STO" may start the stop string: held, then cut
    assert "".join(o or "" for o in out) + rest == want and ts.stopped_by == "STOP" and ts.text == want


def test_held_prefix_is_released_when_it_does_not_match():
    ts, out, rest = run([0, 9, 11], ["STOPPER"])
    assert out == ["def", "", "STO x"] and rest == "" and ts.stopped_by is None


@pytest.mark.parametrize("seed", range(20))
def test_random_token_streams_add_up(seed):
    rng = random.Random(seed)
    toks = [rng.randrange(len(PIECES)) for _ in range(40)]
    stops = rng.choice([[], ["e()"], [" # S", "€ #"], ["x"]])
    ts, out, rest = run(toks, stops)
    full = b"".join(PIECES[t] for t in toks).decode("utf-8", errors="replace")
    cut = min([i for i in (full.find(s) for s in stops) if i >= 0], default=len(full))
    assert "".join(o or "" for o in out) + rest == full[:cut]
