"""The reduced-vocabulary draft head (`--spec-draft-vocab N`, FR-Spec): token ranks (tokenizer and file), the
`_vocab` draft entries against numpy over the full head's rows, speculation on ≡ off with it on the three trained
fixtures, and the gate's choice with the reduced head's cheaper draft step (runtime/depth.py).

The fixtures' vocabulary is 8192 tokens: N = 2048 (a quarter) is the compiled size; 1024 / 2048 / 4096 are the
sizes docs/design.md reports acceptance for (the same fractions, 1/8..1/2, as 19k..76k of GLM's 151552)."""
import json

import numpy as np
import pytest

from conftest import FIXTURES, G4, reference
from nextn.common.errors import NextnError
from nextn.common.gguf import GGUFFile
from nextn.runtime.depth import AdaptiveDepth
from nextn.runtime.draft_vocab import CONTROL, draft_ids, frequency_ranks, read_ranks, tokenizer_ranks, write_ranks

N = 2048
FILES = {"glm4moe": G4 / "tiny-glm4moe-BF16.gguf",
         "glm-dsa": FIXTURES / "tiny-glm-dsa" / "tiny-glm-dsa-BF16.gguf",
         "glm5next": FIXTURES / "tiny-glm5next" / "tiny-glm5next-BF16.gguf"}


def _load(compiled, arch: str, n: int = N, **kw):
    import nextn.runtime as rt

    path = compiled(f"dv{n}-{arch}", FILES[arch], draft_vocab=n)
    return rt.load(path, ctx_size=4096, **kw)


# -- ranks --------------------------------------------------------------------------------------------------------
def test_tokenizer_ranks_put_control_tokens_first_then_merge_order():
    fields = GGUFFile.open(str(G4 / "tiny-glm4moe-Q8_0.gguf")).fields
    r = tokenizer_ranks(fields)
    V = len(fields["tokenizer.ggml.tokens"])
    assert sorted(r.tolist()) == list(range(V))                       # a permutation of the vocabulary
    control = np.flatnonzero(np.asarray(fields["tokenizer.ggml.token_type"]) == CONTROL)
    assert len(control) > 0 and r[:len(control)].tolist() == control.tolist()
    rank = np.empty(V, np.int64)
    rank[r] = np.arange(V)
    index = {t: i for i, t in enumerate(fields["tokenizer.ggml.tokens"])}
    made = [index["".join(m.split(" ", 1))] for m in fields["tokenizer.ggml.merges"]]
    assert np.all(np.diff(rank[made]) > 0)                           # merge results in merge order
    assert rank[made].min() > rank[np.setdiff1d(np.arange(V), made)].max()   # after every token no merge makes


def test_rank_file_formats(tmp_path):
    lines = tmp_path / "ranks.txt"
    lines.write_text("# most frequent first\n5\n\n3\n5\n7\n")
    js = tmp_path / "ranks.json"
    js.write_text(json.dumps([5, 3, 5, 7]))
    assert read_ranks(str(lines), 10).tolist() == read_ranks(str(js), 10).tolist() == [5, 3, 7]
    assert draft_ids(2, 10, {}, str(lines)).tolist() == [5, 3]
    with pytest.raises(NextnError, match="needs 4"):
        draft_ids(4, 10, {}, str(lines))
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\nx\n")
    with pytest.raises(NextnError, match=r"bad.txt: line 3: 'x' is not a token id"):
        read_ranks(str(bad), 10)
    bad.write_text("[1, 12]")
    with pytest.raises(NextnError, match=r"item 1: 12 is not a token id \(expected an integer in 0..9\)"):
        read_ranks(str(bad), 10)
    with pytest.raises(NextnError, match="expected 0 < N < 10"):
        draft_ids(10, 10, {}, str(lines))


def test_frequency_ranks_and_their_file(tmp_path):
    """FR-Spec's frequency file: ids by count (ties by first occurrence), then the fallback's other ids; written as a
    rank file it reads back as the same ids (comment lines skipped)."""
    text = [7, 3, 7, 9, 3, 7, 2]                  # counts: 7 x3, 3 x2, 9 x1 (before 2), 2 x1
    got = frequency_ranks(text, 12, fallback=[0, 1, 2, 3, 4])
    assert got.tolist() == [7, 3, 9, 2, 0, 1, 4] and got.dtype == np.int32
    assert frequency_ranks([], 5, [4, 1]).tolist() == [4, 1]
    path = tmp_path / "freq.txt"
    write_ranks(str(path), got, "counted from\ntwo lines")
    assert path.read_text().startswith("# counted from\n# two lines\n7\n3\n")
    assert read_ranks(str(path), 12).tolist() == got.tolist()
    assert draft_ids(3, 12, {}, str(path)).tolist() == [7, 3, 9]


# -- the compiled entries -----------------------------------------------------------------------------------------
def test_reduced_head_ids_are_numpy_argmax_over_its_rows(compiled):
    """The `_vocab` entries' logits are the full head's logits of the draft ids' rows, and their argmax is
    draft_ids[argmax over those rows] (numpy), for a multi-row call (step 0 with a gap) and a one-row step."""
    m = _load(compiled, "glm4moe")
    seq = m.sequence
    assert seq.model.draft_vocab == N and seq.model.draft_ids.tolist() == tokenizer_ranks(seq.model.files.main.fields)[:N].tolist()
    ids = reference()["prompts"][0]["prompt_ids"]
    h = seq.hidden(ids)
    h_prev = np.concatenate([np.zeros((1, h.shape[1]), np.float32), h[:-1]])
    for rows in (slice(0, 3), slice(3, 4)):
        t, hp, p0 = ids[rows], h_prev[rows], rows.start
        every = np.arange(len(t), dtype=np.int32)
        full = seq._run("mtp_draft", t, p0, h_prev=hp, out_ids=every)[1].numpy()   # the full head, same rows and KV
        _h, lg, am = seq.mtp_draft(t, hp, p0)
        assert seq.vm_seconds["mtp_draft_vocab" if len(t) > 1 else "draft_vocab"] > 0
        want = full[:, seq.model.draft_ids]
        np.testing.assert_allclose(lg.numpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())
        assert am.tolist() == seq.model.draft_ids[np.argmax(want, axis=1)].tolist()
        assert am.tolist() == seq.model.draft_ids[np.argmax(lg.numpy(), axis=1)].tolist()


def _check_lossless(m, p):
    plain = m.generate(p["prompt_ids"], p["n_predict"], spec_type="none", ignore_eos=True)
    assert plain.ids == p["greedy_ids"]
    for n_max in (1, 3):
        r = m.generate(p["prompt_ids"], p["n_predict"], n_max=n_max, ignore_eos=True)
        assert r.ids == plain.ids, f"n_max={n_max}: output with the reduced draft head differs from plain decoding"
        assert r.stats.drafted > 0 and r.to_json()["spec_draft_vocab"] == N
    return r


def test_spec_on_equals_off_with_reduced_head_glm4moe(compiled):
    m = _load(compiled, "glm4moe")
    for p in reference()["prompts"]:
        _check_lossless(m, p)
    assert m.sequence.vm_seconds["draft_vocab"] > 0 and m.sequence.vm_seconds["draft"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["glm-dsa", "glm5next"])
def test_spec_on_equals_off_with_reduced_head(compiled, arch):
    m = _load(compiled, arch)
    for p in reference(FILES[arch].parent)["prompts"]:
        _check_lossless(m, p)
    assert m.sequence.vm_seconds["mtp_draft_shared_vocab"] > 0      # draft steps 1.. reuse step 0's DSA selection


def test_reduced_acceptance_equals_full_head_restricted_to_its_rows(compiled, monkeypatch):
    """The compiled reduced head accepts exactly what the full head accepts when its argmax is restricted to the
    draft ids in numpy (so docs/design.md's acceptance table, measured that way for other N, holds for them)."""
    m = _load(compiled, "glm4moe")
    full = _load(compiled, "glm4moe", draft_vocab=0)       # the same artifact, drafting with the full head
    assert full.loaded.draft_vocab == 0
    sel = m.loaded.draft_ids
    draft = full.sequence.mtp_draft

    def restricted(*a, **kw):
        h, lg, _am = draft(*a, **kw)
        return h, lg, sel[np.argmax(lg.numpy()[:, sel], axis=1)]

    p = reference()["prompts"][0]
    got = m.generate(p["prompt_ids"], p["n_predict"], n_max=3, ignore_eos=True).stats
    monkeypatch.setattr(full.sequence, "mtp_draft", restricted)
    want = full.generate(p["prompt_ids"], p["n_predict"], n_max=3, ignore_eos=True).stats
    assert (got.rounds, got.drafted, got.accepted) == (want.rounds, want.drafted, want.accepted)


def test_bad_draft_vocab_requests(compiled, tmp_path):
    import nextn.runtime as rt

    path = compiled(f"dv{N}-glm4moe", FILES["glm4moe"], draft_vocab=N)
    with pytest.raises(NextnError, match=f"compiled with --spec-draft-vocab {N}"):
        rt.load(path, draft_vocab=N // 2)
    f = tmp_path / "ranks.txt"
    f.write_text("\n".join(map(str, range(10))))
    with pytest.raises(NextnError, match=f"ranks 10 distinct token ids, --spec-draft-vocab {N} needs {N}"):
        rt.load(path, draft_vocab_file=str(f))
    f.write_text("\n".join(map(str, range(8191, -1, -1))))   # a file's ranks, not the tokenizer's
    m = rt.load(path, draft_vocab_file=str(f))
    assert m.loaded.draft_ids.tolist() == list(range(8191, 8191 - N, -1))
    p = reference()["prompts"][0]
    plain = m.generate(p["prompt_ids"], 16, spec_type="none", ignore_eos=True)
    assert m.generate(p["prompt_ids"], 16, n_max=2, ignore_eos=True).ids == plain.ids


# -- the gate ------------------------------------------------------------------------------------------------------
def test_gate_plain_when_no_depth_pays_and_reduced_draft_flips_it():
    """Issue 34's measured costs (units of one decode): verify of 2 rows 1.48, 3 rows 1.97, 4 rows 2.45; a full-head
    draft step 0.32; acceptance 0.79. E(1) = 1.79 tokens for 1.48 + 0.32 = 1.80 decodes: no depth pays, `auto`
    decodes plainly. A draft step of 0.10 (the reduced head) makes depth 1 pay: 1.79 / 1.58 = 1.13 > 1."""
    verify = [1.0, 1.48, 1.97, 2.45]
    full = AdaptiveDepth(3, (verify, 0.32), alpha0=0.79)
    assert full.rates()[0] == pytest.approx(1.0)
    assert full.rates()[1] == pytest.approx(1.79 / 1.80)
    assert [full.choose(i) for i in range(16)] == [0] * 16          # plain for one interval (16 rounds) ...
    assert full.events[0]["to_depth"] == 0 and "plain" in full.events[0]["why"]
    assert full.choose(16) == 1 and full.mode == "probe"              # ... then one probe: acceptance may have moved
    reduced = AdaptiveDepth(3, (verify, 0.10), alpha0=0.79)
    r = reduced.rates()
    assert r[1] == pytest.approx(1.79 / 1.58)
    best = max(range(4), key=lambda k: r[k])       # the argmax of E(k) / c(k), computed here from the doc's formula
    e = [1 + sum(0.79 ** i for i in range(1, k + 1)) for k in range(4)]
    assert best == int(np.argmax([e[k] / (verify[k] + 0.10 * k) for k in range(4)]))
    assert reduced.choose(0) == best and best >= 1


def test_gate_picks_plain_when_cost_bound_at_any_acceptance():
    """Verify of k+1 rows dearer than k+1 decodes: even acceptance 1 loses, so `auto` never drafts."""
    c = AdaptiveDepth(3, ([1.0, 2.1, 3.2, 4.3], 0.05), alpha0=1.0)
    assert [c.choose(i) for i in range(300)] == [0] * 300
    assert "cost-bound" in c.events[0]["why"]


def test_calibrate_times_the_reduced_draft_entry(compiled):
    """`auto`'s cost model times the draft step the engine will run: the `_vocab` entry when the reduced head is
    on (its seconds are what `depth.calibrate` returns as the draft cost)."""
    from nextn.runtime.depth import calibrate

    m = _load(compiled, "glm4moe")
    before = dict(m.sequence.vm_seconds)
    calibrate(m.sequence, 2)
    assert m.sequence.vm_seconds["draft_vocab"] > before["draft_vocab"]
    assert m.sequence.vm_seconds["draft"] == before["draft"]


# -- the command line ----------------------------------------------------------------------------------------------
def test_cli_run_json_reports_the_draft_vocab_and_rejects_a_bad_file(compiled, tmp_path):
    import subprocess
    import sys

    path = compiled(f"dv{N}-glm4moe", FILES["glm4moe"], draft_vocab=N)

    def nextn(*args):
        r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "run", path, "-n", "8", "--ignore-eos",
                            *map(str, args)], capture_output=True, text=True)
        return r.returncode, r.stdout, r.stderr

    rc, out, err = nextn("-p", "def main():", "--json", "--spec-draft-vocab", N)
    assert rc == 0, err
    j = json.loads(out)
    assert j["spec_draft_vocab"] == N and j["timings"]["entry_s"]["draft_vocab"] > 0
    bad = tmp_path / "ranks.txt"
    bad.write_text("7\n-1\n")
    rc, out, err = nextn("-p", "x", "--spec-draft-vocab-file", bad)
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "ranks.txt: line 2: '-1' is not a token id" in err


def test_serve_with_reduced_draft_head(compiled):
    """`nextn serve --spec-draft-vocab N`: the server's slot drafts with the reduced head and its greedy
    completions equal the reference's plain greedy continuation, with drafts made."""
    import httpx
    from test_server import start_server

    from nextn.common.compile_options import CompileOptions

    path = compiled(f"dv{N}-glm4moe", FILES["glm4moe"], draft_vocab=N)
    run = start_server(path, ctx_size=4096, compile_options=CompileOptions(draft_vocab=N), defaults={"n_max": 3})
    try:
        assert run.state.model.loaded.draft_vocab == N
        p = reference()["prompts"][0]
        body = {"prompt": p["prompt_ids"], "n_predict": p["n_predict"], "temperature": 0, "ignore_eos": True,
                "return_tokens": True}
        r = httpx.post(run.url + "/completion", json=body, timeout=120).json()
        assert r["tokens"] == p["greedy_ids"]
        assert r["timings"]["draft_n"] > 0
        assert run.state.scheduler.slots[0].seq.vm_seconds["draft_vocab"] > 0
    finally:
        run.stop()
