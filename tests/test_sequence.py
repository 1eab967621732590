"""Sequences of one LoadedModel (runtime/model.py, runtime/sequence.py): they share the VM and the weight buffers,
each has its own KV; decoding on one, step by step between the other's steps, leaves the other's output the
fixture's reference."""
import numpy as np

from conftest import G4, reference

PROMPTS = {p["kind"]: p for p in reference()["prompts"]}


def _address(t) -> int:
    return np.from_dlpack(t).ctypes.data


def _interleaved(*gens):
    """Step the `speculative.decode` generators in turn, one step each, until all have finished: their Generations."""
    done, live = [None] * len(gens), list(range(len(gens)))
    while live:
        for i in list(live):
            try:
                next(gens[i])
            except StopIteration as e:
                done[i] = e.value
                live.remove(i)
    return done


def _check(g, p, n_max=None):
    """g is the reference's greedy continuation of p (and, speculating, with its rounds, drafts and accepts)."""
    assert g.tokens == p["greedy_ids"]
    if n_max is not None:
        want = p["spec"][str(n_max)]
        assert (g.stats.rounds, g.stats.drafted, g.stats.accepted) == (want["steps"], want["drafted"], want["accepted"])


def test_two_sequences_share_weights_not_states(compiled):
    import nextn.runtime as rt
    from nextn.runtime.params import SPEC_OFF, SamplingParams, SpecParams
    from nextn.runtime.speculative import decode

    m = rt.load(compiled("bf16", G4 / "tiny-glm4moe-BF16.gguf"), ctx_size=1024)
    lm = m.loaded
    a, b = lm.new_sequence(), lm.new_sequence(512)
    assert (a.model, b.model, a.n_ctx, b.n_ctx, lm.n_sequences) == (lm, lm, 1024, 512, 2)
    for name in lm.entries:   # each call's trailing arguments: (its states, its weights)
        assert a._rest[name][1] is b._rest[name][1] is lm.weight_tuple[name]
    assert a.states.keys() == b.states.keys() and a.states
    assert not {_address(t) for t in a.states.values()} & {_address(t) for t in b.states.values()}

    def run(seq, kind, n_max):
        p = PROMPTS[kind]
        spec = SPEC_OFF if n_max is None else SpecParams(n_max=n_max)
        return decode(seq, p["prompt_ids"], SamplingParams(p["n_predict"], ignore_eos=True), spec)

    # a speculates on one prompt while b decodes another plainly, one step each in turn
    ga, gb = _interleaved(run(a, "code-module", 3), run(b, "code-short", None))
    _check(ga, PROMPTS["code-module"], 3)
    _check(gb, PROMPTS["code-short"])
    # then a starts again from position 0 on another prompt while b takes a's first prompt (its KV rewritten)
    ga, gb = _interleaved(run(a, "docs-heading", 2), run(b, "code-module", 1))
    _check(ga, PROMPTS["docs-heading"], 2)
    _check(gb, PROMPTS["code-module"], 1)
    assert min(a.vm_seconds["verify"], b.vm_seconds["verify"], b.vm_seconds["decode"]) > 0
