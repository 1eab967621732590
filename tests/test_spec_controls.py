"""Speculation controls: per-request n_max (clamped to the engine maximum), n_min, p_min, the adaptive depth
controller and its never-lose gate, and the finish rules inside an accepted block (EOS → stop → -n, context)."""
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


def test_calibrate_times_verifies_of_distinct_tokens():
    """Regression (issue 34, bench/spec_realwidth.py): `auto` timed a verify of T copies of one token, which routes
    every row to the same experts and under-priced real verifies (1.07 vs 1.33 decodes at T = 2 on glm45air-4).
    The calibration rows must be T distinct valid ids (the NextN catch-up rows likewise: the gate charges a deferred
    prompt gap at that rate)."""
    import types

    from nextn.runtime.depth import calibrate

    seen = []

    class Fake:   # a Sequence: its model's facts, its calls
        model = types.SimpleNamespace(hparams={"n_embd": 8, "n_vocab": 151552}, has_mtp=True)
        n_ctx = 64

        def verify(self, tokens, pos0):
            seen.append(list(tokens))

        def mtp_draft(self, tokens, h, pos0):
            pass

        def mtp_rows(self, tokens, h, pos0):
            rows.append(list(tokens))

    rows = []
    costs = calibrate(Fake(), 3, reps=1)
    assert len(costs[0]) == 4
    for T in range(1, 5):
        calls = [t for t in seen if len(t) == T]
        assert calls, T
        for t in calls:
            assert len(set(t)) == T and all(0 <= x < 151552 for x in t)
    assert rows and all(len(set(t)) == len(t) == 32 for t in rows)   # the catch-up rows' cost: distinct tokens too
