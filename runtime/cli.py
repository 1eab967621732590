"""The `nextn` command line. User errors print one line on stderr and exit 1, never a traceback."""
from __future__ import annotations

import json
import os
import sys

import click

from .errors import NextnError


@click.group()
@click.version_option(package_name="nextn")
def cli():
    """nextn: compile GLM GGUFs ahead of time and decode with NextN/MTP self-speculation."""


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", default="llvm", show_default=True, help="Compile target (llvm = this CPU).")
@click.option("-o", "--output", "out", default=None, help="Artifact directory [default: artifacts/<model>-<target>].")
@click.option("-md", "--model-draft", "draft", default=None, help="MTP-only GGUF (draft) next to a trunk-only MODEL.")
@click.option("--dump-ir", default=None, help="Write the IR graphs and each Relax phase to this directory.")
def compile(model, target, out, draft, dump_ir):
    """Compile MODEL.gguf into an artifact directory (library + manifest.json)."""
    from nextn.compiler.compile import compile_model

    if out is None:
        base = os.path.splitext(os.path.basename(model))[0]
        out = os.path.join("artifacts", f"{base}-{target}")
    compile_model(model, out, target=target, draft=draft, dump_ir=dump_ir, log=lambda m: click.echo(m, err=True))


@cli.command()
@click.argument("model", type=click.Path())
@click.option("-p", "--prompt", default=None, help="Prompt text (tokenized without any prefix).")
@click.option("-f", "--prompt-file", type=click.Path(dir_okay=False), default=None, help="Read the prompt from a file.")
@click.option("-n", "--n-predict", default=64, show_default=True, help="Tokens to generate.")
@click.option("--temp", default=0.0, show_default=True, help="Temperature; 0 = greedy.")
@click.option("--seed", default=None, type=int, help="RNG seed for sampling.")
@click.option("-c", "--ctx-size", default=None, type=int, help="Context size (KV cells) [default: min(train ctx, 4096)].")
@click.option("--spec-type", type=click.Choice(["none", "draft-mtp"]), default=None,
              help="Speculation: draft-mtp uses the model's NextN head [default: draft-mtp when the model has one].")
@click.option("--spec-draft-n-max", default=3, show_default=True, help="Draft depth n_max.")
@click.option("-md", "--model-draft", "draft", default=None, help="MTP-only GGUF (draft) for a trunk-only model.")
@click.option("--target", default="llvm", show_default=True, help="Target used when MODEL is a GGUF.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at end-of-generation tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def run(model, prompt, prompt_file, n_predict, temp, seed, ctx_size, spec_type, spec_draft_n_max, draft, target,
        ignore_eos, as_json):
    """Generate from MODEL (a GGUF, compiled and cached on first use, or an artifact directory)."""
    from .api import load

    if prompt is not None and prompt_file is not None:
        raise NextnError("give either -p or --prompt-file, not both")
    if prompt_file is not None:
        try:
            with open(prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as e:
            raise NextnError(f"{prompt_file}: cannot read the prompt file ({e.strerror})") from None
    if prompt is None:
        raise NextnError("no prompt: give -p TEXT or --prompt-file F")
    if n_predict < 1:
        raise NextnError(f"-n {n_predict}: expected >= 1")
    want_spec = spec_type != "none"
    m = load(model, target=target, ctx_size=ctx_size, spec=want_spec, draft=draft,
             log=lambda s: click.echo(s, err=True))
    if spec_type is None:
        spec_type = "draft-mtp" if m.has_mtp else "none"
    elif spec_type == "draft-mtp" and not m.has_mtp:
        raise NextnError(f"{model}: --spec-type draft-mtp needs a NextN block; this model is trunk-only "
                         f"(give the MTP GGUF with --model-draft, or use --spec-type none)")
    r = m.generate(prompt, n_predict=n_predict, spec_type=spec_type, n_max=spec_draft_n_max, temp=temp, seed=seed,
                   ignore_eos=ignore_eos)
    if as_json:
        click.echo(json.dumps(r.to_json()))
        return
    click.echo(r.text)
    s = r.stats
    if spec_type == "draft-mtp":
        pos = ", ".join(f"{x:.3f}" for x in s.per_pos)
        click.echo(f"draft-mtp n_max={spec_draft_n_max}: draft acceptance = {s.acceptance:.3f} "
                   f"({s.accepted} accepted / {s.drafted} drafted), rounds = {s.rounds}, mean len = {s.mean_len:.3f}, "
                   f"acc per pos = ({pos})", err=True)
    click.echo(f"prompt {r.prompt_tokens} tokens in {r.prefill_s * 1e3:.1f} ms; generated {len(r.ids)} tokens in "
               f"{r.decode_s * 1e3:.1f} ms ({r.tokens_per_s:.1f} tok/s), finish: {r.finish_reason}", err=True)


def main(argv=None):
    try:
        cli.main(args=argv, prog_name="nextn", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("nextn: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except NextnError as e:
        click.echo(f"nextn: error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("nextn: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
