"""`nextn draft-vocab MODEL.gguf --from TEXT... -o FILE` (issue 34 item 3): a reduced-vocabulary frequency file from
the user's own text, its ranks against a naive count of the tokenized text, its bad input, and speculation with a
file made this way on the tiny glm4moe fixture (lossless on every reference prompt)."""
import json
from collections import Counter

import pytest

from conftest import FIXTURES, G4, reference
from nextn.common.gguf import GGUFFile
from nextn.runtime import cli
from nextn.runtime.draft_vocab import read_ranks, tokenizer_ranks
from nextn.runtime.tokenizer import Tokenizer

MODEL = G4 / "tiny-glm4moe-Q8_0.gguf"
N = 2048     # the compiled reduced head of tests/test_draft_vocab.py


def _texts(tmp_path):
    """Two text files of the fixtures' prompt texts (code kinds, then the others): the user's own text."""
    prompts = json.loads((FIXTURES / "prompts.json").read_text())
    code = "\n".join(p["text"] for p in prompts if p["kind"].startswith("code"))
    rest = "\n".join(p["text"] for p in prompts if not p["kind"].startswith("code"))
    paths = [tmp_path / "code.txt", tmp_path / "docs.txt"]
    for path, text in zip(paths, (code, rest)):
        path.write_text(text, encoding="utf-8")
    return paths, [code, rest]


def _nextn(*args):
    """Exit status and stderr of `nextn ARGS` (cli.main: one line and exit 1 for a user error)."""
    try:
        cli.main([str(a) for a in args])
    except SystemExit as e:
        return e.code
    return 0


def test_draft_vocab_file_ranks_a_naive_count(tmp_path, capsys):
    paths, texts = _texts(tmp_path)
    out = tmp_path / "ranks.txt"
    assert _nextn("draft-vocab", MODEL, "--from", paths[0], "--from", paths[1], "-o", out) == 0
    fields = GGUFFile.open(str(MODEL)).fields
    tok = Tokenizer.from_gguf_fields(fields)
    tokens = [t for text in texts for t in tok.encode(text)]     # each file tokenized on its own
    counts = Counter(tokens)
    counted = sorted(counts, key=lambda t: (-counts[t], tokens.index(t)))
    assert len(counted) > 100 and counts[counted[0]] > counts[counted[-1]]
    rest = [t for t in tokenizer_ranks(fields).tolist() if t not in counts]
    got = read_ranks(str(out), tok.n_vocab).tolist()
    assert got == counted + rest and len(got) == tok.n_vocab
    head = f"# nextn draft-vocab: token frequencies of 2 text file(s) ({len(tokens)} tokens, {len(counted)} distinct"
    assert out.read_text().startswith(head)
    assert f"{len(counted)} counted in {len(tokens)} tokens" in capsys.readouterr().err
    only = tmp_path / "only.txt"
    assert _nextn("draft-vocab", MODEL, "--from", paths[0], "--from", paths[1], "-o", only, "--no-fill") == 0
    assert read_ranks(str(only), tok.n_vocab).tolist() == counted


def test_draft_vocab_bad_input_is_one_line(tmp_path, capsys):
    paths, _ = _texts(tmp_path)
    out = tmp_path / "ranks.txt"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    cases = [((MODEL, "--from", tmp_path / "missing.txt"), "missing.txt: cannot read the text file"),
             ((MODEL, "--from", latin), "latin1.txt: cannot read the text file"),
             ((MODEL, "--from", empty), "empty.txt: no tokens to count"),
             ((paths[0], "--from", paths[0]), "code.txt: not a GGUF file"),
             ((MODEL, "--from", paths[0], "-o", tmp_path / "no" / "dir" / "r.txt"),
              "r.txt: cannot write the rank file")]
    for args, why in cases:
        extra = () if "-o" in args else ("-o", out)
        assert _nextn("draft-vocab", *args, *extra) == 1, why
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.slow
def test_speculation_with_a_file_from_text_is_lossless(compiled, tmp_path):
    """The reduced draft head's rows from a `nextn draft-vocab` file of the prompt texts: its ids are the file's
    first N, and greedy output with speculation on (n_max 1 and 3) equals the reference on every prompt."""
    import nextn.runtime as rt

    paths, _ = _texts(tmp_path)
    ranks = tmp_path / "ranks.txt"
    assert _nextn("draft-vocab", MODEL, "--from", paths[0], "--from", paths[1], "-o", ranks) == 0
    m = rt.load(compiled(f"dv{N}-glm4moe", G4 / "tiny-glm4moe-BF16.gguf", draft_vocab=N), ctx_size=4096,
                draft_vocab_file=str(ranks))
    assert m.loaded.draft_ids.tolist() == read_ranks(str(ranks), 8192)[:N].tolist()
    for p in reference()["prompts"]:
        for n_max in (1, 3):
            r = m.generate(p["prompt_ids"], p["n_predict"], n_max=n_max, ignore_eos=True)
            assert r.ids == p["greedy_ids"], (p["kind"], n_max)
            assert r.stats.drafted > 0 and r.to_json()["spec_draft_vocab"] == N


@pytest.mark.parametrize("args", [("--help",)])
def test_draft_vocab_help(args, capsys):
    assert _nextn("draft-vocab", *args) == 0
    assert "--spec-draft-vocab" in capsys.readouterr().out
