"""`nextn run` prints the continuation as the tokens are emitted (one write per decoding step, as llama-cli), the
same text as before; `--json` is unchanged."""
import json

import click
from click.testing import CliRunner

from conftest import G4, reference

P = {p["kind"]: p for p in reference()["prompts"]}["code-short"]


def test_run_streams_each_step(compiled, monkeypatch, tmp_path):
    from nextn.runtime import cli

    art = compiled("q8", G4 / "tiny-glm4moe-Q8_0.gguf")
    prompt = tmp_path / "p.txt"
    import nextn.runtime as rt

    text = rt.load(art).tokenizer.decode(P["prompt_ids"])
    prompt.write_text(text, encoding="utf-8")
    writes = []
    echo = click.echo

    def spy(message=None, *a, **kw):
        if kw.get("nl") is False and not kw.get("err"):
            writes.append(message)
        return echo(message, *a, **kw)

    monkeypatch.setattr(cli.click, "echo", spy)
    args = ["run", art, "--prompt-file", prompt, "-n", 48, "--temp", 0, "--ignore-eos", "--spec-draft-n-max", 3]
    r = CliRunner().invoke(cli.cli, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    assert r.stdout == P["greedy_text"] + "\n"
    want = P["spec"]["3"]
    # one write per decoding step: the prefill token, then one per verify round (each accepted block at once)
    assert len(writes) == 1 + want["steps"]
    assert "".join(writes) == P["greedy_text"]
    monkeypatch.setattr(cli.click, "echo", echo)
    r = CliRunner().invoke(cli.cli, [str(a) for a in args + ["--json"]])
    out = json.loads(r.stdout)
    assert out["tokens"] == P["greedy_ids"] and out["text"] == P["greedy_text"]
    assert set(out) == {"prompt_tokens", "tokens", "text", "finish_reason", "spec_type", "spec_draft_n_max",
                        "spec_draft_n_max_requested", "spec_draft_vocab", "seed", "threads", "stats", "timings",
                        "kv_cache"}
    assert (out["kv_cache"]["type_k"], out["kv_cache"]["type_v"]) == ("f32", "f32")   # the artifact's own types
