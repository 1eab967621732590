"""runtime/params.py: SamplingParams / SpecParams (what a generation asks for, passed whole from the CLI, the API and
the server) and resolve_spec_type (the one decision of the default speculation type)."""
import pytest

from nextn.common.errors import NextnError
from nextn.runtime.params import SPEC_OFF, SamplingParams, SpecParams, resolve_spec_type


def test_resolve_spec_type():
    assert resolve_spec_type(None, True, "m.gguf") == "draft-mtp"
    assert resolve_spec_type(None, False, "m.gguf") == "none"
    assert resolve_spec_type("none", True, "m.gguf") == "none"
    assert resolve_spec_type("draft-mtp", True, "m.gguf") == "draft-mtp"
    with pytest.raises(NextnError) as e:
        resolve_spec_type("draft-mtp", False, "trunk.gguf", "-md")
    msg = str(e.value)
    assert msg.startswith("trunk.gguf: --spec-type draft-mtp needs a NextN block") and "with -md," in msg
    assert "\n" not in msg


@pytest.mark.parametrize("kw, flag", [({"temperature": -0.1}, "--temp -0.1"), ({"top_p": 0.0}, "--top-p 0.0"),
                                      ({"top_p": 1.5}, "--top-p 1.5"), ({"min_p": -0.5}, "--min-p -0.5")])
def test_sampling_check_names_the_flags(kw, flag):
    with pytest.raises(NextnError, match="expected temp >= 0, 0 < top-p <= 1, 0 <= min-p <= 1") as e:
        SamplingParams(**kw).check()
    assert flag in str(e.value)


def test_sampling_params():
    s = SamplingParams(8, stop="END")
    assert s.stop == ("END",) and s.check() is s and s.greedy
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b") and not SamplingParams(temperature=0.8).greedy
    with pytest.raises(AttributeError):    # frozen: passed whole, never changed on the way
        s.n_predict = 9


@pytest.mark.parametrize("kw, words", [({"type": "eagle"}, "--spec-type 'eagle'"),
                                       ({"n_max": 0}, "--spec-draft-n-max 0"), ({"n_max": True}, "--spec-draft-n-max"),
                                       ({"n_max": "deep"}, "--spec-draft-n-max deep"),
                                       ({"n_min": -1}, "--spec-draft-n-min -1"),
                                       ({"p_min": 2.0}, "--spec-draft-n-min 0 / --spec-draft-p-min 2.0"),
                                       ({"draft_sampling": "beam"}, "draft sampling 'beam'")])
def test_spec_check_names_the_flag(kw, words):
    with pytest.raises(NextnError) as e:
        SpecParams(**kw).check()
    assert str(e.value).startswith(words)


def test_spec_params():
    assert SpecParams().enabled and SpecParams(n_max="auto").check().n_max == "auto"
    assert not SPEC_OFF.enabled and SPEC_OFF.check() is SPEC_OFF


def test_a_request_gives_its_params():
    from nextn.runtime.server.params import GenParams

    p = GenParams(temperature=0.5, top_k=7, top_p=0.9, min_p=0.1, seed=2**33 + 5, stop=["x"], ignore_eos=True,
                  spec_type="draft-mtp", n_max=2, n_min=1, p_min=0.25, draft_sampling="sample")
    assert p.sampling(12) == SamplingParams(12, 0.5, 7, 0.9, 0.1, 5, ("x",), True)
    assert p.spec() == SpecParams("draft-mtp", 2, 1, 0.25, "sample")
    assert GenParams(seed=-1).sampling(3).seed is None
    assert GenParams(spec_type="none", n_max=0).spec() is SPEC_OFF


def test_generate_takes_the_objects_or_the_keywords(q8_model):
    from conftest import reference

    p = reference()["prompts"][2]
    for n_max in (1, "auto"):
        kw = q8_model.generate(p["prompt_ids"], 24, n_max=n_max, ignore_eos=True)
        obj = q8_model.generate(p["prompt_ids"], sampling=SamplingParams(24, ignore_eos=True),
                                spec=SpecParams(n_max=n_max))
        assert obj.ids == kw.ids and obj.n_max == kw.n_max and obj.spec_type == "draft-mtp"
    off = q8_model.generate(p["prompt_ids"], sampling=SamplingParams(24, ignore_eos=True), spec=SPEC_OFF)
    assert off.ids == kw.ids and off.n_max == 0 and off.stats.rounds == 0
    with pytest.raises(NextnError, match="--spec-draft-n-max 0"):
        q8_model.generate(p["prompt_ids"], spec=SpecParams(n_max=0))
