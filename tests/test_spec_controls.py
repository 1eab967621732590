"""Speculation controls: per-request n_max (clamped to the engine maximum), n_min, p_min, the adaptive depth
controller and its never-lose gate, and the finish rules inside an accepted block (EOS → stop → -n, context)."""
import pytest

from conftest import G4, reference
from nextn.runtime.depth import AdaptiveDepth
from nextn.runtime.params import SPEC_OFF, SamplingParams, SpecParams
from nextn.runtime.speculative import generate

PROMPTS = {p["kind"]: p for p in reference()["prompts"]}
P = PROMPTS["code-short"]


def test_n_max_only_lowers_the_engine_maximum(q8_model):
    r = q8_model.generate(P["prompt_ids"], 8, n_max=q8_model.max_draft + 5, ignore_eos=True)
    assert (r.n_max, r.n_max_requested) == (q8_model.max_draft, q8_model.max_draft + 5)
    assert r.to_json()["spec_draft_n_max"] == q8_model.max_draft
    assert len(r.stats.per_pos) == q8_model.max_draft


def test_p_min_and_n_min_cut_drafts(q8_model):
    plain = q8_model.generate(P["prompt_ids"], 24, spec_type="none", ignore_eos=True)
    no_draft = q8_model.generate(P["prompt_ids"], 24, n_max=3, p_min=1.0, ignore_eos=True)
    short = q8_model.generate(P["prompt_ids"], 24, n_max=3, n_min=4, ignore_eos=True)
    some = q8_model.generate(P["prompt_ids"], 24, n_max=3, p_min=0.5, ignore_eos=True)
    full = q8_model.generate(P["prompt_ids"], 24, n_max=3, ignore_eos=True)
    assert no_draft.ids == short.ids == some.ids == plain.ids
    assert no_draft.stats.drafted == short.stats.drafted == 0
    assert no_draft.stats.plain_rounds == 23
    assert 0 < some.stats.drafted < full.stats.drafted


def test_adaptive_depth_gate_switches_and_probes():
    """Synthetic costs: verify flat in rows (GPU-like). High acceptance keeps speculating; low acceptance drops to
    plain, and probes return to speculation once acceptance recovers."""
    c = AdaptiveDepth(3, ([1e-3] * 4, 1e-4), interval=4, max_interval=16)
    for i in range(20):
        k = c.choose(i)
        c.observe(k, k, 1e-3 + k * 1e-4, i)
    assert k == 3 and c.mode == "spec"
    for i in range(40):                       # acceptance collapses: switches to plain
        k = c.choose(i)
        c.observe(k, 0, 1e-3 + k * 1e-4, i)
    assert c.mode == "plain" and c.events[-1]["to_depth"] == 0
    probes = 0
    for i in range(200):                      # acceptance is back: a probe sees it and speculation resumes
        k = c.choose(i)
        probes += c.mode == "probe"
        c.observe(k, k, 1e-3 + k * 1e-4, i)
        if c.mode == "spec":
            break
    assert probes >= 1 and c.mode == "spec" and c.events[-1]["to_depth"] > 0, c.events
    cb = AdaptiveDepth(3, ([1e-3, 3e-3, 5e-3, 7e-3], 1e-3))   # verify cost linear in rows: cost-bound
    assert [cb.choose(i) for i in range(50)] == [0] * 50
    assert "cost-bound" in cb.events[0]["why"]


def test_auto_is_lossless_while_switching(q8_model):
    seq = q8_model.sequence
    plain = generate(seq, P["prompt_ids"], SamplingParams(40), SPEC_OFF)
    ctl = AdaptiveDepth(3, ([1e-4] * 4, 1e-6), interval=2, max_interval=4, alpha0=0.9)   # favours speculation
    r = generate(seq, P["prompt_ids"], SamplingParams(40), SpecParams(n_max="auto"), controller=ctl)
    assert r.tokens == plain.tokens
    assert r.stats.rounds > 0 and r.stats.emitted == len(r.tokens) - 1
    assert r.stats.accepted <= r.stats.drafted == sum(r.stats.drafted_at)


def _stop_inside_block(model):
    """A stop string that spans two or more tokens and completes at an accepted draft that is not the last token of
    its block (greedy, n_max=3), so the finish rule must cut a verified block. Built from the run itself, so it
    always exists: the shortest tail of the text up to that token that spans two tokens and occurs first there.
    Returns (the full run, j = index of the token completing the stop, the stop string)."""
    blocks = []
    full = model.generate(P["prompt_ids"], 48, n_max=3, ignore_eos=True, on_tokens=lambda ids: blocks.append(list(ids)))
    assert [t for b in blocks for t in b] == full.ids
    starts = [sum(map(len, blocks[:i])) for i in range(len(blocks))]
    # an accepted draft that is not its block's last token (the recovered / bonus token), past the first block
    j = next(s + i for s, b in zip(starts[1:], blocks[1:]) for i in range(len(b) - 1) if s + i >= 1)
    pieces = [model.tokenizer.decode([t]) for t in full.ids]
    text = "".join(pieces)
    end = len("".join(pieces[:j + 1]))
    for k in range(len(pieces[j]) + 1, end + 1):   # reaches into token j-1 at least
        s = text[end - k:end]
        if text.find(s) == end - k:
            return full, j, s, blocks
    raise AssertionError("unreachable: the whole prefix occurs first at 0")


def test_stop_string_inside_accepted_block(q8_model):
    full, j, s, blocks = _stop_inside_block(q8_model)
    cut = []
    r = q8_model.generate(P["prompt_ids"], 48, n_max=3, stop=[s], ignore_eos=True, on_tokens=lambda ids: cut.append(list(ids)))
    # the round that completed the stop verified more tokens than it emitted: the block was cut after token j
    assert r.finish_reason == "stop" and cut[:-1] == [b for b in blocks[:len(cut) - 1]]
    assert len(cut[-1]) < len(blocks[len(cut) - 1]) and r.ids[-1] == full.ids[j]
    for n_max in ("auto", 1, 3):
        r = q8_model.generate(P["prompt_ids"], 48, n_max=n_max, stop=[s, "never-there"], ignore_eos=True)
        assert r.finish_reason == "stop"
        assert r.ids == full.ids[:j + 1]
        assert r.text == q8_model.tokenizer.decode(full.ids)[:q8_model.tokenizer.decode(full.ids).find(s)]
        assert r.stats.emitted == len(r.ids) - 1 and r.stats.accepted <= r.stats.emitted
    g = generate(q8_model.sequence, P["prompt_ids"], SamplingParams(48, stop=[s]), SpecParams(n_max=3),
                 token_bytes=q8_model.tokenizer.token_to_bytes)
    assert g.tokens == full.ids[:j + 1] and g.n_past == len(P["prompt_ids"]) + j


def test_finish_precedence_eos_then_stop_then_length(q8_model):
    full, j, s, _blocks = _stop_inside_block(q8_model)
    tb = q8_model.tokenizer.token_to_bytes
    eos = generate(q8_model.sequence, P["prompt_ids"], SamplingParams(j + 1, stop=[s]), SpecParams(n_max=3),
                   eog_ids={full.ids[j]}, token_bytes=tb)
    assert (eos.finish_reason, eos.tokens) == ("eos", full.ids[:j + 1])
    stop = generate(q8_model.sequence, P["prompt_ids"], SamplingParams(j + 1, stop=[s]), SpecParams(n_max=3),
                    token_bytes=tb)
    assert (stop.finish_reason, stop.tokens) == ("stop", full.ids[:j + 1])
    length = generate(q8_model.sequence, P["prompt_ids"], SamplingParams(j, stop=[s]), SpecParams(n_max=3),
                      token_bytes=tb)
    assert (length.finish_reason, length.tokens) == ("length", full.ids[:j])
    assert length.stats.emitted == j - 1 and length.stats.accepted <= j - 1


def test_draft_stops_at_the_context_end(compiled):
    import nextn.runtime as rt

    ids = P["prompt_ids"]
    small = rt.load(compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf"), ctx_size=len(ids) + 6)
    want = generate(small.sequence, ids, SamplingParams(40), SPEC_OFF)
    for n_max in (3, "auto"):
        r = small.generate(ids, 40, n_max=n_max, ignore_eos=True)
        assert r.finish_reason == "length" and len(r.ids) == 7
        assert r.ids == want.tokens


def _fake_sequence(verified: list, rows: list):
    """A Sequence for `depth.calibrate`: its model's facts; the tokens of each verify / NextN catch-up call are
    appended to `verified` / `rows`."""
    import types

    class Fake:
        model = types.SimpleNamespace(hparams={"n_embd": 8, "n_vocab": 151552}, has_mtp=True)
        n_ctx = 64

        def verify(self, tokens, pos0):
            verified.append(list(tokens))

        def mtp_draft(self, tokens, h, pos0):
            pass

        def mtp_rows(self, tokens, h, pos0):
            rows.append(list(tokens))
    return Fake()


def test_calibrate_times_verifies_of_distinct_tokens():
    """Regression (issue 34, bench/spec_realwidth.py): `auto` timed a verify of T copies of one token, which routes
    every row to the same experts and under-priced real verifies (1.07 vs 1.33 decodes at T = 2 on glm45air-4).
    The calibration rows must be T distinct valid ids (the NextN catch-up rows likewise: the gate charges a deferred
    prompt gap at that rate)."""
    from nextn.runtime.depth import calibrate

    seen, rows = [], []
    costs = calibrate(_fake_sequence(seen, rows), 3, reps=1)
    assert len(costs[0]) == 4
    for T in range(1, 5):
        calls = [t for t in seen if len(t) == T]
        assert calls, T
        for t in calls:
            assert len(set(t)) == T and all(0 <= x < 151552 for x in t)
    assert rows and all(len(set(t)) == len(t) == 32 for t in rows)   # the catch-up rows' cost: distinct tokens too


def test_extrapolate_verify_costs_against_hand_computed_lines():
    """`depth.extrapolate`: measured verifies kept; deeper ones on the least-squares line of the multi-row verifies
    (T >= 2), drawn from the last measured one; never a falling line."""
    from nextn.runtime.depth import extrapolate

    # T = 1..4: 1.0, 1.3, 1.4, 1.6 -> slope over (2, 1.3), (3, 1.4), (4, 1.6): 0.15 (hand: sum dx*dy / sum dx^2 =
    # (-1 * -0.1333 + 0 + 1 * 0.1667) / 2 = 0.15); T = 5..7: 1.6 + 0.15, 0.30, 0.45
    assert extrapolate([1.0, 1.3, 1.4, 1.6], 7) == pytest.approx([1.0, 1.3, 1.4, 1.6, 1.75, 1.9, 2.05])
    assert extrapolate([1.0, 1.3, 1.4, 1.6], 3) == [1.0, 1.3, 1.4]          # nothing to extrapolate
    assert extrapolate([2.0, 2.5], 4) == pytest.approx([2.0, 2.5, 3.0, 3.5])   # one multi-row verify: its step
    assert extrapolate([2.0], 3) == [2.0, 2.0, 2.0]
    assert extrapolate([1.0, 1.5, 1.4, 1.3], 5) == pytest.approx([1.0, 1.5, 1.4, 1.3, 1.3])   # noise: flat, not down
    with pytest.raises(ValueError):
        extrapolate([], 2)


def test_calibrate_times_few_verifies_and_stops_when_the_mins_hold(monkeypatch):
    """`depth.calibrate` at k_max 8 times verifies of 1..FIT_ROWS rows only (the rest extrapolated), each call in at
    most 1 + reps rounds, and stops after the warm-up + 2 rounds when the times hold."""
    from nextn.runtime import depth

    calls, cost = [], {1: 1.0, 2: 1.3, 3: 1.4, 4: 1.6}

    def fake_round_robin(calls, rounds):    # each verify of T rows takes cost[T] seconds, draft 0.5, rows 3.2
        out = {k: [] for k in calls}
        for _ in range(rounds):
            for k, f in calls.items():
                f()
                out[k].append(cost[k[1]] if isinstance(k, tuple) else {"draft": 0.5, "rows": 3.2}[k])
        return out
    monkeypatch.setattr(depth, "round_robin", fake_round_robin)
    verify, draft, row = depth.calibrate(_fake_sequence(calls, []), 8, reps=5)
    seen = [len(t) for t in calls]
    assert sorted(set(seen)) == [1, 2, 3, 4] and max(seen) == depth.FIT_ROWS
    assert len(seen) == 4 * 3                   # warm-up + 2 rounds: the mins held
    assert verify == pytest.approx([1.0, 1.3, 1.4, 1.6, 1.75, 1.9, 2.05, 2.2, 2.35])
    assert (draft, row) == (0.5, pytest.approx(3.2 / 32))


def test_settled_min_runs_on_while_a_min_keeps_falling(monkeypatch):
    """`depth.settled_min`: a call whose time falls by more than rtol every round keeps the rounds going up to
    max_rounds; the result is each call's min over the timed rounds (the warm-up round excluded)."""
    from nextn.runtime import depth

    times = {"a": iter([9.0, 1.0, 1.0, 1.0, 1.0, 1.0]), "b": iter([9.0, 8.0, 4.0, 2.0, 1.0, 0.5])}
    rounds = []

    def fake_round_robin(calls, n):
        rounds.append(n)
        return {k: [next(times[k])] for k in calls}
    monkeypatch.setattr(depth, "round_robin", fake_round_robin)
    got = depth.settled_min({"a": None, "b": None}, max_rounds=4)
    assert len(rounds) == 1 + 4 and got == {"a": 1.0, "b": 1.0}
    times = {"a": iter([9.0, 2.0, 2.0, 2.0]), "b": iter([9.0, 3.0, 2.9, 2.0])}
    rounds.clear()
    assert depth.settled_min({"a": None, "b": None}, max_rounds=4) == {"a": 2.0, "b": 2.9}   # 2.9: within 5 %
    assert len(rounds) == 3


def test_retime_at_depth_scales_every_verify_and_keeps_plains_measured_seconds():
    """While cost-bound the gate re-times the decode and the verify of its best depth at the current context
    (`AdaptiveDepth.retime`): at a depth where a decode costs 2x and a verify of 2 rows 3x their position-0
    calibration, every verify scales by 3, plain's by 2, and the plain slowdown halves (its measured round
    seconds, slowdown x base, stay)."""
    at = []

    def remeasure(T):
        at.append(T)
        return {1: 2.0, 2: 3 * 2.1}[T]
    c = AdaptiveDepth(3, ([1.0, 2.1, 3.2, 4.3], 0.05), remeasure, alpha0=1.0, interval=4, max_interval=8)
    for i in range(8):                           # cost-bound from the first round: plain for max_interval rounds
        assert c.choose(i) == 0
        c.observe(0, 0, 1.5, i)                 # plain rounds measured at 1.5 s
    measured = c.slow[0] * c.base[0]
    assert c.choose(8) == 0 and at == [1, 2]    # re-timed: the decode and the verify of 2 rows
    assert c.base[0] == 2.0 and c.slow[0] * c.base[0] == pytest.approx(measured)
    assert c.verify_s == pytest.approx([2.0, 6.3, 9.6, 12.9])
    assert c.base[2] == pytest.approx(9.6 + 2 * 0.05) and c.slow[1] == c.slow[0]
    none = AdaptiveDepth(3, ([1.0, 2.1, 3.2, 4.3], 0.05), lambda T: None, interval=4, max_interval=8)
    for i in range(9):                           # no cells left to time at: the costs stay
        none.choose(i)
    assert none.verify_s == [1.0, 2.1, 3.2, 4.3]


def test_retime_at_depth_re_times_the_draft_step_too():
    """`retime` also re-times a draft step at the current context (`remeasure_draft`): calibrated at position 0
    (decode 1.0 s, verify of 2 rows 1.5 s, draft 0.6 s) depth 1 is cost-bound (2 tokens for 2.1 s at acceptance 1);
    at depth a decode costs 2.0 s, a verify of 2 rows 2.4 s. With the draft step still priced at 0.6 s depth 1
    would pay (2 / 3.0 > 1 / 2.0) and `auto` would speculate; re-timed at 2.0 s it costs 4.4 s for 2 tokens, less
    than plain's 2 per 4.0 s, so `auto` stays plain and re-times again after max_interval rounds."""
    def run(remeasure_draft):
        timed = []

        def draft():
            timed.append("draft")
            return remeasure_draft
        c = AdaptiveDepth(1, ([1.0, 1.5], 0.6), lambda T: {1: 2.0, 2: 2.4}[T], alpha0=1.0, interval=4,
                          max_interval=8, remeasure_draft=draft)
        depths = []
        for i in range(17):
            depths.append(c.choose(i))
            if depths[-1] == 0:
                c.observe(0, 0, 2.0, i)
        return c, depths, timed

    c, depths, timed = run(2.0)
    assert depths == [0] * 17 and timed == ["draft", "draft"]          # re-timed at rounds 8 and 16, plain all along
    assert c.draft_s == 2.0 and c.base == pytest.approx([2.0, 2.4 + 2.0])
    stale, depths, _ = run(None)                                      # no cell to time the draft at: 0.6 s stays
    assert stale.draft_s == 0.6 and depths == [0] * 16 + [1]          # and depth 1 pays at the next check
    assert stale.events[-1]["to_depth"] == 1


def test_retiming_mid_generation_keeps_the_output(q8_model, monkeypatch):
    """The engine's `remeasure` / `remeasure_draft` (runtime/speculative.py) time a verify and a draft step at the
    next cells; their cells are rewritten before they are read: `auto`, re-timing (verify of 2 rows and a draft
    step) at every fifth round, gives plain decoding's tokens, and the draft was timed (seconds > 0)."""
    import nextn.runtime.speculative as sp

    drafts = []

    class Retiming(AdaptiveDepth):
        def __init__(self, *a, remeasure_draft=None, **kw):
            super().__init__(*a, remeasure_draft=lambda: drafts.append(remeasure_draft()) or drafts[-1], **kw)

        def choose(self, n_emitted, gap_rows=0, left=None):
            if n_emitted % 5 == 4:
                self.retime(1)
            return super().choose(n_emitted, gap_rows, left)

    seq = q8_model.sequence
    plain = generate(seq, P["prompt_ids"], SamplingParams(32), SPEC_OFF)
    monkeypatch.setattr(sp, "AdaptiveDepth", Retiming)
    r = generate(seq, P["prompt_ids"], SamplingParams(32), SpecParams(n_max="auto"))
    assert r.tokens == plain.tokens
    assert drafts and all(d is not None and d > 0 for d in drafts)


def test_a_written_gap_does_not_count_as_slowdown():
    """A speculative round that writes a NextN gap of 10 rows (0.1 s each, priced apart by `cost`) takes base + 1 s;
    the spec slowdown sees only base (stays 1.0), and depth 1 keeps paying: E(1) = 1.75 at alpha 0.75 for
    base 1.2 + 0.2 = 1.4 s against plain's 1.0 s per token. Without the correction the slowdown rises to
    1 + 0.1 * ((1.4 + 1.0) / 1.4 - 1) and the next round's cost with it."""
    c = AdaptiveDepth(1, ([1.0, 1.2], 0.2, 0.1), alpha0=0.75)
    assert c.choose(1, gap_rows=10) == 1 and c.gap_s == pytest.approx(1.0)
    c.observe(1, 1, 1.4 + 1.0, 1)
    assert c.slow[1] == pytest.approx(1.0)
    c.observe(0, 0, 2.0, 2)                     # a plain round is not corrected: 2.0 s for base 1.0
    assert c.slow[0] == pytest.approx(1.1)


def test_a_catch_up_is_priced_over_the_rounds_left():
    """A draft that must first write a 10-row NextN gap (0.1 s a row) spreads that 1 s over the rounds it buys:
    `interval` (16) of them while the generation has no near end, so depth 1 (E = 1.75 at alpha 0.75, base 1.2 +
    0.2 s) pays against plain's 1 s per token; with 4 tokens left (2.3 rounds at depth 1) the same catch-up costs
    0.44 s a round and plain decoding wins; with 100 left, 16 rounds again."""
    def first_depth(left):
        return AdaptiveDepth(1, ([1.0, 1.2], 0.2, 0.1), alpha0=0.75, interval=16).choose(1, gap_rows=10, left=left)

    assert first_depth(None) == 1 and first_depth(100) == 1
    assert first_depth(4) == 0
    c = AdaptiveDepth(1, ([1.0, 1.2], 0.2, 0.1), alpha0=0.75, interval=16)
    c.choose(1, gap_rows=10, left=4)
    assert c.spread(1) == pytest.approx(4 / 1.75) and c.cost(1) == pytest.approx(1.4 + 1.0 / (4 / 1.75))
    assert c.events[-1]["to_depth"] == 0


def test_an_untried_depth_takes_the_acceptance_reached_before_it():
    """After 20 rounds at depth 1 that all accepted, position 1's acceptance is 1 - 0.9**15 / 9 (0.977: the mean of
    the prior 0.75 counted as 4 rounds and the first 5 rounds is 8/9, then 15 moving-average steps of 0.1) while
    positions 2, 3 were never reached. Costs: verify of 1..4 rows 1.0 / 1.4 / 1.8 / 2.2 s, a draft step 0.3 s. With
    the untried positions at the prior 0.75, depth 1 would look best (1.98 / 1.7 s against 3.26 / 3.1 s at depth 3);
    taking position 1's 0.977 for them, depth 3 expects 1 + .977 + .977**2 + .977**3 = 3.86 tokens in 3.1 s, the
    best rate, and `auto` tries it."""
    c = AdaptiveDepth(3, ([1.0, 1.4, 1.8, 2.2], 0.3), alpha0=0.75)
    for i in range(20):
        c.observe(1, 1, c.base[1], i)
    a1 = 1 - 0.9 ** 15 / 9
    assert c.alpha[0] == pytest.approx(a1) and c.alpha[1:] == [0.75, 0.75] and c.seen == [True, False, False]
    assert c.believed() == pytest.approx([a1] * 3)
    assert c.expected(3) == pytest.approx(1 + a1 + a1 ** 2 + a1 ** 3)
    assert c.expected(3, [a1, 0.75, 0.75]) / c.cost(3) < c.expected(1) / c.cost(1)     # the prior's verdict
    assert c.choose(20) == 3
    c.observe(3, 1, c.base[3], 20)           # drafts 1 accepted, 2 rejected: position 2 is now measured
    assert c.seen == [True, True, False] and c.believed()[2] == pytest.approx(c.alpha[1])


def test_a_catch_up_is_taken_out_at_its_measured_seconds():
    """The decode loop times the catch-up (`Drafter.take_catch_up`) and `observe` takes those seconds out of the
    round's, not the price `gap_s` (10 rows at 0.1 s = 1.0 s): a catch-up that took 3.0 s leaves the speculative
    slowdowns at 1.0 where the price would have left 2.0 s in them (1 + 0.1 * (3.4 / 1.4 - 1) = 1.143). The catch-up
    is then paid: `gap_s` is 0 for the rates that judge the round."""
    def after(**kw):
        c = AdaptiveDepth(1, ([1.0, 1.2], 0.2, 0.1), alpha0=0.75)
        assert c.choose(1, gap_rows=10, left=100) == 1 and c.gap_s == pytest.approx(1.0)
        c.observe(1, 1, 1.4 + 3.0, 2, **kw)
        return c
    c = after(catch_up_s=3.0)
    assert c.slow[1] == pytest.approx(1.0) and c.slow_at[1] == pytest.approx(1.0) and c.gap_s == 0.0
    priced = after()
    assert priced.slow[1] == pytest.approx(1 + 0.1 * (3.4 / 1.4 - 1))


def test_the_first_round_probes_where_the_prior_says_plain():
    """Issue 34's costs (verify of 2 rows 1.48 decodes, a draft step 0.32): at the prior acceptance 0.79 depth 1
    expects 1.79 tokens in 1.80 s, below plain's 1 a second, but no acceptance is measured yet, so with the
    generation's length known the first round probes (its catch-up is the prompt's alone). Accepted, position 1
    believes (4 * 0.79 + 1) / 5 = 0.832: 1.832 / 1.80 > 1, speculation; rejected, 3.16 / 5 = 0.632: 1.632 / 1.80 is
    more than HOLD below plain, plain decoding, and the switch is recorded. Without `left` the prior's verdict
    stands (plain for one interval)."""
    def probe(a):
        c = AdaptiveDepth(3, ([1.0, 1.48, 1.97, 2.45], 0.32), alpha0=0.79)
        assert c.choose(1, left=127) == 1 and c.mode == "probe"
        c.observe(1, a, 1.80, 2 + a)
        return c
    won, lost = probe(1), probe(0)
    assert won.alpha[0] == pytest.approx(0.832) and won.mode == "spec" and won.events[-1]["to_depth"] >= 1
    assert lost.alpha[0] == pytest.approx(0.632) and lost.mode == "plain" and lost.events[-1]["to_depth"] == 0
    assert "accepted 0" in lost.events[-1]["why"]
    assert AdaptiveDepth(3, ([1.0, 1.48, 1.97, 2.45], 0.32), alpha0=0.79).choose(1) == 0


def test_speculation_holds_within_2_percent_of_plain():
    """Once speculative rounds are measured, depth 1 at the issue's costs (1.80 s a round) keeps going while it
    expects at least 1 / 1.02 tokens a second: at acceptance 0.78 (1.78 / 1.80 = 0.989) it holds, at 0.75
    (0.972) plain decoding takes over."""
    for alpha, want in ((0.78, 1), (0.75, 0)):
        c = AdaptiveDepth(1, ([1.0, 1.48], 0.32))
        c.rounds_at[1], c.reached, c.alpha = 1, [1], [alpha]    # one speculative round measured
        assert c.choose(5, left=100) == want


def test_probes_stay_within_their_budget():
    """`affordable`: a probe at depth 1 (1.4 s round, 1.75 tokens expected at 1 s a plain token) that must first
    write a 3.0 s catch-up is priced 3.0 + 1.4 - 1.75 = 2.65 s; the budget is PROBE_SHARE (2 %) of the generation's
    plain seconds: 2.0 s with 100 tokens left (too dear), 4.0 s with 200; with 1.5 s already spent on probes,
    4.15 s > 4.0 s is too dear again."""
    from nextn.runtime.depth import PROBE_SHARE
    assert PROBE_SHARE == 0.02
    c = AdaptiveDepth(1, ([1.0, 1.2], 0.2, 0.1), alpha0=0.75)
    c.gap_s = 3.0
    c.left = 100
    assert not c.affordable(1)
    c.left = 200
    assert c.affordable(1)
    c.probe_loss_s = 1.5
    assert not c.affordable(1)
